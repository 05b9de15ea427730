"""Layouts derived from a weight (its AMX tiles, its packed words), made at the weight's first use and kept
while it lives where nothing can change it (``_kept_while_read_only``)."""

from __future__ import annotations

import weakref

import numpy as np


def _kept_while_read_only(kept: dict, w, make):
    """``make(w)``, made once and kept in ``kept`` (id -> (a weak reference to w, the value)) as long as w
    lives, where w is read-only (``_read_only``: a model's weights, the loaders make them so), so that a
    layout derived from a weight is made at its first use only; made again for each call where w could
    change."""
    key = id(w)
    entry = kept.get(key)
    if entry is not None and entry[0]() is w:
        return entry[1]
    value = make(w)
    if _read_only(w):
        kept[key] = (weakref.ref(w, lambda _, key=key: kept.pop(key, None)), value)
    return value


def _read_only(w) -> bool:
    """Whether nothing can change w's values through NumPy: w and every array it is a view of are read-only
    (a read-only view of a writable array is not)."""
    while isinstance(w, np.ndarray):
        if w.flags.writeable:
            return False
        w = w.base
    return True
