"""Checkpoints through torch.distributed.checkpoint (DCP), keyed by global layer name (independent of the
partition that wrote them): every rank writes its own layers and their AdamW state (replica 0's; an expert from
its first holder) into one directory, and on load every rank reads just the layers it now holds, whatever the
number of workers or the partition that wrote them. A directory is written under a temporary name and renamed
once complete (rank 0, after every rank's part is written), so a crash leaves the old checkpoints and no half.
Beside the tensors, `meta.pt` holds the step, every rank's RNG state, the partition, the job's fingerprint
(`--resume` refuses a checkpoint written by another job) and a MoE job's expert->rank map and placement state.
Tensors are saved from the CPU and placed on each rank's device on load: a checkpoint written on GPUs resumes on
CPUs and back. Checkpoints of the earlier format (one `step_N.pt` file holding the whole job, gathered on rank 0)
are still read, so old runs resume."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.errors import DataError
from gearshift.planner.expert_map import ExpertMap
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig

FORMAT = 3  # a DCP directory and meta.pt
OLD_FORMAT = 2  # one torch.save file holding the whole job
_NAME = re.compile(r"^step_(\d+)(\.pt)?$")
META = "meta.pt"


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    """The directory of the checkpoint after `step` steps."""
    return checkpoint_dir(out_dir) / f"step_{step:07d}"


def job_fingerprint(cfg: JobConfig) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint: the model and the data (their
    tables, free-form keys included) and the data order (seed, batch size). Steps, schedule, partition,
    workers and outputs may change."""
    tables = cfg.to_dict()  # [model] and [data] as written: a custom model's or dataset's own keys too
    fp = {f"{sec}.{k}": v for sec in ("model", "data") for k, v in tables[sec].items()}
    fp.update({"train.seed": cfg.train.seed, "train.batch_size": cfg.train.batch_size})
    return fp


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write `payload` to the file `path` atomically: a crash leaves the old file or the new one, never half."""
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


def _flatten(model: dict, optim: dict) -> dict:
    """One flat DCP state dict: model/NAME and optim/NAME/KEY (AdamW's exp_avg, exp_avg_sq, step)."""
    flat = {f"model/{k}": v for k, v in model.items()}
    flat.update({f"optim/{name}/{k}": v for name, st in optim.items() for k, v in st.items()})
    return flat


def _unflatten(flat: dict) -> tuple[dict, dict]:
    model, optim = {}, {}
    for key, v in flat.items():
        kind, _, rest = key.partition("/")
        if kind == "model":
            model[rest] = v
        else:
            name, _, k = rest.rpartition("/")
            optim.setdefault(name, {})[k] = v
    return model, optim


def read_tensors(path: Path, layers: set[int] | None = None) -> tuple[dict, dict]:
    """(model, optim) of a DCP checkpoint, keyed by global name: the given layers' (None: all). Collective when
    the process group is up (every rank reads its own layers); without one, this process reads alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    prefixes = tuple(f"layers.{i}." for i in sorted(layers)) if layers is not None else ("",)
    want = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
            if isinstance(m, TensorStorageMetadata) and k.partition("/")[2].startswith(prefixes)}
    with warnings.catch_warnings():  # read alone on purpose when no group is up: no warning about it
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(want, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    return _unflatten(want)


def read_checkpoint(path: Path) -> dict:
    """A whole checkpoint in one dict (model, optim and the metadata), in this process: for tests and tools."""
    path = Path(path)
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    ck = torch.load(path / META, map_location="cpu", weights_only=True)
    ck["model"], ck["optim"] = read_tensors(path)
    return ck


def load_checkpoint(path: Path, fingerprint: dict) -> dict:
    """Read and check a checkpoint; a corrupt one, or one of another job, is a DataError naming what differs.
    Loaded on the CPU (RNG states must be CPU tensors); PipelineRuntime.load_state moves each tensor to its
    parameter's device."""
    old = path.is_file()  # the earlier format: the whole job in one file
    try:
        ck = torch.load(path if old else path / META, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise DataError(f"checkpoint {path}: corrupt or not a Gearshift checkpoint ({type(e).__name__})") from None
    if not isinstance(ck, dict) or ck.get("format") != (OLD_FORMAT if old else FORMAT):
        raise DataError(f"checkpoint {path}: not a Gearshift checkpoint (format {OLD_FORMAT} file or format "
                        f"{FORMAT} directory expected)")
    if not old:
        ck["path"] = str(path)  # the tensors stay on disk until each rank reads its own (Checkpointer.restore)
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
        if "model" in ck:  # an old-format file, or an in-memory copy: the whole job at hand
            rt.load_state(ck["model"], ck["optim"])
        else:  # collective: every rank reads the layers it holds now
            rt.load_state(*read_tensors(Path(ck["path"]), set(rt.layers)))
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
        """Write one checkpoint (collective): every rank its layers (replica 0's; experts from their first
        holders) through DCP, rank 0 the metadata with every rank's RNG state; with experts, their placement and
        `placer_state` (Placer.state). Written under a temporary name, renamed once whole."""
        import torch.distributed.checkpoint as dcp

        path = checkpoint_path(self.cfg.output.dir, step)
        tmp = path.with_name(f".{path.name}.tmp")
        rank = dist.get_rank()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        dcp.save(_flatten(*rt.saved_state()), checkpoint_id=str(tmp))
        cuda_rng = torch.cuda.get_rng_state(rt.device) if rt.device.type == "cuda" else None
        rngs = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object((torch.get_rng_state(), cuda_rng), rngs, dst=0)
        if rank == 0:
            save_checkpoint(tmp / META, {
                "format": FORMAT, "step": step, "rng": [r for r, _ in rngs], "cuda_rng": [c for _, c in rngs],
                "job": job_fingerprint(self.cfg), "data": {"seed": self.cfg.train.seed, "next_step": step},
                "bounds": [list(b) for b in rt.bounds], **_expert_state(rt, placer_state),
            })
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
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
