"""The twins of ``refimpl/codec/encoder.py``: the residual block (ELU, k3 conv, ELU, 1x1 conv, residual) and
ELU into a strided causal conv, over pieces of time with the ELU taken as the taps are stacked; both on the
AMX tiles where granted."""

from __future__ import annotations

import numba
import numpy as np

from ... import nn
from ..host_memory import new_output, thread_words
from .amx_conv import (
    _convs_take_tiles,
    _pair_row_length,
    _split_pair_into,
    _tile_conv_into,
    _unit_scratch,
    _unit_scratch_words,
    _weight_tiles,
)
from .conv import CONV_PIECE_BYTES, CONV_PIECE_MIN_COLUMNS, _direct_conv_into, direct_conv_takes, direct_width
from .elementwise import _add_bias_and_residual, _add_bias_and_residual_rows
from .intrinsics import FASTMATH, _expm1_f32
from .kept import _kept_while_read_only
from .pieces import run_pieces


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_elu_taps_into(x_ct, negative_cs, a, first, stride, dilation, cols_ckn):
    """cols[c, k, j] = ELU(x[c, p]), p = first + j * stride + k * dilation, as ``elu`` computes it, and 0
    where p is outside x (a causal conv's zero padding): ``elu``'s max(x, 0) + expm1(min(x, 0)) is x where
    x > 0, else negative[c, p - a] (NumPy's expm1 of min(x, 0), taken by the caller over x[:, a : a + S];
    NaN stays NaN).  The ELU's own max, sum and zero-padded copy are never made."""
    C, K, N = cols_ckn.shape
    z = a + negative_cs.shape[1]  # x is read at a <= p < z
    for c in range(C):
        for k in range(K):
            start = first + k * dilation
            j0 = min(max(-(-(a - start) // stride), 0), N)  # the first j with p >= a
            j1 = max(min(-(-(z - start) // stride), N), j0)  # the first j with p >= z
            cols_ckn[c, k, :j0] = 0.0
            if j1 > j0:  # (loops over views from index 0: see ``_snake_row_into``)
                p0, p1 = start + j0 * stride, start + (j1 - 1) * stride + 1
                x_m, out_m = x_ct[c, p0:p1:stride], cols_ckn[c, k, j0:j1]
                negative_m = negative_cs[c, p0 - a : p1 - a : stride]
                for j in range(out_m.shape[0]):
                    v = x_m[j]
                    out_m[j] = v if v > 0 else negative_m[j]
            cols_ckn[c, k, j1:] = 0.0


def _elu_taps(x_ct, first: int, stride: int, dilation: int, K: int, n: int):
    """The K taps (``stride``, ``dilation``) of n output columns of a conv over ELU(x), its input read from
    x's sample ``first`` on, zeros outside x: [C, K, n] (``_stack_elu_taps_into``; the same bits as the
    ELU's output padded and stacked)."""
    C, T = x_ct.shape
    stop = first + (n - 1) * stride + (K - 1) * dilation + 1
    a = max(first, 0)
    z = max(min(stop, T), a)
    negative_cs = np.minimum(x_ct[:, a:z], 0)
    np.expm1(negative_cs, out=negative_cs)
    cols_ckn = np.empty((C, K, n), x_ct.dtype)
    _stack_elu_taps_into(x_ct, negative_cs, a, first, stride, dilation, cols_ckn)
    return cols_ckn


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_split_into(h_on, bias_o, negative_on):
    """h = h + bias and negative = min(h + bias, 0), in one pass (the first half of an ELU after a bias; a NaN
    stays NaN in both, as with ``np.minimum``)."""
    for o in range(h_on.shape[0]):
        bias, h_n, negative_n = bias_o[o], h_on[o], negative_on[o]
        for j in range(h_n.shape[0]):
            y = h_n[j] + bias
            h_n[j] = y
            negative_n[j] = np.float32(0.0) if y >= 0 else y


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _keep_positive_else_into(h_on, negative_on):
    """h = h where h > 0, else negative (the ELU's max(h, 0) + expm1(min(h, 0)), one term of which is 0)."""
    for o in range(h_on.shape[0]):
        h_n, negative_n = h_on[o], negative_on[o]
        for j in range(h_n.shape[0]):
            v = h_n[j]
            h_n[j] = v if v > 0 else negative_n[j]


def resnet_block(b, cfg, dilation: int, x_bct, record=None):
    """``codec.encoder.resnet_block`` with an identity shortcut in one pass (``resnet_block_offline``) from
    the block's weights; a 1x1 conv shortcut: ``NotImplemented``."""
    if cfg.use_conv_shortcut:
        return NotImplemented
    w1_oik, b1_o = b["block.1.conv.weight"], b.get("block.1.conv.bias")
    w2_oi1, b2_o = b["block.3.conv.weight"], b.get("block.3.conv.bias")
    return resnet_block_offline(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, cfg.pad_mode)


def elu_causal_conv(w, cfg, act: str, conv: str, stride: int, x_bct, record=None):
    """``codec.encoder.elu_causal_conv`` in one pass (``elu_causal_conv_offline``) from the conv's weights."""
    return elu_causal_conv_offline(x_bct, w[f"{conv}conv.weight"], w.get(f"{conv}conv.bias"), stride, cfg.pad_mode)


def resnet_block_offline(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, pad_mode):
    """x + conv_k1(ELU(causal_conv_k3(ELU(x)))) with an identity shortcut, on plain arrays (float32, zero
    padding; else ``NotImplemented``: the reference runs) over pieces of time, each carried
    through the whole block by one thread in its core's cache: ELU of the piece and its left context as
    its taps are stacked (``_elu_taps``), one product for the k3 conv (C -> Ch), bias + ELU
    (``_add_bias_and_split_into``), one for the k1 conv (Ch -> C), bias + residual into the output in one
    pass.  The ELUs are ``elu``'s own operations (NumPy's expm1: the reference's bits).  On the AMX tiles:
    ``_resnet_block_on_tiles``; where the direct kernel takes the k3 conv (``direct_conv_takes``):
    ``_resnet_block_direct``."""
    B, C, T = x_bct.shape
    Ch, _, K = w1_oik.shape
    if (
        x_bct.dtype != np.float32
        or pad_mode != "constant"
        or w2_oi1.shape != (C, Ch, 1)
        or b1_o is None
        or b2_o is None
    ):
        return NotImplemented
    left = (K - 1) * dilation
    w1_m = np.ascontiguousarray(w1_oik.reshape(Ch, C * K))  # column c * K + k: the order of the stacked taps
    w2_m = np.ascontiguousarray(w2_oi1[:, :, 0])
    n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * C * K))  # ``conv1d``'s pieces
    out_bct = new_output((B, C, T))
    if _convs_take_tiles(C, Ch, T, w1_oik, w2_oi1):
        _resnet_block_on_tiles(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct)
        return out_bct
    if direct_conv_takes(Ch, C, K):
        _resnet_block_direct(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct)
        return out_bct

    def piece(b, t0):
        n = min(n_piece, T - t0)
        cols_ckn = _elu_taps(x_bct[b], t0 - left, 1, dilation, K, n)
        h_hn = w1_m @ cols_ckn.reshape(C * K, n)
        negative_hn = np.empty_like(h_hn)
        _add_bias_and_split_into(h_hn, b1_o, negative_hn)  # h + b1, and min(h + b1, 0)
        np.expm1(negative_hn, out=negative_hn)
        _keep_positive_else_into(h_hn, negative_hn)  # ELU(h + b1)
        _add_bias_and_residual(w2_m @ h_hn, b2_o, x_bct[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)])
    return out_bct


def elu_causal_conv_offline(x_bct, w_oik, b_o, stride, pad_mode):
    """causal_conv(ELU(x)) on plain arrays (float32, zero padding; else ``NotImplemented``) over pieces of
    output columns, each
    one thread's: the ELU of the input span the piece reads (zeros in the causal padding, where the
    reference pads the ELU's output with zeros), its K taps stacked with the stride as the ELU is taken
    (``_elu_taps``), one matrix product, + bias.  The ELU is ``elu``'s own operations (the same bits as the
    reference's).  On the AMX tiles: ``_elu_conv_on_tiles``; where the direct kernel takes its phases
    (``direct_conv_takes``): ``_elu_conv_direct``."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    if x_bct.dtype != np.float32 or pad_mode != "constant" or I != C:
        return NotImplemented
    left = nn.causal_padding(K, stride)
    padded = left + T + nn.extra_right_padding(T, K, stride)
    T_out = (padded - K) // stride + 1
    w_m = np.ascontiguousarray(w_oik.reshape(O, C * K))  # column c * K + k: the order of the stacked taps
    n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * C * K))  # ``conv1d``'s pieces
    out_bot = new_output((B, O, T_out))
    if _convs_take_tiles(C, O, T_out, w_oik):
        _elu_conv_on_tiles(x_bct, w_oik, b_o, stride, left, out_bot)
        return out_bot
    if K % stride == 0 and direct_conv_takes(O, C * stride, K // stride):
        _elu_conv_direct(x_bct, w_oik, b_o, stride, left, out_bot)
        return out_bot

    def piece(b, t0):
        n = min(n_piece, T_out - t0)
        cols_ckn = _elu_taps(x_bct[b], t0 * stride - left, stride, 1, K, n)  # the span read, from x's sample
        out_on = out_bot[b, :, t0 : t0 + n]
        np.matmul(w_m, cols_ckn.reshape(C * K, n), out=out_on)
        if b_o is not None:
            out_on += b_o[:, None]

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)])
    return out_bot


BLOCK_PIECE_VALUES = 1 << 18  # channels x steps of a piece (C = 64: 4096 steps)


@numba.njit(fastmath={"contract"}, inline="always")
def _elu_row_into(x_t, T, start, bias, out_n):
    """out[j] = ELU(x[start + j] + bias) where 0 <= start + j < T, else 0 (the causal zero padding; ELU(0) = 0):
    y where y > 0, else ``_expm1_f32(y)`` (NaN stays NaN).  Over 1-D views from index 0 (see
    ``_snake_row_into``)."""
    N = out_n.shape[0]
    j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)
    out_n[:j0] = 0.0
    if j1 > j0:
        x_m, out_m = x_t[start + j0 : start + j1], out_n[j0:j1]
        for j in range(x_m.shape[0]):
            y = x_m[j] + bias
            e = _expm1_f32(min(y, np.float32(0.0)))
            out_m[j] = y if y > np.float32(0.0) else e
    out_n[max(j1, j0) :] = 0.0


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _resnet_piece_on_tiles(x_ct, t0, n, a1_tiles, b1_o, a2_tiles, b2_o, dilation, out_ct, scratch):
    """``resnet_block_offline``'s output steps t0 .. t0 + n - 1 on the tiles, in one call: ELU of the piece and
    its (K - 1) dilation samples before (``_elu_row_into``) split into the pair layout, the k3 conv C -> Ch
    (``_tile_conv_into``), bias + ELU split likewise, the 1x1 conv Ch -> C, then bias + residual into ``out``.
    The ELU's expm1 is ``_expm1_f32`` (within 2 ulp of NumPy's, tested), so that the piece is one call of
    compiled code and the threads' pieces run side by side (with NumPy's expm1 between Numba calls, the
    piece's steps from Python held the threads back)."""
    C, T = x_ct.shape
    Ch = a1_tiles.shape[0] * 16
    K = a1_tiles.shape[1] * 32 // C
    left = (K - 1) * dilation
    steps = (n + 31) // 32 * 32
    z1, h, z2, g, rows = _unit_scratch(scratch, C, Ch, steps, left, n)
    z1[:, :, left + n :] = 0
    row_a, row_b = rows[0], rows[1]
    zero = np.float32(0.0)
    for c in range(0, C, 2):
        _elu_row_into(x_ct[c], T, t0 - left, zero, row_a)
        _elu_row_into(x_ct[c + 1], T, t0 - left, zero, row_b)
        _split_pair_into(row_a, row_b, c // 2, z1)
    _tile_conv_into(a1_tiles, z1, K, dilation, 1, steps, h)
    z2[:, :, n:] = 0
    for c in range(0, Ch, 2):
        _elu_row_into(h[c], n, 0, b1_o[c], row_a[:n])
        _elu_row_into(h[c + 1], n, 0, b1_o[c + 1], row_b[:n])
        _split_pair_into(row_a[:n], row_b[:n], c // 2, z2)
    _tile_conv_into(a2_tiles, z2, 1, 0, 1, steps, g)
    _add_bias_and_residual_rows(g, n, b2_o, x_ct, t0, out_ct)


def _resnet_block_on_tiles(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct):
    """``resnet_block_offline``'s pieces on the tiles (``_resnet_piece_on_tiles``), side by side, the weights'
    tiles those of ``_weight_tiles``."""
    B, C, T = x_bct.shape
    Ch, _, K = w1_oik.shape
    a1, a2 = _weight_tiles(w1_oik), _weight_tiles(w2_oi1)
    n_piece = max(32, BLOCK_PIECE_VALUES // C // 32 * 32)
    words = _unit_scratch_words(C, Ch, (n_piece + 31) // 32 * 32, (K - 1) * dilation)
    x_bct = np.ascontiguousarray(x_bct)
    b1_o, b2_o = np.ascontiguousarray(b1_o, dtype=np.float32), np.ascontiguousarray(b2_o, dtype=np.float32)
    run_pieces(
        lambda b, t0: _resnet_piece_on_tiles(
            x_bct[b], t0, min(n_piece, T - t0), a1, b1_o, a2, b2_o, dilation, out_bct[b], thread_words(words)
        ),
        [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)],
    )


@numba.njit(inline="always", cache=True)  # (called from Python too)
def _elu_conv_scratch_words(C, O, K, stride, n):
    """The 32-bit words a piece of n outputs of ``_elu_conv_piece_on_tiles`` needs (its views, in order: the
    split phases, the sums, two rows of the ELU's span, two rows of one phase)."""
    steps, m = (n + 31) // 32 * 32, n + (K - 1) // stride
    L = _pair_row_length(steps + (K - 1) // stride)
    return 3 * stride * (C // 2) * L + O * _pair_row_length(steps) + 2 * m * stride + 2 * m


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _elu_conv_piece_on_tiles(x_ct, t0, n, a_tiles, b_o, stride, left, out_ot, scratch):
    """``elu_causal_conv_offline``'s outputs t0 .. t0 + n - 1 on the tiles, in one call: ELU of the input span
    they read (``_elu_row_into``: zeros in the causal padding and beyond x), split into the pair layout phase
    by phase (phase p: the samples t stride + p, so that each tap of the strided conv is a shift of one
    phase: ``_tile_conv_into``), one product, + bias."""
    C, T = x_ct.shape
    O = a_tiles.shape[0] * 16
    K = a_tiles.shape[1] * 32 // C
    m = n + (K - 1) // stride  # samples per phase
    steps = (n + 31) // 32 * 32
    L, width = _pair_row_length(steps + (K - 1) // stride), _pair_row_length(steps)
    s1, s2 = 3 * stride * (C // 2) * L, O * width
    z_pqt = scratch[:s1].reshape((3, stride * (C // 2), L))
    sums_ot = scratch[s1 : s1 + s2].view(np.float32).reshape((O, width))
    span_2s = scratch[s1 + s2 : s1 + s2 + 2 * m * stride].view(np.float32).reshape((2, m * stride))
    rows_2m = scratch[s1 + s2 + 2 * m * stride : s1 + s2 + 2 * m * stride + 2 * m].view(np.float32).reshape((2, m))
    z_pqt[:, :, m:] = 0
    zero = np.float32(0.0)
    for c in range(0, C, 2):
        _elu_row_into(x_ct[c], T, t0 * stride - left, zero, span_2s[0])
        _elu_row_into(x_ct[c + 1], T, t0 * stride - left, zero, span_2s[1])
        for p in range(stride):
            for j in range(m):
                rows_2m[0, j] = span_2s[0, p + j * stride]
                rows_2m[1, j] = span_2s[1, p + j * stride]
            _split_pair_into(rows_2m[0], rows_2m[1], p * (C // 2) + c // 2, z_pqt)
    _tile_conv_into(a_tiles, z_pqt, K, 1, stride, steps, sums_ot)
    for o in range(O):
        bias, sums_n, out_n = b_o[o], sums_ot[o, :n], out_ot[o, t0 : t0 + n]
        for j in range(n):
            out_n[j] = sums_n[j] + bias


def _elu_conv_on_tiles(x_bct, w_oik, b_o, stride, left, out_bot):
    """``elu_causal_conv_offline``'s pieces on the tiles (``_elu_conv_piece_on_tiles``), side by side, the
    weight's tiles those of ``_weight_tiles``."""
    B, C, _ = x_bct.shape
    O, _, K = w_oik.shape
    T_out = out_bot.shape[-1]
    a_tiles = _weight_tiles(w_oik)
    bias_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o, dtype=np.float32)
    n_piece = max(32, BLOCK_PIECE_VALUES // (C * stride) // 32 * 32)
    words = _elu_conv_scratch_words(C, O, K, stride, n_piece)
    x_bct = np.ascontiguousarray(x_bct)
    run_pieces(
        lambda b, t0: _elu_conv_piece_on_tiles(
            x_bct[b], t0, min(n_piece, T_out - t0), a_tiles, bias_o, stride, left, out_bot[b], thread_words(words)
        ),
        [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)],
    )


BLOCK_DIRECT_VALUES = 1 << 16  # channels x steps of a piece on the direct kernel (C = 64: 1024 steps)


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _resnet_convs_direct(x_ct, t0, n, w1_oik, b1_o, dilation, z, h, g):
    """The first half of ``resnet_block_offline``'s output steps t0 .. t0 + n - 1 by the direct kernel
    (``_direct_conv_into``): ELU of the piece and its (K - 1) dilation samples before (``_elu_row_into``,
    zeros in the causal padding) into the rows of z (zeros after them), the k3 conv C -> Ch read from them as
    shifts into h, then bias + ELU into g (zeros after n)."""
    C, T = x_ct.shape
    Ch, K = w1_oik.shape[0], w1_oik.shape[2]
    left = (K - 1) * dilation
    zero = np.float32(0.0)
    for c in range(C):
        _elu_row_into(x_ct[c], T, t0 - left, zero, z[c, : left + n])
        z[c, left + n :] = 0.0
    _direct_conv_into(z, w1_oik, dilation, n, h)
    for o in range(Ch):
        _elu_row_into(h[o], n, 0, b1_o[o], g[o, :n])
        g[o, n:] = 0.0


def _resnet_block_direct(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct):
    """``resnet_block_offline``'s pieces with the k3 conv on the direct kernel (``_resnet_convs_direct``; its
    ELUs' expm1 ``_expm1_f32``, as on the tiles), the 1x1 conv too where it takes it (``direct_conv_takes``;
    else BLAS's product), then bias + residual; side by side, each in this thread's words."""
    B, C, T = x_bct.shape
    Ch, _, K = w1_oik.shape
    left = (K - 1) * dilation
    x_bct = np.ascontiguousarray(x_bct)
    w1_oik, w2_oi1 = np.ascontiguousarray(w1_oik, np.float32), np.ascontiguousarray(w2_oi1, np.float32)
    b1_o, b2_o = np.ascontiguousarray(b1_o, dtype=np.float32), np.ascontiguousarray(b2_o, dtype=np.float32)
    direct_1x1, w2_m = direct_conv_takes(C, Ch, 1), w2_oi1[:, :, 0]
    n_piece = max(64, BLOCK_DIRECT_VALUES // C // 64 * 64)

    def piece(b, t0):
        n = min(n_piece, T - t0)
        W = direct_width(n)  # (a short signal: its own steps only)
        words = thread_words(C * (left + W) + 2 * Ch * W + C * W).view(np.float32)
        z, rest = words[: C * (left + W)].reshape(C, left + W), words[C * (left + W) :]
        h, g = rest[: 2 * Ch * W].reshape(2, Ch, W)
        sums = rest[2 * Ch * W : 2 * Ch * W + C * W].reshape(C, W)
        _resnet_convs_direct(x_bct[b], t0, n, w1_oik, b1_o, dilation, z, h, g)
        if direct_1x1:
            _direct_conv_into(g, w2_oi1, 1, n, sums)
        else:
            np.matmul(w2_m, g, out=sums)
        _add_bias_and_residual(sums[:, :n], b2_o, x_bct[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)])


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _elu_phases_into(x_ct, t0, n, stride, left, span_s, z_rm):
    """z[c stride + p, j] = ELU(x[c, (t0 + j) stride + p - left]) (``_elu_row_into``: zeros in the causal
    padding and beyond x) for j < m = n + K / stride - 1, zeros after: the ELU's span of outputs t0 .. t0 + n
    - 1 in its ``stride`` phases, so that tap k = p + stride q of the strided conv is phase p shifted by q
    (``_phase_weight``), for ``_direct_conv_into``.  ``span_s``: a row of m stride samples."""
    C, T = x_ct.shape
    m = span_s.shape[0] // stride
    zero = np.float32(0.0)
    for c in range(C):
        _elu_row_into(x_ct[c], T, t0 * stride - left, zero, span_s)
        for p in range(stride):
            row = z_rm[c * stride + p]
            for j in range(m):
                row[j] = span_s[p + j * stride]
            row[m:] = 0.0


_PHASE_WEIGHTS: dict = {}  # stride -> {id of a read-only conv weight: (a weak reference to it, its phases' weight)}


def _phase_weight(w_oik, stride):
    """w'[o, c stride + p, q] = w[o, c, p + stride q]: the strided conv's weight as a conv of Q = K / stride taps
    over the ``stride`` phases of each channel (``_elu_phases_into``), kept for a model's read-only weights."""
    O, C, K = w_oik.shape

    def make(w):
        return np.ascontiguousarray(w.reshape(O, C, K // stride, stride).transpose(0, 1, 3, 2), np.float32).reshape(
            O, C * stride, K // stride
        )

    return _kept_while_read_only(_PHASE_WEIGHTS.setdefault(stride, {}), w_oik, make)


def _elu_conv_direct(x_bct, w_oik, b_o, stride, left, out_bot):
    """``elu_causal_conv_offline``'s pieces on the direct kernel: each piece's ELU span in its phases
    (``_elu_phases_into``), one conv of K / stride taps over the C stride phase rows (``_direct_conv_into``,
    ``_phase_weight``), + bias; side by side, each in this thread's words."""
    B, C, _ = x_bct.shape
    O, _, K = w_oik.shape
    T_out, Q = out_bot.shape[-1], K // stride
    w_orq = _phase_weight(w_oik, stride)
    bias_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o, dtype=np.float32)
    x_bct = np.ascontiguousarray(x_bct)
    n_piece = max(64, BLOCK_DIRECT_VALUES // (C * stride) // 64 * 64)
    R = C * stride

    def piece(b, t0):
        n = min(n_piece, T_out - t0)
        W = direct_width(n)  # (a short signal: its own steps only)
        L = W + Q - 1
        words = thread_words(R * L + O * W + (n + Q - 1) * stride).view(np.float32)
        z, sums = words[: R * L].reshape(R, L), words[R * L : R * L + O * W].reshape(O, W)
        _elu_phases_into(x_bct[b], t0, n, stride, left, words[R * L + O * W :][: (n + Q - 1) * stride], z)
        _direct_conv_into(z, w_orq, 1, n, sums)
        np.add(sums[:, :n], bias_o[:, None], out=out_bot[b, :, t0 : t0 + n])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)])
