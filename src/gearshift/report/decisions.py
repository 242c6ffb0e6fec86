"""The run's decisions as rows a reader can scan: step, kind, what changed, the predicted gain, the cost and the
reason, with the decision's inputs kept aside; the emulated changes of the job's [emulate] scenario as rows of
their own, marked. Read from metrics.jsonl's lines (report.records writes them: "plan", "replan", "schedule",
"placement", "strategy") as plain dicts; an unknown kind still gets a row. Numbers to 3 significant figures."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from gearshift.cluster.emulate import parse_event
from gearshift.errors import ConfigError

SHOWN = {"step", "event", "reason"}  # fields a row shows itself; the rest are the decision's inputs


def sig3(x: object) -> str:
    """A number to 3 significant figures ("0.0123", "1.23", "12,300"), a bool as yes/no, anything else as text;
    lists and tables element by element."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x) or x == 0:
            return "inf" if x == math.inf else "-inf" if x == -math.inf else "nan" if x != x else "0"
        digits = 2 - math.floor(math.log10(abs(x)))
        if digits <= 0:
            return f"{round(x, digits):,.0f}"
        if abs(x) < 1e-4:
            return f"{x:.3g}"
        return f"{round(x, digits):.{digits}f}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(sig3(v) for v in x) + "]"
    if isinstance(x, dict):
        return ", ".join(f"{k}: {sig3(v)}" for k, v in x.items())
    return str(x)


_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:e[+-]?\d+)?(?![\w.])|(?<![\w.])\d+e[+-]?\d+(?![\w.])")


def round_text(text: str) -> str:
    """`text` with every decimal number in it to 3 significant figures ("0.02712 s" -> "0.0271 s", "2.033e+05"
    -> "203,000"); integers as they are."""
    return _DECIMAL.sub(lambda m: sig3(float(m.group())), text)


def seconds(x: float | None) -> str:
    """Seconds to 3 significant figures, in ms below one second."""
    if x is None:
        return "-"
    return f"{sig3(x * 1e3)} ms" if abs(x) < 1 else f"{sig3(float(x))} s"


def ranges(bounds: list | None) -> str:
    """[[0, 3], [3, 5]] -> "0-2 | 3-4" (the layers of each stage)."""
    if not bounds:
        return "-"
    return " | ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in bounds)


def _pct(x: float | None) -> str:
    return "" if x is None else f" ({sig3(100 * x)}%)"


@dataclass
class DecisionRow:
    """One row of the decisions table."""

    step: int | None
    kind: str
    changed: str
    gain: str
    cost: str
    reason: str
    inputs: dict = field(default_factory=dict)
    emulated: bool = False  # a change the job's [emulate] scenario makes (not a decision)
    applied: bool = False  # the decision changed what runs


def _plan(r: dict) -> tuple[str, str, str, bool]:
    it, uni = r.get("iteration_s"), r.get("uniform_iteration_s")
    gain = f"{seconds(uni - it)}/step over uniform{_pct((uni - it) / uni if uni else None)}" \
        if it is not None and uni is not None else "-"
    return f"start with layers {ranges(r.get('bounds'))}", gain, "-", True


def _replan(r: dict) -> tuple[str, str, str, bool]:
    applied = bool(r.get("apply"))
    changed = f"{ranges(r.get('old_bounds'))} → {ranges(r.get('new_bounds'))}" if applied else \
        f"kept {ranges(r.get('old_bounds'))}"
    gain = f"{seconds(r.get('predicted_gain_s'))} over the period{_pct(r.get('predicted_gain_fraction'))}"
    cost = seconds(r.get("migration_cost_s"))
    if r.get("migration"):
        cost += f" (took {seconds(r['migration'].get('seconds'))})"
    return changed, gain, cost, applied


def _mk(x) -> str:
    return f"m={x[0]} K={x[1]}" if x else "-"


def _schedule(r: dict) -> tuple[str, str, str, bool]:
    switch = bool(r.get("switch"))
    changed = (f"{_mk(r.get('current'))} → {_mk(r.get('chosen'))}" if r.get("current") else
               f"start with {_mk(r.get('chosen'))}") if switch else f"kept {_mk(r.get('current') or r.get('chosen'))}"
    now, new = r.get("current_predicted_s"), r.get("predicted_s")
    gain = f"{seconds(now - new)}/step{_pct((now - new) / now if now else None)}" \
        if now is not None and new is not None else "-"
    cost = f"{seconds(r['step_overhead_s'])}/step priced" if r.get("step_overhead_s") else "-"
    return changed, gain, cost, switch


def _placement(r: dict) -> tuple[str, str, str, bool]:
    switch = bool(r.get("switch"))
    n = len(r.get("moved") or [])
    changed = f"moved {n} expert {'copy' if n == 1 else 'copies'}" if switch else "kept the placement"
    t1, t2, k = r.get("t1"), r.get("t2"), r.get("k")
    gain = f"{seconds((t1 - t2) * k)} over {k} steps" if None not in (t1, t2, k) else "-"
    cost = seconds(r.get("tc"))
    if r.get("move"):
        cost += f" (took {seconds(r['move'].get('seconds'))})"
    return changed, gain, cost, switch


def _strategy(r: dict) -> tuple[str, str, str, bool]:
    pool = sorted(r.get("pool") or [], key=lambda s: s.get("step_s", math.inf))
    chosen = next((s for s in pool if s.get("name") == r.get("chosen")), None)
    runner = next((s for s in pool if s is not chosen and s.get("fits", True)), None)
    gain = f"{seconds(runner['step_s'] - chosen['step_s'])}/step over {runner['name']}" \
        if chosen and runner and "step_s" in chosen else "-"
    return f"run {r.get('chosen')}", gain, "-", True


def _shares(r: dict) -> tuple[str, str, str, bool]:
    applied = bool(r.get("apply"))
    changed = f"rows per replica {r.get('rows')} → {r.get('new_rows')}" if applied else f"kept {r.get('rows')}"
    gain = f"{sig3(100 * r['gain'])}% of the slowest replica's compute" if r.get("gain") is not None else "-"
    return changed, gain, "a warm-up step" if applied else "-", applied


KINDS = {"plan": ("first plan", _plan), "replan": ("re-plan", _replan), "schedule": ("schedule", _schedule),
         "placement": ("expert placement", _placement), "strategy": ("strategy", _strategy),
         "shares": ("replica shares", _shares)}


def decision_row(r: dict) -> DecisionRow:
    """A metrics.jsonl decision line as a row (an unknown kind: its name, its reason, its fields as inputs)."""
    kind = r.get("event")
    name, fn = KINDS.get(kind, (str(kind), None))
    changed, gain, cost, applied = fn(r) if fn else ("-", "-", "-", False)
    reason = round_text(str(r.get("reason", "-")))
    if "forced" in reason:
        name += " (forced)"
    inputs = {k: v for k, v in r.items() if k not in SHOWN}
    return DecisionRow(r.get("step"), name, changed, gain, cost, reason, inputs, applied=applied)


def emulated_rows(config: dict | None) -> list[DecisionRow]:
    """The job's [emulate] scenario, one row per change (what the emulator did, not a decision)."""
    scenario = ((config or {}).get("emulate") or {}).get("scenario") or []
    rows = []
    for e in scenario:
        try:
            ev = parse_event(e)
        except ConfigError:
            continue
        what = []
        if ev.slowdown is not None:
            what.append(f"rank {ev.rank} computes {sig3(float(ev.slowdown))}x slower")
        if ev.link_bandwidth is not None:
            what.append(f"rank {ev.rank}'s link capped at {sig3(float(ev.link_bandwidth))} B/s")
        rows.append(DecisionRow(ev.step, "emulated change", "; ".join(what), "-", "-",
                                "emulate.scenario (not a measurement of the hardware)", {"event": e}, emulated=True))
    return rows


def decision_rows(records: list[dict], config: dict | None = None) -> list[DecisionRow]:
    """Every decision of the run and every emulated change, by step (an emulated change first at its step)."""
    rows = [decision_row(r) for r in records if r.get("event") is not None] + emulated_rows(config)
    return sorted(rows, key=lambda d: (d.step if d.step is not None else -1, not d.emulated))
