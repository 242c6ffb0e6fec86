"""In-memory copies (train.snapshot): what each rank writes comes back merged, keyed by global name, from the newest
step every rank of the writing group finished; a step some rank never copied is not used."""

from __future__ import annotations

import pytest
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
    # each rank keeps its two newest copies in two slots: the memory a run holds does not grow with its steps
    assert sorted(p.name for p in (tmp_path / "shm").iterdir() if ".rank0." in p.name) == [
        "step0000002.world2.rank0.slot0.json", "step0000003.world2.rank0.slot1.json",
        "world2.rank0.slot0.bin", "world2.rank0.slot1.bin"]


class _Unreadable:
    """A tensor's shape and size, whose bytes cannot be read: the copy stops there, as a killed rank's would."""

    dtype, shape, device = torch.float32, (2, 3), torch.device("cpu")

    def numel(self) -> int:
        return 6

    def element_size(self) -> int:
        return 4


def test_a_copy_cut_off_half_way_is_not_taken_for_whole(tmp_path):
    snaps = Snapshots(tmp_path / "shm", every=1)
    for step in (1, 2):
        for rank in (0, 1):
            snaps.write(_state(rank, step), step, rank, 2, {})
    model, optim = _state(1, 3)
    with pytest.raises(TypeError):  # step 3 goes into the slot step 1 used: it had started to overwrite it
        snaps.write(({**model, "layers.1.bias": _Unreadable()}, optim), 3, 1, 2, {})
    snaps.write(_state(0, 3), 3, 0, 2, {})
    assert not list((tmp_path / "shm").glob("step0000001.world2.rank1.*"))  # its copy stopped counting first
    assert snaps.newest() == 2
    ck = snaps.load(2)
    assert torch.equal(ck["model"]["layers.1.weight"], _state(1, 2)[0]["layers.1.weight"])


def test_no_complete_copy_is_none(tmp_path):
    snaps = Snapshots(tmp_path / "shm", every=2)
    assert snaps.newest() is None and not snaps.due(1) and snaps.due(2)
    snaps.write(_state(0, 2), 2, 0, 2, {})
    assert snaps.newest() is None


def test_a_rank_whose_copy_host_memory_cannot_hold_goes_on_without_copies(tmp_path, monkeypatch, capsys):
    """A full /dev/shm (the slot's memory cannot be reserved) is a line from that rank and no more copies from it,
    not a failed step (before: an OSError, and every restart failed the same way); its earlier copies go, so no
    step counts as copied by every rank past the last one it finished."""
    import errno
    import os

    snaps = [Snapshots(tmp_path / "shm", every=1) for _ in (0, 1)]  # one per rank, as in two processes
    for rank in (0, 1):
        snaps[rank].write(_state(rank, 1), 1, rank, 2, {})
    assert snaps[0].newest() == 1

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)  # step 2 maps a new slot: its memory cannot be had
    assert snaps[1].write(_state(1, 2), 2, 1, 2, {}) is None
    monkeypatch.undo()
    assert capsys.readouterr().err == (
        f"gearshift: rank 1: {tmp_path} cannot hold its in-memory copy (No space left on device): it goes on without "
        "copies (its earlier ones dropped); a restart goes on from the newest checkpoint (train.snapshot_every = 0 "
        "turns the copies off)\n")
    assert not snaps[1].due(3) and not list((tmp_path / "shm").glob("*rank1*"))
    snaps[0].write(_state(0, 2), 2, 0, 2, {})
    assert snaps[0].newest() is None
