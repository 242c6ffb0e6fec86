"""Re-planning onto the workers left: the most workers the config accepts, the replicas kept among equals; none
left is a PlanError that says so."""

from __future__ import annotations

import pytest

from conftest import TINY
from gearshift.errors import PlanError
from gearshift.train.config import load_config
from gearshift.train.survivors import survivors_job


def test_fewer_stages_first_then_fewer_replicas():
    cfg = load_config(None, [*TINY, "--cluster.workers=4", "--parallel.stages=2"])  # 2 stages x 2 replicas
    three = survivors_job(cfg, 3)  # every worker left: 3 stages of 1 replica (the batch of 8 has no 3 replicas)
    assert (three.cluster.workers, three.parallel.stages, three.replicas) == (3, 3, 1)
    two = survivors_job(cfg, 2)
    assert (two.parallel.stages, two.replicas) == (1, 2)  # the replicas kept, one stage each
    assert cfg.cluster.workers == 4  # the job given is left as it was


def test_no_worker_left_is_a_plan_error():
    cfg = load_config(None, [*TINY, "--cluster.workers=2", "--parallel.stages=2"])
    with pytest.raises(PlanError, match="no layout of the job fits the 0 workers left"):
        survivors_job(cfg, 0)
