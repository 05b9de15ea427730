"""PLACEHOLDER for the CuPy backend module (written in full on the ``cupykern`` branch, which replaces
this file): only the interface the backend layer needs, so that asking for "cupy" without CuPy or
without a GPU gives its one clear error.  No twins here."""

from __future__ import annotations

import numpy as np

from . import BackendUnavailable

TWINS: dict = {}
INSTALL_HINT = ("pip install 'qwen3-tts-refimpl[cuda12]' for a CUDA 12 driver, or "
                "'qwen3-tts-refimpl[cuda13]' for a CUDA 13 driver")


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendUnavailable(f"backend 'cupy': CuPy is not installed; {INSTALL_HINT}") from e
    return cupy


def available() -> None:
    cupy = _import_cupy()
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("the CUDA runtime reports 0 devices")
    except Exception as e:
        raise BackendUnavailable(f"backend 'cupy': CuPy {cupy.__version__} is installed but found no usable CUDA "
                                 f"device: {type(e).__name__}: {e}") from e


def __getattr__(name):
    if name == "xp":
        available()
        return _import_cupy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_device(host_array):
    return __getattr__("xp").asarray(host_array)


def to_host(device_array) -> np.ndarray:
    return device_array.get()
