"""In-memory copies (train.snapshot): what each rank writes comes back merged, keyed by global name, from the newest
step every rank of the writing group finished; a step some rank never copied is not used."""

from __future__ import annotations

import torch

from gearshift.train.snapshot import Snapshots


def _state(rank: int, step: int) -> tuple[dict, dict]:
    w = torch.full((2, 3), float(10 * step + rank))
    return {f"layers.{rank}.weight": w}, {f"layers.{rank}.weight": {"exp_avg": w * 2, "step": torch.tensor(step)}}


def test_copies_round_trip_merged_from_the_newest_complete_step(tmp_path):
    snaps = Snapshots(tmp_path / "shm", every=1)
    for step in (1, 2, 3):
        for rank in (0, 1):
            if (step, rank) != (3, 1):  # rank 1 died before copying step 3
                snaps.write(_state(rank, step), step, rank, 2, {"bounds": [[0, 1], [1, 2]]})
    assert snaps.newest() == 2
    ck = snaps.load(2)
    assert ck["step"] == 2 and ck["bounds"] == [[0, 1], [1, 2]] and len(ck["rng"]) == 2
    for rank in (0, 1):
        model, optim = _state(rank, 2)
        assert torch.equal(ck["model"][f"layers.{rank}.weight"], model[f"layers.{rank}.weight"])
        got = ck["optim"][f"layers.{rank}.weight"]
        assert torch.equal(got["exp_avg"], optim[f"layers.{rank}.weight"]["exp_avg"]) and int(got["step"]) == 2
    # each rank keeps its two newest copies: the memory a run holds does not grow with its steps
    assert sorted(p.name for p in (tmp_path / "shm").iterdir() if ".rank0." in p.name) == [
        "step0000002.world2.rank0.pt", "step0000003.world2.rank0.pt"]


def test_no_complete_copy_is_none(tmp_path):
    snaps = Snapshots(tmp_path / "shm", every=2)
    assert snaps.newest() is None and not snaps.due(1) and snaps.due(2)
    snaps.write(_state(0, 2), 2, 0, 2, {})
    assert snaps.newest() is None
