"""The trace writers of docs/port_authors.md ("Writing a dump from a port") compile and write a trace that
load_trace and a standard safetensors reader read back (skipped where no compiler is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from refimpl.porting import trace_files as tracing

DOC = Path(__file__).resolve().parents[2] / "docs" / "port_authors.md"


def writer_source(language: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Writing a dump from a port") :]
    (source,) = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    return source


def check_written(path: Path) -> None:
    trace = tracing.load_trace(path)
    assert trace.keys == ["talker.model.layers.0:0", "refimpl.codes.0"]
    assert trace.metadata["producer"] == "my-port" and trace.metadata["dtype"] == "float32"
    np.testing.assert_array_equal(
        trace["talker.model.layers.0:0"], (0.5 * np.arange(24, dtype=np.float32)).reshape(1, 3, 8)
    )
    np.testing.assert_array_equal(trace["refimpl.codes.0"], [[1, 2, 3, 4]])
    import safetensors.numpy

    assert set(safetensors.numpy.load_file(str(path))) == set(trace.keys)


@pytest.mark.parametrize(
    "language, compiler, command",
    [
        ("cpp", "g++", ["g++", "-std=c++17", "-Wall", "-Werror", "writer.cpp", "-o", "writer"]),
        ("rust", "rustc", ["rustc", "--edition", "2021", "writer.rs", "-o", "writer"]),
    ],
)
def test_the_documented_writer_writes_a_trace(language, compiler, command, tmp_path):
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    (tmp_path / command[-3]).write_text(writer_source(language), encoding="utf-8")
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    subprocess.run([str(tmp_path / "writer")], cwd=tmp_path, check=True, timeout=30)
    check_written(tmp_path / "port.safetensors")
