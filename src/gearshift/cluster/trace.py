"""Co-tenant traces: a file of changes to the emulated cluster (`emulate.trace`), rows {step, rank, slowdown}
(from `step` on, `rank` computes `slowdown` times slower than profiled) and {step, link: [src, dst], bandwidth}
(from `step` on, transfers src -> dst run at `bandwidth` bytes/s), as JSON (a list of rows, or {"rows": [...]})
or CSV (columns step, rank, slowdown, link, bandwidth; link as "SRC-DST"). Pure Python: read and checked here,
applied by cluster.emulate at step boundaries; written by planner-free generators (cluster.trace_synth)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from gearshift.errors import ConfigError

ROW_KEYS = {"step", "rank", "slowdown", "link", "bandwidth"}


@dataclass(frozen=True)
class TraceRow:
    """One change: a rank's slowdown, or a link's bandwidth (bytes/s), from `step` on."""

    step: int
    rank: int | None = None
    slowdown: float | None = None
    link: tuple[int, int] | None = None
    bandwidth: float | None = None

    def to_dict(self) -> dict:
        if self.link is not None:
            return {"step": self.step, "link": list(self.link), "bandwidth": self.bandwidth}
        return {"step": self.step, "rank": self.rank, "slowdown": self.slowdown}


def read_trace(path: str | Path, world_size: int | None = None, where: str = "emulate.trace") -> list[TraceRow]:
    """The rows of a trace file, checked (ranks inside the job when `world_size` is given, steps in order);
    a ConfigError names the first bad field."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{where}: {str(path)!r} is a directory; expected a co-tenant trace file (.json or .csv, "
                          "as `gearshift trace synth` writes)")
    if not p.is_file():
        raise ConfigError(f"{where}: no such file {str(path)!r}")
    text = p.read_text()
    if p.suffix.lower() == ".csv":
        raw = [_csv_row(r, f"{where}[{i}]") for i, r in enumerate(csv.DictReader(text.splitlines()))]
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg} at line {e.lineno}); expected a list of rows "
                              "{step, rank, slowdown} / {step, link: [src, dst], bandwidth}, or a .csv") from None
        if isinstance(data, dict) and "traceEvents" in data:  # a run's trace.json: a timeline, not a co-tenant trace
            raise ConfigError(f"{where}: {str(path)!r} is a run's timeline (open it in https://ui.perfetto.dev); "
                              "expected a co-tenant trace, as `gearshift trace synth` writes")
        raw = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(raw, list):
            raise ConfigError(f"{where}: expected a list of rows (or {{\"rows\": [...]}})")
    rows = [parse_row(r, world_size, f"{where}[{i}]") for i, r in enumerate(raw)]
    for i in range(1, len(rows)):
        if rows[i].step < rows[i - 1].step:
            raise ConfigError(f"{where}[{i}].step: steps out of order ({rows[i].step} after {rows[i - 1].step})")
    return rows


def _csv_row(r: dict, where: str) -> dict:
    out: dict = {}
    for k, v in r.items():
        if k is None or v is None or v == "":
            continue
        if k not in ROW_KEYS:
            raise ConfigError(f"{where}.{k}: unknown column (allowed: {', '.join(sorted(ROW_KEYS))})")
        try:
            if k == "link":
                a, b = v.split("-")
                out[k] = [int(a), int(b)]
            else:
                out[k] = int(v) if k in ("step", "rank") else float(v)
        except ValueError:
            raise ConfigError(f"{where}.{k}: not a number{' pair SRC-DST' if k == 'link' else ''}: {v!r}") from None
    return out


def _number(x: object, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {x!r}")
    return float(x)


def _rank(x: object, world_size: int | None, where: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0 or (world_size is not None and x >= world_size):
        allowed = f"0..{world_size - 1}" if world_size is not None else ">= 0"
        raise ConfigError(f"{where}: expected a rank in {allowed}, got {x!r}")
    return x


def parse_row(r: object, world_size: int | None = None, where: str = "emulate.trace") -> TraceRow:
    """One row, checked; a ConfigError names the field."""
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: expected a row {{step, rank, slowdown}} or {{step, link, bandwidth}}, got {r!r}")
    for k in r:
        if k not in ROW_KEYS:
            raise ConfigError(f"{where}.{k}: unknown field (allowed: {', '.join(sorted(ROW_KEYS))})")
    step = r.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"{where}.step: expected an integer >= 0, got {step!r}")
    if "link" in r:
        link = r["link"]
        if not isinstance(link, list) or len(link) != 2:
            raise ConfigError(f"{where}.link: expected [src, dst], got {link!r}")
        a, b = (_rank(x, world_size, f"{where}.link") for x in link)
        if a == b:
            raise ConfigError(f"{where}.link: src and dst must differ, got {link!r}")
        if "bandwidth" not in r:
            raise ConfigError(f"{where}.bandwidth: a link row needs a bandwidth in bytes/s")
        return TraceRow(step, link=(a, b), bandwidth=_number(r["bandwidth"], f"{where}.bandwidth"))
    if "rank" not in r:
        raise ConfigError(f"{where}.rank: a row needs a rank (with slowdown) or a link (with bandwidth)")
    if "slowdown" not in r:
        raise ConfigError(f"{where}.slowdown: a rank row needs a slowdown")
    return TraceRow(step, _rank(r["rank"], world_size, f"{where}.rank"), _number(r["slowdown"], f"{where}.slowdown"))


def write_trace(rows: list[TraceRow], path: str | Path) -> None:
    """Write rows as JSON ({"rows": [...]}) or, for a .csv path, CSV."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        lines = ["step,rank,slowdown,link,bandwidth"]
        for r in rows:
            lines.append(f"{r.step},,,{r.link[0]}-{r.link[1]},{r.bandwidth}" if r.link
                         else f"{r.step},{r.rank},{r.slowdown},,")
        p.write_text("\n".join(lines) + "\n")
    else:
        p.write_text(json.dumps({"rows": [r.to_dict() for r in rows]}, indent=1) + "\n")


def changes_at(rows: list[TraceRow]) -> dict[int, list[TraceRow]]:
    """The rows grouped by step (the steps where the environment changes)."""
    out: dict[int, list[TraceRow]] = {}
    for r in rows:
        out.setdefault(r.step, []).append(r)
    return out


def slowdown_series(rows: list[TraceRow], ranks: int, steps: int) -> list[list[float]]:
    """Each rank's slowdown at each step 0..steps-1 (1.0 before its first row)."""
    cur, out, by = [1.0] * ranks, [], changes_at(rows)
    for s in range(steps):
        for r in by.get(s, []):
            if r.rank is not None:
                cur[r.rank] = r.slowdown
        out.append(list(cur))
    return out
