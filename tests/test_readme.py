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
