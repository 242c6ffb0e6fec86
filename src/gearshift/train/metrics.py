"""metrics.jsonl: one JSON object per step (and per evaluation / re-planning event), appended by rank 0: each a
record of gearshift.report.records, written as its to_dict()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gearshift.report.records import Record


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

    def write(self, record: dict | Record) -> None:
        self._f.write(json.dumps(record if isinstance(record, dict) else record.to_dict()) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _before(record: dict, resume_step: int) -> bool:
    """Whether `record` happened before the checkpoint at `resume_step`."""
    step = record.get("step", 0)
    return step <= resume_step if "event" in record else step < resume_step


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
