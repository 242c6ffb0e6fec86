"""ScheduleSwitcher's decisions without processes: the start, a period, a cue that finds no moved link, a
moved link, forced switches, and the step-time cue."""

from __future__ import annotations

from types import SimpleNamespace

from gearshift.cluster.state import ClusterState
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.runtime.reschedule import ScheduleSwitcher, describe

BOUNDS = [(0, 2), (2, 4), (4, 6), (6, 8)]


def _profiles(batch: int = 8) -> dict[int, ModelProfile]:
    out = {}
    for mb in (1, 2, 4, 8):
        w = 2e-3 + 1e-3 * mb
        out[mb] = ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1.0, 1000, 64_000, 100_000 * mb)
                                for i in range(8)], microbatch_size=mb, seq_len=16)
    return out


def _state(bandwidth: float, latency: float = 1e-4) -> ClusterState:
    bw = [[float("inf") if a == b else bandwidth for b in range(4)] for a in range(4)]
    lat = [[0.0 if a == b else latency for b in range(4)] for a in range(4)]
    return ClusterState([1.0] * 4, bw, lat, [1e12] * 4)


def _switcher(**kw) -> tuple[ScheduleSwitcher, SimpleNamespace]:
    sw = ScheduleSwitcher(_profiles(), 8, 4, every=10, change=0.25, margin=0.05, **kw)
    adapter = SimpleNamespace(sizes=[], use_microbatch=lambda size: adapter.sizes.append(size))
    return sw, adapter


def test_start_then_a_cue_without_a_moved_link_is_skipped_and_a_moved_one_reprices() -> None:
    sw, ad = _switcher()
    ev = sw._decide(_state(25e6), BOUNDS, 0, "start")
    sw._adopt(ev, ad, 0)
    rec = ev.to_dict()  # the metrics.jsonl line
    assert rec["current"] is None and rec["switch"] and sw.current == tuple(rec["chosen"])
    assert ad.sizes == [8 // sw.current[0]] and sw.runs == [{"m": sw.current[0], "k": sw.current[1], "from_step": 0}]
    assert describe(rec).startswith("schedule: auto picked m=")
    assert sw._decide(_state(24e6), BOUNDS, 7, "step time moved") is None  # no link moved: skipped
    rec = sw._decide(_state(2e6, latency=0.02), BOUNDS, 7, "step time moved").to_dict()
    assert rec["links_moved"] and rec["links_moved"][0].startswith("0->1 bandwidth 200 Mbit/s -> 16 Mbit/s")
    assert rec["trigger"] == "step time moved" and rec["current"] == list(sw.current)
    assert rec["switch"] == (rec["chosen"] != list(sw.current))
    period = sw._decide(_state(25e6), BOUNDS, 10, "period").to_dict()
    assert not period["switch"] and period["links_moved"] == []


def test_forced_switches_are_priced_and_logged() -> None:
    sw, ad = _switcher(forced={0: (2, 1), 5: (8, 8)})
    ev = sw._decide(_state(25e6), BOUNDS, 0, "forced", sw.forced[0])
    sw._adopt(ev, ad, 0)
    rec = ev.to_dict()
    assert rec["chosen"] == [2, 1] and rec["switch"] and rec["reason"].startswith("forced (the choice would be m=")
    assert rec["predicted_s"] == next(c["predicted_s"] for c in rec["candidates"] if (c["m"], c["k"]) == (2, 1))
    sw.times = [0.5, 0.5, 0.6]
    ev = sw._decide(_state(25e6), BOUNDS, 5, "forced", sw.forced[5])
    sw._adopt(ev, ad, 5)
    rec = ev.to_dict()
    assert rec["chosen"] == [8, 8] and rec["current"] == [2, 1] and rec["measured_step_s"] == 0.5
    assert ad.sizes == [4, 1] and [r["from_step"] for r in sw.runs] == [0, 5] and sw.times == []


def test_step_time_cue() -> None:
    sw, _ = _switcher()
    sw.times = [1.0, 1.0, 1.1, 1.0, 1.2]
    assert not sw._cued()  # too few steps to compare
    sw.times = [1.0, 1.0, 1.1, 1.0, 1.2, 1.1]
    assert not sw._cued()  # within 25%
    sw.times = [1.0, 1.0, 1.1, 1.4, 1.5, 1.3]
    assert sw._cued()
    sw.change = 0.0
    assert not sw._cued()  # off


def test_a_zb1p_key_names_its_schedule() -> None:
    """auto's keys: (m, K) of kFkB, (m, 1, "zb1p") of zb1p, on the same one-stage-per-rank placement (so a
    running job switches between them with set_schedule)."""
    from gearshift.runtime.reschedule import ScheduleSwitcher

    sw = ScheduleSwitcher({}, 8, 4)
    zb, kf = sw.schedule((4, 1, "zb1p")), sw.schedule((4, 2))
    assert (zb.name, zb.num_microbatches, kf.name, kf.params) == ("zb1p", 4, "kfkb", {"k": 2})
    assert zb.placement == kf.placement == [0, 1, 2, 3]


def test_auto_recompute_decision_names_the_stages_every_rank_takes() -> None:
    from gearshift.runtime.recompute import stages_to_recompute

    sw, ad = _switcher(memory=[0.85e6] * 4, recompute="auto")
    ev = sw._decide(_state(25e6, 5e-3), BOUNDS, 0, "start")
    sw._adopt(ev, ad, 0)
    rec = ev.to_dict()
    assert rec["recompute"] and sw.recompute_stages == frozenset(rec["recompute"])
    assert sw.runs[-1]["recompute"] == rec["recompute"] and "recomputing stages" in describe(rec)
    # each rank recomputes its own stages among the chosen ones
    assert [stages_to_recompute("auto", [r], sw.recompute_stages) for r in range(4)] == \
        [frozenset({r} & set(rec["recompute"])) for r in range(4)]
    forced = sw._decide(_state(25e6, 5e-3), BOUNDS, 3, "forced", (8, 1))  # fits storing its activations
    sw._adopt(forced, ad, 3)
    line = forced.to_dict()
    assert line["recompute"] == [] and line["would_recompute"] == rec["recompute"]
    assert sw.recompute_stages == frozenset() and sw.runs[-1] == {"m": 8, "k": 1, "from_step": 3}
