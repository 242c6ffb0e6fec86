"""Option value types: a number option refuses nan and inf with one line naming the option (they reached numpy
as a traceback, or a trace full of nan)."""

import pytest

from gearshift.cli.main import main


@pytest.mark.parametrize("argv, message", [
    (["moe", "synth", "x.npz", "--zipf", "nan"], "argument --zipf: expected a finite number, got 'nan'"),
    (["trace", "synth", "x.json", "--ranks", "2", "--depth", "inf"], "argument --depth: expected a finite number"),
    (["trace", "synth", "x.json", "--ranks", "2", "--mean-gap", "x"], "argument --mean-gap: expected a number, got"),
])
def test_number_options_refuse_nan_and_inf(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())  # nothing written
