"""The norm and rotation twins of the cupy backend (refimpl/backends/cupy_cuda/transformer.py), checked
without a GPU: kernels/rms_norm_and_rope.cu compiles with ``nvcc`` for float32 and float64 (skipped, saying
so, where nvcc is not installed), and the kernels' index arithmetic, replayed in NumPy
(tests/backends/cupy_cuda/replays.py), run through the twins' own launch code with NumPy in place of CuPy, equals
``nn.rms_norm`` (within its rounding) and ``nn.apply_rope`` (to the bit).
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import nn
from refimpl.backends.cupy_cuda import transformer as cuda_transformer
from refimpl.backends.cupy_cuda.device import cuda_source

from .replays import needs_nvcc, numpy_in_place_of_cupy, nvcc_compile


@needs_nvcc
def test_rows_module_compiles_for_both_dtypes(tmp_path):
    names = [name for pair in cuda_transformer.ROWS_KERNELS.values() for name in pair]
    keep = ", ".join(f"(void*)&{name}" for name in names)
    source = cuda_source(cuda_transformer.CU_FILE)
    nvcc_compile(tmp_path, "rows", source + f"\nvoid* kernels_to_compile[] = {{{keep}}};\n")


@pytest.fixture
def numpy_as_xp(monkeypatch):
    """The transformer room with NumPy in place of CuPy (NumPy arrays playing the device arrays), and the
    kernels replaced by their emulations."""
    numpy_in_place_of_cupy(monkeypatch.setattr)
    return cuda_transformer


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 9, 64), (3, 5, 8, 128), (2, 3, 1000), (1, 1, 20)])
def test_rms_norm_kernel_equals_the_reference(numpy_as_xp, shape, dtype):
    """The norm's kernel, replayed: rows of one warp, of several, longer than a block (each thread several
    values), shorter than a warp; within the reference's own rounding of a sum of C squares, against float64."""
    rng = np.random.default_rng(sum(shape))
    x, w = (rng.standard_normal(shape) * 3).astype(dtype), rng.standard_normal(shape[-1]).astype(dtype)
    got = numpy_as_xp.rms_norm(x, w, 1e-6)
    exact = nn.rms_norm.reference(x.astype(np.float64), w.astype(np.float64), 1e-6)
    ref = nn.rms_norm.reference(x, w, 1e-6)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    eps = np.finfo(dtype).eps
    bound = (shape[-1] + 4) * eps * np.abs(exact)  # (the sum's C terms, the root, the division and the product)
    assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
    assert numpy_as_xp.rms_norm(x, w.astype(np.float16), 1e-6).dtype == ref.dtype  # another dtype: the reference


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_kernel_equals_the_reference_to_the_bit(numpy_as_xp, dtype):
    """The rotation's kernel, replayed: x [B, H, T, D] read through a transpose (a layer's q), angles [T, D],
    [1, 1, T, D] and one set per batch [B, 1, T, D]: the reference's arithmetic, so the same bits; shapes the
    kernel does not take (angles that would broadcast over the heads, an odd D) run the reference."""
    rng = np.random.default_rng(5)
    x_bhtd = rng.standard_normal((2, 9, 4, 64)).astype(dtype).transpose(0, 2, 1, 3)
    positions = np.stack([np.arange(9), np.arange(3, 12)])
    cos_td, sin_td = nn.rope_cos_sin(positions[0], 64, 10000.0, dtype)
    both = [nn.rope_cos_sin(p, 64, 10000.0, dtype) for p in positions]
    cos_b1td, sin_b1td = (np.stack([pair[i] for pair in both])[:, None] for i in (0, 1))
    for cos, sin in ((cos_td, sin_td), (cos_td[None, None], sin_td[None, None]), (cos_b1td, sin_b1td)):
        assert numpy_as_xp._rope_batches(cos, 2, 9, 64) in (1, 2)
        got = numpy_as_xp.apply_rope(x_bhtd, cos, sin)
        np.testing.assert_array_equal(got, nn.apply_rope.reference(x_bhtd, cos, sin))
    assert numpy_as_xp._rope_batches(cos_b1td[:, 0], 2, 9, 64) is None  # [2, T, D] would pair with the heads
    odd = rng.standard_normal((1, 2, 3, 5)).astype(dtype)
    cos5, sin5 = rng.standard_normal((3, 5)).astype(dtype), rng.standard_normal((3, 5)).astype(dtype)
    np.testing.assert_array_equal(numpy_as_xp.apply_rope(odd, cos5, sin5), nn.apply_rope.reference(odd, cos5, sin5))
