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


def test_the_job_line_counts_in_words() -> None:
    """One of a thing is singular ("1 worker, 1 stage x 1 replica, 1 micro-batch"), more plural."""
    from gearshift.train.config import load_config
    from gearshift.train.progress import job_line
    from gearshift.words import plural

    assert (plural(1, "stage"), plural(0, "stage"), plural(3, "micro-batch", "micro-batches")) == \
        ("1 stage", "0 stages", "3 micro-batches")
    one = load_config(None, ["--cluster.workers=1", "--parallel.stages=1", "--parallel.microbatches=1"])
    assert job_line(one) == "1 worker, 1 stage x 1 replica, 1f1b, 1 micro-batch"
    many = load_config(None, ["--cluster.workers=4", "--parallel.stages=2", "--parallel.microbatches=4"])
    assert job_line(many) == "4 workers, 2 stages x 2 replicas, 1f1b, 4 micro-batches"
    assert job_line(many, _runs(2)) == "4 workers, 2 stages x 2 replicas, 1f1b schedule (" + \
        schedule_runs_text(_runs(2)) + ")"


def test_the_bar_counts_samples_where_a_sample_is_one() -> None:
    from gearshift.report.records import StepMetrics
    from gearshift.train.progress import Progress

    rec = StepMetrics(0, 2.5, 1e-3, 1.0, 640.0, 0.1, [0.1], 0.0, [[0, 2]], [0])
    for rate in ("samples/s", "tok/s"):
        bar = Progress(10, 0, enabled=True, rate=rate)
        bar.update(0, rec)
        assert f"640 {rate}" in bar.bar.tasks[0].fields["info"]
        bar.close()
