"""The backend layer: which arrays the networks compute on, and faster twins of the primitives of
``refimpl.nn`` (same names, same signatures).

    backend  arrays                               what runs
    numpy    NumPy, on the host                   the plain primitives of refimpl/nn.py (the reference)
    numba    NumPy, on the host                   the CPU twins of refimpl/backends/numba_cpu.py where one
                                                  exists, else the reference
    cupy     CuPy, on a CUDA GPU                  the twins of refimpl/backends/cupy_cuda.py where one exists,
                                                  else the reference formulas, run by CuPy on device arrays

A primitive of ``refimpl.nn`` is marked ``@primitive``; at every call it looks up the twin of the
active backend and runs it instead of its own body.  The stage modules only ever call ``nn.<name>``,
and create arrays through ``nn.zeros`` / ``nn.arange`` / ``nn.to_device`` ..., so that the backend
decides where they live (docs/backends.md).

A device backend is a module named in ``_ARRAY_MODULES`` with: ``xp`` (its NumPy-like namespace),
``to_device(host) -> device array``, ``to_host(device array) -> numpy.ndarray``, ``available()``
(raises ``BackendUnavailable`` naming what is missing), ``TWINS`` (name -> twin) and optionally
``special`` (its ``scipy.special``).  Besides "cupy" there is the test backend "strict"
(``refimpl/backends/strict_device.py``): NumPy underneath, as strict as CuPy about host round trips,
so CI proves the device data flow without a GPU.  It is accepted everywhere a backend name is, but not
listed in ``BACKENDS`` (no user should pick it).

Which backend is active:
    1. ``with refimpl.use_backend("numba"): ...``      (innermost wins)
    2. the environment variable ``REFIMPL_BACKEND=numpy|numba|cupy``
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
from scipy import special as host_special

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "primitive",
    "use_backend",
    "active_backend",
    "twin_of",
    "device_backend",
    "installed_backends",
    "array_module",
    "device_module",
    "to_device",
    "to_host",
    "model_scope",
    "on_model_backend",
    "iterate_on_model_backend",
]

BACKENDS = ("numpy", "numba", "cupy")
TEST_BACKENDS = ("strict",)  # accepted by name, never offered (see the module docstring)
_TWIN_MODULES = {"numba": "refimpl.backends.numba_cpu"}
_ARRAY_MODULES = {"cupy": "refimpl.backends.cupy_cuda", "strict": "refimpl.backends.strict_device"}
_ENV = "REFIMPL_BACKEND"

_requested: contextvars.ContextVar = contextvars.ContextVar("refimpl_backend", default=None)
_twins: dict = {}  # backend -> {primitive name: twin}, filled on first use
_modules: dict = {}  # device backend -> its module, once ``available()`` passed


class BackendUnavailable(RuntimeError, ValueError):
    """A backend was asked for that cannot run here (its library is not installed, or no device).  A
    ValueError too: the argument names a backend this machine cannot run (the CLI reports it in one line)."""


def _check_name(name: str, where: str) -> str:
    if name not in BACKENDS and name not in TEST_BACKENDS:
        raise ValueError(f"{where}: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in _ARRAY_MODULES:
        device_module(name)  # BackendUnavailable now, with one message naming what is missing
    return name


def installed_backends() -> tuple:
    """The backends of ``BACKENDS`` that can run here (a device backend only when its ``available()``
    passes: CuPy installed and a GPU visible)."""
    names = []
    for name in BACKENDS:
        try:
            _check_name(name, "installed_backends")
        except BackendUnavailable:
            continue
        names.append(name)
    return tuple(names)


def device_module(name: str):
    """The module of device backend ``name`` (``_ARRAY_MODULES``), after its ``available()`` check passed."""
    module = _modules.get(name)
    if module is None:
        try:
            module = importlib.import_module(_ARRAY_MODULES[name])
        except ImportError as e:
            raise BackendUnavailable(f"backend {name!r}: its module could not be imported ({e})") from None
        module.available()
        _modules[name] = module
    return module


def active_backend() -> tuple:
    """(backend name or "auto", why): what the primitives use now."""
    requested = _requested.get()
    if requested is not None:
        return requested
    env = os.environ.get(_ENV, "").strip()
    if env:
        return _check_name(env, f"environment variable {_ENV}"), f"environment variable {_ENV}"
    return "auto", "default: numba twins for float32, the numpy reference for float64"


def device_backend() -> str | None:
    """The active backend's name when it keeps arrays on a device ("cupy", "strict"), else None."""
    name = active_backend()[0]
    return name if name in _ARRAY_MODULES else None


@contextlib.contextmanager
def use_backend(name: str, reason: str = "refimpl.use_backend()"):
    """Run the enclosed code with the primitives of backend ``name`` ("numpy", "numba" or "cupy");
    ``reason`` is what ``active_backend`` reports as the cause.  A device backend that cannot run here
    raises ``BackendUnavailable`` on entry."""
    token = _requested.set((_check_name(name, "use_backend"), reason))
    try:
        yield name
    finally:
        _requested.reset(token)


# ----------------------------------------------------------------------------- arrays of the active backend


def array_module():
    """The NumPy-like namespace arrays are created with now: ``numpy`` on the host backends, the
    device module's ``xp`` (``cupy``) on a device backend."""
    name = device_backend()
    return np if name is None else device_module(name).xp


def to_device(x):
    """``x`` as an array of the active backend: a host array (or list, scalar) is uploaded to a device
    backend (the one explicit host -> device copy); a device array is returned as it is.  On the host
    backends this is ``np.asarray``."""
    name = device_backend()
    if name is None:
        return np.asarray(x)
    module = device_module(name)
    return x if isinstance(x, module.xp.ndarray) else module.to_device(np.asarray(x))


def to_host(x) -> np.ndarray:
    """``x`` as a host ``numpy.ndarray``: a device array of a loaded device backend is copied down (the
    one explicit device -> host copy); anything else goes through ``np.asarray``."""
    if isinstance(x, np.ndarray):
        return x
    for module in _modules.values():
        if isinstance(x, module.xp.ndarray):
            return module.to_host(x)
    return np.asarray(x)


def special_module(x):
    """``scipy.special`` for host arrays, the device's equivalent (``cupyx.scipy.special``) otherwise."""
    if isinstance(x, (np.ndarray, np.generic)):
        return host_special
    for module in _modules.values():
        if isinstance(x, module.xp.ndarray):
            special = getattr(module, "special", None)
            if special is None:  # the CuPy module may leave it out: CuPy keeps it in cupyx
                special = module.special = importlib.import_module("cupyx.scipy.special")
            return special
    return host_special


def model_scope(loaded_on: str | None, what: str):
    """The backend a model's public method runs under: a model whose weights were uploaded to device
    backend ``loaded_on`` runs there, whatever host backend is active (its weights live on that device);
    a model kept on the host runs under the active host backend.  Asking a model for another device
    than its own, or a host model for a device, is a ValueError naming both."""
    active = device_backend()
    if active == loaded_on:
        return contextlib.nullcontext()
    if loaded_on is None:
        raise ValueError(
            f"{what} was loaded with its weights on the host; the active backend {active!r} "
            f"computes on a device: load it under use_backend({active!r}) (or --backend {active})"
        )
    if active is not None:
        raise ValueError(
            f"{what} was loaded on backend {loaded_on!r}, not on the active {active!r}: load it "
            "again under the backend it should run on"
        )
    return use_backend(loaded_on, f"the backend {what} was loaded on")


def on_model_backend(method):
    """Decorate a public method of a model (an object with ``backend``: the device backend its weights
    were uploaded to, or None): it runs under ``model_scope``."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with model_scope(self.backend, type(self).__name__):
            return method(self, *args, **kwargs)

    return run


def iterate_on_model_backend(model, items):
    """Iterate ``items`` (a generator of the model's) with every step run under ``model_scope``: a
    ``with`` inside a generator would stay entered while the caller holds a chunk."""
    items = iter(items)
    while True:
        with model_scope(model.backend, type(model).__name__):
            try:
                item = next(items)
            except StopIteration:
                return
        yield item


# ----------------------------------------------------------------------------- primitives and their twins


def _twin_table(backend: str) -> dict:
    table = _twins.get(backend)
    if table is None:
        if backend in _ARRAY_MODULES:
            table = _twins[backend] = dict(device_module(backend).TWINS)
        else:
            table = _twins[backend] = dict(importlib.import_module(_TWIN_MODULES[backend]).TWINS)
    return table


def twin_of(name: str, backend: str):
    """The twin of primitive ``name`` in ``backend``, or None where the backend has none (or is numpy)."""
    if backend == "numpy":
        return None
    return _twin_table(backend).get(name)


def primitive(reference):
    """Mark a plain NumPy primitive: calls go to the active backend's twin of the same name, if any.
    On a device backend a call with a host array (the sampling arithmetic) runs the reference on the host."""
    name = reference.__name__

    @functools.wraps(reference)
    def dispatch(*args, **kwargs):
        backend, _ = active_backend()
        first = args[0] if args else None
        if backend == "auto":
            backend = "numba" if getattr(first, "dtype", None) == np.float32 else "numpy"
        elif backend in _ARRAY_MODULES and isinstance(first, np.ndarray):
            backend = "numpy"
        twin = twin_of(name, backend)
        return (twin or reference)(*args, **kwargs)

    dispatch.reference = reference
    return dispatch
