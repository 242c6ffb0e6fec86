"""`gearshift export RUN_DIR OUT`: the run's model from its latest checkpoint as one state dict in the model's own
names."""

from __future__ import annotations

import argparse

from gearshift.train.export import EXTENSIONS, FORMATS, export_run, out_format


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (output.dir of a run with a checkpoint)")
    p.add_argument("out", metavar="OUT", help="the file to write; its extension picks the format (" +
                   ", ".join(f"{e}: {f}" for e, f in EXTENSIONS.items()) + "; any other: safetensors)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="safetensors or torch (a torch.save state dict); default: OUT's extension's, and one that "
                        "contradicts it is refused")


def run(args: argparse.Namespace) -> int:
    fmt = out_format(args.out, args.format)  # before the checkpoint is read: a contradiction costs nothing
    path, n = export_run(args.run_dir, args.out, fmt)
    print(f"wrote {args.out} ({fmt}): {n} tensors of {path}")
    return 0
