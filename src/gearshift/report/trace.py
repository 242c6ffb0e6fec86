"""Chrome/Perfetto trace JSON from per-rank timelines, so predicted and measured runs open side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gearshift.sim.engine import SimResult

Event = tuple[str, float, float, dict]  # (name, start s, end s, args)

_COMPUTE = re.compile(r"^(?:[FB]\d+|STEP)$")
_PASS = re.compile(r"^[FB]\d+$")  # a forward or backward of one micro-batch


def category(name: str) -> str:
    """ "compute" for forward/backward/optimizer step labels ("F3", "B0", "STEP"), else "comm"."""
    return "compute" if _COMPUTE.match(name) else "comm"


# chrome://tracing's reserved colours, one per direction; Perfetto ignores cname and colours a slice by its
# name without digits, so each direction's slices are named by a letter ("dir A") on a track of their own.
_CNAMES = ("rail_response", "rail_animation", "good", "rail_load", "yellow", "olive", "terrible", "rail_idle")


def direction_name(pipe: int) -> str:
    """The slice name of direction (pipe) `pipe` in traces: "dir A", "dir B", ..."""
    return f"dir {chr(ord('A') + pipe % 26)}"


def direction_tracks(timelines: dict[str, list[Event]], stages_per_pipe: int) -> dict[str, list[Event]]:
    """Beside each rank's track, a track of its forwards and backwards coloured by direction (one colour per
    direction): every such event with a "stage" arg, renamed to its direction."""
    out: dict[str, list[Event]] = {}
    for track, items in timelines.items():
        out[track] = items
        dirs = [(direction_name(args["stage"] // stages_per_pipe), start, end,
                 dict(args, cat="direction", cname=_CNAMES[args["stage"] // stages_per_pipe % len(_CNAMES)]))
                for name, start, end, args in items if args.get("stage", -1) >= 0 and _PASS.match(name)]
        if dirs:
            out[f"{track} directions"] = dirs
    return out


def chrome_trace(timelines: dict[str, list[Event]], process_name: str, stages_per_pipe: int | None = None) -> dict:
    """One process named `process_name`, one thread per track (e.g. "rank 0"), ph "X" events in
    microseconds. args may carry "cat" to override the category inferred from the name (and "cname", a
    chrome://tracing colour). With `stages_per_pipe` (several pipes), each rank's compute is also drawn on
    a track of its own, one colour per direction (direction_tracks)."""
    if stages_per_pipe:
        timelines = direction_tracks(timelines, stages_per_pipe)
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
            cname = args.pop("cname", None)
            event = {
                "ph": "X",
                "name": name,
                "cat": cat,
                "pid": 0,
                "tid": tid,
                "ts": start * 1e6,
                "dur": max(end - start, 0.0) * 1e6,
                "args": args,
            }
            if cname:
                event["cname"] = cname
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def sim_trace(result: SimResult, name: str = "predicted", stages_per_pipe: int | None = None) -> dict:
    """A SimResult as a trace: one track per rank, plus one per used link showing transfers in flight (and,
    with `stages_per_pipe`, each rank's compute coloured by direction)."""
    tracks: dict[str, list[Event]] = {}
    for rank, line in enumerate(result.timelines):
        tracks[f"rank {rank}"] = [(a.label, start, end, _args(a)) for a, start, end in line]
    for a, src, dst, start, end in result.transfers:
        args = _args(a) | {"cat": "comm"}
        tracks.setdefault(f"link {src}->{dst}", []).append((a.label, start, end, args))
    return chrome_trace(tracks, name, stages_per_pipe)


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
