"""Counts in words for the console and the report: "1 worker", "2 workers"."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n` and the word, in the plural unless n is 1 ("1 stage", "4 stages"; `many` for an irregular plural)."""
    return f"{n} {word if n == 1 else many or word + 's'}"
