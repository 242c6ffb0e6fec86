"""The command line: overrides reach the verb whole, whatever their values hold."""

from __future__ import annotations

from gearshift.cli.main import _parse


def test_an_override_with_spaces_is_an_override_not_a_config_file():
    args, _ = _parse(["train", "--emulate.slowdown=[1, 2]", "job.toml", "--train.steps=5", "--resume"])
    assert args.config == "job.toml" and args.resume
    assert args.overrides == ["--emulate.slowdown=[1, 2]", "--train.steps=5"]


def test_version_prints_the_version(capsys):
    import pytest

    from gearshift import __version__
    from gearshift.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gearshift {__version__}"
