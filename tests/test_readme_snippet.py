"""The README's Python snippet: it says where to run it, and from there it builds its job (the launch itself is
left out here: tests/train/test_custom_jobs.py trains such jobs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # a fresh interpreter per test

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_python_snippet_says_where_it_runs_and_runs_there(tmp_path):
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"((?:.*\n){3})```python\n(.*?)```", readme, re.S)
    assert m, "the README has a python snippet"
    before, snippet = m.group(1), m.group(2)
    assert "repository root" in before  # says where to run it
    assert "gearshift.launch(" in snippet
    stub = ("import gearshift\n"
            "def fake(cfg, model=None, data=None):\n"
            "    print('LAUNCH', cfg.train.steps, model.__module__, data.__module__)\n"
            "gearshift.launch = fake\n")
    code = stub + snippet.replace("import gearshift\n", "")  # as a script saved in the root: its folder on sys.path
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "LAUNCH 50 examples.mlp examples.mlp"
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
    assert elsewhere.returncode != 0  # why the README says where: examples/ is not installed
