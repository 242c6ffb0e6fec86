"""scripts/screenshot_report.py: report.html rendered by headless Chromium into a PNG, its decisions a table of
words (no JSON) in the page the browser built. Skips where no Chromium is installed (Debian:
`apt-get install chromium-headless-shell`, or set $CHROMIUM)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.py"


def _script():
    spec = importlib.util.spec_from_file_location("screenshot_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.browser
def test_report_screenshot_in_headless_chromium(tmp_path):
    shot = _script()
    browser = shot.find_browser()
    if browser is None:
        pytest.skip("no Chromium installed (apt-get install chromium-headless-shell, or set $CHROMIUM)")
    run = tmp_path / "run"
    assert shot.main(["--demo", str(run), "--out", str(tmp_path / "page.png"), "--height", "3600"]) == 0
    from PIL import Image

    with Image.open(tmp_path / "page.png") as im:
        assert im.size == (1200, 3600)
        assert len(im.convert("L").resize((60, 180)).getcolors(4096)) > 10  # a drawn page, not a blank one
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                          "--dump-dom", (run / "report.html").resolve().as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    table = dom[dom.index('<table class="decisions">'):]
    table = table[:table.index("<h2>")]
    shown = re.sub(r"<details>.*?</details>", "", table, flags=re.S)  # the folded inputs left out
    text = re.sub(r"<[^>]+>", " ", shown)
    assert "re-plan" in text and "expert placement" in text and "emulated change" in text
    assert "{" not in text and '":' not in text  # no JSON in what the table shows


def test_without_a_browser_the_script_says_so(tmp_path, monkeypatch, capsys):
    shot = _script()
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-such-browser"))
    assert shot.main(["--demo", str(tmp_path / "run")]) == 3
    assert "no Chromium found" in capsys.readouterr().err
