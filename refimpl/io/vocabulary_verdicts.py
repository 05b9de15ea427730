"""The store of vocabulary verdicts: that a model's ``vocab.json`` is the Qwen2 numbering of its
``merges.txt``, so that loading the same two files again need not parse the vocabulary nor look up every
merge's symbols in it.

The released text tokenizer's ``vocab.json`` numbers the 256 byte symbols by code point (ids 0..255), then
the symbol each line of ``merges.txt`` makes, in the file's order (id 256 + rank): the one file follows from
the other.  Parsing its 151,643 entries and checking that every merge's two symbols are among them is most
of the text tokenizer's load, on the way to a fresh process's first audio.  So, as the finiteness check's
verdict is kept by the checkpoint file's stamp (``finite_verdicts``, whose rules this store shares), the
verdict "``vocab.json`` is the numbering of ``merges.txt``, every symbol once, and every merge's symbols are
in it" (``text_tokenizer.follows_the_qwen2_numbering``), with "``merges.txt`` is in its usual form, every line
two symbols and one space" (its lines then taken as they are), is kept by the stamps of both files, and a
later load of the same two files numbers the vocabulary from ``merges.txt`` alone.

One small JSON file per ``vocab.json`` (named by the sha256 of its resolved path) in ``vocabulary/`` of the
cache directory: ``{"format", "vocab": [path, stamp], "merges": [path, stamp]}``, written only when neither
file changed within ``finite_verdicts.RACY_NS`` of its read nor since; anything else in its place is no
verdict (the files are read and checked), never an error; written atomically, a failed write ignored.
"""

from __future__ import annotations

from pathlib import Path

from .finite_verdicts import FileVersion, cache_directory, is_stamp, read_store_file, store_file, write_store_file

__all__ = ["FORMAT", "directory", "remembered", "remember"]

FORMAT = 1  # the store file's format (a file of another format is no verdict)


def directory() -> Path | None:
    """The folder of store files: ``vocabulary/`` of the cache directory (None: no store)."""
    base = cache_directory()
    return None if base is None else base / "vocabulary"


def remembered(vocab: FileVersion | None, merges: FileVersion | None) -> bool:
    """Whether the verdict is kept for ``vocab`` (``vocab.json`` as it was stat'ed) with ``merges``
    (``merges.txt``), both unchanged since."""
    folder = directory()
    if folder is None or vocab is None or merges is None or not (vocab.unchanged() and merges.unchanged()):
        return False
    data = read_store_file(store_file(folder, vocab))
    return (
        isinstance(data, dict)
        and data.get("format") == FORMAT
        and _is_version(data.get("vocab"), vocab)
        and _is_version(data.get("merges"), merges)
    )


def remember(vocab: FileVersion | None, merges: FileVersion | None) -> None:
    """Keep the verdict for ``vocab`` with ``merges`` (found now), unless a stamp is racy or moved since
    the files were read; a failed write is ignored."""
    folder = directory()
    if folder is None or vocab is None or merges is None or not (vocab.settled() and merges.settled()):
        return
    data = {"format": FORMAT, "vocab": [vocab.path, list(vocab.stamp)], "merges": [merges.path, list(merges.stamp)]}
    write_store_file(folder, store_file(folder, vocab), data)


def _is_version(value, version: FileVersion) -> bool:
    return (
        isinstance(value, list) and len(value) == 2 and value[0] == version.path and is_stamp(value[1], version.stamp)
    )
