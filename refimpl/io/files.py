"""Files in and out: output written so that a failed write never destroys a good file, and .npy input
checked before NumPy allocates what its header claims.

``write_atomically`` writes to a temporary file in the same directory and renames it over the target only
once every byte is on disk; a full disk, a file-size limit or an interrupt leaves the previous file (if
any) untouched and no temporary file behind.  Targets that are not regular files (``/dev/null``, a
named pipe) are written directly, since they cannot be replaced by a rename.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["write_atomically", "load_npy_codes", "user_cache_dir"]


def _default_mode() -> int:
    """The permissions ``open(path, "w")`` would give a new file: 0o666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    path = os.path.realpath(os.fspath(path))  # through a symbolic link: replace its target, keep the link
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory", path)
    if os.path.exists(path) and not os.path.isfile(path):  # a device or a pipe: no rename possible
        with open(path, "wb") as f:
            f.write(data)
        return
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)[:200]  # the temporary name must stay under the 255-byte limit
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.isfile(path) else _default_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_npy_codes(data: bytes, name: str) -> np.ndarray:
    """The one array of a .npy file's bytes; ValueError naming ``name`` for an .npz archive, a header that
    is not .npy, Python objects, or a header claiming more data than the bytes hold."""
    if data[:4] == b"PK\x03\x04":  # a zip file: np.savez
        raise ValueError(
            f"cannot read codes from {name}: it holds several arrays (an .npz archive), not one .npy array"
        )
    check_npy_header(data, name)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"cannot read codes from {name}: not a .npy file ({e or 'empty file'})") from None


def check_npy_header(data: bytes, name: str) -> None:
    """The .npy header's shape and dtype must fit the bytes that follow it (a header claiming more would
    make numpy allocate the claimed size before finding out)."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
    except (ValueError, EOFError) as e:
        raise ValueError(f"cannot read codes from {name}: not a .npy file ({e or 'empty file'})") from None
    if dtype.hasobject:
        raise ValueError(f"cannot read codes from {name}: it holds Python objects, not integer codes")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need > len(data) - f.tell():
        raise ValueError(
            f"cannot read codes from {name}: its header claims shape {tuple(shape)} of {dtype} "
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
