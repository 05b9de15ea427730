"""The first audio's kernels loaded from Numba's cache ahead of their first calls (``cached_kernels``): what
is loaded is what a first call would load (no compilation, the same results), the list names real cached
kernels, and it covers the kernels a generation's first audio calls, so that after the load's thread has
run, none of them waits on the cache at its first call.  Each run is a fresh process (a kernel's first
call happens once a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

pytest.importorskip("numba")

from refimpl.backends import numba_cpu  # noqa: E402
from refimpl.backends.numba_cpu import cached_kernels  # noqa: E402

# A fresh process: the embedded CustomVoice model streamed to its first chunk on the numba backend, every
# first call of a kernel of the backend recorded (the kernels loaded ahead have none).  argv: "ahead" to let
# the load start its thread (and wait for it before the first chunk), "first-calls" to turn it off; then
# "tiles" to lower the codec's tile thresholds to one step, so that the embedded model's decode takes the AMX
# tiles, as the released sizes do on a processor that has them.
FIRST_CHUNK = r"""
import json, sys
import numba.core.dispatcher as dispatcher
from refimpl.backends.numba_cpu import amx_conv, cached_kernels
from refimpl import Qwen3TTS, use_backend
if sys.argv[2] == "tiles":
    amx_conv.KEPT_TILES_MIN_STEPS = amx_conv.UNIT_TILES_MIN_STEPS = 1

first_calls = []
compile_for_args = dispatcher.Dispatcher._compile_for_args
def recorded(self, *a, **k):
    module = self.py_func.__module__
    if module.startswith("refimpl.backends.numba_cpu."):
        first_calls.append([module.rsplit(".", 1)[1], self.py_func.__name__])
    return compile_for_args(self, *a, **k)
dispatcher.Dispatcher._compile_for_args = recorded
if sys.argv[1] == "first-calls":
    cached_kernels.load_ahead = lambda *a: None
with use_backend("numba"):
    tts = Qwen3TTS.from_pretrained("default")
    if sys.argv[1] == "ahead":
        cached_kernels.wait_for_loading()
        first_calls.clear()  # (the packing's, waited for with the loading: not a generation's)
    stream = tts.stream_custom_voice("Hello there.", speaker="eric", language="english", max_new_tokens=3,
                                     do_sample=False, subtalker_dosample=False)
    first = next(stream)
print(json.dumps({"first_calls": first_calls, "samples": len(first), "sum": float(first.astype(float).sum()),
                  "registries": "numba.np.linalg" in sys.modules, "special": "scipy.special" in sys.modules}))
"""


def first_chunk(mode: str, paths: str = "as chosen") -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_NUM_THREADS="2")
    run = subprocess.run(
        [sys.executable, "-c", FIRST_CHUNK, mode, paths], capture_output=True, text=True, env=env, timeout=900, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def first_calls_listed_and_none_once_loaded(paths: str) -> tuple:
    """The first chunk's first calls without the loading thread (each must be in ``FIRST_AUDIO``), then with
    it (none left, the same audio to the bit): the kernels first called, and the run with the thread."""
    without = first_chunk("first-calls", paths)
    called = {tuple(c) for c in without["first_calls"]}
    missing = called - set(cached_kernels.FIRST_AUDIO)
    assert not missing, f"first calls of the first audio ({paths}) not in FIRST_AUDIO: {sorted(missing)}"
    ahead = first_chunk("ahead", paths)
    assert ahead["first_calls"] == [], ahead["first_calls"]
    assert (ahead["samples"], ahead["sum"]) == (without["samples"], without["sum"])
    return called, ahead


def test_the_list_names_cached_kernels_of_the_backend_once_each():
    assert len(set(cached_kernels.FIRST_AUDIO)) == len(cached_kernels.FIRST_AUDIO)
    for module, name in cached_kernels.FIRST_AUDIO:
        kernel = getattr(getattr(numba_cpu, module), name)
        assert getattr(kernel._cache, "_cache_file", None) is not None, f"{module}.{name} is not cached"


def test_the_first_audio_calls_no_listed_kernel_first_once_they_are_loaded_ahead():
    """Without the thread, a generation's first chunk calls kernels for the first time (the list must name
    every one of them); with it, none of the listed ones (they were loaded from the cache), and the audio
    is the same to the bit.  With every kernel in the cache (the first run put them there), neither run set
    up Numba's registries (whose set-up imports ``numba.np.linalg``): no kernel the first audio loads
    inlines Numba's array math (an array's ``sum``, whose module imports it); nor imported SciPy's special
    functions (the text projection's SiLU has a twin)."""
    called, ahead = first_calls_listed_and_none_once_loaded("as chosen")
    assert called, "no kernel called: the test ran no numba kernel"
    assert not ahead["registries"], "loading the first audio's kernels set up Numba's registries"
    again = first_chunk("first-calls")
    assert not again["registries"], "the first calls' loads set up Numba's registries"
    assert not (again["special"] or ahead["special"]), "the first audio imported scipy.special"


@pytest.mark.skipif(not numba_cpu.amx.USE_TILES, reason="the AMX tiles' kernels run only where the processor has them")
def test_the_list_covers_the_first_audio_on_the_tiles():
    """Where the processor has AMX tiles, the released sizes' first chunk decodes on them: its tile kernels,
    and the small functions Python calls to size their scratch, are listed and cached too (uncached, such a
    function is compiled by every fresh process).  The embedded model takes that path with the tile
    thresholds lowered."""
    called, _ = first_calls_listed_and_none_once_loaded("tiles")
    assert ("codec_decoder", "_unit_piece_on_tiles") in called, "the decode did not take the tiles"


def test_load_cached_loads_without_compiling(tmp_path):
    """In a fresh process whose cache holds a kernel, ``load_cached`` adds its overloads (the count it says),
    and the kernel's first call then finds them: no cache miss, no compilation.  The load does not set up
    Numba's registries (``numba.np.linalg`` is not imported); a function compiled after it, which needs
    them (a list's sort, an array's sum), compiles and runs: Numba's compiler sets them up then."""
    script = r"""
import json, sys
import numba
import numpy as np
from refimpl.backends.numba_cpu import cached_kernels, elementwise
kernel = elementwise._rms_norm_rows
loaded = cached_kernels.load_cached(kernel)
before = len(kernel.overloads)
x = np.ones((2, 8), np.float32)
out = elementwise.rms_norm(x, np.ones(8, np.float32), 1e-6)
registries = "numba.np.linalg" in sys.modules

@numba.njit
def smallest_plus_total(a):
    return sorted([a[1], a[0]])[0] + a.sum()

print(json.dumps({"loaded": loaded, "before": before, "after": len(kernel.overloads),
                  "misses": sum(kernel._cache_misses.values()), "again": cached_kernels.load_cached(kernel),
                  "registries": registries, "compiled": smallest_plus_total(np.array([3.0, 2.0])),
                  "registries_after": "numba.np.linalg" in sys.modules}))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(tmp_path))
    for _ in range(2):  # the first run compiles into the empty cache; the second loads
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["loaded"] >= 1 and seen["before"] == seen["loaded"]
    assert seen["after"] == seen["before"] and seen["misses"] == 0
    assert seen["again"] == 0  # (what a dispatcher has is not loaded twice)
    assert not seen["registries"] and seen["registries_after"]
    assert seen["compiled"] == 7.0


@pytest.mark.skipif(
    not numba_cpu.packed_words.PACKED_COMPILED, reason="the packed kernel needs 512-bit byte shuffles (avx512bw)"
)
def test_the_packings_kernels_load_without_numbas_registries(tmp_path):
    """The packing's kernel (the first one a full-size load calls, before its thread) loaded from the cache in
    a fresh process: it does not set up Numba's registries, by itself or through the functions it inlined
    (an array's ``sum`` would import Numba's array math, and its linear algebra with it)."""
    script = r"""
import json, sys
import numpy as np
from refimpl.backends.numba_cpu import cached_kernels, packed_words
kernels = (packed_words._packings,)
loaded = [cached_kernels.load_cached(kernel) for kernel in kernels]
words = (0x3F00 | np.arange(256, dtype=np.uint16))
words.flags.writeable = False  # (a checkpoint's map is read-only: the overload a load calls)
dense, firsts = packed_words._dense_part([(1, 128), (2, 64)])
packed = packed_words._packings(words, np.array([0, 128]), np.array([[1, 128], [2, 64]]), dense, firsts)
print(json.dumps({"loaded": loaded, "misses": sum(sum(k._cache_misses.values()) for k in kernels),
                  "registries": "numba.np.linalg" in sys.modules, "special": "scipy.special" in sys.modules}))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(tmp_path))
    for _ in range(2):  # the first run compiles into the empty cache; the second loads
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == [1] and seen["misses"] == 0
    assert not seen["registries"], "loading the packing's kernels set up Numba's registries"


def cached_object_code(kernel) -> list:
    """(machine code, shared bitcode) of every entry of ``kernel``'s cache for this machine."""
    cache = kernel._cache
    magic = kernel.targetctx.codegen().magic_tuple()
    found = []
    for key in cache._cache_file._load_index():
        if key[1] != magic:
            continue
        payload = cache._cache_file.load(key)
        name, kind, (code, bitcode) = payload[0]  # the library, as serialize_using_object_code wrote it
        assert kind == "object"
        found.append((code, bitcode))
    return found


def test_the_machine_codes_symbols_are_the_ones_its_bitcode_defines():
    """Every cached entry of the first audio's kernels (their caches filled by a call where empty): the
    symbols read from the machine code's ELF table are the functions and data its bitcode defines (what
    Numba's load would list by parsing the bitcode)."""
    import llvmlite.binding as llvm

    x = np.linspace(-3, 3, 64, dtype=np.float32)
    numba_cpu.elementwise.silu(x)
    numba_cpu.elementwise.rms_norm(x.reshape(2, 32), np.ones(32, np.float32), 1e-6)
    checked = 0
    for module, name in cached_kernels.FIRST_AUDIO:
        for code, bitcode in cached_object_code(getattr(getattr(numba_cpu, module), name)):
            if code[:4] != b"\x7fELF":
                pytest.skip("machine code not in ELF: Numba's own load is used")
            parsed = llvm.parse_bitcode(bitcode)
            defined = {g.name for gs in (parsed.functions, parsed.global_variables) for g in gs if not g.is_declaration}
            assert numba_cpu.runtime._elf_defined_symbols(code) == defined, name
            checked += 1
    assert checked >= 2


def test_a_damaged_symbol_table_is_refused():
    """A machine code cut short or with a symbol table that does not fit: ValueError (the load that finds
    it discards the cache entry); another format: None (Numba's own load)."""
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    numba_cpu.elementwise.silu(x)
    code, _ = cached_object_code(numba_cpu.elementwise._silu_into)[0]
    if code[:4] != b"\x7fELF":
        pytest.skip("machine code not in ELF: Numba's own load is used")
    assert numba_cpu.runtime._elf_defined_symbols(b"\xcf\xfa\xed\xfe" + code[4:]) is None  # (Mach-O's magic)
    with pytest.raises(ValueError):
        numba_cpu.runtime._elf_defined_symbols(code[: len(code) // 2])
    shoff = int.from_bytes(code[0x28:0x30], "little")
    shnum = int.from_bytes(code[0x3C:0x3E], "little")
    for i in range(shnum):  # the symbol table made longer than the file
        at = shoff + 64 * i
        if int.from_bytes(code[at + 4 : at + 8], "little") == 2:
            damaged = code[: at + 32] + (1 << 40).to_bytes(8, "little") + code[at + 40 :]
            with pytest.raises(ValueError):
                numba_cpu.runtime._elf_defined_symbols(damaged)
            break
    else:
        raise AssertionError("no symbol table in the machine code")


def test_a_kernel_loaded_without_parsing_its_bitcode_links_into_a_later_compile(tmp_path):
    """In a fresh process, a kernel loaded from the cache keeps its bitcode unparsed; a function compiled
    after, which calls it (its bitcode linked in), parses it then, and computes what the kernel does."""
    script = r"""
import json
import numba
import numpy as np
from refimpl.backends.numba_cpu import cached_kernels, elementwise
kernel = elementwise._silu_into
loaded = cached_kernels.load_cached(kernel)
libraries = [compiled.library for compiled in kernel.overloads.values()]
unparsed = [library._shared_module is None for library in libraries]

@numba.njit
def silu_twice(x, one, out):
    kernel(x, one, out)
    kernel(out.copy(), one, out)

x = np.linspace(-3, 3, 50, dtype=np.float32)
out = np.empty_like(x)
silu_twice(x, np.float32(1), out)
twice = elementwise.silu(elementwise.silu(x))
print(json.dumps({"loaded": loaded, "unparsed": unparsed, "same": bool((out == twice).all()),
                  "parsed": [library._shared_module is not None for library in libraries]}))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(tmp_path))
    for _ in range(2):  # the first run compiles into the empty cache; the second loads
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == 1 and seen["same"]
    assert seen["unparsed"] == [True] and seen["parsed"] == [True]
