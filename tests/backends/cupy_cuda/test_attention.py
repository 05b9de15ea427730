"""The attention twin of the cupy backend (refimpl/backends/cupy_cuda/attention.py), checked without a GPU:

- kernels/attention.cu compiles with ``nvcc`` for float32 and float64 (skipped, saying so, where nvcc is
  not installed);
- the kernels' index arithmetic, replayed in NumPy thread by thread (tests/backends/cupy_cuda/replays.py), run
  through the twin's own launch code with NumPy in place of CuPy, equals ``nn.attention`` (window,
  grouped-query heads, padding, rows with no visible key; one block per row and the keys split over blocks);
- the formula path (longer prompts, explicit boolean masks) with NumPy as xp gives the reference's result.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import CASES, attention_case

from refimpl import nn
from refimpl.backends.cupy_cuda import attention as cuda_attention
from refimpl.backends.cupy_cuda.device import cuda_source

from .replays import needs_nvcc, numpy_in_place_of_cupy, nvcc_compile


@needs_nvcc
def test_attention_module_compiles_for_both_dtypes(tmp_path):
    # taking the address of each instance makes nvcc compile it, as CuPy's name_expressions make NVRTC do
    names = list(cuda_attention.ATTENTION_KERNELS.values()) + [
        n for pair in cuda_attention.ATTENTION_SPLIT_KERNELS.values() for n in pair
    ]
    keep = ", ".join(f"(void*)&{name}" for name in names)
    source = cuda_source(cuda_attention.CU_FILE)
    nvcc_compile(tmp_path, "attention", source + f"\nvoid* kernels_to_compile[] = {{{keep}}};\n")


@pytest.fixture
def numpy_as_xp(monkeypatch):
    """The attention room with NumPy in place of CuPy (NumPy arrays playing the device arrays), and the
    kernels replaced by their emulations."""
    numpy_in_place_of_cupy(monkeypatch.setattr)
    return cuda_attention


@pytest.mark.parametrize("split_keys", [None, 3], ids=["one block per row", "keys split over blocks"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_attention_kernel_equals_the_reference(numpy_as_xp, monkeypatch, case, dtype, split_keys):
    if split_keys:  # parts of 3 keys: several blocks per row, parts with no visible key among them
        monkeypatch.setattr(cuda_attention, "ATTENTION_SPLIT_KEYS", split_keys)
    q, k, v, mask = attention_case(len(case), dtype, **CASES[case])
    S = k.shape[2]
    assert (cuda_attention.attention_splits(q.shape[0] * q.shape[1] * q.shape[2], S)[0] > 1) == bool(split_keys)
    ref = nn.attention.reference(q, k, v, mask, scale=0.125)
    got = numpy_as_xp.attention_rows_kernel(q, k, v, mask, 0.125)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-13  # sums in another order only
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol)
    if case == "padded":
        assert np.all(got[-1] == 0) and np.any(got[0] != 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["causal", "window", "padded", "mqa_window_padded"])
def test_attention_formula_path_equals_the_reference(numpy_as_xp, case, dtype):
    q, k, v, mask = attention_case(7, dtype, **{**CASES[case], "Tq": 20, "S": 30})
    ref = nn.attention.reference(q, k, v, mask, scale=0.3)
    assert q.shape[2] > cuda_attention.DECODE_MAX_QUERIES  # the dispatcher takes the cuBLAS formula
    np.testing.assert_array_equal(numpy_as_xp.attention(q, k, v, mask, 0.3), ref)
    dense = mask.rows(0, q.shape[2])  # an explicit boolean mask
    np.testing.assert_array_equal(numpy_as_xp.attention(q, k, v, dense, 0.3), ref)


def test_attention_refuses_heads_that_do_not_share(numpy_as_xp):
    q, k, v, mask = attention_case(0, np.float32, H=4, G=3)
    with pytest.raises(ValueError, match="3 key/value heads"):
        numpy_as_xp.attention(q, k, v, mask, 0.5)
