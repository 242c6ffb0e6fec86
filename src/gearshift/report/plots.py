"""Pictures of a run: loss, throughput and bubbles over steps from metrics.jsonl, re-plans marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_run(records: list[dict], path: str | Path, unigram_entropy: float | None = None) -> Path:
    """Three panels (loss, tokens/s, bubble fraction) over steps; vertical lines where a re-plan applied."""
    steps = [r for r in records if "loss" in r and r.get("event") is None]
    replans = [r for r in records if r.get("event") == "replan" and r.get("apply")]
    xs = [r["step"] for r in steps]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(xs, [r["loss"] for r in steps], label="train loss", lw=1)
    val = [(r["step"], r["val_loss"]) for r in steps if "val_loss" in r]
    if val:
        axes[0].plot(*zip(*val), "o-", label="validation loss")
    if unigram_entropy is not None:
        axes[0].axhline(unigram_entropy, color="gray", ls="--", label="unigram entropy")
    axes[0].set_ylabel("nats")
    axes[0].legend()
    axes[1].plot(xs, [r["tokens_per_s"] for r in steps], lw=1)
    axes[1].set_ylabel("tokens/s")
    axes[2].plot(xs, [r["bubble_fraction"] for r in steps], lw=1)
    axes[2].set_ylabel("bubble fraction")
    axes[2].set_xlabel("step")
    for r in replans:
        for ax in axes:
            ax.axvline(r["step"], color="red", alpha=0.4)
    if replans:
        axes[1].plot([], [], color="red", alpha=0.4, label="re-plan applied")
        axes[1].legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
