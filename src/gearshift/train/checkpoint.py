"""Checkpoints keyed by global layer index (independent of the partition that wrote them), written
atomically (temp file, fsync, rename) and loaded with `torch.load(weights_only=True)`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from gearshift.errors import DataError

FORMAT = 1
_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step_{step:07d}.pt"


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


def load_checkpoint(path: Path, model_cfg: dict) -> dict:
    """Read and check a checkpoint; a corrupt or mismatched one is a DataError naming what is wrong."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise DataError(f"checkpoint {path}: corrupt or not a Gearshift checkpoint ({type(e).__name__})") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise DataError(f"checkpoint {path}: not a Gearshift checkpoint (format {FORMAT} expected)")
    saved = ck.get("model_config", {})
    for key in ("name", "layers", "width", "heads", "context"):
        if saved.get(key) != model_cfg.get(key):
            raise DataError(
                f"checkpoint {path}: model.{key} is {saved.get(key)!r} in the checkpoint but "
                f"{model_cfg.get(key)!r} in the config"
            )
    return ck


def find_resumable(out_dir: str | Path, model_cfg: dict) -> tuple[Path, dict]:
    """The latest checkpoint in `out_dir`, loaded and checked against the model config."""
    path = latest_checkpoint(out_dir)
    if path is None:
        raise DataError(f"--resume: no checkpoint in {checkpoint_dir(out_dir)}")
    return path, load_checkpoint(path, model_cfg)
