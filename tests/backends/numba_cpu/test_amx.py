"""The AMX tile core: the exact bf16 split and a prompt's products on the tiles (skipped without AMX)."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

from .cases import needs_tiles


def test_tile_split_is_exact():
    """x = hi + mid + lo exactly, each part a bfloat16 word in the tiles' pair layout (parts[p, k, n, j] is
    part p of x[n, 2 k + j], the padding rows zero), for values of every size, signed zeros and the
    smallest normal; an infinity keeps its sign and a NaN stays a NaN (in the hi part)."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, -3.14159, 1e-30, 1.17549435e-38, 3.4e38, -2.5e-12, 65504.123, np.inf, -np.inf, np.nan]
    x = np.concatenate([rng.standard_normal(52) * np.exp(rng.uniform(-40, 40, 52)), special]).astype(np.float32)
    x = np.stack([x, x[::-1], -x])  # 3 rows of 64 columns
    parts = np.empty((3, 32, 32, 2), np.uint16)
    numba_cpu.amx._split_into_pairs(x, parts)
    words = parts.transpose(0, 2, 1, 3).reshape(3, 32, 64)  # [p, n, i]
    values = (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert not values[:, 3:].any()  # the padding rows
    total = values[0, :3] + values[1, :3] + values[2, :3]
    finite = np.isfinite(x)
    np.testing.assert_array_equal(total[finite], x[finite].astype(np.float64))
    np.testing.assert_array_equal(total[np.isinf(x)], x[np.isinf(x)])
    assert np.isnan(total[np.isnan(x)]).all()


@needs_tiles
@pytest.mark.parametrize("N, O, I", [(17, 32, 32), (28, 64, 1024), (33, 96, 2080), (70, 32, 96), (28, 2048, 1024)])
def test_tile_kernel_within_the_bound_and_each_row_alone(N, O, I):
    """The AMX tile kernel (x in three exact bf16 parts, the sums in float32 tiles, ``TILE_K_SPAN`` columns
    at a time): within linear's reduction-length bound of the float64 product of the same bf16 words,
    for rows that fill no whole tile, several groups of 32 rows, several column spans (2080 > 1024); each
    row's bits the same computed alone or among the others in another order (no row's sum sees another)."""
    rng, bits, x, got = _product_within_the_bound(numba_cpu.amx._tile_bf16_times, N, O, I)
    alone = np.empty((1, O), np.float32)
    numba_cpu.amx._tile_bf16_times(np.ascontiguousarray(x[-1:]), bits, alone, 1)
    np.testing.assert_array_equal(alone[0], got[-1])
    order = rng.permutation(N)
    shuffled = np.empty((N, O), np.float32)
    numba_cpu.amx._tile_bf16_times(np.ascontiguousarray(x[order]), bits, shuffled, 2)
    np.testing.assert_array_equal(shuffled, got[order])


@needs_tiles
@pytest.mark.parametrize("N, O, I", [(1, 32, 32), (2, 64, 1024), (4, 96, 2080), (5, 2048, 1024), (11, 64, 3072)])
def test_few_rows_kernel_within_the_bound_and_each_row_alone(N, O, I):
    """The few rows' tile kernel (a step's or a batch's rows, the three parts of up to ``FEW_TILE_ROWS``
    rows side by side in one tile of x, each part summed apart, ``TILE_K_SPAN`` columns at a time): within
    linear's reduction-length bound of the float64 product of the same bf16 words, for one row, rows that
    fill part of a tile, several passes (11 rows), several spans (2080, 3072) and threads with no pair or
    an odd number of pairs of weight tiles; each row's bits the same computed alone, or among the others
    in another order; an infinity or a NaN gives the non-finite outputs of the float32 product."""
    rng, bits, x, got = _product_within_the_bound(numba_cpu.amx._tile_few_rows_times, N, O, I)
    for n in range(N):
        alone = np.full((1, O), np.nan, np.float32)
        numba_cpu.amx._tile_few_rows_times(np.ascontiguousarray(x[n : n + 1]), bits, alone, 1 + n % 2)
        np.testing.assert_array_equal(alone[0], got[n])
    order = rng.permutation(N)
    shuffled = np.empty((N, O), np.float32)
    numba_cpu.amx._tile_few_rows_times(np.ascontiguousarray(x[order]), bits, shuffled, 3)
    np.testing.assert_array_equal(shuffled, got[order])
    x[0, 0], x[-1, I // 2] = np.inf, np.nan
    numba_cpu.amx._tile_few_rows_times(x, bits, got, 2)
    ref = x @ np.asarray(BF16Matrix(bits)).T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


def _product_within_the_bound(kernel, N, O, I):
    """A tile kernel's product of N random rows and an O x I random bf16 matrix, asserted within linear's
    reduction-length bound of the float64 product of the same words; (rng, bits, x, the product)."""
    rng = np.random.default_rng(N + O + I)
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    x = rng.standard_normal((N, I)).astype(np.float32)
    got = np.full((N, O), np.nan, np.float32)
    kernel(x, bits, got, 2)
    w = np.asarray(BF16Matrix(bits), np.float64)
    exact = x.astype(np.float64) @ w.T
    bound = 2 * (I + 1) * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    assert np.all(np.abs(got - exact) <= bound)
    return rng, bits, x, got
