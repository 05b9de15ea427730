"""The linear twin of the cupy backend (refimpl/backends/cupy_cuda/linear.py), checked without a GPU:

- kernels/bf16_rows_times.cu compiles with ``nvcc`` (skipped, saying so, where nvcc is not installed);
- the bf16 kernel's index arithmetic, replayed in NumPy (tests/backends/cupy_cuda/replays.py), run through the
  twin's own launch code with NumPy in place of CuPy, equals ``nn.linear``; a matrix whose words are still on
  the host, or a weight that is no array, is refused;
- the twins that are the reference's formula with ``xp`` for ``numpy`` (``linear`` with float weights, and
  ``conv1d`` of refimpl/backends/cupy_cuda/conv.py) give the reference's result when ``xp`` is NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import nn
from refimpl.backends.cupy_cuda import conv as cuda_conv
from refimpl.backends.cupy_cuda import device as cuda_device
from refimpl.backends.cupy_cuda import linear as cuda_linear
from refimpl.backends.cupy_cuda.device import cuda_source

from .replays import needs_nvcc, numpy_in_place_of_cupy, nvcc_compile


@needs_nvcc
def test_bf16_module_compiles(tmp_path):
    nvcc_compile(tmp_path, "bf16", cuda_source(cuda_linear.CU_FILE))


@pytest.fixture
def numpy_as_xp(monkeypatch):
    """The linear room with NumPy in place of CuPy (NumPy arrays playing the device arrays), and the
    kernel replaced by its emulation."""
    numpy_in_place_of_cupy(monkeypatch.setattr)
    return cuda_linear


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_formula_twins_equal_the_reference_with_numpy_as_xp(numpy_as_xp, dtype):
    rng = np.random.default_rng(3)
    r = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    x_btc, w_oi, b_o = r(2, 5, 8), r(6, 8), r(6)
    np.testing.assert_array_equal(numpy_as_xp.linear(x_btc, w_oi, b_o), nn.linear.reference(x_btc, w_oi, b_o))
    for groups, (C, O, I) in {1: (4, 6, 4), 2: (4, 6, 2), 4: (4, 4, 1)}.items():  # dense, grouped, depthwise
        x, wk, bias = r(2, C, 12), r(O, I, 3), r(O)
        got = cuda_conv.conv1d(x, wk, bias, 2, 2, groups)
        np.testing.assert_allclose(
            got,
            nn.conv1d.reference(x, wk, bias, 2, 2, groups),
            rtol=1e-5 if dtype == np.float32 else 1e-13,
            err_msg=f"conv1d groups={groups}",
        )


@pytest.mark.parametrize("rows", [1, 3, 17])  # the kernel up to MATVEC_MAX_ROWS = 16, then widen + cuBLAS
def test_bf16_linear_equals_the_reference(numpy_as_xp, rows):
    from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

    rng = np.random.default_rng(rows)
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((11, 70)).astype(np.float32)))
    x, b = rng.standard_normal((rows, 70)).astype(np.float32), rng.standard_normal(11).astype(np.float32)
    ref = nn.linear.reference(x, np.asarray(w), b)
    got = numpy_as_xp.linear(x, w, b)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(numpy_as_xp.widen_bf16(w.bits), np.asarray(w))  # widening is exact
    assert numpy_as_xp.bf16_rows_times(x[:0], w.bits).shape == (0, 11)


def test_linear_refuses_host_bf16_words_and_non_arrays(monkeypatch):
    from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

    monkeypatch.setattr(cuda_device, "array_module", lambda: np)
    w = BF16Matrix(float32_to_bf16_bits(np.ones((3, 4), np.float32)))
    with pytest.raises(TypeError, match="still on the host"):
        cuda_linear.linear(np.ones((2, 4), np.float32), w)
    with pytest.raises(TypeError, match="as an array on the device, got list"):
        cuda_linear.linear(np.ones((2, 4), np.float32), [[1.0] * 4])
