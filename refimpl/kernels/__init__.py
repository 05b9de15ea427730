"""The backend layer: faster twins of the primitives of ``refimpl.nn``, same names, same signatures.

    backend  what runs
    numpy    the plain primitives of refimpl/nn.py, each the formula of its docstring (the reference)
    numba    the CPU twins of refimpl/kernels/numba_cpu.py where one exists, else the reference

A primitive of ``refimpl.nn`` is marked ``@primitive``; at every call it looks up the twin of the
active backend and runs it instead of its own body.  The stage modules only ever call ``nn.<name>``.

Which backend is active:
    1. ``with refimpl.use_backend("numba"): ...``      (innermost wins)
    2. the environment variable ``REFIMPL_BACKEND=numpy|numba``
    3. otherwise "auto": the twins run on float32 arrays (the fast everyday mode) and the reference on
       float64 arrays (the oracle mode stays the plain formulas unless a backend is asked for).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os

import numpy as np

__all__ = ["BACKENDS", "primitive", "use_backend", "active_backend", "twin_of"]

BACKENDS = ("numpy", "numba")
_TWIN_MODULES = {"numba": "refimpl.kernels.numba_cpu"}
_ENV = "REFIMPL_BACKEND"

_requested: contextvars.ContextVar = contextvars.ContextVar("refimpl_backend", default=None)
_twins: dict = {}   # backend -> {primitive name: twin}, filled on first use


def _check_name(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def active_backend() -> tuple:
    """(backend name or "auto", why): what the primitives use now."""
    requested = _requested.get()
    if requested is not None:
        return requested
    env = os.environ.get(_ENV, "").strip()
    if env:
        return _check_name(env, f"environment variable {_ENV}"), f"environment variable {_ENV}"
    return "auto", "default: numba twins for float32, the numpy reference for float64"


@contextlib.contextmanager
def use_backend(name: str, reason: str = "refimpl.use_backend()"):
    """Run the enclosed code with the primitives of backend ``name`` ("numpy" or "numba"); ``reason`` is
    what ``active_backend`` reports as the cause."""
    token = _requested.set((_check_name(name, "use_backend"), reason))
    try:
        yield name
    finally:
        _requested.reset(token)


def _twin_table(backend: str) -> dict:
    table = _twins.get(backend)
    if table is None:
        module = importlib.import_module(_TWIN_MODULES[backend])
        table = _twins[backend] = dict(module.TWINS)
    return table


def twin_of(name: str, backend: str):
    """The twin of primitive ``name`` in ``backend``, or None where the backend has none (or is numpy)."""
    if backend == "numpy":
        return None
    return _twin_table(backend).get(name)


def primitive(reference):
    """Mark a plain NumPy primitive: calls go to the active backend's twin of the same name, if any."""
    name = reference.__name__

    @functools.wraps(reference)
    def dispatch(*args, **kwargs):
        backend, _ = active_backend()
        if backend == "auto":
            first = args[0] if args else None
            backend = "numba" if getattr(first, "dtype", None) == np.float32 else "numpy"
        twin = twin_of(name, backend)
        return (twin or reference)(*args, **kwargs)

    dispatch.reference = reference
    return dispatch
