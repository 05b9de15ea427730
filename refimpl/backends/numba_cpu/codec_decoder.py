"""The twins of ``refimpl/codec/decoder.py``: the residual unit (SnakeBeta, k7 conv, SnakeBeta, 1x1 conv,
residual) and SnakeBeta into a causal conv, each over pieces of time carried through in one thread's cache;
the residual unit on the AMX tiles where granted.  The twins (``residual_unit``, ``snake_causal_conv``) take
the stage's weights and streaming state and hand their arrays to one push of a signal (``residual_unit_push``,
``snake_causal_conv_push``)."""

from __future__ import annotations

import numba
import numpy as np

from ... import nn
from ..host_memory import new_output, thread_words
from .amx_conv import (
    _convs_take_tiles,
    _split_pair_into,
    _tile_conv_into,
    _unit_scratch,
    _unit_scratch_words,
    _weight_tiles,
)
from .conv import (
    DIRECT_OUT,
    DIRECT_STEPS,
    PER_TAP_MAX_OUT,
    _direct_conv_into,
    direct_conv_takes,
    direct_half_width,
)
from .elementwise import (
    _add_bias_and_residual,
    _add_bias_and_residual_rows,
    _snake_params,
    _snake_row_into,
    _snake_rows_into,
    snake_beta,
)
from .intrinsics import FASTMATH
from .pieces import _piece_threads, run_pieces, time_pieces

UNIT_PIECE = 1024  # most time steps a piece of the fused residual unit: its stacked taps ([C * 7, 1024]) stay in cache
PRODUCT_STEPS = 32  # pieces on BLAS's products: multiples of these (a streamed frame's 160: 96 + 64, not 128 + 32)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_taps_into(x_ct, T, start, alpha_c, inv_beta_c, dilation, row_s, cols_ckn):
    """cols[c, k, j] = SnakeBeta(x[c, start + k * dilation + j]) (0 outside x[:, :T]): one row of SnakeBeta at a
    time into ``row_s`` (N + (K - 1) * dilation samples, in the first-level cache), then its K taps copied
    from it ("im2col" with the activation on the way)."""
    C, K, N = cols_ckn.shape
    for c in range(C):
        _snake_row_into(x_ct[c], T, start, np.float32(0.0), alpha_c[c], inv_beta_c[c], row_s)
        for k in range(K):
            cols_ckn[c, k, :] = row_s[k * dilation : k * dilation + N]


def _whole_rows(x_bct):
    """(rows, T): a C-contiguous array whose rows begin with x's rows [B, C, >= T], and x's length T: x
    itself; for the first samples of longer rows (the trimmed output of a transposed conv) those whole
    rows, without a copy, where they lie inside the memory x's base owns; otherwise a contiguous copy."""
    T, base = x_bct.shape[-1], x_bct.base
    if x_bct.flags.c_contiguous:
        return x_bct, T
    B, C, _ = x_bct.shape
    s0, s1, s2 = x_bct.strides
    item = x_bct.itemsize
    if isinstance(base, np.ndarray) and base.flags.c_contiguous and s2 == item and s1 % item == 0 and s1 >= T * item:
        first, last = x_bct.ctypes.data, x_bct.ctypes.data + B * s0  # the whole rows' bytes
        if s0 == C * s1 and base.ctypes.data <= first and last <= base.ctypes.data + base.nbytes:
            return np.lib.stride_tricks.as_strided(x_bct, (B, C, s1 // item), x_bct.strides, writeable=False), T
    return np.ascontiguousarray(x_bct), T


def residual_unit(u, dilation: int, x_bct, state, record=None):
    """``codec.decoder.residual_unit`` in one pass (``residual_unit_push``) from the unit's weights and its
    conv1's left context (streaming; offline: zeros); the next context kept in conv1's state."""
    conv1, conv2 = state.sub("conv1.").conv(nn.CausalConvState), state.sub("conv2.").conv(nn.CausalConvState)
    pushed = residual_unit_push(
        x_bct,
        *(u["act1.alpha"], u["act1.beta"], u["conv1.conv.weight"], u["conv1.conv.bias"]),
        *(u["act2.alpha"], u["act2.beta"], u["conv2.conv.weight"], u["conv2.conv.bias"]),
        dilation,
        None if conv1 is None else conv1.context_bct,
    )
    if pushed is NotImplemented:
        return pushed
    y_bct, context_bcs = pushed
    if conv1 is not None:
        conv1.context_bct, conv2.context_bct = context_bcs, y_bct[:, :, :0]  # a 1x1 conv keeps no samples
    return y_bct


def residual_unit_push(
    x_bct, log_alpha1_c, log_beta1_c, w1_oik, b1_o, log_alpha2_c, log_beta2_c, w2_oi1, b2_o, dilation, context_bcs=None
):
    """x + conv_k1(SnakeBeta_2(causal_conv_k7_dilated(SnakeBeta_1(x)))) for one push of a signal (float32, C -> C
    channels): ``residual_unit``'s formula on plain arrays, ``context_bcs`` the k7 conv's left context (the last 6 *
    dilation outputs of SnakeBeta_1 of the pushes before; None: zeros), returning (y, the context for the next
    push).  Over pieces of at most ``UNIT_PIECE`` time steps, shared evenly between the threads (``time_pieces``: a
    streamed chunk's short push too), each carried through the whole unit by one thread in its core's cache:
    SnakeBeta of the piece and its left context (``context_bcs`` before the push, or zeros) straight into the
    stacked taps, one product for the k7 conv, bias + SnakeBeta, one for the k1 conv, bias + residual into the
    output, the only array of the signal's length (the reference makes five).  The next push's context is SnakeBeta
    of the last samples, by the same row kernel.  On the AMX tiles: ``_residual_unit_on_tiles``."""
    if x_bct.dtype != np.float32 or w1_oik.shape[0] != w1_oik.shape[1] or w2_oi1.shape[-1] != 1:
        return NotImplemented  # (float64: the reference runs)
    rows_bcs, T = _whole_rows(x_bct)  # no copy of a trimmed transposed-conv output
    B, C = x_bct.shape[:2]
    K = w1_oik.shape[-1]
    left = (K - 1) * dilation
    alpha1, inv_beta1 = _snake_params(log_alpha1_c, log_beta1_c)
    alpha2, inv_beta2 = _snake_params(log_alpha2_c, log_beta2_c)
    w1_m = np.ascontiguousarray(w1_oik.reshape(C, C * K))  # column i * K + k: the order of the stacked taps
    w2_m = np.ascontiguousarray(w2_oi1[:, :, 0])
    out_bct = new_output((B, C, T))
    if _convs_take_tiles(C, C, T, w1_oik, w2_oi1):
        params_6c = np.stack([alpha1, inv_beta1, alpha2, inv_beta2, b1_o, b2_o]).astype(np.float32)
        _residual_unit_on_tiles(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct)
        return out_bct, _next_context(x_bct, log_alpha1_c, log_beta1_c, left, context_bcs)
    if direct_conv_takes(C, C, K):
        params_6c = np.stack([alpha1, inv_beta1, alpha2, inv_beta2, b1_o, b2_o]).astype(np.float32)
        _residual_unit_direct(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct)
        return out_bct, _next_context(x_bct, log_alpha1_c, log_beta1_c, left, context_bcs)

    def piece(b, t0, n):
        cols_ckn = _snake_taps(rows_bcs[b], T, t0, n, alpha1, inv_beta1, K, dilation, context_bcs, b)
        h_cn = w1_m @ cols_ckn.reshape(C * K, n)
        g_cn = np.empty_like(h_cn)
        _snake_rows_into(h_cn, b1_o, alpha2, inv_beta2, g_cn)
        _add_bias_and_residual(w2_m @ g_cn, b2_o, rows_bcs[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0, n) for b in range(B) for t0, n in time_pieces(T, UNIT_PIECE, PRODUCT_STEPS)])
    return out_bct, _next_context(x_bct, log_alpha1_c, log_beta1_c, left, context_bcs)


def _snake_taps(x_ct, T, t0, n, alpha_c, inv_beta_c, K, dilation, context_bcs, b):
    """[C, K, n]: SnakeBeta of the K taps of a causal conv's output columns t0 .. t0 + n - 1 side by side
    ("im2col", ``_snake_taps_into``), the taps before the push's start taken from ``context_bcs[b]``
    (the last (K - 1) * dilation SnakeBeta outputs of the pushes before) or zeros where it is None."""
    left = (K - 1) * dilation
    cols_ckn = np.empty((x_ct.shape[0], K, n), np.float32)
    row_s = np.empty(left + n, np.float32)
    _snake_taps_into(x_ct, T, t0 - left, alpha_c, inv_beta_c, dilation, row_s, cols_ckn)
    for k in range(K if context_bcs is not None else 0):  # taps before the push: the context
        first = t0 - left + k * dilation
        if first < 0:
            m = min(-first, n)
            cols_ckn[:, k, :m] = context_bcs[b, :, left + first : left + first + m]
    return cols_ckn


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_conv_few_into(x_ct, T, t0, alpha_c, inv_beta_c, w_oik, context_cs, row_s, out_on):
    """out[o, j] = sum_c sum_k w[o, c, k] * SnakeBeta(x[c, t0 - (K - 1) + k + j]) for a few outputs o:
    SnakeBeta of one row of x at a time into ``row_s`` (N + K - 1 samples, in the first-level cache; before
    the push's start the context's samples, ``context_cs`` [C, K - 1], or zeros where it is empty), then
    its K taps multiplied into every output row (stacked for a product with one row, the taps would read
    K times the samples from memory)."""
    O, C, K = w_oik.shape
    N = out_on.shape[1]
    left = K - 1
    out_on[:, :] = 0.0
    for c in range(C):
        _snake_row_into(x_ct[c], T, t0 - left, np.float32(0.0), alpha_c[c], inv_beta_c[c], row_s)
        if context_cs.shape[0] > 0:
            for i in range(min(max(left - t0, 0), N + left)):  # positions before the push: the context
                row_s[i] = context_cs[c, t0 + i]
        for o in range(O):
            out_n = out_on[o]
            for k in range(K):
                weight, taps_n = w_oik[o, c, k], row_s[k : k + N]
                for j in range(N):
                    out_n[j] += weight * taps_n[j]


def snake_causal_conv(w, act: str, conv: str, x_bct, state, record=None):
    """``codec.decoder.snake_causal_conv`` in one pass (``snake_causal_conv_push``) from the weights of the
    SnakeBeta ``act`` and the conv ``conv`` and the conv's left context; the next context kept in its state."""
    conv_state = state.sub(conv).conv(nn.CausalConvState)
    pushed = snake_causal_conv_push(
        x_bct,
        *(w[f"{act}.alpha"], w[f"{act}.beta"], w[f"{conv}conv.weight"], w[f"{conv}conv.bias"]),
        None if conv_state is None else conv_state.context_bct,
    )
    if pushed is NotImplemented:
        return pushed
    y_bct, context_bcs = pushed
    if conv_state is not None:
        conv_state.context_bct = context_bcs
    return y_bct


def snake_causal_conv_push(x_bct, log_alpha_c, log_beta_c, w_oik, b_o, context_bcs=None):
    """causal_conv(SnakeBeta(x)) for one push of a signal (float32), ``context_bcs`` the conv's left context (the
    last K - 1 outputs of SnakeBeta of the pushes before; None: zeros), returning (y, the context for the next
    push), over pieces of at most ``UNIT_PIECE`` time steps side by side (``time_pieces``): SnakeBeta of the piece
    and its K - 1 samples of left context, multiplied tap by tap into the few outputs (``_snake_conv_few_into``: up
    to ``PER_TAP_MAX_OUT``, the decoder's last conv), or stacked into the K taps for one matrix product
    (``_snake_taps``), + bias.  Neither SnakeBeta's full-length output nor a padded copy of it is made (the
    reference's two arrays of the signal's length, the copy's fresh pages a good part of a decode); the next push's
    context is ``residual_unit_push``'s."""
    if x_bct.dtype != np.float32:
        return NotImplemented  # (float64: the reference runs)
    rows_bcs, T = _whole_rows(x_bct)
    B, C = x_bct.shape[:2]
    O, _, K = w_oik.shape
    alpha, inv_beta = _snake_params(log_alpha_c, log_beta_c)
    w_oik = np.ascontiguousarray(w_oik, dtype=np.float32)
    w_m = w_oik.reshape(O, C * K)  # column i * K + k: the order of the stacked taps
    no_context = np.zeros((0, 0), np.float32)
    out_bot = new_output((B, O, T))

    def piece(b, t0, n):
        out_on = out_bot[b, :, t0 : t0 + n]
        if O <= PER_TAP_MAX_OUT:
            context_cs = no_context if context_bcs is None else np.ascontiguousarray(context_bcs[b], np.float32)
            row_s = np.empty(n + K - 1, np.float32)
            _snake_conv_few_into(rows_bcs[b], T, t0, alpha, inv_beta, w_oik, context_cs, row_s, out_on)
        else:
            cols_ckn = _snake_taps(rows_bcs[b], T, t0, n, alpha, inv_beta, K, 1, context_bcs, b)
            np.matmul(w_m, cols_ckn.reshape(C * K, n), out=out_on)
        if b_o is not None:
            out_on += b_o[:, None]

    run_pieces(piece, [(b, t0, n) for b in range(B) for t0, n in time_pieces(T, UNIT_PIECE, DIRECT_STEPS)])
    return out_bot, _next_context(x_bct, log_alpha_c, log_beta_c, K - 1, context_bcs)


def _next_context(x_bct, log_alpha_c, log_beta_c, left, context_bcs):
    """The last ``left`` samples of SnakeBeta(x) after the context before: [B, C, left] (``snake_beta``'s
    twin: the bits the step path keeps)."""
    B, C, T = x_bct.shape
    snaked_bct = snake_beta(x_bct[:, :, max(T - left, 0) :], log_alpha_c, log_beta_c)
    if left <= T:
        return snaked_bct
    before = context_bcs if context_bcs is not None else np.zeros((B, C, left), np.float32)
    return np.concatenate([before[:, :, T:], snaked_bct], axis=-1)


UNIT_PIECE_VALUES = 96 * 1024  # channels x time steps of a piece on the tiles (C = 96: 1024 steps; 768: 128)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _unit_piece_on_tiles(x_ct, T, t0, n, params_6c, a1_tiles, a2_tiles, dilation, context_cs, out_ct, scratch):
    """The residual unit's output steps t0 .. t0 + n - 1 on the tiles: SnakeBeta_1 of the piece and its
    (K - 1) dilation steps before (from ``context_cs`` before the push's start) split into the pair
    layout, the k7 conv (``_tile_conv_into``), bias + SnakeBeta_2 split likewise, the 1x1 conv, then
    bias + residual into ``out`` (the reference's order).  ``params_6c``: alpha, 1 / beta of both
    SnakeBetas, the two biases; ``scratch``: this thread's words (``_unit_scratch_words``), which hold the
    split signals, the sums and two rows (fresh arrays, first touched in every piece, took a large part of
    its time)."""
    C = x_ct.shape[0]
    K = a1_tiles.shape[1] * 32 // C
    left = (K - 1) * dilation
    alpha1, inv_beta1, alpha2, inv_beta2 = params_6c[0], params_6c[1], params_6c[2], params_6c[3]
    b1, b2 = params_6c[4], params_6c[5]
    steps = (n + 31) // 32 * 32
    z1, h, z2, g, rows = _unit_scratch(scratch, C, C, steps, left, n)
    z1[:, :, left + n :] = 0
    row_a, row_b = rows[0], rows[1]
    for c in range(0, C, 2):
        _snake_row_into(x_ct[c], T, t0 - left, np.float32(0.0), alpha1[c], inv_beta1[c], row_a)
        _snake_row_into(x_ct[c + 1], T, t0 - left, np.float32(0.0), alpha1[c + 1], inv_beta1[c + 1], row_b)
        for j in range(max(left - t0, 0)):  # before the push: the context (SnakeBeta's outputs already)
            row_a[j], row_b[j] = context_cs[c, t0 + j], context_cs[c + 1, t0 + j]
        _split_pair_into(row_a, row_b, c // 2, z1)
    _tile_conv_into(a1_tiles, z1, K, dilation, 1, steps, h)
    z2[:, :, n:] = 0
    for c in range(0, C, 2):
        _snake_row_into(h[c], n, 0, b1[c], alpha2[c], inv_beta2[c], row_a[:n])
        _snake_row_into(h[c + 1], n, 0, b1[c + 1], alpha2[c + 1], inv_beta2[c + 1], row_b[:n])
        _split_pair_into(row_a[:n], row_b[:n], c // 2, z2)
    _tile_conv_into(a2_tiles, z2, 1, 0, 1, steps, g)
    _add_bias_and_residual_rows(g, n, b2, x_ct, t0, out_ct)


def _residual_unit_on_tiles(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct):
    """``residual_unit_push``'s pieces on the tiles (``_unit_piece_on_tiles``), side by side, the weights'
    tiles those of ``_weight_tiles``: at most ``UNIT_PIECE_VALUES`` a piece, in whole tiles of 32 steps shared
    evenly between the threads (``time_pieces``: a streamed frame's 640 steps at 192 channels are two pieces
    of 320, where cut at 512 one thread had four times the other's)."""
    B, C = out_bct.shape[:2]
    K = w1_oik.shape[-1]
    a1, a2 = _weight_tiles(w1_oik), _weight_tiles(w2_oi1)
    if context_bcs is None:
        context_bcs = np.zeros((B, C, (K - 1) * dilation), np.float32)
    context_bcs = np.ascontiguousarray(context_bcs, dtype=np.float32)
    n_piece = max(32, UNIT_PIECE_VALUES // C // 32 * 32)
    words = _unit_scratch_words(C, C, (n_piece + 31) // 32 * 32, (K - 1) * dilation)
    run_pieces(
        lambda b, t0, n: _unit_piece_on_tiles(
            *(rows_bcs[b], T, t0, n, params_6c, a1, a2, dilation, context_bcs[b], out_bct[b]), thread_words(words)
        ),
        [(b, t0, n) for b in range(B) for t0, n in time_pieces(T, n_piece, 32)],
    )


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_context_into(x_ct, T, t0, n, alpha_c, inv_beta_c, left, context_cs, z):
    """z[c, j] = SnakeBeta_1(x[c, t0 - left + j]) for j < left + n, from ``context_cs`` [C, left] before the
    push's start (SnakeBeta's outputs already), zeros after: the rows the residual unit's k7 conv reads as
    shifts (for the rows given: a share of the channels, or all of them)."""
    for c in range(z.shape[0]):
        _snake_row_into(x_ct[c], T, t0 - left, np.float32(0.0), alpha_c[c], inv_beta_c[c], z[c, : left + n])
        z[c, left + n :] = 0.0
        for j in range(max(left - t0, 0)):  # before the push: the context
            z[c, j] = context_cs[c, t0 + j]


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _unit_convs_direct(x_ct, T, t0, n, params_6c, w1_oik, dilation, context_cs, z, h, g):
    """The first half of the residual unit's output steps t0 .. t0 + n - 1 by the direct kernel
    (``_direct_conv_into``): SnakeBeta_1 of the piece and its (K - 1) dilation steps before into the rows of z
    (``_snake_context_into``), the k7 conv read from them as shifts into h, then bias + SnakeBeta_2 into g
    (``params_6c`` as for ``_unit_piece_on_tiles``)."""
    K = w1_oik.shape[2]
    _snake_context_into(x_ct, T, t0, n, params_6c[0], params_6c[1], (K - 1) * dilation, context_cs, z)
    _direct_conv_into(z, w1_oik, dilation, n, h)
    _snake_rows_into(h, params_6c[4], params_6c[2], params_6c[3], g)


def _unit_rows(C: int, left: int, W: int) -> tuple:
    """This thread's rows for a residual unit on the direct kernel over W steps (``thread_words``): z [C, left +
    W] (SnakeBeta_1 of the steps and their context), h and g [C, W] (the k7 conv, SnakeBeta_2, the 1x1 conv)."""
    words = thread_words(C * (left + 3 * W)).view(np.float32)
    z = words[: C * (left + W)].reshape(C, left + W)
    h, g = words[C * (left + W) : C * (left + 3 * W)].reshape(2, C, W)
    return z, h, g


def _residual_unit_direct(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct):
    """``residual_unit_push``'s pieces (``time_pieces``) with the k7 conv on the direct kernel
    (``_unit_convs_direct``), the 1x1 conv too where it takes it (``direct_conv_takes``; else BLAS's product),
    then bias + residual (the reference's order); side by side, each in this thread's words.  A push too short
    to share its time out evenly shares its output channels instead (``_unit_by_outputs``)."""
    B, C = out_bct.shape[:2]
    K = w1_oik.shape[-1]
    left = (K - 1) * dilation
    context_bcs = np.zeros((B, C, left), np.float32) if context_bcs is None else context_bcs
    context_bcs = np.ascontiguousarray(context_bcs, dtype=np.float32)
    w1_oik, w2_oi1 = np.ascontiguousarray(w1_oik, np.float32), np.ascontiguousarray(w2_oi1, np.float32)
    direct_1x1, w2_m = direct_conv_takes(C, C, 1), w2_oi1[:, :, 0]
    if _shares_outputs(B, C, T):
        for b in range(B):
            _unit_by_outputs(rows_bcs[b], T, params_6c, w1_oik, w2_oi1, dilation, context_bcs[b], out_bct[b])
        return

    def piece(b, t0, n):
        z, h, g = _unit_rows(C, left, direct_half_width(n))  # (a short push: its own steps only, to 32)
        _unit_convs_direct(rows_bcs[b], T, t0, n, params_6c, w1_oik, dilation, context_bcs[b], z, h, g)
        if direct_1x1:
            _direct_conv_into(g, w2_oi1, 1, n, h)
        else:
            np.matmul(w2_m, g, out=h)
        _add_bias_and_residual(h[:, :n], params_6c[5], rows_bcs[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0, n) for b in range(B) for t0, n in time_pieces(T, UNIT_PIECE, DIRECT_STEPS)])


SHARED_OUTPUTS_MAX_BLOCKS = 4  # up to this many blocks of 64 steps a thread: a push's unit may share its channels
SHARED_OUTPUTS_MIN_CHANNELS = 128  # and at least this many channels (fewer: the rounds' hand-offs cost more)


def _shares_outputs(B: int, C: int, T: int) -> bool:
    """Whether a residual unit on the direct kernel shares its output channels between the threads rather
    than its time (``_unit_by_outputs``): a short push of a wide unit, too few blocks of ``DIRECT_STEPS``
    steps to give every thread the same number (a streamed chunk's first block: 32 steps a frame), and whole
    blocks of ``DIRECT_OUT`` channels for each thread."""
    threads = _piece_threads()
    blocks = B * -(-T // DIRECT_STEPS)
    fits = threads > 1 and C >= SHARED_OUTPUTS_MIN_CHANNELS and C % (threads * DIRECT_OUT) == 0
    return fits and blocks % threads != 0 and blocks <= SHARED_OUTPUTS_MAX_BLOCKS * threads


def _unit_by_outputs(x_ct, T, params_6c, w1_oik, w2_oi1, dilation, context_cs, out_ct):
    """One push of one signal through the residual unit as ``_residual_unit_direct``'s pieces compute it, all T
    steps at once, the threads sharing the channels (``run_pieces``, three rounds): SnakeBeta_1 of the push and its
    context into the rows of z (``_snake_context_into``), each thread a share of the rows; the k7 conv then bias +
    SnakeBeta_2 of a share of the outputs (``_direct_conv_into`` of the weight's rows, each output's sum as in a
    piece of time); the 1x1 conv of a share of the outputs (direct or BLAS's product, as the pieces), bias and
    residual.  The same operations in the same order as the pieces: the same bits."""
    C, K = w1_oik.shape[0], w1_oik.shape[2]
    left = (K - 1) * dilation
    z, h, g = _unit_rows(C, left, direct_half_width(T))  # (this thread's words: the pieces, also run here, take none)
    alpha1, inv_beta1, alpha2, inv_beta2, b1, b2 = params_6c
    direct_1x1, w2_m = direct_conv_takes(C, C, 1), w2_oi1[:, :, 0]
    blocks, threads = C // DIRECT_OUT, _piece_threads()
    cuts = [DIRECT_OUT * (blocks * i // threads) for i in range(threads + 1)]
    shares = [(cuts[i], cuts[i + 1]) for i in range(threads) if cuts[i] < cuts[i + 1]]

    def snake_taps(c0, c1):
        _snake_context_into(x_ct[c0:c1], T, 0, T, alpha1[c0:c1], inv_beta1[c0:c1], left, context_cs[c0:c1], z[c0:c1])

    def conv_k7(o0, o1):
        _direct_conv_into(z, w1_oik[o0:o1], dilation, T, h[o0:o1])
        _snake_rows_into(h[o0:o1], b1[o0:o1], alpha2[o0:o1], inv_beta2[o0:o1], g[o0:o1])

    def conv_k1(o0, o1):
        if direct_1x1:
            _direct_conv_into(g, w2_oi1[o0:o1], 1, T, h[o0:o1])
        else:
            np.matmul(w2_m[o0:o1], g, out=h[o0:o1])
        _add_bias_and_residual(h[o0:o1, :T], b2[o0:o1], x_ct[o0:o1], 0, out_ct[o0:o1])

    for step in (snake_taps, conv_k7, conv_k1):
        run_pieces(step, shares)
