"""Pictures of a run from metrics.jsonl: loss, throughput and bubbles over steps with decisions marked, the
partition over time, and each rank's busy and idle time."""

from __future__ import annotations

import io
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def step_records(records: list[dict]) -> list[dict]:
    """The per-step records (not evaluations or decisions)."""
    return [r for r in records if "loss" in r and r.get("event") is None]


def decision_records(records: list[dict]) -> list[dict]:
    """Records of a decision (any record with an "event" key: re-plans, later schedule switches, ...)."""
    return [r for r in records if r.get("event") is not None]


def _mark_decisions(axes, records: list[dict], legend_ax=None) -> None:
    """A vertical line at each decision's step: red where a re-plan applied, dashed grey for the rest;
    their legend on `legend_ax`."""
    applied = shown = False
    for r in decision_records(records):
        if "step" not in r:
            continue
        is_applied = r.get("event") == "replan" and bool(r.get("apply"))
        style = {"color": "red", "alpha": 0.4} if is_applied else {"color": "grey", "alpha": 0.5, "ls": "--"}
        for ax in axes:
            ax.axvline(r["step"], **style)
        applied |= is_applied
        shown |= not is_applied
    if legend_ax is None:
        return
    if applied:
        legend_ax.plot([], [], color="red", alpha=0.4, label="re-plan applied")
    if shown:
        legend_ax.plot([], [], color="grey", alpha=0.5, ls="--", label="other decision")
    if applied or shown:
        legend_ax.legend()


def emulated_steps(config: dict | None) -> list[int]:
    """The steps at which the job's [emulate] scenario changes a rank (config.json's), for the plots to mark."""
    steps = []
    for e in ((config or {}).get("emulate") or {}).get("scenario") or []:
        step = e.get("step") if isinstance(e, dict) else str(e).split(":")[0]
        try:
            steps.append(int(step))
        except (TypeError, ValueError):
            continue
    return sorted(set(steps))


def run_figure(records: list[dict], unigram_entropy: float | None = None, loss_label: str = "loss (nats)",
               rate: str = "tokens/s", emulated: list[int] | None = None) -> Figure:
    """Three panels (loss with validation loss and the unigram entropy where the data has one, throughput in
    `rate`, bubble fraction) over steps, decisions marked, and the emulated changes (purple, dotted)."""
    steps = step_records(records)
    xs = [r["step"] for r in steps]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(xs, [r["loss"] for r in steps], label="train loss", lw=1)
    val = [(r["step"], r["val_loss"]) for r in steps if "val_loss" in r]
    if val:
        axes[0].plot(*zip(*val), "o-", label="validation loss")
    if unigram_entropy is not None:
        axes[0].axhline(unigram_entropy, color="gray", ls="--", label="unigram entropy")
    axes[0].set_ylabel(loss_label)
    axes[0].legend()
    axes[1].plot(xs, [r["tokens_per_s"] for r in steps], lw=1)
    axes[1].set_ylabel(rate)
    axes[2].plot(xs, [r["bubble_fraction"] for r in steps], lw=1)
    axes[2].set_ylabel("bubble fraction")
    axes[2].set_xlabel("step")
    for i, step in enumerate(emulated or []):
        for ax in axes:
            ax.axvline(step, color="purple", ls=":", lw=1.5)
        if i == 0:
            axes[2].plot([], [], color="purple", ls=":", label="emulated change")
            axes[2].legend()
    _mark_decisions(axes, records, axes[1])
    fig.tight_layout()
    return fig


def partition_figure(records: list[dict]) -> Figure | None:
    """The layers each stage holds at every step (one band per stage, from that step on), decisions marked;
    None when no record has a partition."""
    steps = [r for r in step_records(records) if r.get("partition")]
    if not steps:
        return None
    xs = [r["step"] for r in steps]
    stages = max(len(r["partition"]) for r in steps)
    fig, ax = plt.subplots(figsize=(8, 3))
    for s in range(stages):
        lo = [r["partition"][s][0] if s < len(r["partition"]) else float("nan") for r in steps]
        hi = [r["partition"][s][1] if s < len(r["partition"]) else float("nan") for r in steps]
        ax.fill_between(xs, lo, hi, step="post", alpha=0.6, label=f"stage {s}")
    _mark_decisions([ax], records)
    ax.set_xlabel("step")
    ax.set_ylabel("layers held (start, end)")
    ax.invert_yaxis()
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def busy_figure(records: list[dict]) -> Figure | None:
    """Per rank: median compute (busy) and idle (bubble) seconds per step, and its idle fraction over steps;
    None when no record has per-rank busy times."""
    steps = [r for r in step_records(records) if r.get("busy_s") and r.get("step_time_s")]
    if not steps:
        return None
    ranks = len(steps[0]["busy_s"])
    steps = [r for r in steps if len(r["busy_s"]) == ranks]
    busy = [statistics.median(r["busy_s"][k] for r in steps) for k in range(ranks)]
    idle = [statistics.median(r["step_time_s"] - r["busy_s"][k] for r in steps) for k in range(ranks)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    names = [str(k) for k in range(ranks)]
    left.bar(names, busy, label="busy (compute)")
    left.bar(names, idle, bottom=busy, label="bubble (idle)")
    left.set_xlabel("rank")
    left.set_ylabel("seconds per step (median)")
    left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize="small")
    xs = [r["step"] for r in steps]
    for k in range(ranks):
        right.plot(xs, [1.0 - r["busy_s"][k] / r["step_time_s"] for r in steps], lw=1, label=f"rank {k}")
    right.set_xlabel("step")
    right.set_ylabel("idle fraction")
    right.legend(fontsize="small")
    fig.tight_layout()
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (and closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def plot_run(records: list[dict], path: str | Path, unigram_entropy: float | None = None,
             loss_label: str = "loss (nats)", rate: str = "tokens/s", emulated: list[int] | None = None) -> Path:
    """run_figure written to `path` (metrics.png)."""
    path = Path(path)
    path.write_bytes(png_bytes(run_figure(records, unigram_entropy, loss_label, rate, emulated)))
    return path
