"""The standard streams: made safe to use before any work, and a closed pipe ended quietly.

A careful Unix tool started with a closed stdin, stdout or stderr must not open an output file as one of
their descriptors (``settle_standard_streams``), and a reader that stops reading (``| head``) ends the
command with status 1 and no message (``quiet_after_closed_pipe``)."""

from __future__ import annotations

import contextlib
import io
import os
import sys


def quiet_after_closed_pipe() -> int:
    """Standard output was closed by its reader (``| head``): end without a message or a traceback (and
    without the interpreter's own complaint when it flushes standard output at exit)."""
    with contextlib.suppress(OSError, ValueError):
        devnull_on(sys.stdout.fileno())
    return 1


def devnull_on(fd: int) -> None:
    """Give the open descriptor ``fd`` /dev/null for writing (what it held is closed: a pipe's reader sees
    its end when no other descriptor holds it)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def end_standard_output() -> None:
    """The end of a command's standard output: flushed, then its descriptor given /dev/null, so that a reader
    (``| aplay``) sees the end of the stream when the work is done, not when the interpreter has finished
    tearing down (freeing a model's arrays, Numba's state).  A reader that has
    gone raises ``BrokenPipeError`` here, as at any flush."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # (a ClosedStream, or a stand-in without a descriptor)
        return
    if fd == 1:  # (else a stand-in's own file, e.g. a test's capture: not the process's standard output)
        devnull_on(fd)


class ClosedStream(io.RawIOBase):
    """Stands in for a standard stream that was closed when refimpl started: reading or writing it is an
    error naming it (its file descriptor is held open on /dev/null, so that no file opened later takes it)."""

    def __init__(self, name: str):
        super().__init__()
        self.stream_name = name

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer):
        raise OSError(f"cannot read standard {self.stream_name}: it is closed")

    def write(self, data):
        raise OSError(f"cannot write standard {self.stream_name}: it is closed")


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def settle_standard_streams() -> None:
    """What a careful Unix tool does before any work: a closed stdin, stdout or stderr gets /dev/null on its
    descriptor (so that no output file is opened as descriptor 1); reading a closed stdin or writing a
    closed stdout is then an error (``ClosedStream``), while notes for a closed stderr are dropped (never
    sent to stdout).  An unbuffered stdout (``PYTHONUNBUFFERED``, ``-u``) gets a buffer again: a raw write
    may write only part of its bytes, and the buffered writer writes the rest or raises."""
    for fd, name, attribute in ((0, "input", "stdin"), (1, "output", "stdout"), (2, "error", "stderr")):
        if getattr(sys, attribute) is not None and fd_is_open(fd):
            continue
        if not fd_is_open(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if attribute == "stderr":
            sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
        else:
            setattr(sys, attribute, io.TextIOWrapper(ClosedStream(name), encoding="utf-8", write_through=True))
    raw = getattr(sys.stdout, "buffer", None)
    if sys.stdout is sys.__stdout__ and isinstance(raw, io.FileIO):  # the interpreter's own, unbuffered
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding=sys.stdout.encoding, errors=sys.stdout.errors, line_buffering=True
        )
