"""The numba backend's setup (``runtime.configure``): where the compiled kernels are cached, that a second
process loads them, how their entries are keyed, and the 512-bit vectors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from refimpl.backends import numba_cpu


def test_cache_dir_falls_back_to_a_writable_place(monkeypatch, tmp_path):
    """A read-only package directory sends the compiled kernels to the user cache, else to a temp dir.  (An
    empty setting counts as none; set through monkeypatch, the teardown puts back the session's own, which
    the processes later tests start read.)"""
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    package_cache = Path(numba_cpu.__file__).resolve().parent / "__pycache__"
    monkeypatch.setattr(numba_cpu.runtime, "_writable", lambda d: Path(d) != package_cache)
    numba_cpu.runtime._choose_cache_dir()
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "xdg" / "refimpl" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    monkeypatch.setattr(numba_cpu.runtime, "_writable", lambda d: False)
    numba_cpu.runtime._choose_cache_dir()
    assert Path(os.environ["NUMBA_CACHE_DIR"]).name.startswith("refimpl-numba-")


def test_a_second_process_loads_the_kernels_instead_of_compiling(tmp_path):
    """cache=True: the first process compiles and saves, the next one only loads (NUMBA_DEBUG_CACHE)."""
    code = (
        "import logging, numpy as np; logging.basicConfig(level=logging.INFO); "
        "from refimpl.backends import numba_cpu as k; "
        "from refimpl.backends.bf16 import BF16Matrix; "
        "k.elementwise.snake_beta(np.ones((1, 2, 8), np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)); "
        "k.linear.linear(np.ones((1, 4), np.float32), BF16Matrix(np.zeros((3, 4), np.uint16)))"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1", PYTHONPATH=str(REPO))
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert "data saved to" in runs[0].stdout
    assert "data saved to" not in runs[1].stdout and "data loaded from" in runs[1].stdout
    # the note that kernels are compiled (logged at INFO): the first process's, once; none where they load
    note = numba_cpu.runtime.COMPILING_NOTE
    assert runs[0].stderr.count(note) == 1 and note not in runs[1].stderr, (runs[0].stderr[-2000:], runs[1].stderr)


def test_the_first_compile_of_a_kernel_is_noted_once(monkeypatch, caplog):
    """The first of the package's kernels to compile in a process logs ``COMPILING_NOTE`` (logger "refimpl",
    INFO), and no later one; code of other modules compiled with Numba logs nothing."""
    import threading

    import numba

    monkeypatch.setattr(numba_cpu.runtime, "_NOTED", threading.Event())  # as in a process that compiled nothing

    def kernel_in(module: str):
        def plus_one(x):
            return x + 1

        plus_one.__module__ = module
        return numba.njit(plus_one)

    caplog.set_level("INFO", logger="refimpl")
    assert kernel_in("tests.elsewhere")(1) == 2
    assert caplog.records == []
    ours = kernel_in(numba_cpu.elementwise.__name__)
    for value in (1, 2.5):  # a kernel of the package, then another overload of it
        assert ours(value) == value + 1
    assert kernel_in(numba_cpu.conv.__name__)(3) == 4  # another kernel of the package
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("refimpl", "INFO", numba_cpu.runtime.COMPILING_NOTE)
    ]


def test_the_kernels_cache_entries_are_keyed_by_the_whole_package(tmp_path):
    """A compiled kernel holds the code of the kernels it calls from the package's other modules: its cache
    entries are keyed by all of the package's source files (an edited intrinsic compiles again the kernels
    that inline it); any other code's by its own file, as Numba keys it."""
    from numba.core import caching

    kernel = numba_cpu.conv._stack_taps_into
    stamp = caching.InTreeCacheLocator(kernel.py_func, numba_cpu.conv.__file__).get_source_stamp()
    assert stamp == numba_cpu.runtime._package_stamp()
    other = tmp_path / "other.py"
    other.write_text("def f():\n    return 1\n")
    locator = caching.InTreeCacheLocator(kernel.py_func, str(other))
    before = locator.get_source_stamp()
    other.write_text("def f():\n    return 10\n")
    assert before != locator.get_source_stamp() != stamp


def test_the_package_stamp_is_taken_once_a_process(monkeypatch):
    """Every cached kernel asks for the package's stamp as its module is imported: the files are listed and
    read for the first one only, and later asks (a kernel decorated now) get the stamp of the source the
    process imported, whatever the files hold by then."""
    from numba.core import caching

    stamp = numba_cpu.runtime._package_stamp()

    def no_listing(*args, **kwargs):
        raise AssertionError("the package's files listed again")

    monkeypatch.setattr(Path, "glob", no_listing)
    monkeypatch.setattr(Path, "read_bytes", no_listing)
    locator = caching.InTreeCacheLocator(numba_cpu.conv._stack_taps_into.py_func, numba_cpu.conv.__file__)
    assert locator.get_source_stamp() == stamp == numba_cpu.runtime._package_stamp()


@pytest.mark.skipif(
    "+avx512f" not in numba_cpu.runtime._compile_features(), reason="a processor without 512-bit vectors"
)
def test_a_program_importing_numba_first_still_gets_512_bit_vectors(tmp_path):
    """Numba reads the CPU features when it is imported: a program that imports it before refimpl's backend
    compiles with 512-bit vectors all the same (the backend has Numba read its configuration again), its
    own kernels included; without the backend, LLVM's default prefers 256-bit ones on most of these
    processors (on this VM's Xeon: ymm only)."""
    code = (
        "import sys, numba, numpy as np\n"
        "if sys.argv[1] == 'refimpl':\n"
        "    from refimpl.backends import numba_cpu\n"
        "@numba.njit(fastmath=True)\n"
        "def squares(a):\n"
        "    s = np.float32(0)\n"
        "    for i in range(a.size):\n"
        "        s += a[i] * a[i]\n"
        "    return s\n"
        "squares(np.ones(64, np.float32))\n"
        "print('zmm' in next(iter(squares.inspect_asm().values())))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", code, "refimpl"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True"]
