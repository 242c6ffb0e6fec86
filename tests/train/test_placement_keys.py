"""[moe] placement keys and the emulated skewed router's keys ([emulate]): bad values, a model that is not moe_gpt,
replicas that do not fill or do not fit a rank's memory are each one line naming the field."""

from __future__ import annotations

import pytest

from gearshift.errors import UserError
from gearshift.train.config import load_config

MOE = ["--model.name=moe_gpt", "--parallel.stages=1", "--parallel.experts=4", "--model.experts=8"]


@pytest.mark.parametrize("args,message", [
    (["--moe.every=-1"], "moe.every: must be >= 0, got -1"),
    (["--moe.every=5", "--model.name=gpt", "--parallel.experts=1", "--model.experts=8"],
     "model.experts: a key of model.name"),
    (["--moe.every=5", "--parallel.experts=1"], "moe.every: expert placement needs parallel.experts > 1"),
    (["--moe.replicas=1"], "moe.replicas: replicas are placed by the re-placement every moe.every steps"),
    (["--moe.every=5", "--moe.replicas=7"], "moe.replicas: extra expert slots per device must be in 0..6"),
    (["--moe.every=5", "--moe.replicas=2", "--model.width=2048", "--model.heads=8", "--model.layers=8"],
     "moe.replicas: 2 + 2 experts per rank need"),
    (["--moe.every=5", "--moe.forecast=median"], "moe.forecast: 'median' (allowed: trend, mean)"),
    (["--emulate.router_skew=-1"], "emulate.router_skew: must be a number >= 0 (got -1.0)"),
    (["--emulate.router_drift=1.5"], "emulate.router_drift: expected an integer, got 1.5"),
    (["--emulate.router_drift=-2"], "emulate.router_drift: must be an integer >= 0 (got -2)"),
    (["--emulate.router_bursts=2"], "emulate.router_bursts: must be a probability in 0..1 (got 2.0)"),
    (["--model.router_skew=1"], "model.router_skew: unknown key"),
])
def test_bad_placement_keys_are_one_line(args, message):
    with pytest.raises(UserError) as e:
        load_config(None, MOE + args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_good_placement_keys():
    cfg = load_config(None, MOE + ["--moe.every=5", "--moe.replicas=2", "--moe.window=10",
                                   "--moe.forecast=mean",
                                   "--emulate.router_skew=1.2", "--emulate.router_drift=20"])
    assert (cfg.moe.every, cfg.moe.replicas, cfg.moe.window, cfg.moe.forecast) == (5, 2, 10, "mean")
    assert (cfg.emulate.router_skew, cfg.emulate.router_drift) == (1.2, 20) and "router_skew" not in cfg.model.table()


def test_no_placement_follows_the_last_step():
    """Every moe.every steps, but not after the job's last step: nothing would run on what it moved."""
    from gearshift.train.placement import placement_due

    assert [s for s in range(10) if placement_due(s, 5, 10)] == [4]
    assert [s for s in range(10) if placement_due(s, 1, 10)] == list(range(9))
    assert [s for s in range(10) if placement_due(s, 3, 10)] == [2, 5, 8]
    assert not any(placement_due(s, 0, 10) for s in range(10))
