"""Names for the Numba kernels in a ``perf`` profile.

    perf record -g -o perf.data -- python benchmarks/perf_kernels.py SCRIPT [ARGS ...]
    perf report -i perf.data --no-children --sort pid,sym

Runs SCRIPT with its arguments as ``python SCRIPT ARGS`` would (a benchmark, or any program that uses refimpl)
and, when it ends, writes ``perf-PID.map`` in the temporary directory (``tempfile.gettempdir()``: perf reads
its maps from the system's, so leave TMPDIR unset): the file in which ``perf report`` looks up the names of
code that no file on disk holds.  Without it a profile shows the kernels as ``[JIT] tid N`` and bare
addresses.  The map names every function of each kernel's object code (as Numba linked it into the process:
loaded from its cache or compiled) after the kernel: its module within the numba backend and its name
(``linear._bf16_block_times``); the body of each of its parallel loops, numbered in the order of their code
(``linear._bf16_block_times [parallel loop 1]``); a function of another kernel compiled into it, by that
kernel's name; a kernel compiled for several kinds of arguments, each kind numbered in the order of their
first calls (``transformer._decoder_steps_bf16 #2``).  Read by thread (``--sort pid,sym``), a profile then
tells where a step's time goes and how long each thread waits between the parallel loops (the OpenMP
runtime's own functions, ``libgomp``)."""

from __future__ import annotations

import atexit
import gc
import os
import re
import runpy
import sys
import tempfile

PREFIX = "refimpl.backends.numba_cpu."
KEPT: dict = {}  # id of a code library -> the object code it was loaded from (the library drops its copy)


def keep_object_code() -> None:
    """Keep the object code of every kernel loaded from the cache from now on (call it before any kernel
    loads): Numba hands it to the linker and forgets it; a compiled kernel's library keeps its own."""
    from numba.core.codegen import CPUCodeLibrary

    set_compiled_object = CPUCodeLibrary._set_compiled_object

    def kept(self, value):
        KEPT[id(self)] = bytes(value)
        return set_compiled_object(self, value)

    CPUCodeLibrary._set_compiled_object = kept


def elf_functions(code: bytes) -> list:
    """(name, section, offset, size) of each function of some size that the 64-bit ELF object ``code``
    defines (read as the backend's cache loader reads its symbols)."""
    from refimpl.backends.numba_cpu.runtime import _SHN_UNDEF, _elf_symbols

    symbols = _elf_symbols(code, lambda info, section: info & 0xF == 2 and section != _SHN_UNDEF)  # (2: FUNC)
    return [symbol for symbol in symbols or () if symbol[3]]


def demangled(symbol: str) -> str:
    """A Numba function's dotted name from its mangled symbol (``_ZN7refimpl8backends...4nameB...``: each
    part after its length, up to the ABI tags), within the numba backend where it is one of its kernels;
    Numba's wrappers marked as such; any other symbol as it is."""
    wrapper = ""
    if symbol.startswith("cfunc."):
        symbol, wrapper = symbol.removeprefix("cfunc."), " [C wrapper]"
    if not symbol.startswith("_ZN"):
        return symbol + wrapper
    parts, at = [], 3
    while (digits := re.match(r"\d+", symbol[at:])) is not None:
        at += len(digits.group())
        parts.append(symbol[at : at + int(digits.group())])
        at += int(digits.group())
    if parts[:1] == ["cpython"]:
        parts, wrapper = parts[1:], " [Python wrapper]"
    return ".".join(parts).removeprefix(PREFIX) + wrapper


def kernel_functions() -> list:
    """(address, size, name) of each function of every compiled kernel in this process (see the module)."""
    from numba.core.dispatcher import Dispatcher

    functions = set()
    for dispatcher in [o for o in gc.get_objects() if isinstance(o, Dispatcher)]:
        kernel = f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}".removeprefix(PREFIX)
        overloads = list(dispatcher.overloads.values())
        for k, result in enumerate(overloads, start=1):
            owner = kernel if len(overloads) == 1 else f"{kernel} #{k}"  # (by the order of their first calls)
            library = result.library
            code = KEPT.get(id(library)) or getattr(library, "_compiled_object", None)
            if not code:
                continue
            found = elf_functions(bytes(code))
            bases = {}  # section -> its address in memory: a function's address less its offset in the object
            for symbol, section, offset, _ in found:
                if section not in bases:
                    try:
                        bases[section] = library.get_pointer_to_function(symbol) - offset
                    except Exception:  # (a symbol the linker does not export)
                        continue
            loops: dict = {}  # a parallel loop's id -> its number in the kernel, in the order of the code
            for symbol, section, offset, size in sorted(found, key=lambda f: (f[1], f[2])):
                if section in bases and bases[section] + offset > 0:
                    name = demangled(symbol)
                    loop = re.search(r"__numba_parfor_gufunc_(0x[0-9a-f]+)", symbol)
                    if loop is not None:  # its body, and its wrapper (``__gufunc__.``) that shares out the work
                        number = loops.setdefault(loop.group(1), len(loops) + 1)
                        part = ", its wrapper" if symbol.startswith("__gufunc__.") else ""
                        name = f"{owner} [parallel loop {number}{part}]"
                    functions.add((bases[section] + offset, size, name))
    return sorted(functions)


def perf_map_path(pid: int) -> str:
    """Where perf looks for the map of process ``pid``: ``perf-PID.map`` in the temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"perf-{pid}.map")


def write_perf_map(path: str | None = None) -> str:
    """Write ``kernel_functions`` in perf's map format (``START SIZE NAME``, hexadecimal) to ``path``, by
    default ``perf-PID.map`` of this process in the temporary directory; the path written."""
    path = path or perf_map_path(os.getpid())
    with open(path, "w") as f:
        for address, size, name in kernel_functions():
            f.write(f"{address:x} {size:x} {name}\n")
    return path


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    import refimpl  # noqa: F401  (first, as the benchmarks: it sets OpenBLAS's idle spin before NumPy loads it)

    keep_object_code()
    atexit.register(write_perf_map)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
