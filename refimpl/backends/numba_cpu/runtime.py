"""The numba backend's setup, one step (``configure``) that the package's ``__init__`` runs before it imports
any kernel module: the Numba settings checked and completed before Numba reads them, Numba's on-disk cache
made safe, and the CPU's AMX tile registers asked for.

Compiled kernels are cached on disk (``cache=True``): next to this package's files when that is writable,
else in the user's cache directory (``$XDG_CACHE_HOME/refimpl/numba`` or ``~/.cache/refimpl/numba``), else a
temporary directory; ``NUMBA_CACHE_DIR`` set by the user wins.  Loops use 512-bit vectors where the
processor has them (LLVM prefers 256-bit ones by default, which slows these loops down).
Parallel loops run on Numba's default (OpenMP) threads; ``NUMBA_NUM_THREADS`` sets their number (default:
the cores).  The "workqueue" pool, whose threads sleep between loops, is slower for generation: waking them
costs more than a frame's many small parallel loops can hide (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import os
import platform
import struct
import sys
import tempfile
import threading
from pathlib import Path

from ...environment import switch
from ...io.files import user_cache_dir
from .. import BackendUnavailable

PACKAGE = Path(__file__).resolve().parent  # the kernels' modules: one cache directory for all of them


@dataclasses.dataclass(frozen=True)
class Machine:
    """What ``configure`` found: whether Numba compiles the AMX tile instructions (``tiles_compiled``; else
    they emit nothing), whether this process may run them (``tiles_granted``: compiled, granted by Linux, not
    turned off with ``REFIMPL_AMX=0``), whether it compiles the 64-byte shuffles of the packed words
    (``packed_compiled``: AVX512BW), the byte permutes across a whole vector (``permutes_compiled``:
    AVX512_VBMI), and whether LLVM's loops run on 512-bit vectors (``vectors_512``: AVX-512 without the
    256-bit preference, as ``_prefer_512_bit_vectors`` sets it)."""

    tiles_compiled: bool
    tiles_granted: bool
    packed_compiled: bool
    permutes_compiled: bool
    vectors_512: bool


_MACHINE: Machine | None = None  # what configure() found, once it has run


def configure() -> Machine:
    """Set up Numba for the kernels, once a process (a later call returns the first one's answer): check the
    Numba settings of the environment (a ValueError naming a setting the backend cannot run with), choose
    the cache directory and the CPU features before Numba is imported (it reads them then), let a failed
    cache save cost a warning instead of the call, discard a damaged cache entry where it is loaded, key the
    kernels' cache entries by the whole package's source, say when the first kernel is compiled
    (``_note_first_compile``), and ask Linux for the AMX tile registers where Numba compiles their
    instructions."""
    global _MACHINE
    if _MACHINE is None:
        _check_numba_settings()
        _choose_cache_dir()
        _prefer_512_bit_vectors()
        _survive_unwritable_cache()
        _discard_damaged_cache()
        _parse_shared_bitcode_when_linked()
        _key_cache_by_the_package()
        _note_first_compile()
        features = _compile_features()
        tiles_compiled = {"+amx-tile", "+amx-bf16"} <= features
        packed_compiled = "+avx512bw" in features
        permutes_compiled = packed_compiled and "+avx512vbmi" in features
        _MACHINE = Machine(
            tiles_compiled=tiles_compiled,
            tiles_granted=tiles_compiled and _tiles_granted(),
            packed_compiled=packed_compiled,
            permutes_compiled=permutes_compiled,
            vectors_512={"+avx512f", "-prefer-256-bit"} <= features,
        )
    return _MACHINE


def machine() -> Machine:
    """What ``configure`` found (the package's ``__init__`` runs it before the kernel modules are imported)."""
    if _MACHINE is None:
        raise RuntimeError("refimpl.backends.numba_cpu.runtime.configure() has not run")
    return _MACHINE


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _choose_cache_dir() -> None:
    """Set NUMBA_CACHE_DIR where Numba's own choice (this package's __pycache__) is not writable."""
    if os.environ.get("NUMBA_CACHE_DIR") or _writable(PACKAGE / "__pycache__"):
        return
    user_cache = user_cache_dir()
    base = None if user_cache is None else user_cache / "numba"
    os.environ["NUMBA_CACHE_DIR"] = str(
        base if base is not None and _writable(base) else tempfile.mkdtemp(prefix="refimpl-numba-")
    )


def _prefer_512_bit_vectors() -> None:
    """Let LLVM use the full 512-bit vectors of AVX-512 processors (unless the user set the CPU features).
    Numba reads the setting when it is imported; a program that imported it before this module has its
    configuration read again (it has compiled nothing yet in a program that compiles nothing of its own
    before importing refimpl's backend)."""
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        return
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_NAME"] = llvm.get_host_cpu_name()
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
        if "numba" in sys.modules:  # imported before us: read the environment again
            sys.modules["numba"].core.config.reload_config()


# The Numba settings checked before Numba reads them (docs/limits.md#the-environment).  Numba itself warns
# with a traceback and goes on without a value it cannot parse; 100,000 threads crash its thread pool
# (segmentation fault); a feature without its + or - fails an LLVM assertion, which aborts the process; an
# unknown processor or feature makes LLVM print a warning at every compilation (and an unknown processor
# without +64bit in the features is a fatal LLVM error).
CHECKED_SETTINGS = (
    "NUMBA_DISABLE_JIT",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "NUMBA_CPU_NAME",
    "NUMBA_CPU_FEATURES",
)
THREADING_LAYERS = ("default", "safe", "forksafe", "threadsafe", "tbb", "omp", "workqueue")  # Numba's names
MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))


def _check_numba_settings() -> None:
    """One ValueError naming the variable for a Numba setting this backend cannot run with; an empty one is
    removed (unset, as for the REFIMPL_ switches: Numba would warn that it cannot parse it)."""
    import re

    for name in CHECKED_SETTINGS:
        if name in os.environ and not os.environ[name].strip():
            del os.environ[name]
    env = os.environ
    for name in ("NUMBA_DISABLE_JIT", "NUMBA_NUM_THREADS"):
        if name in env:
            try:
                int(env[name])  # as Numba reads them
            except ValueError:
                raise ValueError(f"environment variable {name}={env[name][:40]!r} is not a whole number") from None
    if "NUMBA_NUM_THREADS" in env and not 1 <= int(env["NUMBA_NUM_THREADS"]) <= MAX_THREADS:
        raise ValueError(
            f"environment variable NUMBA_NUM_THREADS={env['NUMBA_NUM_THREADS']!r}: the numba backend runs 1 to "
            f"{MAX_THREADS} threads"
        )
    if "NUMBA_THREADING_LAYER" in env and env["NUMBA_THREADING_LAYER"] not in THREADING_LAYERS:
        raise ValueError(
            f"environment variable NUMBA_THREADING_LAYER={env['NUMBA_THREADING_LAYER'][:40]!r} is not one of "
            f"Numba's threading layers ({', '.join(THREADING_LAYERS)})"
        )
    features = env.get("NUMBA_CPU_FEATURES")
    if features is not None and not all(re.fullmatch(r"[+-][A-Za-z0-9_.-]+", f) for f in features.split(",")):
        raise ValueError(
            f"environment variable NUMBA_CPU_FEATURES={features[:60]!r}: a comma-separated list of +feature and "
            "-feature (e.g. +avx2,-prefer-256-bit)"
        )
    if "NUMBA_CPU_NAME" in env or features is not None:
        complaint = _llvm_complaint(env.get("NUMBA_CPU_NAME"), features)
        if complaint:
            name = "NUMBA_CPU_NAME" if "processor" in complaint else "NUMBA_CPU_FEATURES"
            raise ValueError(f"environment variable {name}={env[name][:60]!r}: LLVM says {complaint!r}")


def _llvm_complaint(cpu: str | None, features: str | None) -> str | None:
    """LLVM's warning about processor ``cpu`` with ``features`` (None: the host's), or None if it knows
    both.  LLVM writes the warning on file descriptor 2 when the target machine is made; it is caught there."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    cpu = cpu if cpu is not None else llvm.get_host_cpu_name()
    features = features if features is not None else llvm.get_host_cpu_features().flatten()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error: nothing to catch the warning with
        return None
    with tempfile.TemporaryFile() as caught:
        try:
            sys.stderr.flush()
            os.dup2(caught.fileno(), 2)
            llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        lines = caught.read(1 << 16).decode("utf-8", "replace").splitlines()
    return next((line for line in lines if "not a recognized" in line), None)


def available() -> None:
    """BackendUnavailable when Numba does not compile: ``NUMBA_DISABLE_JIT`` (its debugging switch, or
    ``disable_jit`` in a ``.numba_config.yaml``) makes every kernel run as Python, and the twins' intrinsics
    (bit casts, vector shuffles, tile instructions) cannot run as Python."""
    import numba

    if numba.config.DISABLE_JIT:
        raise BackendUnavailable(
            "backend 'numba': Numba's JIT is turned off (NUMBA_DISABLE_JIT), and the numba kernels cannot run "
            "as Python (unset NUMBA_DISABLE_JIT to use them)"
        )


def _discard_damaged_cache() -> None:
    """Numba trusts its cache files: an emptied index or a truncated data file (a full disk, a killed
    writer) would make the first call of that kernel, and every later run's, fail with EOFError or
    UnpicklingError.  For this package's kernels, an entry that fails to load (``load_guarded``) is deleted
    with a one-line warning and the kernel compiled again, at the load that finds it: nothing is read ahead
    (unpickling every entry of a cache that holds hundreds of overloads cost a fresh process a tenth of a
    second before its first call).  And the load does not set up Numba's registries
    (``_load_without_registries``)."""

    def load_overload(load, self, sig, target_context):
        return load_guarded(self, lambda: _load_without_registries(self, sig, target_context))

    _guard_our_kernels("load_overload", load_overload)


def _load_without_registries(cache, sig, target_context):
    """Numba's ``Cache.load_overload`` without its first step, ``target_context.refresh()``: the first
    refresh of a process imports every lowering registry of Numba (its list, dict, set, linear-algebra,
    random... implementations, and SciPy's linear algebra with them: about 200 modules) which only
    compiling uses.  Loading compiled code needs Numba's runtime functions (``rtsys.initialize``, the first
    thing a refresh does) and the modules of the functions the kernel inlined (the unpickling imports
    them); a kernel compiled later refreshes the context then (Numba's compiler does at every compile)."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)
    _LOADING_OURS.active = True
    try:
        with cache._guard_against_spurious_io_errors():
            return cache._load_overload(sig, target_context)
    finally:
        _LOADING_OURS.active = False


_LOADING_OURS = threading.local()  # .active: this thread is loading one of this package's kernels


def _parse_shared_bitcode_when_linked() -> None:
    """A cached kernel is its machine code and, beside it, its LLVM bitcode (for linking the kernel into a
    later compile that calls it).  Numba's load parses the bitcode at once, to list the symbols the machine
    code defines: most of the load of a large kernel (the fused transformer step's).  For this package's
    kernels the symbols are read from the machine code's ELF symbol table (``_elf_defined_symbols``; the
    same set, tested on every entry of a cache) and the bitcode is parsed at the first link that needs it;
    machine code in another format is loaded by Numba's way."""
    import llvmlite.binding as llvm
    from numba.core.codegen import CPUCodeLibrary

    unserialize, module_for_linking = CPUCodeLibrary._unserialize.__func__, CPUCodeLibrary._get_module_for_linking
    if getattr(unserialize, "refimpl_guard", False):
        return

    def _unserialize(cls, codegen, state):
        name, kind, data = state
        engine = codegen._engine
        symbols = None
        if kind == "object" and getattr(_LOADING_OURS, "active", False) and hasattr(engine, "_defined_symbols"):
            symbols = _elf_defined_symbols(data[0])
        if symbols is None:
            return unserialize(cls, codegen, state)
        library = codegen.create_library(name)
        library.enable_object_caching()
        library._set_compiled_object(data[0])
        library._refimpl_shared_bitcode = data[1]
        library._finalize_final_module()
        engine._defined_symbols |= symbols
        return library

    def _get_module_for_linking(self):
        bitcode = self.__dict__.pop("_refimpl_shared_bitcode", None)
        if bitcode is not None and self._shared_module is None:
            self._shared_module = llvm.parse_bitcode(bitcode)
        return module_for_linking(self)

    _unserialize.refimpl_guard = True
    CPUCodeLibrary._unserialize = classmethod(_unserialize)
    CPUCodeLibrary._get_module_for_linking = _get_module_for_linking


_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # e_ident ... e_shstrndx: a 64-bit little-endian ELF file
_ELF_SECTION = struct.Struct("<IIQQQQIIQQ")  # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link...
_ELF_SYMBOL = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
_SHT_SYMTAB, _SHN_UNDEF, _SYMBOL_TYPES = 2, 0, (0, 1, 2)  # the symbol table; not defined; NOTYPE, OBJECT, FUNC


def _elf_defined_symbols(code: bytes) -> set | None:
    """The names of the functions and data that the 64-bit little-endian ELF object ``code`` defines (its
    symbol table's entries with a section), or None for an object in another format.  A table that does
    not fit in the file raises ValueError (a damaged cache entry: ``load_guarded`` discards it)."""
    symbols = _elf_symbols(code, lambda info, section: section != _SHN_UNDEF and info & 0xF in _SYMBOL_TYPES)
    return None if symbols is None else {name for name, _, _, _ in symbols}


def _elf_symbols(code: bytes, keep) -> list | None:
    """(name, section, value, size) of each entry of the symbol tables of the 64-bit little-endian ELF object
    ``code`` for which ``keep(info, section)`` holds (its type and binding, the index of its section), or
    None for an object in another format.  A table that does not fit in the file raises ValueError."""
    if len(code) < _ELF_HEADER.size or code[:6] != b"\x7fELF\x02\x01":
        return None
    header = _ELF_HEADER.unpack_from(code)
    shoff, shentsize, shnum = header[6], header[11], header[12]
    if shentsize != _ELF_SECTION.size or shoff + shnum * shentsize > len(code):
        raise ValueError("an ELF object whose section table does not fit in it")
    sections = [_ELF_SECTION.unpack_from(code, shoff + i * shentsize) for i in range(shnum)]
    symbols = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB:
            continue
        if entsize != _ELF_SYMBOL.size or offset + size > len(code) or link >= shnum:
            raise ValueError("an ELF object whose symbol table does not fit in it")
        strings = sections[link][4]
        for k in range(1, size // entsize):  # (entry 0 is the null symbol)
            name, info, _, section, value, length = _ELF_SYMBOL.unpack_from(code, offset + k * entsize)
            if keep(info, section):
                end = code.index(b"\0", strings + name)
                symbols.append((code[strings + name : end].decode(), section, value, length))
    return symbols


def load_guarded(cache, read):
    """``read()`` (a load from the Numba ``cache`` of one of this package's kernels), or None (compile the
    kernel again) where the cache's files are damaged: any exception the read raises (EOFError,
    UnpicklingError, ValueError... from an emptied index or a truncated data file; not MemoryError) deletes
    the kernel's index and data files, with one warning line naming them and the exception."""
    import warnings

    try:
        return read()
    except MemoryError:  # (not a damaged file)
        raise
    except Exception as e:
        cache_file = cache._cache_file
        index = Path(cache_file._index_path)
        for path in [index, *index.parent.glob(index.name[: -len(".nbi")] + ".*.nbc")]:
            with contextlib.suppress(OSError):
                path.unlink()
        warnings.warn(
            f"discarded damaged Numba cache entries in {index.parent}: {index.name} ({type(e).__name__}); "
            "recompiling that kernel",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _survive_unwritable_cache() -> None:
    """Numba (outside Windows) lets an OSError from writing a cache entry escape from the call that compiled
    the kernel: a full disk, a file-size limit or a cache directory made read-only would fail a decode whose
    kernel was compiled and ready.  For this package's kernels, a save that fails is skipped with a one-line
    warning (the kernel runs; the next process compiles it again); Numba's own write leaves no partial file
    (a temporary file renamed into place, removed on failure)."""
    import warnings

    def save_overload(save, self, sig, data):
        try:
            return save(self, sig, data)
        except OSError as e:
            warnings.warn(
                f"could not write the compiled {self._py_func.__name__} into Numba's cache ({e}); it runs, and is "
                "compiled again by the next process",
                RuntimeWarning,
                stacklevel=2,
            )

    _guard_our_kernels("save_overload", save_overload)


def _guard_our_kernels(name: str, guarded) -> None:
    """Numba's ``Cache.<name>`` replaced, for this package's kernels only, by ``guarded(the method, self,
    *args)`` (once a process: a second call finds it replaced)."""
    from numba.core.caching import Cache

    method = getattr(Cache, name)
    if getattr(method, "refimpl_guard", False):
        return

    def ours_guarded(self, *args):
        if not getattr(self._py_func, "__module__", "").startswith("refimpl."):
            return method(self, *args)
        return guarded(method, self, *args)

    ours_guarded.refimpl_guard = True
    setattr(Cache, name, ours_guarded)


def _compile_features() -> set:
    """The CPU features Numba compiles for: its ``CPU_FEATURES`` (``NUMBA_CPU_FEATURES``, which
    ``_prefer_512_bit_vectors`` sets from the host's; none for ``NUMBA_CPU_NAME=generic``), else the host's."""
    import llvmlite.binding as llvm
    import numba

    configured = numba.core.config.CPU_FEATURES
    return set((configured if configured is not None else llvm.get_host_cpu_features().flatten()).split(","))


def _key_cache_by_the_package() -> None:
    """Numba keys a kernel's cache entries by its own source file, but the compiled kernel holds the code of
    the kernels it calls, from the other modules of this package too: an edited intrinsic would leave every
    kernel that inlines it stale.  This package's kernels are keyed by all of its source files together
    instead (``_package_stamp``: an edit to any of them compiles them all again)."""
    from numba.core import caching

    locator = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    stamp = getattr(locator, "get_source_stamp", None)
    if stamp is None or getattr(stamp, "refimpl_guard", False):
        return

    def get_source_stamp(self):
        py_file = getattr(self, "_py_file", None)
        if py_file is None or Path(py_file).resolve().parent != PACKAGE:
            return stamp(self)
        return _package_stamp()

    get_source_stamp.refimpl_guard = True
    locator.get_source_stamp = get_source_stamp


COMPILING_NOTE = "compiling the numba backend's kernels for this processor (once: Numba's cache keeps them)"
_NOTED = threading.Event()  # set once COMPILING_NOTE was logged in this process


def _note_first_compile() -> None:
    """Log ``COMPILING_NOTE`` (logger "refimpl", level INFO) when the first of this package's kernels starts
    compiling in this process, once: a run whose kernels the cache does not hold yet (the first on a
    machine, or after the package's source changed) waits for the compiler before its first audio, and the
    command line shows why (``refimpl.cli``; Python's default logging shows nothing at INFO).  A Numba
    ``numba:compile`` event listener: a kernel loaded from the cache sends no such event."""
    import logging

    from numba.core import event

    class FirstCompile(event.Listener):
        def on_start(self, ev):
            dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
            if module.startswith(__package__ + ".") and not _NOTED.is_set():
                _NOTED.set()
                logging.getLogger("refimpl").info(COMPILING_NOTE)

        def on_end(self, ev):
            pass

    event.register("numba:compile", FirstCompile())


@functools.cache
def _package_stamp() -> bytes:
    """A hash of this package's source files, their names and contents in name order, taken once a process (at
    the first kernel's decoration: the source the kernels are compiled from).  Every cached kernel asks for it
    as its module is imported, and listing the files again for each one slowed the import."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # (x86-64 Linux)


def _tiles_granted() -> bool:
    """Ask Linux for this process's AMX tile registers (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``, Linux 5.16+): whether they are granted, on x86-64 Linux, and not turned off
    (``REFIMPL_AMX=0``)."""
    if not switch("REFIMPL_AMX"):
        return False
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False
