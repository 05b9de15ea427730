"""``BF16Matrix``: bfloat16 words widened exactly where they are used (``refimpl/backends/bf16.py``)."""

from __future__ import annotations

import numpy as np

from refimpl import nn
from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits


def test_bf16_matrix_widens_exactly_where_used():
    bits = float32_to_bf16_bits(np.array([[1.5, -2.0, 3.140625], [0.0, 1e-3, 65280.0]], np.float32))
    m = BF16Matrix(bits)
    wide = np.asarray(m)
    assert wide.dtype == np.float32 and wide.tolist() == [[1.5, -2.0, 3.140625], [0.0, wide[1, 1], 65280.0]]
    np.testing.assert_array_equal(m[[1, 0]], wide[[1, 0]])
    np.testing.assert_array_equal(m.T, wide.T)
    assert m.astype(np.float32, copy=False) is m
    x = np.array([[0.5, 2.0, -1.0]], np.float32)
    np.testing.assert_array_equal(nn.linear.reference(x, m), x @ wide.T)
