"""``nn.linear``: the dispatch by shape and weight type, and its kernels: for bfloat16 weights read as stored,
a matrix-vector kernel (a generation step), a register-blocked kernel (a short prompt), blocks widened for
BLAS (longer inputs) and the AMX tiles where granted (``amx.py``: a step's and a prompt's); for float32
weights, a few rows of x, each weight read once through a big weight.  ``_products_into`` and
``_weight_products_into`` are the same choice in compiled code, for the fused decoder layer."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange
from numba.core import types
from numba.extending import overload

from ... import nn
from ..bf16 import BF16Matrix
from . import amx, runtime
from .amx import TILES_COMPILED, _tile_bf16_times, _tile_few_rows_times, _tiles_take
from .intrinsics import (
    FASTMATH,
    PREFETCH_ROWS_AHEAD,
    _bf16_to_f32,
    _f32_fma,
    _line_aligned_empty,
    _line_aligned_rows,
    _prefetch,
    _prefetch_row,
    _rows_on_cache_lines,
    _v16_add,
    _v16_fma_lanes,
    _v16_load,
    _v16_sum,
    _v16_widen_bf16,
    _v16_zeros,
)
from .packed_words import _packed_products_into, packed_words
from .pieces import _piece_threads, run_pieces

MATVEC_MAX_ROWS = 16  # up to this many rows of x: the bf16 kernel (each weight row read once for all)
TILES_MIN_ROWS = 5  # a layer's products for this many new positions or more: on the AMX tiles where granted
BLOCK_MAX_ROWS = 64  # up to this many (a prompt): the block kernel; more: widen blocks, then BLAS
WIDEN_BLOCK_ROWS = 1024  # weight rows widened at a time for BLAS (4 MB of float32 per 1024 x 1024)
F32_FEW_ROWS = (2, 8)  # float32 weights: from 2 to 8 rows of x, ``_rows_times_f32`` ...
F32_FEW_ROWS_MIN_BYTES = 1 << 20  # ... for a weight of at least 1 MB (below, BLAS's product) ...
F32_FEW_ROWS_SHARED_MIN_BYTES = 4 << 20  # ... on the piece threads from 4 MB, on the caller's alone below (where a
# piece's hand-off to another thread costs more than the second core saves: the codec decoder's transformer)


def linear(x, w_oi, b_o=None):
    """``nn.linear``.  A ``BF16Matrix`` weight is read as stored: for a few rows of x (a generation step) from
    its packed words where it has them, else on the AMX tiles where granted (the few rows' kernel), else by
    the matrix-vector kernels; for more on the AMX tiles where granted, else by the block kernel (a short
    prompt) or by BLAS on blocks of rows widened one at a time, so that no float32 copy of the whole matrix
    ever exists.  Float32 weights go to BLAS as in the reference, but for a few rows of x and a big weight
    (``_few_rows_f32``)."""
    if not isinstance(w_oi, BF16Matrix):
        few = _few_rows_f32(x, w_oi, b_o) if isinstance(w_oi, np.ndarray) and isinstance(x, np.ndarray) else None
        return nn.linear.reference(x, w_oi, b_o) if few is None else few
    O, I = w_oi.shape
    x_ni = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, I)
    packed = packed_words(w_oi) if x_ni.shape[0] <= MATVEC_MAX_ROWS else None
    if packed is not None:  # (a code predictor's head)
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _packed_products_into(x_ni, packed, out_no)
    elif x_ni.shape[0] <= MATVEC_MAX_ROWS and _tiles_take(amx.USE_TILES, O, I):  # (a Talker step's head)
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _tile_few_rows_times(x_ni, w_oi.bits, out_no, numba.get_num_threads())
    elif x_ni.shape[0] == 1:  # (a generation step's head: the layers' one-row kernel)
        out_no = np.empty((1, O), dtype=np.float32)
        _matvec_bf16_into(x_ni[0], w_oi.bits, out_no[0])
    elif x_ni.shape[0] <= MATVEC_MAX_ROWS:
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _bf16_rows_times(x_ni, w_oi.bits, out_no)
    elif _tiles_take(amx.USE_TILES, O, I):
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _tile_bf16_times(x_ni, w_oi.bits, out_no, numba.get_num_threads())
    elif x_ni.shape[0] <= BLOCK_MAX_ROWS:
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _bf16_block_times(x_ni, w_oi.bits, out_no, numba.get_num_threads())
    else:  # each block of output channels is a contiguous block of rows of out_on: BLAS writes it in place
        out_on = np.empty((O, x_ni.shape[0]), dtype=np.float32)
        block_oi = np.empty((min(O, WIDEN_BLOCK_ROWS), I), dtype=np.float32)  # reused for every block
        for start in range(0, O, WIDEN_BLOCK_ROWS):
            stop = min(O, start + WIDEN_BLOCK_ROWS)
            _widen_bf16_into(w_oi.bits[start:stop], block_oi[: stop - start])
            np.matmul(block_oi[: stop - start], x_ni.T, out=out_on[start:stop])
        out_no = np.ascontiguousarray(out_on.T)
    if b_o is not None:
        out_no += b_o
    return out_no.reshape(x.shape[:-1] + (O,))


# bfloat16 weights, read as stored: a generation step's rows, each summed in one order on every processor
LANES = 64  # a row's sum: 64 lanes, lane l summing the columns i = l mod 64 in increasing order (4 vectors of
# 16), then the vectors added (((v0 + v1) + v2) + v3), their 16 lanes by halves (``_v16_sum``), and the last
# I mod 64 columns one by one.  Written out in vectors rather than left to LLVM's loop vectoriser, whose order
# follows the processor's vector width: a batch's row and its text alone, one kernel or the other, on any
# processor, have the same bits
# the vector registers the kernels below block their sums for: 32 with AVX-512, else 16 (AVX2). A speed
# choice only: a row's sums are the same whichever blocking holds them
VECTOR_REGISTERS = 32 if runtime.machine().vectors_512 else 16


@numba.njit(inline="always")
def _lanes_total(v0, v1, v2, v3):
    return _v16_sum(_v16_add(_v16_add(_v16_add(v0, v1), v2), v3))


@numba.njit(inline="always")
def _dot_bf16(x_i, words, start, I):
    """sum_i x[i] * widen(words[start + i]) over i < I, in the order of ``LANES``."""
    s0 = s1 = s2 = s3 = _v16_zeros()
    end = I - I % LANES
    for i in range(0, end, LANES):
        s0 = _v16_fma_lanes(s0, _v16_load(x_i, i), _v16_widen_bf16(words, start + i))
        s1 = _v16_fma_lanes(s1, _v16_load(x_i, i + 16), _v16_widen_bf16(words, start + i + 16))
        s2 = _v16_fma_lanes(s2, _v16_load(x_i, i + 32), _v16_widen_bf16(words, start + i + 32))
        s3 = _v16_fma_lanes(s3, _v16_load(x_i, i + 48), _v16_widen_bf16(words, start + i + 48))
    total = _lanes_total(s0, s1, s2, s3)
    for i in range(end, I):
        total = _f32_fma(x_i[i], _bf16_to_f32(words[start + i]), total)
    return total


@numba.njit(inline="always")
def _fma_4_rows(a, b, c, d, x0, x1, x2, x3, i, w):
    """The sums of 4 rows of x, each + x_n[i : i + 16] * w (16 lanes of one widened weight row)."""
    a = _v16_fma_lanes(a, _v16_load(x0, i), w)
    b = _v16_fma_lanes(b, _v16_load(x1, i), w)
    c = _v16_fma_lanes(c, _v16_load(x2, i), w)
    d = _v16_fma_lanes(d, _v16_load(x3, i), w)
    return a, b, c, d


@numba.njit(inline="always")
def _quarter_sums_4_rows(x0, x1, x2, x3, words, start, end, q):
    """One vector of the 64 lanes (columns q, q + 64, ...) for 4 rows of x: one of the four passes."""
    a = b = c = d = _v16_zeros()
    for i in range(q, end, LANES):
        a, b, c, d = _fma_4_rows(a, b, c, d, x0, x1, x2, x3, i, _v16_widen_bf16(words, start + i))
    return a, b, c, d


@numba.njit(inline="always")
def _dot_bf16_4_rows(x0, x1, x2, x3, words, start, I, one_pass):
    """``_dot_bf16`` for 4 rows of x, each weight word widened once for the 4: in one pass over the weight row
    (16 vectors of sums) or in four (4 at a time), as ``one_pass``; the same bits either way."""
    end = I - I % LANES
    if one_pass:
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = _v16_zeros()
        for i in range(0, end, LANES):
            a0, b0, c0, d0 = _fma_4_rows(a0, b0, c0, d0, x0, x1, x2, x3, i, _v16_widen_bf16(words, start + i))
            w = _v16_widen_bf16(words, start + i + 16)
            a1, b1, c1, d1 = _fma_4_rows(a1, b1, c1, d1, x0, x1, x2, x3, i + 16, w)
            w = _v16_widen_bf16(words, start + i + 32)
            a2, b2, c2, d2 = _fma_4_rows(a2, b2, c2, d2, x0, x1, x2, x3, i + 32, w)
            w = _v16_widen_bf16(words, start + i + 48)
            a3, b3, c3, d3 = _fma_4_rows(a3, b3, c3, d3, x0, x1, x2, x3, i + 48, w)
    else:
        a0, b0, c0, d0 = _quarter_sums_4_rows(x0, x1, x2, x3, words, start, end, 0)
        a1, b1, c1, d1 = _quarter_sums_4_rows(x0, x1, x2, x3, words, start, end, 16)
        a2, b2, c2, d2 = _quarter_sums_4_rows(x0, x1, x2, x3, words, start, end, 32)
        a3, b3, c3, d3 = _quarter_sums_4_rows(x0, x1, x2, x3, words, start, end, 48)
    r0, r1 = _lanes_total(a0, a1, a2, a3), _lanes_total(b0, b1, b2, b3)
    r2, r3 = _lanes_total(c0, c1, c2, c3), _lanes_total(d0, d1, d2, d3)
    for i in range(end, I):
        w = _bf16_to_f32(words[start + i])
        r0, r1 = _f32_fma(x0[i], w, r0), _f32_fma(x1[i], w, r1)
        r2, r3 = _f32_fma(x2[i], w, r2), _f32_fma(x3[i], w, r3)
    return r0, r1, r2, r3


@numba.njit(parallel=True, cache=True)
def _bf16_rows_times(x_ni, bits_oi, out_no, registers=VECTOR_REGISTERS):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]), each row of x summed in the order of ``LANES`` (the
    bits of ``_matvec_bf16_into`` for that row alone): each weight row is read once for all n rows of x, each
    word widened once for 4 rows at a time (``_dot_bf16_4_rows``: in one pass over the weight row where 32
    ``registers`` hold their 16 vectors of sums, else in four; the last N mod 4 rows one by one), so that
    a batch's step stays bound by the bytes, not by the widening.  Memory-bound: while row o is multiplied,
    row o + 8 is prefetched, one request per 64-byte line (the weights are memory-mapped 4 KB pages, where the
    hardware prefetcher stops at every page end)."""
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    if x_ni.shape[1] < I or x_ni.strides[1] != 4:
        raise ValueError("_bf16_rows_times: x's rows must hold I contiguous float32 values")
    words = bits_oi.reshape(-1)
    for o in prange(O):
        if o + PREFETCH_ROWS_AHEAD < O:
            _prefetch_row(words, I, o + PREFETCH_ROWS_AHEAD)
        for n in range(0, N - N % 4, 4):
            x0, x1, x2, x3 = x_ni[n], x_ni[n + 1], x_ni[n + 2], x_ni[n + 3]
            r0, r1, r2, r3 = _dot_bf16_4_rows(x0, x1, x2, x3, words, o * I, I, registers >= 32)
            out_no[n, o], out_no[n + 1, o], out_no[n + 2, o], out_no[n + 3, o] = r0, r1, r2, r3
        for n in range(N - N % 4, N):
            out_no[n, o] = _dot_bf16(x_ni[n], words, o * I, I)


@numba.njit(parallel=True, cache=True)
def _matvec_bf16_into(x_i, bits_oi, out_o):
    """out[o] = sum_i x[i] * widen(bits[o, i]) for ONE row of x (``_dot_bf16``), parallel over the weight
    rows, row o + 8 asked for while row o is multiplied.  One matrix per parallel loop: a loop whose body
    chooses between two or three matrices (the q/k/v rows stacked) streams them more slowly than one loop per
    matrix."""
    O, I = bits_oi.shape
    if x_i.shape[0] < I or x_i.strides[0] != 4:
        raise ValueError("_matvec_bf16_into: x must hold I contiguous float32 values")
    words = bits_oi.reshape(-1)
    for o in prange(O):
        if o + PREFETCH_ROWS_AHEAD < O:
            _prefetch_row(words, I, o + PREFETCH_ROWS_AHEAD)
        out_o[o] = _dot_bf16(x_i, words, o * I, I)


BLOCK_N = 4  # the block kernel's register block: 4 rows of x (1 where 16 registers) ...
BLOCK_O = 6  # ... times 6 weight rows: 24 vectors of sums (4 x 4 and 4 x 8 measured slower)
BLOCK_I_SPAN = 1024  # columns summed at a time (half as many measured the same)


@numba.njit(inline="always")
def _store_6(out_no, n, o0, cols, add, v0, v1, v2, v3, v4, v5):
    """out[n, o0 : o0 + cols] = (v0, ..., v5)[:cols], or += where ``add`` (a later span of the sums)."""
    if add:
        v0 += out_no[n, o0]
        v1 += out_no[n, o0 + 1] if cols > 1 else np.float32(0.0)
        v2 += out_no[n, o0 + 2] if cols > 2 else np.float32(0.0)
        v3 += out_no[n, o0 + 3] if cols > 3 else np.float32(0.0)
        v4 += out_no[n, o0 + 4] if cols > 4 else np.float32(0.0)
        v5 += out_no[n, o0 + 5] if cols > 5 else np.float32(0.0)
    out_no[n, o0] = v0
    if cols > 1:
        out_no[n, o0 + 1] = v1
    if cols > 2:
        out_no[n, o0 + 2] = v2
    if cols > 3:
        out_no[n, o0 + 3] = v3
    if cols > 4:
        out_no[n, o0 + 4] = v4
    if cols > 5:
        out_no[n, o0 + 5] = v5


@numba.njit(inline="always")
def _fma_6(a0, a1, a2, a3, a4, a5, x, w0, w1, w2, w3, w4, w5):
    """The sums of one row of x times 6 weight rows, each + x * w_r (16 lanes)."""
    a0, a1, a2 = _v16_fma_lanes(a0, x, w0), _v16_fma_lanes(a1, x, w1), _v16_fma_lanes(a2, x, w2)
    a3, a4, a5 = _v16_fma_lanes(a3, x, w3), _v16_fma_lanes(a4, x, w4), _v16_fma_lanes(a5, x, w5)
    return a0, a1, a2, a3, a4, a5


@numba.njit(inline="always")
def _store_sums_6(out_no, n, o0, cols, add, sums, x_i, w, i0, i1):
    """Row n's 6 vectors of sums over a span, each's 16 lanes added (``_v16_sum``), then the span's last
    columns [i0, i1) one by one, stored (``_store_6``)."""
    s0, s1, s2 = _v16_sum(sums[0]), _v16_sum(sums[1]), _v16_sum(sums[2])
    s3, s4, s5 = _v16_sum(sums[3]), _v16_sum(sums[4]), _v16_sum(sums[5])
    for i in range(i0, i1):
        x = x_i[i]
        s0, s1, s2 = _f32_fma(x, w[0, i], s0), _f32_fma(x, w[1, i], s1), _f32_fma(x, w[2, i], s2)
        s3, s4, s5 = _f32_fma(x, w[3, i], s3), _f32_fma(x, w[4, i], s4), _f32_fma(x, w[5, i], s5)
    _store_6(out_no, n, o0, cols, add, s0, s1, s2, s3, s4, s5)


@numba.njit(parallel=True, cache=True)
def _bf16_block_times(x_ni, bits_oi, out_no, n_threads, registers=VECTOR_REGISTERS):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) for a few dozen rows of x (a prompt): each thread
    takes a range of weight rows, widens ``BLOCK_O`` of them at a time into its own float32 buffer and
    multiplies them with the rows of x, ``BLOCK_N`` at a time where 32 ``registers`` hold their 24 vectors of
    sums (each loaded value feeding several multiply-adds), else (and the last N mod 4 rows) one at a time,
    over ``BLOCK_I_SPAN`` columns at a time so that the rows' spans stay in the first-level cache.  Each
    (row, weight row) sums a span in 16 lanes (lane l the columns i = l mod 16, in increasing order), the
    lanes added by halves and the span's last columns one by one, then added to the earlier spans' sum:
    written out in vectors, so a row's bits are the same whatever the rows beside it and on any processor.
    The rows of x and of the buffer start on cache lines (x copied where they do not): no load spans two."""
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    x_ni = _line_aligned_rows(x_ni)
    words = bits_oi.reshape(-1)
    blocks = (O + BLOCK_O - 1) // BLOCK_O
    n_four = N - N % BLOCK_N if registers >= 32 else 0  # the rows taken four at a time
    n_blocks = n_four // BLOCK_N + (N - n_four)  # the blocks of rows a span's sums are taken in
    row = x_ni.shape[1]  # I, or I rounded up to a whole cache line
    for t in prange(n_threads):
        w = _line_aligned_empty(BLOCK_O, row)  # one buffer per thread
        w0_i, w1_i, w2_i, w3_i, w4_i, w5_i = w[0], w[1], w[2], w[3], w[4], w[5]
        for ob in range(t * blocks // n_threads, (t + 1) * blocks // n_threads):
            o0 = ob * BLOCK_O
            for r in range(BLOCK_O):
                o = min(o0 + r, O - 1)
                for i in range(I):
                    w[r, i] = _bf16_to_f32(bits_oi[o, i])
            cols = min(BLOCK_O, O - o0)
            ahead0 = min((o0 + BLOCK_O) * I, O * I)  # the next block's words: [ahead0, ahead1)
            ahead1 = min((o0 + 2 * BLOCK_O) * I, O * I)
            spans = (I + BLOCK_I_SPAN - 1) // BLOCK_I_SPAN
            # the next block's words asked for a slice per block of rows of every span: spread over the work,
            # not in one burst the memory system drops
            pieces = n_blocks * spans
            slice_ = ((ahead1 - ahead0 + pieces - 1) // pieces + 31) // 32 * 32  # whole 64-byte lines
            for c0 in range(0, I, BLOCK_I_SPAN):
                c1 = min(I, c0 + BLOCK_I_SPAN)
                v1 = c0 + (c1 - c0) // 16 * 16  # the span's whole vectors: [c0, v1)
                for b in range(n_blocks):
                    piece = (c0 // BLOCK_I_SPAN) * n_blocks + b
                    for j in range(ahead0 + piece * slice_, min(ahead0 + (piece + 1) * slice_, ahead1), 32):
                        _prefetch(words, j)
                    if b < n_four // BLOCK_N:
                        n = b * BLOCK_N
                        x0_i, x1_i, x2_i, x3_i = x_ni[n], x_ni[n + 1], x_ni[n + 2], x_ni[n + 3]
                        a0 = a1 = a2 = a3 = a4 = a5 = b0 = b1 = b2 = b3 = b4 = b5 = _v16_zeros()
                        c_0 = c_1 = c_2 = c_3 = c_4 = c_5 = d0 = d1 = d2 = d3 = d4 = d5 = _v16_zeros()
                        for i in range(c0, v1, 16):
                            w0, w1, w2 = _v16_load(w0_i, i), _v16_load(w1_i, i), _v16_load(w2_i, i)
                            w3, w4, w5 = _v16_load(w3_i, i), _v16_load(w4_i, i), _v16_load(w5_i, i)
                            x = _v16_load(x0_i, i)
                            a0, a1, a2, a3, a4, a5 = _fma_6(a0, a1, a2, a3, a4, a5, x, w0, w1, w2, w3, w4, w5)
                            x = _v16_load(x1_i, i)
                            b0, b1, b2, b3, b4, b5 = _fma_6(b0, b1, b2, b3, b4, b5, x, w0, w1, w2, w3, w4, w5)
                            x = _v16_load(x2_i, i)
                            c_0, c_1, c_2, c_3, c_4, c_5 = _fma_6(
                                c_0, c_1, c_2, c_3, c_4, c_5, x, w0, w1, w2, w3, w4, w5
                            )
                            x = _v16_load(x3_i, i)
                            d0, d1, d2, d3, d4, d5 = _fma_6(d0, d1, d2, d3, d4, d5, x, w0, w1, w2, w3, w4, w5)
                        sums = (
                            (a0, a1, a2, a3, a4, a5),
                            (b0, b1, b2, b3, b4, b5),
                            (c_0, c_1, c_2, c_3, c_4, c_5),
                            (d0, d1, d2, d3, d4, d5),
                        )
                        for k in range(BLOCK_N):  # (one copy of the code that stores a row's sums)
                            _store_sums_6(out_no, n + k, o0, cols, c0 > 0, sums[k], x_ni[n + k], w, v1, c1)
                    else:
                        n = n_four + b - n_four // BLOCK_N
                        x_i = x_ni[n]
                        a0 = a1 = a2 = a3 = a4 = a5 = _v16_zeros()
                        for i in range(c0, v1, 16):
                            w0, w1, w2 = _v16_load(w0_i, i), _v16_load(w1_i, i), _v16_load(w2_i, i)
                            w3, w4, w5 = _v16_load(w3_i, i), _v16_load(w4_i, i), _v16_load(w5_i, i)
                            a0, a1, a2, a3, a4, a5 = _fma_6(
                                a0, a1, a2, a3, a4, a5, _v16_load(x_i, i), w0, w1, w2, w3, w4, w5
                            )
                        _store_sums_6(out_no, n, o0, cols, c0 > 0, (a0, a1, a2, a3, a4, a5), x_i, w, v1, c1)


@numba.njit(cache=True)
def _widen_bf16_into(bits_oi, out_oi):
    """out = the float32 values of the bfloat16 words (exact).  One thread: it alternates with BLAS calls,
    and Numba's parallel threads would still be spinning while BLAS's run (prompts measured far slower)."""
    O, I = bits_oi.shape
    for o in range(O):
        for i in range(I):
            out_oi[o, i] = _bf16_to_f32(bits_oi[o, i])


# float32 weights: a few rows of x, each weight row read once
@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _rows_times_f32(x_ni, w_oi, o0, o1, out_no):
    """out[n, o] = sum_i x[n, i] w[o, i] for the weight rows o0 <= o < o1: each row read once, from memory,
    for all the few rows of x (in the first-level cache meanwhile), 4 rows of x at a time (each loaded
    weight value feeds 4 multiply-adds; the same bits as one row at a time), row o + 8 asked for.  BLAS
    packs the weight before multiplying a few rows, which costs more than the product itself in a short
    decode's ConvNeXt and transformer products (one row stays BLAS's: there the pieces' hand-off costs
    more than it saves)."""
    I = w_oi.shape[1]
    N = x_ni.shape[0]
    words = w_oi.reshape(-1)
    for o in range(o0, o1):
        if o + 8 < o1:
            for j in range((o + 8) * I, (o + 9) * I, 16):  # one request per 64-byte line
                _prefetch(words, j)
        w_i = w_oi[o]
        for n0 in range(0, N, 4):  # (the remainder repeats the last row and drops it)
            n1, n2, n3 = min(n0 + 1, N - 1), min(n0 + 2, N - 1), min(n0 + 3, N - 1)
            x0_i, x1_i, x2_i, x3_i = x_ni[n0, :I], x_ni[n1, :I], x_ni[n2, :I], x_ni[n3, :I]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(I):
                w = w_i[i]
                a0 += x0_i[i] * w
                a1 += x1_i[i] * w
                a2 += x2_i[i] * w
                a3 += x3_i[i] * w
            out_no[n0, o] = a0
            if n0 + 1 < N:
                out_no[n1, o] = a1
            if n0 + 2 < N:
                out_no[n2, o] = a2
            if n0 + 3 < N:
                out_no[n3, o] = a3


def _few_rows_f32(x, w_oi, b_o):
    """``nn.linear`` of float32 x and weight by ``_rows_times_f32``, the weight's rows shared out over the
    piece threads (from ``F32_FEW_ROWS_SHARED_MIN_BYTES``; below, all of them on the caller's thread: the
    same bits); None where it does not apply (another dtype or layout, too many or too few rows, a small
    weight)."""
    O, I = w_oi.shape
    rows = math.prod(x.shape[:-1])
    if not F32_FEW_ROWS[0] <= rows <= F32_FEW_ROWS[1] or w_oi.nbytes < F32_FEW_ROWS_MIN_BYTES:
        return None
    if x.dtype != np.float32 or w_oi.dtype != np.float32 or not w_oi.flags.c_contiguous or x.shape[-1] != I:
        return None
    if b_o is not None and getattr(b_o, "dtype", None) != np.float32:
        return None  # (the reference's promotion)
    x_ni = _rows_on_cache_lines(np.ascontiguousarray(x).reshape(rows, I))  # (no load spanning two cache lines)
    out_no = np.empty((rows, O), np.float32)
    n = _piece_threads() if w_oi.nbytes >= F32_FEW_ROWS_SHARED_MIN_BYTES else 1
    run_pieces(
        lambda o0, o1: _rows_times_f32(x_ni, w_oi, o0, o1, out_no), [(O * t // n, O * (t + 1) // n) for t in range(n)]
    )
    if b_o is not None:
        out_no += b_o
    return out_no.reshape(x.shape[:-1] + (O,))


# the same choice in compiled code, for the fused decoder layer
@numba.njit(fastmath=FASTMATH, cache=True)
def _products_into(x_ni, bits_oi, out_no, n_threads, rows, tiles):
    """out = x @ widen(bits)^T for a generation step or a prompt, by ``rows``.  Where ``tiles`` and the shapes
    let them, on the AMX tiles: the prompt's kernel (``_tile_bf16_times``) from ``TILES_MIN_ROWS``, the few
    rows' (``_tile_few_rows_times``) for fewer; else ``_matvec_bf16_into`` for one,
    ``_bf16_rows_times`` up to ``MATVEC_MAX_ROWS`` and ``_bf16_block_times`` for more (``linear``, which
    cannot tell a batch's rows from a prompt's positions, takes the prompt's tiles only above
    ``MATVEC_MAX_ROWS``).  ``rows`` is the layer's count of new positions of each batch row, also where x holds
    fewer (the last position alone) or more (a batch's rows, one position each: the few rows' tiles, or
    ``_bf16_rows_times``, which sums each row as ``_matvec_bf16_into`` does): each
    kernel sums a row the same way whatever the others, so that a batch's row has the bits of its text alone."""
    O, I = bits_oi.shape
    if TILES_COMPILED and _tiles_take(tiles, O, I):  # (a constant: without the tiles, their kernels not compiled in)
        if rows >= TILES_MIN_ROWS:
            _tile_bf16_times(x_ni, bits_oi, out_no, n_threads)
        else:
            _tile_few_rows_times(x_ni, bits_oi, out_no, n_threads)
    elif rows == 1 and x_ni.shape[0] == 1:
        _matvec_bf16_into(x_ni[0], bits_oi, out_no[0])
    elif rows <= MATVEC_MAX_ROWS:
        _bf16_rows_times(x_ni, bits_oi, out_no)
    else:
        _bf16_block_times(x_ni, bits_oi, out_no, n_threads)


def _matrix_rows(w):
    """O of a layer step's matrix [O, I], given as bf16 words or packed (``_weight_products_into``)."""


@overload(_matrix_rows)
def _matrix_rows_for(w):
    if isinstance(w, types.Array):
        return lambda w: w.shape[0]
    return lambda w: w[0].shape[0]


def _weight_products_into(x_ni, w, out_no, n_threads, rows, tiles):
    """out = x @ W^T for a layer step's matrix W, given as bf16 words (``_products_into``) or packed
    (``_packed_products_into``): the layer kernels are compiled for either (``numba.extending.overload``)."""


@overload(_weight_products_into, jit_options={"fastmath": FASTMATH})
def _weight_products_for(x_ni, w, out_no, n_threads, rows, tiles):
    if isinstance(w, types.Array):
        return lambda x_ni, w, out_no, n_threads, rows, tiles: _products_into(x_ni, w, out_no, n_threads, rows, tiles)
    return lambda x_ni, w, out_no, n_threads, rows, tiles: _packed_products_into(x_ni, w, out_no)
