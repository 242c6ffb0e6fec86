"""Chrome/Perfetto trace JSON from per-rank timelines, so predicted and measured runs open side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gearshift.sim.engine import SimResult

Event = tuple[str, float, float, dict]  # (name, start s, end s, args)

_COMPUTE = re.compile(r"^(?:[FB]\d+|STEP)$")


def category(name: str) -> str:
    """ "compute" for forward/backward/optimizer step labels ("F3", "B0", "STEP"), else "comm"."""
    return "compute" if _COMPUTE.match(name) else "comm"


def chrome_trace(timelines: dict[str, list[Event]], process_name: str) -> dict:
    """One process named `process_name`, one thread per track (e.g. "rank 0"), ph "X" events in
    microseconds. args may carry "cat" to override the category inferred from the name."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": process_name}}
    ]
    for tid, (track, items) in enumerate(timelines.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": track}})
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid, "args": {"sort_index": tid}}
        )
        for name, start, end, args in items:
            args = dict(args)
            cat = args.pop("cat", None) or category(name)
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat,
                    "pid": 0,
                    "tid": tid,
                    "ts": start * 1e6,
                    "dur": max(end - start, 0.0) * 1e6,
                    "args": args,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def sim_trace(result: SimResult, name: str = "predicted") -> dict:
    """A SimResult as a trace: one track per rank, plus one per used link showing transfers in flight."""
    tracks: dict[str, list[Event]] = {}
    for rank, line in enumerate(result.timelines):
        tracks[f"rank {rank}"] = [(a.label, start, end, _args(a)) for a, start, end in line]
    for a, src, dst, start, end in result.transfers:
        args = _args(a) | {"cat": "comm"}
        tracks.setdefault(f"link {src}->{dst}", []).append((a.label, start, end, args))
    return chrome_trace(tracks, name)


def _args(a) -> dict:
    out = {"op": a.op.value}
    for key in ("stage", "mb", "peer"):
        value = getattr(a, key)
        if value >= 0:
            out[key] = value
    return out


def merge_traces(*traces: dict) -> dict:
    """Put each trace in its own process (pid 0, 1, ...) of one trace, e.g. predicted next to measured."""
    events = [dict(e, pid=pid) for pid, trace in enumerate(traces) for e in trace["traceEvents"]]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, trace: dict) -> Path:
    """Write trace JSON (open it in ui.perfetto.dev or chrome://tracing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, separators=(",", ":")))
    return path
