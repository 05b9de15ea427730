"""benchmarks/perf_kernels.py: the map that names the Numba kernels in a ``perf`` profile, written for a
program that calls a kernel, once compiling it and once loading it from the cache that run left."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent(
    """
    import os
    import numpy as np
    from refimpl.backends.numba_cpu import linear
    x, w, out = np.ones((25, 64), np.float32), np.ones((12, 64), np.uint16), np.empty((25, 12), np.float32)
    linear._bf16_block_times(x, w, out, 2)
    result = next(iter(linear._bf16_block_times.overloads.values()))
    print(os.getpid(), result.library.get_pointer_to_function(result.fndesc.llvm_func_name))
    """
)


def _map_of_a_run(program: Path, cache: Path) -> tuple:
    """(the kernel's entry address, {name: (start, size)}) of one run of ``program`` under the tool."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "perf_kernels.py"), str(program)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    pid, entry = map(int, run.stdout.split())
    path = Path(tempfile.gettempdir()) / f"perf-{pid}.map"
    try:
        rows = [line.split(" ", 2) for line in path.read_text().splitlines()]
    finally:
        path.unlink()
    spans = sorted((int(start, 16), int(start, 16) + int(size, 16)) for start, size, _ in rows)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))
    return entry, {name: (int(start, 16), int(size, 16)) for start, size, name in rows}


def test_the_map_names_a_kernel_and_its_parallel_loop_compiled_or_cached(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    for run in ("compiled", "loaded from the cache"):
        entry, named = _map_of_a_run(program, tmp_path / "cache")
        start, size = named["linear._bf16_block_times"]
        assert start == entry and size > 0, run
        for part in ("[parallel loop 1]", "[parallel loop 1, its wrapper]", "[Python wrapper]"):
            assert f"linear._bf16_block_times {part}" in named, (run, part)
        assert not any(name.startswith("_ZN") for name in named), run  # every kernel's symbol read
