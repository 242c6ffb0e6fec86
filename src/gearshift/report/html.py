"""report.html: one self-contained page about a run (summary, plots as embedded PNGs, every decision, the
config), built from the files the run left in its directory."""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path

from gearshift.errors import DataError
from gearshift.report.plots import (
    busy_figure,
    decision_records,
    partition_figure,
    png_bytes,
    run_figure,
    step_records,
)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; }
code { font-size: 0.85em; }
img { max-width: 100%; }
"""


def read_run(run_dir: str | Path) -> tuple[list[dict], dict | None]:
    """metrics.jsonl's records and config.json (None when the run has none); DataError for a missing
    directory or metrics file and for a line that is not JSON."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"report: {run} is not a run directory")
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"report: {path} not found (a run directory holds metrics.jsonl)")
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise DataError(f"report: {path} line {i} is not JSON") from None
    cfg_path = run / "config.json"
    config = None
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except json.JSONDecodeError:
            raise DataError(f"report: {cfg_path} is not JSON") from None
    return records, config


def summary(records: list[dict]) -> dict:
    """First and last loss, last validation loss, median tokens/s and bubble (the first step, warm-up, left
    out when there are others), steps and decisions."""
    steps = step_records(records)
    timed = steps[1:] or steps
    decisions = decision_records(records)
    val = [r["val_loss"] for r in steps if "val_loss" in r]
    return {
        "steps": len(steps),
        "step range": f"{steps[0]['step']} .. {steps[-1]['step']}" if steps else "",
        "first loss": steps[0]["loss"] if steps else None,
        "last loss": steps[-1]["loss"] if steps else None,
        "last validation loss": val[-1] if val else None,
        "median tokens/s": statistics.median(r["tokens_per_s"] for r in timed) if timed else None,
        "median step time (s)": statistics.median(r["step_time_s"] for r in timed) if timed else None,
        "median bubble fraction": statistics.median(r["bubble_fraction"] for r in timed) if timed else None,
        "decisions": sum(1 for r in decisions if r.get("event") != "environment"),
        "environment changes": sum(1 for r in decisions if r.get("event") == "environment"),
        "re-plans applied": sum(1 for r in decisions if r.get("event") == "replan" and r.get("apply")),
    }


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "))
    return str(v)


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{html.escape(_fmt(v))}</td>' if isinstance(v, (int, float)) and not isinstance(v, bool)
            else f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def decisions_table(records: list[dict]) -> str:
    """Every decision record: step, event, applied, reason, and the rest of its fields."""
    rows = []
    for r in decision_records(records):
        rest = {k: v for k, v in r.items() if k not in ("step", "event", "apply", "reason")}
        rows.append([r.get("step"), r.get("event"), r.get("apply"), r.get("reason"), rest or None])
    if not rows:
        return "<p>No decisions were recorded.</p>"
    return _table(["step", "event", "applied", "reason", "details"], rows)


def config_tables(config: dict | None) -> str:
    """The job config, one table per section (key, value)."""
    if config is None:
        return "<p>No config.json in the run directory.</p>"
    parts, flat = [], []
    for section, body in config.items():
        if isinstance(body, dict):
            rows = [[k, v] for k, v in body.items()]
            parts.append(f"<h3>[{html.escape(section)}]</h3>" + _table(["key", "value"], rows))
        else:
            flat.append([section, body])
    if flat:
        parts.insert(0, _table(["key", "value"], flat))
    return "".join(parts)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render(records: list[dict], config: dict | None, title: str) -> str:
    """The page as HTML text."""
    figures = [("Loss, throughput and bubbles over steps (decisions, environment changes marked)",
                run_figure(records)),
               ("Partition over time", partition_figure(records)),
               ("Per-rank busy and bubble time", busy_figure(records))]
    sections = [f"<h1>{html.escape(title)}</h1>", "<h2>Summary</h2>",
                _table(["", "value"], [[k, v] for k, v in summary(records).items()])]
    for heading, fig in figures:
        if fig is not None:
            sections += [f"<h2>{html.escape(heading)}</h2>", _img(png_bytes(fig), heading)]
    sections += ["<h2>Decisions</h2>", decisions_table(records), "<h2>Config</h2>", config_tables(config)]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")


def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report.html from RUN_DIR/metrics.jsonl (and config.json when present); returns its path."""
    run = Path(run_dir)
    records, config = read_run(run)
    out = run / "report.html"
    out.write_text(render(records, config, f"Gearshift run: {run}"))
    return out
