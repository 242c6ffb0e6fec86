import json

from gearshift.report.trace import chrome_trace, merge_traces, sim_trace, write_trace
from gearshift.schedules import gpipe
from gearshift.sim import ScheduleCosts, simulate


def complete(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_chrome_trace_events_and_tracks():
    trace = chrome_trace(
        {"rank 0": [("F0", 0.0, 0.5, {"stage": 0, "mb": 0})], "rank 1": [("SA0", 1.0, 1.0, {"mb": 0})]},
        "measured",
    )
    meta = {(e["name"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "measured"}
    assert meta[("thread_name", 0)] == {"name": "rank 0"}
    assert meta[("thread_name", 1)] == {"name": "rank 1"}
    f0, sa0 = complete(trace)
    assert (f0["name"], f0["cat"], f0["tid"], f0["ts"], f0["dur"]) == ("F0", "compute", 0, 0.0, 5e5)
    assert f0["args"] == {"stage": 0, "mb": 0}
    assert (sa0["cat"], sa0["tid"], sa0["ts"], sa0["dur"]) == ("comm", 1, 1e6, 0.0)


def test_sim_trace_has_every_action_and_link_tracks(tmp_path):
    sch = gpipe(2, 3)
    res = simulate(sch, ScheduleCosts.uniform(2, 2, act_bytes=1.0, bandwidth=4.0))
    trace = sim_trace(res)
    events = complete(trace)
    tracks = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert set(tracks) == {"rank 0", "rank 1", "link 0->1", "link 1->0"}
    on_rank0 = [e["name"] for e in events if e["tid"] == tracks["rank 0"]]
    assert on_rank0 == [a.label for a in sch.actions[0]]
    b2 = next(e for e in events if e["name"] == "B2" and e["tid"] == tracks["rank 1"])
    assert b2["cat"] == "compute" and b2["args"] == {"op": "B", "stage": 1, "mb": 2}
    link = [e for e in events if e["tid"] == tracks["link 0->1"]]
    assert [e["name"] for e in link] == ["SA0", "SA1", "SA2"]
    assert all(e["cat"] == "comm" and e["dur"] == 0.25e6 for e in link)
    assert {e["cat"] for e in events if e["name"] in ("SYNC", "RA0")} == {"comm"}

    path = write_trace(tmp_path / "out" / "predicted.json", trace)
    assert json.loads(path.read_text()) == trace


def test_merge_traces_separates_processes():
    a = chrome_trace({"rank 0": [("F0", 0.0, 1.0, {})]}, "predicted")
    b = chrome_trace({"rank 0": [("F0", 0.0, 2.0, {})]}, "measured")
    merged = merge_traces(a, b)
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "predicted", 1: "measured"}
    assert [(e["pid"], e["dur"]) for e in complete(merged)] == [(0, 1e6), (1, 2e6)]
    assert a["traceEvents"][0]["pid"] == 0 and b["traceEvents"][0]["pid"] == 0  # inputs untouched


def test_multidir_compute_is_coloured_by_direction():
    """Perfetto colours a slice by its name without digits, so each direction's compute gets a track of
    slices named by the direction's letter (one colour each); chrome://tracing also gets a cname."""
    import re

    from gearshift.schedules import make_schedule

    sch = make_schedule("multidir", 4, 4, directions=2)
    trace = sim_trace(simulate(sch, ScheduleCosts.uniform(8, 4)), stages_per_pipe=4)
    tracks = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert [t for t in tracks if t.startswith("rank")] == [
        f"rank {r}{x}" for r in range(4) for x in ("", " directions")]
    for r in range(4):
        dirs = [e for e in complete(trace) if e["tid"] == tracks[f"rank {r} directions"]]
        ops = [e for e in complete(trace) if e["tid"] == tracks[f"rank {r}"] and e["cat"] == "compute"
               and e["name"] != "STEP"]
        assert [(e["ts"], e["dur"]) for e in dirs] == [(e["ts"], e["dur"]) for e in ops]
        for d, op in zip(dirs, ops):
            assert d["name"] == ("dir A" if op["args"]["stage"] < 4 else "dir B")
        colours = {re.sub(r"( )?\d+", "", e["name"]): e["cname"] for e in dirs}  # Perfetto's colour key
        assert colours == {"dir A": "rail_response", "dir B": "rail_animation"}
