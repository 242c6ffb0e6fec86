"""Pictures of expert placement: each device's load over steps per policy, and the expert->device map over time
(from a replay, or from a training run's placement decisions)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gearshift.planner.expert_map import ExpertMap  # noqa: E402
from gearshift.planner.replay import PolicyReplay  # noqa: E402


def expert_map(maps: Sequence[ExpertMap], devices: int) -> np.ndarray:
    """[expert, period]: the device holding the expert's first copy (copies are drawn apart)."""
    return np.array([[p.holders[e][0] for p in maps] for e in range(maps[0].experts)])


def plot_replay(results: Sequence[PolicyReplay], path: str | Path, layer: int = 0) -> Path:
    """One panel per policy (layer `layer`'s tokens per device over steps, mean dashed), then for greedy_replicas
    (else the first policy that moves) its expert->device map and copies per expert over the periods."""
    moving = [r for r in results if r.policy == "greedy_replicas"] + [r for r in results if len(r.maps) > 1]
    shown = (moving or list(results))[0]
    n = len(results)
    fig, axes = plt.subplots(n + 2, 1, figsize=(10, 2.2 * (n + 2)))
    for ax, r in zip(axes, results):
        load = r.device_load[:, layer, :]
        ax.plot(load, lw=0.7)
        ax.plot(load.mean(axis=1), "k--", lw=1, label="mean device")
        ax.set_ylabel("tokens")
        ax.set_title(f"{r.policy}: busiest/mean {r.busiest_over_mean:.2f} (p95 {r.p95_busiest_over_mean:.2f}), "
                     f"{r.moved_experts} experts moved", fontsize=9)
    axes[n - 1].set_xlabel("step")
    axes[0].legend(fontsize=8)
    maps = [m[layer] for m in shown.maps]
    devices = maps[0].devices
    im = axes[n].imshow(expert_map(maps, devices), aspect="auto", interpolation="nearest", cmap="tab10",
                        vmin=0, vmax=max(devices - 1, 1))
    axes[n].set_ylabel("expert")
    axes[n].set_title(f"{shown.policy}: device of each expert's first copy, per period", fontsize=9)
    fig.colorbar(im, ax=axes[n], label="device")
    copies = np.array([p.copies() for p in maps]).T
    im2 = axes[n + 1].imshow(copies, aspect="auto", interpolation="nearest", cmap="viridis")
    axes[n + 1].set_ylabel("expert")
    axes[n + 1].set_xlabel("period" if shown.policy in ("greedy", "greedy_replicas", "oracle") else "switch")
    axes[n + 1].set_title(f"{shown.policy}: copies of each expert, per period", fontsize=9)
    fig.colorbar(im2, ax=axes[n + 1], label="copies")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_run_placement(records: list[dict], devices: int, path: str | Path) -> Path:
    """A training run's expert placement from its metrics.jsonl records: each device's load over steps under the
    contiguous placement and under the placements the run switched to, and its expert->device map over time."""
    from gearshift.planner.replay import replay, replay_run

    steps = [r for r in records if "expert_tokens" in r and r.get("event") is None]
    loads = np.asarray([r["expert_tokens"] for r in steps], dtype=np.int64)
    static = replay(loads, devices, max(len(steps), 1), 0, policies=("static",))[0]
    run = replay_run(loads, devices, [r for r in records if r.get("event") == "placement"],
                     steps[0]["step"] if steps else 0)
    return plot_replay([static, run], path)
