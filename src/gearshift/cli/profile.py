"""`gearshift profile [CONFIG]`: per-layer forward/backward time, FLOPs, bytes and memory of the job's
model; prints a table and writes a ModelProfile JSON that the planners read."""

from __future__ import annotations

import argparse
from pathlib import Path

from gearshift.cli.argtypes import int_at_least, positive_int
from gearshift.cli.config_help import add_config_help
from gearshift.paths import check_output_file
from gearshift.profile import print_profile
from gearshift.train.config import load_config
from gearshift.train.profiling import profile_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--out", help="where to write the profile JSON (default: OUTPUT_DIR/profile.json)")
    p.add_argument("--repeats", type=positive_int, default=10,
                   help="timed repeats per layer, the median kept (default 10)")
    p.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed warm-up runs per layer (default 3)")
    add_config_help(p, full=False)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    out = Path(args.out or Path(cfg.output.dir) / "profile.json")
    check_output_file(out, "--out" if args.out else "output.dir")  # before the minutes of profiling
    prof = profile_job(cfg, repeats=args.repeats, warmup=args.warmup)
    print_profile(prof)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.save(out)
    print(f"wrote {out}")
    return 0
