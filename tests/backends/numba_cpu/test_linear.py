"""The twin of ``nn.linear``: each of its kernels (matrix-vector, block, tiles, widened for BLAS, a few float32
rows) against the reference, within the bound of the summation order."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

from .cases import needs_tiles


@st.composite
def linear_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    O, I = draw(st.integers(1, 70)), draw(st.one_of(st.integers(1, 300), st.sampled_from((1024, 1500, 2100))))
    # <= 16 rows: the matrix-vector kernel; <= 64: the block kernel (remainders of its 4 x 6 register block, sums in
    # spans of BLOCK_I_SPAN columns: 1500 and 2100 end in a partial span); more: BLAS
    rows = draw(st.sampled_from(((1,), (3,), (2, 8), (17,), (18,), (19,), (20,), (31,), (64,), (3, 40), (65,))))
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32)))
    x = rng.standard_normal(rows + (I,)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if draw(st.booleans()) else None
    return x, w, b


@settings(max_examples=80, deadline=None)
@given(linear_case())
def test_linear_twin_reads_bf16_weights_as_stored(case):
    x, w, b = case
    wide = np.asarray(w)  # the exact float32 values of the bfloat16 words
    ref = nn.linear.reference(x, wide, b)
    got = numba_cpu.linear.linear(x, w, b)
    assert got.shape == ref.shape == x.shape[:-1] + (w.shape[0],) and got.dtype == np.float32
    n = w.shape[1]
    abs_sum = np.abs(x.astype(np.float64)) @ np.abs(wide.astype(np.float64)).T + (np.abs(b) if b is not None else 0)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (n + 1) * np.finfo(np.float32).eps * abs_sum)


@needs_tiles
def test_linear_takes_the_tiles_for_a_prompt_and_keeps_infinities():
    """``linear`` on bf16 words takes the few rows' tile kernel up to 16 rows where the shapes fit (a step's
    head, one text or a batch: its bits), the prompt's from 17 (its bits), the block kernel for 17 rows of
    a shape that does not (O = 40), BLAS's widened blocks no more for 100 rows; an infinity or a NaN in x
    gives the non-finite outputs of the float32 product."""
    rng = np.random.default_rng(7)
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((64, 96)).astype(np.float32)))
    for rows in (1, 4, 16):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        few = np.empty((rows, 64), np.float32)
        numba_cpu.amx._tile_few_rows_times(x, w.bits, few, numba.get_num_threads())
        np.testing.assert_array_equal(numba_cpu.linear.linear(x, w), few)
    for rows in (17, 100):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        tiles = np.empty((rows, 64), np.float32)
        numba_cpu.amx._tile_bf16_times(x, w.bits, tiles, numba.get_num_threads())
        np.testing.assert_array_equal(numba_cpu.linear.linear(x, w), tiles)
    odd = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((40, 96)).astype(np.float32)))
    x = rng.standard_normal((17, 96)).astype(np.float32)
    block = np.empty((17, 40), np.float32)
    numba_cpu.linear._bf16_block_times(x, odd.bits, block, numba.get_num_threads())
    np.testing.assert_array_equal(numba_cpu.linear.linear(x, odd), block)
    x = rng.standard_normal((20, 96)).astype(np.float32)
    x[3, 5], x[8, 0], x[11, 95] = np.inf, -np.inf, np.nan
    got, ref = numba_cpu.linear.linear(x, w), nn.linear.reference(x, np.asarray(w))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    np.testing.assert_array_equal(np.sign(got[np.isinf(ref)]), np.sign(ref[np.isinf(ref)]))


@needs_tiles
def test_the_fused_step_takes_the_tiles_from_a_few_new_positions():
    """The fused step's products (``_products_into``) run on the tiles where granted and the shapes fit: the
    prompt's kernel from ``TILES_MIN_ROWS`` new positions, the few rows' kernel for fewer and for a batch's
    step (one position a row, several rows: each row's bits as alone); without the tiles, on the
    matrix-vector kernels (a batch's rows with the bits of each alone)."""
    rng = np.random.default_rng(11)
    bits = float32_to_bf16_bits(rng.standard_normal((64, 96)).astype(np.float32))
    first = numba_cpu.linear.TILES_MIN_ROWS
    prompt, few = numba_cpu.amx._tile_bf16_times, numba_cpu.amx._tile_few_rows_times

    def rows_kernel(x, bits, out, n_threads):
        numba_cpu.linear._bf16_rows_times(x, bits, out)

    for rows, tiles, kernel in ((first, True, prompt), (16, True, prompt), (first - 1, True, few), (1, True, few),
                                (first, False, rows_kernel)):  # fmt: skip
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        got, expect = np.empty((rows, 64), np.float32), np.empty((rows, 64), np.float32)
        numba_cpu.linear._products_into(x, bits, got, 2, rows, tiles)
        kernel(x, bits, expect, 2)
        np.testing.assert_array_equal(got, expect)
    x = rng.standard_normal((8, 96)).astype(np.float32)  # a batch of 8 texts' step: one position each
    for tiles in (True, False):
        got, alone = np.empty((8, 64), np.float32), np.empty((1, 64), np.float32)
        numba_cpu.linear._products_into(x, bits, got, 2, 1, tiles)
        for n in range(8):
            numba_cpu.linear._products_into(np.ascontiguousarray(x[n : n + 1]), bits, alone, 2, 1, tiles)
            np.testing.assert_array_equal(got[n], alone[0])
        if not tiles:
            numba_cpu.linear._matvec_bf16_into(x[7], bits, alone[0])
            np.testing.assert_array_equal(got[7], alone[0])


def _block_times(x, bits, registers=None):
    out = np.full((x.shape[0], bits.shape[0]), np.nan, np.float32)
    if registers is None:
        numba_cpu.linear._bf16_block_times(x, bits, out, 2)
    else:
        numba_cpu.linear._bf16_block_times(x, bits, out, 2, registers)
    return out


@pytest.mark.parametrize("I", [1024, 1040, 1001, 2100])
@pytest.mark.parametrize("shift", [0, 1, 4, 8])
def test_block_kernel_gives_the_same_bits_wherever_its_rows_start(I, shift):
    """The block kernel multiplies rows starting on 64-byte boundaries: x where its rows do (I a multiple of
    16 floats, the start aligned), else a copy whose rows do; its widened buffer always.  Any start of x
    (shifted by 4 to 32 bytes: the 16- and 32-byte starts of NumPy's and Numba's arrays) gives the bits of
    the aligned x, and those are within the bound of the float64 product.  Each row has the same bits
    whether the kernel takes the rows four at a time or one at a time, and alone (a batch's prompt row and
    its text's)."""
    rng = np.random.default_rng(I + shift)
    N, O = 29, 40
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    x = rng.standard_normal((N, I)).astype(np.float32)
    aligned = numba_cpu.intrinsics._line_aligned_rows(x)
    assert aligned.ctypes.data % 64 == 0 and aligned.strides[0] % 64 == 0
    np.testing.assert_array_equal(aligned[:, :I], x)
    store = np.empty(N * I + 64, np.float32)
    first = shift + (-store.ctypes.data // 4) % 16  # x's start: shift floats past a 64-byte boundary
    shifted = store[first : first + N * I].reshape(N, I)
    shifted[:] = x
    assert shifted.ctypes.data % 64 == 4 * shift
    expected = np.empty((N, O), np.float32)
    numba_cpu.linear._bf16_block_times(aligned[:, :I] if I % 16 == 0 else x, bits, expected, 2)
    got = np.empty((N, O), np.float32)
    numba_cpu.linear._bf16_block_times(shifted, bits, got, 2)
    np.testing.assert_array_equal(got, expected)
    for registers in (16, 32):  # rows one at a time (AVX2's registers) or four (AVX-512's): the same bits
        np.testing.assert_array_equal(got, _block_times(x, bits, registers))
    for n in (0, N - 1):  # a row alone (the remainder's way) has the bits it has among the others
        np.testing.assert_array_equal(got[n], _block_times(x[n : n + 1], bits)[0])
    wide = np.asarray(BF16Matrix(bits), dtype=np.float64)
    exact, abs_sum = x.astype(np.float64) @ wide.T, np.abs(x.astype(np.float64)) @ np.abs(wide).T
    assert np.all(np.abs(got - exact) <= 2 * (I + 1) * np.finfo(np.float32).eps * abs_sum)
    assert numba_cpu.intrinsics._line_aligned_empty(3, 5).ctypes.data % 64 == 0


@settings(max_examples=40, deadline=None)
@given(
    shape=st.sampled_from(((2,), (3,), (1, 2), (2, 4), (8,), (1, 1), (9,), (1, 3, 3))),
    O=st.integers(1, 70),
    I=st.integers(1, 70),
    with_bias=st.booleans(),
    n_threads=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_float32_linear_of_a_few_rows_reads_each_weight_row_once(shape, O, I, with_bias, n_threads, seed):
    """Float32 weights and 2 to 8 rows of x (a big weight: here every size): each output within the bound of
    a sum of I products of the reference's, the same bits whether the weight's rows are shared out over the
    piece threads or all taken by the caller's (a weight below ``F32_FEW_ROWS_SHARED_MIN_BYTES``); 1 row or
    more than 8 stay BLAS's (the reference, bit for bit)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape, I)).astype(np.float32)
    w = rng.standard_normal((O, I)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if with_bias else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.linear, "F32_FEW_ROWS_MIN_BYTES", 0)
        mp.setattr(numba_cpu.linear, "_piece_threads", lambda: n_threads)
        mp.setattr(numba_cpu.linear, "F32_FEW_ROWS_SHARED_MIN_BYTES", 0)
        got = numba_cpu.linear.linear(x, w, b)
        few = numba_cpu.linear._few_rows_f32(x, w, b)
        mp.setattr(numba_cpu.linear, "F32_FEW_ROWS_SHARED_MIN_BYTES", w.nbytes + 1)
        alone = numba_cpu.linear._few_rows_f32(x, w, b)
    ref = nn.linear.reference(x, w, b)
    assert got.shape == ref.shape and got.dtype == np.float32
    if not 2 <= int(np.prod(shape)) <= 8:
        assert few is None and np.array_equal(got, ref)
        return
    assert few is not None and np.array_equal(alone, few)
    bound = (
        2
        * (I + 1)
        * np.finfo(np.float32).eps
        * (np.abs(x).astype(np.float64) @ np.abs(w).T + (np.abs(b) if with_bias else 0))
    )
    assert np.all(
        np.abs(got.astype(np.float64) - (x.astype(np.float64) @ w.T.astype(np.float64) + (b if with_bias else 0)))
        <= bound
    )
    if O > 1 and I > 1:
        assert numba_cpu.linear._few_rows_f32(x, np.asfortranarray(w), b) is None  # (a layout it has no kernel for)


def test_linear_twin_edge_shapes():
    """No rows (an empty time axis), one weight row, one input channel: the kernel and the BLAS path agree
    with the reference on shapes and values."""
    rng = np.random.default_rng(5)
    for O, I, rows in ((3, 5, (0,)), (1, 7, (2,)), (4, 1, (20,)), (1, 1, (17,)), (5, 2, (66,)), (2, 3, (1, 0, 3))):
        w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32)))
        x = rng.standard_normal(rows + (I,)).astype(np.float32)
        got, ref = numba_cpu.linear.linear(x, w), nn.linear.reference(x, np.asarray(w))
        assert got.shape == ref.shape == rows + (O,)
        abs_sum = np.abs(x.astype(np.float64)) @ np.abs(np.asarray(w, dtype=np.float64)).T
        assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (I + 1) * np.finfo(np.float32).eps * abs_sum)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), O=st.integers(1, 70), I=st.integers(1, 300), N=st.integers(2, 9))
def test_matvec_kernel_of_the_fused_step_is_the_linear_kernel(seed, O, I, N):
    """Linear's kernel for a few rows (a batch's step: each word widened once for 4 rows, in one pass over a
    weight row or in four, the remainder of 1 to 3 rows one by one) gives each row the bits it gets alone (a
    row's output does not depend on the rows beside it), both ways of passing over the rows, and so does linear
    for one row (a step of one text), on the one-row matrix-vector kernel of the fused step and of linear's
    single rows (one parallel loop per matrix, rows prefetched ahead; widths that are and are not a multiple of
    the 64 lanes).  The one row stays within the reduction-length bound of the float64 product of the same bf16
    weights.  (With the tiles off: where granted, linear takes them for these rows where the shapes fit.)"""
    rng = np.random.default_rng(seed)
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    rows = rng.standard_normal((N, I)).astype(np.float32)
    x = rows[0]
    few = np.full((N, O), np.nan, np.float32)
    numba_cpu.linear._bf16_rows_times(rows, bits, few)
    other_passes = np.full((N, O), np.nan, np.float32)
    other_registers = 16 if numba_cpu.linear.VECTOR_REGISTERS == 32 else 32
    numba_cpu.linear._bf16_rows_times(rows, bits, other_passes, other_registers)
    np.testing.assert_array_equal(other_passes, few)
    for n in range(N):
        alone = np.full((1, O), np.nan, np.float32)
        numba_cpu.linear._bf16_rows_times(rows[n : n + 1], bits, alone)
        np.testing.assert_array_equal(alone[0], few[n])
        numba_cpu.linear._matvec_bf16_into(rows[n], bits, alone[0])
        np.testing.assert_array_equal(alone[0], few[n])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        out = numba_cpu.linear.linear(x[None], BF16Matrix(bits))[0]
        np.testing.assert_array_equal(out, few[0])
        np.testing.assert_array_equal(few, numba_cpu.linear.linear(rows, BF16Matrix(bits)))
    w = np.asarray(BF16Matrix(bits), np.float64)
    x64 = x.astype(np.float64)
    assert np.all(np.abs(out - w @ x64) <= (I + 1) * np.finfo(np.float32).eps * (np.abs(w) @ np.abs(x64)))


def test_the_step_kernels_refuse_x_they_would_read_past_or_between():
    """The step's kernels load x 16 lanes at a time from its rows' memory: x narrower than the weights' columns
    (a load past its end) or with columns not side by side (a strided view: the lanes between) is refused,
    not read."""
    rng = np.random.default_rng(0)
    bits = float32_to_bf16_bits(rng.standard_normal((8, 64)).astype(np.float32))
    out = np.empty((2, 8), np.float32)
    narrow = rng.standard_normal((2, 48)).astype(np.float32)
    strided = rng.standard_normal((2, 128)).astype(np.float32)[:, ::2]
    for x in (narrow, strided):
        with pytest.raises(ValueError, match="contiguous float32"):
            numba_cpu.linear._bf16_rows_times(x, bits, out)
        with pytest.raises(ValueError, match="contiguous float32"):
            numba_cpu.linear._matvec_bf16_into(x[0], bits, out[0])
    wide = rng.standard_normal((2, 80)).astype(np.float32)  # wider than the columns: its first 64 read
    exact = np.empty((2, 8), np.float32)
    numba_cpu.linear._bf16_rows_times(wide, bits, out)
    numba_cpu.linear._bf16_rows_times(np.ascontiguousarray(wide[:, :64]), bits, exact)
    np.testing.assert_array_equal(out, exact)
