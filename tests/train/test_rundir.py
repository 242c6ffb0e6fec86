"""The run directory: an old run is moved aside (or the run refused), never mixed with a fresh one."""

from __future__ import annotations

import os

import pytest

from gearshift.errors import ConfigError
from gearshift.train.config import load_config
from gearshift.train.rundir import holds_run, prepare_run_dir


def _cfg(out, *args):
    return load_config(None, [f"--output.dir={out}", *args])


def test_an_empty_or_scratch_only_directory_is_used_as_it_is(tmp_path):
    out = tmp_path / "run"
    assert prepare_run_dir(_cfg(out), resume=False) is None and out.is_dir()
    (out / ".launch").mkdir(exist_ok=True)  # the launcher's scratch (the owner file: this process)
    assert not holds_run(out)
    assert prepare_run_dir(_cfg(out), resume=False) is None
    assert (out / ".launch").is_dir()


def test_an_old_run_is_moved_aside_or_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    assert prepare_run_dir(_cfg(out), resume=True) is None  # resuming continues it
    with pytest.raises(ConfigError, match="output.dir: .* holds another run"):
        prepare_run_dir(_cfg(out, "--output.existing=refuse"), resume=False)
    note = prepare_run_dir(_cfg(out), resume=False)
    (aside,) = [p for p in tmp_path.iterdir() if p != out]
    assert note.endswith(f"moved it to {aside}")
    assert (aside / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert out.is_dir() and [p.name for p in out.iterdir()] == [".launch"]  # the owner file alone


def test_output_dir_naming_a_file_is_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="output.dir: .* is a file"):
        prepare_run_dir(_cfg(f), resume=False)


def test_only_the_newest_output_keep_runs_moved_aside_are_kept(tmp_path):
    out = tmp_path / "run"
    older = [tmp_path / n for n in ("run.20260101-000000", "run.20260102-000000", "run.20260102-000000-2")]
    for p in [*older, tmp_path / "run.mine"]:  # run.mine: not a name the mover gives, never deleted
        p.mkdir()
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    note = prepare_run_dir(_cfg(out, "--output.keep_runs=2"), resume=False)
    left = sorted(p.name for p in tmp_path.iterdir())
    (aside,) = [n for n in left if n not in ("run", "run.mine", older[2].name)]
    assert left == sorted(["run", "run.mine", older[2].name, aside])  # the newest two aside: this one and -2
    assert note.endswith("deleted 2 older runs moved aside (output.keep_runs = 2)")
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    assert "deleted" not in prepare_run_dir(_cfg(out, "--output.keep_runs=0"), resume=False)
    with pytest.raises(ConfigError, match="output.keep_runs: must be >= 0"):
        _cfg(out, "--output.keep_runs=-1")


def test_resuming_another_runs_checkpoint_moves_the_old_run_aside(tmp_path):
    """--resume=PATH from another run's checkpoints starts a new run in output.dir (before: its steps were
    appended to the metrics and checkpoints of the run there); PATH inside output.dir continues it."""
    out, other = tmp_path / "run", tmp_path / "other" / "checkpoints" / "step_0000010"
    (out / "checkpoints" / "step_0000004").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    assert prepare_run_dir(_cfg(out), resume=str(out / "checkpoints" / "step_0000004")) is None
    assert (out / "metrics.jsonl").is_file()
    with pytest.raises(ConfigError, match="output.dir: .* holds another run"):
        prepare_run_dir(_cfg(out, "--output.existing=refuse"), resume=str(other))
    note = prepare_run_dir(_cfg(out), resume=str(other))
    assert note and "moved it to" in note and not holds_run(out)


def test_a_directory_a_live_job_still_runs_in_is_refused_not_moved_aside(tmp_path):
    """A second run into the output.dir of a job still running (its owner file names a live process) is one line
    naming that process, before anything moves (before: the live run was moved aside and went on writing into the
    new run's directory); once that process is gone, or the pid names another process, the run goes ahead."""
    import subprocess
    import sys

    from gearshift.train.rundir import OWNER, _start_time, release

    out = tmp_path / "run"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".launch").mkdir(parents=True)
        (out / "metrics.jsonl").write_text('{"step": 0}\n')
        (out / OWNER).write_text(f"{other.pid} {_start_time(other.pid)}\n")
        for resume in (False, True):
            with pytest.raises(ConfigError, match=rf"output.dir: .* is in use by a job still running \(process "
                                                  rf"{other.pid}\)"):
                prepare_run_dir(_cfg(out), resume=resume)
        assert (out / "metrics.jsonl").is_file() and [p.name for p in tmp_path.iterdir()] == ["run"]
        (out / OWNER).write_text(f"{other.pid} not-its-start-time\n")  # the pid reused by another process
        assert prepare_run_dir(_cfg(out), resume=True) is None
    finally:
        other.kill()
        other.wait()
    (out / OWNER).write_text(f"{other.pid} {_start_time(other.pid)}\n")
    assert prepare_run_dir(_cfg(out), resume=True) is None  # gone: free
    assert (out / OWNER).read_text().split()[0] == str(os.getpid())  # this process owns it now, and gives it back
    assert prepare_run_dir(_cfg(out), resume=True) is None
    release(out)
    assert not (out / OWNER).exists()
