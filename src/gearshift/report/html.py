"""report.html: one self-contained page about a run (summary, plots as embedded PNGs, every decision, the
config), built from the files the run left in its directory."""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path

from gearshift.errors import DataError
from gearshift.report.decisions import decision_rows, sig3
from gearshift.report.plots import (
    busy_figure,
    decision_records,
    emulated_steps,
    partition_figure,
    png_bytes,
    run_figure,
    step_records,
)
from gearshift.report.run_info import RunInfo, read_run_info
from gearshift.words import plural

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; }
code { font-size: 0.85em; }
img { max-width: 100%; }
p.job { font-size: 1.05em; background: #f6f8fa; border-left: 4px solid #4a7; padding: 0.5em 0.8em; }
table.decisions tr.applied td { background: #eef8ee; }
table.decisions tr.emulated td { background: #f3eefa; font-style: italic; }
.tag { background: #7a5aa8; color: white; border-radius: 3px; padding: 0 0.35em; font-size: 0.8em;
       font-style: normal; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border: 1px solid #ccc; vertical-align: middle;
          margin-left: 0.8em; }
.swatch.applied { background: #eef8ee; } .swatch.kept { background: white; } .swatch.emulated { background: #f3eefa; }
p.legend { font-size: 0.85em; color: #555; }
details summary { cursor: pointer; color: #36c; }
table.inputs { font-size: 0.85em; margin: 0.3em 0; }
"""


def read_run(run_dir: str | Path, notes: list[str] | None = None) -> tuple[list[dict], dict | None]:
    """metrics.jsonl's records and config.json (None when the run has none); DataError for a missing
    directory, for neither file there, and for a line that is not JSON, but for a last line cut short (a run
    that died while writing it): that line is left out and `notes` told so."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"report: {run} is not a run directory")
    path = run / "metrics.jsonl"
    if not path.is_file() and not (run / "config.json").is_file():
        raise DataError(f"report: {path} not found (a run directory holds metrics.jsonl)")
    records = []
    text = path.read_text() if path.is_file() else ""  # a run started, no step logged yet: its config alone
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) and not text.endswith("\n"):  # cut short as the run died: keep what it logged
                    if notes is not None:
                        notes.append(f"report: {path} line {i} is cut short (the run stopped while writing it); "
                                     f"left out")
                    break
                raise DataError(f"report: {path} line {i} is not JSON") from None
    cfg_path = run / "config.json"
    config = None
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except json.JSONDecodeError:
            raise DataError(f"report: {cfg_path} is not JSON") from None
    if notes is not None and not any("loss" in r for r in records):
        notes.append(f"report: {run} has no finished step logged yet (a run that has not finished its first "
                     "step, or stopped before it): the page holds the job and its config only")
    return records, config


def summary(records: list[dict], info: RunInfo | None = None) -> dict:
    """First and last loss, last validation loss, the unigram entropy where the data has one, median throughput
    (tokens or samples per second) and bubble (the first step, warm-up, left out when there are others), steps
    and decisions. Keys name their units."""
    info = info or RunInfo()
    steps = step_records(records)
    timed = steps[1:] or steps
    decisions = decision_records(records)
    val = [r["val_loss"] for r in steps if "val_loss" in r]
    unit = f" ({info.loss_unit})" if info.loss_unit else ""
    out = {
        "steps": len(steps),
        "step range": f"{steps[0]['step']} .. {steps[-1]['step']}" if steps else "",
        f"first loss{unit}": steps[0]["loss"] if steps else None,
        f"last loss{unit}": steps[-1]["loss"] if steps else None,
        f"last validation loss{unit}": val[-1] if val else None,
    }
    if info.unigram_entropy is not None:
        out["unigram entropy (nats; a model that ignores context)"] = info.unigram_entropy
    out.update({
        f"median {info.rate}": statistics.median(r["tokens_per_s"] for r in timed) if timed else None,
        "median step time (s)": statistics.median(r["step_time_s"] for r in timed) if timed else None,
        "median bubble fraction": statistics.median(r["bubble_fraction"] for r in timed) if timed else None,
        "decisions": sum(1 for r in decisions if r.get("event") != "environment"),
        "environment changes": sum(1 for r in decisions if r.get("event") == "environment"),
        "re-plans applied": sum(1 for r in decisions if r.get("event") == "replan" and r.get("apply")),
    })
    if any(r.get("event") == "decision" for r in decisions):  # the one controller's (adapt.controller = joint)
        out["controller moves applied"] = sum(1 for r in decisions if r.get("event") == "decision" and r.get("apply"))
    if not info.loss_unit:
        out["loss"] = "the model's own loss function (its unit is the model's)"
    return out


def _fmt(v: object) -> str:
    return sig3(v)


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{html.escape(_fmt(v))}</td>' if isinstance(v, (int, float)) and not isinstance(v, bool)
            else f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _inputs(inputs: dict) -> str:
    """A decision's inputs, folded: one row per field, numbers to 3 significant figures (a long list shortened)."""
    if not inputs:
        return "-"
    rows = []
    for k, v in inputs.items():
        text = sig3(v)
        if len(text) > 300:
            text = text[:300] + " …"
        rows.append(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(text)}</td></tr>")
    return f"<details><summary>inputs</summary><table class=\"inputs\">{''.join(rows)}</table></details>"


NB_HYPHEN = "\u2011"  # a hyphen the browser does not break a line at


def decisions_table(records: list[dict], config: dict | None = None) -> str:
    """Every decision (and every emulated change of the job's scenario, marked): step, kind, what changed, the
    predicted gain, the cost, the reason, and its inputs folded under a details element."""
    rows = decision_rows(records, config)
    if not rows:
        return "<p>No decisions were recorded.</p>"
    head = "".join(f"<th>{h}</th>" for h in ("step", "kind", "what changed", "predicted gain", "cost", "reason",
                                             "inputs"))
    body = []
    for d in rows:
        cls = "emulated" if d.emulated else "applied" if d.applied else "kept"
        kind = html.escape(d.kind) + (' <span class="tag">emulated</span>' if d.emulated else "")
        cells = [f'<td class="num">{html.escape(sig3(d.step))}</td>', f"<td>{kind}</td>",
                 f"<td>{html.escape(d.changed).replace('-', NB_HYPHEN)}</td>",  # a layer range stays whole
                 *(f"<td>{html.escape(x)}</td>" for x in (d.gain, d.cost, d.reason)),
                 f"<td>{_inputs(d.inputs)}</td>"]
        body.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>")
    legend = ('<p class="legend"><span class="swatch applied"></span> changed what runs '
              '<span class="swatch kept"></span> kept <span class="swatch emulated"></span> emulated change '
              "(emulate.scenario: the job slowed a rank on purpose)</p>")
    return legend + f'<table class="decisions"><tr>{head}</tr>{"".join(body)}</table>'


def job_shape(config: dict | None, info: RunInfo | None = None) -> str:
    """The job in one line from its config.json: model, data, workers as stages x replicas, schedule and
    micro-batches, batch, steps, partition, and what is emulated."""
    if not config:
        return "The run has no config.json: its job is unknown."
    m, d, c, p, t = (config.get(k) or {} for k in ("model", "data", "cluster", "parallel", "train"))
    e = config.get("emulate") or {}
    name = m.get("name", "gpt")
    model = name
    if name in ("gpt", "moe_gpt"):
        gpt = m.get("gpt") or m
        shape = [plural(gpt["layers"], "block") if "layers" in gpt else None,
                 f"width {gpt['width']}" if "width" in gpt else None,
                 f"{gpt['experts']} experts" if name == "moe_gpt" and "experts" in gpt else None]
        model += f" ({', '.join(x for x in shape if x)})" if any(shape) else ""
    workers, stages = c.get("workers"), p.get("stages")
    parts = [f"model {model}", f"data {d.get('name', 'bytes')}"]
    if workers and stages:
        if p.get("schedule") == "multidir":
            parts.append(f"{plural(workers, 'worker')}: multidir, {p.get('directions')} directions over "
                         f"{plural(stages, 'stage')}")
        else:
            parts.append(f"{plural(workers, 'worker')}: {plural(stages, 'stage')} x "
                         f"{plural(workers // stages, 'replica')}")
    if p.get("schedule"):
        mbs = p.get("microbatches")
        parts.append(f"schedule {p['schedule']}" + (f", {plural(mbs, 'micro-batch', 'micro-batches')}"
                                                     if mbs else ""))
    if p.get("experts", 1) > 1 or p.get("strategy") == "auto":
        parts.append(f"expert-parallel width {p.get('experts')}, strategy {p.get('strategy', 'fixed')}")
    if t.get("batch_size"):
        unit = (info.throughput_unit if info else "samples").replace("tokens", "sequences")
        parts.append(f"batch {t['batch_size']} {unit}")
    if t.get("steps"):
        parts.append(plural(t["steps"], "step"))
    if isinstance(p.get("partition"), str):
        parts.append(f"partition {p['partition']}")
    slow = [f for f in (e.get("slowdown") or []) if f != 1]
    if slow or e.get("scenario") or e.get("link_bandwidth"):
        what = []
        if slow:
            what.append(f"slowdown {_sig3s(e['slowdown'])}")
        if e.get("scenario"):
            what.append(f"{plural(len(e['scenario']), 'scenario change')}")
        if e.get("link_bandwidth"):
            what.append(f"links capped at {_sig3s(e['link_bandwidth'])} B/s")
        parts.append("emulated: " + ", ".join(what))
    return " · ".join(parts)


def _sig3s(v: float | list) -> str:
    """A number, or a per-rank list of them, to 3 significant figures."""
    return " / ".join(sig3(float(x)) for x in v) if isinstance(v, list) else sig3(float(v))


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


def render(records: list[dict], config: dict | None, title: str, info: RunInfo | None = None) -> str:
    """The page as HTML text."""
    info = info or RunInfo.from_config(config)
    figures = [("Loss, throughput and bubbles over steps (decisions, environment changes marked)",
                run_figure(records, info.unigram_entropy, info.loss_label, info.rate, emulated_steps(config))),
               ("Partition over time", partition_figure(records)),
               ("Per-rank busy and bubble time", busy_figure(records))]
    sections = [f"<h1>{html.escape(title)}</h1>", f'<p class="job">{html.escape(job_shape(config, info))}</p>',
                "<h2>Summary</h2>", _table(["", "value"], [[k, v] for k, v in summary(records, info).items()])]
    for heading, fig in figures:
        if fig is not None:
            sections += [f"<h2>{html.escape(heading)}</h2>", _img(png_bytes(fig), heading)]
    sections += ["<h2>Decisions</h2>", decisions_table(records, config), "<h2>Config</h2>", config_tables(config)]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")


def write_report(run_dir: str | Path, notes: list[str] | None = None) -> Path:
    """Write RUN_DIR/report.html from RUN_DIR/metrics.jsonl (and config.json when present); returns its path
    (what it left out of a run cut short: in `notes`)."""
    run = Path(run_dir)
    records, config = read_run(run, notes)
    out = run / "report.html"
    out.write_text(render(records, config, f"Gearshift run: {run}", read_run_info(run, config)))
    return out
