"""`gearshift train --help` lists every config key with its default and doc, generated from the config
dataclasses; the commands that take the same overrides say so."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import typing

import pytest

from gearshift.cli.main import COMMANDS, main
from gearshift.tomlfile import loads
from gearshift.train.config import JobConfig, load_config
from gearshift.train.config.fields import section_keys


def _help(capsys, verb: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([verb, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _comments(reference: str) -> dict[str, str]:
    """'section' and 'section.key' -> the comment beside it in the listing, continuation lines joined."""
    out: dict[str, str] = {}
    sec = name = ""
    for ln in reference.splitlines():
        code, _, comment = ln.partition("#")
        if m := re.match(r"\[(\w+)\]", code.strip()):
            sec = name = m.group(1)
        elif code.strip():
            name = f"{sec}.{code.split('=')[0].strip()}"
        if comment:
            out[name] = f"{out.get(name, '')} {comment.strip()}".strip()
    return out


def test_train_help_lists_every_key_with_default_and_doc(capsys):
    text = _help(capsys, "train")
    assert "--section.key=value" in text and "TOML" in text
    reference = text[text.index("\n[model]"):]
    listed = loads(reference)  # the listing is itself a TOML job: every key at its default
    comments = _comments(reference)
    hints = typing.get_type_hints(JobConfig)
    assert list(listed) == [s.name for s in dataclasses.fields(JobConfig)]
    for sec in dataclasses.fields(JobConfig):
        section = hints[sec.name]()
        assert comments[sec.name] == " ".join(section.__doc__.split())
        keys = section_keys(type(section))  # the section's own keys and those of the settings it embeds
        assert list(listed[sec.name]) == list(keys)
        for name, (home, f, _) in keys.items():
            default = getattr(getattr(section, home) if home else section, name)
            assert listed[sec.name][name] == default, f"{sec.name}.{name}: wrong default"
            assert comments[f"{sec.name}.{name}"] == " ".join(f.metadata["doc"].split()), f"{sec.name}.{name}: doc"


def test_the_listing_is_the_job_that_runs_without_a_config(capsys):
    """One set of defaults: every key of the job `gearshift train` runs with no CONFIG has the listed value (the
    GPT's 6 blocks among them), and the embedded settings' keys (the GPT's, the sync's) are listed too."""
    text = _help(capsys, "train")
    listed = loads(text[text.index("\n[model]"):])
    job = load_config(None)
    for sec, table in job.to_dict().items():
        assert {k: listed[sec][k] for k in table} == table, sec
    comments = _comments(text)
    assert job.model.gpt.layers == 6 and "model.layers" in comments and "parallel.bucket_mb" in comments
    assert "emulate.router_skew" in comments and "adapt.force" not in comments and "moe.always_switch" not in comments


@pytest.mark.parametrize("verb", ["simulate", "profile", "plan"])
def test_commands_taking_overrides_point_to_the_keys(capsys, verb):
    text = " ".join(_help(capsys, verb).split())
    assert "--section.key=value" in text and "gearshift train --help" in text


def _options(parser: argparse.ArgumentParser, prog: str):
    """(command, option) of every option under `parser`, sub-actions (moe synth, trace show, ...) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                yield from _options(p, f"{prog} {name}")
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield prog, action


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_option_of_every_command_says_what_it_does(verb):
    parser = argparse.ArgumentParser(prog=f"gearshift {verb}")
    importlib.import_module(f"gearshift.cli.{COMMANDS[verb][0]}").add_arguments(parser)
    bare = [f"{prog} {a.option_strings[-1]}" for prog, a in _options(parser, parser.prog) if not a.help]
    assert not bare, f"options without a line in --help: {bare}"


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_option_taking_a_value_says_its_default(verb):
    """An option with a default value names it in its --help line (flags and options without one are exempt)."""
    parser = argparse.ArgumentParser(prog=f"gearshift {verb}")
    importlib.import_module(f"gearshift.cli.{COMMANDS[verb][0]}").add_arguments(parser)
    silent = [f"{prog} {a.option_strings[-1]}" for prog, a in _options(parser, parser.prog)
              if a.nargs != 0 and a.default not in (None, False) and "default" not in (a.help or "")]
    assert not silent, f"options whose --help line does not say their default: {silent}"
