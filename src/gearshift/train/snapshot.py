"""In-memory copies of the job, for a worker that dies: every train.snapshot_every steps each rank writes its
layers, their AdamW state and its RNG state (keyed by global name, as checkpoints are; with the partition, and for
a MoE job where its experts are and its placer's state) into host memory outside
its process (/dev/shm: tmpfs, no disk), in place into one of two slots mapped once, made whole by a manifest
renamed into place after the copy (Snapshots). The copy is taken after the step's
update and before the step's stats collective, so a step every rank has finished has a copy on every rank.
When the elastic agent restarts the group, the new workers merge the newest step that every rank of the old
group copied and go on from there (any partition, any number of workers: state is keyed by global layer);
steps after that copy are replayed from the same data. One host: a host that goes away takes its copies along."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.runtime.agree import rank0_decides
from gearshift.train.checkpoint import (
    OLD_FORMAT,
    Checkpointer,
    checkpoint_path,
    job_fingerprint,
    latest_checkpoint,
    save_checkpoint,
)
from gearshift.train.config import JobConfig
from gearshift.train.metrics import steps_logged

_NAME = re.compile(r"^step(\d+)\.world(\d+)\.rank(\d+)\.slot([01])\.json$")
_ALIGN = 64  # each tensor's bytes start on this boundary in a slot (a view of any dtype lines up)


def snapshot_root(run_id: str, out_dir: str | Path) -> Path:
    """Where one run's copies live: /dev/shm (host memory) when there is one, named by the agent's run id
    and the run directory, so two jobs never read each other's."""
    tag = hashlib.sha1(str(Path(out_dir).resolve()).encode()).hexdigest()[:10]
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"gearshift-{run_id}-{tag}"


def drop(root: Path) -> None:
    """Free a run's copies (its memory)."""
    shutil.rmtree(root, ignore_errors=True)


class Snapshots:
    """One run's in-memory copies: write this rank's, find the newest complete set, merge it.

    Each rank has two slots per group size, files in `root` mapped into its memory once (torch.from_file,
    shared) and written in place: a copy is a memcpy of each tensor, not a serialization. A slot's contents
    count only while its small manifest (step, layout, `extra`) exists; a write first removes the manifest of the
    slot it overwrites, copies, then renames the new manifest into place. A rank that dies mid-copy thus leaves
    that slot without a manifest (not a torn copy taken for whole), and its other slot, the step before, intact."""

    def __init__(self, root: Path, every: int):
        self.root, self.every = Path(root), every
        self._mapped: dict[tuple[int, int, int], tuple] = {}  # (world, rank, slot) -> (what it holds, views, layout)

    def due(self, done: int) -> bool:
        """Whether to copy after `done` finished steps."""
        return bool(self.every) and done % self.every == 0

    def write(self, state: tuple[dict, dict], done: int, rank: int, world: int, extra: dict) -> Path | None:
        """Copy this rank's (model, optim) state after `done` steps (live tensors: they are only read), with
        `extra` (bounds...: JSON) and its RNG state, into the slot its copy of the step before does not use;
        returns the manifest. A rank keeps its two newest copies (the newest may be one its peers have not
        finished). Where host memory cannot hold the copy (a full /dev/shm) the rank says so once and goes on
        without copies (None), its earlier ones dropped: training is not stopped for them, and a restart goes on
        from the newest checkpoint (no step has a copy from every rank)."""
        try:
            return self._write(state, done, rank, world, extra)
        except OSError as e:
            self.every = 0  # due() is False from now on: this rank's copies stop here
            for s in (0, 1):
                self._mapped.pop((world, rank, s), None)
                self._slot_file(world, rank, s).unlink(missing_ok=True)
                for m in self._manifests(world, rank, s):
                    m.unlink(missing_ok=True)
            sys.stderr.write(f"gearshift: rank {rank}: {self.root.parent} cannot hold its in-memory copy "
                             f"({e.strerror or e}): it goes on without copies (its earlier ones dropped); a "
                             "restart goes on from the newest checkpoint (train.snapshot_every = 0 turns the copies "
                             "off)\n")
            sys.stderr.flush()
            return None

    def _write(self, state: tuple[dict, dict], done: int, rank: int, world: int, extra: dict) -> Path:
        model, optim = state
        tensors = [*model.values(), *(v for st in optim.values() for v in st.values()), torch.get_rng_state()]
        keys = (tuple(model), tuple((n, tuple(st)) for n, st in optim.items()),
                tuple((t.dtype, t.shape) for t in tensors))
        slot = (done // max(self.every, 1)) % 2
        for old in self._manifests(world, rank, slot):  # this slot's contents stop counting before they change
            old.unlink(missing_ok=True)
        views, layout = self._slot(world, rank, slot, keys, model, optim, tensors)
        if all(t.device.type == "cpu" for t in tensors):
            torch._foreach_copy_(views, tensors)
        else:
            for v, t in zip(views, tensors, strict=True):
                v.copy_(t)
        path = self.root / f"step{done:07d}.world{world}.rank{rank}.slot{slot}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(f'{{"step": {done}, "extra": {json.dumps(extra)}, {layout}}}')
        os.replace(tmp, path)
        return path

    def _slot(self, world: int, rank: int, slot: int, keys: tuple, model: dict, optim: dict,
              tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], str]:
        """The slot's views, one per tensor, and its manifest's layout (JSON): made again, and the slot mapped at
        its new size, when the tensors changed (a migration, the optimizer's first step)."""
        key = (world, rank, slot)
        if key in self._mapped and self._mapped[key][0] == keys:
            return self._mapped[key][1], self._mapped[key][2]
        self._mapped.pop(key, None)
        names = [("model", n, "") for n in model] + [("optim", n, k) for n, st in optim.items() for k in st]
        names.append(("rng", "", ""))
        layout, size = [], 0
        for (kind, name, k), t in zip(names, tensors, strict=True):
            layout.append([kind, name, k, str(t.dtype).removeprefix("torch."), list(t.shape), size])
            size += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        size = max(size, _ALIGN)
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._slot_file(world, rank, slot)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # the memory now: a full /dev/shm is an OSError here, not a SIGBUS later
        finally:
            os.close(fd)
        buf = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        views = [buf[off:off + t.numel() * t.element_size()].view(t.dtype).view(shape)
                 for t, (*_, shape, off) in zip(tensors, layout, strict=True)]
        text = f'"size": {size}, "layout": {json.dumps(layout)}'
        self._mapped[key] = (keys, views, text)
        return views, text

    def _slot_file(self, world: int, rank: int, slot: int) -> Path:
        return self.root / f"world{world}.rank{rank}.slot{slot}.bin"

    def _manifests(self, world: int, rank: int, slot: int) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if (m := _NAME.match(p.name))
                and (int(m.group(2)), int(m.group(3)), int(m.group(4))) == (world, rank, slot)]

    def _sets(self) -> dict[tuple[int, int], dict[int, Path]]:
        found: dict[tuple[int, int], dict[int, Path]] = {}
        if self.root.is_dir():
            for p in self.root.iterdir():
                if m := _NAME.match(p.name):
                    found.setdefault((int(m.group(1)), int(m.group(2))), {})[int(m.group(3))] = p
        return found

    def newest(self) -> int | None:
        """The newest step that every rank of the group that wrote it has copied, or None."""
        done = [step for (step, world), ranks in self._sets().items() if set(ranks) == set(range(world))]
        return max(done) if done else None

    def load(self, step: int) -> dict:
        """The job at `step` merged from every rank's copy, shaped as a checkpoint (model, optim, rng per rank,
        bounds) for train.checkpoint.Checkpointer to restore."""
        (world, ranks), = [(w, r) for (s, w), r in self._sets().items() if s == step and set(r) == set(range(w))]
        out: dict = {"step": step, "model": {}, "optim": {}, "rng": [None] * world, "from": "memory"}
        for r in range(world):
            m = _NAME.match(ranks[r].name)
            meta = json.loads(ranks[r].read_text())
            buf = torch.from_file(str(self._slot_file(world, r, int(m.group(4)))), shared=False, size=meta["size"],
                                  dtype=torch.uint8)
            for kind, name, key, dtype, shape, off in meta["layout"]:
                dt = getattr(torch, dtype)
                n = math.prod(shape) * torch.empty((), dtype=dt).element_size()
                t = buf[off:off + n].view(dt).view(shape).clone()
                if kind == "model":
                    out["model"][name] = t
                elif kind == "optim":
                    out["optim"].setdefault(name, {})[key] = t
                else:
                    out["rng"][r] = t
            out.update(meta["extra"])
        return out


def go_on_from(cfg: JobConfig, ckpt: Checkpointer, snapshots: Snapshots | None) -> bool:
    """After the agent restarted the group (collective): hand `ckpt` the newest complete in-memory copy, else
    leave it the newest checkpoint on disk (also where that is newer than every copy: train.snapshot_every above
    train.checkpoint_every; the run resumed drops the checkpoints past its step, so a finished one would go); True
    when there is either (the job resumes), False to start over. Rank 0 decides and says so, with the steps that
    will be replayed."""

    def decide() -> tuple[str, int | None, int]:
        logged = steps_logged(Path(cfg.output.dir) / "metrics.jsonl")
        step = snapshots.newest() if snapshots else None
        disk = latest_checkpoint(cfg.output.dir)
        on_disk = int(re.search(r"(\d+)", disk.name).group(1)) if disk else None
        if step is not None and (on_disk is None or step >= on_disk):
            return "memory", step, logged
        return ("disk", None, logged) if disk else ("start", None, logged)

    kind, step, logged = rank0_decides(decide)
    if kind == "memory":
        ckpt.use(snapshots.load(step))
    elif kind == "disk":
        step = int(ckpt.resumed()["step"])
    if dist.get_rank() == 0:
        where = {"memory": f"the in-memory copy of step {step}", "disk": f"the checkpoint of step {step}",
                 "start": "the start (no copy, no checkpoint)"}[kind]
        print(f"gearshift: restarted: going on from {where}; {max(0, logged - (step or 0))} finished steps to "
              "replay", flush=True)
    return kind != "start"


def to_checkpoint(cfg: JobConfig, snapshots: Snapshots) -> Path | None:
    """Write the newest complete in-memory copy as a checkpoint `--resume` accepts (one file, the whole job), for
    a job that stops because no layout fits the workers left; None when there is no copy."""
    step = snapshots.newest()
    if step is None:
        return None
    ck = snapshots.load(step)
    path = checkpoint_path(cfg.output.dir, step).with_suffix(".pt")
    save_checkpoint(path, {"format": OLD_FORMAT, "step": step, "model": ck["model"], "optim": ck["optim"],
                           "rng": ck["rng"], "job": job_fingerprint(cfg), "bounds": ck.get("bounds", []),
                           "data": {"seed": cfg.train.seed, "next_step": step}})
    return path
