"""Checkpoints keyed by global layer index (independent of the partition that wrote them), written
atomically (temp file, fsync, rename) and loaded with `torch.load(weights_only=True)`. A checkpoint carries
its job's fingerprint, and `--resume` refuses one written by another job. Tensors are saved from the CPU and
loaded onto it, then placed on each rank's device: a checkpoint written on GPUs resumes on CPUs and back. A MoE
job's checkpoint also carries its expert->rank map and the expert placement's state (the loads it forecasts
from), so a resumed run holds the experts where the interrupted one did and decides as it would have.
`--resume` takes the newest checkpoint that loads (a corrupt or truncated newer one is skipped, and said so);
`--resume=PATH` takes that one. Only the newest train.keep_checkpoints are kept."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.errors import DataError
from gearshift.planner.expert_map import ExpertMap
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig
from gearshift.train.env import under_torchrun

FORMAT = 2
_NAME = re.compile(r"^step_(\d+)\.pt$")
Resume = bool | str  # False: a fresh run; True: the newest good checkpoint in output.dir; a path: that checkpoint


class CorruptCheckpoint(DataError):
    """A checkpoint file that does not load (corrupt, truncated, or not Gearshift's): --resume skips it for an
    older one; a checkpoint of another job is a plain DataError and is never skipped."""


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step_{step:07d}.pt"


def job_fingerprint(cfg: JobConfig) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint: the model and the data (their
    tables, free-form keys included) and the data order (seed, batch size). Steps, schedule, partition,
    workers and outputs may change."""
    tables = cfg.to_dict()  # [model] and [data] as written: a custom model's or dataset's own keys too
    fp = {f"{sec}.{k}": v for sec in ("model", "data") for k, v in tables[sec].items()}
    fp.update({"train.seed": cfg.train.seed, "train.batch_size": cfg.train.batch_size})
    return fp


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write `payload` to `path` atomically: a crash leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def checkpoints(out_dir: str | Path) -> list[Path]:
    """The checkpoints in `out_dir/checkpoints`, newest (highest step) first."""
    d = checkpoint_dir(out_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in `out_dir/checkpoints`, or None."""
    found = checkpoints(out_dir)
    return found[0] if found else None


def prune_checkpoints(out_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (0: keep every one); returns those deleted."""
    old = checkpoints(out_dir)[keep:] if keep > 0 else []
    for p in old:
        p.unlink(missing_ok=True)
    return old


def later_than(out_dir: str | Path, step: int) -> list[Path]:
    """The checkpoints in `out_dir` past `step`, newest first."""
    return [p for p in checkpoints(out_dir) if int(_NAME.match(p.name).group(1)) > step]


def drop_after(out_dir: str | Path, step: int) -> list[Path]:
    """A run resumed at `step` rewrites what came after it (metrics.jsonl drops those steps too): delete the
    checkpoints past it (an abandoned continuation, or corrupt ones skipped), so that --resume and
    train.keep_checkpoints see this run's own (find_resumable's line names them); returns those deleted."""
    later = later_than(out_dir, step)
    for p in later:
        p.unlink(missing_ok=True)
    return later


def load_checkpoint(path: Path, fingerprint: dict) -> dict:
    """Read and check a checkpoint; a corrupt one, or one of another job, is a DataError naming what differs.
    Loaded on the CPU (RNG states must be CPU tensors); PipelineRuntime.load_state moves each tensor to its
    parameter's device."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise CorruptCheckpoint(f"checkpoint {path}: corrupt or not a Gearshift checkpoint ({type(e).__name__})") \
            from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise CorruptCheckpoint(f"checkpoint {path}: not a Gearshift checkpoint (format {FORMAT} expected)")
    saved = ck.get("job", {})
    for key, value in fingerprint.items():
        if saved.get(key) != value:
            raise DataError(f"checkpoint {path}: {key} is {saved.get(key)!r} in the checkpoint but {value!r} in "
                            "the config (--resume continues the same job)")
    return ck


def find_resumable(cfg: JobConfig, resume: Resume = True) -> tuple[Path, dict, str | None]:
    """The checkpoint to resume (`resume` a path: that one; else the newest in output.dir that loads), loaded and
    checked against the job, and a line saying which newer ones in output.dir were skipped as unreadable or will be
    replaced (drop_after) by the run that continues from it (None: none)."""
    fp = job_fingerprint(cfg)
    if isinstance(resume, str):
        path = Path(resume)
        if not path.is_file():
            raise DataError(f"--resume={resume}: no such checkpoint file")
        ck = load_checkpoint(path, fp)
        later = later_than(cfg.output.dir, int(ck["step"]))
        note = None if not later else (f"gearshift: --resume={resume}: continuing from step {ck['step']}; this run "
                                       f"replaces the later checkpoints {', '.join(p.name for p in later)}")
        return path, ck, note
    found = checkpoints(cfg.output.dir)
    if not found:
        raise DataError(f"--resume: no checkpoint in {checkpoint_dir(cfg.output.dir)}")
    skipped: list[tuple[Path, CorruptCheckpoint]] = []
    for path in found:
        try:
            ck = load_checkpoint(path, fp)
        except CorruptCheckpoint as e:
            skipped.append((path, e))
            continue
        note = None if not skipped else (
            f"gearshift: --resume: skipped {', '.join(p.name for p, _ in skipped)} (corrupt or truncated); resuming "
            f"from {path.name} (--resume=PATH picks another)")
        return path, ck, note
    raise skipped[0][1]  # none loads: the newest one's error says what is wrong


def completed(cfg: JobConfig, ck: dict) -> str | None:
    """The line for a resumed run that has nothing left to do (its checkpoint is at train.steps or past), or None."""
    step = int(ck["step"])
    if step < cfg.train.steps:
        return None
    return (f"gearshift: {cfg.output.dir} is already complete at step {step} (train.steps = {cfg.train.steps}); "
            "raise train.steps to train on")


class Checkpointer:
    """Saves the job every train.checkpoint_every steps, at the end and when asked to stop; resumes it."""

    def __init__(self, cfg: JobConfig, resume: Resume = False):
        self.cfg, self.resume = cfg, resume
        self._resumed: dict | None = None

    def due(self, step: int, end: int) -> bool:
        """Whether to save after `step` steps (of a run that ends at `end`)."""
        every = self.cfg.train.checkpoint_every
        return bool(every and step % every == 0) or step == end

    def resumed(self) -> dict:
        """The checkpoint --resume continues from (read once)."""
        if self._resumed is None:
            _, self._resumed, note = find_resumable(self.cfg, self.resume or True)
            if note and under_torchrun() and dist.get_rank() == 0:  # else `gearshift train` said it
                print(note, flush=True)
        return self._resumed

    def restore(self, rt: PipelineRuntime) -> int:
        """Load the checkpoint into this rank's layers; returns the step to resume at."""
        ck = self.resumed()
        rt.load_state(ck["model"], ck["optim"])
        rank = dist.get_rank()
        if len(ck["rng"]) == dist.get_world_size():
            torch.set_rng_state(ck["rng"][rank])
            cuda_rng = ck.get("cuda_rng", [None] * len(ck["rng"]))[rank]
            if cuda_rng is not None and rt.device.type == "cuda":  # written on a GPU, resumed on one
                torch.cuda.set_rng_state(cuda_rng, rt.device)
        return int(ck["step"])

    def expert_placements(self, experts: int, width: int) -> dict[int, ExpertMap] | None:
        """The expert->rank map the resumed checkpoint was written under, per MoE layer; None when it has none or
        when it does not fit this job (another expert-parallel width: the contiguous placement then)."""
        saved = self.resumed().get("experts")
        if not saved or saved["width"] != width or saved["experts"] != experts:
            return None
        return {int(i): ExpertMap(tuple(tuple(h) for h in holders), width) for i, holders in saved["holders"].items()}

    def save(self, rt: PipelineRuntime, step: int, placer_state: dict | None = None) -> Path:
        """Gather every layer (from replica 0; experts from their first holders) and its AdamW state on rank 0
        and write one checkpoint (collective); with experts, their placement and `placer_state` (Placer.state)."""
        model, optim = rt.saved_state()  # CPU tensors: gather_object pickles them
        cuda_rng = torch.cuda.get_rng_state(rt.device) if rt.device.type == "cuda" else None
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((model, optim, torch.get_rng_state(), cuda_rng), parts, dst=0)
        path = checkpoint_path(self.cfg.output.dir, step)
        if dist.get_rank() == 0:
            all_model, all_optim = {}, {}
            for m, o, _, _ in parts:
                all_model.update(m)
                all_optim.update(o)
            save_checkpoint(path, {
                "format": FORMAT, "step": step, "model": all_model, "optim": all_optim,
                "rng": [r for _, _, r, _ in parts], "cuda_rng": [c for _, _, _, c in parts],
                "job": job_fingerprint(self.cfg),
                "data": {"seed": self.cfg.train.seed, "next_step": step}, "bounds": [list(b) for b in rt.bounds],
                **_expert_state(rt, placer_state),
            })
            prune_checkpoints(self.cfg.output.dir, self.cfg.train.keep_checkpoints)
        dist.barrier()
        return path


def _expert_state(rt: PipelineRuntime, placer_state: dict | None) -> dict:
    """A MoE job's expert->rank map (group ranks holding each expert, per MoE layer) and its placer's state."""
    sh = rt.experts
    if sh is None:
        return {}
    holders = {str(i): [list(h) for h in p.holders] for i, p in sh.placements.items()}
    out: dict = {"experts": {"width": sh.width, "experts": sh.experts, "holders": holders}}
    if placer_state is not None:
        out["placer"] = placer_state
    return out
