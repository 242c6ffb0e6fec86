"""Layer ranges for schedules that run several stages per rank (interleaved, zbv): each stage's share of the
profiled work is its rank's share of the speed, so every stage takes about as long on its own rank; the cuts
honour the profile's keep-together boundaries."""

from __future__ import annotations

from gearshift.errors import PlanError
from gearshift.profile.model_profile import ModelProfile


def virtual_bounds(profile: ModelProfile, speeds: list[float], placement: list[int]) -> list[tuple[int, int]]:
    """One [start, end) layer range per stage of `placement` (stage -> rank), in stage order, each non-empty."""
    n, S = profile.num_layers, len(placement)
    no_cut = set(profile.no_cut)
    cuts_ok = [k for k in range(1, n) if k not in no_cut]
    if len(cuts_ok) < S - 1:
        raise PlanError(f"partition: {S} stages need {S - 1} cuts, the model allows {len(cuts_ok)}")
    work = [lp.work_s for lp in profile.layers]
    total = sum(work) or float(n)
    if not sum(work):
        work = [1.0] * n
    weight = [speeds[r] for r in placement]
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    bounds, start, acc = [], 0, 0.0
    for s in range(S - 1):
        acc += total * weight[s] / sum(weight)
        # the allowed cut nearest the target, leaving room for the stages after this one
        room = [k for k in cuts_ok if k > start and len([c for c in cuts_ok if c > k]) >= S - 2 - s]
        k = min(room, key=lambda c: abs(prefix[c] - acc))
        bounds.append((start, k))
        start = k
    bounds.append((start, n))
    return bounds
