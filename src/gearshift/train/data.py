"""Byte-level language-modelling data: a corpus of raw bytes (vocab 256) and batches that are a pure
function of (seed, step, split), so resumed or re-partitioned runs see exactly the same data."""

from __future__ import annotations

import math
import os
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gearshift.errors import ConfigError, DataError

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
SPLITS = {"train": 0, "val": 1}
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_files() -> Iterator[Path]:
    """The standard library's own .py files in walk order (installed packages excluded)."""
    return (p for p in walk_files(Path(sysconfig.get_paths()["stdlib"])) if p.suffix == ".py")


def walk_files(root: Path) -> Iterator[Path]:
    """All files under `root`, lazily and deterministically: each directory's files sorted by name, then
    its subdirectories sorted by name (hidden and cache directories skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        yield from (Path(dirpath) / f for f in sorted(filenames))


def read_bytes(files: Iterable[Path], max_bytes: int) -> tuple[bytes, int]:
    """Concatenate files in order, stopping (mid-file) once `max_bytes` are read; also the files read."""
    chunks, total = [], 0
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read(max_bytes - total)
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks), len(chunks)


class ByteCorpus:
    """Bytes of a text file, a directory (all files, recursively, sorted) or, by default, this Python's
    standard library .py source, capped at `max_bytes` (files in `walk_files` order). The split is by
    position: the last `val_fraction` of the concatenated bytes is validation, the rest training."""

    vocab_size = 256

    def __init__(self, path: str | None = None, val_fraction: float = 0.05,
                 max_bytes: int = DEFAULT_MAX_BYTES):
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction: must be in (0, 1) (got {val_fraction!r})")
        if max_bytes <= 0:
            raise ConfigError(f"data.max_bytes: must be a positive integer (got {max_bytes!r})")
        if path is None:
            files, self.source = stdlib_files(), f"stdlib:{sysconfig.get_paths()['stdlib']}"
        else:
            p = Path(path).expanduser()
            if not p.exists():
                raise DataError(f"data.path: {path} does not exist")
            files, self.source = (walk_files(p) if p.is_dir() else iter([p])), str(p)
        raw, self.num_files = read_bytes(files, max_bytes)
        if len(raw) == 0:
            raise DataError(f"data.path: corpus {self.source} is empty")
        self.data = np.frombuffer(raw, dtype=np.uint8)
        n_val = max(1, int(round(len(self.data) * val_fraction)))
        if n_val >= len(self.data):
            raise DataError(f"data.path: corpus {self.source} ({len(self.data)} bytes) is too small to split")
        self.train = self.data[: len(self.data) - n_val]
        self.val = self.data[len(self.data) - n_val:]

    def __len__(self) -> int:
        return len(self.data)

    def split(self, split: str) -> np.ndarray:
        """The uint8 array of one split ("train" or "val")."""
        if split not in SPLITS:
            raise ConfigError(f"data.split: must be one of {sorted(SPLITS)} (got {split!r})")
        return self.train if split == "train" else self.val

    def batch(self, step: int, batch_size: int, seq_len: int, seed: int,
              split: str = "train") -> tuple[Tensor, Tensor]:
        """(x, y) LongTensors of shape (batch_size, seq_len), y = x shifted by one byte; random windows
        drawn by np.random.default_rng([seed, step, split id]), so a pure function of its arguments."""
        data = self.split(split)
        if batch_size <= 0 or seq_len <= 0:
            raise ConfigError(f"data: batch size and seq_len must be positive (got {batch_size}, {seq_len})")
        if seed < 0 or step < 0:
            raise ConfigError(f"train.seed: seed and step must be non-negative (got {seed}, {step})")
        if len(data) < seq_len + 1:
            raise DataError(f"data.path: {split} split has {len(data)} bytes, fewer than seq_len + 1 = "
                            f"{seq_len + 1}")
        rng = np.random.default_rng([seed, step, SPLITS[split]])
        starts = rng.integers(0, len(data) - seq_len, size=batch_size)
        chunk = torch.from_numpy(data[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def unigram_entropy(self, split: str = "train", bits: bool = False) -> float:
        """Entropy of the byte distribution (nats, or bits): the loss a model that ignores context reaches."""
        counts = np.bincount(self.split(split), minlength=256).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        h = float(-(p * np.log(p)).sum())
        return h / math.log(2) if bits else h


def microbatches(x: Tensor, y: Tensor, n: int) -> list[tuple[Tensor, Tensor]]:
    """Split a batch evenly into `n` micro-batches along dim 0 (views, in order)."""
    b = x.shape[0]
    if n <= 0 or b % n != 0:
        raise ConfigError(f"parallel.microbatches: batch size {b} is not divisible into {n} micro-batches")
    return list(zip(x.split(b // n), y.split(b // n)))
