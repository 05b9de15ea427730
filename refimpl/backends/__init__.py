"""The backend layer: which arrays the networks compute on, and faster twins of the primitives of
``refimpl.nn`` (same names, same signatures).

    backend  arrays                               what runs
    numpy    NumPy, on the host                   the plain primitives of refimpl/nn.py (the reference)
    numba    NumPy, on the host                   the CPU twins of refimpl/backends/numba_cpu/ where one
                                                  exists, else the reference
    cupy     CuPy, on a CUDA GPU                  the twins of refimpl/backends/cupy_cuda/ where one exists,
                                                  else the reference formulas, run by CuPy on device arrays

A primitive of ``refimpl.nn`` is marked ``@primitive``; at every call it looks up the twin of the
backend chosen for the call (``backend_for_call``) and runs it instead of its own body.  The stage modules
only ever call ``nn.<name>``, and create arrays through ``nn.zeros`` / ``nn.arange`` / ``nn.to_device`` ...,
so that the backend decides where they live (docs/backends.md).

Each backend is one ``Backend`` object of ``REGISTRY``: its name, the module that provides it, its array
module ``xp``, ``to_device`` / ``to_host``, its special functions, its twins and its availability.  A
backend module provides ``TWINS`` (primitive name -> twin: a module-level table, the one place a twin is
registered); a device backend's module also ``xp`` (its NumPy-like namespace), ``to_device(host)``,
``to_host(device array)``, ``special`` (its ``scipy.special``) and ``available()`` (raises
``BackendUnavailable`` naming what is missing); any backend module may provide ``prepare_weights(matrices)``,
its layouts of a model's weights started at the load, and ``prepare_kernels(helper, matrices)``, what it
readies at the start of a load (both called by ``prepare_load`` here).  Besides "cupy" there is
the test backend "strict" (``refimpl/backends/strict_device.py``): NumPy underneath, as strict as CuPy
about host round trips and results, so CI proves the device data flow without a GPU.  It is accepted
everywhere a backend name is, but not listed in ``BACKENDS`` (no user should pick it).

Which backend is active:
    1. ``with refimpl.use_backend("numba"): ...``      (innermost wins)
    2. the environment variable ``REFIMPL_BACKEND=numpy|numba|cupy``
    3. otherwise "auto" (``AUTO_RULE``, implemented by ``backend_for_call`` alone).

The numba backend is checked like a device backend (its module's ``available()``): with Numba's JIT turned
off (``NUMBA_DISABLE_JIT=1``, Numba's debugging switch) its kernels cannot run.  Asked for by name that is
one ``BackendUnavailable``; under "auto" the numpy reference runs for every dtype instead, with one warning
(``auto_fallback``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from .host_memory import recycled_outputs, workspace_of

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "BACKENDS",
    "prepare_load",
    "prepare_weights",
    "AUTO_RULE",
    "Backend",
    "REGISTRY",
    "BackendUnavailable",
    "backend",
    "backend_for_call",
    "primitive",
    "use_backend",
    "active_backend",
    "twin_of",
    "device_backend",
    "installed_backends",
    "array_module",
    "device_module",
    "special_module",
    "to_device",
    "to_host",
    "model_scope",
    "on_model_backend",
    "iterate_on_model_backend",
    "auto_fallback",
]

_ENV = "REFIMPL_BACKEND"

# The rule of "auto" (no backend asked for), in words; ``backend_for_call`` is its one implementation.
AUTO_RULE = "default: numba twins for float32 (and complex64), the numpy reference for float64"
FAST_DTYPES = (np.float32, np.complex64)  # the first arguments "auto" gives the numba twins


class BackendUnavailable(RuntimeError, ValueError):
    """A backend was asked for that cannot run here (its library is not installed, or no device).  A
    ValueError too: the argument names a backend this machine cannot run (the CLI reports it in one line)."""


class Backend:
    """One backend: its ``name``, the module that provides it (``module_name``; None for "numpy", whose
    primitives are the references themselves), whether its arrays live on a device (``on_device``),
    whether its module's ``available()`` must pass before it is used (``checked``: every device backend,
    and numba) and whether users are offered it (``offered``; the test stand-in is not).

    The module is imported on first use (``load``), so that importing refimpl never imports CuPy or
    Numba; a checked backend's module is kept only once its ``available()`` passed."""

    def __init__(
        self,
        name: str,
        module_name: str | None = None,
        *,
        on_device: bool = False,
        checked: bool = False,
        offered: bool = True,
    ):
        self.name = name
        self.module_name = module_name
        self.on_device = on_device
        self.checked = checked or on_device
        self.offered = offered
        self._module: ModuleType | None = None

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, {self.module_name!r}, on_device={self.on_device})"

    def load(self) -> Any:
        """The backend's module, imported (and for a checked backend, its ``available()`` passed): one
        ``BackendUnavailable`` naming what is missing otherwise (a ValueError naming the variable for a
        setting of the environment it cannot run with).  None for "numpy"."""
        if self._module is None and self.module_name is not None:
            try:
                module = importlib.import_module(self.module_name)
            except ImportError as e:
                raise BackendUnavailable(f"backend {self.name!r}: its module could not be imported ({e})") from None
            if self.checked:
                module.available()
            self._module = module
        return self._module

    def check(self) -> None:
        """``BackendUnavailable`` unless this backend can run here: a checked backend is loaded (a device
        backend needs its library and a device; numba, its JIT)."""
        if self.checked:
            self.load()

    @property
    def loaded(self) -> bool:
        return self._module is not None

    @property
    def xp(self) -> Any:
        """The NumPy-like namespace this backend's arrays are created with (numpy on the host)."""
        return self.load().xp if self.on_device else np

    @property
    def special(self) -> Any:
        """This backend's ``scipy.special`` (the device's own special functions on a device backend)."""
        return self.load().special if self.on_device else _host_special()

    def owns(self, x: object) -> bool:
        """True when ``x`` is an array of this (loaded) device backend."""
        return self.on_device and self._module is not None and isinstance(x, self._module.xp.ndarray)

    def to_device(self, x: Any) -> Any:
        """``x`` as an array of this backend: a host array (list, scalar) uploaded to a device backend (the one
        explicit host -> device copy), a device array of its own as it is; ``np.asarray`` on the host."""
        if not self.on_device:
            return np.asarray(x)
        module = self.load()
        return x if isinstance(x, module.xp.ndarray) else module.to_device(np.asarray(x))

    def to_host(self, x: Any) -> np.ndarray:
        """``x`` (an array of this backend) as a host ``numpy.ndarray`` (the one explicit device -> host copy)."""
        return self.load().to_host(x) if self.on_device else np.asarray(x)

    @functools.cached_property
    def twins(self) -> dict[str, Callable[..., Any]]:
        """{primitive name: twin}: the module's ``TWINS`` table (empty for "numpy")."""
        module = self.load()
        return {} if module is None else dict(module.TWINS)


REGISTRY = {
    b.name: b
    for b in (
        Backend("numpy"),
        Backend("numba", "refimpl.backends.numba_cpu", checked=True),
        Backend("cupy", "refimpl.backends.cupy_cuda", on_device=True),
        Backend("strict", "refimpl.backends.strict_device", on_device=True, offered=False),
    )
}
BACKENDS = tuple(name for name, b in REGISTRY.items() if b.offered)  # what users may choose
TEST_BACKENDS = tuple(name for name, b in REGISTRY.items() if not b.offered)  # accepted by name, never offered

_requested: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("refimpl_backend", default=None)


def backend(name: str) -> Backend:
    """The ``Backend`` named ``name``, checked: ValueError for an unknown name, ``BackendUnavailable`` for
    one that cannot run here."""
    return REGISTRY[_check_name(name, "backend")]


def _check_name(name: str, where: str) -> str:
    found = REGISTRY.get(name)
    if found is None:
        raise ValueError(f"{where}: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    found.check()  # BackendUnavailable now, with one message naming what is missing
    return name


def installed_backends() -> tuple[str, ...]:
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


def device_module(name: str) -> Any:
    """The module of device backend ``name``, after its ``available()`` check passed."""
    return REGISTRY[name].load()


def active_backend() -> tuple[str, str]:
    """(backend name or "auto", why): what the primitives use now ("auto" says so when the numba backend
    turned out unavailable and the numpy reference runs instead: ``auto_fallback``)."""
    requested = _requested.get()
    if requested is not None:
        return requested
    env = os.environ.get(_ENV, "").strip()
    if env:
        return _check_name(env, f"environment variable {_ENV}"), f"environment variable {_ENV}"
    return "auto", AUTO_RULE if not _auto_fast.get(
        "why"
    ) else f"the numpy reference for every dtype: {_auto_fast['why']}"


# "auto"'s backend for float32: numba, unless it is unavailable ({"name": ..., "why": ...} once decided)
_auto_fast: dict[str, str] = {}


def auto_fallback() -> str:
    """The backend "auto" runs float32 calls on: "numba", or "numpy" when the numba backend is unavailable
    (``BackendUnavailable``: Numba's JIT turned off, Numba missing), said once in a ``RuntimeWarning``.  A
    Numba setting it cannot run with (a ValueError naming the variable) is raised, not fallen back from."""
    if "name" not in _auto_fast:
        try:
            REGISTRY["numba"].check()
            _auto_fast.update(name="numba", why="")
        except BackendUnavailable as e:
            _auto_fast.update(name="numpy", why=str(e))
            warnings.warn(f"{e}; the numpy reference runs instead (slower)", RuntimeWarning, stacklevel=3)
    return _auto_fast["name"]


def device_backend() -> str | None:
    """The active backend's name when it keeps arrays on a device ("cupy", "strict"), else None."""
    name = active_backend()[0]
    return name if name != "auto" and REGISTRY[name].on_device else None


@contextlib.contextmanager
def use_backend(name: str, reason: str = "refimpl.use_backend()") -> Iterator[str]:
    """Run the enclosed code with the primitives of backend ``name`` ("numpy", "numba" or "cupy");
    ``reason`` is what ``active_backend`` reports as the cause.  A device backend that cannot run here
    raises ``BackendUnavailable`` on entry."""
    token = _requested.set((_check_name(name, "use_backend"), reason))
    try:
        yield name
    finally:
        _requested.reset(token)


# ----------------------------------------------------------------------------- arrays of the active backend


def _active() -> Backend:
    """The backend whose arrays are created now: the active device backend, else "numpy" (host arrays)."""
    name = device_backend()
    return REGISTRY["numpy" if name is None else name]


def array_module() -> Any:
    """The NumPy-like namespace arrays are created with now: ``numpy`` on the host backends, the
    device backend's ``xp`` (``cupy``) on a device backend."""
    return _active().xp


def to_device(x: Any) -> Any:
    """``x`` as an array of the active backend: a host array (or list, scalar) is uploaded to a device
    backend (the one explicit host -> device copy); a device array is returned as it is.  On the host
    backends this is ``np.asarray``."""
    return _active().to_device(x)


def _owner(x: object) -> Backend | None:
    """The loaded device backend whose array ``x`` is, or None."""
    for b in REGISTRY.values():
        if b.owns(x):
            return b
    return None


def to_host(x: Any) -> np.ndarray:
    """``x`` as a host ``numpy.ndarray``: a device array of a loaded device backend is copied down (the
    one explicit device -> host copy); anything else goes through ``np.asarray``."""
    if isinstance(x, np.ndarray):
        return x
    owner = _owner(x)
    return np.asarray(x) if owner is None else owner.to_host(x)


def special_module(x: object) -> Any:
    """``scipy.special`` for host arrays, the special functions of the device backend that owns ``x``
    (``cupyx.scipy.special``) otherwise."""
    if isinstance(x, (np.ndarray, np.generic)):
        return _host_special()
    owner = _owner(x)
    return _host_special() if owner is None else owner.special


def _host_special() -> Any:
    """``scipy.special``, imported at its first use, not by ``import refimpl`` (a codec or a speaker encoder
    alone never needs it; the numba backend imports it ahead of a model's first audio: ``cached_kernels``)."""
    from scipy import special

    return special


def model_scope(loaded_on: str | None, what: str) -> contextlib.AbstractContextManager[object]:
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


def on_model_backend(method: F) -> F:
    """Decorate a public method of a model (an object with ``backend``: the device backend its weights
    were uploaded to, or None): it runs under ``model_scope``, its big host outputs taken from the model's
    workspace (``refimpl/backends/host_memory.py``)."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with model_scope(self.backend, type(self).__name__), recycled_outputs(workspace_of(self)):
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]  # functools.wraps: the same signature as ``method``


def iterate_on_model_backend(model: Any, items: Iterable[T]) -> Iterator[T]:
    """Iterate ``items`` (a generator of the model's) with every step run under ``model_scope``: a
    ``with`` inside a generator would stay entered while the caller holds a chunk."""
    items = iter(items)
    while True:
        with model_scope(model.backend, type(model).__name__), recycled_outputs(workspace_of(model)):
            try:
                item = next(items)
            except StopIteration:
                return
        yield item


# ----------------------------------------------------------------------------- primitives and their twins


def backend_for_call(requested: str, first: object) -> str:
    """The backend whose twin runs one primitive call, from the requested backend (``active_backend``) and
    the call's first argument.  The one place that decides it:

    - "auto" (``AUTO_RULE``): a float32 first argument (or complex64, a float32 spectrum) runs the numba
      twins (the fast everyday mode; the numpy reference where numba cannot run: ``auto_fallback``);
      anything else (float64: the oracle mode) the numpy reference, so that the oracle mode stays the
      plain formulas unless a backend is asked for;
    - a device backend given a host ``numpy.ndarray`` (the sampling arithmetic on a downloaded row) runs
      the numpy reference on the host;
    - otherwise the requested backend."""
    if requested == "auto":
        if getattr(first, "dtype", None) not in FAST_DTYPES:
            return "numpy"
        return _auto_fast.get("name") or auto_fallback()
    if isinstance(first, np.ndarray) and REGISTRY[requested].on_device:
        return "numpy"
    return requested


def prepare_weights(matrices: list, dtype: Any) -> None:
    """Hand a model's read-only weights, just loaded, to the backend that will run its ``dtype`` calls
    (``backend_for_call``), so that it may prepare its layouts of them ahead of their first use (a backend
    module's optional ``prepare_weights(matrices)``: the numba backend packs the code predictor's words in a
    thread).  Nothing for the other backends."""
    prepare = getattr(_module_for_calls(dtype), "prepare_weights", None)
    if prepare is not None:
        prepare(matrices)


def prepare_load(dtype: Any, matrices: list, helper: list[str] | None = None) -> None:
    """What a model's load tells the backend that will run its ``dtype`` calls (``backend_for_call``), once its
    files are mapped: that a load has started (a backend module's optional ``prepare_kernels(helper,
    matrices)``: the numba backend loads the first audio's kernels from its cache in a thread, and on a first
    run starts ``helper``, the command of a process that compiles some of them by running the model), and its
    read-only ``matrices`` to prepare layouts of ahead of their first use (``prepare_weights``).  The backend's
    module is imported here, in the caller's thread (two threads importing Numba's modules at once can each
    see the other's half made)."""
    prepare = getattr(_module_for_calls(dtype), "prepare_kernels", None)
    if prepare is not None:
        prepare(helper, matrices)
    prepare_weights(matrices, dtype)


def _module_for_calls(dtype: Any) -> Any:
    """The module of the backend that will run the ``dtype`` calls of a model loaded now."""
    return REGISTRY[backend_for_call(active_backend()[0], np.empty(0, dtype))].load()


def twin_of(name: str, backend_name: str) -> Callable[..., Any] | None:
    """The twin of primitive ``name`` in backend ``backend_name``, or None where it has none (or is numpy)."""
    return REGISTRY[backend_name].twins.get(name)


def primitive(reference: F) -> F:
    """Mark a primitive: a call runs the twin of the same name of the backend ``backend_for_call`` chooses,
    or the reference where that backend has no twin of it, or where the twin returns ``NotImplemented`` (a
    dtype, shape or layout it has no kernel for: a twin checks its own eligibility).  The plain function
    stays reachable as ``.reference``.

    A primitive is either a formula of ``refimpl/nn.py`` (its first argument an array) or a whole stage whose
    body is its recorded formula (a parameter named ``record``: ``transformer_stack``, the codec's residual
    unit...), which a backend may run as one fused twin.  The one rule for stages: while its ``record``
    records, the reference runs (a twin records nothing); the backend is chosen from the stage's first array
    argument (its input: the weights and settings before it have no dtype).  A stage twin has the stage's
    signature but for ``record``'s default, None (it never receives a recorder that records)."""
    name = reference.__name__
    parameters = list(inspect.signature(reference).parameters)
    if "record" in parameters:
        return _stage_primitive(reference, name, parameters.index("record"))

    @functools.wraps(reference)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        chosen = backend_for_call(active_backend()[0], args[0] if args else None)
        twin = REGISTRY[chosen].twins.get(name)
        if twin is not None:
            result = twin(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return reference(*args, **kwargs)

    dispatch.reference = reference  # type: ignore[attr-defined]
    return dispatch  # type: ignore[return-value]  # functools.wraps: the same signature as ``reference``


def _stage_primitive(reference: F, name: str, record_at: int) -> F:
    """``primitive`` for a stage (a ``record`` parameter at position ``record_at``): the reference while the
    call records, else the twin of the backend its first array argument chooses."""

    @functools.wraps(reference)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        record = args[record_at] if len(args) > record_at else kwargs.get("record")
        if not getattr(record, "enabled", False):
            first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")), None)
            twin = REGISTRY[backend_for_call(active_backend()[0], first)].twins.get(name)
            if twin is not None:
                result = twin(*args, **kwargs)
                if result is not NotImplemented:
                    return result
        return reference(*args, **kwargs)

    dispatch.reference = reference  # type: ignore[attr-defined]
    return dispatch  # type: ignore[return-value]  # functools.wraps: the same signature as ``reference``
