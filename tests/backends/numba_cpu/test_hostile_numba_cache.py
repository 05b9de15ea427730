"""A damaged Numba on-disk cache (an emptied index, a truncated data file: a full disk, a killed writer)
is found where the kernel's entry is loaded, discarded with one warning line naming it, and the kernel
compiled again; the run succeeds and the next one finds a good cache and says nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

pytest.importorskip("numba")

# one small call of the two cached kernels the snake activation and the bf16 widening use
SCRIPT = """
import warnings
warnings.simplefilter("always")
import numpy as np
from refimpl.backends import numba_cpu
x = np.ones((1, 2, 8), np.float32)
numba_cpu.elementwise.snake_beta(x, np.zeros(2, np.float32), np.zeros(2, np.float32))
numba_cpu.linear._widen_bf16_into(np.zeros((2, 3), np.uint16), np.empty((2, 3), np.float32))
print("ran")
"""


def run(cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)


def test_damaged_cache_is_discarded_and_recompiled(tmp_path):
    first = run(tmp_path)
    assert first.returncode == 0 and "Numba cache" not in first.stderr, first.stderr
    snake_index = next(tmp_path.rglob("elementwise._snake_rows_into-*.nbi"))
    widen_data = next(tmp_path.rglob("linear._widen_bf16_into-*.nbc"))
    snake_index.write_bytes(b"")  # an emptied index: EOFError in Numba's pickle.load
    widen_data.write_bytes(widen_data.read_bytes()[:100])  # a truncated data file: UnpicklingError
    second = run(tmp_path)
    assert second.returncode == 0 and second.stdout == "ran\n", second.stderr
    notes = [line for line in second.stderr.splitlines() if "discarded damaged Numba cache entries" in line]
    assert len(notes) == 2, second.stderr
    assert any("_snake_rows_into" in note and "(EOFError)" in note for note in notes), notes
    assert any("_widen_bf16_into" in note and "(UnpicklingError)" in note for note in notes), notes
    assert "Traceback" not in second.stderr
    assert snake_index.stat().st_size > 0  # written again by the recompilation
    third = run(tmp_path)
    assert third.returncode == 0 and "Numba cache" not in third.stderr, third.stderr


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_call(tmp_path):
    """A file-size limit (as a full disk or quota would) stops Numba writing its cache entries: the kernels
    still run, each failed save says so in one warning line naming the kernel, and nothing partial is left
    behind for the next run to trip on."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))  # every cache file is larger

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, preexec_fn=limit
    )
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    notes = [line for line in r.stderr.splitlines() if "into Numba's cache" in line]
    assert any("_snake_rows_into" in line for line in notes) and "Traceback" not in r.stderr, r.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ".tmp." in p.name]
    second = run(tmp_path)  # no limit: compiles what is missing, finds nothing damaged
    assert second.returncode == 0 and "Numba cache" not in second.stderr, second.stderr


def test_a_damaged_entry_found_while_loading_ahead_is_discarded_too(tmp_path):
    """The first audio's kernels loaded ahead (``cached_kernels.load_cached``) read the index themselves: a
    damaged one is discarded there with the same warning, nothing is loaded, and the call compiles."""
    assert run(tmp_path).returncode == 0
    snake_index = next(tmp_path.rglob("elementwise._snake_rows_into-*.nbi"))
    snake_index.write_bytes(b"\x80")  # a pickle cut short
    script = SCRIPT.replace(
        "x = np.ones",
        "from refimpl.backends.numba_cpu import cached_kernels\n"
        "print(cached_kernels.load_cached(numba_cpu.elementwise._snake_rows_into))\nx = np.ones",
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout == "0\nran\n", r.stderr
    notes = [line for line in r.stderr.splitlines() if "discarded damaged Numba cache entries" in line]
    assert len(notes) == 1 and "_snake_rows_into" in notes[0] and "Traceback" not in r.stderr, r.stderr
    assert snake_index.stat().st_size > 1  # written again by the compilation


def test_running_out_of_memory_while_loading_is_not_damage(tmp_path):
    """A MemoryError from a cache load is raised as it is: the entry is not deleted."""
    from refimpl.backends.numba_cpu import runtime

    index = tmp_path / "k.nbi"
    index.write_bytes(b"index")

    class Cache:
        class _cache_file:
            _index_path = str(index)

    def out_of_memory():
        raise MemoryError

    with pytest.raises(MemoryError):
        runtime.load_guarded(Cache, out_of_memory)
    assert index.exists()
    with pytest.warns(RuntimeWarning, match=r"k.nbi \(EOFError\)"):
        assert runtime.load_guarded(Cache, lambda: (_ for _ in ()).throw(EOFError())) is None
    assert not index.exists()
