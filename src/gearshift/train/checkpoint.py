"""Checkpoints keyed by global layer index (independent of the partition that wrote them), written
atomically (temp file, fsync, rename) and loaded with `torch.load(weights_only=True)`. A checkpoint carries
its job's fingerprint, and `--resume` refuses one written by another job. Tensors are saved from the CPU and
loaded onto it, then placed on each rank's device: a checkpoint written on GPUs resumes on CPUs and back. A MoE
job's checkpoint also carries its expert->rank map and the expert placement's state (the loads it forecasts
from), so a resumed run holds the experts where the interrupted one did and decides as it would have."""

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

FORMAT = 2
_NAME = re.compile(r"^step_(\d+)\.pt$")


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


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in `out_dir/checkpoints`, or None."""
    d = checkpoint_dir(out_dir)
    if not d.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return max(found)[1] if found else None


def load_checkpoint(path: Path, fingerprint: dict) -> dict:
    """Read and check a checkpoint; a corrupt one, or one of another job, is a DataError naming what differs.
    Loaded on the CPU (RNG states must be CPU tensors); PipelineRuntime.load_state moves each tensor to its
    parameter's device."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise DataError(f"checkpoint {path}: corrupt or not a Gearshift checkpoint ({type(e).__name__})") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise DataError(f"checkpoint {path}: not a Gearshift checkpoint (format {FORMAT} expected)")
    saved = ck.get("job", {})
    for key, value in fingerprint.items():
        if saved.get(key) != value:
            raise DataError(f"checkpoint {path}: {key} is {saved.get(key)!r} in the checkpoint but {value!r} in "
                            "the config (--resume continues the same job)")
    return ck


def find_resumable(cfg: JobConfig) -> tuple[Path, dict]:
    """The latest checkpoint in output.dir, loaded and checked against the job."""
    path = latest_checkpoint(cfg.output.dir)
    if path is None:
        raise DataError(f"--resume: no checkpoint in {checkpoint_dir(cfg.output.dir)}")
    return path, load_checkpoint(path, job_fingerprint(cfg))


class Checkpointer:
    """Saves the job every train.checkpoint_every steps, at the end and when asked to stop; resumes it."""

    def __init__(self, cfg: JobConfig):
        self.cfg = cfg
        self._resumed: dict | None = None

    def due(self, step: int, end: int) -> bool:
        """Whether to save after `step` steps (of a run that ends at `end`)."""
        every = self.cfg.train.checkpoint_every
        return bool(every and step % every == 0) or step == end

    def use(self, ck: dict) -> None:
        """Resume from `ck` (a checkpoint's contents, or train.snapshot's merged in-memory copy) instead of the
        newest checkpoint on disk."""
        self._resumed = ck

    def resumed(self) -> dict:
        """The checkpoint --resume continues from (read once)."""
        if self._resumed is None:
            self._resumed = find_resumable(self.cfg)[1]
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
