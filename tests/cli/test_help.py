"""`gearshift train --help` lists every config key with its default and doc, generated from the config
dataclasses; the commands that take the same overrides say so."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from gearshift.cli.main import main
from gearshift.tomlfile import loads
from gearshift.train.config import JobConfig


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
        assert set(listed[sec.name]) == {f.name for f in dataclasses.fields(section)}
        for f in dataclasses.fields(section):
            assert listed[sec.name][f.name] == getattr(section, f.name), f"{sec.name}.{f.name}: wrong default"
            assert comments[f"{sec.name}.{f.name}"].startswith(f.metadata["doc"]), f"{sec.name}.{f.name}: doc"


def test_help_shows_what_the_default_job_sets_instead(capsys):
    """`gearshift train` without CONFIG runs the embedded default job (6 blocks, the dataclass says 4)."""
    comments = _comments(_help(capsys, "train"))
    assert comments["model.layers"].endswith("(default job: 6)")
    assert "default job" not in comments["model.width"]


@pytest.mark.parametrize("verb", ["simulate", "profile", "plan"])
def test_commands_taking_overrides_point_to_the_keys(capsys, verb):
    text = " ".join(_help(capsys, verb).split())
    assert "--section.key=value" in text and "gearshift train --help" in text
