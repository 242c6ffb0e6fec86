"""Tiny jobs for launcher, checkpoint and CLI tests (seconds, not minutes)."""

from __future__ import annotations

TINY = [
    "--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16",
    "--train.batch_size=8", "--data.max_bytes=100000", "--train.eval_every=0",
    "--parallel.microbatches=2", "--output.trace=false", "--output.progress=false", "--output.report=false",
]
