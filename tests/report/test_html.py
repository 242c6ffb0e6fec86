"""report.html from a metrics.jsonl written here: one self-contained page with the plots, every decision,
the summary and the config; bad run directories fail in one line."""

import base64
import json
import re

import pytest

from gearshift.cli.main import main
from gearshift.errors import DataError
from gearshift.report.html import read_run, summary, write_report
from gearshift.train.config import load_config


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
                    "old_bounds": OLD, "new_bounds": NEW, "old_iteration_s": 0.61234567, "new_iteration_s": 0.5,
                    "predicted_gain_s": 1.23456789, "predicted_gain_fraction": 0.1234567,
                    "migration_cost_s": 0.0456789})
    records += [step(i, 5.0 - 0.1 * i, NEW) for i in range(6, 10)]
    records[-1]["val_loss"] = 4.25
    records.append({"event": "schedule_switch", "step": 10, "from": "1f1b", "to": "kfkb k=2",
                    "reason": "links <tested & escaped>"})
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config:
        (run / "config.json").write_text(json.dumps({
            "model": {"name": "gpt", "layers": 6, "width": 128}, "data": {"name": "bytes"},
            "cluster": {"workers": 4}, "train": {"batch_size": 32, "steps": 10},
            "parallel": {"stages": 4, "schedule": "1f1b", "microbatches": 8, "partition": "adaptive"},
            "emulate": {"slowdown": [], "scenario": ["3:1:3.0"]}}))
    return records


def _rows(section: str) -> list[str]:
    """The decisions table's rows (each a <tr class=...> up to the next), their folded inputs left in."""
    return section.split('<tr class="')[1:]


def test_page_holds_plots_decisions_summary_and_config(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    page = write_report(run).read_text()
    assert (run / "report.html").is_file()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # loss/throughput/bubbles, partition over time, per-rank busy and bubble
    assert all(base64.b64decode(b).startswith(b"\x89PNG") for b in images)
    decisions = page[page.index("<h2>Decisions</h2>"):page.index("<h2>Config</h2>")]
    rows = _rows(decisions)
    assert [r.split('"')[0] for r in rows] == ["emulated", "applied", "kept"]  # by step; the scenario's marked
    assert "replan" not in decisions.split("<details>")[0]  # kinds in words
    assert "re-plan" in rows[1] and "schedule_switch" in rows[2] and "predicted gain 12%" in rows[1]
    assert "&lt;tested &amp; escaped&gt;" in decisions and "<tested" not in page
    config = page[page.index("<h2>Config</h2>"):]
    assert "[parallel]" in config and "microbatches" in config and "128" in config


def test_decisions_are_a_readable_table_with_inputs_folded(tmp_path):
    """step, kind, what changed, predicted gain, cost, reason: words and numbers to 3 significant figures, no
    JSON; the inputs under a details element; the scenario's change marked emulated."""
    run = tmp_path / "run"
    write_run(run)
    page = write_report(run).read_text()
    decisions = page[page.index("<h2>Decisions</h2>"):page.index("<h2>Config</h2>")]
    head = re.findall(r"<th>([^<]+)</th>", decisions.split("</tr>")[0])
    assert head == ["step", "kind", "what changed", "predicted gain", "cost", "reason", "inputs"]
    emulated, replan, other = _rows(decisions)
    shown = [r.split("<details>")[0] for r in (emulated, replan, other)]
    assert not any("{" in r or "[[" in r or '": ' in r for r in shown)  # no JSON outside the folded inputs
    assert "0-1 | 2-3 | 4-5 | 6-7 → 0-2 | 3-4 | 5-6 | 7" in shown[1].replace("\u2011", "-")
    assert "1.23 s over the period (12.3%)" in shown[1] and "45.7 ms" in shown[1]
    assert "1.2345" not in page and "0.6123" not in page  # 3 significant figures everywhere
    assert all(r.count("<details><summary>inputs</summary>") == 1 for r in (replan, other))
    assert "0.612" in replan.split("<details>")[1]  # the inputs, folded, to 3 figures too
    assert 'class="tag">emulated</span>' in emulated and "rank 1 computes 3.00x slower" in emulated
    assert emulated.split("</td>")[0].endswith(">3")  # at the scenario's step


def test_the_job_shape_units_and_unigram_line(tmp_path):
    """The job's shape under the title; the summary names tokens/s and nats and gives the unigram entropy where
    run.json has one; samples and no unit for a model with its own loss."""
    from gearshift.report.run_info import RunInfo

    run = tmp_path / "run"
    write_run(run)
    RunInfo.of_job("gpt", 128, 3.25).write(run)
    page = write_report(run).read_text()
    job = re.search(r'<h1>.*?</h1>\s*<p class="job">([^<]+)</p>', page, re.S).group(1)
    assert "model gpt (6 blocks, width 128)" in job and "4 workers: 4 stages x 1 replica" in job
    assert "schedule 1f1b, 8 micro-batches" in job and "batch 32 sequences" in job and "emulated: 1 scenario" in job
    summary_part = page[page.index("<h2>Summary</h2>"):page.index("<h2>Loss")]
    assert "median tokens/s" in summary_part and "first loss (nats)" in summary_part
    assert "unigram entropy" in summary_part and ">3.25<" in summary_part
    RunInfo.of_job("examples.mlp:build", 1, None).write(run)
    page = write_report(run).read_text()
    summary_part = page[page.index("<h2>Summary</h2>"):page.index("<h2>Loss")]
    assert "median samples/s" in summary_part and "tokens" not in summary_part and "nats" not in summary_part
    assert "the model&#x27;s own loss function" in summary_part and "unigram" not in summary_part


def test_run_info_falls_back_to_the_config(tmp_path):
    from gearshift.report.run_info import RunInfo, read_run_info

    assert read_run_info(tmp_path, {"model": {"name": "m:f"}, "data": {"name": "d:f"}}) == \
        RunInfo("samples", 1, None, None)
    assert read_run_info(tmp_path, {"model": {"name": "moe_gpt"}, "data": {"name": "bytes"}}).rate == "tokens/s"
    (tmp_path / "run.json").write_text("{not json")
    assert read_run_info(tmp_path, None) == RunInfo()


def test_numbers_to_three_significant_figures():
    from gearshift.report.decisions import round_text, sig3

    assert [sig3(x) for x in (0.0123456, 1.23456, 12.3456, 123.456, 12345.6, 1e-7, 0.0, 7, True, None)] == \
        ["0.0123", "1.23", "12.3", "123", "12,300", "1e-07", "0", "7", "yes", "-"]
    assert sig3([0.61234567, 2]) == "[0.612, 2]"
    assert round_text("predicted 0.02712 s/step; gain 0.03846 s over 4 steps (1 layers, 2.033e+05 bytes), v1.2") == \
        "predicted 0.0271 s/step; gain 0.0385 s over 4 steps (1 layers, 203,000 bytes), v1.2"


def test_summary_figures():
    records = [step(i, 5.0 - 0.5 * i, OLD) for i in range(4)]
    records[0]["tokens_per_s"] = 1.0  # warm-up step: left out of the median
    records.append({"event": "replan", "step": 4, "apply": False, "reason": "gain below noise"})
    s = summary(records)
    assert (s["steps"], s["first loss (nats)"], s["last loss (nats)"]) == (4, 5.0, 3.5)
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


def test_a_run_that_died_while_writing_a_line_is_reported_up_to_it(tmp_path, capsys):
    """A run killed half way leaves its last line cut short: the page holds every step before it, and says so."""
    run = tmp_path / "run"
    records = write_run(run)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-len(json.dumps(records[-1])) // 2 - 1])  # half the last line
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"line {len(records)} is cut short (the run stopped while writing it); left out")
    notes: list[str] = []
    assert read_run(run, notes)[0] == records[:-1] and len(notes) == 1  # every whole line, the cut one left out
    assert "Gearshift run" in (run / "report.html").read_text()


def test_cli_writes_the_page(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run)
    assert main(["report", str(run)]) == 0
    assert str(run / "report.html") in capsys.readouterr().out
    assert main(["report", str(run), "--extra"]) == 2


def test_the_job_shape_reads_per_rank_emulation_lists():
    from gearshift.report.html import job_shape

    cfg = {"model": {}, "parallel": {}, "train": {}, "cluster": {},
           "emulate": {"slowdown": [1, 4], "link_bandwidth": [1e9, 2e5]}}
    line = job_shape(cfg)
    assert "slowdown 1.00 / 4.00" in line and "200,000 B/s" in line


def test_a_run_with_no_step_yet_is_a_page_of_its_config_and_says_so(tmp_path, capsys):
    """A run dir whose first step has not finished (config.json, metrics.jsonl empty or not written yet) gets a
    page of the job and its config and a line saying why there are no figures; a dir with neither is refused."""
    run = tmp_path / "run"
    run.mkdir()
    assert main(["report", str(run)]) == 2 and "metrics.jsonl not found" in capsys.readouterr().err
    (run / "config.json").write_text(json.dumps(load_config(None, ["--train.steps=7"]).to_dict()))
    for metrics in (None, ""):
        if metrics is not None:
            (run / "metrics.jsonl").write_text(metrics)
        assert main(["report", str(run)]) == 0
        out = capsys.readouterr().out
        assert "has no finished step logged yet" in out and str(run / "report.html") in out
        assert "7 steps" in (run / "report.html").read_text()
