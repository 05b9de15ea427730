"""Convolutions on the AMX tiles, shared by the stages' twins: the stacked taps of a signal times a weight
of bf16 values (``_taps_blocks_on_tiles``: the speaker encoder's TDNNs, bf16 1x1 convs), and a float32
conv with both operands split into their exact bf16 parts, its taps read as shifts of the split signal
(``_tile_conv_into``: the codecs' residual units and blocks); the weights' tiles, made once and kept for a
model's read-only weights."""

from __future__ import annotations

import numba
import numpy as np

from ..host_memory import new_output
from . import amx
from .amx import (
    TILE_K_SPAN,
    _bf16_parts,
    _dot_c0,
    _dot_c1,
    _dot_c2,
    _dot_c3,
    _load_a4,
    _load_a5,
    _load_b6,
    _load_b7,
    _load_c0,
    _load_c1,
    _load_c2,
    _load_c3,
    _store_c0,
    _store_c1,
    _store_c2,
    _store_c3,
    _tile_config,
    _tile_release,
    _tile_shapes,
    _zero_c0,
    _zero_c1,
    _zero_c2,
    _zero_c3,
)
from .intrinsics import _bits_of, _prefetch
from .kept import _kept_while_read_only, _read_only
from .pieces import _piece_threads, run_pieces

# A TDNN's weights are bf16 values in the released checkpoints (widened to float32 at load): each is one
# exact bf16 word, so the weights are the A tiles as they are, and the signal is split into its three exact
# parts (``_bf16_parts``) as in ``_tile_bf16_times``: every product exact, the same sums in the same order.
# The prompt's kernel would stream all of the split signal once per 32 outputs and read each tile's rows a
# whole reduction apart.  Here each thread splits ``TILE_TDNN_STEPS`` steps at a time into a buffer that
# stays in its level-2 cache, the taps read in place (no stacked copy), and every pair of weight tiles (one
# contiguous kilobyte each, made once per read-only weight) passes over them; bias and ReLU are applied as
# the sums are stored.  A tile register is not renamed, so a load waits for the multiplies still reading
# its register: the second tile of steps is loaded between the first one's two multiplies.

TILE_TDNN_STEPS = 128  # time steps of a block: their split taps (3 x 2 bytes x 128 x the stacked width, 1.2 MB
# at 1536 channels) stay in the thread's level-2 cache while every weight tile passes over them
TILE_SPLIT_AHEAD = 8  # columns ahead whose rows of x the split asks for while it splits the current ones
TILE_TDNN_MIN_STEPS = 32  # shorter signals keep the BLAS path (one pair of tiles of time steps)
TILE_TDNN_MIN_OUT = 256  # fewer outputs keep the BLAS path: the signal's split costs the same whatever O, and
# the tiles' saving on each product outweighs it only from a few hundred outputs


@numba.njit(inline="always")
def _mirrored(t, T):
    """The reflect padding's index: -t before the start, 2 (T - 1) - t past the end (the edge sample not
    repeated)."""
    return -t if t < 0 else (2 * (T - 1) - t if t >= T else t)


@numba.njit(inline="always")
def _tap_row_into(x_ct, i, start, n, row_n):
    """row[j] = x[i, r(start + j)] for j < n (r: the reflect padding, ``_mirrored``): a row of taps that
    reaches past an edge of x."""
    T = x_ct.shape[1]
    for j in range(n):
        row_n[j] = x_ct[i, _mirrored(start + j, T)]


@numba.njit(inline="always")
def _pair_parts_into(a_j, b_j, n, J, hi_j, mid_j, lo_j):
    """hi[j], mid[j], lo[j] = the parts (``_bf16_parts``) of a[j] in the low half and of b[j] in the high half
    of each word, for j < n; 0 for n <= j < J."""
    shift = np.uint32(16)
    for j in range(n):
        a_hi, a_mid, a_lo = _bf16_parts(a_j[j])
        b_hi, b_mid, b_lo = _bf16_parts(b_j[j])
        hi_j[j] = np.uint32(a_hi) | (np.uint32(b_hi) << shift)
        mid_j[j] = np.uint32(a_mid) | (np.uint32(b_mid) << shift)
        lo_j[j] = np.uint32(a_lo) | (np.uint32(b_lo) << shift)
    for j in range(n, J):
        hi_j[j] = 0
        mid_j[j] = 0
        lo_j[j] = 0


@numba.njit(cache=True, nogil=True)
def _split_taps_into_tiles(x_ct, K, dilation, first, t0, n, J, pairs_spqn):
    """pairs[s, p, q, j] = part p (``_bf16_parts``) of the stacked taps' row t = t0 + j at columns c = 32 s +
    2 q (low half) and c + 1 (high half), where column c = i K + k holds x[i, r(t + first + k dilation)] (r:
    the reflect padding); 0 for n <= j < J.  The B tile of steps t0 + 16 u ... + 15 is pairs[s, p, :, 16 u :
    16 u + 16]: 16 rows (pairs of columns) of 64 bytes a row of ``pairs`` apart.  A pair of columns whose
    taps lie inside x is split from x's rows in place; one that reaches past an edge from a row of its
    taps, mirrored (``_tap_row_into``)."""
    S = pairs_spqn.shape[0]
    T = x_ct.shape[1]
    x_flat = x_ct.reshape(-1)
    a_j = np.empty(J, dtype=np.float32)
    b_j = np.empty(J, dtype=np.float32)
    for h in range(16 * S):  # pairs of columns
        c = 2 * h
        for ahead in range(c + TILE_SPLIT_AHEAD, min(c + TILE_SPLIT_AHEAD + 2, 32 * S)):
            first_ahead = (ahead // K) * T + min(max(t0 + first + (ahead % K) * dilation, 0), T - 1)
            for j in range(0, n, 16):  # its lines asked for meanwhile (each row's are apart by the row)
                _prefetch(x_flat, min(first_ahead + j, x_flat.shape[0] - 1))
        ia, sa = c // K, t0 + first + (c % K) * dilation
        ib, sb = (c + 1) // K, t0 + first + ((c + 1) % K) * dilation
        s, q = h // 16, h % 16
        hi_j, mid_j, lo_j = pairs_spqn[s, 0, q], pairs_spqn[s, 1, q], pairs_spqn[s, 2, q]
        if min(sa, sb) >= 0 and max(sa, sb) + n <= T:
            _pair_parts_into(x_ct[ia, sa : sa + n], x_ct[ib, sb : sb + n], n, J, hi_j, mid_j, lo_j)
        else:
            _tap_row_into(x_ct, ia, sa, n, a_j)
            _tap_row_into(x_ct, ib, sb, n, b_j)
            _pair_parts_into(a_j, b_j, n, J, hi_j, mid_j, lo_j)


@numba.njit(cache=True, nogil=True)
def _bf16_words_into_tiles(w_om, tiles_usrc):
    """tiles[u, s, r, c] = the bf16 word of w[16 u + r, 32 s + c], True; False (tiles unfinished) as soon as a
    weight is not a bf16 value (its low 16 bits not zero): the A tiles of ``_taps_blocks_on_tiles``, each [r, c]
    one kilobyte (16 output rows x 32 words)."""
    O, M = w_om.shape
    for o in range(O):
        for c in range(M):
            bits = _bits_of(w_om[o, c])
            if bits & np.uint32(0xFFFF):
                return False
            tiles_usrc[o // 16, c // 32, o % 16, c % 32] = np.uint16(bits >> np.uint32(16))
    return True


@numba.njit(cache=True, nogil=True)
def _taps_blocks_on_tiles(x_ct, a_tiles_usrc, b_o, K, dilation, first, out_ot, th, n_threads):
    """out[o, t] = ReLU(b[o] + sum_c w[o, c] x_stacked[t, c]) on the tile registers, in blocks of
    ``TILE_TDNN_STEPS`` steps of which this call takes th, th + n_threads, ... (one piece of ``run_pieces``):
    the stacked taps' rows
    (``_split_taps_into_tiles``) times the weights' bf16 words (``_bf16_words_into_tiles``; O a multiple
    of 32, K I of 32), four float32 tiles of sums for every pair of weight tiles: the order of
    ``_tile_bf16_times``, the same bits as it gives for the stacked rows.  A step's sums see its row alone."""
    U, S = a_tiles_usrc.shape[0], a_tiles_usrc.shape[1]
    NB = TILE_TDNN_STEPS
    T = x_ct.shape[1]
    blocks = (T + NB - 1) // NB
    steps = TILE_K_SPAN // 32
    a_words = a_tiles_usrc.reshape(-1)
    J = NB + 16  # a row of the split taps: the block's steps and 64 bytes more (rows a power of two apart
    pairs_spqn = np.empty((S, 3, 16, J), dtype=np.uint32)  # would fall in the same sets of the cache)
    b_words = pairs_spqn.reshape(-1).view(np.uint16)
    span_rn = np.empty((32, NB), dtype=np.float32)
    sums_rn = np.empty((32, NB), dtype=np.float32)
    span = span_rn.reshape(-1)
    _tile_config(_tile_shapes())
    for blk in range(th, blocks, n_threads):
        t0 = blk * NB
        n = min(NB, T - t0)
        pairs = (n + 31) // 32  # pairs of 16-step tiles
        _split_taps_into_tiles(x_ct, K, dilation, first, t0, n, 32 * pairs, pairs_spqn)
        for up in range(U // 2):
            for s0 in range(0, S, steps):
                for v in range(pairs):
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                    for s in range(s0, min(s0 + steps, S)):
                        _load_a4(a_words, ((2 * up) * S + s) * 512, 64)
                        _load_a5(a_words, ((2 * up + 1) * S + s) * 512, 64)
                        for p in range(3):
                            b0 = ((s * 3 + p) * 16 * J + 32 * v) * 2
                            _load_b6(b_words, b0, 4 * J)
                            _dot_c0()
                            _dot_c2()
                            _load_b7(b_words, b0 + 32, 4 * J)
                            _dot_c1()
                            _dot_c3()
                    _store_c0(span, 32 * v, 4 * NB)
                    _store_c1(span, 32 * v + 16, 4 * NB)
                    _store_c2(span, 16 * NB + 32 * v, 4 * NB)
                    _store_c3(span, 16 * NB + 32 * v + 16, 4 * NB)
                if s0 == 0 and steps < S:
                    sums_rn[:, :n] = span_rn[:, :n]
                elif s0 > 0:
                    for r in range(32):
                        for t in range(n):
                            sums_rn[r, t] += span_rn[r, t]
            final_rn = span_rn if steps >= S else sums_rn  # (one span: its sums are the sums)
            for r in range(32):
                o = 32 * up + r
                bias, sums_t, out_t = b_o[o], final_rn[r], out_ot[o, t0 : t0 + n]
                for t in range(n):
                    y = sums_t[t] + bias
                    out_t[t] = np.float32(0.0) if y <= 0 else y
    _tile_release()


_TDNN_TILES: dict = {}  # id of a read-only weight -> (a weak reference to it, its tiles or None)


def _tdnn_weight_tiles(w_oik):
    """The A tiles of a TDNN's float32 weight [O, I, K] seen as [O, I K] (``_bf16_words_into_tiles``), or
    None where O is not a multiple of 32, I K not of 32, or some weight is not a bf16 value (the check stops
    at the first).  Kept as long as the weight lives where it is read-only (a model's weights:
    ``SpeakerEncoder`` makes them so), made again for each call otherwise."""
    O, I, K = w_oik.shape
    if O % 32 or (I * K) % 32 or w_oik.dtype != np.float32:
        return None
    return _kept_while_read_only(_TDNN_TILES, w_oik, _tdnn_tiles_of)


def _tdnn_tiles_of(w_oik):
    """``_tdnn_weight_tiles`` made (None where some weight is not a bf16 value)."""
    O, I, K = w_oik.shape
    tiles_usrc = np.empty((O // 16, I * K // 32, 16, 32), np.uint16)
    ok = _bf16_words_into_tiles(np.ascontiguousarray(w_oik).reshape(O, I * K), tiles_usrc)
    return tiles_usrc if ok else None


def _taps_on_tiles(x_ct, tiles_usrc, b_o, K, dilation, first, out_ot):
    """out = ReLU(the stacked taps' product by the weight's tiles + b): the blocks of ``_taps_blocks_on_tiles``
    shared out over the piece threads (``run_pieces``)."""
    x_ct, n = np.ascontiguousarray(x_ct), _piece_threads()
    run_pieces(
        lambda th: _taps_blocks_on_tiles(x_ct, tiles_usrc, b_o, K, dilation, first, out_ot, th, n),
        [(th,) for th in range(n)],
    )


# The decoder's residual units are float32 convolutions (a k7 dilated conv and a 1x1 conv, C -> C channels),
# most of a decode's work.  On the tiles both operands are split into their exact bf16 parts (weights w =
# wh + wm + wl, signal z = zh + zm + zl) and six of the nine products of parts are summed: every term
# down to 2^-16 of the product (hh; hm, mh; hl, mm, lh), the three dropped ones (ml, lm, ll) below
# 2^-23 of it together, about one float32 rounding of each product.  The reduction runs over blocks of 32
# channels and, within a block, over the taps, so that a tap's tile of z is the split SnakeBeta rows
# themselves, shifted by k * dilation: no stacked taps are written at all.

TILE_CONV_STEPS = 42  # steps (32 channels of one tap) summed in the tiles before they are stored and reloaded
UNIT_TILES_MIN_STEPS = 1024  # shorter signals keep the BLAS path where the weights are split for each call
# Where their tiles are kept (a model's read-only weights): on the tiles from 256 steps.  Below, the six
# products of parts cost more than the vector kernels' one (a short streaming push's widest units).
KEPT_TILES_MIN_STEPS = 256


@numba.njit(cache=True, nogil=True)
def _split_weight_into_tiles(w_oik, o0, o1, tiles_usprj):
    """tiles[o // 16, b K + k, p, o % 16, j] = part p (``_bf16_parts``) of w[o, 32 b + j, k] for o0 <= o < o1
    (multiples of 16): the conv weight in three bf16 words, each A tile of ``_tile_conv_into`` (16 outputs
    x 32 channels of one tap and one part) a contiguous kilobyte, in the order the kernel reads them (rows
    of 64 bytes a whole reduction apart fell in a few sets of the first-level cache)."""
    C, K = w_oik.shape[1], w_oik.shape[2]
    for o in range(o0, o1):
        for b in range(C // 32):
            for k in range(K):
                w_j, tile_prj = w_oik[o, 32 * b : 32 * b + 32, k], tiles_usprj[o // 16, b * K + k]
                hi_j, mid_j, lo_j = tile_prj[0, o % 16], tile_prj[1, o % 16], tile_prj[2, o % 16]
                for j in range(32):  # (over 1-D views from 0: the loop vectorises)
                    hi_j[j], mid_j[j], lo_j[j] = _bf16_parts(w_j[j])


_WEIGHT_TILES: dict = {}  # id of a read-only conv weight -> (a weak reference to it, its tiles)


def _weight_tiles(w_oik):
    """[O / 16, K C / 32, 3, 16, 32]: ``_split_weight_into_tiles`` of the whole weight (O a multiple of 32),
    its rows shared out over the piece threads in whole tiles; kept while the weight lives where it is
    read-only (``_kept_while_read_only``: a model's weights are split at their first call only), else split
    again for each call, into the model's workspace."""
    if _read_only(w_oik):
        return _kept_while_read_only(_WEIGHT_TILES, w_oik, lambda w: _split_weight_tiles(w, np.empty))
    return _split_weight_tiles(w_oik, new_output)


def _split_weight_tiles(w_oik, allocate):
    """``_weight_tiles`` made, into ``allocate(shape, dtype)``."""
    O, C, K = w_oik.shape
    tiles_usprj = allocate((O // 16, K * C // 32, 3, 16, 32), np.uint16)  # (25 MB at 768 channels)
    n = min(_piece_threads(), O // 16)
    shares = [(16 * (O // 16 * t // n), 16 * (O // 16 * (t + 1) // n)) for t in range(n)]
    run_pieces(lambda o0, o1: _split_weight_into_tiles(w_oik, o0, o1, tiles_usprj), shares)
    return tiles_usprj


@numba.njit(fastmath={"contract"}, inline="always")
def _split_pair_into(a_t, b_t, q, parts_pqt):
    """parts[p, q, t] = the pair of part p (``_bf16_parts``) of a[t] (low half) and of b[t] (high
    half), for the rows of channels 2 q and 2 q + 1: the B tiles' layout (each element two channels'
    words, time along the tile's 16 columns)."""
    for t in range(a_t.shape[0]):
        a_hi, a_mid, a_lo = _bf16_parts(a_t[t])
        b_hi, b_mid, b_lo = _bf16_parts(b_t[t])
        parts_pqt[0, q, t] = (np.uint32(b_hi) << np.uint32(16)) | np.uint32(a_hi)
        parts_pqt[1, q, t] = (np.uint32(b_mid) << np.uint32(16)) | np.uint32(a_mid)
        parts_pqt[2, q, t] = (np.uint32(b_lo) << np.uint32(16)) | np.uint32(a_lo)


@numba.njit(inline="always", cache=True)  # (called from Python too: cached, not compiled by each process)
def _pair_row_length(steps):
    """Time steps of a row of channel pairs (4 bytes each): at least ``steps``, a whole number of 64-byte
    lines and an odd one, so that the 16 rows of a B tile fall in 16 different sets of the cache."""
    lines = (steps + 15) // 16
    return 16 * (lines + 1 - lines % 2)


@numba.njit(cache=True, nogil=True)
def _tile_conv_into(a_tiles, z_pqt, K, dilation, stride, steps, out_on):
    """out[o, t] = sum_k sum_c w[o, c, k] z[c, t + k dilation] for t < steps (a multiple of 32; O and C
    multiples of 32), w and z given by their parts (``a_tiles``: ``_weight_tiles``, ``z_pqt``:
    ``_split_pair_into``), on this thread's tiles.  With a stride s, z holds s phases one after the other
    (the samples t s + p) and tap k reads phase k % s at the offset k // s.  An output's sums are a float32
    chain in the order of the reduction.  A NaN in z gives NaN; an infinity would too where a weight's part
    is 0, but none reaches here (SnakeBeta of an infinity is NaN)."""
    S = a_tiles.shape[1]
    O = a_tiles.shape[0] * 16
    L = z_pqt.shape[2]
    A, Z = a_tiles.reshape(-1), z_pqt.reshape(-1)
    out = out_on.reshape(-1)
    row = out_on.shape[1]
    pz = z_pqt.shape[1] * L  # pairs of words per part of z
    phase = pz // stride  # pairs of words per phase
    _tile_config(_tile_shapes())
    blocks = S // K  # of 32 channels
    span = max(1, TILE_CONV_STEPS // K)  # blocks summed in the tiles before they are stored (a store waits)
    for b0 in range(0, blocks, span):
        for o0 in range(0, O, 32):
            for t0 in range(0, steps, 32):
                c_first, c_second = o0 * row + t0, (o0 + 16) * row + t0
                if b0 == 0:
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                else:
                    _load_c0(out, c_first, 4 * row)
                    _load_c1(out, c_first + 16, 4 * row)
                    _load_c2(out, c_second, 4 * row)
                    _load_c3(out, c_second + 16, 4 * row)
                for s in range(b0 * K, min(b0 + span, blocks) * K):
                    cb, k = s // K, s % K
                    a = ((o0 // 16) * S + s) * 1536  # tile (o0 / 16, step s, part p): a + 512 p
                    a2 = a + S * 1536  # outputs o0 + 16 ..
                    z = cb * 16 * L + t0 + (k % stride) * phase + (k // stride) * dilation  # (pairs 16 cb ..)
                    # the six products of parts (lh, mh, mm, hm, hl, hh), one operand reloaded at a time: a
                    # tile load waits for the multiplies still reading that tile
                    _load_a4(A, a + 1024, 64)  # wl
                    _load_a5(A, a2 + 1024, 64)
                    _load_b6(Z, z, 4 * L)  # zh
                    _load_b7(Z, z + 16, 4 * L)
                    _dots_after_a()
                    _load_a4(A, a + 512, 64)  # wm
                    _load_a5(A, a2 + 512, 64)
                    _dots_after_a()
                    _load_b6(Z, pz + z, 4 * L)  # zm
                    _load_b7(Z, pz + z + 16, 4 * L)
                    _dots_after_b()
                    _load_a4(A, a, 64)  # wh
                    _load_a5(A, a2, 64)
                    _dots_after_a()
                    _load_b6(Z, 2 * pz + z, 4 * L)  # zl
                    _load_b7(Z, 2 * pz + z + 16, 4 * L)
                    _dots_after_b()
                    _load_b6(Z, z, 4 * L)  # zh
                    _load_b7(Z, z + 16, 4 * L)
                    _dots_after_b()
                _store_c0(out, c_first, 4 * row)
                _store_c1(out, c_first + 16, 4 * row)
                _store_c2(out, c_second, 4 * row)
                _store_c3(out, c_second + 16, 4 * row)
    _tile_release()


@numba.njit(inline="always")
def _dots_after_a():
    """The four multiplies, those reading A tile 4 first (it is the next one reloaded)."""
    _dot_c0()
    _dot_c1()
    _dot_c2()
    _dot_c3()


@numba.njit(inline="always")
def _dots_after_b():
    """The four multiplies, those reading B tile 6 first."""
    _dot_c0()
    _dot_c2()
    _dot_c1()
    _dot_c3()


@numba.njit(inline="always", cache=True)  # (called from Python too)
def _unit_scratch_words(C, Ch, steps, left):
    """The 32-bit words a piece of ``steps`` (a multiple of 32) of a C -> Ch -> C unit needs (``_unit_scratch``)."""
    L1, width = _pair_row_length(steps + left), _pair_row_length(steps)
    return 3 * (C // 2) * L1 + Ch * width + 3 * (Ch // 2) * width + C * width + 2 * (left + steps)


@numba.njit(inline="always")
def _unit_scratch(scratch, C, Ch, steps, left, n):
    """Views of ``scratch`` for a piece of a C -> Ch -> C unit (each row of pairs and of sums an odd number of
    lines: ``_pair_row_length``): z1 [3, C / 2, L1] (the first conv's split input), h [Ch, width] float32
    (its sums), z2 [3, Ch / 2, width] (the second conv's split input), g [C, width] float32 (its sums) and
    two rows [2, left + n] float32."""
    L1, width = _pair_row_length(steps + left), _pair_row_length(steps)
    s1, s2, s3, s4 = 3 * (C // 2) * L1, Ch * width, 3 * (Ch // 2) * width, C * width
    z1 = scratch[:s1].reshape((3, C // 2, L1))
    h = scratch[s1 : s1 + s2].view(np.float32).reshape((Ch, width))
    z2 = scratch[s1 + s2 : s1 + s2 + s3].reshape((3, Ch // 2, width))
    g = scratch[s1 + s2 + s3 : s1 + s2 + s3 + s4].view(np.float32).reshape((C, width))
    end = s1 + s2 + s3 + s4
    rows = scratch[end : end + 2 * (left + n)].view(np.float32).reshape((2, left + n))
    return z1, h, z2, g, rows


def _convs_take_tiles(C: int, Ch: int, T: int, *weights) -> bool:
    """Whether convs between C and Ch channels over T output steps (a residual unit C -> C -> C, a block
    C -> Ch -> C, a strided conv C -> Ch) with these weights run on the tiles: granted (``USE_TILES``), whole
    tiles of channels, and a signal long enough that the weights' split is a small part of the work:
    ``KEPT_TILES_MIN_STEPS`` where every weight is read-only (a model's: split once and kept), else
    ``UNIT_TILES_MIN_STEPS`` (split for this call; set lower, as the tests do, it lowers both)."""
    kept = all(_read_only(w) for w in weights)
    min_steps = min(KEPT_TILES_MIN_STEPS, UNIT_TILES_MIN_STEPS) if kept else UNIT_TILES_MIN_STEPS
    return amx.USE_TILES and C % 32 == 0 and Ch % 32 == 0 and min_steps <= T
