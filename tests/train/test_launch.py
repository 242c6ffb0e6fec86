"""The local launcher: a job runs on N workers; a worker that raises stops the whole job fast with
that rank's error; nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import TINY


def _gearshift(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gearshift.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def _workers_alive(out_dir: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in ps.splitlines() if "gearshift.train" in ln and out_dir in ln]


def test_train_runs_and_writes_metrics(tmp_path):
    out = tmp_path / "run"
    r = _gearshift("train", *TINY, "--cluster.workers=2", "--parallel.stages=2", "--train.steps=3",
                   f"--output.dir={out}")
    assert r.returncode == 0, r.stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert "unigram entropy" in r.stdout


def test_failing_worker_stops_job_with_its_error(tmp_path):
    out = tmp_path / "fail"
    t0 = time.time()
    r = _gearshift("train", *TINY, "--cluster.workers=4", "--parallel.stages=4", "--train.steps=50",
                   f"--output.dir={out}", env={"GEARSHIFT_INJECT_FAULT": "2:3"})
    elapsed = time.time() - t0
    assert r.returncode == 1
    assert "rank 2 failed: RuntimeError: injected fault on rank 2 at step 3" in r.stderr
    assert elapsed < 60, f"took {elapsed:.0f}s to stop"
    time.sleep(0.5)
    assert not _workers_alive(str(out)), "orphan workers left behind"


def _losses_by_allreduce(tmp_path, stages: int, algos: tuple[str, ...], auto_line: str) -> dict[str, list]:
    """Train 3 steps on 4 workers, 2 per node, once per parallel.allreduce value; the losses of each. Only
    `auto` prints auto_line (it measures the links first and says what it chose)."""
    losses = {}
    for algo in algos:
        out = tmp_path / algo
        r = _gearshift("train", *TINY, "--cluster.workers=4", "--cluster.ranks_per_node=2",
                       f"--parallel.stages={stages}", f"--parallel.allreduce={algo}", "--train.steps=3",
                       f"--output.dir={out}")
        assert r.returncode == 0, r.stderr
        assert (auto_line in r.stdout) == (algo == "auto"), r.stdout
        assert ("(measured " in r.stdout) == (algo == "auto"), r.stdout  # auto timed its candidates
        losses[algo] = [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return losses


def test_data_parallel_allreduce_algorithms_train_alike(tmp_path):
    """parallel.allreduce only changes how gradients travel: ring, hierarchical and auto give gloo's losses."""
    losses = _losses_by_allreduce(tmp_path, 1, ("gloo", "ring", "hierarchical", "auto"), "all-reduce auto (2 nodes):")
    for algo in ("ring", "hierarchical", "auto"):
        assert losses[algo] == pytest.approx(losses["gloo"], rel=1e-6), algo


def test_replicated_pipeline_allreduce_algorithms_train_alike(tmp_path):
    """2 stages x 2 replicas: each stage's replicas sync with parallel.allreduce over their own group, and
    every algorithm gives the losses of the runtime's flat gloo all-reduce."""
    losses = _losses_by_allreduce(tmp_path, 2, ("gloo", "hierarchical", "auto"),
                                  "all-reduce auto (2 nodes, each stage's 2 replicas):")
    for algo in ("hierarchical", "auto"):
        assert losses[algo] == pytest.approx(losses["gloo"], rel=1e-6), algo


def test_ctrl_c_stops_every_worker(tmp_path):
    """SIGINT to the launcher (Ctrl-C) stops all workers cleanly: exit 130, nothing left running."""
    import signal

    out = tmp_path / "int"
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *TINY, "--cluster.workers=2", "--parallel.stages=2",
           "--train.steps=100000", f"--output.dir={out}"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
        assert time.time() < deadline and p.poll() is None, "job did not start"
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err
    time.sleep(0.5)
    assert not _workers_alive(str(out))


def test_runs_under_torchrun(tmp_path):
    """The same job under torchrun (env:// rendezvous); the worker count comes from torchrun."""
    out = tmp_path / "torchrun"
    from gearshift.comm.launch import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(free_port())]
    args = [a for a in TINY if a != "--output.progress=false"]
    r = subprocess.run([*torchrun, "-m", "gearshift.train", *args, "--parallel.stages=2", "--train.steps=2",
                        f"--output.dir={out}"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
