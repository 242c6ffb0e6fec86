"""Under torchrun, as the README shows it: the example job runs on the processes torchrun starts, and a job
those processes cannot hold fails with our one line (once), no traceback from gearshift."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.train.launch import free_port

pytestmark = pytest.mark.multiprocess
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.toml"


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "gearshift.train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=cwd)


def test_example_job_runs_under_torchrun(tmp_path):
    r = _torchrun(str(EXAMPLE), "--train.steps=2", "--train.eval_every=0", "--data.max_bytes=100000",
                  "--output.trace=false", "--output.progress=false", "--output.report=false",
                  f"--output.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_default_job_on_two_processes_is_one_line(tmp_path):
    r = _torchrun(cwd=tmp_path)  # the default job has 4 stages
    assert r.returncode != 0
    ours = [ln for ln in r.stderr.splitlines() if "gearshift.train: error:" in ln]
    assert len(ours) == 1, r.stderr[-3000:]
    assert ours[0].endswith("gearshift.train: error: parallel.stages: must divide cluster.workers (2 workers, "
                            "4 stages); under torchrun cluster.workers is the 2 processes torchrun started")
    assert not re.search(r'File ".*gearshift', r.stderr), r.stderr[-3000:]  # torchrun's own summary only
