"""A co-tenant trace drawn: each rank's slowdown over steps (gearshift trace show --plot)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_trace(series: list[list[float]], path: str | Path) -> Path:
    """`series[step][rank]` (cluster.trace.slowdown_series) as one step line per rank, written to `path`."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in range(len(series[0]) if series else 0):
        ax.step(range(len(series)), [s[r] for s in series], where="post", label=f"rank {r}")
    ax.set_xlabel("step")
    ax.set_ylabel("slowdown (x)")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
