"""planner.shares priced: the split `measured` heads for, from each replica's predicted time at the equal split."""

from __future__ import annotations

from gearshift.planner.shares import predicted_split, share_rows


def test_the_priced_split_gives_the_slow_replica_less_and_finishes_first() -> None:
    # replica 1 takes twice as long per row, plus a fixed cost per step on both
    def replica_s(r: int, rows: int) -> float:
        return 0.05 + rows * (0.01 if r == 0 else 0.02)

    rows = predicted_split(replica_s, 2, 48, 4)
    assert sum(rows) == 48 and all(x % 4 == 0 for x in rows) and rows[0] > rows[1]
    equal = share_rows([1.0, 1.0], 48, 4)
    assert max(replica_s(r, x) for r, x in enumerate(rows)) < max(replica_s(r, x) for r, x in enumerate(equal))
    # replicas of one speed keep the equal split
    assert predicted_split(lambda r, rows: 0.05 + rows * 0.01, 2, 48, 4) == equal
