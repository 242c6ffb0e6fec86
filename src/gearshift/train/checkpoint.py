"""Checkpoints through torch.distributed.checkpoint (DCP), keyed by global layer name (independent of the partition
that wrote them): every rank writes its own layers and their AdamW state (replica 0's; an expert from its first
holder) into one directory, and on load every rank reads just the layers it now holds, whatever the number of
workers or the partition that wrote them. A directory is written under a temporary name and renamed once complete
(rank 0, after every rank's part is written), so a crash leaves the old checkpoints and no half (the next save
clears what a crash left); a write that fails (a full disk) fails on every rank alike, as one line. Beside the
tensors, `meta.pt` holds the step, every rank's RNG state, the partition and the (m, K) in force, the job's
fingerprint (`--resume` refuses a checkpoint written by another job) and a MoE job's expert->rank map and placement
state (the loads it forecasts from), so a resumed run holds the experts where the interrupted one did and decides as
it would have. Tensors are saved from the CPU and placed on each rank's device on load: a checkpoint written on GPUs
resumes on CPUs and back. Checkpoints of the earlier format (one `step_N.pt` file holding the whole job, gathered on
rank 0) are still read, so old runs resume. `--resume` takes the newest checkpoint that loads (a corrupt or
truncated newer one is skipped, and said so); `--resume=PATH` takes that one. Only the newest train.keep_checkpoints
are kept."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.errors import DataError
from gearshift.planner.expert_map import ExpertMap
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig
from gearshift.train.env import under_torchrun

FORMAT = 3  # a DCP directory and meta.pt
OLD_FORMAT = 2  # one torch.save file holding the whole job
_NAME = re.compile(r"^step_(\d+)(\.pt)?$")
_TEMP = re.compile(r"^\.step_\d+\.tmp$")  # a checkpoint being written (Checkpointer.save), or left by a crash
_REPLACED = re.compile(r"^\.step_(\d+)\.old$")  # a step's earlier checkpoint while a new one of that step goes in
META = "meta.pt"
Resume = bool | str  # False: a fresh run; True: the newest good checkpoint in output.dir; a path: that checkpoint


class CorruptCheckpoint(DataError):
    """A checkpoint that does not load (corrupt, truncated, or not Gearshift's): --resume skips it for an older
    one; a checkpoint of another job is a plain DataError and is never skipped."""


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


def checkpoints(out_dir: str | Path) -> list[Path]:
    """The checkpoints in `out_dir/checkpoints`, newest (highest step) first."""
    d = checkpoint_dir(out_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    steps = {step for step, _ in found}
    found += [(step, p) for p in d.iterdir() if (m := _REPLACED.match(p.name))  # a crash between the two renames:
              and (step := int(m.group(1))) not in steps]  # the step's earlier checkpoint is whole, and counts
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in `out_dir/checkpoints`, or None."""
    found = checkpoints(out_dir)
    return found[0] if found else None


def prune_checkpoints(out_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (0: keep every one), and the half-written directories a crash
    left (never read; run between saves, when none is being written) and a replaced copy of a step whose new
    checkpoint is in place; returns the checkpoints deleted."""
    old = checkpoints(out_dir)[keep:] if keep > 0 else []
    for p in old:
        _remove(p)
    d = checkpoint_dir(out_dir)
    names = [p.name for p in d.iterdir()] if d.is_dir() else []
    published = {int(m.group(1)) for n in names if (m := _NAME.match(n))}
    for n in names:
        m = _REPLACED.match(n)  # a step's earlier checkpoint, replaced: gone once the step's new one is in place
        if _TEMP.match(n) or (m and int(m.group(1)) in published):
            _remove(d / n)
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
        _remove(p)
    return later


def _remove(path: Path) -> None:
    """Delete a checkpoint: a directory, or an old-format file."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


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
        raise CorruptCheckpoint(f"checkpoint {path}: corrupt or not a Gearshift checkpoint ({type(e).__name__})") \
            from None
    if not isinstance(ck, dict) or ck.get("format") != (OLD_FORMAT if old else FORMAT):
        raise CorruptCheckpoint(f"checkpoint {path}: not a Gearshift checkpoint (format {OLD_FORMAT} file or format "
                                f"{FORMAT} directory expected)")
    if not old:
        ck["path"] = str(path)  # the tensors stay on disk until each rank reads its own (Checkpointer.restore)
    saved = ck.get("job", {})
    for key, value in fingerprint.items():
        if saved.get(key) != value:
            raise DataError(f"checkpoint {path}: {key} is {_said(saved.get(key))} in the checkpoint but "
                            f"{_said(value)} in the config (--resume continues the same job; to start from its "
                            "weights under another config: gearshift export it, then model.init in a new output.dir)")
    return ck


def _said(value: object) -> str:
    """A fingerprint value as the resume error names it: None is a key left unset (the model's own default)."""
    return "unset (its default)" if value is None else repr(value)


def find_resumable(cfg: JobConfig, resume: Resume = True) -> tuple[Path, dict, str | None]:
    """The checkpoint to resume (`resume` a path: that one; else the newest in output.dir that loads), loaded and
    checked against the job, and a line saying which newer ones in output.dir were skipped as unreadable or will be
    replaced (drop_after) by the run that continues from it (None: none)."""
    fp = job_fingerprint(cfg)
    if isinstance(resume, str):
        path = Path(resume)
        if not path.exists():
            raise DataError(f"--resume={resume}: no such checkpoint")
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


LR_KEYS = ("steps", "warmup_steps", "lr", "min_lr")  # what lr_at's curve depends on


def lr_schedule(cfg: JobConfig) -> dict:
    """The train keys the learning-rate curve is drawn from, as a checkpoint records them."""
    return {k: getattr(cfg.train, k) for k in LR_KEYS}


def lr_schedule_note(cfg: JobConfig, ck: dict) -> str | None:
    """The line for a run resumed under another learning-rate curve than its checkpoint's (e.g. train.steps
    raised to train on: the cosine decay is drawn anew over the new steps), or None where it is the same."""
    old, new = ck.get("lr_schedule"), lr_schedule(cfg)
    if not old or old == new:
        return None
    changed = ", ".join(f"train.{k} {old[k]} -> {new[k]}" for k in LR_KEYS if old.get(k) != new[k])
    return (f"gearshift: resuming at step {int(ck['step'])} with {changed}: the learning rate follows the new "
            "warmup and cosine decay from there, not the checkpointed run's")


class Checkpointer:
    """Saves the job every train.checkpoint_every steps, at the end and when asked to stop; resumes it."""

    def __init__(self, cfg: JobConfig, resume: Resume = False):
        self.cfg, self.resume = cfg, resume
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
            _, self._resumed, note = find_resumable(self.cfg, self.resume or True)
            if note and under_torchrun() and dist.get_rank() == 0:  # else `gearshift train` said it
                print(note, flush=True)
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

    def save(self, rt: PipelineRuntime, step: int, placer_state: dict | None = None,
             schedule: list | None = None) -> Path:
        """Write one checkpoint (collective): every rank its layers (replica 0's; experts from their first
        holders) through DCP, rank 0 the metadata with every rank's RNG state, the partition and `schedule` (the
        (m, K) in force, where it switches); with experts, their placement and `placer_state` (Placer.state).
        Written under a temporary name, renamed once whole. A write that fails on any rank (a full disk, no
        permission) fails on every rank alike: a DataError naming output.dir, the half-written directory removed
        and the earlier checkpoints untouched."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        path = checkpoint_path(self.cfg.output.dir, step)
        tmp = path.with_name(f".{path.name}.tmp")
        rank = dist.get_rank()
        if rank == 0:
            self._agree(lambda: (shutil.rmtree(tmp, ignore_errors=True), tmp.mkdir(parents=True)), path, tmp)
        else:
            self._agree(None, path, tmp)
        try:  # DCP's own collectives raise a failure on one rank on every rank
            dcp.save(_flatten(*rt.saved_state()), checkpoint_id=str(tmp))
        except (OSError, CheckpointException) as e:  # CheckpointException: each failed rank's error
            if (err := _os_error(e)) is None:
                raise
            self._fail(path, tmp, err)
        cuda_rng = torch.cuda.get_rng_state(rt.device) if rt.device.type == "cuda" else None
        rngs = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object((torch.get_rng_state(), cuda_rng), rngs, dst=0)

        def publish() -> None:
            save_checkpoint(tmp / META, {
                "format": FORMAT, "step": step, "rng": [r for r, _ in rngs], "cuda_rng": [c for _, c in rngs],
                "job": job_fingerprint(self.cfg), "data": {"seed": self.cfg.train.seed, "next_step": step},
                "lr_schedule": lr_schedule(self.cfg), "bounds": [list(b) for b in rt.bounds],
                **({"schedule": list(schedule)} if schedule else {}), **expert_state(rt, placer_state),
            })
            if self.before_publish is not None:  # a test's fault: the data written, the checkpoint not yet published
                self.before_publish()
            replaced = path.with_name(f".{path.name}.old")  # a checkpoint of this step already (a redone step):
            if path.exists():  # kept whole under another name until the new one is in place (checkpoints())
                shutil.rmtree(replaced, ignore_errors=True)
                os.replace(path, replaced)
            os.replace(tmp, path)
            shutil.rmtree(replaced, ignore_errors=True)

        self._agree(publish if rank == 0 else None, path, tmp)
        if rank == 0:
            prune_checkpoints(self.cfg.output.dir, self.cfg.train.keep_checkpoints)
        dist.barrier()
        return path

    before_publish: Callable[[], None] | None = None  # train.forcing's "checkpoint" kill point (tests only)

    def _agree(self, write: Callable[[], object] | None, path: Path, tmp: Path) -> None:
        """Rank 0 runs `write` (others pass None) and every rank learns whether it failed (collective): a failure
        is raised on every rank, so none waits in a collective rank 0 left."""
        def attempt() -> str | None:
            try:
                write()
            except OSError as e:
                return e.strerror or str(e)
            return None

        box = [attempt() if write is not None else None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            self._fail(path, tmp, box[0])

    def _fail(self, path: Path, tmp: Path, why: object) -> None:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        why = why.strerror or str(why) if isinstance(why, OSError) else why
        raise DataError(f"output.dir: cannot write the checkpoint {path}: {why} (the earlier checkpoints are "
                        "kept; --resume continues from the newest)")


def _os_error(e: BaseException) -> OSError | None:
    """The first OSError in `e` (itself, its causes, or the per-rank failures of DCP's CheckpointException)."""
    seen: list[BaseException] = [e]
    while seen:
        x = seen.pop()
        if isinstance(x, OSError):
            return x
        failures = getattr(x, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        if isinstance(failures, dict):
            seen.extend(v[0] if isinstance(v, tuple) else v for v in failures.values())
        seen.extend(c for c in (x.__cause__, x.__context__) if c is not None)
    return None


def expert_state(rt: PipelineRuntime, placer_state: dict | None) -> dict:
    """A MoE job's expert->rank map (group ranks holding each expert, per MoE layer) and its placer's state."""
    sh = rt.experts
    if sh is None:
        return {}
    holders = {str(i): [list(h) for h in p.holders] for i, p in sh.placements.items()}
    out: dict = {"experts": {"width": sh.width, "experts": sh.experts, "holders": holders}}
    if placer_state is not None:
        out["placer"] = placer_state
    return out
