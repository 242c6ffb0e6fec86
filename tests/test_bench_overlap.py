"""bench/overlap.py's traced parts (pure): a step's trace cut into compute, the wait for the slowest replica, the sync
once every replica is in, and what the STEP adds after the last one is out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import overlap  # noqa: E402


def _trace(path: Path, ranks: list[dict[str, tuple[float, float]]]) -> Path:
    """A measured step's trace as the Tracer writes it: per rank (tid) spans in microseconds."""
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "measured step 7"}}]
    for tid, spans in enumerate(ranks):
        events += [{"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": s * 1e6, "dur": (e - s) * 1e6}
                   for name, (s, e) in spans.items()]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_the_step_in_parts_counts_each_wait_once(tmp_path):
    # two replicas: rank 1 reaches SYNC 0.2 s later; the ring lets rank 0 out 0.01 s before rank 1; the clip's
    # all-reduce holds rank 0 in STEP until rank 1 is out, then both update for 0.02 s
    ranks = [{"F0": (0.0, 0.4), "B0": (0.4, 1.0), "SYNC": (1.0, 1.49), "STEP": (1.49, 1.52)},
             {"F0": (0.0, 0.5), "B0": (0.5, 1.2), "SYNC": (1.2, 1.5), "STEP": (1.5, 1.52)}]
    parts = overlap.trace_parts(_trace(tmp_path / "trace.json", ranks))
    assert parts["compute_s"] == pytest.approx(1.1) and parts["slowest_wait_s"] == pytest.approx(0.1)
    assert parts["sync_s"] == pytest.approx(0.3)  # from the last one in to the last one out
    assert parts["step_op_s"] == pytest.approx(0.02)  # after the last one out: the update, not the wait
    assert parts["step_span_s"] == pytest.approx(0.025)  # the STEP's own span holds rank 0's 0.01 s wait
    assert parts["compute_s"] + parts["slowest_wait_s"] + parts["sync_s"] + parts["step_op_s"] == pytest.approx(1.52)
    assert overlap.trace_parts(tmp_path / "missing.json") is None
