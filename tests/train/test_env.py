"""One way to tell a torchrun worker: torchrun's variables without the local launcher's mark. Both entry
points (`gearshift train`, `python -m gearshift.train`) size the job from WORLD_SIZE under torchrun, and a
config error is one line per machine, no traceback."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gearshift.cli.main import main as cli_main
from gearshift.errors import ConfigError
from gearshift.train.__main__ import main as worker_main
from gearshift.train.env import TORCHRUN_VARS, job_device_choice, load_job, reports_config_errors, under_torchrun
from gearshift.train.worker import init_distributed

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.fixture
def env(monkeypatch):
    """A clean environment (no torchrun variables); set(**vars) adds some."""
    for v in (*TORCHRUN_VARS, "GEARSHIFT_PARENT_PID"):
        monkeypatch.delenv(v, raising=False)

    def set_(**kv: str) -> None:
        for k, v in kv.items():
            monkeypatch.setenv(k, v)
    return set_


def test_under_torchrun(env):
    assert not under_torchrun()
    env(**TORCHRUN)
    assert under_torchrun()
    env(GEARSHIFT_PARENT_PID="123")  # a worker of the local launcher, which sets torchrun's variables too
    assert not under_torchrun()


def test_torchrun_sets_the_worker_count(env):
    env(**TORCHRUN)
    assert load_job(None, ["--parallel.stages=2"]).cluster.workers == 2
    assert load_job(None, ["--parallel.stages=2", "--cluster.workers=4"]).cluster.workers == 2


def test_a_stage_count_torchrun_cannot_fill_names_both(env):
    env(**TORCHRUN)
    with pytest.raises(ConfigError) as e:
        load_job(None, [])  # the default job: 4 stages
    assert str(e.value) == ("parallel.stages: must divide cluster.workers (2 workers, 4 stages); under torchrun "
                            "cluster.workers is the 2 processes torchrun started")


def test_only_local_rank_0_reports_a_config_error(env):
    assert reports_config_errors()
    env(**TORCHRUN)
    assert not reports_config_errors()
    env(LOCAL_RANK="0")
    assert reports_config_errors()


@pytest.mark.parametrize("entry,prefix", [(lambda a: cli_main(["train", *a]), "gearshift train: error: "),
                                          (worker_main, "gearshift.train: error: ")])
@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_both_entry_points_fail_once_per_machine_with_one_line(env, capsys, entry, prefix, local_rank):
    env(**dict(TORCHRUN, LOCAL_RANK=local_rank))
    assert entry([]) == 2
    err = capsys.readouterr().err
    if local_rank == "0":
        assert err.startswith(prefix + "parallel.stages: must divide cluster.workers (2 workers, 4 stages); under "
                              "torchrun") and len(err.splitlines()) == 1
    else:
        assert err == ""


def test_worker_entry_outside_torchrun_says_how_to_start(env, capsys):
    assert worker_main(["--parallel.stages=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gearshift.train: error: not started by torchrun") and "gearshift train CONFIG" in err


def test_worker_entry_reads_config_then_overrides_in_any_order(env, capsys, tmp_path):
    """`-m gearshift.train --x=1 job.toml` once dropped job.toml silently; now it is the config."""
    job = tmp_path / "job.toml"
    job.write_text("[parallel]\nstages = 8\n")
    env(**dict(TORCHRUN, LOCAL_RANK="0"))
    assert worker_main(["--train.steps=3", str(job)]) == 2
    assert "(2 workers, 8 stages)" in capsys.readouterr().err
    assert worker_main([str(job), "--train.steps", "3"]) == 2
    assert "--train.steps: expected --train.steps=VALUE (got a space" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: cluster.device = cuda can run")
def test_a_torchrun_worker_asked_for_cuda_without_it_stops_before_joining(env):
    """Under torchrun no launcher checks first: the worker's ConfigError (one line from rank 0, exit 2: see
    run_as_worker) comes before it joins the process group, so no peer waits on it."""
    env(**dict(TORCHRUN, RANK="0", LOCAL_RANK="0"))
    for override, field in (("--cluster.device=cuda", "cluster.device: cuda"), ("--cluster.backend=nccl",
                                                                                  "cluster.backend: nccl")):
        cfg = load_job(None, ["--parallel.stages=2", override])
        with pytest.raises(ConfigError, match=f"^{field}, but torch finds no CUDA device on this machine"):
            init_distributed(cfg)
        assert not dist.is_initialized()


def test_outside_a_launched_job_auto_picks_what_the_jobs_workers_would(env, monkeypatch):
    """`gearshift profile` or `plan` on a one-GPU machine: a job of 4 local workers trains on the CPU (a GPU per
    local rank or none), so its profile is taken there; one worker gets the GPU; torchrun's count wins."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    four = load_job(None, [])
    assert job_device_choice(four).device == torch.device("cpu")
    one = load_job(None, ["--cluster.workers=1", "--parallel.stages=1"])
    assert job_device_choice(one).device == torch.device("cuda", 0)
    env(LOCAL_WORLD_SIZE="1")
    assert job_device_choice(four).device == torch.device("cuda", 0)
