"""report.html from a metrics.jsonl written here: one self-contained page with the plots, every decision,
the summary and the config; bad run directories fail in one line."""

import base64
import json
import re

import pytest

from gearshift.cli.main import main
from gearshift.errors import DataError
from gearshift.report.html import summary, write_report


def step(i: int, loss: float, bounds: list[list[int]], **extra) -> dict:
    busy = [0.3, 0.5, 0.4, 0.2]
    return {"step": i, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1000.0 + i,
            "step_time_s": 0.6, "busy_s": busy, "bubble_fraction": 1 - sum(busy) / (4 * 0.6),
            "partition": bounds, **extra}


OLD = [[0, 2], [2, 4], [4, 6], [6, 8]]
NEW = [[0, 3], [3, 5], [5, 7], [7, 8]]


def write_run(run, config: bool = True) -> list[dict]:
    records = [step(i, 5.0 - 0.1 * i, OLD) for i in range(6)]
    records.append({"event": "replan", "step": 6, "apply": True, "reason": "predicted gain 12%",
                    "old_bounds": OLD, "new_bounds": NEW, "old_iteration_s": 0.6, "new_iteration_s": 0.5})
    records += [step(i, 5.0 - 0.1 * i, NEW) for i in range(6, 10)]
    records[-1]["val_loss"] = 4.25
    records.append({"event": "schedule_switch", "step": 10, "from": "1f1b", "to": "kfkb k=2",
                    "reason": "links <tested & escaped>"})
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config:
        (run / "config.json").write_text(json.dumps({"model": {"layers": 6, "width": 128},
                                                     "parallel": {"schedule": "1f1b", "microbatches": 8}}))
    return records


def test_page_holds_plots_decisions_summary_and_config(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    page = write_report(run).read_text()
    assert (run / "report.html").is_file()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # loss/throughput/bubbles, partition over time, per-rank busy and bubble
    assert all(base64.b64decode(b).startswith(b"\x89PNG") for b in images)
    decisions = page[page.index("<h2>Decisions</h2>"):page.index("<h2>Config</h2>")]
    assert decisions.count("<tr>") == 3  # header + both decisions, whatever their kind
    assert "replan" in decisions and "schedule_switch" in decisions and "predicted gain 12%" in decisions
    assert "&lt;tested &amp; escaped&gt;" in decisions and "<tested" not in page
    config = page[page.index("<h2>Config</h2>"):]
    assert "[parallel]" in config and "microbatches" in config and "128" in config


def test_summary_figures():
    records = [step(i, 5.0 - 0.5 * i, OLD) for i in range(4)]
    records[0]["tokens_per_s"] = 1.0  # warm-up step: left out of the median
    records.append({"event": "replan", "step": 4, "apply": False, "reason": "gain below noise"})
    s = summary(records)
    assert (s["steps"], s["first loss"], s["last loss"]) == (4, 5.0, 3.5)
    assert s["median tokens/s"] == 1002.0
    assert (s["decisions"], s["re-plans applied"]) == (1, 0)


def test_run_without_config_or_decisions(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(step(0, 5.0, OLD)) + "\n")
    page = write_report(run).read_text()
    assert "No decisions were recorded" in page and "No config.json" in page


@pytest.mark.parametrize("case", ["missing", "no_metrics", "bad_json"])
def test_bad_run_dir_is_one_error_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    if case != "missing":
        run.mkdir()
    if case == "bad_json":
        (run / "metrics.jsonl").write_text('{"step": 0}\n{not json\n')
    with pytest.raises(DataError, match="run directory|metrics.jsonl"):
        write_report(run)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gearshift report: error:")


def test_cli_writes_the_page(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run)
    assert main(["report", str(run)]) == 0
    assert str(run / "report.html") in capsys.readouterr().out
    assert main(["report", str(run), "--extra"]) == 2
