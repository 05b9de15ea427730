"""The backend switch: which backend a primitive's call runs on (``refimpl/backends/__init__.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu


def _calls(monkeypatch):
    """Record which implementation of conv1d runs."""
    seen = []
    monkeypatch.setitem(
        kernels.REGISTRY["numba"].twins, "conv1d", lambda *a, **k: seen.append("twin") or numba_cpu.conv.conv1d(*a, **k)
    )
    return seen


def test_auto_uses_twins_for_float32_and_the_reference_for_float64(monkeypatch):
    monkeypatch.delenv("REFIMPL_BACKEND", raising=False)
    seen = _calls(monkeypatch)
    w = np.ones((1, 1, 1))
    assert kernels.active_backend()[0] == "auto"
    nn.conv1d(np.ones((1, 1, 4), np.float64), w)
    assert seen == []
    nn.conv1d(np.ones((1, 1, 4), np.float32), w.astype(np.float32))
    assert seen == ["twin"]
    for dtype, chosen in ((np.complex64, "numba"), (np.complex128, "numpy"), (np.float64, "numpy")):
        assert kernels.backend_for_call("auto", np.ones(2, dtype)) == chosen  # (a float32 spectrum: the twins)


def test_use_backend_and_the_environment_choose(monkeypatch):
    seen = _calls(monkeypatch)
    x, w = np.ones((1, 1, 4), np.float32), np.ones((1, 1, 1), np.float32)
    with kernels.use_backend("numpy"):
        assert kernels.active_backend() == ("numpy", "refimpl.use_backend()")
        nn.conv1d(x, w)
    assert seen == []
    monkeypatch.setenv("REFIMPL_BACKEND", "numba")
    assert kernels.active_backend()[0] == "numba"
    nn.conv1d(x.astype(np.float64), w.astype(np.float64))  # an explicit backend serves float64 too
    assert seen == ["twin"]
    with kernels.use_backend("numpy"):  # the context manager wins over the environment
        nn.conv1d(x, w)
    assert seen == ["twin"]


def test_unknown_backends_are_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'cuda'.*numpy, numba"), kernels.use_backend("cuda"):
        pass
    monkeypatch.setenv("REFIMPL_BACKEND", "fast")
    with pytest.raises(ValueError, match="REFIMPL_BACKEND: unknown backend 'fast'"):
        nn.silu(np.zeros(3))
