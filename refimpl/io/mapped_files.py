"""The files this process has memory-mapped, and what a bus error (SIGBUS) on one of them says.

A checkpoint's tensors are views of a memory map of the file (``checkpoint.read_safetensors_file``: the
float tensors stored in the compute dtype, the embedding tables, and with ``REFIMPL_HUGE_PAGES=0`` the
bfloat16 matrices too).  When another process truncates such a file while it is mapped, the kernel takes
the pages past the new end away, and the next read of one is a fault the kernel reports with SIGBUS, in
whatever code touched it (NumPy, BLAS, a Numba kernel).  Python cannot recover from a fault in C code: a
Python-level handler would return to the faulting instruction forever, and ``faulthandler`` prints a
traceback and dies by the signal.

``handle_bus_errors`` (the command line calls it) asks for a handler instead: when the first file is mapped,
a tiny C-level function (compiled once with llvmlite, Numba's code generator: about 10 ms) is installed for
SIGBUS; it writes one line, prepared beforehand, that names the files mapped at the time, and ends the
process with ``BUS_ERROR_STATUS`` (``write`` and ``_exit`` only, both safe in a signal handler, in any
thread).  Nothing is installed in a process that maps no file, nor for the Python API unless it asks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["track", "mapped_files", "handle_bus_errors", "read_every_page", "read_pages_beside", "BUS_ERROR_STATUS"]

BUS_ERROR_STATUS = 1  # the command line's status for bad input or environment (docs/limits.md)
MESSAGE_BYTES = 8192  # the prepared line, cut (with "...") past this

_lock = threading.Lock()
_mapped: dict[int, str] = {}  # id of a map's owner -> the file's path
_state: dict = {"wanted": False, "installed": False}
_message = np.zeros(MESSAGE_BYTES, np.uint8)  # the line the handler writes (never moved or freed)
_length = np.zeros(1, np.int64)  # its length in bytes


PAGE_BYTES = 4096


def read_every_page(arrays: Iterable[Any]) -> None:
    """Read one byte of every page of each contiguous host array of ``arrays``, in their order.  A model's
    weights are a memory map of its file: in a fresh process the first read of each of their pages maps it
    (a page fault).  Run by a thread beside the work that will read them (a model's load starts one for the
    Talker's matrices, in the order of a step; a speech tokenizer's first stream one for the decoder's, from its
    last weights back while the push reads from its first), those faults are taken there rather than inside
    that work's parallel loops, where a thread stalled by a fault holds up the others."""
    for a in arrays:
        if isinstance(a, np.ndarray) and a.flags.c_contiguous and a.nbytes > PAGE_BYTES:
            a.reshape(-1).view(np.uint8)[::PAGE_BYTES].max()  # (NumPy lets the interpreter go meanwhile)


def read_pages_beside(arrays: Iterable[Any], name: str) -> threading.Thread:
    """Start a daemon thread ``name`` that runs ``read_every_page(arrays)``; returns it."""
    thread = threading.Thread(target=read_every_page, args=(list(arrays),), name=name, daemon=True)
    thread.start()
    return thread


def track(owner, path) -> None:
    """Note that ``owner`` (an object that keeps the map alive, e.g. an ``np.memmap``) maps ``path``, until
    ``owner`` is collected; installs the SIGBUS handler if it was asked for (``handle_bus_errors``)."""
    key = id(owner)
    with _lock:
        _mapped[key] = os.path.abspath(os.fspath(path))
    weakref.finalize(owner, _untrack, key)
    if _state["wanted"] and not _state["installed"]:
        _install()
    _prepare()


def mapped_files() -> list[str]:
    """The files mapped now, each once, in the order they were first mapped."""
    with _lock:
        return list(dict.fromkeys(_mapped.values()))


def handle_bus_errors() -> None:
    """Ask for the SIGBUS handler: installed now if a file is mapped, else when the first one is.  Where it
    cannot be (no SIGBUS, no llvmlite, no C library through ctypes), the default stays: the process is
    killed by the signal."""
    _state["wanted"] = True
    if _mapped and not _state["installed"]:
        _install()
        _prepare()


def _untrack(key: int) -> None:
    with _lock:
        _mapped.pop(key, None)
    _prepare()


def bus_error_line(files: list[str]) -> bytes:
    """The line written on a bus error, naming ``files`` (cut to ``MESSAGE_BYTES``)."""
    named = ", ".join(files) if files else "none known"
    line = (
        "refimpl: error: bus error (SIGBUS) reading a memory-mapped file: one was truncated while in use (by "
        f"another process?); mapped: {named} (see docs/limits.md)"
    ).encode("utf-8", "backslashreplace")
    if len(line) + 1 > MESSAGE_BYTES:
        line = line[: MESSAGE_BYTES - 5] + b"..."
    return b"\n" + line + b"\n"  # on a line of its own, whatever a progress bar left on the current one


def _prepare() -> None:
    """Write the current line into the handler's buffer (the length last, so the handler never reads a
    half-written line past its length)."""
    if not _state["installed"]:
        return
    line = bus_error_line(mapped_files())
    _length[0] = 0
    _message[: len(line)] = np.frombuffer(line, np.uint8)
    _length[0] = len(line)


_IR = """
declare i64 @write(i32, {ptr}, i64)
declare void @_exit(i32)
define void @refimpl_bus_error(i32 %signum) {{
  %n = load volatile i64, {lptr} inttoptr (i64 {length} to {lptr})
  %w = call i64 @write(i32 2, {ptr} inttoptr (i64 {message} to {ptr}), i64 %n)
  call void @_exit(i32 {status})
  unreachable
}}
"""


def _install() -> None:
    """Compile the handler (LLVM IR: write the prepared line to descriptor 2, then ``_exit``) and install it
    for SIGBUS; the compiled code is kept for the life of the process."""
    _state["installed"] = True  # tried once, whatever happens
    if not hasattr(signal, "SIGBUS"):
        return
    try:
        import llvmlite.binding as llvm

        libc = ctypes.CDLL(None)
        for name in ("write", "_exit"):
            llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        where = {"length": _length.ctypes.data, "message": _message.ctypes.data, "status": BUS_ERROR_STATUS}
        try:  # typed pointers (LLVM up to 16), else opaque ones
            module = llvm.parse_assembly(_IR.format(ptr="i8*", lptr="i64*", **where))
        except RuntimeError:
            module = llvm.parse_assembly(_IR.format(ptr="ptr", lptr="ptr", **where))
        module.verify()
        engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
        engine.finalize_object()
        handler = engine.get_function_address("refimpl_bus_error")
        install = libc.signal
        install.argtypes, install.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    except Exception:  # no llvmlite or C library here: the default action stays
        return
    _state["engine"] = engine  # the handler's code lives as long as its engine
    with contextlib.suppress(Exception):
        install(int(signal.SIGBUS), handler)
