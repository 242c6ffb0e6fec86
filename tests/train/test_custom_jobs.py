"""Custom models and data under `gearshift train`: the MLP example (a map-style Dataset) launched with its functions
and by naming them, resumed exactly; the Hugging Face GPT-2 example as a 4-stage pipeline, profiled and planned;
models and data that do not import, build or fit as one line and exit 2 before any worker starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gearshift
from gearshift.errors import ConfigError
from gearshift.testing import spawn
from gearshift.train.forcing import Forcing

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--output.trace=false", "--output.progress=false", "--output.report=false"]
MLP = ["--cluster.workers=2", "--parallel.stages=2", "--parallel.microbatches=2", "--train.batch_size=8",
       "--train.warmup_steps=2", "--train.eval_every=3", "--train.eval_batches=2", *QUIET]
MIGRATE = Forcing(partitions={4: [(0, 2), (2, 8)]})  # layers 2-3 move to the other stage before step 4
HF = ["examples/hf_gpt2.toml", "--model.context=16", "--data.seq_len=16", "--model.width=32", "--model.layers=2",
      "--model.heads=2", "--data.max_bytes=100000", "--train.batch_size=8", "--parallel.microbatches=4", *QUIET]


def _gs(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "gearshift.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _records(out: Path) -> list[dict]:
    """The per-step records of a run's metrics.jsonl (not its re-planning events)."""
    return [r for ln in (out / "metrics.jsonl").read_text().splitlines() if "loss" in (r := json.loads(ln))]


def _trained(rank: int, world: int, args: list[str], forcing: Forcing) -> None:
    from gearshift.train.loop import train

    train(gearshift.load_config(None, args), forcing=forcing)


@pytest.mark.multiprocess
def test_mlp_example_launched_with_functions_equals_naming_them_and_resumes_exactly(tmp_path, capfd):
    """launch(cfg, model=build, data=data) runs the same job as model.name / data.name naming them: a run launched
    with the functions, stopped after 3 steps and resumed by naming them, gives the losses of the named job run
    straight (on spawned ranks: the reference) exactly (a shuffled Dataset), through a live migration of the custom
    model's layers (forced: launch(..., forcing=...))."""
    from examples.mlp import build, data

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    env = {"PYTHONPATH": str(ROOT)}
    named = ["--model.name=examples.mlp:build", "--data.name=examples.mlp:data", *MLP, "--train.steps=6",
             f"--output.dir={resumed}"]
    spawn(_trained, 2, [*named, f"--output.dir={straight}"], MIGRATE)
    cfg = gearshift.load_config(None, [*MLP, "--train.steps=6", "--train.stop_after=3", f"--output.dir={resumed}"])
    assert gearshift.launch(cfg, model=build, data=data, quiet=True, env=env, forcing=MIGRATE) == 0
    capfd.readouterr()
    assert gearshift.launch(gearshift.load_config(None, named), resume=True, quiet=True, env=env,
                            forcing=MIGRATE) == 0
    out = capfd.readouterr().out  # rank 0's summary
    a, b = _records(straight), _records(resumed)
    assert [x["loss"] for x in a] == [x["loss"] for x in b] and len(a) == 6
    assert [x.get("val_loss") for x in a] == [x.get("val_loss") for x in b] and "val_loss" in a[2]
    assert a[0]["partition"] == [[0, 4], [4, 8]]  # 8 layers (the example's default depth 6 + 2)
    assert a[4]["partition"] == b[4]["partition"] == [[0, 2], [2, 8]]  # migrated
    assert "validation loss" in out and "unigram entropy" not in out  # the data has no such figure


def test_a_forced_partition_that_does_not_fit_the_model_is_one_line_before_any_worker_starts(tmp_path):
    import gearshift

    cfg = gearshift.load_config(None, ["--model.name=examples.mlp:build", "--data.name=examples.mlp:data", *MLP,
                                       f"--output.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"^Forcing.partitions\[4\]: ranges must end at 8 \(the number of layers\), "
                                          r"got 6$"):
        gearshift.launch(cfg, forcing=Forcing(partitions={4: [(0, 2), (2, 6)]}))
    assert not (tmp_path / "run").exists()


BAD = [
    (["--model.name=no_such_pkg.models:build", "--data.seq_len=16"], "model.name: cannot import 'no_such_pkg.models'"),
    (["--model.name=examples.mlp:build", "--data.name=examples.mlp:data", "--data.inputs=31"],
     "model: layer 0 (Linear) fails on its input of shape (2, 31) (torch.float32)"),
    (["--model.name=tests.train.custom_parts:head", "--data.name=tests.train.custom_parts:classes"],
     "model: the loss cross_entropy fails on the last layer's output (8, 3) (torch.float32) and the data's targets "
     "(8,) (torch.int64): IndexError: Target 3 is out of bounds."),
]


def _check_one_line(r: subprocess.CompletedProcess, message: str, out: Path) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()  # no run directory: no worker started


@pytest.mark.parametrize("args, message", BAD)
def test_bad_models_and_data_are_one_line_before_any_worker_starts(tmp_path, args, message):
    """Found by the launcher's check, which imports the model and runs it on the data's sample (validating the
    config never builds a model); the other messages are tested in-process (test_model_spec, test_layout,
    test_datasets). `gearshift train` run by this process (the next test runs one in a fresh interpreter)."""
    from gearshift.cli.main import main

    out = tmp_path / "run"
    argv = ["train", *args, *MLP, f"--output.dir={out}"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(argv)
    _check_one_line(subprocess.CompletedProcess(argv, rc, stdout.getvalue(), stderr.getvalue()), message, out)


@pytest.mark.subprocess
def test_a_bad_model_is_one_line_from_the_command_as_a_user_runs_it(tmp_path):
    """The same check in a fresh interpreter, as a user runs it: exit 2, one line on stderr, no traceback."""
    (args, message), out = BAD[1], tmp_path / "run"
    _check_one_line(_gs("train", *args, *MLP, f"--output.dir={out}"), message, out)


@pytest.mark.multiprocess
def test_an_error_in_the_users_forward_is_one_traceback_naming_its_rank(tmp_path):
    """A bug the launcher's check cannot reach (it runs only while training) stops the job with exit 1 and the
    raising rank's traceback once, down to the user's line; each worker's failure is one line naming its rank, not
    a prefixed traceback per rank (before: one from each of the 2 ranks and the launcher's)."""
    r = _gs("train", "--model.name=tests.train.custom_parts:fails_in_training",
            "--data.name=tests.train.custom_parts:classes", *MLP, "--train.steps=3", "--cluster.max_restarts=0",
            f"--output.dir={tmp_path / 'run'}")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("Traceback") == 1 and "[rank" not in r.stderr, r.stderr
    assert "gearshift: rank 1 failed: RuntimeError: a bug in the user's forward" in r.stderr
    assert "custom_parts.py" in r.stderr.split("--- rank 1 traceback ---")[1]


@pytest.mark.multiprocess
def test_a_bug_that_fails_again_after_a_restart_is_not_restarted_again(tmp_path):
    """The same error at the same step after a restart is a bug in the job, not a lost worker: one restart, then a
    line saying so and the traceback once (before: cluster.max_restarts = 3 restarts, each failing alike)."""
    r = _gs("train", "--model.name=tests.train.custom_parts:fails_in_training",
            "--data.name=tests.train.custom_parts:classes", *MLP, "--train.steps=3", f"--output.dir={tmp_path / 'run'}")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("restarting the workers") == 1, r.stderr
    assert "gearshift: the same error again after a restart, with 0 steps finished as before: a bug in the job, not " \
           "a lost worker; not restarted again" in r.stderr
    assert r.stderr.count("Traceback") == 1


def test_a_worker_of_the_launcher_shows_its_failure_as_one_line(monkeypatch, capsys):
    """Under gearshift's launcher a failing worker's excepthook prints one line naming its rank (the launcher
    prints the root cause's traceback once); a peer's gloo 'connection closed' says a peer went first, not gloo's
    long line."""
    import sys

    from gearshift.train.worker import run_as_worker

    monkeypatch.setenv("GEARSHIFT_PARENT_PID", str(os.getpid()))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    for error, line in [
        (ValueError("bad batch\nmore detail"), "gearshift: rank 3 failed: ValueError: bad batch\n"),
        (RuntimeError("[../pair.cc:553] Connection closed by peer [127.0.0.1]:1. This is typically caused by a "
                      "remote worker crashing. GLHF!"),
         "gearshift: rank 3 stopped: a peer's connection closed (the rank that failed first says why)\n"),
    ]:
        def body(e=error):
            raise e

        with pytest.raises(type(error)) as raised:
            run_as_worker(body)
        sys.excepthook(raised.type, raised.value, raised.tb)
        assert capsys.readouterr().err == line


def test_workers_import_the_model_module_from_where_the_launcher_found_it(tmp_path, monkeypatch):
    """A script run from another directory (`python sub/train.py`: sys.path has sub/, the working directory does
    not hold the module) launches workers that import its model and data modules from there too (before: every
    worker failed with "cannot import"); a module in the working directory needs nothing added."""
    from gearshift.train.launch import _with_module_roots

    pkg = tmp_path / "sub" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text("from tests.train.custom_parts import head as build, classes as data\n")
    monkeypatch.syspath_prepend(str(tmp_path / "sub"))
    monkeypatch.delitem(sys.modules, "mypkg", raising=False)
    monkeypatch.delitem(sys.modules, "mypkg.parts", raising=False)
    import mypkg.parts  # noqa: F401 - what the user's script imported

    cfg = gearshift.load_config(None, ["--model.name=mypkg.parts:build", "--data.name=mypkg.parts:data"])
    env = _with_module_roots(cfg, {"OTHER": "1"})
    assert env["OTHER"] == "1" and env["PYTHONPATH"].split(os.pathsep) == [str((tmp_path / "sub").resolve())]
    monkeypatch.chdir(tmp_path / "sub")
    assert _with_module_roots(cfg, None) is None
