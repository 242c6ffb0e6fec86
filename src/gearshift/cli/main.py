"""The `gearshift` command: one subcommand module per verb, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys
import typing

from gearshift.errors import UsageError, UserError

# verb -> (module under gearshift.cli, one-line help). Each module has add_arguments(p) and run(args) -> int.
COMMANDS = {
    "train": ("train", "train a model (local workers, or under torchrun)"),
    "profile": ("profile", "measure per-layer time, FLOPs, bytes and memory; write a ModelProfile"),
    "simulate": ("simulate", "predict iteration time and bubbles of the configured pipeline"),
    "plan": ("plan", "partition a model over a cluster; compare with baselines"),
    "schedule": ("schedule", "the schedule candidates auto prices for a job (m, K, memory, step time), and its pick"),
    "allreduce": ("allreduce", "all-reduce algorithm per message size: predicted for a spec, or measured"),
    "moe": ("moe", "expert placement: replay policies on a routing trace, or write a synthetic one"),
    "testbed": ("testbed", "emulated multi-host network (Linux namespaces + tc)"),
    "report": ("report", "write RUN_DIR/report.html: loss, throughput, partition, bubbles, decisions, config"),
    "export": ("export", "write a run's model from its latest checkpoint as one state dict in the model's own names"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a command line that does not parse is one line (as all bad input is), not usage + error."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _parse(argv: list[str]) -> tuple[argparse.Namespace, dict]:
    from gearshift import __version__

    parser = _Parser(prog="gearshift", description="Adaptive parallel training for PyTorch.")
    parser.add_argument("--version", action="version", version=f"gearshift {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    mods = {}
    verb = next((a for a in argv if not a.startswith("-")), None)
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == verb:  # import only the module that runs
            mods[name] = importlib.import_module(f"gearshift.cli.{mod}")
            mods[name].add_arguments(p)
    # Overrides go around argparse, which reads an argument with a space ('--emulate.slowdown=[1, 2]') as a
    # positional one.
    overrides = [a for a in argv if a.startswith("--") and "." in a.split("=", 1)[0] and "=" in a]
    args, extra = parser.parse_known_args([a for a in argv if a not in overrides])
    if args.command is None:
        parser.print_help()
    args.overrides = overrides + extra
    return args, mods


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)
    prog = f"gearshift {verb}" if verb in COMMANDS else "gearshift"
    try:
        from gearshift.train.config import check_override_spelling

        check_override_spelling(argv)
        args, mods = _parse(argv)
        return int(mods[args.command].run(args) or 0) if args.command else 0
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gearshift: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
