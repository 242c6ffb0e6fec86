"""The all-to-all's per-call split of a replicated expert's rows over its copies: every rank cuts the same queue from
the summed table of counts, each source's rows go to exactly one copy each, and the copies' devices carry the
balanced split's loads (not the queue-position split's)."""

from __future__ import annotations

import numpy as np
import torch

from gearshift.comm.alltoall import runs_index, split_rows
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import balanced_split, device_loads


def test_the_cut_gives_each_copy_its_balanced_share_from_the_sources_in_order():
    placement = ExpertMap(((0, 1, 2), (1,), (2,), (0, 2), (3,), (3, 1)), 4)
    rng = np.random.default_rng(0)
    for _ in range(5):
        table = torch.from_numpy(rng.integers(0, 20, (4, 6))).to(torch.int64)
        table[:, 0] *= 3  # a hot replicated expert
        ends, runs = split_rows(table, placement)
        total = table.sum(0)
        parts = balanced_split(total.tolist(), placement)
        assert (runs.sum(2) == table).all()  # every source's rows of an expert go to one copy each
        for e, p in enumerate(parts):
            assert runs[:, e, :len(p)].sum(0).tolist() == p and runs[:, e, len(p):].sum() == 0
            # the runs follow the queue: source s's rows of e start where the sources before it end
            queue = torch.repeat_interleave(torch.arange(len(p)), torch.tensor(p))
            got = torch.cat([queue[int(a):int(a + n)] for a, n in zip(table[:, e].cumsum(0) - table[:, e],
                                                                       table[:, e])])
            assert torch.bincount(got, minlength=len(p)).tolist() == p
            assert int(ends[e, -1]) == int(total[e])
        rows = np.zeros(4)
        for e, h in enumerate(placement.holders):
            for j, d in enumerate(h):
                rows[d] += int(runs[:, e, j].sum())
        assert rows.tolist() == device_loads(total.tolist(), placement).tolist()
        assert rows.max() <= device_loads(total.tolist(), placement, "even").max()


def test_runs_index_concatenates_the_runs_in_order():
    rng = np.random.default_rng(1)
    for _ in range(5):
        starts, lengths = rng.integers(0, 50, 12), rng.integers(0, 4, 12)
        want = [i for a, n in zip(starts, lengths) for i in range(a, a + n)]
        assert runs_index(torch.from_numpy(starts), torch.from_numpy(lengths)).tolist() == want
    assert runs_index(torch.tensor([3, 7]), torch.tensor([0, 0])).tolist() == []
