"""metrics.jsonl: one JSON object per step (and per evaluation / re-planning event), appended by rank 0."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Append-only JSON lines; on resume, lines from steps at or after the resume point are dropped so
    the file reads as one uninterrupted run. A decision ("event") is logged at the step it takes effect from, after
    the step before it and before that step's checkpoint: one at the resume point itself is kept."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in lines if _before(json.loads(ln), resume_step)]
            path.write_text("".join(ln + "\n" for ln in kept))
        self._f = open(path, "a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _before(record: dict, resume_step: int) -> bool:
    """Whether `record` happened before the checkpoint at `resume_step`."""
    step = record.get("step", 0)
    return step <= resume_step if "event" in record else step < resume_step


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def step_record(step: int, loss: float, grad_norm: float, lr: float, busy_s: float, step_s: float,
                bounds: list, tokens: int, speed: float | None, stop: bool,
                peak_act_bytes: int = 0) -> tuple[dict, bool]:
    """The metrics record of `step` from every rank's busy and step time and peak bytes of activations saved
    for backward (collective), and whether any rank was asked to stop (so that all of them stop after the
    same step)."""
    from gearshift.comm.policy import gather

    rows = gather((busy_s, step_s, speed, stop, peak_act_bytes))
    wall = max(r[1] for r in rows)
    rec = {
        "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / wall,
        "step_time_s": wall, "busy_s": [r[0] for r in rows],
        "bubble_fraction": 1.0 - sum(r[0] for r in rows) / (len(rows) * wall),
        "partition": [list(b) for b in bounds], "peak_act_bytes": [r[4] for r in rows],
    }
    if speed is not None:
        rec["measured_speed"] = [r[2] for r in rows]
    return rec, any(r[3] for r in rows)
