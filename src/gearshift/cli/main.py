"""The `gearshift` command: one subcommand module per verb, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

from gearshift.errors import UserError

# verb -> (module under gearshift.cli, one-line help). Each module has add_arguments(p) and run(args) -> int.
COMMANDS = {
    "train": ("train", "train a model (local workers, or under torchrun)"),
    "profile": ("profile", "measure per-layer time, FLOPs, bytes and memory; write a ModelProfile"),
    "simulate": ("simulate", "predict iteration time and bubbles of the configured pipeline"),
    "plan": ("plan", "partition a model over a cluster; compare with baselines"),
    "allreduce": ("allreduce", "all-reduce algorithm per message size: predicted for a spec, or measured"),
    "testbed": ("testbed", "emulated multi-host network (Linux namespaces + tc)"),
    "report": ("report", "write RUN_DIR/report.html: loss, throughput, partition, bubbles, decisions, config"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gearshift", description="Adaptive parallel training for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    mods = {}
    verb = next((a for a in argv if not a.startswith("-")), None)
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == verb:  # import only the module that runs
            mods[name] = importlib.import_module(f"gearshift.cli.{mod}")
            mods[name].add_arguments(p)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    args.overrides = extra
    try:
        return int(mods[args.command].run(args) or 0)
    except UserError as e:
        print(f"gearshift {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gearshift: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
