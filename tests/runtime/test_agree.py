"""runtime.agree on 4 gloo ranks: the per-rank table's one all_reduce gives every rank exactly what each rank
contributed (floats bit for bit, integers past 2**32), made once and refilled each call; the step's statistics
(train.step_stats) from it; the stop agreement when one rank alone asks; rank 0's decision, and its PlanError,
on every rank; objects gathered and broadcast in one collective where they fit, in two where one does not (the
capacity then grows alike on every rank)."""

from __future__ import annotations

import pickle

import pytest

from gearshift.testing import spawn

pytestmark = pytest.mark.multiprocess

WORLD = 4


def _mine(rank: int, call: int) -> dict[str, float]:
    """Rank `rank`'s values at its `call`-th contribution: awkward floats, a large integer, a negative."""
    return {"x": (rank + 1) / 3 + call, "big": float(2**40 * (rank + 1) + 7 * rank + call),
            "neg": -1e-300 * (rank + 1) - call}


def _table(rank: int, world: int) -> tuple[list[dict], bool, list[dict]]:
    import torch.distributed as dist

    from gearshift.runtime.agree import PerRank

    table = PerRank(("x", "big", "neg"))
    first = table(_mine(rank, 0))
    made = table._table.data_ptr()
    second = table(_mine(rank, 1))
    gathered: list = [None] * world  # every rank's own values, through an object gather to compare against
    dist.all_gather_object(gathered, [_mine(rank, 0), _mine(rank, 1)])
    return [first, second], table._table.data_ptr() == made, gathered


def test_per_rank_table_is_every_rank_contribution_exactly() -> None:
    for got, reused, gathered in spawn(_table, WORLD):
        assert reused
        for call in (0, 1):
            want = {f: [gathered[r][call][f] for r in range(WORLD)] for f in ("x", "big", "neg")}
            assert got[call] == want  # exact: x + 0 is x
        assert got[1]["big"][3] == 2**40 * 4 + 21 + 1


def _step(rank: int, world: int) -> tuple[dict, list]:
    import torch.distributed as dist

    from gearshift.runtime.executor import StepRecord
    from gearshift.train.step_stats import StepStats

    rec = StepRecord(compute_s={0: 0.1 * (rank + 1), 4: 1 / 7}, step_s=0.5 + 0.01 * rank,
                     peak_act_bytes=2**33 + rank)
    speed = None if rank == 1 else 1.0 + rank / 9  # rank 1 not measured yet
    line = StepStats()(3, 2.5, 0.75, 1e-3, rec, [(0, 2), (2, 4), (4, 6), (6, 8)], 1024, speed).to_dict()
    mine: list = [None] * world
    dist.all_gather_object(mine, (rec.busy_s, rec.step_s, speed, rec.peak_act_bytes))
    return line, mine


def test_step_statistics_are_every_rank_numbers() -> None:
    for line, mine in spawn(_step, WORLD):
        wall = max(m[1] for m in mine)
        assert line["busy_s"] == [m[0] for m in mine] and line["step_time_s"] == wall
        assert line["peak_act_bytes"] == [m[3] for m in mine]
        assert line["measured_speed"] == [m[2] for m in mine] and line["measured_speed"][1] is None
        assert line["tokens_per_s"] == 1024 / wall
        assert line["bubble_fraction"] == 1.0 - sum(m[0] for m in mine) / (WORLD * wall)
        assert (line["step"], line["loss"], line["grad_norm"], line["lr"]) == (3, 2.5, 0.75, 1e-3)


def _agree(rank: int, world: int) -> dict:
    from gearshift.errors import PlanError
    from gearshift.runtime.agree import AnyRank, Objects, rank0_decides

    stop = AnyRank()
    asked = [stop(rank == 2), stop(False), stop(rank == 0), stop(rank == 3)]
    decided = rank0_decides(lambda: {"by": rank, "pool": [(0, 4), (4, 8)]})
    try:
        rank0_decides(lambda: (_ for _ in ()).throw(PlanError("nothing fits")))
        error = None
    except PlanError as e:
        error = str(e)
    # objects in one collective where they fit 16 bytes, else a second one sized by the lengths every rank got
    objects = Objects(capacity=16)
    small = objects.all_gather(rank)
    large = objects.all_gather(list(range(rank * 40)))  # rank 0's fits, the others' do not
    grown = objects.capacity
    spoken = objects.broadcast({"by": rank, "pool": list(range(100))})
    told = Objects(capacity=16).broadcast("rank 0's" if rank == 0 else None)
    by_objects = rank0_decides(lambda: {"by": rank, "long": "x" * 300}, Objects(capacity=16))
    return {"asked": asked, "decided": decided, "error": error, "small": small, "large": large, "grown": grown,
            "spoken": spoken, "told": told, "by_objects": by_objects}


def test_stop_agreement_and_rank0_decisions_on_every_rank() -> None:
    for out in spawn(_agree, WORLD):
        assert out["asked"] == [True, False, True, True]  # one rank asking stops every rank
        assert out["decided"] == {"by": 0, "pool": [(0, 4), (4, 8)]}
        assert out["error"] == "nothing fits"
        assert out["small"] == list(range(WORLD))
        assert out["large"] == [list(range(r * 40)) for r in range(WORLD)]
        assert out["grown"] >= len(pickle.dumps(list(range((WORLD - 1) * 40))))  # alike on every rank
        assert out["spoken"] == {"by": 0, "pool": list(range(100))} and out["told"] == "rank 0's"
        assert out["by_objects"] == {"by": 0, "long": "x" * 300}
