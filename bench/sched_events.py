"""Where a pipeline's step goes, from `bench/schedules_vs_torch.py --events FILE`: per Gearshift row, each step
replayed from its own actions' measured durations through the schedule's data dependencies (a receive waits for
its send's issue in the replay, transfers are free), against the measured time to the last compute's end; and the
same replay with each rank's median duration per kind of op. The first gap is what the runtime lost beyond its
ops' own durations (late messages, wake-ups); the second what the ops' spread cost the step beside their medians.
Per rank and op kind: the median duration (the duty cycle's sleep included)."""

from __future__ import annotations

import argparse
import json
import re
import statistics

COMPUTE = ("F", "B", "BI", "BW")


def op_of(label: str) -> tuple[str, int]:
    """("BI", 3) from "BI3": the op and its micro-batch (-1: none)."""
    m = re.match(r"([A-Z]+)(\d*)", label)
    return m.group(1), int(m.group(2)) if m.group(2) else -1


def replay(lists: list[list[tuple[str, int, int, float]]]) -> float:
    """The end of the last compute when each rank runs its (op, micro-batch, stage, seconds) in order, compute for
    its seconds, a receive when its send was issued."""
    n = len(lists)
    pc, clock, sent, end = [0] * n, [0.0] * n, {}, [0.0] * n
    moved = True
    while moved:
        moved = False
        for r in range(n):
            while pc[r] < len(lists[r]):
                op, mb, stage, d = lists[r][pc[r]]
                if op in ("RA", "RG"):
                    key = ("SA", stage - 1, mb) if op == "RA" else ("SG", stage + 1, mb)
                    if key not in sent:
                        break
                    clock[r] = max(clock[r], sent[key])
                elif op in ("SA", "SG"):
                    sent[(op, stage, mb)] = clock[r]
                elif op in COMPUTE:
                    clock[r] += d
                    end[r] = clock[r]
                pc[r] += 1
                moved = True
    return max(end)


def analyse(ranks: list[list[list]]) -> dict:
    """One row's figures from its ranks' timed steps ([label, stage, start, end] actions)."""
    steps = len(ranks[0])
    med: dict[tuple[int, str], list[float]] = {}
    for r, rank_steps in enumerate(ranks):
        for acts in rank_steps:
            for label, _, t0, t1 in acts:
                if op_of(label)[0] in COMPUTE:
                    med.setdefault((r, op_of(label)[0]), []).append(t1 - t0)
    medians = {k: statistics.median(v) for k, v in med.items()}
    measured, replayed, smooth = [], [], []
    for i in range(steps):
        acts = [ranks[r][i] for r in range(len(ranks))]
        measured.append(max(t1 for rank in acts for label, _, _, t1 in rank if op_of(label)[0] in COMPUTE))
        replayed.append(replay([[(*op_of(label), s, t1 - t0) for label, s, t0, t1 in rank] for rank in acts]))
        smooth.append(replay([[(*op_of(label), s, medians.get((r, op_of(label)[0]), 0.0)) for label, s, _, _ in rank]
                              for r, rank in enumerate(acts)]))
    return {"measured_s": statistics.median(measured), "replayed_s": statistics.median(replayed),
            "median_ops_s": statistics.median(smooth),
            "op_ms": {f"{r}:{op}": round(v * 1e3, 1) for (r, op), v in sorted(medians.items())}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("events", help="the file schedules_vs_torch.py --events wrote")
    a = p.parse_args(argv)
    out = {key: analyse(ranks) for key, ranks in json.loads(open(a.events).read()).items()}
    for key, r in out.items():
        print(f"{key}: measured {r['measured_s']:.3f} s, its ops replayed {r['replayed_s']:.3f} s, their medians "
              f"replayed {r['median_ops_s']:.3f} s (to the last compute's end, medians over steps)")
        print("   median ms per rank:op", " ".join(f"{k} {v}" for k, v in r["op_ms"].items()))
    return out


if __name__ == "__main__":
    main()
