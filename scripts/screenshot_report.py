"""Screenshot a run's report.html in headless Chromium: `python scripts/screenshot_report.py RUN_DIR [--out PNG]`
(re)writes RUN_DIR/report.html and saves the page as OUT.png (default RUN_DIR/report.png). Without RUN_DIR
(`--demo DIR`), it writes a small run of its own there first: a few steps, a re-plan, a schedule switch, an
expert placement and an emulated slowdown, so the page has every kind of row.

The browser: $CHROMIUM, else the first of chromium, chromium-browser, google-chrome, chromium-headless-shell on
PATH (Debian: `apt-get install chromium-headless-shell`). No browser: exit 3 with one line saying so."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chromium-headless-shell", "headless_shell")


def find_browser() -> str | None:
    """$CHROMIUM, or the first Chromium on PATH; None when there is none."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def demo_run(run: Path) -> Path:
    """A small run directory whose report has every kind of row (metrics.jsonl, config.json, run.json)."""
    run.mkdir(parents=True, exist_ok=True)
    old, new = [[0, 2], [2, 4], [4, 6], [6, 8]], [[0, 3], [3, 5], [5, 7], [7, 8]]
    records = [{"event": "plan", "step": 0, "bounds": old, "iteration_s": 0.6, "uniform_iteration_s": 0.6,
                "reason": "dynamic program over the measured speeds and links: predicted 0.6 s/step",
                "measured": {"speeds": [1.0, 1.0, 1.0, 1.0]}, "fits": True, "schedule": "1f1b"}]
    for i in range(30):
        slow = 1.5 if 10 <= i < 20 else 1.0
        busy = [0.3, 0.5 * slow, 0.4, 0.2]
        wall = max(busy) + 0.1
        records.append({"step": i, "loss": 5.5 - 2.0 * (1 - 0.93 ** i), "lr": 1e-3, "grad_norm": 1.0,
                        "tokens_per_s": 4096 / wall, "step_time_s": wall, "busy_s": busy,
                        "bubble_fraction": 1 - sum(busy) / (4 * wall), "partition": new if i >= 20 else old,
                        "peak_act_bytes": [1 << 20] * 4})
        if i == 19:
            records.append({"event": "replan", "step": 20, "apply": True, "old_bounds": old, "new_bounds": new,
                            "old_iteration_s": 0.8123456, "new_iteration_s": 0.6512345,
                            "predicted_gain_s": 1.6111234, "predicted_gain_fraction": 0.19838,
                            "migration_cost_s": 0.0423456, "reason": "gain 1.611 s over 10 steps > migration 0.0423 s",
                            "measured": {"speeds": [1.0, 0.667, 1.0, 1.0], "source": "measured"}})
        if i == 24:
            records.append({"event": "schedule", "step": 25, "chosen": [8, 2], "current": [8, 1], "switch": True,
                            "predicted_s": 0.61234, "current_predicted_s": 0.65123, "step_overhead_s": 0.0012,
                            "reason": "kfkb K=2 predicted 6.0% faster", "trigger": "links changed"})
        if i == 27:
            records.append({"event": "placement", "step": 28, "switch": False, "t1": 0.61, "t2": 0.605, "k": 10,
                            "tc": 0.2, "moved": [[1, 3, 0]], "reason": "10 steps gain 0.05 s <= the move's 0.2 s"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "config.json").write_text(json.dumps({
        "model": {"name": "gpt", "layers": 6, "width": 128}, "data": {"name": "bytes"}, "cluster": {"workers": 4},
        "parallel": {"stages": 4, "schedule": "auto", "microbatches": 8, "partition": "adaptive"},
        "train": {"batch_size": 32, "steps": 30}, "emulate": {"slowdown": [], "scenario": ["10:1:1.5", "20:1:1.0"]}}))
    (run / "run.json").write_text(json.dumps({"throughput_unit": "tokens", "tokens_per_sample": 128,
                                              "loss_unit": "nats", "unigram_entropy": 3.3}))
    return run


def screenshot(html: Path, out: Path, browser: str, width: int = 1200, height: int = 4000) -> Path:
    """`html` rendered by headless `browser` into `out` (PNG, width x height CSS pixels)."""
    with tempfile.TemporaryDirectory(prefix="gs-shot-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out.resolve()}",
               html.resolve().as_uri()]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{browser} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", help="a run's output.dir")
    p.add_argument("--out", help="the PNG (default RUN_DIR/report.png)")
    p.add_argument("--demo", help="write a small demo run into this directory and screenshot its report")
    p.add_argument("--height", type=int, default=4000, help="page height in CSS pixels (default 4000)")
    args = p.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("screenshot_report: no Chromium found (set $CHROMIUM, or install chromium-headless-shell)",
              file=sys.stderr)
        return 3
    if not args.run_dir and not args.demo:
        p.error("give RUN_DIR or --demo DIR")
    run = demo_run(Path(args.demo)) if args.demo else Path(args.run_dir)
    from gearshift.report.html import write_report

    page = write_report(run)
    out = screenshot(page, Path(args.out) if args.out else run / "report.png", browser, height=args.height)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
