"""``nn.conv1d`` and ``nn.conv_transpose1d``: each a few matrix products over pieces of time side by side
(``run_pieces``), by the arrangement the shapes call for."""

from __future__ import annotations

import numba
import numpy as np

from ... import nn
from ..host_memory import new_output
from . import amx, runtime
from .intrinsics import FASTMATH, _v16_fma, _v16_load, _v16_store, _v16_zeros
from .linear import F32_FEW_ROWS, F32_FEW_ROWS_MIN_BYTES, _few_rows_f32
from .pieces import _piece_threads, run_pieces, time_pieces

CONV_PIECE_BYTES = 4 << 20  # the stacked taps of one piece of ``conv1d`` ([I * K, columns] float32; half was slower)
CONV_PIECE_MIN_COLUMNS = 256  # with many stacked taps, pieces this wide still (each piece reads the weight once)
PER_TAP_MAX_OUT = 8  # up to this many output channels (the decoder's last conv, 96 -> 1): a product per tap
MIN_PIECES = 8  # fewer pieces than this share out unevenly over the threads: then one piece on BLAS's threads


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_taps_into(x_ct, t0, stride, dilation, cols_ikn):
    """cols[i, k, j] = x[i, (t0 + j) * stride + k * dilation]: the K taps of output columns t0 .. t0 + N - 1
    side by side ("im2col"), so that the conv of the piece is one matrix product."""
    I, K, N = cols_ikn.shape
    for i in range(I):
        for k in range(K):
            first = t0 * stride + k * dilation
            if stride == 1:
                cols_ikn[i, k, :] = x_ct[i, first : first + N]
            else:
                for j in range(N):
                    cols_ikn[i, k, j] = x_ct[i, first + j * stride]


ONE_CHANNEL_SPAN = 2048  # output columns a one-channel conv sums at a time (a float32 buffer of 8 KB)


@numba.njit(cache=True, nogil=True)
def _one_channel_conv_into(x_t, w_ok, b_o, dilation, t0, t1, out_ot):
    """out[o, t] = (((w[o, 0] x[t] + w[o, 1] x[t + d]) + w[o, 2] x[t + 2 d]) + ...) + b[o] for t0 <= t < t1:
    a stride-1 conv of ONE input channel, its taps summed in order and the bias last, each product rounded
    before its sum (no fused multiply-adds): the reference's operations in its order, its bits.  A chunk of
    columns at a time for every output channel, two taps a pass (stacked for a product, the taps of one
    channel would write and read K copies of the input)."""
    O, K = w_ok.shape
    acc_n = np.empty(ONE_CHANNEL_SPAN, dtype=np.float32)
    for c0 in range(t0, t1, ONE_CHANNEL_SPAN):
        n = min(ONE_CHANNEL_SPAN, t1 - c0)
        for o in range(O):
            w0, x0 = w_ok[o, 0], x_t[c0 : c0 + n]
            for j in range(n):
                acc_n[j] = w0 * x0[j]
            for k in range(1, K - 1, 2):
                wa, wb, first = w_ok[o, k], w_ok[o, k + 1], c0 + k * dilation
                xa, xb = x_t[first : first + n], x_t[first + dilation : first + dilation + n]
                for j in range(n):
                    acc_n[j] = (acc_n[j] + wa * xa[j]) + wb * xb[j]
            out_t, bias = out_ot[o, c0 : c0 + n], b_o[o]
            if K % 2 == 0:
                w_last, x_last = w_ok[o, K - 1], x_t[c0 + (K - 1) * dilation : c0 + (K - 1) * dilation + n]
                for j in range(n):
                    out_t[j] = (acc_n[j] + w_last * x_last[j]) + bias
            else:
                for j in range(n):
                    out_t[j] = acc_n[j] + bias


SMALL_WEIGHT_SHARE = 8  # a weight of at most 1/8 of the stacked taps' bytes is cheap to read once per thread


def _few_conv_pieces(weight_values: int, taps_per_column: int, T_out: int) -> int:
    """The columns of each piece of a conv with too few pieces to share out evenly: one equal share per
    thread where the weight is small against the stacked taps (each thread stacks its own taps and reads
    the weight again: the stacking runs on every thread too), else all of them in one piece, on BLAS's
    threads."""
    threads = _piece_threads()
    share = -(-T_out // max(threads, 1))
    small_weight = SMALL_WEIGHT_SHARE * weight_values <= taps_per_column * T_out
    if threads > 1 and share >= CONV_PIECE_MIN_COLUMNS and small_weight:
        return share
    return T_out


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d`` by the arrangement the shapes call for (other group counts: the reference):

    - one input channel, stride 1: ``_one_channel_conv``, the reference's bits;
    - at most ``PER_TAP_MAX_OUT`` outputs: a product per tap, accumulated in one reused buffer;
    - 1x1, stride 1: one product;
    - a few output columns and a big float32 weight: ``_few_columns_conv``;
    - dense otherwise: pieces of columns side by side, each ONE product of its stacked taps ("im2col",
      about ``CONV_PIECE_BYTES``) by the weight as stored, in place (fewer than ``MIN_PIECES``:
      ``_few_conv_pieces``);
    - depthwise: a multiply-add per tap."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    end = lambda k: k * dilation + stride * (T_out - 1) + 1  # noqa: E731 - last input index used by tap k, +1
    if groups == 1 and I == 1 and stride == 1 and _one_channel_takes(x_bct, w_oik, b_o):
        return _one_channel_conv(x_bct, w_oik, b_o, dilation, T_out)
    if groups == 1 and O <= PER_TAP_MAX_OUT:
        out = np.matmul(w_oik[:, :, 0], x_bct[:, :, 0 : end(0) : stride])
        product = np.empty_like(out)  # reused for every further tap
        for k in range(1, K):
            out += np.matmul(w_oik[:, :, k], x_bct[:, :, k * dilation : end(k) : stride], out=product)
    elif groups == 1 and K == 1 and stride == 1:  # a plain product (the speaker encoder's 1x1 convs)
        out = np.matmul(np.ascontiguousarray(w_oik[:, :, 0]), x_bct, out=new_output((B, O, T), x_bct.dtype))
    elif groups == 1 and B == 1 and _few_columns(x_bct, w_oik, b_o, T_out):
        return _few_columns_conv(x_bct, w_oik, b_o, stride, dilation, T_out)
    elif groups == 1:
        x_bct = np.ascontiguousarray(x_bct)
        w_m = np.ascontiguousarray(w_oik).reshape(O, I * K)  # column i * K + k: the order of the stacked taps
        n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * I * K))
        if B * -(-T_out // n_piece) < MIN_PIECES:  # too few to share out evenly
            n_piece = _few_conv_pieces(O * I * K, I * K, T_out)
        out = new_output((B, O, T_out), x_bct.dtype)

        def piece(b, t0):
            cols_ikn = np.empty((I, K, min(n_piece, T_out - t0)), x_bct.dtype)
            _stack_taps_into(x_bct[b], t0, stride, dilation, cols_ikn)
            out_on = out[b, :, t0 : t0 + cols_ikn.shape[-1]]
            np.matmul(w_m, cols_ikn.reshape(I * K, -1), out=out_on)
            if b_o is not None:
                out_on += b_o[:, None]

        run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)])
        return out
    elif groups == C and I == 1 and O == C:
        out = np.zeros((B, O, T_out), dtype=x_bct.dtype)
        for k in range(K):
            out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation : end(k) : stride]
    else:
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    if b_o is not None:
        out += b_o[None, :, None]
    return out


def _one_channel_takes(x_bct, w_oik, b_o) -> bool:
    """Whether ``_one_channel_conv`` computes this conv: float32 host arrays (float64, the explicit backend,
    keeps the reference)."""
    arrays = (x_bct, w_oik) if b_o is None else (x_bct, w_oik, b_o)
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


def _one_channel_conv(x_bct, w_oik, b_o, dilation, T_out):
    """A stride-1 conv of one input channel by ``_one_channel_conv_into``, in ``MIN_PIECES`` pieces of
    columns side by side (``run_pieces``)."""
    B, O = x_bct.shape[0], w_oik.shape[0]
    x_bt, w_ok = np.ascontiguousarray(x_bct[:, 0]), np.ascontiguousarray(w_oik[:, 0])
    b_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o)
    out = new_output((B, O, T_out), np.float32)
    share = max(ONE_CHANNEL_SPAN, -(-T_out // MIN_PIECES))

    def piece(b, t0):
        _one_channel_conv_into(x_bt[b], w_ok, b_o, dilation, t0, min(T_out, t0 + share), out[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, share)])
    return out


def _few_columns(x_bct, w_oik, b_o, T_out: int) -> bool:
    """Whether a dense conv's product is a few rows (its output columns) times a float32 weight worth
    streaming: what ``_few_rows_f32`` takes (other dtypes keep the stacked-taps product)."""
    if x_bct.dtype != np.float32 or w_oik.dtype != np.float32 or getattr(b_o, "dtype", np.float32) != np.float32:
        return False
    return F32_FEW_ROWS[0] <= T_out <= F32_FEW_ROWS[1] and w_oik.nbytes >= F32_FEW_ROWS_MIN_BYTES


def _few_columns_conv(x_bct, w_oik, b_o, stride, dilation, T_out):
    """A dense conv with a few output columns and a big weight (the decoder's first conv over the steps of
    a short decode): the stacked taps, transposed, are a few rows times the weight ([O, I * K] as stored)
    by ``_few_rows_f32``, the weight read once from memory, where BLAS packs it first; ``conv1d`` has
    checked the shapes."""
    O, I, K = w_oik.shape
    cols_ikn = np.empty((I, K, T_out), x_bct.dtype)
    _stack_taps_into(np.ascontiguousarray(x_bct[0]), 0, stride, dilation, cols_ikn)
    x_ni = np.ascontiguousarray(cols_ikn.reshape(I * K, T_out).T)
    out_no = _few_rows_f32(x_ni, np.ascontiguousarray(w_oik).reshape(O, I * K), b_o)  # (``_few_columns``: it applies)
    return np.ascontiguousarray(out_no.T)[None]


TRANSPOSED_PIECE_BYTES = 4 << 20  # the products of one piece of ``conv_transpose1d`` ([O * K, frames] float32)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _overlap_add_into(z_okf, first, t0, n, stride, bias_o, out_ot):
    """out[o, stride * t + p] = bias[o] + sum_j z[o, p + j * stride, t - j - first] for output frames
    t0 <= t < t0 + n, phases p < stride and j < K / stride, over the input frames z holds (frames
    first .. first + F - 1; the others are zeros): the taps' products added where they land, tap block j
    by tap block j over the frames where it has input (no test inside the loop), then the bias: the sum of
    a sample in the order j = 0, 1, ..., bias, as one sample at a time summed it (the same bits)."""
    O, K, F = z_okf.shape
    J = K // stride
    for o in range(O):
        row_s = out_ot[o, stride * t0 : stride * (t0 + n)]
        row_s[:] = 0.0
        for j in range(J):
            lo, hi = max(t0, first + j), min(t0 + n, first + j + F)  # the frames t with 0 <= t - j - first < F
            for p in range(stride):
                z_f = z_okf[o, p + j * stride]
                for t in range(lo, hi):
                    row_s[stride * (t - t0) + p] += z_f[t - j - first]
        row_s += bias_o[o]


FEW_FRAMES = 8  # up to this many input frames (a streaming chunk, a first frame): ``_few_frames_times``
FEW_FRAMES_COLUMNS = 4096  # weight columns a thread sums at a time (their sums for 8 frames: 128 KB, in L2)
FEW_FRAMES_ROWS = 8  # weight rows added into the sums at a time (``_eight_rows_times``: 8 vectors in registers)


@numba.njit(inline="always")
def _eight_rows_times(words, p, J, x_if, i0, sums, q, F, columns):
    """sums[f * columns + q ...] (16 of them) + rows i0 .. i0 + 7 of the weight (16 columns from word p) times
    x[i, f], for every frame f: the 8 vectors of the weight loaded once, each sum a chain of 8 fused
    multiply-adds in the rows' order."""
    w0, w1, w2 = _v16_load(words, p), _v16_load(words, p + J), _v16_load(words, p + 2 * J)
    w3, w4, w5 = _v16_load(words, p + 3 * J), _v16_load(words, p + 4 * J), _v16_load(words, p + 5 * J)
    w6, w7 = _v16_load(words, p + 6 * J), _v16_load(words, p + 7 * J)
    for f in range(F):
        s = _v16_load(sums, f * columns + q)
        s = _v16_fma(_v16_fma(s, w0, x_if[i0, f]), w1, x_if[i0 + 1, f])
        s = _v16_fma(_v16_fma(s, w2, x_if[i0 + 2, f]), w3, x_if[i0 + 3, f])
        s = _v16_fma(_v16_fma(s, w4, x_if[i0 + 4, f]), w5, x_if[i0 + 5, f])
        s = _v16_fma(_v16_fma(s, w6, x_if[i0 + 6, f]), w7, x_if[i0 + 7, f])
        _v16_store(sums, f * columns + q, s)


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _few_frames_times(x_if, w_ij, j0, j1, columns, z_jf):
    """z[j, f] = sum_i x[i, f] w[i, j] for a few frames f and the columns j0 <= j < j1, each sum a chain of
    fused multiply-adds in the order i = 0 .. I - 1: strip by strip of ``columns`` columns, their sums for
    every frame kept in the cache while ``FEW_FRAMES_ROWS`` rows of the strip at a time, read in order (from
    memory: the weight is read once), are added into them, 16 columns a vector (``_eight_rows_times``; the
    last rows and a strip's last columns one at a time, the same operations).  Where BLAS packs every block of
    the weight (a copy) before multiplying a few columns, this reads it once; a sum's round trip through the
    cache every row (the loops before) took twice the time."""
    I, J = w_ij.shape
    F = x_if.shape[1]
    words = w_ij.reshape(-1)
    sums = np.empty(F * columns, dtype=np.float32)
    for s0 in range(j0, j1, columns):
        n = min(j1, s0 + columns) - s0
        whole = n // 16 * 16
        sums[:] = 0.0
        for i0 in range(0, I, FEW_FRAMES_ROWS):
            i1 = min(I, i0 + FEW_FRAMES_ROWS)
            for j in range(0, whole, 16):
                if i1 - i0 == FEW_FRAMES_ROWS:
                    _eight_rows_times(words, i0 * J + s0 + j, J, x_if, i0, sums, j, F, columns)
                    continue
                for f in range(F):  # the last rows
                    s = _v16_load(sums, f * columns + j)
                    for i in range(i0, i1):
                        s = _v16_fma(s, _v16_load(words, i * J + s0 + j), x_if[i, f])
                    _v16_store(sums, f * columns + j, s)
            for j in range(whole, n):  # (fastmath "contract" alone: each += a fused multiply-add, in order)
                for f in range(F):
                    s = sums[f * columns + j]
                    for i in range(i0, i1):
                        s += x_if[i, f] * w_ij[i, s0 + j]
                    sums[f * columns + j] = s
        for j in range(n):
            for f in range(F):
                z_jf[s0 + j, f] = sums[f * columns + j]


def conv_transpose1d(x_bct, w_iok, b_o=None, stride: int = 1):
    """``nn.conv_transpose1d`` for K = J * stride taps (the codec's K = 2 * stride): a piece of output
    frames and channels takes the products of their taps with the input frames they read in ONE matrix
    product, W^T [O * K, I] (the weight as stored, read transposed) times x [I, frames], and adds each where
    it lands (``_overlap_add_into``).  The pieces' outputs are disjoint (the J - 1 frames before a piece are
    multiplied again), so they run side by side; their size is ``_transposed_pieces``'s.  Up to
    ``FEW_FRAMES`` input frames, the products come from ``_few_frames_times``."""
    B, C, T = x_bct.shape
    I, O, K = w_iok.shape
    if x_bct.dtype != np.float32 or K % stride or C != I:
        return NotImplemented
    J = K // stride
    x_bct = np.ascontiguousarray(x_bct)
    w_t = np.ascontiguousarray(w_iok).reshape(I, O * K).T  # a view: BLAS reads it transposed
    bias_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o, dtype=np.float32)
    frames = T + J - 1  # output frames: (T - 1) * stride + K samples
    out_bot = new_output((B, O, frames * stride))
    if T <= FEW_FRAMES:  # the weight read once, all its columns side by side
        n_threads, z_jf = _piece_threads(), np.empty((O * K, T), np.float32)
        ranges = [(O * K * t // n_threads, O * K * (t + 1) // n_threads) for t in range(n_threads)]
        for b in range(B):
            run_pieces(lambda j0, j1, b=b: _few_frames_times(x_bct[b], w_t.T, j0, j1, FEW_FRAMES_COLUMNS, z_jf), ranges)
            _overlap_add_into(z_jf.reshape(O, K, T), 0, 0, frames, stride, bias_o, out_bot[b])
        return out_bot
    step, n_piece = _transposed_pieces(O, K, frames, w_t.nbytes)
    if step == O:  # every channel: pieces of frames as even between the threads as whole lines allow
        frame_pieces = time_pieces(frames, n_piece, TRANSPOSED_FRAMES_STEP)
    else:
        frame_pieces = [(t0, min(n_piece, frames - t0)) for t0 in range(0, frames, n_piece)]

    def piece(b, o0, t0, n):
        o1 = min(O, o0 + step)
        first, last = max(t0 - J + 1, 0), min(t0 + n, T)  # the input frames this piece reads
        z_okf = (w_t[o0 * K : o1 * K] @ x_bct[b, :, first:last]).reshape(o1 - o0, K, last - first)
        _overlap_add_into(z_okf, first, t0, n, stride, bias_o[o0:o1], out_bot[b, o0:o1])

    run_pieces(piece, [(b, o0, t0, n) for b in range(B) for o0 in range(0, O, step) for t0, n in frame_pieces])
    return out_bot


TRANSPOSED_FRAMES_STEP = 16  # a piece of frames of every channel: a whole number of 16 frames (but the last)
TRANSPOSED_CHANNEL_PIECE_BYTES = 32 << 20  # the products of a piece of some of the channels (bounds its memory)


def _transposed_pieces(O: int, K: int, frames: int, weight_bytes: int) -> tuple:
    """(channels, frames) of a piece of ``conv_transpose1d``: every channel and ``TRANSPOSED_PIECE_BYTES``
    of products (each piece reads the whole weight), unless a thread's share of the channels, with pieces
    of ``TRANSPOSED_CHANNEL_PIECE_BYTES`` (each piece reads its share of the weight), moves fewer bytes,
    counting the weight's reads and the products written and read again out of the cache (big weights over
    a few hundred frames take shares; small ones over long signals every channel).  Too few frames for a
    piece per thread: shares too."""
    row_bytes = 4 * O * K  # the products of one frame
    n_all = max(16, TRANSPOSED_PIECE_BYTES // row_bytes)
    n_share = max(16, TRANSPOSED_CHANNEL_PIECE_BYTES // row_bytes)
    threads = _piece_threads()
    all_channels = -(-frames // n_all) * weight_bytes
    shares = -(-frames // n_share) * weight_bytes + 2 * frames * row_bytes
    if shares < all_channels or -(-frames // n_all) < threads:  # (fewer pieces than threads: shares, too)
        return -(-O // max(2, threads)), n_share
    return O, n_all


# Without the AMX tiles, the codecs' convolutions of a few hundred channels were OpenBLAS's products of their
# stacked taps (about 75-95 GFLOP/s on a Zen 4 core, the taps written first).  A direct kernel reads the taps
# as shifts of the rows themselves and keeps the sums of 4 outputs x 64 steps in 16 vector registers over the
# whole reduction (about 110 GFLOP/s there).  The rule is ``direct_conv_takes``.

DIRECT_OUT = 4  # output channels of a block of ``_direct_conv_into`` (4 x 4 vectors of sums in registers)
DIRECT_STEPS = 64  # time steps of a block (4 vectors of 16 lanes)
DIRECT_1X1_MAX_IN = 128  # a 1x1 conv with more inputs keeps the BLAS product (faster there: measured at 384)


def direct_kernel_takes(O: int, I: int, K: int) -> bool:
    """Whether ``_direct_conv_into`` can run a conv of I -> O channels with K taps: compiled for 512-bit vectors
    (AVX-512; with narrower ones its 16 vectors of sums would not stay in registers), whole blocks of
    ``DIRECT_OUT`` outputs, and taps to read (K > 1) or at most ``DIRECT_1X1_MAX_IN`` inputs."""
    avx512 = runtime.machine().packed_compiled
    return avx512 and O % DIRECT_OUT == 0 and (K > 1 or I <= DIRECT_1X1_MAX_IN)


def direct_conv_takes(O: int, I: int, K: int) -> bool:
    """Whether a conv of I -> O channels with K taps runs on ``_direct_conv_into``: where the kernel can
    (``direct_kernel_takes``) and the AMX tiles are not granted (they run these convs:
    ``amx_conv._convs_take_tiles``).  The speaker encoder's convs take it wherever the tiles do not run them
    (its twins' rule: a Res2Net's groups, a TDNN of float32 weights)."""
    return not amx.USE_TILES and direct_kernel_takes(O, I, K)


def direct_width(n: int) -> int:
    """The row length ``_direct_conv_into`` writes for n steps: n rounded up to whole blocks."""
    return -(-n // DIRECT_STEPS) * DIRECT_STEPS


@numba.njit(inline="always")
def _fma_row(s0, s1, s2, s3, x0, x1, x2, x3, weight):
    """The 4 vectors of sums of one output (64 steps) plus weight times the 4 vectors of taps."""
    return _v16_fma(s0, x0, weight), _v16_fma(s1, x1, weight), _v16_fma(s2, x2, weight), _v16_fma(s3, x3, weight)


@numba.njit(inline="always")
def _store_row(out, r, s0, s1, s2, s3):
    """out[r : r + 64] = the 4 vectors of sums of one output."""
    _v16_store(out, r, s0)
    _v16_store(out, r + 16, s1)
    _v16_store(out, r + 32, s2)
    _v16_store(out, r + 48, s3)


@numba.njit(inline="always")
def _direct_half_block_into(x, w, L, C, K, dilation, o, t, out, W):
    """``_direct_conv_into``'s block of 4 outputs at step t over 32 steps only (2 vectors an output): the
    same chain of fused multiply-adds for each of them."""
    CK = C * K
    a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = _v16_zeros()
    for c in range(C):
        for k in range(K):
            i, q = c * L + t + k * dilation, o * CK + c * K + k
            x0, x1 = _v16_load(x, i), _v16_load(x, i + 16)
            a0, a1 = _v16_fma(a0, x0, w[q]), _v16_fma(a1, x1, w[q])
            b0, b1 = _v16_fma(b0, x0, w[q + CK]), _v16_fma(b1, x1, w[q + CK])
            c0, c1 = _v16_fma(c0, x0, w[q + 2 * CK]), _v16_fma(c1, x1, w[q + 2 * CK])
            d0, d1 = _v16_fma(d0, x0, w[q + 3 * CK]), _v16_fma(d1, x1, w[q + 3 * CK])
    r = o * W + t
    _v16_store(out, r, a0)
    _v16_store(out, r + 16, a1)
    _v16_store(out, r + W, b0)
    _v16_store(out, r + W + 16, b1)
    _v16_store(out, r + 2 * W, c0)
    _v16_store(out, r + 2 * W + 16, c1)
    _v16_store(out, r + 3 * W, d0)
    _v16_store(out, r + 3 * W + 16, d1)


@numba.njit(cache=True, nogil=True)
def _direct_conv_into(x_cl, w_oik, dilation, n, out_ow):
    """out[o, j] = sum_c sum_k w[o, c, k] x[c, j + k dilation] for j < W, out's row length: ``direct_width(n)``,
    or n rounded up to 32 steps where it ends in the first half of a block (O a multiple of ``DIRECT_OUT``; x
    and out C-contiguous, x's rows at least (K - 1) dilation + W samples long): blocks of 4 outputs x 64 steps
    (the last, within rows of such a W, of 32 steps: ``_direct_half_block_into``), each output's sum a float32
    chain of fused multiply-adds in the order c, then k (the same bits whichever block or thread computes it)."""
    O, C, K = w_oik.shape
    L, W = x_cl.shape[1], out_ow.shape[1]
    x, w, out = x_cl.reshape(-1), w_oik.reshape(-1), out_ow.reshape(-1)
    CK = C * K
    for o in range(0, O, DIRECT_OUT):
        for t in range(0, n, DIRECT_STEPS):
            if W - t < DIRECT_STEPS:  # rows ending 32 steps after t
                _direct_half_block_into(x, w, L, C, K, dilation, o, t, out, W)
                continue
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = _v16_zeros()
            for c in range(C):
                for k in range(K):
                    i, q = c * L + t + k * dilation, o * CK + c * K + k
                    x0, x1, x2, x3 = _v16_load(x, i), _v16_load(x, i + 16), _v16_load(x, i + 32), _v16_load(x, i + 48)
                    a0, a1, a2, a3 = _fma_row(a0, a1, a2, a3, x0, x1, x2, x3, w[q])
                    b0, b1, b2, b3 = _fma_row(b0, b1, b2, b3, x0, x1, x2, x3, w[q + CK])
                    c0, c1, c2, c3 = _fma_row(c0, c1, c2, c3, x0, x1, x2, x3, w[q + 2 * CK])
                    d0, d1, d2, d3 = _fma_row(d0, d1, d2, d3, x0, x1, x2, x3, w[q + 3 * CK])
            r = o * W + t
            _store_row(out, r, a0, a1, a2, a3)
            _store_row(out, r + W, b0, b1, b2, b3)
            _store_row(out, r + 2 * W, c0, c1, c2, c3)
            _store_row(out, r + 3 * W, d0, d1, d2, d3)


def direct_half_width(n: int) -> int:
    """The row length for n steps where ``_direct_conv_into`` computes a last half block: n rounded up to
    32 steps (``direct_width`` where that is whole blocks)."""
    return -(-n // (DIRECT_STEPS // 2)) * (DIRECT_STEPS // 2)
