"""Running out of memory, said as such: the address-space limit (``ulimit -v``, RLIMIT_AS) checked against
what a load needs before it allocates, and the failures that mean "out of memory" (``MemoryError``, an
``OSError`` ENOMEM from ``mmap``, a shared library that cannot be mapped) told apart from the others, so
that the error names the stage and the file, the bytes needed and the limit (docs/limits.md)."""

from __future__ import annotations

import contextlib
import errno
import functools
import os

__all__ = ["OutOfMemory", "address_space_limit", "address_space_used", "check_room", "is_out_of_memory", "loading"]

# what a shared library or a thread that cannot get memory says (the dynamic loader, glibc, Rust's std)
_OUT_OF_MEMORY_TEXTS = ("failed to map segment", "cannot allocate memory", "out of memory", "memory allocation")


class OutOfMemory(MemoryError):
    """Memory ran out (or would) while loading ``what``; the message says how much was needed and the limit."""


def address_space_limit() -> int | None:
    """The soft address-space limit of this process in bytes (RLIMIT_AS), None where there is none."""
    try:
        import resource
    except ImportError:  # not on this system
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def address_space_used() -> int | None:
    """The address space this process uses now in bytes (VmSize of /proc/self/status), None where unknown."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MB"


def limit_note() -> str:
    """', under the address-space limit of N MB (ulimit -v), M MB in use', or '' without a limit."""
    limit = address_space_limit()
    if limit is None:
        return ""
    used = address_space_used()
    return f", under the address-space limit of {mb(limit)} (ulimit -v)" + (f", {mb(used)} in use" if used else "")


def check_room(what: str, nbytes: int) -> None:
    """Refuse, before anything is allocated, a load that needs at least ``nbytes`` more address space than
    the limit leaves (``nbytes`` must be a lower bound: what the load holds at once)."""
    limit = address_space_limit()
    used = address_space_used()
    if limit is not None and used is not None and used + nbytes > limit:
        raise OutOfMemory(
            f"out of memory loading {what}: it needs at least {mb(nbytes)} more, the process uses {mb(used)} "
            f"of its address-space limit of {mb(limit)} (ulimit -v); about {mb(used + nbytes - limit)} short"
        )


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says that memory ran out: a ``MemoryError``, an ``OSError`` ENOMEM, or an error whose text
    is the loader's or the C library's (a shared library that cannot be mapped, a thread without memory)."""
    if isinstance(e, MemoryError):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:
        return True
    text = str(e).lower()
    return isinstance(e, (OSError, ImportError, RuntimeError)) and any(t in text for t in _OUT_OF_MEMORY_TEXTS)


def out_of_memory(what: str, e: BaseException, nbytes: int | None = None) -> OutOfMemory:
    """The ``OutOfMemory`` that replaces ``e`` (memory ran out while loading ``what``)."""
    if isinstance(e, OutOfMemory):
        return e
    needed = f" (it needs at least {mb(nbytes)})" if nbytes else ""
    cause = " ".join(str(e).split()) or type(e).__name__
    return OutOfMemory(f"out of memory loading {what}{needed}{limit_note()}: {cause}")


def memory_message(e: BaseException) -> str:
    """The command line's one line for an out-of-memory error."""
    if isinstance(e, OutOfMemory):
        return str(e)
    cause = "" if isinstance(e, MemoryError) and not str(e) else f" ({' '.join(str(e).split())})"
    return f"out of memory{cause} (a shorter input needs less; see docs/limits.md){limit_note()}"


def file_size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def names_the_file_when_memory_runs_out(read):
    """Decorate ``read(path, ...)``: an out-of-memory failure inside it (``is_out_of_memory``) becomes one
    ``OutOfMemory`` naming ``path``."""

    @functools.wraps(read)
    def reading(path, *args, **kwargs):
        try:
            return read(path, *args, **kwargs)
        except (MemoryError, OSError) as e:
            if not is_out_of_memory(e):
                raise
            raise out_of_memory(str(path), e) from None

    return reading


@contextlib.contextmanager
def loading(what: str):
    """A stage boundary: memory that runs out inside the block (``is_out_of_memory``) is one ``OutOfMemory``
    naming ``what`` (an ``OutOfMemory`` raised inside, which names its file, passes unchanged)."""
    try:
        yield
    except OutOfMemory:
        raise
    except (MemoryError, OSError, ImportError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        raise out_of_memory(what, e) from None
