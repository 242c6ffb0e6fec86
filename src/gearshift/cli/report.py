"""`gearshift report RUN_DIR`: write RUN_DIR/report.html (summary, plots, decisions, config) for a run."""

from __future__ import annotations

import argparse

from gearshift.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run's output.dir (holds metrics.jsonl; config.json when the run wrote one)")


def run(args: argparse.Namespace) -> int:
    if args.overrides:
        raise UserError(f"report: unexpected argument {args.overrides[0]!r} (usage: gearshift report RUN_DIR)")
    from gearshift.report.html import write_report

    notes: list[str] = []
    out = write_report(args.run_dir, notes)
    for note in notes:
        print(note)
    print(f"wrote {out}")
    return 0
