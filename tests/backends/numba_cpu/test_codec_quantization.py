"""The twin of the quantizer's nearest rows against its reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.backends import numba_cpu
from refimpl.codec import quantization


@settings(max_examples=60, deadline=None)
@given(
    N=st.integers(1, 40), K=st.integers(2, 300), D=st.integers(1, 20), ties=st.booleans(), seed=st.integers(0, 2**31)
)
def test_nearest_rows_twin_is_the_reference_bit_for_bit(N, K, D, ties, seed):
    """The quantizer's choice and margin without a partition: the same indices and margins, bit for bit,
    duplicated codebook rows (ties: the lowest index, a margin of 0) included; a NaN goes to the reference."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    e = rng.standard_normal((K, D)).astype(np.float32)
    if ties:
        e[K // 2] = e[0]
        x[0] = e[0]
    got, ref = numba_cpu.codec_quantization.nearest_rows(x, e), quantization.nearest_rows.reference(x, e)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[0].dtype == np.int64 and got[1].dtype == np.float32
    x[-1, 0] = np.nan
    assert numba_cpu.codec_quantization.nearest_rows(x, e) is NotImplemented
