"""Environment changes (metrics.jsonl "environment" records) are drawn at their steps apart from decisions, once
even when the config's scenario names the same step, and counted apart in report.html's summary."""

from gearshift.report.html import summary
from gearshift.report.plots import run_figure
from gearshift.report.records import EnvironmentEvent


def _steps(n: int) -> list[dict]:
    return [{"step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 100.0,
             "step_time_s": 0.1, "busy_s": [0.1], "bubble_fraction": 0.2, "partition": [[0, 4]],
             "peak_act_bytes": [1]} for s in range(n)]


def test_changes_are_marked_once_and_counted_apart() -> None:
    env = EnvironmentEvent(3, [{"rank": 0, "slowdown": 4.0}]).to_dict()
    move = {"event": "decision", "step": 4, "apply": True, "reason": "t1*k > t2*k + tc"}
    records = [*_steps(6), env, move]
    fig = run_figure(records, emulated=[3, 5])  # step 3 has its record; step 5 only the config's scenario
    purple = sorted({line.get_xdata()[0] for line in fig.axes[1].lines if line.get_color() == "purple"
                     and len(line.get_xdata())})
    red = {line.get_xdata()[0] for line in fig.axes[1].lines if line.get_color() == "red" and len(line.get_xdata())}
    assert purple == [3, 5] and red == {4}
    assert sum(line.get_xdata()[0] == 3 for line in fig.axes[1].lines if len(line.get_xdata())) == 1
    s = summary(records)
    assert (s["decisions"], s["environment changes"], s["controller moves applied"]) == (1, 1, 1)
