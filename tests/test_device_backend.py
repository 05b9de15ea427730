"""The device-array backend layer, proven on the CPU.

CI has no GPU, so the data flow of the CuPy backend is checked with ``refimpl/kernels/strict_device.py``:
a NumPy-backed device array library at least as strict as CuPy (every implicit host round trip raises).

1. the stand-in itself refuses what it claims to refuse (each refusal tested) and counts transfers;
2. asking for "cupy" without CuPy, or without a GPU, is one clear error;
3. the whole pipeline under the strict backend equals the numpy backend bit for bit (NumPy underneath),
   with no implicit host conversion and a bounded number of explicit host syncs per generated frame;
4. a model remembers the backend it was loaded on;
5. the stage modules create no arrays with NumPy and call no scipy in their compute paths (an AST check).
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from refimpl import kernels, nn
from refimpl.kernels import BackendUnavailable, strict_device, use_backend
from refimpl.kernels.strict_device import StrictArray, to_device, to_host, xp

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- 1. the stand-in


@pytest.fixture
def a():
    return to_device(np.arange(6, dtype=np.float32).reshape(2, 3))


def test_implicit_conversion_to_the_host_is_refused(a):
    for convert in (np.asarray, np.array, lambda x: x.__array__(), np.ascontiguousarray):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(a)
    with pytest.raises(TypeError, match="Python index"):
        [0, 1, 2][a[0, 0].astype(np.int64)]


def test_mixing_with_host_arrays_is_refused(a):
    host = np.ones(3, dtype=np.float32)
    for mix in (lambda: a + host, lambda: host + a, lambda: a * host, lambda: np.maximum(a, host),
                lambda: np.where(a > 1, a, host), lambda: np.concatenate([a, host[None]]),
                lambda: np.matmul(a, host)):
        with pytest.raises(TypeError, match="host numpy.ndarray"):
            mix()


def test_host_indices_values_and_uploads_through_asarray_are_refused(a):
    with pytest.raises(TypeError, match="cannot index a device array"):
        a[np.array([0, 1])]
    with pytest.raises(TypeError, match="not allowed on a device array"):
        a[[0, 1]]
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        a[0] = np.zeros(3, dtype=np.float32)
    with pytest.raises(TypeError, match="through to_device"):
        xp.asarray(np.zeros(3))
    with pytest.raises(TypeError, match="already on the device"):
        to_device(a)
    with pytest.raises(TypeError, match="expects a StrictArray"):
        to_host(np.zeros(3))


def test_functions_cupy_lacks_are_refused(a):
    with pytest.raises(TypeError, match="put_along_axis is not in the CuPy functions"):
        np.put_along_axis(a, to_device(np.zeros((2, 1), dtype=np.int64)), 0.0, axis=1)
    with pytest.raises(TypeError, match="not a ufunc CuPy implements"):
        np.spacing(a)
    with pytest.raises(AttributeError, match="no 'fft'"):
        xp.fft
    assert "put_along_axis" not in strict_device.CUPY_FUNCTIONS


def test_what_is_allowed_computes_what_numpy_computes_and_counts_transfers(a):
    strict_device.reset_transfers()
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = a * np.float32(2) + 1                      # NumPy and Python scalars mix freely
    b[:, 1] += a[:, 2]                             # views and in-place updates write through
    b[to_device(np.array([True, False]))] = 0      # boolean device masks index
    expected = host * 2 + 1
    expected[:, 1] += host[:, 2]
    expected[[True, False]] = 0
    total = np.sum(np.exp(b), axis=None)           # a reduction is a 0-d device array, like CuPy's
    assert isinstance(total, StrictArray) and total.shape == ()
    assert np.array_equal(to_host(b), expected)
    assert float(total) == float(np.sum(np.exp(expected)))
    assert to_host(xp.special.erf(a)).dtype == np.float32
    assert strict_device.transfers == {"to_device": 1, "to_host": 2, "sync": 1}
    assert bool(a.max() > 4) and a.shape == (2, 3) and a.T.shape == (3, 2)
    assert strict_device.transfers["sync"] == 2


# ----------------------------------------------------------------------------- 2. cupy without CuPy / without a GPU


@pytest.fixture
def no_loaded_cupy(monkeypatch):
    """Forget any loaded CuPy backend for the duration of a test."""
    monkeypatch.setattr(kernels, "_modules", {k: v for k, v in kernels._modules.items() if k != "cupy"})
    monkeypatch.setattr(kernels, "_twins", {k: v for k, v in kernels._twins.items() if k != "cupy"})


def test_cupy_without_cupy_is_one_clear_error(monkeypatch, no_loaded_cupy):
    monkeypatch.setitem(sys.modules, "cupy", None)     # "import cupy" now fails, as where it is not installed
    for ask in (lambda: use_backend("cupy").__enter__(),
                lambda: (monkeypatch.setenv("REFIMPL_BACKEND", "cupy"), kernels.active_backend())):
        with pytest.raises(BackendUnavailable, match=r"CuPy is not installed.*\[cuda12\].*\[cuda13\]"):
            ask()
    monkeypatch.delenv("REFIMPL_BACKEND")
    assert "cupy" not in kernels.installed_backends()
    assert kernels.active_backend()[0] == "auto"


def test_cupy_without_a_gpu_is_one_clear_error(monkeypatch, no_loaded_cupy):
    fake = types.ModuleType("cupy")                    # CuPy installed, the CUDA runtime sees no device
    fake.__version__ = "0.0-test"

    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device),
                                      is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(BackendUnavailable, match=r"(?i)cupy.*installed.*CUDA.*device"):
        with use_backend("cupy"):
            pass
    assert issubclass(BackendUnavailable, RuntimeError)
