"""The job's data, whatever it is: batches that are a pure function of (step, batch size, seed, split), so a
resumed or re-partitioned run sees the same data and every replica and stage agrees on it.

`data.name` picks the source: "bytes" (this Python's standard library sources, or data.path) and "text"
(data.path) are byte corpora cut into samples of data.seq_len bytes; "package.module:function" is called with
the [data] table (without `name`) as a dict and returns one of:
  - an object with `batch(step, batch_size, seed, split) -> (inputs, targets)`, a pure function of its
    arguments (split is "train" or "val"; set `has_val = False` on it when it has no validation split);
  - a map-style torch.utils.data.Dataset of (input, target) pairs (no validation split), or a
    (train, val) pair of them: sampled in a shuffled order per epoch drawn from (seed, epoch, split).
Optional attributes of a batch object: `tokens_per_sample` (what tokens/s counts; default: the length of
integer sequence inputs, else 1 per sample) and `unigram_entropy()` (the summary's reference loss)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import Tensor
from torch.utils.data import Dataset, default_collate

from gearshift.errors import ConfigError, DataError
from gearshift.imports import call_user, import_object
from gearshift.models.layered import seeded
from gearshift.train.config import JobConfig
from gearshift.train.data import SPLITS, ByteCorpus


class BatchSource(Protocol):
    def batch(self, step: int, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]: ...


class CorpusBatches:
    """A ByteCorpus cut into samples of `seq_len` bytes (targets: the next byte)."""

    def __init__(self, corpus: ByteCorpus, seq_len: int):
        self.corpus, self.tokens_per_sample = corpus, seq_len

    def batch(self, step: int, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        return self.corpus.batch(step, batch_size, self.tokens_per_sample, seed, split)

    def unigram_entropy(self) -> float:
        return self.corpus.unigram_entropy()


class SampledDataset:
    """Map-style datasets of (input, target) pairs as batches: the samples of split s are taken in epochs,
    each a permutation drawn by np.random.default_rng([seed, epoch, split id]); the batch of `step` is
    positions [step * batch_size, (step + 1) * batch_size) of that endless sequence, collated with
    torch.utils.data.default_collate."""

    def __init__(self, train: Dataset, val: Dataset | None = None):
        self.splits = {"train": train, "val": val}
        self.has_val = val is not None
        self._perm: dict[str, tuple[tuple[int, int], np.ndarray]] = {}  # split -> ((seed, epoch), permutation)

    def _permutation(self, split: str, seed: int, epoch: int, n: int) -> np.ndarray:
        key = (seed, epoch)
        if split not in self._perm or self._perm[split][0] != key:
            self._perm[split] = (key, np.random.default_rng([seed, epoch, SPLITS[split]]).permutation(n))
        return self._perm[split][1]

    def batch(self, step: int, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        ds = self.splits.get(split)
        if ds is None:
            raise DataError(f"data: the dataset has no {split!r} split")
        n = len(ds)
        if n == 0:
            raise DataError(f"data: the {split} dataset is empty")
        pos = np.arange(step * batch_size, (step + 1) * batch_size)
        idx = np.concatenate([self._permutation(split, seed, int(e), n)[pos[pos // n == e] % n]
                              for e in np.unique(pos // n)])
        items = [ds[int(i)] for i in idx]
        if not all(isinstance(it, (tuple, list)) and len(it) == 2 for it in items[:1]):
            raise DataError(f"data: dataset items must be (input, target) pairs, got {type(items[0]).__name__}")
        x, y = default_collate(items)
        return x, y


@dataclass
class JobData:
    """What the loop, the evaluator and the profiler draw batches from."""

    source: Any  # a BatchSource
    has_val: bool
    tokens_per_sample: int

    def batch(self, step: int, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        return self.source.batch(step, batch_size, seed, split)

    def sample(self, n: int, seed: int) -> tuple[Tensor, Tensor]:
        """A batch of `n` training samples (the first step's): what shapes and profiles are taken from."""
        return self.batch(0, n, seed)

    def unigram_entropy(self) -> float | None:
        """The loss of a model that ignores context, where the data can say (byte corpora); else None."""
        fn = getattr(self.source, "unigram_entropy", None)
        return float(fn()) if fn is not None else None


def _is_dataset(obj: Any) -> bool:
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not isinstance(obj, (tuple, list))


def as_source(result: Any, where: str) -> Any:
    """A batch source from what a data function returned (see the module's docstring)."""
    if callable(getattr(result, "batch", None)):
        return result
    if _is_dataset(result):
        return SampledDataset(result)
    if isinstance(result, (tuple, list)) and len(result) == 2 and all(_is_dataset(r) for r in result):
        return SampledDataset(*result)
    raise ConfigError(f"{where}: returned {type(result).__name__}; expected an object with batch(step, batch_size, "
                      f"seed, split), a map-style Dataset, or a (train, val) pair of Datasets")


def tokens_per_sample(x: Tensor) -> int:
    """What tokens/s counts per sample: the length of integer sequences (token ids), else 1 (a sample)."""
    return int(x.shape[1]) if x.dim() >= 2 and not x.is_floating_point() else 1


def job_data(cfg: JobConfig) -> JobData:
    """The job's data (built the same way on every rank: the data function runs under a RNG seeded from
    train.seed)."""
    d = cfg.data
    if d.name in ("bytes", "text"):
        corpus = ByteCorpus(d.path or None, d.val_fraction, d.max_bytes)
        seq_len = d.seq_len or cfg.model.gpt.context
        return JobData(CorpusBatches(corpus, seq_len), True, seq_len)
    fn = import_object(d.name, "data.name")
    with seeded(cfg.train.seed, -2):
        result = call_user(fn, d.name, "data.name", d.table())
    source = as_source(result, f"data.name: {d.name}")
    tokens = getattr(source, "tokens_per_sample", None)
    if tokens is None:
        tokens = tokens_per_sample(source.batch(0, 1, cfg.train.seed, "train")[0])
    return JobData(source, bool(getattr(source, "has_val", True)), int(tokens))
