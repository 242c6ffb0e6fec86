"""Checkpoints: 10 steps straight equal 5 + --resume + 5 (losses and parameters, exactly); resuming
under another partition works; corrupt or mismatched checkpoints are one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import TINY
from gearshift.errors import DataError
from gearshift.testing import spawn
from gearshift.train.checkpoint import (
    OLD_FORMAT,
    checkpoint_path,
    checkpoints,
    completed,
    find_resumable,
    job_fingerprint,
    latest_checkpoint,
    lr_schedule,
    lr_schedule_note,
    prune_checkpoints,
    read_checkpoint,
    save_checkpoint,
)
from gearshift.train.config import load_config
from gearshift.train.launch import launch
from gearshift.train.metrics import read_metrics


def _argv(out: Path, *args: str) -> list[str]:
    return ["train", *TINY, f"--output.dir={out}", "--train.steps=10", "--train.checkpoint_every=5",
            "--train.warmup_steps=2", *args]


def _train(capfd, out: Path, *args: str) -> subprocess.CompletedProcess:
    """`gearshift train` run by this process, as a user runs it but for the interpreter's start-up (test_launch
    runs it in fresh ones): the launcher's lines and its workers' (rank 0's summary), as capfd reads them."""
    from gearshift.cli.main import main

    capfd.readouterr()
    rc = main(_argv(out, *args))
    said = capfd.readouterr()
    return subprocess.CompletedProcess(["gearshift", *_argv(out, *args)], rc, said.out, said.err)


def _train_here(out: Path, *args: str) -> subprocess.CompletedProcess:
    """_train for the answers given before any worker starts (bad input, exit 2; a run already complete)."""
    from gearshift.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(_argv(out, *args))
    return subprocess.CompletedProcess(["gearshift", *_argv(out, *args)], rc, stdout.getvalue(), stderr.getvalue())


def _losses(out: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _final(out: Path) -> dict:
    ck = read_checkpoint(latest_checkpoint(out))
    assert ck["step"] == 10
    return ck


def _trained(rank: int, world: int, args: list[str]) -> None:
    from gearshift.train.loop import train

    train(load_config(None, args))


def _launch(out: Path, *args: str, resume: bool = False) -> int:
    """_train's job launched from this process (no launcher interpreter to start): where no console line is tested."""
    cfg = load_config(None, [*TINY, f"--output.dir={out}", "--train.steps=10", "--train.checkpoint_every=5",
                             "--train.warmup_steps=2", *args])
    return launch(cfg, resume=resume, quiet=True)


@pytest.mark.multiprocess
def test_resume_is_exact_and_partition_independent_and_each_run_traces_its_last_step(tmp_path):
    """The cut-short run and its resumption trace with output.trace_step = -1 (the last step): each traces the
    step it ends after (train.stop_after ends the first before train.steps)."""
    straight, resumed, moved = tmp_path / "straight", tmp_path / "resumed", tmp_path / "moved"
    two = ["--cluster.workers=2", "--parallel.stages=2"]
    spawn(_trained, 2, _argv(straight, *two)[1:])  # the reference: the same job on spawned ranks, not launched
    # 5 steps (a run cut short, as by a preemption), then resume for the last 5
    assert _launch(resumed, *two, "--train.stop_after=5", "--output.trace=true") == 0
    assert "measured step 4" in (resumed / "trace.json").read_text()
    shutil.copytree(resumed, moved)  # the same cut-short run, resumed below by another layout
    assert _launch(resumed, *two, "--output.trace=true", resume=True) == 0
    assert "measured step 9" in (resumed / "trace.json").read_text()
    assert _losses(resumed) == _losses(straight)
    a, b = _final(straight), _final(resumed)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for name in a["optim"]:
        for k in a["optim"][name]:
            assert torch.equal(a["optim"][name][k], b["optim"][name][k]), (name, k)
    # the same checkpoint resumed by a 1-stage job on 1 worker: state is keyed by global layer index
    assert _launch(moved, "--cluster.workers=1", "--parallel.stages=1", resume=True) == 0
    torch.testing.assert_close(torch.tensor(_losses(moved)), torch.tensor(_losses(straight)), rtol=1e-5, atol=1e-6)
    c = _final(moved)
    for name in a["model"]:
        torch.testing.assert_close(c["model"][name], a["model"][name], rtol=1e-5, atol=1e-6)


def test_corrupt_and_mismatched_checkpoints_are_clear_errors(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step_0000005.pt").write_bytes(b"not a checkpoint")
    r = _train_here(out, "--resume")
    assert r.returncode == 2
    assert "corrupt or not a Gearshift checkpoint" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    job = job_fingerprint(load_config(None, [*TINY, "--model.layers=3"]))
    save_checkpoint(out / "checkpoints" / "step_0000006.pt", {"format": OLD_FORMAT, "step": 6, "job": job})
    r = _train_here(out, "--resume")
    assert r.returncode == 2 and "model.layers is 3 in the checkpoint but 2 in the config" in r.stderr
    r = _train_here(tmp_path / "empty", "--resume")
    assert r.returncode == 2 and "no checkpoint" in r.stderr


def test_atomic_write_leaves_no_temp_files(tmp_path):
    p = tmp_path / "c" / "step_0000001.pt"
    save_checkpoint(p, {"format": 1, "x": torch.ones(3)})
    assert [f.name for f in p.parent.iterdir()] == ["step_0000001.pt"]


def _fake(cfg, step: int) -> Path:
    """An old-format checkpoint file (the whole job in one file: what --resume still reads)."""
    path = checkpoint_path(cfg.output.dir, step).with_suffix(".pt")
    save_checkpoint(path, {"format": OLD_FORMAT, "step": step, "job": job_fingerprint(cfg)})
    return path


def test_resume_skips_a_corrupt_or_truncated_newest_checkpoint_and_a_path_picks_one(tmp_path):
    cfg = load_config(None, [*TINY, f"--output.dir={tmp_path}"])
    good = [_fake(cfg, s) for s in (5, 10)]
    truncated, corrupt = _fake(cfg, 15), checkpoint_path(tmp_path, 20).with_suffix(".pt")
    truncated.write_bytes(truncated.read_bytes()[:40])
    corrupt.write_bytes(b"not a checkpoint")
    path, ck, note = find_resumable(cfg)
    assert path == good[1] and ck["step"] == 10
    assert note == ("gearshift: --resume: skipped step_0000020.pt, step_0000015.pt (corrupt or truncated); resuming "
                    "from step_0000010.pt (--resume=PATH picks another)")
    path, ck, note = find_resumable(cfg, str(good[0]))
    assert path == good[0] and ck["step"] == 5
    assert note.endswith("continuing from step 5; this run replaces the later checkpoints step_0000020.pt, "
                         "step_0000015.pt, step_0000010.pt")
    with pytest.raises(DataError, match="corrupt or not a Gearshift checkpoint"):
        find_resumable(cfg, str(corrupt))
    with pytest.raises(DataError, match="--resume=.*nope.pt: no such checkpoint"):
        find_resumable(cfg, str(tmp_path / "nope.pt"))
    other = load_config(None, [*TINY, f"--output.dir={tmp_path}", "--train.seed=1"])
    with pytest.raises(DataError, match="train.seed is 0 in the checkpoint but 1"):  # another job: never skipped
        find_resumable(other)


def test_only_the_newest_keep_checkpoints_are_kept(tmp_path):
    cfg = load_config(None, [*TINY, f"--output.dir={tmp_path}"])
    paths = [_fake(cfg, s) for s in (1, 2, 10, 3)]
    half = checkpoint_path(tmp_path, 11).with_name(".step_0000011.tmp")  # a crash between writing and publishing
    (half / "x").mkdir(parents=True)
    assert prune_checkpoints(tmp_path, 0) == [] and len(checkpoints(tmp_path)) == 4 and not half.exists()
    assert prune_checkpoints(tmp_path, 2) == [paths[1], paths[0]]
    assert checkpoints(tmp_path) == [paths[2], paths[3]]
    assert load_config(None, ["--train.steps=50"]).train.keep_checkpoints == 3
    with pytest.raises(Exception, match="train.keep_checkpoints: must be >= 0"):
        load_config(None, ["--train.keep_checkpoints=-1"])


def test_a_step_checkpointed_again_keeps_its_earlier_checkpoint_until_the_new_one_is_in_place(tmp_path):
    """A crash between the two renames of a same-step replace leaves the step's earlier checkpoint as
    .step_N.old and no step_N: it still counts (and loads); once a step_N is in place, pruning removes it."""
    cfg = load_config(None, [*TINY, f"--output.dir={tmp_path}"])
    first, second = _fake(cfg, 2), _fake(cfg, 4)
    replaced = second.with_name(".step_0000004.old")
    second.rename(replaced)
    assert checkpoints(tmp_path) == [replaced, first]
    path, ck, _ = find_resumable(cfg)
    assert path == replaced and ck["step"] == 4
    assert prune_checkpoints(tmp_path, 0) == [] and replaced.exists()  # the only copy of step 4: kept
    again = _fake(cfg, 4)
    assert checkpoints(tmp_path) == [again, first]
    assert prune_checkpoints(tmp_path, 0) == [] and not replaced.exists()


def test_a_finished_run_resumed_is_complete():
    cfg = load_config(None, [*TINY, "--train.steps=10"])
    assert completed(cfg, {"step": 9}) is None
    assert "already complete at step 10 (train.steps = 10)" in completed(cfg, {"step": 10})


def test_a_run_resumed_under_another_learning_rate_curve_says_so():
    cfg = load_config(None, [*TINY, "--train.steps=10"])
    assert lr_schedule_note(cfg, {"step": 5, "lr_schedule": lr_schedule(cfg)}) is None
    assert lr_schedule_note(cfg, {"step": 5}) is None  # a checkpoint written before the curve was recorded
    longer = load_config(None, [*TINY, "--train.steps=20", "--train.min_lr=0"])
    note = lr_schedule_note(longer, {"step": 5, "lr_schedule": lr_schedule(cfg)})
    assert note.startswith("gearshift: resuming at step 5 with train.steps 10 -> 20, train.min_lr ")
    assert "-> 0.0" in note and "warmup_steps" not in note and "\n" not in note


@pytest.mark.multiprocess
def test_resume_skips_a_corrupt_checkpoint_keeps_three_says_complete_and_a_fresh_run_moves_it_aside(tmp_path, capfd):
    """One worker: 4 steps, a checkpoint each, 3 kept; the newest corrupted; --resume to 5 steps skips it (one
    line) and continues from step 3; --resume again says the run is complete, exit 0; --resume=PATH picks one, and
    the checkpoints after it go (its continuation replaces them). Then a fresh run into that run's directory moves
    it aside (and says where) instead of mixing with it; --resume refuses a checkpoint whose job (model, data, seed,
    batch size) differs from the config."""
    out = tmp_path / "run"
    one = ["--cluster.workers=1", "--parallel.stages=1", "--train.checkpoint_every=1"]
    assert _launch(out, *one, "--train.steps=4") == 0
    assert [p.name for p in checkpoints(out)] == ["step_0000004", "step_0000003", "step_0000002"]
    meta = checkpoint_path(out, 4) / "meta.pt"
    meta.write_bytes(meta.read_bytes()[:100])  # truncated
    r = _train(capfd, out, *one, "--train.steps=5", "--resume")
    assert r.returncode == 0, r.stderr
    assert "skipped step_0000004 (corrupt or truncated); resuming from step_0000003 " in r.stdout
    assert r.stdout.count("step_0000004") == 1  # one line: the skip, not its deletion too
    assert "resuming at step 3 with train.steps 4 -> 5: the learning rate follows the new" in r.stdout
    assert [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert "3 -> 5 " in r.stdout  # the summary: the steps this run ran
    r = _train_here(out, *one, "--train.steps=5", "--resume")
    assert r.returncode == 0 and "already complete at step 5 (train.steps = 5)" in r.stdout, r.stdout
    assert "nan" not in r.stdout
    r = _train(capfd, out, *one, "--train.steps=5", f"--resume={checkpoint_path(out, 3)}")
    assert r.returncode == 0 and "already complete" not in r.stdout, r.stderr
    assert "continuing from step 3; this run replaces the later checkpoints step_0000005, step_0000004" \
        in r.stdout
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 5
    assert [p.name for p in checkpoints(out)] == ["step_0000005", "step_0000004", "step_0000003"]

    two = [*one, "--train.steps=2"]
    r = _train(capfd, out, *two, "--train.seed=1")
    assert r.returncode == 0, r.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
    assert len(aside) == 1 and f"moved it to {aside[0]}" in r.stdout
    assert [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert [p.name for p in checkpoints(aside[0])] == ["step_0000005", "step_0000004", "step_0000003"]
    r = _train_here(out, *two, "--resume")
    assert r.returncode == 2 and "train.seed is 1 in the checkpoint but 0 in the config" in r.stderr, r.stderr
    r = _train_here(out, *two, "--train.seed=1", "--output.existing=refuse")
    assert r.returncode == 2 and "output.dir:" in r.stderr and "holds another run" in r.stderr


def test_a_moe_checkpoint_gives_back_its_expert_placement_where_it_fits(tmp_path):
    from gearshift.planner.expert_map import ExpertMap
    from gearshift.train.checkpoint import Checkpointer, checkpoint_path

    moe = ["--model.name=moe_gpt", "--model.experts=8", "--parallel.stages=1", f"--output.dir={tmp_path}"]
    cfg = load_config(None, moe + ["--parallel.experts=4"])
    holders = [[0, 1], [1], [2], [3], [0], [1, 2], [2, 3], [3, 0]]
    save_checkpoint(checkpoint_path(tmp_path, 5).with_suffix(".pt"), {
        "format": OLD_FORMAT, "step": 5, "job": job_fingerprint(cfg),
        "experts": {"width": 4, "experts": 8, "holders": {"3": holders}}})
    got = Checkpointer(cfg).expert_placements(8, 4)
    assert got == {3: ExpertMap(tuple(tuple(h) for h in holders), 4)}
    assert Checkpointer(load_config(None, moe + ["--parallel.experts=2"])).expert_placements(8, 2) is None


@pytest.mark.multiprocess
def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_earlier_checkpoints(tmp_path, capfd):
    """The checkpoint of step 4 cannot be written (the file size limit: every write past 64 KiB fails as on a full
    disk, on both ranks): the job stops with one line naming output.dir and exit 2, the half-written directory is
    gone, step 2's checkpoint is still the one --resume takes; a write that fails on rank 0 alone stops both ranks
    alike; --resume then finishes the job."""
    import resource

    out = tmp_path / "full"
    two = ["--cluster.workers=2", "--parallel.stages=2", "--train.checkpoint_every=2", "--train.snapshot_every=0"]
    assert _launch(out, *two, "--train.stop_after=2") == 0
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    capfd.readouterr()
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # the workers the launch starts inherit it
    try:
        cfg = load_config(None, [*TINY, f"--output.dir={out}", "--train.steps=10", "--train.warmup_steps=2", *two])
        rc = launch(cfg, resume=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"gearshift train: error: output.dir: cannot write the checkpoint {checkpoint_path(out, 4)}: File "
                   "too large (the earlier checkpoints are kept; --resume continues from the newest)"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000002"]
    path, ck, _ = find_resumable(load_config(None, [*TINY, f"--output.dir={out}"]))
    assert path == checkpoint_path(out, 2) and ck["step"] == 2
    # a write that fails on rank 0 alone (its directory cannot be made: a file holds the name): every rank stops
    blocker = out / "checkpoints" / ".step_0000004.tmp"
    blocker.write_text("")
    capfd.readouterr()
    assert launch(cfg, resume=True) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [f"gearshift train: error: output.dir: cannot write the checkpoint {checkpoint_path(out, 4)}: File "
                   "exists (the earlier checkpoints are kept; --resume continues from the newest)"]
    blocker.unlink()
    assert _launch(out, *two, resume=True) == 0
    assert [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == list(range(10))


@pytest.mark.multiprocess
def test_a_full_disk_at_a_metrics_line_is_one_line_and_exit_2_without_restarts(tmp_path, capfd):
    """metrics.jsonl cannot grow past 3 KB (the file size limit, as a full disk) after a few steps: rank 0's one
    line naming output.dir, exit 2, no restart (before: a traceback, and every restart failed on the torn line);
    the other rank, whose peer left, says nothing more; the metrics file holds whole lines."""
    import resource

    out = tmp_path / "full"
    cfg = load_config(None, [*TINY, f"--output.dir={out}", "--train.steps=10", "--cluster.workers=2",
                             "--parallel.stages=2", "--train.checkpoint_every=0", "--train.snapshot_every=0"])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    capfd.readouterr()
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, hard))
    try:
        rc = launch(cfg)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"gearshift train: error: output.dir: cannot write {out / 'metrics.jsonl'}: ")
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "event" not in r]
    assert 0 < len(steps) < 10 and (out / "metrics.jsonl").read_text().endswith("\n")


def test_a_key_the_checkpoints_job_left_unset_is_named_so_with_the_way_to_its_weights(tmp_path):
    cfg = load_config(None, [*TINY, f"--output.dir={tmp_path}"])
    path = checkpoint_path(cfg.output.dir, 3).with_suffix(".pt")
    save_checkpoint(path, {"format": OLD_FORMAT, "step": 3, "job": {**job_fingerprint(cfg), "train.seed": None}})
    with pytest.raises(DataError, match=r"train.seed is unset \(its default\) in the checkpoint but 0 in the "
                                        r"config .*gearshift export it, then model.init in a new output.dir"):
        find_resumable(cfg)
