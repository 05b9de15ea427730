"""Writing output files so that a failed write never destroys a good file.

``write_atomically`` writes to a temporary file in the same directory and renames it over the target only
once every byte is on disk; a full disk, a file-size limit or an interrupt leaves the previous file (if
any) untouched and no temporary file behind.  Targets that are not regular files (``/dev/null``, a
named pipe) are written directly, since they cannot be replaced by a rename.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["write_atomically"]


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
