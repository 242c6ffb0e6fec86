"""Losing workers: a worker killed mid-step (in a forward, in a layer migration, in an expert move, in a schedule
switch; rank 0 too, one loss after the other) is restarted by the elastic agent with the whole group, which goes on
from the in-memory copies: every finished step is kept, the step in flight is redone, and the losses equal those of
the run without faults."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from conftest import TINY
from gearshift.testing import spawn
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.launch import launch

pytestmark = pytest.mark.multiprocess

JOB = [*TINY, "--cluster.workers=2", "--parallel.stages=2", "--train.steps=4", "--train.checkpoint_every=0",
       "--train.warmup_steps=1"]


def _steps(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "event" not in r]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> list[dict]:
    """JOB's steps without faults, on one rank (depth does not change the math): one run that the tests with
    faults in JOB compare against."""
    out = tmp_path_factory.mktemp("plain")
    spawn(_plain, 1, str(out))
    return _steps(out)


def test_killed_workers_go_on_from_memory_with_the_same_losses(tmp_path, capfd, plain):
    move = [(0, 1), (1, 4)]  # before step 2, layer 1 moves to stage 1: rank 1 dies in that migration
    # then rank 0 dies in a forward, and rank 1 in the switch to 4 micro-batches before step 3
    faults = Forcing(partitions={2: move}, schedules={3: (4, 1)},
                     kills=[(1, 1, "migration"), (0, 2, "forward"), (1, 2, "switch")])
    assert launch(load_config(None, [*JOB, f"--output.dir={tmp_path / 'faults'}"]), quiet=True, forcing=faults) == 0
    said = capfd.readouterr().out
    assert said.count("restarted: going on from the in-memory copy") == 3 and "0 finished steps to replay" in said
    kills = (tmp_path / "faults" / ".launch" / "kills.jsonl").read_text().splitlines()
    assert [(k["rank"], k["where"]) for k in map(json.loads, kills)] == [(1, "migration"), (0, "forward"),
                                                                          (1, "switch")]
    got, want = _steps(tmp_path / "faults"), plain
    assert [r["step"] for r in got] == [0, 1, 2, 3]  # each step once: none lost, none logged twice
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) <= 1e-5


def _plain(rank: int, world: int, out: str, *more: str) -> None:
    from gearshift.train.loop import train

    train(load_config(None, [*JOB, "--cluster.workers=1", "--parallel.stages=1", f"--output.dir={out}", *more]))


def _trained(rank: int, world: int, args: list[str], forcing: Forcing | None = None) -> None:
    """The job of `args` on the spawned ranks, without faults: the reference a launch with faults is held to."""
    from gearshift.train.loop import train

    train(load_config(None, args), forcing=forcing)


MOE = ["--model.name=moe_gpt", "--model.experts=4", "--model.moe_every=1", "--train.batch_size=16"]
PLACE = ["--parallel.stages=1", "--parallel.experts=2", "--moe.every=1", "--moe.window=2", "--moe.replicas=1"]


def test_a_worker_killed_while_experts_move_goes_on_from_memory_with_the_same_losses(tmp_path, capfd):
    """Rank 1 dies in the expert move after step 0 (experts sent and received, not yet in place): the group goes on
    from the copies of step 1, taken before the move, so no expert is half-moved; the losses equal the same job's
    without faults (against one process they differ as MoE routing amplifies float order, faults or not)."""
    job = [*JOB, *MOE, *PLACE]
    faults = Forcing(move_experts=True, kills=[(1, 0, "migration")])
    assert launch(load_config(None, [*job, f"--output.dir={tmp_path / 'faults'}"]), quiet=True, forcing=faults) == 0
    assert "restarted: going on from the in-memory copy of step 1; 0 finished steps" in capfd.readouterr().out
    spawn(_trained, 2, [*job, f"--output.dir={tmp_path / 'plain'}"], Forcing(move_experts=True))
    got, want = _steps(tmp_path / "faults"), _steps(tmp_path / "plain")
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) <= 1e-5


def test_workers_lost_for_good_shrink_the_job_then_stop_it_with_a_checkpoint(tmp_path, capfd, plain):
    """Rank 1 is lost for good at step 1: the job is re-planned onto the one worker left (1 stage) and goes on from
    the in-memory copies; that worker is lost at step 3: no layout fits none, so the job stops with one line after
    writing the last finished step as a checkpoint, and --resume finishes it. Losses equal the run without faults."""
    out = tmp_path / "lost"
    faults = Forcing(kills=[(1, 1, "forward"), (0, 3, "forward")], lost=[0, 1])
    job = load_config(None, [*JOB, f"--output.dir={out}"])
    assert launch(job, quiet=True, forcing=faults) == 1
    err = capfd.readouterr().err
    assert "no layout of the job fits the 0 workers left" in err and "step_0000003.pt (--resume continues)" in err
    assert json.loads((out / ".launch" / "config.json").read_text())["parallel"]["stages"] == 1  # the shrunk job
    one = load_config(None, [*JOB, "--cluster.workers=1", "--parallel.stages=1", f"--output.dir={out}"])
    assert launch(one, resume=True, quiet=True) == 0
    got, want = _steps(out), plain
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) <= 1e-5


STEPS_BACK = 60  # a tiny step takes milliseconds: enough of them for the agent to see the worker back and regroup


@pytest.mark.serial  # the agent must regroup before the job's steps run out: it races the clock
def test_a_worker_back_grows_the_job_again_with_the_same_losses(tmp_path):
    """Rank 1 is lost for good at step 1 (the job goes on with 1 stage), and is back once step 1 is finished: the
    job grows back to 2 stages at a step boundary, from the in-memory copies. Each step once, the same losses."""
    out = tmp_path / "back"

    def host_comes_back() -> None:
        while True:
            try:
                done = max(r["step"] for r in _steps(out))
                small = json.loads((out / ".launch" / "config.json").read_text())["cluster"]["workers"] == 1
            except (OSError, ValueError, KeyError):
                done, small = -1, False
            if small and done >= 1:  # a step ran on the one worker; the rest is the window the agent grows in
                (out / ".launch" / "back.jsonl").write_text("{}\n")
                return
            time.sleep(0.05)

    threading.Thread(target=host_comes_back, daemon=True).start()
    job = load_config(None, [*JOB, f"--train.steps={STEPS_BACK}", f"--output.dir={out}"])
    assert launch(job, quiet=True, forcing=Forcing(kills=[(1, 1, "forward")], lost=[0])) == 0
    spawn(_plain, 1, str(tmp_path / "plain"), f"--train.steps={STEPS_BACK}")
    got, want = _steps(out), _steps(tmp_path / "plain")
    ranks = [len(r["busy_s"]) for r in got]
    assert [r["step"] for r in got] == list(range(STEPS_BACK))
    assert ranks[0] == 2 and 1 in ranks and ranks[-1] == 2  # 2 workers, then 1, then 2 again
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) <= 1e-5


def test_a_signal_hidden_behind_torch_s_metrics_wrapper_is_still_the_exit_code():
    """SIGTERM landing inside torch.distributed.elastic's metrics wrapper surfaces as its UnboundLocalError with
    the SignalException as context: the launcher still exits 128 + 15 (seen in `make test`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gearshift.train.elastic import _signal_in

    try:
        try:
            raise SignalException("got signal: 15", sigval=15)
        except SignalException:
            raise UnboundLocalError("cannot access local variable 'start'") from None
    except UnboundLocalError as e:
        assert e.__context__ is not None and _signal_in(e, SignalException) == 15
    assert _signal_in(ValueError("no signal"), SignalException) is None


def test_a_rank_lost_in_a_collective_and_one_killed_publishing_a_checkpoint_resume_from_the_last_complete_one(
        tmp_path, capfd, plain):
    """Two replicas, a checkpoint every step, an in-memory copy every other step. Rank 1 dies before its gradient
    all_reduce in step 1 while rank 0 waits inside it: both leave, and the group goes on from the checkpoint of
    step 1 (no copy yet). Rank 0 dies writing the checkpoint of step 3, its data and metadata written but not
    published: the group goes on from step 2 (the copy), the half-written one is never read, and it is written
    anew. Rank 1 dies in step 3: the checkpoint of step 3 is newer than any copy, and the group goes on from it
    (it is not dropped for the older copy). Each step once, the losses of the run without faults."""
    out = tmp_path / "disk"
    job = load_config(None, [*JOB, "--parallel.stages=1", "--train.checkpoint_every=1", "--train.snapshot_every=2",
                             f"--output.dir={out}"])
    faults = Forcing(kills=[(1, 1, "allreduce"), (0, 2, "checkpoint"), (1, 3, "forward")])
    assert launch(job, quiet=True, forcing=faults) == 0
    said = capfd.readouterr().out
    assert "restarted: going on from the checkpoint of step 1; 0 finished steps to replay" in said
    assert "restarted: going on from the in-memory copy of step 2; 1 finished steps to replay" in said
    assert "restarted: going on from the checkpoint of step 3; 0 finished steps to replay" in said
    kills = [(k["rank"], k["step"], k["where"]) for k in map(json.loads, (out / ".launch" / "kills.jsonl").open())]
    assert kills == [(1, 1, "allreduce"), (0, 2, "checkpoint"), (1, 3, "forward")]
    got, want = _steps(out), plain
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) <= 1e-5
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000002", "step_0000003", "step_0000004"]


def test_a_restart_after_a_migration_and_a_switch_keeps_the_partition_and_schedule_in_force(tmp_path, capfd, plain):
    """Layer 1 moves to stage 1 before step 1 and the schedule switches to 4 micro-batches before step 2; rank 0
    dies in step 3, where nothing is forced: the group goes on from the copy of step 3 under the partition and the
    (m, K) that were in force (not the configured ones), and the losses are those of the run without faults."""
    out = tmp_path / "moved"
    move = [(0, 1), (1, 4)]
    faults = Forcing(partitions={1: move}, schedules={2: (4, 1)}, kills=[(0, 3, "forward")])
    assert launch(load_config(None, [*JOB, f"--output.dir={out}"]), quiet=True, forcing=faults) == 0
    assert "restarted: going on from the in-memory copy of step 3; 0 finished steps" in capfd.readouterr().out
    got = _steps(out)
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert [r["partition"] for r in got] == [[[0, 2], [2, 4]], *[[list(b) for b in move]] * 3]
    events = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r.get("event") == "schedule"]
    last = events[-1]  # the restarted group's first choice
    assert last["trigger"] == "resumed" and last["step"] == 3 and last["chosen"][:2] == [4, 1], last
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, plain)) <= 1e-5
    meta = torch.load(out / "checkpoints" / "step_0000004" / "meta.pt", weights_only=True)  # what --resume restores
    assert meta["bounds"] == [list(b) for b in move] and meta["schedule"][:2] == [4, 1]


def test_the_agents_restart_reaches_the_user_as_one_line():
    """The agent logs a restart at INFO on its own logger, whose import sets it to WARNING: the line printed only
    where the level is set after that import (in a fresh process, as the launcher imports the agent inside the
    log's context; it was silent on every restart)."""
    import subprocess
    import sys

    code = ("import logging\n"
            "from gearshift.train.elastic import _agent_log\n"
            "with _agent_log(quiet=False):\n"
            "    import torch.distributed.elastic.agent.server.api as api\n"
            "    api.logger.info('[default] Worker group FAILED. 3/3 attempts left; will restart worker group')\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "a worker failed: restarting the workers (restart 1)" in got.stderr


def test_a_failure_is_a_repeat_only_with_the_same_python_errors_at_the_same_step():
    """What tells a bug (restarted once, then not again) from a lost worker (restarted up to max_restarts): each
    failed rank's Python error, a peer's closed connection left out, and the steps finished."""
    from types import SimpleNamespace

    from gearshift.train.elastic import failure_signature

    def failed(message, data=True):
        return SimpleNamespace(message={"message": message, "extraInfo": {"timestamp": time.time()}},
                               error_file_data={"message": message} if data else {})

    bug = {1: failed("RuntimeError: a bug"), 0: failed("RuntimeError: [pair.cc:553] Connection closed by peer")}
    assert failure_signature(bug, 4) == (((1, "RuntimeError: a bug"),), 4)
    assert failure_signature(bug, 4) == failure_signature({**bug, 0: failed("Connection reset by peer")}, 4)
    assert failure_signature(bug, 4) != failure_signature(bug, 5)
    assert failure_signature({1: failed("", data=False)}, 4) is None  # killed: no Python error
    assert failure_signature({0: bug[0]}, 4) is None  # only a peer's connection: the one that left said nothing


def test_the_root_failure_is_the_earliest_that_is_not_a_peers_closed_connection():
    """Error files carry whole-second timestamps: a tie went to rank 0, whose line was only that its peer left."""
    from types import SimpleNamespace

    from gearshift.train.elastic import root_failure

    def failed(message, at):
        return SimpleNamespace(message={"message": message}, timestamp=at)

    peer = failed("RuntimeError: [pair.cc:553] Connection closed by peer", 100)
    assert root_failure({0: peer, 1: failed("RuntimeError: a bug", 100)})[0] == 1
    assert root_failure({0: failed("ValueError: first", 99), 1: failed("RuntimeError: later", 100)})[0] == 0
    assert root_failure({0: peer})[0] == 0
