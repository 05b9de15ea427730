"""A memory-mapped checkpoint truncated by another process during a run (docs/limits.md, files changing
under a run): the next read of a page past the new end is a fault the kernel reports with SIGBUS.  The
command line ends with one line naming the mapped files and status 1 instead of a death by the signal;
the Python API keeps the default unless it asks (``handle_bus_errors``).  Each case in a child process."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from refimpl.io import mapped_files

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
EMBEDDED = REPO / "refimpl" / "data" / "default-customvoice"

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGBUS"), reason="no SIGBUS here")


def mapped_by(pid: int, path: Path) -> bool:
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("huge_pages", ["0", "1"])
def test_a_checkpoint_truncated_during_a_decode_is_one_line_and_status_1(tmp_path, huge_pages):
    """``refimpl codec decode`` of 3000 frames while its checkpoint is cut to 100 bytes once mapped."""
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED, model)
    codes = tmp_path / "codes.npy"
    np.save(codes, np.random.default_rng(0).integers(0, 64, (3000, 16)))
    weights = model / "speech_tokenizer" / "model.safetensors"
    command = [sys.executable, "-m", "refimpl", "codec", "decode", str(codes), "--model", str(model), "-q"]
    env = dict(ENV, REFIMPL_HUGE_PAGES=huge_pages)
    child = subprocess.Popen([*command, "-o", str(tmp_path / "out.wav")], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mapped_by(child.pid, weights) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.truncate(weights, 100)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refimpl: error: bus error (SIGBUS)"), err
    assert str(weights) in lines[0] and "Traceback" not in err and "Fatal" not in err
    assert not (tmp_path / "out.wav").exists()


MAP_AND_CUT = """
import os, sys
import numpy as np
from refimpl.io import mapped_files
from refimpl.io.checkpoint import read_safetensors_file
if sys.argv[2] == "ask":
    mapped_files.handle_bus_errors()
weights = read_safetensors_file(sys.argv[1])
os.truncate(sys.argv[1], 0)
print(sum(float(np.sum(w)) for w in weights.values()))
"""


@pytest.mark.parametrize("ask", [False, True])
def test_the_python_api_keeps_the_default_unless_it_asks(tmp_path, ask):
    path = tmp_path / "model.safetensors"
    shutil.copyfile(EMBEDDED / "model.safetensors", path)
    script = textwrap.dedent(MAP_AND_CUT)
    r = subprocess.run(
        [sys.executable, "-c", script, str(path), "ask" if ask else "no"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ask:
        assert r.returncode == mapped_files.BUS_ERROR_STATUS and str(path) in r.stderr, r.stderr
    else:
        assert r.returncode == -signal.SIGBUS, r.stderr


def test_the_mapped_files_are_those_still_in_use(tmp_path):
    from refimpl.io.checkpoint import read_safetensors_file

    path = tmp_path / "model.safetensors"
    shutil.copyfile(EMBEDDED / "model.safetensors", path)
    before = mapped_files.mapped_files()
    weights = read_safetensors_file(path)
    assert mapped_files.mapped_files() == [*before, str(path)] or str(path) in mapped_files.mapped_files()
    one = next(iter(weights.values()))
    del weights
    gc.collect()
    assert str(path) in mapped_files.mapped_files()  # one tensor still views the map
    del one
    gc.collect()
    assert str(path) not in mapped_files.mapped_files()


def test_the_line_is_bounded():
    line = mapped_files.bus_error_line(["/x" * 10_000])
    assert len(line) <= mapped_files.MESSAGE_BYTES and line.endswith(b"...\n") and line.count(b"\n") == 2
    assert b"mapped: none known" in mapped_files.bus_error_line([])


def test_a_trace_read_by_compare_is_named_too(tmp_path):
    """``compare`` and ``--replay`` read safetensors traces through a memory map: a truncated trace is named."""
    from refimpl.io.checkpoint import write_safetensors_file
    from refimpl.porting.trace_files import read_safetensors_trace

    path = tmp_path / "trace.safetensors"
    write_safetensors_file(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3)})
    _, arrays = read_safetensors_trace(path)
    assert str(path) in mapped_files.mapped_files()
    del arrays
    gc.collect()
    assert str(path) not in mapped_files.mapped_files()
