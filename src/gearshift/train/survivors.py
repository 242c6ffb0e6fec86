"""The job for the workers left after some are lost for good: the layout with the most workers that the config
accepts (stages x replicas, never more replicas than before), the one with more replicas among equals. State is keyed by
global layer, so the survivors load the in-memory copies of the larger group whatever the new cut; the global
batch and the data order stay, so the math does too."""

from __future__ import annotations

import copy

from gearshift.errors import ConfigError, PlanError
from gearshift.train.config import JobConfig, validate


def survivors_job(cfg: JobConfig, survivors: int) -> JobConfig:
    """`cfg` re-planned onto `survivors` workers; a PlanError says why none fits."""
    replicas = cfg.replicas
    candidates = sorted(((s * r, r, s) for r in range(replicas, 0, -1) for s in range(survivors, 0, -1)
                         if s * r <= survivors), reverse=True)
    why = f"{survivors} workers left"
    for _, r, s in candidates:
        new = copy.deepcopy(cfg)
        new.cluster.workers, new.parallel.stages = s * r, s
        if new.cluster.ranks_per_node and new.cluster.workers % new.cluster.ranks_per_node:
            new.cluster.ranks_per_node = 0
        try:
            return validate(new)
        except ConfigError as e:
            why = f"{s} stages x {r} replicas: {e}"
    raise PlanError(f"no layout of the job fits the {survivors} workers left (the last tried, {why})")
