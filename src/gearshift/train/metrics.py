"""metrics.jsonl: one JSON object per step (and per evaluation / re-planning event), appended by rank 0: each a
record of gearshift.report.records, written as its to_dict()."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gearshift.errors import DataError

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
            kept = [json.dumps(r) for r in _records(path.read_text()) if _before(r, resume_step)]
            path.write_text("".join(ln + "\n" for ln in kept))
        self._f = open(path, "ab", buffering=0)  # each line goes to the file as it is written, or fails there
        self._size = path.stat().st_size

    def write(self, record: dict | Record) -> None:
        """Append one line; a write that fails (a full disk) leaves the file as it was, and is one line naming
        output.dir (DataError) with the checkpoints untouched."""
        line = (json.dumps(record if isinstance(record, dict) else record.to_dict()) + "\n").encode()
        try:
            if self._f.write(line) != len(line):  # part of it: the disk filled up
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            try:  # no torn line left behind for a resume to read
                os.truncate(self.path, self._size)
            except OSError:
                pass
            raise DataError(f"output.dir: cannot write {self.path}: {e.strerror or e} (the checkpoints are "
                            "kept; --resume continues from the newest)") from None
        self._size += len(line)

    def close(self) -> None:
        self._f.close()


def _before(record: dict, resume_step: int) -> bool:
    """Whether `record` happened before the checkpoint at `resume_step`."""
    step = record.get("step", 0)
    return step <= resume_step if "event" in record else step < resume_step


def read_metrics(path: str | Path) -> list[dict]:
    return _records(Path(path).read_text())


def steps_logged(path: str | Path) -> int:
    """How many steps metrics.jsonl says were finished (the last step record's step + 1; 0 with no file)."""
    if not Path(path).is_file():
        return 0
    return max((r.get("step", -1) for r in read_metrics(path) if "event" not in r), default=-1) + 1


def _records(text: str) -> list[dict]:
    """The records of metrics.jsonl's text; a torn last line (a crash in mid-write) is left out, a bad line
    before it is an error."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    records = []
    for i, ln in enumerate(lines):
        try:
            records.append(json.loads(ln))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise
    return records
