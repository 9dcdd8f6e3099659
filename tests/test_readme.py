"""The README's five-minute tour runs as written (curl and python3, as a new user would),
against a real server: every step works and no id has to be copied by hand."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from platform_api.app import create_app
from tests.browser_support import run_server
from tests.conftest import make_settings

README = Path(__file__).resolve().parent.parent / "README.md"


def tour_script() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## A five-minute tour", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_tour_needs_nothing_typed_in_by_hand():
    script = tour_script()
    assert "<id>" not in script and "<" not in script.replace("<<", "")
    assert "$PATIENT" in script.split("# 4.", 1)[1]


def test_the_readme_tour_runs_against_a_real_server(tmp_path: Path):
    if shutil.which("curl") is None:
        pytest.fail("the tour uses curl (Debian package curl)")
    script = tour_script()
    with run_server(create_app(make_settings(tmp_path))) as base:
        script = script.replace("B=http://127.0.0.1:8000", f"B={base}", 1)
        result = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script + '\nprintf "\\n%s\\n" "$PATIENT"'],
            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    *answers, patient = documents(result.stdout)
    assert all(a.get("success") is not False for a in answers), answers
    read, history, created = answers[-3:]  # steps 4 (read, history) and 5
    assert read["resourceType"] == "Patient" and read["id"] == patient
    assert read["name"][0]["family"] == "Odhiambo"
    assert history["type"] == "history" and history["entry"][0]["resource"]["id"] == patient
    assert created["name"][0]["family"] == "Mensah"


def documents(output: str) -> list[Any]:
    """The JSON answers curl printed one after the other, and the last line (an id)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    text = output.rstrip()
    last_line = text.rsplit("\n", 1)[-1]
    body = text[:len(text) - len(last_line)]
    while at < len(body):
        if body[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(body, at)
        found.append(value)
    return [*found, last_line]
