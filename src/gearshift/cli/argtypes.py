"""argparse value types whose errors say what is allowed (shown as one line by gearshift.cli.main)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_at_least(lo: int) -> Callable[[str], int]:
    """An integer option that must be >= lo."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse


positive_int = int_at_least(1)


def finite_float(text: str) -> float:
    """A number option: nan and inf are refused here, where they would otherwise reach the numbers they break."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v
