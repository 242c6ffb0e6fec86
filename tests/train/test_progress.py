"""The run summary's schedule line: every switch while short, the ends of a long series."""

from __future__ import annotations

from gearshift.train.progress import schedule_runs_text


def _runs(n: int) -> list[dict]:
    return [{"m": 8, "k": i + 1, "from_step": 4 * i} for i in range(n)]


def test_a_few_switches_are_all_shown() -> None:
    assert schedule_runs_text(_runs(2)) == "m=8 K=1 from step 0; m=8 K=2 from step 4"


def test_a_long_series_shows_its_ends_and_the_count_between() -> None:
    text = schedule_runs_text(_runs(61))
    assert text == ("m=8 K=1 from step 0; m=8 K=2 from step 4; ... 57 more ...; "
                    "m=8 K=60 from step 236; m=8 K=61 from step 240")
