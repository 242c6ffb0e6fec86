"""ByteCorpus: default stdlib corpus, user files and dirs, deterministic batches, splits, errors."""

import math

import numpy as np
import pytest
import torch

from gearshift.errors import ConfigError, DataError
from gearshift.train.data import ByteCorpus, microbatches

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def stdlib() -> ByteCorpus:
    return ByteCorpus(max_bytes=1 << 20)


def test_default_corpus_is_stdlib_source(stdlib):
    assert stdlib.source.startswith("stdlib:")
    assert len(stdlib) == 1 << 20
    assert stdlib.data.dtype == np.uint8
    assert b"def " in stdlib.data.tobytes()
    again = ByteCorpus(max_bytes=1 << 20)
    assert np.array_equal(again.data, stdlib.data)


def test_split_is_tail_and_disjoint(stdlib):
    n = len(stdlib)
    assert len(stdlib.train) + len(stdlib.val) == n
    assert len(stdlib.val) == round(0.05 * n)
    assert np.array_equal(np.concatenate([stdlib.train, stdlib.val]), stdlib.data)


def test_batches_deterministic(stdlib):
    x, y = stdlib.batch(step=3, batch_size=4, seq_len=32, seed=1)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = stdlib.batch(step=3, batch_size=4, seq_len=32, seed=1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, stdlib.batch(step=4, batch_size=4, seq_len=32, seed=1)[0])
    assert not torch.equal(x, stdlib.batch(step=3, batch_size=4, seq_len=32, seed=2)[0])
    assert not torch.equal(x, stdlib.batch(step=3, batch_size=4, seq_len=32, seed=1, split="val")[0])


def windows_in(data: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> bool:
    """Every row of (x, y) is a contiguous window of `data`."""
    raw = data.tobytes()
    return all(bytes(r.tolist()) in raw for r in torch.cat([x, y[:, -1:]], dim=1))


def test_batches_come_from_their_split(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"a" * 900 + b"b" * 100)  # train is all "a", val all "b"
    c = ByteCorpus(str(f), val_fraction=0.1)
    x, y = c.batch(0, 8, 16, seed=0)
    assert (x == ord("a")).all() and (y == ord("a")).all()
    x, y = c.batch(0, 8, 16, seed=0, split="val")
    assert (x == ord("b")).all() and (y == ord("b")).all()


def test_user_file_and_directory(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_bytes(b"BBBB")
    (tmp_path / "d" / "a.txt").write_bytes(b"AAAA")
    (tmp_path / "d" / "sub" / "c.bin").write_bytes(bytes(range(256)))
    c = ByteCorpus(str(tmp_path / "d"), val_fraction=0.5)
    assert c.data.tobytes() == b"AAAABBBB" + bytes(range(256))
    assert c.num_files == 3
    one = ByteCorpus(str(tmp_path / "d" / "a.txt"), val_fraction=0.25)
    assert one.train.tobytes() == b"AAA" and one.val.tobytes() == b"A"
    capped = ByteCorpus(str(tmp_path / "d"), max_bytes=6)
    assert capped.data.tobytes() == b"AAAABB" and capped.num_files == 2
    x, y = c.batch(0, 2, 8, seed=0)
    assert windows_in(c.train, x, y)


def test_unigram_entropy(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abcd" * 100 + b"zz" * 10)
    c = ByteCorpus(str(f), val_fraction=20 / 420)
    assert c.unigram_entropy() == pytest.approx(math.log(4))
    assert c.unigram_entropy(bits=True) == pytest.approx(2.0)
    assert c.unigram_entropy("val") == pytest.approx(0.0)


def test_errors(tmp_path):
    with pytest.raises(DataError, match="data.path"):
        ByteCorpus(str(tmp_path / "missing.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="data.path"):
        ByteCorpus(str(tmp_path / "empty"))
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(DataError, match="data.path"):
        ByteCorpus(str(tmp_path / "e.txt"))
    (tmp_path / "small.txt").write_bytes(b"0123456789" * 3)
    c = ByteCorpus(str(tmp_path / "small.txt"), val_fraction=0.2)
    with pytest.raises(DataError, match="data.path"):
        c.batch(0, 1, 10, seed=0, split="val")  # 6 val bytes < 11
    with pytest.raises(ConfigError, match="data.val_fraction"):
        ByteCorpus(str(tmp_path / "small.txt"), val_fraction=1.0)
    with pytest.raises(ConfigError, match="data.split"):
        c.batch(0, 1, 4, seed=0, split="test")


def test_microbatches():
    x, y = torch.arange(24).view(6, 4), torch.arange(24).view(6, 4) + 1
    parts = microbatches(x, y, 3)
    assert len(parts) == 3 and all(a.shape == (2, 4) for a, _ in parts)
    assert torch.equal(torch.cat([a for a, _ in parts]), x)
    assert torch.equal(torch.cat([b for _, b in parts]), y)
    with pytest.raises(ConfigError, match="parallel.microbatches"):
        microbatches(x, y, 4)
    with pytest.raises(ConfigError, match="parallel.microbatches"):
        microbatches(x, y, 0)
