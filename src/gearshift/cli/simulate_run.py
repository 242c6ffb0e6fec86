"""The run `gearshift simulate` compares with: the job in output.dir's config.json, the check that the job asked
about is that one, and what actually ran there from its metrics.jsonl (each (m, K) and partition that ran, with
its steps' measured times), so that the prediction is for the schedule that ran, never for another job's."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.errors import ConfigError
from gearshift.train.config import JobConfig, load_config
from gearshift.train.metrics import read_metrics

# The keys that change a prediction (every key of these sections, or the keys named); the rest (steps, learning
# rate, outputs, adaptation periods) do not.
PREDICTION_SECTIONS = ("model", "data", "emulate")
PREDICTION_KEYS = {"cluster": ("workers", "spec", "device", "ranks_per_node"), "train": ("batch_size",),
                   "parallel": ("stages", "schedule", "microbatches", "k", "partition", "directions", "update",
                                "experts", "strategy")}
STRATEGY_KEYS = ("stages", "experts", "partition", "strategy")  # what parallel.strategy = auto sets in the run


@dataclass
class Segment:
    """Steps that ran one (m, K) on one partition, and their measured step times and bubble fractions (each
    segment's first step left out, as its warm-up)."""

    m: int
    k: int
    bounds: list[tuple[int, int]]
    steps: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    bubble: list[float] = field(default_factory=list)
    recompute: tuple[int, ...] = ()  # the stages that recomputed (parallel.recompute = auto's choice)

    @property
    def measured_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    @property
    def measured_bubble(self) -> float | None:
        return statistics.median(self.bubble) if self.bubble else None

    def label(self) -> str:
        again = f" recomputing {','.join(map(str, self.recompute))}" if self.recompute else ""
        return f"m={self.m} K={self.k}{again}, steps {_ranges(self.steps)}"


def run_config(out: Path) -> dict | None:
    """output.dir's config.json (the job as it ran), or None where the directory holds no run's config."""
    path = out / "config.json"
    if not (path.is_file() and (out / "metrics.jsonl").is_file()):
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise ConfigError(f"output.dir: {path} is not a run's config.json (not JSON)") from None


def the_job(config: str | None, overrides: list[str]) -> tuple[JobConfig, bool]:
    """The job to predict and whether output.dir holds its run (then the job is the run's). With no config file the
    run's config.json is the base the overrides apply to; a job that differs from the run in a key that changes the
    prediction is refused in one line."""
    given = load_config(config, overrides)
    d = run_config(Path(given.output.dir))
    if d is None:
        return given, False
    ran = load_config(None, [f"--output.dir={given.output.dir}"], base=d)
    if config is None:
        given = load_config(None, overrides, base=d)
    check_same_job(given, ran)
    return ran, True


def check_same_job(given: JobConfig, ran: JobConfig) -> None:
    """ConfigError naming the first key that changes the prediction and differs between the two jobs."""
    a, b = given.to_dict(), ran.to_dict()
    keys = [(sec, k) for sec in PREDICTION_SECTIONS for k in sorted(set(a[sec]) | set(b[sec]))]
    keys += [(sec, k) for sec, ks in PREDICTION_KEYS.items() for k in ks]
    for sec, k in keys:
        if sec == "parallel" and k in STRATEGY_KEYS and given.parallel.strategy == "auto":
            continue  # the run's config holds the strategy auto chose
        if sec == "parallel" and k == "microbatches" and given.parallel.microbatch_size:
            continue  # the size decides: compared by train.batch_size and the layout
        if a[sec].get(k) != b[sec].get(k):
            raise ConfigError(f"output.dir: {given.output.dir} holds a run of another job: {sec}.{k} is "
                              f"{b[sec].get(k)!r} there but {a[sec].get(k)!r} here (simulate predicts the run in "
                              "output.dir: give no config, or that run's; another job: another --output.dir)")


def segments(cfg: JobConfig, out: Path, bounds: list[tuple[int, int]]) -> list[Segment]:
    """What ran in `out`, per (m, K) and partition, in the order first run. The (m, K) is the config's, or for
    parallel.schedule = auto each "schedule" event's choice from its step on; the partition is each step's
    (`bounds` where a step does not say, and always for multidir, whose slices the config fixes)."""
    p = cfg.parallel
    lines = read_metrics(out / "metrics.jsonl")
    running = (p.microbatches, p.k)
    chosen: dict[int, tuple[int, int]] = {}
    again: dict[int, tuple[int, ...]] = {}
    for d in lines:
        if d.get("event") == "schedule":
            chosen[int(d["step"])] = tuple(d["chosen"])
            again[int(d["step"])] = tuple(d.get("recompute", ()))
    recompute: tuple[int, ...] = ()
    rows = sorted((d for d in lines if "event" not in d and "step_time_s" in d), key=lambda d: d["step"])
    found: dict[tuple, Segment] = {}
    last = None
    for i, d in enumerate(rows):
        running, recompute = chosen.get(d["step"], running), again.get(d["step"], recompute)
        part = bounds if p.schedule == "multidir" or not d.get("partition") else [tuple(b) for b in d["partition"]]
        key = (*running, tuple(part), recompute)
        seg = found.setdefault(key, Segment(running[0], running[1], list(part), recompute=recompute))
        seg.steps.append(d["step"])
        if i > 0 and key == last:  # a run's first step, and the first after a change, warm up
            seg.step_s.append(d["step_time_s"])
            seg.bubble.append(d["bubble_fraction"])
        last = key
    return list(found.values())


def moe_shares(out: Path) -> list[list[float]] | None:
    """Each MoE layer's share of the tokens routed per expert over the run, from metrics.jsonl (None: none logged)."""
    rows = [d["expert_tokens"] for d in read_metrics(out / "metrics.jsonl") if d.get("expert_tokens")]
    if not rows:
        return None
    totals = [[sum(col) for col in zip(*layer)] for layer in zip(*rows)]
    return [[t / max(sum(layer), 1) for t in layer] for layer in totals]


def job_title(cfg: JobConfig) -> str:
    """The job in one line: model, workers, stages, replicas, schedule, micro-batches and their size."""
    p, c = cfg.parallel, cfg.cluster
    model = cfg.model.name
    if model == "moe_gpt":
        g = cfg.model.gpt
        model += f" ({_n(g.experts, 'expert')}, top-{g.top_k}, over {_n(p.experts, 'rank')})"
    size = cfg.train.batch_size // cfg.batch_parts // p.microbatches
    if p.schedule == "multidir":
        how = (f"multidir: {_n(p.directions, 'direction')} over {_n(p.stages, 'stage')}, update {p.update}, "
               f"{_n(p.microbatches, 'micro-batch', 'micro-batches')} of {size} per direction")
    else:
        sched = p.schedule + (f" K={p.k}" if p.schedule == "kfkb" else "")
        if p.schedule == "auto":
            sched += " (the (m, K) chosen as it ran)"
        how = (f"{_n(p.stages, 'stage')} x {_n(cfg.replicas, 'replica')}, {sched}, "
               f"{_n(p.microbatches, 'micro-batch', 'micro-batches')} of {size}")
    return f"{model}, {_n(c.workers, 'worker')}, {how}"


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2, 5-6'."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}-{s}" if s != start else f"{s}")
            start = None
    return ", ".join(out)
