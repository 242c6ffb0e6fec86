"""A file of jobs' own-step fits (profile.overhead) on one machine: what `gearshift simulate --save-overhead`
adds a run's fit to, and what `--overhead` and a job's start (adapt.overhead) price a shape not run yet by
(carried_overhead: each figure's median over the fits, without their fitted cores). JSON: {"fits": [{"label":
..., StepOverhead's fields}, ...]}."""

from __future__ import annotations

import json
from pathlib import Path

from gearshift.profile.overhead import StepOverhead, carried_overhead


def read_fits(path: str | Path) -> list[StepOverhead]:
    """The fits in the file at `path`; ValueError (saying what is wrong) for a file that is not one."""
    try:
        data = json.loads(Path(path).read_text())
        fits = data["fits"]
        return [StepOverhead.from_dict(d) for d in fits]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a file of overhead fits written by `gearshift simulate --save-overhead` "
                         f"({type(e).__name__}: {e})") from None


def add_fit(path: str | Path, fit: StepOverhead, label: str) -> int:
    """Append `fit` (named `label`: the run it came from) to the file at `path` (made where there is none); the
    number of fits it holds now."""
    p = Path(path)
    if p.is_file():
        read_fits(p)  # a file that is not a fits file is refused, not overwritten
    fits = json.loads(p.read_text())["fits"] if p.is_file() else []
    fits.append({"label": label, **fit.to_dict()})
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"fits": fits}, indent=1) + "\n")
    return len(fits)


def carried_from(path: str | Path, demand: float = 0.0) -> StepOverhead:
    """The overhead carried from the fits in the file at `path` to a job whose busiest host is asked for `demand`
    cores' worth per core (carried_overhead); ValueError for a file that is not a fits file or holds no fit that
    measured a step."""
    got = carried_overhead(read_fits(path), demand=demand)
    if got is None:
        raise ValueError(f"{path} holds no fit that measured a step (add one with `gearshift simulate "
                         "--save-overhead`)")
    return got
