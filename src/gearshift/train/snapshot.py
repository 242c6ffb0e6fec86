"""In-memory copies of the job, for a worker that dies: every train.snapshot_every steps each rank writes its
layers, their AdamW state and its RNG state (keyed by global name, as checkpoints are) into host memory outside
its process (/dev/shm: tmpfs, no disk), atomically (temp file, rename). The copy is taken after the step's
update and before the step's stats collective, so a step every rank has finished has a copy on every rank.
When the elastic agent restarts the group, the new workers merge the newest step that every rank of the old
group copied and go on from there (any partition, any number of workers: state is keyed by global layer);
steps after that copy are replayed from the same data. One host: a host that goes away takes its copies along."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
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

_NAME = re.compile(r"^step(\d+)\.world(\d+)\.rank(\d+)\.pt$")


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
    """One run's in-memory copies: write this rank's, find the newest complete set, merge it."""

    def __init__(self, root: Path, every: int):
        self.root, self.every = Path(root), every

    def due(self, done: int) -> bool:
        """Whether to copy after `done` finished steps."""
        return bool(self.every) and done % self.every == 0

    def write(self, state: tuple[dict, dict], done: int, rank: int, world: int, extra: dict) -> Path:
        """This rank's (model, optim) state after `done` steps, with `extra` (bounds...), and its RNG state;
        keeps this rank's two newest copies (the newest may be one its peers have not finished)."""
        self.root.mkdir(parents=True, exist_ok=True)
        model, optim = state
        path = self.root / f"step{done:07d}.world{world}.rank{rank}.pt"
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"step": done, "model": model, "optim": optim, "rng": torch.get_rng_state(), **extra}, tmp)
        os.replace(tmp, path)
        mine = sorted(p for p in self.root.iterdir() if (m := _NAME.match(p.name)) and int(m.group(3)) == rank)
        for old in mine[:-2]:
            old.unlink(missing_ok=True)
        return path

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
            part = torch.load(ranks[r], map_location="cpu", weights_only=True)
            out["model"].update(part.pop("model"))
            out["optim"].update(part.pop("optim"))
            out["rng"][r] = part.pop("rng")
            part.pop("step")
            out.update(part)
        return out


def go_on_from(cfg: JobConfig, ckpt: Checkpointer, snapshots: Snapshots | None) -> bool:
    """After the agent restarted the group (collective): hand `ckpt` the newest complete in-memory copy, else
    leave it the newest checkpoint on disk; True when there is either (the job resumes), False to start over.
    Rank 0 decides and says so, with the steps that will be replayed."""

    def decide() -> tuple[str, int | None, int]:
        logged = _logged_steps(Path(cfg.output.dir) / "metrics.jsonl")
        step = snapshots.newest() if snapshots else None
        if step is not None:
            return "memory", step, logged
        return ("disk", None, logged) if latest_checkpoint(cfg.output.dir) else ("start", None, logged)

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


def _logged_steps(path: Path) -> int:
    """How many steps metrics.jsonl says were finished (the last step record's step + 1)."""
    import json

    if not path.is_file():
        return 0
    steps = [json.loads(ln).get("step", -1) for ln in path.read_text().splitlines() if ln.strip() and '"event"'
             not in ln]
    return max(steps, default=-1) + 1


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
