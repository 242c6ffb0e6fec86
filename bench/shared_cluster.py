"""Shared cluster: 4 ranks under seeded co-tenant traces (every rank at least --base x slower by duty cycle, the
trace's factors on top). Systems: gearshift (adaptive partition, auto schedule, the joint controller with change
detection), best_static (every contiguous partition at the default schedule, then the (m, K) grid, m from 4 to twice
--micro, on the three best, each measured under every phase of the trace; the least total time over the trace),
uniform_1f1b, torch (torch.distributed.pipelining's schedules on an equal-time split, the one with the least total
time over the trace), and oracle (each phase's best measured configuration, switched at no cost). Writes
bench/results/shared_cluster.json.

Static configurations are measured in two jobs per trace (the partitions, then the grid), phase by phase (each
phase's environment held by trace rows), each candidate for --segment steps by forced re-partitions and schedule
switches (the first step of each segment left out). gearshift's time is its step times plus its decision points'
wall time (probes, pricing and moves). torch's schedules (GPipe and 1F1B; with 2 x 4 layer units or more also
Interleaved1F1B, InterleavedZeroBubble and ZBVZeroBubble) run over the whole trace in one job, stepped in rotating
order, each stage module wrapped (bench/torch_pipe.Slowed) under the trace's emulation: each step's duty cycle of
its rank and the capped links' delays into it, from Gearshift's own Emulator."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path

import torch.distributed as dist
from torch.distributed import pipelining as pp
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

import harness
from gearshift.cluster.emulate import Emulator
from gearshift.cluster.trace import TraceRow, changes_at, read_trace, write_trace
from gearshift.cluster.trace_synth import synth
from gearshift.planner.schedule_choice import splits
from gearshift.profile.model_profile import ModelProfile
from gearshift.testing import spawn
from gearshift.train.build import equal_time_slices, lr_at
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from gearshift.train.forcing import Forcing
from torch_pipe import Slowed, TorchPipeline

WORLD = 4
TRACES = {"cotenant": ("cotenant", 0.0), "burst": ("burst", 0.0), "link": ("cotenant", 2e7)}


def make_trace(kind: str, link_bw: float, steps: int, seed: int, base: float, path: Path) -> list[TraceRow]:
    """A synthesized trace with every rank's slowdown times `base` (the duty-cycle floor), written to `path`."""
    rows = [TraceRow(r.step, r.rank, r.slowdown * base) if r.rank is not None else r
            for r in synth(kind, WORLD, steps, seed, link_bandwidth=link_bw, mean_gap=steps / 3, mean_stay=steps / 4)]
    write_trace(rows, path)
    return read_trace(path, WORLD)


def phases(rows: list[TraceRow], steps: int) -> list[tuple[int, int, tuple]]:
    """(start, end, state) of each phase: the steps between changes and every rank's and link's value there."""
    state: dict = {("r", r): 1.0 for r in range(WORLD)}
    out, by = [], changes_at(rows)
    starts = sorted(s for s in by if s < steps)
    for i, s in enumerate(starts):
        for r in by[s]:
            state[("r", r.rank) if r.link is None else ("l", r.link)] = r.slowdown if r.link is None else r.bandwidth
        out.append((s, starts[i + 1] if i + 1 < len(starts) else steps, tuple(sorted(state.items()))))
    return out


def sweep(name: str, configs: list[tuple], ph: list[tuple], seg: int, base: list[str], work: Path,
          nice: int = 0) -> dict:
    """One job measuring every (bounds, (m, k)) of `configs` under every distinct state of the phases `ph`: state by
    state (held by a trace row per rank and link), each config for `seg` steps (forced re-partitions and switches);
    the median step time of each segment, the first step left out. Returns (bounds, (m, k)) -> time per phase."""
    states = list(dict.fromkeys(st for *_, st in ph))
    n, rows, parts, scheds = len(configs), [], {}, {}
    for i, state in enumerate(states):
        rows += [TraceRow(i * n * seg, k[1], v) if k[0] == "r" else TraceRow(i * n * seg, link=k[1], bandwidth=v)
                 for k, v in state]
        for j, (b, mk) in enumerate(configs):
            g = (i * n + j) * seg
            if g and configs[j - 1][0] != b:  # configs[-1] before a phase's first
                parts[g] = list(b)
            scheds[g] = mk
    write_trace(rows, work / f"{name}.json")
    run = harness.run_job(name, [*base, f"--emulate.trace={work / f'{name}.json'}", harness.partition(configs[0][0]),
                                 "--parallel.schedule=kfkb", f"--train.steps={len(states) * n * seg}"], work,
                          nice=nice, forcing=Forcing(partitions=parts, schedules=scheds))
    t = {r["step"]: r["step_time_s"] for r in run.steps}
    at = {st: i for i, st in enumerate(states)}
    return {c: [statistics.median(t[s] for s in range(((at[st] * n + j) * seg) + 1, (at[st] * n + j + 1) * seg))
                for *_, st in ph] for j, c in enumerate(configs)}


def torch_schedules(units: int) -> dict[str, int]:
    """torch.distributed.pipelining's schedules that `units` layer units allow: name -> stages per rank."""
    return {"GPipe": 1, "1F1B": 1} | ({t: 2 for t in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")}
                                      if units >= 2 * WORLD else {})


def _torch_worker(rank: int, world: int, overrides: list[str], cuts: dict[int, list], micro: int) -> dict:
    """Every torch schedule on this rank, stepped in rotating order over the trace; each stage module slowed by this
    rank's factor at the step, and its input and output gradient delayed by the capped links into this rank."""
    cfg = load_config(None, overrides)
    data, em, step = job_data(cfg), Emulator(cfg.emulate, rank), [0]
    group = dist.new_group(list(range(world)))

    def wrap(owner: list[int]):
        def make(s: int, module):
            peer = {"forward": owner[s - 1] if s else None, "backward": owner[s + 1] if s + 1 < len(owner) else None}

            def receive(nbytes: int, way: str) -> None:
                if peer[way] is not None and peer[way] != rank:
                    em.transfer_delay(nbytes, 0.0, step[0], peer[way])
            return Slowed(module, em.slowdown_at(0), receive)
        return make

    runners = {}
    for t, v in torch_schedules(cfg.model.gpt.layers + 2).items():
        owner = list(range(world)) if v == 1 else \
            generate_stage_to_rank_mapping(world, v * world, style="v" if t.startswith("ZBV") else "loop")
        owner = [owner[s] for s in range(v * world)]
        runners[t] = TorchPipeline(cfg, group, getattr(pp, f"Schedule{t}"), cuts[v], owner, micro, wrap(owner))

    def before(key: str, s: int) -> None:  # the trace's factor at this step, as Gearshift's emulation applies it
        step[0] = s
        for mod in runners[key].wrapped.values():
            mod.f = em.slowdown_at(s)

    res = harness.interleave(runners, cfg.train.steps, 0, lambda s: data.batch(s, cfg.train.batch_size, cfg.train.seed),
                             lambda key, s: lr_at(s, cfg), before)
    return {k: r["times"] for k, r in res.items()}


def run_torch(overrides: list[str], profile: ModelProfile, micro: int) -> dict[str, float]:
    """Each torch schedule's total step time over the trace (an equal-time split, `micro` micro-batches)."""
    cuts = {v: [list(b) for b in equal_time_slices(profile, v * WORLD)] for v in (1, 2)
            if profile.num_layers >= v * WORLD}
    t0 = time.perf_counter()
    times = spawn(_torch_worker, WORLD, overrides, cuts, micro, timeout_s=7200)[0]
    print(f"  torch        {len(times)} schedules in {time.perf_counter() - t0:5.1f} s", flush=True)
    return {k: sum(v) for k, v in times.items()}


def partitions(units: int, stages: int) -> list[list[tuple[int, int]]]:
    """Every contiguous partition of `units` layer units over `stages` stages."""
    return [[(a, b) for a, b in zip((0, *cuts), (*cuts, units))]
            for cuts in itertools.combinations(range(1, units), stages - 1)]


def main() -> None:
    quick = {"layers": 3, "width": 32, "context": 32, "batch": 8, "steps": 24, "segment": 3, "traces": "cotenant",
             "top": 1, "every": 8}
    p = harness.parser(__doc__, "shared_cluster", quick, layers=4, width=64, context=64, batch=16, micro=4,
                       max_bytes=2_000_000, steps=120, keep="", nice=0)
    p.add_argument("--base", type=float, default=4.0, help="duty-cycle slowdown floor on every rank (>= 4)")
    p.add_argument("--segment", type=int, default=4, help="steps per static candidate in the measuring jobs")
    p.add_argument("--traces", default="cotenant,burst,link", help="which traces (cotenant, burst, link)")
    p.add_argument("--top", type=int, default=3, help="best partitions the (m, K) grid is measured on")
    p.add_argument("--every", type=int, default=10, help="gearshift's adapt.every")
    p.add_argument("--detect", type=float, default=2.0, help="gearshift's adapt.detect")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    work, t_start, seg = harness.workdir("shared_cluster", a.keep), time.perf_counter(), a.segment
    base = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", *harness.QUIET,
            "--train.warmup_steps=5", f"--adapt.profiles={work / 'profiles'}", f"--adapt.profile={work / 'p.json'}"]
    profile = harness.robust_profile(load_config(None, [o for o in base if "adapt.profile" not in o]), 3,
                                     work / "p.json")
    tokens = a.batch * a.context
    units = a.layers + 2
    parts = partitions(units, WORLD)
    grid = [(m, k) for m in splits(a.batch) if WORLD <= m <= 2 * a.micro for k in range(1, m + 1) if m % k == 0]
    default = (a.micro, 1)
    rows, report = [], {}
    for name in a.traces.split(","):
        kind, link_bw = TRACES[name]
        trace = make_trace(kind, link_bw, a.steps, a.seed, a.base, work / f"{name}.json")
        ph = phases(trace, a.steps)
        times = sweep(f"{name}.partitions", [(tuple(b), default) for b in parts], ph, seg, base, work, a.nice)
        total = {c: sum(t * (e - s) for t, (s, e, _) in zip(ts, ph)) for c, ts in times.items()}
        top = [b for b, _ in sorted(total, key=total.get)[:a.top]]  # the (m, K) grid on the best partitions
        times.update(sweep(f"{name}.grid", [(b, mk) for b in top for mk in grid if mk != default], ph, seg, base,
                           work, a.nice))
        total = {c: sum(t * (e - s) for t, (s, e, _) in zip(ts, ph)) for c, ts in times.items()}
        best = min(total, key=total.get)
        oracle_s = sum(min(ts[i] for ts in times.values()) * (e - s) for i, (s, e, _) in enumerate(ph))
        uni = tuple(min(parts, key=lambda b: max(y - x for x, y in b) - min(y - x for x, y in b)))
        live = harness.run_job(f"{name}.gearshift", [*base, f"--emulate.trace={work / f'{name}.json'}",
                                                     f"--train.steps={a.steps}", "--parallel.partition=adaptive",
                                                     "--parallel.schedule=auto", "--adapt.controller=joint",
                                                     f"--adapt.every={a.every}", f"--adapt.detect={a.detect}"], work,
                               nice=a.nice)
        decisions = live.events("decision")
        live_s = sum(r["step_time_s"] for r in live.steps) + sum(d.get("decision_s") or 0 for d in decisions)
        applied = sorted(d["step"] for d in decisions if d["apply"])
        at = sorted(d["step"] for d in decisions)  # a change's reaction: its first decision point (moved or kept)
        react = [x for x in (next((d - c for d in at if d > c), None) for c in changes_at(trace) if c > 0)
                 if x is not None]
        torch_s = run_torch([*base, f"--emulate.trace={work / f'{name}.json'}", f"--train.steps={a.steps}"], profile,
                            a.micro)
        best_torch = min(torch_s, key=torch_s.get)
        tps = {"gearshift": tokens * a.steps / live_s, "best_static": tokens * a.steps / total[best],
               "uniform_1f1b": tokens * a.steps / total[(uni, default)], "oracle": tokens * a.steps / oracle_s,
               "torch": tokens * a.steps / torch_s[best_torch]}
        for system, v in tps.items():
            rows.append({"trace": name, "system": system, "tokens_per_s": v,
                         "reaction_steps": statistics.median(react) if system == "gearshift" and react else None,
                         "moves": len(applied) if system == "gearshift" else 0})
        report[name] = {"phases": len(ph), "best_static": [list(best[0]), list(best[1])],
                        "headroom_oracle_over_best_static": tps["oracle"] / tps["best_static"],
                        "gearshift_over_oracle": tps["gearshift"] / tps["oracle"],
                        "gearshift_over_best_static": tps["gearshift"] / tps["best_static"],
                        "torch_schedule": best_torch, "torch_tokens_per_s": {k: tokens * a.steps / v
                                                                              for k, v in torch_s.items()},
                        "gearshift_over_torch": tps["gearshift"] / tps["torch"]}
        print(f"{name}: oracle / best_static headroom {report[name]['headroom_oracle_over_best_static']:.3f}x; "
              f"gearshift {report[name]['gearshift_over_oracle']:.3f}x oracle, "
              f"{report[name]['gearshift_over_best_static']:.3f}x best_static, "
              f"{report[name]['gearshift_over_torch']:.3f}x torch ({best_torch}); reaction "
              f"{rows[-len(tps)]['reaction_steps']} steps, {len(applied)} moves", flush=True)
    harness.write_results("shared_cluster", {
        "rows": rows, "summary": report, "traces": a.traces, "steps": a.steps, "base_slowdown": a.base,
        "segment": seg, "model": {"layers": a.layers, "width": a.width, "context": a.context, "batch": a.batch},
        "wall_s": time.perf_counter() - t_start}, a.out, emulation=f"duty cycle x{a.base:g} on every rank + trace")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
