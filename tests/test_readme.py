"""The README's Python code blocks run as written (against the embedded tiny models)."""

from __future__ import annotations

import re
import warnings

import pytest
from conftest import REPO

from refimpl import official_api

BLOCKS = re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(encoding="utf-8"), re.S | re.M)


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) >= 2  # the tour and "Coming from qwen_tts"


@pytest.mark.soxr_optional  # a block may resample its example audio: it runs with either resampler
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, monkeypatch):
    monkeypatch.setattr(official_api, "_NOTED", set())  # the drop-in's one-time notes, as in a fresh process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", official_api.IgnoredArgumentWarning)
        exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})


def test_ci_script_stops_at_its_first_failing_step():
    """``.ci/run`` runs under ``set -e``, which does not stop the script where a command on the left of ``&&``
    fails (the list's status is the script's only where it is the last command): each step that gates the
    landing (lint, format, types, tests) is its own command, none joined by ``&&``."""
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text("utf-8")
    assert "set -euo pipefail" in script
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for step in ("ruff check .", "ruff format --check .", "mypy", "python -m pytest"):
        lines = [line for line in commands if step in line]
        assert lines and all(line.startswith(step) and "&&" not in line for line in lines), (step, lines)
