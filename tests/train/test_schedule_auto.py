"""parallel.schedule = "auto" end to end: the start-up choice within the memory limit, a forced switch and a
periodic re-pricing logged to metrics.jsonl with predicted and measured step times, and the summary saying
what ran."""

from __future__ import annotations

import json

import pytest

from gearshift.cli.main import main
from gearshift.profile.overhead import StepOverhead
from gearshift.profile.overhead_store import add_fit
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.launch import launch

pytestmark = pytest.mark.multiprocess

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--cluster.workers=2", "--parallel.stages=2", "--train.eval_every=0",
        "--output.trace=false",
        "--output.report=false"]


def _key(c: dict) -> tuple:
    """A candidate's identity as `chosen` writes it: (m, K), or (m, K, kind) beside kFkB."""
    return (c["m"], c["k"], c["kind"]) if c.get("kind") else (c["m"], c["k"])


def test_auto_start_forced_switch_and_period(tmp_path, capfd) -> None:
    job = [*TINY, f"--adapt.profiles={tmp_path / 'profiles'}"]
    assert main(["schedule", *job, "--json"]) == 0  # the candidates' memory (exact: bytes, not timings)
    cands = json.loads(capfd.readouterr().out)["candidates"]
    peaks = sorted({max(c["peak_memory"]) for c in cands})
    limit = peaks[len(peaks) // 2]
    allowed = {_key(c) for c in cands if max(c["peak_memory"]) <= limit}  # kFkB's (m, K) and zb1p's (m, 1, kind)
    forced = min((key for key in allowed if len(key) == 2), key=lambda mk: (-mk[0], mk[1]))  # most micro-batches
    out = tmp_path / "run"
    fits = tmp_path / "fits.json"  # another run's overhead on this machine (neutral: the choices stay the same)
    add_fit(fits, StepOverhead(1.0, 0.0, 0.0, 0.1, 8, "theil-sen", cores=1.5, wake_s=0.0), "another run")
    cfg = load_config(None, [*job, "--parallel.schedule=auto", "--train.steps=5", "--adapt.every=4",
                             f"--cluster.memory_gb={limit / 1e9!r}", f"--output.dir={out}", "--output.progress=true",
                             f"--adapt.overhead={fits}"])
    assert launch(cfg, quiet=True, forcing=Forcing(schedules={2: forced})) == 0
    stdout = capfd.readouterr().out  # rank 0's progress and summary
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    start, switch, period = [x for x in rows if x.get("event") == "schedule"]
    steps = [x for x in rows if x.get("event") is None]
    assert [x["step"] for x in steps] == [0, 1, 2, 3, 4]
    assert (start["step"], start["trigger"], start["current"]) == (0, "start", None)
    for d in (start, period):  # chosen by the simulator within the limit, never over it
        fit = [c for c in d["candidates"] if c["fits"]]
        assert {_key(c) for c in fit} == allowed and len(fit) < len(d["candidates"])
        assert tuple(d["chosen"]) in allowed and d["predicted_s"] == min(c["predicted_s"] for c in fit)
        assert d["memory_limit"] == [limit, limit]
        assert d["measured"]["link_bandwidth"][0] > 0 and d["measured"]["link_latency"][0] > 0
        cal = d["calibration"]  # the job's start calibration priced the candidates: a line per position
        assert len(cal["lines"]) == 2 and all(ln["method"].startswith("theil-sen") for ln in cal["lines"])
        assert all(ln["sizes"] >= 2 and ln["slope"] > 0 and ln["intercept"] >= 0 for ln in cal["lines"])
        assert cal["seconds"] > 0 and 0 <= cal["wait_cpu"] <= 1
    assert all(ln["points"] >= 4 for ln in start["calibration"]["lines"])  # F and B at two sizes, at least
    carried = start["calibration"]["overhead"]  # the other run's fit, without its cores; later: the job's own steps
    assert carried["method"].startswith("carried") and carried["points"] == 8 and carried["cores"] == 0
    assert carried["wake_s"] == 0.0 and not period["calibration"]["overhead"]["method"].startswith("carried")
    assert "refined" in period["calibration"]["meta"]
    assert (switch["step"], switch["trigger"], switch["chosen"]) == (2, "forced", list(forced))
    assert switch["current"] == start["chosen"] and switch["measured_steps"] == 1  # step 0 left out (warm-up)
    assert (period["step"], period["trigger"], period["current"]) == (4, "period", list(forced))
    assert period["measured_step_s"] > 0 and period["predicted_when_chosen_s"] == switch["predicted_s"]
    runs = f"auto schedule (m={start['chosen'][0]} K={start['chosen'][1]} from step 0; m={forced[0]} K={forced[1]}"
    assert runs in " ".join(stdout.replace("│", " ").split()), stdout  # the summary table, unwrapped
