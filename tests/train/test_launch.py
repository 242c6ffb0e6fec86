"""The local launcher: a job runs on N workers; a worker that raises stops the whole job fast with
that rank's error; nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY
from gearshift.testing import spawn
from gearshift.train.config import load_config
from gearshift.train.launch import run_ranks

pytestmark = pytest.mark.multiprocess


def _gearshift(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gearshift.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def _workers_alive(out_dir: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in ps.splitlines() if "gearshift.train" in ln and out_dir in ln]


def test_failing_worker_stops_job_with_its_error(tmp_path, capsys):
    out = tmp_path / "fail"
    cfg = load_config(None, [*TINY, "--cluster.workers=4", "--parallel.stages=4", "--train.steps=50",
                             f"--output.dir={out}"])
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg.to_dict()))
    cmd = [sys.executable, str(Path(__file__).with_name("faulty_worker.py")), "2:3", "--from-json", str(cfg_path)]
    t0 = time.time()
    rc = run_ranks(cmd, 4, 4, tmp_path / ".launch")
    elapsed = time.time() - t0
    assert rc == 1
    assert "rank 2 failed: RuntimeError: injected fault on rank 2 at step 3" in capsys.readouterr().err
    assert elapsed < 60, f"took {elapsed:.0f}s to stop"
    time.sleep(0.5)
    assert not _workers_alive(str(cfg_path)), "orphan workers left behind"


def _trained(rank: int, world: int, args: list[str]) -> None:
    from gearshift.train.loop import train

    train(load_config(None, args))


def _start(out, *args: str) -> subprocess.Popen:
    """A tiny 2-stage job in the background; returns once it has logged a step."""
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *TINY, "--cluster.workers=2", "--parallel.stages=2",
           f"--output.dir={out}", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
        assert time.time() < deadline and p.poll() is None, "job did not start"
        time.sleep(0.2)
    return p


def _losses(out) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


def test_sigterm_checkpoints_the_last_step_and_resume_is_exact(tmp_path):
    """SIGTERM (what schedulers send) stops every worker after its current step with a checkpoint, says so
    and exits 143; --resume then continues exactly: the same losses as a run never stopped."""
    import signal

    steps = ["--train.steps=40", "--train.warmup_steps=2", "--train.checkpoint_every=0"]
    out = tmp_path / "term"
    p = _start(out, *steps)
    p.send_signal(signal.SIGTERM)
    stdout, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    done = len(_losses(out))
    assert f"stopped after step {done} (SIGTERM)" in stdout and "--resume continues" in stdout, stdout
    assert f"0 -> {done} (of 40; --resume continues)" in stdout  # the summary: the steps this run ran
    assert done < 40 and (out / "checkpoints" / f"step_{done:07d}").is_dir()
    time.sleep(0.5)
    assert not _workers_alive(str(out))
    r = _gearshift("train", *TINY, "--cluster.workers=2", "--parallel.stages=2", f"--output.dir={out}", *steps,
                   "--resume")
    assert r.returncode == 0, r.stderr
    straight = tmp_path / "straight"  # the run never stopped: the same job on spawned ranks
    spawn(_trained, 2, [*TINY, "--cluster.workers=2", "--parallel.stages=2", f"--output.dir={straight}", *steps])
    assert _losses(out) == _losses(straight)


def test_ctrl_c_stops_every_worker(tmp_path):
    """SIGINT to the launcher (Ctrl-C) stops all workers after a checkpoint: exit 130, nothing left running;
    the closing line names SIGINT and the summary the steps that ran."""
    import signal

    out = tmp_path / "int"
    p = _start(out, "--train.steps=100000")
    p.send_signal(signal.SIGINT)
    stdout, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "SIGINT: stopping the workers" in err
    done = len(_losses(out))
    assert f"stopped after step {done} (SIGINT)" in stdout and "SIGTERM" not in stdout, stdout
    assert f"0 -> {done} (of 100000; --resume continues)" in stdout
    assert list((out / "checkpoints").glob("step_*"))
    time.sleep(0.5)
    assert not _workers_alive(str(out))


def test_train_writes_its_run_and_emulation_on_some_ranks_only_does_not_deadlock(tmp_path, capfd):
    """A run writes metrics, config, its own trace and report into its own directory. Rank 0 at slowdown 1 is
    not emulated, rank 1 is: both still build the adaptation loop and enter the same collectives (the
    profile's broadcast); before, rank 0 skipped it and the job hung. `gearshift train` run by this process (the
    tests above run it in fresh interpreters): capfd reads its workers' lines."""
    from gearshift.cli.main import main

    out = tmp_path / "emu"
    assert main(["train", *TINY, "--cluster.workers=2", "--parallel.stages=2", "--train.steps=2",
                 "--emulate.slowdown=[1,2]", "--cluster.timeout_s=30", f"--output.dir={out}", "--output.trace=true",
                 "--output.report=true"]) == 0
    said = capfd.readouterr().out
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert "unigram entropy" in said and "(open in a browser)" in said  # the summary points at the report
    assert json.loads((out / "config.json").read_text())["output"]["dir"] == str(out)
    assert "predicted (simulator)" in (out / "trace.json").read_text()  # the run's own trace, in its own dir
    assert (out / "report.html").is_file() and (out / "metrics.png").is_file()
