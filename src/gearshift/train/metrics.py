"""metrics.jsonl: one JSON object per step (and per evaluation / re-planning event), appended by rank 0."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Append-only JSON lines; on resume, lines from steps at or after the resume point are dropped so
    the file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in lines if json.loads(ln).get("step", 0) < resume_step]
            path.write_text("".join(ln + "\n" for ln in kept))
        self._f = open(path, "a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
