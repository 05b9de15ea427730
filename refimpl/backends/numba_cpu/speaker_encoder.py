"""The twins of ``refimpl/tts/speaker_encoder.py``: the TDNN (reflected taps read in place, bias and ReLU in
one pass), on the AMX tiles where the weights are bf16 values, else on the direct kernel where it takes them;
the Res2Net built of them, on the direct kernel where it takes its groups (a thread's range of steps through
all the groups in one call); the gated residual, the pooling statistics and the spectral magnitude, each one
pass without temporaries (the attentive pooling's biases folded into its passes); the log-mel front end's FFT
on more than one of SciPy's threads, and its filterbank's product over each band's nonzero bins alone."""

from __future__ import annotations

import numba
import numpy as np

from ..host_memory import new_output
from . import amx
from .amx_conv import TILE_TDNN_MIN_OUT, TILE_TDNN_MIN_STEPS, _taps_on_tiles, _tdnn_weight_tiles
from .conv import DIRECT_OUT, DIRECT_STEPS, _direct_conv_into, direct_kernel_takes, direct_width
from .elementwise import ELEMENTWISE_PIECE
from .intrinsics import FASTMATH, _exp_f32, _v16_fma, _v16_load, _v16_store, _v16_zeros
from .pieces import _piece_threads, run_pieces


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_reflected_taps_into(x_ct, first, dilation, cols_ikn):
    """cols[i, k, j] = x[i, r(first + k * dilation + j)], r mirroring positions outside 0 .. T - 1 about the
    edge samples (r(-1) = 1, r(T) = T - 2: the reflect padding, without the padded copy)."""
    I, K, N = cols_ikn.shape
    T = x_ct.shape[1]
    for i in range(I):
        for k in range(K):
            start = first + k * dilation
            j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)  # x itself for j0 <= j < j1
            for j in range(j0):
                cols_ikn[i, k, j] = x_ct[i, -(start + j)]
            if j1 > j0:
                cols_ikn[i, k, j0:j1] = x_ct[i, start + j0 : start + j1]
            for j in range(max(j1, j0), N):
                cols_ikn[i, k, j] = x_ct[i, 2 * (T - 1) - (start + j)]


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_relu(h_on, bias_o):
    """h = ReLU(h + bias), in place (a NaN stays NaN, as with ``np.maximum``)."""
    for o in range(h_on.shape[0]):
        bias, row = bias_o[o], h_on[o]
        for j in range(row.shape[0]):
            y = row[j] + bias
            row[j] = np.float32(0.0) if y <= 0 else y


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _bias_and_relu_into(sums_ow, bias_o, out_ot):
    """out = ReLU(sums + bias) over out's steps (``_add_bias_and_relu``'s arithmetic, from another array)."""
    for o in range(out_ot.shape[0]):
        bias, sums_t, out_t = bias_o[o], sums_ow[o], out_ot[o]
        for t in range(out_t.shape[0]):
            y = sums_t[t] + bias
            out_t[t] = np.float32(0.0) if y <= 0 else y


def _tdnn_direct(x_ct, w_oik, b_o, dilation, out_ot):
    """out = ReLU(reflect-"same" conv(x) + b) [C, T] -> [O, T] on the direct kernel (``_direct_conv_into``):
    x's rows with their mirrored edges once (``_stack_reflected_taps_into`` of one tap; zeros after), then
    the output channels in shares of whole blocks side by side, each read from those rows as shifts, its
    bias and ReLU taken as its sums are copied out."""
    O, I, K = w_oik.shape
    T = x_ct.shape[1]
    W, span = direct_width(T), T + dilation * (K - 1)
    rows_il = np.zeros((I, dilation * (K - 1) + W), np.float32)
    _stack_reflected_taps_into(np.ascontiguousarray(x_ct), -(dilation * (K - 1) // 2), 1, rows_il[:, None, :span])
    w_oik, sums_ow = np.ascontiguousarray(w_oik, np.float32), np.empty((O, W), np.float32)
    blocks, n = O // DIRECT_OUT, _piece_threads()
    cuts = [DIRECT_OUT * (blocks * i // n) for i in range(n + 1)]
    b_o = np.ascontiguousarray(b_o, np.float32)

    def piece(o0, o1):
        _direct_conv_into(rows_il, w_oik[o0:o1], dilation, T, sums_ow[o0:o1])
        _bias_and_relu_into(sums_ow[o0:o1], b_o[o0:o1], out_ot[o0:o1])

    run_pieces(piece, [(cuts[i], cuts[i + 1]) for i in range(n) if cuts[i] < cuts[i + 1]])


TDNN_DIRECT_MAX_TAPS = 512  # a TDNN of at least this many stacked taps (inputs x taps: the released encoder's first
# TDNN, 128 mel bins x 5) runs on OpenBLAS's product of the stacked taps, faster there on a Zen 4 than the direct
# kernel (docs/performance.md, "The speaker encoder"); fewer (a Res2Net's groups) stay on the direct kernel

TDNN_RELU_PIECE = 1 << 21  # values per piece of the bias + ReLU pass (8 MB): smaller outputs in one pass here, as a
# piece thread's hand-off costs more than it saves for small inputs


def _tdnn_into(x_ct, w_oik, b_o, dilation, out_ot, cols_ikn=None):
    """out = ReLU(reflect-"same" conv(x) + b) for one item [C, T] -> [O, T]: the taps read straight from x
    with the mirrored edges (``_stack_reflected_taps_into``, into ``cols_ikn`` [I, K, T] where given: a
    buffer reused from one call to the next; a 1-tap conv multiplies x itself), one matrix product on
    BLAS's threads into out, then bias and ReLU in one pass over rows of channels side by side.  Where the
    tiles do not run it and the direct kernel can (``direct_kernel_takes``, tiles granted or not, as for the
    Res2Net's groups) with fewer than ``TDNN_DIRECT_MAX_TAPS`` stacked taps: ``_tdnn_direct`` instead, bias
    and ReLU in it."""
    O, I, K = w_oik.shape
    T = x_ct.shape[1]
    on_tiles = amx.USE_TILES and T >= TILE_TDNN_MIN_STEPS and O >= TILE_TDNN_MIN_OUT
    tiles_usrc = _tdnn_weight_tiles(w_oik) if on_tiles else None
    if tiles_usrc is not None:  # bf16 weights (as released): the product on the tiles, bias and ReLU in it
        first = -(dilation * (K - 1) // 2)
        _taps_on_tiles(x_ct, tiles_usrc, b_o, K, dilation, first, out_ot)
        return
    if direct_kernel_takes(O, I, K) and I * K < TDNN_DIRECT_MAX_TAPS:
        _tdnn_direct(x_ct, w_oik, b_o, dilation, out_ot)
        return
    w_m = np.ascontiguousarray(w_oik.reshape(O, I * K))  # column i * K + k: the order of the stacked taps
    if K == 1:
        np.matmul(w_m, x_ct, out=out_ot)
    else:
        cols_ikn = np.empty((I, K, T), np.float32) if cols_ikn is None else cols_ikn
        _stack_reflected_taps_into(np.ascontiguousarray(x_ct), -(dilation * (K - 1) // 2), dilation, cols_ikn)
        np.matmul(w_m, cols_ikn.reshape(I * K, T), out=out_ot)
    rows = max(1, TDNN_RELU_PIECE // T)
    run_pieces(
        lambda o0: _add_bias_and_relu(out_ot[o0 : o0 + rows], b_o[o0 : o0 + rows]), [(o0,) for o0 in range(0, O, rows)]
    )


def tdnn(x_bct, w_oik, b_o, dilation: int, record=None):
    """``tts.speaker_encoder.tdnn`` (float32): ``_tdnn_into`` for each item, where the reference pads
    a copy of x and adds the bias and takes the ReLU as two more passes, each a fresh array."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    left = dilation * (K - 1) // 2
    too_short = max(left, dilation * (K - 1) - left) >= T  # (the reference's error)
    if x_bct.dtype != np.float32 or w_oik.dtype != np.float32 or I != C or b_o is None or too_short:
        return NotImplemented
    out_bot = new_output((B, O, T))
    for b in range(B):
        _tdnn_into(x_bct[b], w_oik, b_o, dilation, out_bot[b])
    return out_bot


def res2net(x_bct, w_joik, b_jo, dilation: int, record=None):
    """``tts.speaker_encoder.res2net`` (float32): each group's TDNN written in place in the
    concatenated output (its rows of channels are a contiguous block of it), the sum with the previous
    group's output taken into one small buffer; group 0 copied, where the reference splits, adds into a
    fresh array, makes a TDNN's output and concatenates them all again (for the released encoder's small
    groups, a good part of the time).  Where the direct kernel can take the groups' convs, all the groups of a
    range of steps in one call (``_res2net_range_direct``: one call a thread, not seven hand-offs and passes
    of each group), the AMX tiles granted or not: for groups this small the direct kernel was the faster at
    every length measured (docs/performance.md, "AMX tiles")."""
    B, C, T = x_bct.shape
    Cg = C // (len(w_joik) + 1)  # channels per group
    if x_bct.dtype != np.float32 or C % (len(w_joik) + 1) or any(w.shape[:2] != (Cg, Cg) for w in w_joik):
        return NotImplemented
    K = w_joik[0].shape[-1]
    left = dilation * (K - 1) // 2
    too_short = max(left, dilation * (K - 1) - left) >= T  # (the reference's error)
    if too_short or any(w.dtype != np.float32 or w.shape[-1] != K for w in w_joik) or any(b is None for b in b_jo):
        return NotImplemented
    out_bct = new_output((B, C, T))
    if direct_kernel_takes(Cg, Cg, K):  # AVX-512: all the groups of a range of steps in one call
        w_joik = np.ascontiguousarray(np.stack(w_joik), np.float32)
        b_jo = np.ascontiguousarray(np.stack(b_jo), np.float32)
        n = max(1, min(_piece_threads(), T // RES2NET_PIECE_MIN_STEPS))
        cuts = [T * i // n for i in range(n + 1)]
        for b in range(B):
            x_ct, out_ct = np.ascontiguousarray(x_bct[b]), out_bct[b]
            run_pieces(
                lambda t0, t1, x_ct=x_ct, out_ct=out_ct: _res2net_range_direct(
                    x_ct, w_joik, b_jo, dilation, t0, t1, out_ct
                ),
                [(cuts[i], cuts[i + 1]) for i in range(n)],
            )
        return out_bct
    out_bct[:, :Cg] = x_bct[:, :Cg]
    sum_ct = np.empty((Cg, T), np.float32)
    cols_ckt = np.empty((Cg, K, T), np.float32)  # every group's stacked taps, in one buffer
    for b in range(B):
        for j, (w_oik, b_o) in enumerate(zip(w_joik, b_jo, strict=True), start=1):
            group_ct = x_bct[b, j * Cg : (j + 1) * Cg]
            if j > 1:  # plus the previous group's output: rows of out just written
                group_ct = np.add(group_ct, out_bct[b, (j - 1) * Cg : j * Cg], out=sum_ct)
            _tdnn_into(group_ct, w_oik, b_o, dilation, out_bct[b, j * Cg : (j + 1) * Cg], cols_ckt)
    return out_bct


@numba.njit(cache=True, nogil=True)
def _gated_residual_rows(h_ct, gates_c, x_ct, out_ct):
    """out[c] = h[c] * gates[c] + x[c], the product rounded before the sum (no fused multiply-add: NumPy's
    two steps, the same bits)."""
    for c in range(h_ct.shape[0]):
        gate, h_t, x_t, out_t = gates_c[c], h_ct[c], x_ct[c], out_ct[c]
        for t in range(h_t.shape[0]):
            out_t[t] = h_t[t] * gate + x_t[t]


def gated_residual(h_bct, gates_bc1, x_bct, record=None):
    """``tts.speaker_encoder.gated_residual`` (float32): one pass into one output where the reference makes
    two arrays."""
    arrays = (h_bct, gates_bc1, x_bct)
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 3 for a in arrays):
        return NotImplemented
    B, C, T = h_bct.shape
    if x_bct.shape != h_bct.shape or gates_bc1.shape != (B, C, 1):
        return NotImplemented
    out_bct = new_output((B, C, T))
    for b in range(B):
        _gated_residual_rows(
            np.ascontiguousarray(h_bct[b]), gates_bc1[b, :, 0].copy(), np.ascontiguousarray(x_bct[b]), out_bct[b]
        )
    return out_bct


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _weighted_mean_and_std_rows(x_ct, w_rt, eps, mean_c, std_c):
    """mean[c] = sum_t w[c, t] x[c, t], std[c] = sqrt(max(sum_t w[c, t] (x[c, t] - mean[c])^2, eps)), w's one
    row for every c when it has one row; each row's two passes while it is in the first-level cache."""
    C, T = x_ct.shape
    for c in range(C):
        x_t, w_t = x_ct[c], w_rt[c if w_rt.shape[0] > 1 else 0]
        mean = np.float32(0.0)
        for t in range(T):
            mean += w_t[t] * x_t[t]
        variance = np.float32(0.0)
        for t in range(T):
            d = x_t[t] - mean
            variance += w_t[t] * (d * d)
        mean_c[c] = mean
        std_c[c] = np.sqrt(eps) if variance < eps else np.sqrt(variance)  # (NaN stays NaN)


def mean_and_std(x_bct, weights_bct, eps: float = 1e-12):
    """``tts.speaker_encoder.mean_and_std`` (float32): both statistics of a row in one kernel call, rows of
    channels side by side (``run_pieces``), no [B, C, T] temporaries (the reference makes four).  Its sums
    run in another order than NumPy's pairwise ``np.sum``: float32 rounding apart, the same numbers."""
    B, C, T = x_bct.shape
    if (
        x_bct.dtype != np.float32
        or not isinstance(weights_bct, np.ndarray)
        or weights_bct.dtype != np.float32
        or weights_bct.ndim != 3
        or weights_bct.shape[0] != B
        or weights_bct.shape[1] not in (1, C)
        or weights_bct.shape[2] != T
    ):
        return NotImplemented
    mean_bc, std_bc = np.empty((B, C), np.float32), np.empty((B, C), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // max(T, 1))
    per_row = weights_bct.shape[1] > 1

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        w_rt = weights_bct[b, c0:c1] if per_row else weights_bct[b]
        _weighted_mean_and_std_rows(x_bct[b, c0:c1], w_rt, np.float32(eps), mean_bc[b, c0:c1], std_bc[b, c0:c1])

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return mean_bc, std_bc


@numba.njit(fastmath=FASTMATH, error_model="numpy", inline="always")
def _weighted_mean_and_std(x_t, e_t, eps):
    """With s = sum_t e: mean = sum_t e x / s, std = sqrt(max(sum_t e (x - mean)^2 / s, eps)) (NaN stays NaN)."""
    total = np.float32(0.0)
    weighted = np.float32(0.0)
    for t in range(x_t.shape[0]):
        total += e_t[t]
        weighted += e_t[t] * x_t[t]
    mean = weighted / total
    variance = np.float32(0.0)
    for t in range(x_t.shape[0]):
        d = x_t[t] - mean
        variance += e_t[t] * (d * d)
    variance = variance / total
    return mean, np.sqrt(eps) if variance < eps else np.sqrt(variance)


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _exp_biased_minus_into(l_t, bias, m, e_t):
    """e = exp((l + bias) - m) by ``_exp_f32``, the sum rounded first (compiled without reassociation)."""
    for t in range(l_t.shape[0]):
        e_t[t] = _exp_f32((l_t[t] + bias) - m)


@numba.njit(fastmath=FASTMATH, error_model="numpy", cache=True, nogil=True)
def _biased_softmax_mean_and_std_rows(x_ct, l_ct, lmax_c, bias_c, eps, mean_c, std_c):
    """For each row c of the logits l[c] + bias[c] (each sum rounded, as a conv's bias pass rounds it), with
    e = exp(l + bias - m), m = max(l) + bias (rounding is monotonic: the maximum of the rounded sums), and
    s = sum_t e: mean = sum_t e x / s, std = sqrt(max(sum_t e (x - mean)^2 / s, eps)); the weights e / s of
    the softmax folded into the sums, each row's passes in the first-level cache.  A bias of 0 is the
    softmax of l itself (l + 0 is l)."""
    C, T = x_ct.shape
    e_t = np.empty(T, dtype=np.float32)
    for c in range(C):
        bias = bias_c[c]
        _exp_biased_minus_into(l_ct[c], bias, lmax_c[c] + bias, e_t)
        mean_c[c], std_c[c] = _weighted_mean_and_std(x_ct[c], e_t, eps)


def softmax_mean_and_std(x_bct, logits_bct, eps: float = 1e-12, record=None):
    """``tts.speaker_encoder.softmax_mean_and_std`` (float32): the softmax's weights never made (the
    reference's [B, C, T] weights, and mean_and_std's four temporaries): each row's maximum by NumPy, then
    per row exp(l - max) into a row buffer, its sum and the two weighted sums, rows of channels side by
    side (``run_pieces``).  exp is ``_exp_f32`` (within 1 ulp) and the sums run in another order than the
    reference's: float32 rounding apart, the same numbers."""
    if not isinstance(logits_bct, np.ndarray) or x_bct.dtype != np.float32 or logits_bct.dtype != np.float32:
        return NotImplemented
    if logits_bct.shape != x_bct.shape or x_bct.shape[-1] == 0:
        return NotImplemented
    B, C, T = x_bct.shape
    x_bct, logits_bct = np.ascontiguousarray(x_bct), np.ascontiguousarray(logits_bct)
    max_bc, no_bias_c = np.max(logits_bct, axis=2), np.zeros(C, np.float32)
    mean_bc, std_bc = np.empty((B, C), np.float32), np.empty((B, C), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // T)

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        _biased_softmax_mean_and_std_rows(
            x_bct[b, c0:c1],
            logits_bct[b, c0:c1],
            max_bc[b, c0:c1],
            no_bias_c[c0:c1],
            np.float32(eps),
            mean_bc[b, c0:c1],
            std_bc[b, c0:c1],
        )

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return mean_bc, std_bc


def attentive_statistics_pooling(a, x_bct, record=None):
    """``tts.speaker_encoder.attentive_statistics_pooling`` (float32): the reference's products (BLAS's, AMX
    tiles or not: one has 128 outputs, the other sums 128 inputs, too few for the tiles to gain) and
    roundings, with the TDNN's bias, ReLU and tanh in place in one array, and the logits' bias added inside
    the softmax's statistics (``_biased_softmax_mean_and_std_rows``, rows of channels side by side), where the
    reference makes three arrays and the conv's bias pass, and its softmax twin a pass of NumPy's for each
    row's maximum."""
    if not isinstance(x_bct, np.ndarray) or x_bct.dtype != np.float32 or x_bct.ndim != 3:
        return NotImplemented
    B, C, T = x_bct.shape
    w1_a3c1, b1_a, w2_ca1, b2_c = a["tdnn.conv.weight"], a["tdnn.conv.bias"], a["conv.weight"], a["conv.bias"]
    arrays = (w1_a3c1, b1_a, w2_ca1, b2_c)
    if T == 0 or not all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in arrays):
        return NotImplemented
    A = w1_a3c1.shape[0]
    if w1_a3c1.shape != (A, 3 * C, 1) or b1_a.shape != (A,) or w2_ca1.shape != (C, A, 1) or b2_c.shape != (C,):
        return NotImplemented
    x_bct = np.ascontiguousarray(x_bct)
    mean_bc, std_bc = mean_and_std(x_bct, np.full((B, 1, T), 1.0 / T, dtype=np.float32))
    w_a3c = w1_a3c1[:, :, 0]
    bias_ba = b1_a + mean_bc @ w_a3c[:, C : 2 * C].T + std_bc @ w_a3c[:, 2 * C :].T  # (as the reference)
    w_ac, w_ca = np.ascontiguousarray(w_a3c[:, :C]), np.ascontiguousarray(w2_ca1[:, :, 0])
    pooled_bc1 = np.empty((B, 2 * C, 1), np.float32)
    mean_bc, std_bc = pooled_bc1[:, :C, 0], pooled_bc1[:, C:, 0]
    rows = max(1, ELEMENTWISE_PIECE // T)
    for b in range(B):
        h_at = np.matmul(w_ac, x_bct[b])
        h_at += bias_ba[b, :, None]
        np.tanh(np.maximum(h_at, 0, out=h_at), out=h_at)
        logits_ct = np.matmul(w_ca, h_at, out=new_output((C, T)))
        sums_c = np.empty((2, C), np.float32)

        def piece(c0, logits_ct=logits_ct, x_ct=x_bct[b], sums_c=sums_c):
            c1 = min(C, c0 + rows)
            lmax_c = np.max(logits_ct[c0:c1], axis=1)  # (NumPy's vectorized maximum, on this thread)
            _biased_softmax_mean_and_std_rows(
                x_ct[c0:c1],
                logits_ct[c0:c1],
                lmax_c,
                b2_c[c0:c1],
                np.float32(1e-12),
                sums_c[0, c0:c1],
                sums_c[1, c0:c1],
            )

        run_pieces(piece, [(c0,) for c0 in range(0, C, rows)])
        mean_bc[b], std_bc[b] = sums_c
    return pooled_bc1


@numba.njit(cache=True, nogil=True)
def _magnitude_rows(spectrum_tf, out_tf):
    """out = sqrt(re^2 + im^2 + 1e-9), each step rounded in float32 in that order (no fast-math: the
    reference's bits)."""
    for t in range(spectrum_tf.shape[0]):
        s_f, out_f = spectrum_tf[t], out_tf[t]
        for f in range(s_f.shape[0]):
            re, im = s_f[f].real, s_f[f].imag
            out_f[f] = np.sqrt((re * re + im * im) + np.float32(1e-9))


FFT_WORKERS = 2  # SciPy's threads for the frames' transforms (each frame's transform the same on any number)


def real_fft(frames_btn):
    """``tts.mel.real_fft`` with the frames split over ``FFT_WORKERS`` of SciPy's threads: the same transforms."""
    if not isinstance(frames_btn, np.ndarray):
        return NotImplemented
    import scipy.fft

    return scipy.fft.rfft(frames_btn, axis=-1, workers=FFT_WORKERS)


def spectral_magnitude(spectrum_btf):
    """``tts.speaker_encoder.spectral_magnitude`` (complex64): one pass over the spectrum, rows of frames
    side by side, where the reference's strided squares and sums make three passes and a temporary; the
    same bits."""
    if not isinstance(spectrum_btf, np.ndarray) or spectrum_btf.dtype != np.complex64 or spectrum_btf.ndim != 3:
        return NotImplemented
    B, T, F = spectrum_btf.shape
    spectrum_btf = np.ascontiguousarray(spectrum_btf)
    out_btf = np.empty((B, T, F), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // max(F, 1))
    run_pieces(
        lambda b, t0: _magnitude_rows(spectrum_btf[b, t0 : t0 + rows], out_btf[b, t0 : t0 + rows]),
        [(b, t0) for b in range(B) for t0 in range(0, T, rows)],
    )
    return out_btf


MEL_LANES = 16  # frames a band's sums of ``_mel_bands_into`` hold in one vector


@numba.njit(cache=True, nogil=True)
def _mel_bands_into(mag_tf, basis_mf, f0_m, f1_m, t0, t1, out_mt):
    """out[m, t] = sum_f basis[m, f] mag[t, f] for t0 <= t < t1, over each band's bins f0[m] <= f < f1[m] alone
    (the rest of its row zeros), a chain of fused multiply-adds in the order of f; 16 frames at once, their
    magnitudes copied into a buffer [F, 16] (a band's bin is then one vector of them)."""
    M, F = basis_mf.shape
    lanes_fl = np.zeros((F, MEL_LANES), dtype=np.float32)  # (lanes past the last frame: finite, dropped)
    lanes, sums_l = lanes_fl.reshape(-1), np.empty(MEL_LANES, dtype=np.float32)
    for s in range(t0, t1, MEL_LANES):
        n = min(MEL_LANES, t1 - s)
        mag_nf = mag_tf[s : s + n]
        for f in range(F):
            for i in range(n):
                lanes[f * MEL_LANES + i] = mag_nf[i, f]
        for m in range(M):
            sums = _v16_zeros()
            for f in range(f0_m[m], f1_m[m]):
                sums = _v16_fma(sums, _v16_load(lanes, f * MEL_LANES), basis_mf[m, f])
            _v16_store(sums_l, 0, sums)
            for i in range(n):
                out_mt[m, s + i] = sums_l[i]


def band_spans(basis_mf):
    """(f0, f1) [M] each: the first bin of each band's row that is not zero and one past its last (0, 0 for a
    row of zeros)."""
    nonzero_mf = basis_mf != 0
    F = basis_mf.shape[1]
    some_m = nonzero_mf.any(axis=1)
    f0_m = np.where(some_m, np.argmax(nonzero_mf, axis=1), 0)
    f1_m = np.where(some_m, F - np.argmax(nonzero_mf[:, ::-1], axis=1), 0)
    return f0_m.astype(np.int64), f1_m.astype(np.int64)


def mel_bands(basis_mf, magnitude_bft):
    """``tts.mel.mel_bands`` (float32): each band's sum over its nonzero bins alone (about 2 of the 128 rows'
    bins a bin, where the reference's product multiplies every zero), 16 frames a vector, pieces of frames
    side by side (``_mel_bands_into``).  Sums of the same nonzero terms in another order than BLAS's: float32
    rounding apart, the same numbers."""
    arrays = (basis_mf, magnitude_bft)
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays):
        return NotImplemented
    if basis_mf.ndim != 2 or magnitude_bft.ndim != 3 or magnitude_bft.shape[1] != basis_mf.shape[1]:
        return NotImplemented
    B, F, T = magnitude_bft.shape
    mag_btf = np.ascontiguousarray(np.swapaxes(magnitude_bft, 1, 2))  # (the front end's frames: a view)
    basis_mf = np.ascontiguousarray(basis_mf)
    f0_m, f1_m = band_spans(basis_mf)
    out_bmt = np.empty((B, basis_mf.shape[0], T), np.float32)
    n = _piece_threads()
    cuts = [MEL_LANES * (-(-T // MEL_LANES) * i // n) for i in range(n)] + [T]
    run_pieces(
        lambda b, t0, t1: _mel_bands_into(mag_btf[b], basis_mf, f0_m, f1_m, t0, t1, out_bmt[b]),
        [(b, cuts[i], cuts[i + 1]) for b in range(B) for i in range(n) if cuts[i] < cuts[i + 1]],
    )
    return out_bmt


RES2NET_PIECE_MIN_STEPS = 128  # steps a thread's range of ``_res2net_range_direct`` has at least (shorter signals: one)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _res2net_range_direct(x_ct, w_joik, b_jo, dilation, a, b, out_ct):
    """``res2net``'s output steps a <= t < b of one item [C, T] on the direct kernel (``_direct_conv_into``),
    all its groups on this thread: group 0 copied; group j's TDNN on x_j + y_(j-1) over the steps its
    successors need (the range widened by the padding's reach once per later group), its input rows written
    with their mirrored edges, then bias and ReLU.  Each output is the same chain of multiply-adds as the
    TDNN twin's on the direct kernel over the whole signal, so the same bits whoever computes it."""
    C, T = x_ct.shape
    J, Cg, _, K = w_joik.shape  # groups after the first, their channels, taps
    span = dilation * (K - 1)
    left = span // 2
    reach = span - left  # the steps an output reads beyond itself, on its farther side
    n_most = min(b - a + 2 * (J - 1) * reach, T)
    W = -(-n_most // DIRECT_STEPS) * DIRECT_STEPS
    rows_cl = np.zeros((Cg, span + W), dtype=np.float32)  # a group's input rows from r0 - left, mirrored
    sums_cw = np.empty((Cg, W), dtype=np.float32)
    y_ct = np.empty((Cg, T), dtype=np.float32)  # the previous group's output where it is computed
    for c in range(Cg):
        out_t, x_t = out_ct[c, a:b], x_ct[c, a:b]
        for i in range(out_t.shape[0]):
            out_t[i] = x_t[i]
    for j in range(1, J + 1):
        widen = (J - j) * reach
        r0, r1 = max(a - widen, 0), min(b + widen, T)  # group j's outputs the cascade needs
        n = r1 - r0
        p0 = r0 - left  # the position of rows[:, 0]
        inner0, inner1 = max(-p0, 0), min(T - p0, n + span)  # rows[:, inner0:inner1] unmirrored
        for c in range(Cg):
            x_t, y_t, row = x_ct[j * Cg + c], y_ct[c], rows_cl[c]
            for m in range(inner0):
                q = -(p0 + m)
                row[m] = x_t[q] if j == 1 else x_t[q] + y_t[q]
            xs, ys, rs = x_t[p0 + inner0 : p0 + inner1], y_t[p0 + inner0 : p0 + inner1], row[inner0:inner1]
            for i in range(rs.shape[0]):  # (indices from 0: no check for negative ones, a vectorized loop)
                rs[i] = xs[i] if j == 1 else xs[i] + ys[i]
            for m in range(inner1, n + span):
                q = 2 * (T - 1) - (p0 + m)
                row[m] = x_t[q] if j == 1 else x_t[q] + y_t[q]
        _direct_conv_into(rows_cl, w_joik[j - 1], dilation, n, sums_cw)
        for c in range(Cg):
            bias = b_jo[j - 1, c]
            for t in range(n):
                v = sums_cw[c, t] + bias
                y_ct[c, r0 + t] = np.float32(0.0) if v <= 0 else v
        for c in range(Cg):
            out_t, y_t = out_ct[j * Cg + c, a:b], y_ct[c, a:b]
            for i in range(out_t.shape[0]):
                out_t[i] = y_t[i]
