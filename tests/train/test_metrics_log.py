"""metrics.jsonl on resume reads as one uninterrupted run: the steps from the resume point on are dropped, and the
decisions made before the checkpoint are kept (a decision after step s is logged at step s + 1, where it takes
effect, and a checkpoint at s + 1 is written after it)."""

from __future__ import annotations

import json
import resource

import pytest

from gearshift.errors import DataError
from gearshift.train.metrics import MetricsLog, read_metrics


def test_resume_drops_later_steps_and_keeps_the_decisions_before_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in range(5):
        log.write({"step": step, "loss": 1.0})
        if step in (2, 4):  # decided after this step, in force from the next
            log.write({"event": "placement", "step": step + 1})
    log.close()
    MetricsLog(path, resume_step=3).close()  # the checkpoint after step 2 (written after its decision)
    kept = [(r.get("event", "step"), r["step"]) for r in read_metrics(path)]
    assert kept == [("step", 0), ("step", 1), ("step", 2), ("placement", 3)]
    assert json.loads(path.read_text().splitlines()[-1])["event"] == "placement"


def test_a_torn_last_line_is_left_out_and_a_bad_line_before_it_is_an_error(tmp_path):
    """A crash in mid-write leaves part of a line at the end: readers and a resume leave it out (a restart read it
    and failed with JSONDecodeError, every restart alike)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 0}, {"step": 1}]
    MetricsLog(path, resume_step=5).close()
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
    path.write_text('{"step": 0}\n{"st\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        read_metrics(path)


def test_a_write_the_disk_refuses_is_one_line_naming_output_dir_and_leaves_no_torn_line(tmp_path):
    """A full disk (here the file size limit, which fails a write past it the same way) at a metrics line: a
    DataError naming the file, and the file holds the lines before it, whole."""
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"step": 0})
    before = path.read_text()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 10, hard))
    try:
        with pytest.raises(DataError, match=rf"^output.dir: cannot write {path}: .* \(the checkpoints are kept; "
                                            r"--resume continues from the newest\)$"):
            log.write({"step": 1, "loss": 2.5, "note": "x" * 100})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert path.read_text() == before
    log.write({"step": 1})
    log.close()
    assert read_metrics(path) == [{"step": 0}, {"step": 1}]
