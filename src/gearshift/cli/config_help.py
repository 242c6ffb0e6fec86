"""The job config keys in `--help`, generated from the config dataclasses: every key with its default and
its one-line doc, section by section, written as TOML (a valid job file) so any line can be copied."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import shutil
import textwrap
import typing
from typing import Any

from gearshift.train.config import JobConfig
from gearshift.train.config.fields import section_keys

OVERRIDES = """\
A job is a TOML file with the sections below (copy examples/job.toml to start one). Any key can be
overridden on the command line as --section.key=value, the value read as TOML (a bare word as a string):
  --train.steps=50  --emulate.slowdown=[1,2,4,4]  --output.dir=runs/x
Each key is shown with its default; with no CONFIG, `gearshift train` runs every key at its default."""

SHARED = """\
The job config of `gearshift train` applies here too: CONFIG (a job TOML file) and --section.key=value
overrides, e.g. --model.layers=8 --parallel.stages=2. `gearshift train --help` lists every key."""


def toml_value(v: Any) -> str:
    """A Python config value as TOML, e.g. True -> true, "gpt" -> "gpt", [1.0, 2.0] -> [1.0, 2.0]."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, int):
        return f"{v:_}" if abs(v) >= 100_000 else str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {v!r}")


def _commented(left: str, doc: str, width: int, col: int) -> list[str]:
    """`left` padded to `col`, then `doc` as a TOML comment wrapped to `width` (continuations aligned)."""
    body = textwrap.wrap(doc, max(width - col - 2, 30), break_on_hyphens=False)
    if len(left) + 2 > col:
        return [left] + [" " * col + "# " + ln for ln in body]
    return [left.ljust(col) + "# " + body[0]] + [" " * col + "# " + ln for ln in body[1:]]


def config_reference(width: int | None = None, col: int = 26) -> str:
    """Every section and key of JobConfig as TOML: `key = default  # doc` (a section's keys include those of
    the settings it embeds: train.config.fields)."""
    width = width or min(max(shutil.get_terminal_size().columns, 80), 120)
    sections = typing.get_type_hints(JobConfig)
    lines: list[str] = []
    for sec in dataclasses.fields(JobConfig):
        cls = sections[sec.name]
        summary = " ".join(inspect.getdoc(cls).split())
        lines += ["", *_commented(f"[{sec.name}]", summary, width, col)]
        defaults = cls()
        for name, (home, f, _) in section_keys(cls).items():
            value = getattr(getattr(defaults, home) if home else defaults, name)
            lines += _commented(f"  {name} = {toml_value(value)}", f.metadata["doc"], width, col)
    return "\n".join(lines)


def add_config_help(p: argparse.ArgumentParser, full: bool) -> None:
    """End `p`'s help with the config keys (full) or a pointer to them; the text is kept as written."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = f"{OVERRIDES}\n{config_reference()}" if full else SHARED
