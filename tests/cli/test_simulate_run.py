"""`gearshift simulate` beside a run: it predicts the run's own job (its config.json) and the (m, K) and partition
that ran (metrics.jsonl), names that job in its title, and refuses a config of another job in one line."""

from __future__ import annotations

import json

import pytest

from gearshift.cli.simulate_run import job_title, segments, the_job
from gearshift.errors import ConfigError
from gearshift.train.config import load_config

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=16",
        "--data.max_bytes=100000", "--parallel.microbatches=2",
        "--output.report=false"]


def _run(out, job: list[str], schedule_events: dict[int, list[int]] = (), steps: int = 6,
         recompute: dict[int, list[int]] | None = None, cpu: bool = False) -> None:
    """A run's files as training writes them: config.json, and metrics.jsonl with a step line each (step i took
    (i + 1) / 8 s; with `cpu`, each of 2 ranks 1 / 32 s of CPU in its compute and 1 / 16 s in all) and a
    "schedule" event where the (m, K) changed (with the stages recomputing, where given)."""
    cfg = load_config(None, [*job, f"--output.dir={out}"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    lines = []
    for i in range(steps):
        if i in dict(schedule_events):
            lines.append({"event": "schedule", "step": i, "chosen": dict(schedule_events)[i],
                          **({"recompute": recompute[i]} if recompute and i in recompute else {})})
        lines.append({"step": i, "step_time_s": (i + 1) / 8, "bubble_fraction": 0.25,
                      "partition": [[0, 2], [2, 4]], **({"cpu_s": [1 / 16] * 2, "compute_cpu_s": [1 / 32] * 2}
                                                        if cpu else {})})
    (out / "metrics.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))


AUTO = [*TINY, "--cluster.workers=2", "--parallel.stages=2", "--parallel.schedule=auto"]
MULTIDIR = [*TINY, "--parallel.schedule=multidir", "--parallel.microbatches=4", "--model.layers=6"]


def test_the_run_s_own_job_and_the_m_k_that_ran(tmp_path):
    out = tmp_path / "run"
    _run(out, AUTO, {0: [2, 1], 3: [8, 3]})
    cfg, has_run = the_job(None, [f"--output.dir={out}"])  # no config: the run's
    assert has_run and cfg.parallel.schedule == "auto" and cfg.cluster.workers == 2
    segs = segments(cfg, out, [(0, 2), (2, 4)])
    assert [(s.m, s.k, s.steps) for s in segs] == [(2, 1, [0, 1, 2]), (8, 3, [3, 4, 5])]
    assert segs[0].step_s == [2 / 8, 3 / 8] and segs[1].step_s == [5 / 8, 6 / 8]  # each segment's first step warms up
    assert segs[1].label() == "m=8 K=3, steps 3-5"
    cfg2, _ = the_job(None, [f"--output.dir={out}", "--train.steps=99", "--train.lr=0.1"])  # nothing predicted moves
    assert cfg2.parallel.schedule == "auto"


def test_the_stages_that_recomputed_split_the_segments(tmp_path):
    out = tmp_path / "run"
    _run(out, [*AUTO, "--parallel.recompute=auto", "--cluster.memory_gb=1"], {0: [8, 3], 2: [8, 3], 4: [2, 1]},
         recompute={0: [0], 2: []})
    cfg, _ = the_job(None, [f"--output.dir={out}"])
    segs = segments(cfg, out, [(0, 2), (2, 4)])
    assert [(s.m, s.k, s.recompute, s.steps) for s in segs] == [(8, 3, (0,), [0, 1]), (8, 3, (), [2, 3]),
                                                                 (2, 1, (), [4, 5])]
    assert segs[0].label() == "m=8 K=3 recomputing 0, steps 0-1"


@pytest.mark.parametrize("args, message", [
    (["--cluster.workers=2", "--parallel.stages=2"], r"parallel.schedule is 'auto' there but '1f1b' here"),
    (["--parallel.schedule=auto", "--cluster.workers=2", "--parallel.stages=2", "--model.layers=3"],
     r"model.layers is 2 there but 3 here"),
])
def test_another_job_s_config_is_refused_in_one_line(tmp_path, args, message):
    out = tmp_path / "run"
    _run(out, AUTO)
    job = tmp_path / "job.toml"
    job.write_text("")
    with pytest.raises(ConfigError, match=rf"^output.dir: .*run holds a run of another job: {message} \(simulate "
                                          r"predicts the run in output.dir"):
        the_job(str(job), [*TINY, *args, f"--output.dir={out}"])
    with pytest.raises(ConfigError, match="cluster.workers is 2 there but 4 here"):  # overrides on the run's config
        the_job(None, [f"--output.dir={out}", "--parallel.stages=4", "--cluster.workers=4"])


def test_the_title_names_the_job():
    assert job_title(load_config(None, MULTIDIR)) == ("gpt, 4 workers, multidir: 2 directions over 4 stages, update "
                                                      "flush, 4 micro-batches of 2 per direction")
    assert job_title(load_config(None, [*TINY, "--cluster.workers=1", "--parallel.stages=1"])) == \
        "gpt, 1 worker, 1 stage x 1 replica, 1f1b, 2 micro-batches of 8"
    moe = load_config(None, [*TINY, "--model.name=moe_gpt", "--model.experts=4", "--parallel.stages=2",
                             "--parallel.experts=2"])
    assert job_title(moe).startswith("moe_gpt (4 experts, top-2, over 2 ranks), 4 workers, 2 stages x 2 replicas")


def test_simulate_names_the_run_s_job_and_predicts_each_m_k(tmp_path, gearshift, nominal_cores, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    prof = tmp_path / "profile.json"
    r = gearshift("profile", *AUTO, f"--output.dir={tmp_path}", "--out", str(prof), "--repeats", "1", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    auto, md = tmp_path / "auto", tmp_path / "md"
    _run(auto, AUTO, {0: [2, 1], 3: [8, 3]}, cpu=True)
    fits = tmp_path / "fits.json"
    r = gearshift("simulate", f"--output.dir={auto}", "--profile", str(prof), "--save-overhead", str(fits))
    assert r.returncode == 0, r.stderr
    assert f"added the run's overhead to {fits} (1 fits)" in r.stdout
    saved = json.loads(fits.read_text())["fits"]
    assert len(saved) == 1 and saved[0]["points"] > 0 and saved[0]["label"].startswith(f"{auto}: gpt")
    assert saved[0]["work"] and all(f > 0 and c > 0 for f, c in saved[0]["work"])  # what the compute line carries
    assert f"{auto}: gpt, 2 workers, 2 stages x 1 replica, auto" in r.stdout
    assert "predicted with the run's CPU" in r.stdout and "cores together (fitted to the measured step)" in r.stdout
    for label in ("m=2 K=1, steps 0-2", "m=8 K=3, steps 3-5"):
        assert f"{label}: predicted" in r.stdout and f"{label}: measured" in r.stdout
    _run(md, MULTIDIR)
    prof6 = tmp_path / "profile6.json"
    r = gearshift("profile", *MULTIDIR, f"--output.dir={tmp_path}", "--out", str(prof6), "--repeats", "1",
                  "--warmup", "0")
    assert r.returncode == 0, r.stderr
    r = gearshift("simulate", f"--output.dir={md}", "--profile", str(prof6), "--overhead", str(fits))
    assert r.returncode == 0, r.stderr
    assert "multidir: 2 directions over 4 stages" in r.stdout and "measured" in r.stdout
    assert "carried: the median of 1 jobs' fits" in r.stdout  # the other run's fit prices this shape
    job = tmp_path / "job.toml"
    job.write_text("")
    r = gearshift("simulate", str(job), *TINY, f"--output.dir={md}", "--profile", str(prof))  # a 1F1B job's config
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "another job: model.layers is 6 there but 2 here" in r.stderr


def test_a_file_that_holds_no_fits_is_refused_naming_the_option(tmp_path):
    from gearshift.cli.simulate import _carried
    from gearshift.errors import UserError

    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(UserError, match="^--overhead: .* is not a file of overhead fits"):
        _carried(str(bad))
    empty = tmp_path / "empty.json"
    empty.write_text('{"fits": [{"points": 0}]}')
    with pytest.raises(UserError, match="^--overhead: .* holds no fit that measured a step"):
        _carried(str(empty))
    with pytest.raises(UserError, match="^--overhead: file not found"):
        _carried(str(tmp_path / "none.json"))


def test_the_replicas_spread_comes_from_the_run_s_steps(tmp_path):
    from gearshift.cli.simulate import run_spread
    from gearshift.sim.replicas import compute_spread

    busy = {1: [1.0, 2.0, 1.2, 2.0], 2: [1.1, 2.2, 0.9, 1.8], 3: [5.0, 2.0, 1.0, 2.0]}  # 2 replicas of 2 stages
    lines = [{"event": "schedule", "step": 1}] + [{"step": k, "step_time_s": 1.0, "busy_s": b} for k, b in busy.items()]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert run_spread(tmp_path, 2, [1, 2]) == pytest.approx(compute_spread([busy[1], busy[2]], 2))  # those steps only
    assert run_spread(tmp_path, 2, [1, 2]) > 0 and run_spread(tmp_path, 2, [4]) == 0.0
