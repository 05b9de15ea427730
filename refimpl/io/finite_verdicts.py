"""The store of finiteness verdicts: which tensors of a checkpoint file, at one version of it, were found
free of NaN and infinity, so that loading the same file again need not read every weight to check it.

Every load checks every weight (``checkpoint.check_weights``): 1.8 GB for the 0.6B model's Talker, 0.68 GB
for its codec, a large share of a fresh process's work before its first audio.  The files do not change
between runs, so, like Numba's cache of compiled kernels (kept by the source file's stamp), the verdict is
kept by the checkpoint file's stamp: ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``.  A file rewritten in place
or replaced gets a new stamp (its ctime at least moves, and no program can set that back), and a new stamp
is a file never checked.

One small JSON file per checkpoint file, named by the sha256 of its resolved path, in ``finite/`` of the
cache directory (``directory``): ``{"format", "path", "stamp", "finite": [tensor names]}``.  It is replaced
when the stamp changes and names are only added for the same stamp, so the store holds one file per
checkpoint file ever loaded, however many loads.

- A verdict is recorded only when the file's mtime and ctime are at least ``RACY_NS`` older than the moment
  the file was read (a file written within the clock's granularity could change and keep its stamp) and
  the stamp is the same after the check as when the file was read.
- A tensor found non-finite is never recorded: its error comes at every load.
- Reading a store file is reading input: at most ``MAX_STORE_BYTES``, its JSON shape checked, its path and
  stamp equal to the file's; anything else is no verdict (the check runs), never an error.
- Writing is atomic (a temporary file in the same folder renamed over the old one), and a failed write is
  ignored: a read-only home must not stop a load.

``REFIMPL_CACHE_DIR`` (docs/limits.md#the-environment) names the cache directory (0, off, false or no: no
store at all); unset or empty, the per-user cache (``files.user_cache_dir``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..environment import FALSE
from .files import parse_json, read_limited, user_cache_dir

__all__ = ["FORMAT", "FileVersion", "directory", "remembered", "remember"]

FORMAT = 1  # the store file's format (a file of another format is no verdict)
MAX_STORE_BYTES = 1 << 20  # a store file larger than this is not read (nor written)
RACY_NS = 2_000_000_000  # a file changed less than this before it was read is not remembered
VARIABLE = "REFIMPL_CACHE_DIR"

_lock = threading.Lock()  # one read-merge-write at a time (the codec is loaded in a thread beside the Talker)


@dataclass(frozen=True)
class FileVersion:
    """One checkpoint file as it was read: its resolved path, its stamp then, and when it was read."""

    path: str
    stamp: tuple
    read_ns: int

    @classmethod
    def of(cls, path) -> FileVersion | None:
        """The version of ``path`` now (None if it cannot be stat'ed)."""
        read_ns = time.time_ns()
        resolved = os.path.realpath(os.fspath(path))
        stamp = stamp_of(resolved)
        return None if stamp is None else cls(resolved, stamp, read_ns)

    def unchanged(self) -> bool:
        return stamp_of(self.path) == self.stamp

    def racy(self) -> bool:
        """Changed too close to the moment it was read to tell a later change by the stamp."""
        _, _, _, mtime_ns, ctime_ns = self.stamp
        return max(mtime_ns, ctime_ns) > self.read_ns - RACY_NS

    def settled(self) -> bool:
        """Whether a verdict on the file as it was read may be kept: not racy, and unchanged since."""
        return not self.racy() and self.unchanged()


def stamp_of(path: str) -> tuple | None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def cache_directory() -> Path | None:
    """The cache directory of the verdicts' stores: ``$REFIMPL_CACHE_DIR``, else the per-user cache; None
    when ``REFIMPL_CACHE_DIR`` turns the stores off (0, off, false, no) or no cache directory is known."""
    raw = os.environ.get(VARIABLE, "").strip()
    if raw.lower() in FALSE:
        return None
    return Path(raw).expanduser() if raw else user_cache_dir()


def directory() -> Path | None:
    """The folder of store files: ``finite/`` of ``cache_directory()`` (None: no store)."""
    base = cache_directory()
    return None if base is None else base / "finite"


def store_file(folder: Path, version: FileVersion) -> Path:
    """The store file of ``version``'s file in ``folder``: named by the sha256 of its resolved path."""
    return folder / (hashlib.sha256(os.fsencode(version.path)).hexdigest() + ".json")


def read_store_file(store: Path):
    """The JSON value of a store file, or None where it is absent, over ``MAX_STORE_BYTES``, not a regular
    file or not JSON (no verdict, never an error)."""
    try:
        return parse_json(read_limited(store, MAX_STORE_BYTES, str(store), regular_only=True), str(store))
    except ValueError:  # (an InputError)
        return None


def write_store_file(folder: Path, store: Path, data: dict) -> None:
    """``data`` as compact JSON into ``store`` (made atomically in ``folder``), unless it is over
    ``MAX_STORE_BYTES``; a failed write is ignored (a read-only home must not stop a load)."""
    text = json.dumps(data, separators=(",", ":"))
    if len(text) <= MAX_STORE_BYTES:
        with contextlib.suppress(OSError):
            _write_atomically(folder, store, text.encode("ascii"))


def is_stamp(value, stamp: tuple) -> bool:
    """Whether the JSON ``value`` is the list of integers ``stamp`` (booleans are not integers)."""
    return isinstance(value, list) and all(type(x) is int for x in value) and tuple(value) == stamp


def remembered(version: FileVersion) -> frozenset:
    """The names of ``version``'s tensors remembered as finite; empty when the file changed since it was
    read, or when there is no store or no valid verdict for this stamp."""
    folder = directory()
    if folder is None or not version.unchanged():
        return frozenset()
    return _read_verdict(store_file(folder, version), version)


def _read_verdict(store: Path, version: FileVersion) -> frozenset:
    data = read_store_file(store)
    if not (
        isinstance(data, dict)
        and data.get("format") == FORMAT
        and data.get("path") == version.path
        and is_stamp(data.get("stamp"), version.stamp)
        and isinstance(data.get("finite"), list)
        and all(isinstance(name, str) for name in data["finite"])
    ):
        return frozenset()
    return frozenset(data["finite"])


def remember(version: FileVersion, finite) -> None:
    """Add the tensor names ``finite`` (found free of NaN and infinity in ``version``) to its verdict, unless
    its stamp is racy or moved since it was read; a failed write is ignored."""
    folder = directory()
    if folder is None or not finite or not version.settled():
        return
    store = store_file(folder, version)
    with _lock:
        known = _read_verdict(store, version)
        if known.issuperset(finite):
            return
        data = {"format": FORMAT, "path": version.path, "stamp": list(version.stamp)}
        write_store_file(folder, store, dict(data, finite=sorted(known.union(finite))))


def _write_atomically(folder: Path, store: Path, data: bytes) -> None:
    """``data`` into ``store`` through a temporary file renamed over it (a cache: no fsync; a file cut short
    by a crash is not valid JSON, so no verdict)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, store)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
