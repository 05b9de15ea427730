"""The AMX tile core: the grant, the tile instructions, the exact bf16 split of a float32 value, and the
products of bf16 weights on the tiles: a prompt's (``_tile_bf16_times``), a step's or a batch's few rows
(``_tile_few_rows_times``); the convolutions on the tiles are in ``amx_conv.py``.

Processors with AMX (Intel's tile registers: 8 tiles of 16 rows x 64 bytes, and ``TDPBF16PS``, which adds
the products of bfloat16 pairs into float32 tiles) multiply bf16 matrices far faster than vectors.  The
weights are bf16 words already; x is float32, split EXACTLY into three bf16 parts (x = hi + mid + lo, each
the top 8 significant bits of what is left), so that every product of a word and a part is exact and
W x = W hi + W mid + W lo, summed in float32.  Linux grants the tile registers when asked
(``runtime.configure`` asks); Numba's LLVM emits the tile instructions from its ``llvm.x86.*`` intrinsics
when the compile target has the features."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import runtime
from .intrinsics import _bits_of, _f32_from_bits, _prefetch

TILES_COMPILED = runtime.machine().tiles_compiled  # else the tile intrinsics emit nothing
USE_TILES = runtime.machine().tiles_granted  # whether the tiles run: the one switch (tests turn it off here)


def _tile_call(name: str, immediates: tuple, with_pointer: bool):
    """An intrinsic for one tile instruction on fixed tile registers ``immediates``; with a pointer, its
    arguments are (array, index of the first element, row stride in bytes).  Where the compile target has
    no tiles it emits nothing (it is never called then: ``USE_TILES`` is False)."""

    def typer(typingctx, *args):
        sig = types.void(*args)

        def codegen(context, builder, signature, llargs):
            if not TILES_COMPILED:
                return context.get_dummy_value()
            i8, i64 = ir.IntType(8), ir.IntType(64)
            p8 = i8.as_pointer()
            values = [ir.Constant(i8, t) for t in immediates]
            arg_types = [i8] * len(immediates)
            if with_pointer:
                aryty = signature.args[0]
                ary = context.make_array(aryty)(context, builder, llargs[0])
                ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [llargs[1]], wraparound=False)
                stride = context.cast(builder, llargs[2], signature.args[2], types.int64)
                values += [builder.bitcast(ptr, p8), stride]
                arg_types += [p8, i64]
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), arg_types), f"llvm.x86.{name}"
            )
            builder.call(fn, values)
            return context.get_dummy_value()

        return sig, codegen

    if with_pointer:
        return intrinsic(lambda typingctx, array, index, stride: typer(typingctx, array, index, stride))
    return intrinsic(lambda typingctx: typer(typingctx))


@intrinsic
def _tile_config(typingctx, config):
    """``ldtilecfg``: this thread's tile shapes from the 64-byte ``config``."""
    sig = types.void(config)

    def codegen(context, builder, signature, args):
        if TILES_COMPILED:
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            p8 = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [p8])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.ldtilecfg")
            builder.call(fn, [builder.bitcast(data, p8)])
        return context.get_dummy_value()

    return sig, codegen


_tile_release = _tile_call("tilerelease", (), False)
_zero_c0, _zero_c1, _zero_c2, _zero_c3 = (_tile_call("tilezero", (t,), False) for t in range(4))
_store_c0, _store_c1, _store_c2, _store_c3 = (_tile_call("tilestored64", (t,), True) for t in range(4))
_load_c0, _load_c1, _load_c2, _load_c3, _load_a4, _load_a5, _load_b6, _load_b7 = (
    _tile_call("tileloadd64", (t,), True) for t in range(8)
)
# C[o-tile i, n-tile j] (tile 2 i + j) += A[o-tile i] (tile 4 + i) . B[n-tile j] (tile 6 + j)
_dot_c0, _dot_c1 = _tile_call("tdpbf16ps", (0, 4, 6), False), _tile_call("tdpbf16ps", (1, 4, 7), False)
_dot_c2, _dot_c3 = _tile_call("tdpbf16ps", (2, 5, 6), False), _tile_call("tdpbf16ps", (3, 5, 7), False)
# a few rows' kernel: C tiles 0 and 2 only, the weight tiles of odd steps in tiles 1 and 3, x's in 7
_dot_017, _dot_237 = _tile_call("tdpbf16ps", (0, 1, 7), False), _tile_call("tdpbf16ps", (2, 3, 7), False)


@numba.njit(inline="always")
def _tile_shapes():
    """The 64-byte tile configuration: palette 1, all 8 tiles 16 rows of 64 bytes (C: 16 x 16 float32;
    A: 16 weight rows x 32 words; B: 16 pairs of columns x 16 rows of x x 2 words)."""
    config = np.zeros(64, dtype=np.uint8)
    config[0] = 1
    for t in range(8):
        config[16 + 2 * t] = 64  # bytes per row (little-endian 16 bits)
        config[48 + t] = 16  # rows
    return config


@numba.njit(inline="always")
def _bf16_parts(v):
    """The three bf16 words (hi, mid, lo) of a float32 v, hi + mid + lo = v exactly: hi = v with its low 16
    bits cleared, mid = the same of v - hi, lo = v - hi - mid (8 significant bits at most: a bf16 word
    exactly).  An infinity or a NaN is its hi part alone (a NaN kept a NaN: its payload may lie in the
    cleared bits).  Without branches (selects), so that loops over it vectorise."""
    low = np.uint32(0xFFFF0000)
    hi = _bits_of(v) & low
    rest = v - _f32_from_bits(np.int32(hi))  # (exact; NaN for an infinity or a NaN)
    mid = _bits_of(rest) & low
    lo = _bits_of(rest - _f32_from_bits(np.int32(mid)))
    finite = abs(v) < np.inf
    zero = np.uint32(0)
    hi = hi if finite or v == v else hi | np.uint32(0x00400000)
    mid, lo = (mid, lo) if finite else (zero, zero)
    return np.uint16(hi >> np.uint32(16)), np.uint16(mid >> np.uint32(16)), np.uint16(lo >> np.uint32(16))


@numba.njit(parallel=True, cache=True)
def _split_into_pairs(x_ni, parts_pkn2):
    """parts[p, k, n, j] = the bf16 word of part p of x[n, 2 k + j] (``_bf16_parts``; 0 for the padding
    rows n >= N), so hi + mid + lo = x: the tiles' layout for B, each 64-byte row the pairs of two columns
    of x for 16 of its rows.  In blocks of 32 columns, whose three part blocks stay in the first-level
    cache while they are written.  An infinity or a NaN is its hi part alone, so that the products give
    what the float32 product gives."""
    N, I = x_ni.shape
    npad = parts_pkn2.shape[2]
    for kb in prange(I // 32):
        for n in range(npad):
            for j in range(32):
                i = 32 * kb + j
                hi, mid, lo = _bf16_parts(x_ni[n, i] if n < N else np.float32(0.0))
                parts_pkn2[0, i // 2, n, i % 2] = hi
                parts_pkn2[1, i // 2, n, i % 2] = mid
                parts_pkn2[2, i // 2, n, i % 2] = lo


TILE_K_SPAN = 1024  # columns summed in the tiles at a time; the spans' sums added in float32 after


@numba.njit(parallel=True, cache=True)
def _tile_bf16_times(x_ni, bits_oi, out_no, n_threads):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) on the tile registers (O a multiple of 32, I of 32):
    x split into its three exact bf16 parts (``_split_into_pairs``); each thread takes a range of pairs
    of 16-row weight tiles, read from the words as stored (the next pair's words asked for a few lines
    before each part's multiplies, not all at once), and for every 32 rows of x four float32 tiles of
    sums, 2 weight tiles x 2 tiles of x, the tiles of x loaded alternately so that a load never waits for
    the multiply still reading the other.  The sums run over ``TILE_K_SPAN`` columns at a time, the
    spans' sums added in float32 (one sum over all 3 I terms in a tile strays much further from the exact
    product).  A row's sums involve that row alone: the same bits whatever the others."""
    N, I = x_ni.shape
    O = bits_oi.shape[0]
    npad = (N + 31) // 32 * 32
    parts = np.empty((3, I // 2, npad, 2), dtype=np.uint16)
    _split_into_pairs(x_ni, parts)
    pairs = parts.reshape(-1)
    words = bits_oi.reshape(-1)
    part_words = (I // 2) * npad * 2
    o_pairs = O // 32
    steps = TILE_K_SPAN // 32
    for t in prange(n_threads):
        sums = np.empty((32, npad), dtype=np.float32)  # one o-pair's sums, this thread's
        span = np.empty(32 * npad, dtype=np.float32)
        _tile_config(_tile_shapes())
        for op in range(t * o_pairs // n_threads, (t + 1) * o_pairs // n_threads):
            o0 = op * 32
            for s0 in range(0, I // 32, steps):
                for n0 in range(0, npad, 32):
                    ahead = n0 == 0 and op + 1 < o_pairs  # the next pair of tiles' words asked for, in order
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                    for s in range(s0, min(s0 + steps, I // 32)):
                        _load_a4(words, o0 * I + s * 32, 2 * I)
                        _load_a5(words, (o0 + 16) * I + s * 32, 2 * I)
                        for p in range(3):
                            if ahead:
                                for r in range(p * 11, min(p * 11 + 11, 32)):
                                    _prefetch(words, (o0 + 32) * I + (s * 32 + r) * 32)
                            first = p * part_words + s * 32 * npad + n0 * 2
                            _load_b6(pairs, first, 4 * npad)
                            _load_b7(pairs, first + 32, 4 * npad)
                            _dot_c0()
                            _dot_c2()
                            _dot_c1()
                            _dot_c3()
                    _store_c0(span, n0, 4 * npad)
                    _store_c1(span, n0 + 16, 4 * npad)
                    _store_c2(span, 16 * npad + n0, 4 * npad)
                    _store_c3(span, 16 * npad + n0 + 16, 4 * npad)
                span_on = span.reshape(32, npad)
                if s0 == 0:
                    sums[:, :] = span_on
                else:
                    for r in range(32):
                        for n in range(npad):
                            sums[r, n] += span_on[r, n]
            for r in range(32):
                for n in range(N):
                    out_no[n, o0 + r] = sums[r, n]
        _tile_release()


@numba.njit(cache=True)
def _tiles_take(tiles, O, I):
    """Whether the tile kernels may take a product by an O x I bf16 matrix (a prompt's: ``linear``'s more than
    ``MATVEC_MAX_ROWS`` rows of x, the fused step's ``TILES_MIN_ROWS`` new positions; a step's few rows
    otherwise): tiles granted (``USE_TILES``, passed in: compiled code must not freeze it) and whole tiles."""
    return tiles and O % 32 == 0 and I % 32 == 0 and I > 0


FEW_TILE_ROWS = 5  # rows of x a pass: the three parts of each side by side in one tile of x (16 columns)
FEW_AHEAD_STEPS = 4  # the weight lines asked for this many steps (32 columns) ahead of the multiplies
SPLIT_COLUMNS = 256  # columns of x split at a time (their parts stay in the first-level cache)


@numba.njit(cache=True)
def _split_into_columns(x_ni, n0, n1, words_pi, parts_kc2):
    """parts[k, p R + r, j] = the bf16 word of part p (``_bf16_parts``) of x[n0 + r, 2 k + j] for the R =
    n1 - n0 <= ``FEW_TILE_ROWS`` rows n0 .. n1 - 1: the three parts of every row side by side in the 16 columns of one
    tile of x, for ``_tile_few_rows_times``.  ``SPLIT_COLUMNS`` columns at a time: each row's parts made in
    ``words_pi`` ([3, SPLIT_COLUMNS] uint16) by a loop that vectorises, then copied in pairs of words (a
    tile's column holds two columns of x a row) while the chunk's lines of parts stay in that cache.  The
    other columns are left as they are: no column's sums involve another's."""
    R, I = n1 - n0, x_ni.shape[1]
    pairs_pk = words_pi.view(np.uint32)
    parts_kc = parts_kc2.reshape(I // 2, 32).view(np.uint32)
    for c0 in range(0, I, SPLIT_COLUMNS):
        c1 = min(I, c0 + SPLIT_COLUMNS)
        for r in range(R):
            x_i = x_ni[n0 + r]
            for i in range(c0, c1):
                words_pi[0, i - c0], words_pi[1, i - c0], words_pi[2, i - c0] = _bf16_parts(x_i[i])
            for p in range(3):
                for k in range(c0 // 2, c1 // 2):
                    parts_kc[k, p * R + r] = pairs_pk[p, k - c0 // 2]


@numba.njit(inline="always")
def _few_rows_step(a_words, a_first, a_stride, pairs, s, odd):
    """One step of 32 columns of the few rows' kernels: the weight tiles of rows 0..15 and 16..31 from
    a_words (rows a_stride bytes apart, the second 16 rows after the first), x's tile of step s, two
    multiplies into C tiles 0 and 2; odd steps on tiles 1, 3 and 7, so that a load never waits for the
    multiply still reading the other set."""
    if odd:
        _load_c1(a_words, a_first, a_stride)
        _load_c3(a_words, a_first + 16 * a_stride // 2, a_stride)
        _load_b7(pairs, s * 512, 64)
        _dot_017()
        _dot_237()
    else:
        _load_a4(a_words, a_first, a_stride)
        _load_a5(a_words, a_first + 16 * a_stride // 2, a_stride)
        _load_b6(pairs, s * 512, 64)
        _dot_c0()
        _dot_c2()


@numba.njit(inline="always")
def _few_rows_span_summed(span, sums, first_span):
    """sums (+)= the span's two C tiles (rows 0..15, 16..31 of the pair's sums, [32, 16] float32 flat): the
    first span's stored in place, a later one's through ``span`` and added."""
    if first_span:
        _store_c0(sums, 0, 64)
        _store_c2(sums, 256, 64)
    else:
        _store_c0(span, 0, 64)
        _store_c2(span, 256, 64)
        for k in range(32 * 16):
            sums[k] += span[k]


@numba.njit(inline="always")
def _few_rows_out(sums, n0, R, o0, out_no):
    """out[n0 + r, o0 + m] = (hi sum + mid sum) + lo sum of row r, for the pair's 32 weight rows m."""
    sums_rc = sums.reshape(32, 16)
    for m in range(32):
        for r in range(R):
            out_no[n0 + r, o0 + m] = (sums_rc[m, r] + sums_rc[m, R + r]) + sums_rc[m, 2 * R + r]


@numba.njit(inline="always")
def _prefetch_step(words, o0, I, s):
    """Ask for step s's line (32 columns, 64 bytes) of each of the 32 weight rows o0 .. o0 + 31."""
    for m in range(32):
        _prefetch(words, (o0 + m) * I + s * 32)


@numba.njit(cache=True)
def _few_rows_pairs_on_tiles(x_ni, words, op0, op1, out_no):
    """``_tile_few_rows_times`` for the pairs of 16-row weight tiles op0 <= op < op1 (one thread's), x split
    by the thread itself (tiles loaded from lines another core had just written measured several times
    slower), ``FEW_TILE_ROWS`` rows of x a pass over the weights."""
    N, I = x_ni.shape
    steps, span_steps = I // 32, TILE_K_SPAN // 32
    parts = np.empty((I // 2, 16, 2), dtype=np.uint16)
    pairs = parts.reshape(-1)
    words_pi = np.empty((3, SPLIT_COLUMNS), dtype=np.uint16)
    sums = np.empty(32 * 16, dtype=np.float32)  # one pair's sums [32, 16]
    span = np.empty(32 * 16, dtype=np.float32)
    _tile_config(_tile_shapes())
    for n0 in range(0, N, FEW_TILE_ROWS):
        n1 = min(N, n0 + FEW_TILE_ROWS)
        _split_into_columns(x_ni, n0, n1, words_pi, parts)
        for op in range(op0, op1):
            o0 = op * 32
            if op == op0:
                for s in range(min(FEW_AHEAD_STEPS, steps)):
                    _prefetch_step(words, o0, I, s)
            for s0 in range(0, steps, span_steps):
                _zero_c0()
                _zero_c2()
                for s in range(s0, min(s0 + span_steps, steps)):
                    ahead = s + FEW_AHEAD_STEPS
                    if ahead < steps:
                        _prefetch_step(words, o0, I, ahead)
                    elif op + 1 < op1:  # (the next pair's first steps)
                        _prefetch_step(words, o0 + 32, I, ahead - steps)
                    _few_rows_step(words, o0 * I + s * 32, 2 * I, pairs, s, s % 2 == 1)
                _few_rows_span_summed(span, sums, s0 == 0)
            _few_rows_out(sums, n0, n1 - n0, o0, out_no)
    _tile_release()


@numba.njit(parallel=True, cache=True)
def _tile_few_rows_times(x_ni, bits_oi, out_no, n_threads):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) on the tile registers for a few rows of x (a generation
    step's, a batch's): the three exact bf16 parts of ``FEW_TILE_ROWS`` rows at a time are the columns of
    one tile of x (``_split_into_columns``), so that each pair of 16-row weight tiles, read as stored, takes
    two multiplies a step of 32 columns for all of them; the weight lines asked for ``FEW_AHEAD_STEPS``
    steps ahead (the next pair's from the end of a pair's).  Sums over ``TILE_K_SPAN`` columns at a time,
    the spans' sums added in float32; a row's value is (hi sum + mid sum) + lo sum.  Each column's sums
    involve its own part of its own row alone: a row has the same bits whatever the others."""
    words, o_pairs = bits_oi.reshape(-1), bits_oi.shape[0] // 32
    for t in prange(n_threads):
        _few_rows_pairs_on_tiles(x_ni, words, t * o_pairs // n_threads, (t + 1) * o_pairs // n_threads, out_no)
