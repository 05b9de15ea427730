"""Files in and out: output written so that a failed write never destroys a good file, and input read
within bounds and checked before use.

Output.  ``atomic_output`` (and ``write_atomically`` on it) writes to a temporary file in the same
directory and renames it over the target only once every byte is on disk; a full disk, a file-size
limit, an interrupt (Ctrl-C) or a SIGTERM / SIGHUP leaves the previous file (if any) untouched and no
temporary file behind (the two signals are caught around the write, the temporary file removed, and the
signal then delivered again with its previous handler, so the process still ends as the signal asks).
Targets that are not regular files (``/dev/null``, a named pipe) are written directly, since they cannot
be replaced by a rename.

Input.  Every file the tools read goes through three checks before its content is used:

- ``read_limited``: the size is bounded before reading: a regular file larger than the limit is refused
  from its size, anything else (a pipe, a terminal, ``/dev/zero``) is read up to the limit and refused
  past it, a directory is refused;
- ``parse_json``: JSON nested deeper than ``MAX_JSON_DEPTH`` is an error (not a RecursionError), and so is
  an integer of more than ``MAX_JSON_INT_DIGITS`` digits (not Python's own ValueError, which names no file);
- ``plain_file_name``: a name that comes from input and becomes part of an output or input path is a
  plain file name (no folder part, no ``..``, not absolute).

Each failure is an ``InputError`` (a ``ValueError``) naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = [
    "InputError",
    "Signalled",
    "signals_raise",
    "atomic_output",
    "write_atomically",
    "read_limited",
    "parse_json",
    "plain_file_name",
    "load_npy_codes",
    "check_npy_header",
    "user_cache_dir",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_INPUT_BYTES",
    "MAX_JSON_INT_DIGITS",
]


class InputError(ValueError):
    """A file (or stream) from outside cannot be used: too large, not the format it should be, malformed."""


# ----------------------------------------------------------------------------- output


def _default_mode() -> int:
    """The permissions ``open(path, "w")`` would give a new file: 0o666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class Signalled(BaseException):
    """SIGTERM or SIGHUP arrived during an atomic write (raised by the handler, caught by the writer)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


CLEANUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def signals_raise():
    """Within the block, SIGTERM and SIGHUP raise ``Signalled`` (so that ``finally`` clauses run); the
    previous handlers are restored after it.  Ignored signals stay ignored (``nohup``); outside the main
    thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {}

    def handler(signum, frame):
        raise Signalled(signum)

    try:
        for signum in CLEANUP_SIGNALS:
            old = signal.getsignal(signum)
            if old is not signal.SIG_IGN and old is not None:
                previous[signum] = signal.signal(signum, handler)
        yield previous
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def atomic_output(path):
    """A binary file to write ``path`` through: a temporary file in the same directory, renamed over
    ``path`` when the block ends without an exception (after ``fsync``; the permissions of the file it
    replaces, else those of a new file).  On an exception, or SIGTERM / SIGHUP, the temporary file is
    removed and ``path`` stays as it was; the signal is then delivered again to its previous handler
    (by default: the process ends, killed by that signal)."""
    path = os.path.realpath(os.fspath(path))  # through a symbolic link: replace its target, keep the link
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory", path)
    if os.path.exists(path) and not os.path.isfile(path):  # a device or a pipe: no rename possible
        with open(path, "wb") as f:
            yield f
        return
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)[:200]  # the temporary name must stay under the 255-byte limit
    tmp = None
    try:
        with signals_raise():
            try:
                fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + name + ".", suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.isfile(path) else _default_mode())
                os.replace(tmp, path)
                tmp = None
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
    except Signalled as e:
        # the handlers are restored: deliver the signal again (the default action ends the process here)
        signal.raise_signal(e.signum)
        raise InterruptedError(4, f"interrupted by signal {e.signum} while writing", path) from None


def write_atomically(path, data) -> None:
    """Write ``data`` (bytes, or a sequence of bytes-like pieces written one after the other) to ``path``
    through ``atomic_output``."""
    with atomic_output(path) as f:
        for piece in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
            f.write(piece)


# ----------------------------------------------------------------------------- input

MAX_JSON_BYTES = 100_000_000  # a JSON file (config, index, tokenizer) or header: the safetensors limit
MAX_JSON_DEPTH = 64  # released configs nest 4 levels, trace metadata (a config inside) 7
MAX_INPUT_BYTES = 1 << 28  # 256 MiB: a codes file, a cases file, text on standard input
MAX_JSON_INT_DIGITS = 4300  # Python's default limit of int(str): no JSON number we read has more than 20


def read_limited(source, limit: int, what: str, error=InputError, regular_only: bool = False) -> bytes:
    """All bytes of ``source`` (a path, or a binary file object such as ``sys.stdin.buffer``), refused
    with one ``error`` naming ``what`` if there are more than ``limit``: a regular file from its size,
    before reading; a stream (pipe, terminal, device) after reading ``limit + 1`` bytes at most.  With
    ``regular_only`` a path that is not a regular file is refused before it is opened (opening a named
    pipe would wait for a writer)."""
    if not hasattr(source, "read"):
        if regular_only:
            try:
                mode = os.stat(os.fspath(source)).st_mode
            except OSError:
                mode = None  # reported by open() below
            if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise error(f"cannot read {what}: it is not a regular file (a pipe or a device?)")
        try:
            with open(os.fspath(source), "rb") as f:
                return read_limited(f, limit, what, error)
        except IsADirectoryError:
            raise error(f"cannot read {what}: it is a directory") from None
        except FileNotFoundError:
            raise error(f"cannot read {what}: it does not exist") from None
        except OSError as e:
            raise error(f"cannot read {what}: {e.strerror or e}") from None
    try:
        info = os.fstat(source.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise error(f"cannot read {what}: it is a directory")
    if info is not None and stat.S_ISREG(info.st_mode) and info.st_size > limit:
        raise error(f"{what} is {info.st_size} bytes, over the limit of {limit}")
    pieces, total = [], 0
    while total <= limit:
        piece = source.read(min(1 << 20, limit + 1 - total))
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
    if total > limit:
        raise error(f"{what} is over the limit of {limit} bytes (an endless stream or device?)")
    return b"".join(pieces)


def json_depth_at_most(value, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` lists / objects deep (iterative).  Only the
    lists and objects holding lists or objects are walked in Python: a flat object of 151,643 entries (a
    vocabulary) is one pass over its values' types."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return False
        if _CONTAINERS.isdisjoint(map(type, children)):
            continue
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


_CONTAINERS = frozenset({dict, list})  # (the types json.loads makes of objects and arrays)


def _unique_keys(pairs):
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        raise _RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return value


class _RepeatedKey(Exception):
    pass


class _LongInteger(Exception):
    pass


def _json_integer(text: str) -> int:
    """A JSON integer, refused past ``MAX_JSON_INT_DIGITS`` digits before it is converted (Python's own
    limit, ``sys.set_int_max_str_digits``, depends on the environment and names no file; without a limit
    the conversion is quadratic in the digits)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise _LongInteger(digits)
    try:
        return int(text)
    except ValueError:  # PYTHONINTMAXSTRDIGITS set lower than our limit
        raise _LongInteger(digits) from None


def _json_loads(text, object_pairs_hook):
    """``json.loads`` with integers of at most ``MAX_JSON_INT_DIGITS`` digits.  Where Python's own limit of
    int(str) is set and at most ours (its default, 4300 digits, is ours), its decoder converts the integers
    in C and refuses a longer one (a ValueError naming no file): the text is then read again with
    ``_json_integer``, which raises ``_LongInteger`` with the digits.  Otherwise (no limit, a larger one,
    or a Python without it) every integer passes through ``_json_integer``: a Python call each, the most
    of a vocabulary's read."""
    python_limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if 0 < python_limit <= MAX_JSON_INT_DIGITS:
        try:
            return json.loads(text, object_pairs_hook=object_pairs_hook)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise
        except ValueError:  # an integer past Python's limit: read again to name it
            pass
    return json.loads(text, object_pairs_hook=object_pairs_hook, parse_int=_json_integer)


def parse_json(text, what: str, error=InputError, max_depth: int = MAX_JSON_DEPTH, unique_keys: bool = False):
    """``json.loads`` with every failure one ``error`` naming ``what``: malformed JSON, text that is not
    UTF-8, nesting deeper than ``max_depth`` (Python's decoder would raise RecursionError past ~1000),
    an integer of more than ``MAX_JSON_INT_DIGITS`` digits, and with ``unique_keys`` an object that
    repeats a key (``json`` would keep the last silently)."""
    try:
        value = _json_loads(text, _unique_keys if unique_keys else None)
    except _RepeatedKey as e:
        raise error(f"{what}: the key {e.args[0]!r} appears twice in one object") from None
    except _LongInteger as e:
        raise error(
            f"{what}: a JSON integer of {e.args[0]} digits (at most {MAX_JSON_INT_DIGITS} digits are read)"
        ) from None
    except json.JSONDecodeError as e:
        raise error(f"{what} is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} is not valid UTF-8 text: {e}") from None
    except RecursionError:
        raise error(f"{what}: JSON nested more than {max_depth} levels deep") from None
    if not json_depth_at_most(value, max_depth):
        raise error(f"{what}: JSON nested more than {max_depth} levels deep")
    return value


def plain_file_name(name) -> bool:
    """A name usable as one file in a directory: a non-empty str without a folder part (``/`` or ``\\``),
    not ``.`` or ``..``, not absolute, no NUL or other control character, at most 200 characters (so that
    an extension and the atomic writer's temporary name stay under the 255-byte limit)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 200
        and len(name.encode("utf-8", "surrogatepass")) <= 200
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and not os.path.isabs(name)
        and all(ord(c) >= 32 and ord(c) != 127 for c in name)
    )


def load_npy_codes(data: bytes, name: str) -> np.ndarray:
    """The one array of a .npy file's bytes; ValueError naming ``name`` for an .npz archive, a header that
    is not .npy, Python objects, or a header claiming more data than the bytes hold."""
    if data[:4] == b"PK\x03\x04":  # a zip file: np.savez
        raise InputError(
            f"cannot read codes from {name}: it holds several arrays (an .npz archive), not one .npy array"
        )
    check_npy_header(data, name)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"cannot read codes from {name}: not a .npy file ({e or 'empty file'})") from None


def read_npy_header(f, name: str, what: str = "codes") -> tuple:
    """(shape, fortran_order, dtype) of the .npy header at ``f``'s position; InputError naming ``name``."""
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return read_header(f)
    except (ValueError, EOFError, SyntaxError, TypeError) as e:
        raise InputError(f"cannot read {what} from {name}: not a .npy file ({e or 'empty file'})") from None


def check_npy_header(data: bytes, name: str, what: str = "codes") -> None:
    """The .npy header's shape and dtype must fit the bytes that follow it (a header claiming more would
    make numpy allocate the claimed size before finding out)."""
    f = io.BytesIO(data)
    shape, _, dtype = read_npy_header(f, name, what)
    if dtype.hasobject:
        raise InputError(f"cannot read {what} from {name}: it holds Python objects, not numbers")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need > len(data) - f.tell():
        raise InputError(
            f"cannot read {what} from {name}: its header claims shape {tuple(shape)} of {dtype} "
            f"({need} bytes) but the file holds only {len(data) - f.tell()} (truncated file?)"
        )


def user_cache_dir() -> Path | None:
    """This package's per-user cache directory: $XDG_CACHE_HOME/refimpl, else ~/.cache/refimpl; None when
    neither is known.  A relative XDG_CACHE_HOME is ignored, as the XDG specification says."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):
            return None
    return Path(base) / "refimpl"
