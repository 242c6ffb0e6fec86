"""metrics.jsonl on resume reads as one uninterrupted run: the steps from the resume point on are dropped, and the
decisions made before the checkpoint are kept (a decision after step s is logged at step s + 1, where it takes
effect, and a checkpoint at s + 1 is written after it)."""

from __future__ import annotations

import json

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
