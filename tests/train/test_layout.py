"""resolve_partition: the configured split, with the model's no-cut boundaries honoured."""

from __future__ import annotations

import pytest

from gearshift.errors import ConfigError
from gearshift.train.build import gpt_config
from gearshift.train.config import load_config
from gearshift.train.layout import resolve_partition


def _cfg(partition: str):
    return load_config(None, ["--cluster.workers=3", "--parallel.stages=3", "--model.layers=8",
                              "--train.batch_size=24", f"--parallel.partition={partition}"])


def test_uniform_and_params_snap_to_allowed_boundaries():
    cfg = _cfg('"uniform"')
    assert resolve_partition(cfg, gpt_config(cfg)) == [(0, 4), (4, 7), (7, 10)]
    assert resolve_partition(cfg, gpt_config(cfg), no_cut=[4, 5]) == [(0, 3), (3, 7), (7, 10)]
    cfg = _cfg('"params"')
    free = resolve_partition(cfg, gpt_config(cfg))
    kept = resolve_partition(cfg, gpt_config(cfg), no_cut=[free[0][1]])
    assert kept[0][1] != free[0][1] and abs(kept[0][1] - free[0][1]) == 1


def test_explicit_ranges_may_not_cut_what_the_model_keeps_together():
    cfg = _cfg("[[0, 3], [3, 6], [6, 10]]")
    assert resolve_partition(cfg, gpt_config(cfg), no_cut=[4]) == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ConfigError, match=r"parallel.partition: cuts at boundaries \[6\], which the model keeps"):
        resolve_partition(cfg, gpt_config(cfg), no_cut=[5, 6])
