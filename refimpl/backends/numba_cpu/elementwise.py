"""The elementwise twins of ``refimpl/nn.py`` (silu, elu, softmax, rms_norm, gelu_erf, snake_beta) and the
polynomials they evaluate, in pieces side by side (``run_pieces``); the per-row passes the codecs' fused
steps share (SnakeBeta of a row, bias plus residual)."""

from __future__ import annotations

import math

import numba
import numpy as np

from ... import nn
from ..host_memory import new_output
from .intrinsics import FASTMATH
from .pieces import run_pieces

ELEMENTWISE_PIECE = 1 << 18  # samples per piece of an elementwise twin (a megabyte of float32)


def _elementwise_in_pieces(x, into):
    """A new array y with ``into(x_piece, y_piece)`` for pieces of ``ELEMENTWISE_PIECE`` samples of x
    (flattened), side by side (``run_pieces``: NumPy's and SciPy's ufuncs release the GIL), each piece's
    passes in the cache."""
    x = np.ascontiguousarray(x)
    flat, out = x.reshape(-1), new_output(x.shape, x.dtype)
    out_flat, n = out.reshape(-1), ELEMENTWISE_PIECE

    def piece(i0):
        into(flat[i0 : i0 + n], out_flat[i0 : i0 + n])

    run_pieces(piece, [(i0,) for i0 in range(0, flat.size, n)])
    return out


def silu(x):
    """``nn.silu``, x * (1 / (1 + exp(-x))) in x's precision, in pieces (``_silu_into``): the reference's
    bits, without importing SciPy for its ``expit`` (the text projection's SiLU is on a fresh process's
    way to its first audio, where importing SciPy's special functions is a sizable part of the start)."""
    one = x.dtype.type(1.0)
    return _elementwise_in_pieces(x, lambda xs, ys: _silu_into(xs, one, ys))


@numba.njit(cache=True, nogil=True)
def _silu_into(x, one, out):
    """out = x * (one / (one + exp(-x))), ``one`` of x's type: the operations of ``scipy.special.expit`` (a
    quotient of the C library's exp) and the product, each rounded to x's type; exp is the C library's
    (``math.exp``, a call Numba does not vectorise), so every element is the reference's to the bit
    (tested across every float32 exponent)."""
    for i in range(x.shape[0]):
        xi = x[i]
        out[i] = xi * (one / (one + math.exp(-xi)))


def elu(x, alpha: float = 1.0):
    """``nn.elu`` as max(x, 0) + alpha * expm1(min(x, 0)) (one term is always 0: the same bits), in pieces."""
    a = x.dtype.type(alpha)
    return _elementwise_in_pieces(x, lambda xs, ys: _elu_into(xs, a, ys))


def _elu_into(x, alpha, out) -> None:
    """out = max(x, 0) + alpha * expm1(min(x, 0)) (``out`` may be ``x``)."""
    negative = np.minimum(x, 0)
    np.expm1(negative, out=negative)
    if alpha != 1.0:
        negative *= alpha
    np.maximum(x, 0, out=out)
    out += negative


def softmax(x, axis: int = -1):
    """``nn.softmax`` over the last axis of a host float array: the reference itself on pieces of rows side by
    side (``run_pieces``), each piece's three arrays in the cache, into one output (the same bits)."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim == 0 or x.size == 0:
        return NotImplemented
    if axis not in (-1, x.ndim - 1):
        return NotImplemented
    x = np.ascontiguousarray(x)
    rows_rt, out = x.reshape(-1, x.shape[-1]), new_output(x.shape, x.dtype)
    out_rt, n = out.reshape(rows_rt.shape), max(1, ELEMENTWISE_PIECE // x.shape[-1])

    def piece(r0):
        out_rt[r0 : r0 + n] = nn.softmax.reference(rows_rt[r0 : r0 + n], axis=-1)

    run_pieces(piece, [(r0,) for r0 in range(0, rows_rt.shape[0], n)])
    return out


PAIRWISE_BLOCK = 128  # NumPy's pairwise summation: blocks of up to 128 values, each with 8 accumulators


@numba.njit(inline="always")
def _pairwise_block(a, lo, n):
    """sum(a[lo : lo + n]) for n <= PAIRWISE_BLOCK as NumPy adds it: under 8 values one after another; else
    8 interleaved sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the values past
    the last multiple of 8."""
    if n < 8:
        total = np.float32(-0.0)
        for i in range(n):
            total += a[lo + i]
        return total
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0, r1, r2, r3 = r0 + a[lo + i], r1 + a[lo + i + 1], r2 + a[lo + i + 2], r3 + a[lo + i + 3]
        r4, r5, r6, r7 = r4 + a[lo + i + 4], r5 + a[lo + i + 5], r6 + a[lo + i + 6], r7 + a[lo + i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += a[lo + i]
        i += 1
    return total


@numba.njit(cache=True, nogil=True)
def _pairwise_sum(a, lo, n):
    """sum(a[lo : lo + n]) with the bits of NumPy's float32 ``np.add.reduce`` of a contiguous row: a row
    longer than PAIRWISE_BLOCK split in two at a multiple of 8 near its middle, each half summed so, the
    halves added; a shorter one by ``_pairwise_block``.  The recursion is a loop over a stack (a recursive
    Numba function breaks in the on-disk cache): a piece (kind 0) is summed, or split into its halves and
    a combination (kind 1), which adds the last two sums."""
    lo_s, n_s, kind_s = np.empty(128, np.int64), np.empty(128, np.int64), np.empty(128, np.int64)
    sums = np.empty(64, dtype=np.float32)
    lo_s[0], n_s[0], kind_s[0], top, done = lo, n, 0, 1, 0
    while top > 0:
        top -= 1
        p_lo, p_n, kind = lo_s[top], n_s[top], kind_s[top]
        if kind == 1:  # both halves summed: their sum replaces them
            sums[done - 2] = sums[done - 2] + sums[done - 1]
            done -= 1
        elif p_n <= PAIRWISE_BLOCK:
            sums[done] = _pairwise_block(a, p_lo, p_n)
            done += 1
        else:  # the left half first: pushed last
            half = p_n // 2
            half -= half % 8
            lo_s[top], n_s[top], kind_s[top] = 0, 0, 1
            lo_s[top + 1], n_s[top + 1], kind_s[top + 1] = p_lo + half, p_n - half, 0
            lo_s[top + 2], n_s[top + 2], kind_s[top + 2] = p_lo, half, 0
            top += 3
    return sums[0]


@numba.njit(cache=True, nogil=True)
def _rms_norm_rows(x_rc, w_c, eps, out_rc):
    """out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for each row, float32 step by step without fused
    multiply-adds, the mean NumPy's (``_pairwise_sum`` of the squares, divided by the row length): the
    reference's operations in its order, its bits."""
    R, C = x_rc.shape
    squares_c = np.empty(C, dtype=np.float32)
    for r in range(R):
        x_c, out_c = x_rc[r], out_rc[r]
        for c in range(C):
            squares_c[c] = x_c[c] * x_c[c]
        root = np.sqrt(_pairwise_sum(squares_c, 0, C) / np.float32(C) + eps)
        for c in range(C):
            out_c[c] = w_c[c] * (x_c[c] / root)


def rms_norm(x, w, eps: float):
    """``nn.rms_norm`` for float32 host arrays, C-contiguous, and a weight of the last axis's length: one
    compiled pass per row with the reference's bits (``_rms_norm_rows``), where the reference makes six
    small NumPy calls; rows in pieces side by side when there are many.  The weight is passed read-only (a
    view where it is writable: the norms widened from bf16 at the load are, a mapped checkpoint's are not),
    so that one compiled kind of the kernel serves both."""
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in (x, w)) or x.ndim == 0:
        return NotImplemented
    if not x.flags.c_contiguous or w.shape != x.shape[-1:] or x.size == 0:
        return NotImplemented  # (another layout sums in another order in NumPy; a broadcast weight: the reference)
    rows_rc, out = x.reshape(-1, x.shape[-1]), np.empty(x.shape, np.float32)
    out_rc, w_c, eps32 = out.reshape(rows_rc.shape), np.ascontiguousarray(w), np.float32(eps)
    if w_c.flags.writeable:
        w_c = w_c.view()
        w_c.flags.writeable = False
    n = max(1, ELEMENTWISE_PIECE // x.shape[-1])
    if rows_rc.shape[0] <= n:
        _rms_norm_rows(rows_rc, w_c, eps32, out_rc)
        return out

    def piece(r0):
        _rms_norm_rows(rows_rc[r0 : r0 + n], w_c, eps32, out_rc[r0 : r0 + n])

    run_pieces(piece, [(r0,) for r0 in range(0, rows_rc.shape[0], n)])
    return out


def gelu_erf(x):
    """``nn.gelu_erf``, 0.5 * x * (1 + erf(x / sqrt(2))), in pieces, each the reference's float32
    operations in its order.  Float32: erf by ``_erf_f64`` in a Numba loop that vectorises
    (``_gelu_erf_into``; SciPy's float32 erf is scalar code, most of the codecs' GELU time); float64 (the
    explicit backend): SciPy's erf, the reference's bits."""
    scale = x.dtype.type(1.0 / math.sqrt(2.0))
    if x.dtype == np.float32:
        return _elementwise_in_pieces(x, lambda xs, ys: _gelu_erf_into(xs, scale, ys))

    import scipy.special  # (float64 only: not imported with the backend)

    def into(xs, ys):
        scipy.special.erf(xs * scale, out=ys)
        ys += 1.0
        ys *= 0.5 * xs

    return _elementwise_in_pieces(x, into)


# erf(y) / y as a polynomial in u = y^2 / 8 - 1 (y in [-4, 4] -> u in [-1, 1]): degree 22, fitted to SciPy's
# float64 erf at 6000 Chebyshev nodes and written in powers of u; on [0, 4] it is within 4e-13 of SciPy's erf
# (float32's spacing near 1 is 6e-8).  Beyond |y| = 4 the float32 erf is +-1, which erf(4) = 1 - 1.5e-8 rounds to.
_ERF_OVER_Y = (
    0.35353099564338725,
    -0.17657623330398098,
    0.1316751168997239,
    -0.10771044230009358,
    0.09020899387405061,
    -0.07472787165302433,
    0.05988690940399517,
    -0.045765039993557174,
    0.03306059027452971,
    -0.022474034087925025,
    0.014349838413858671,
    -0.008604344628029009,
    0.004852696242802761,
    -0.0025830604519514306,
    0.0012946133243498192,
    -0.0006048223275941489,
    0.00027243411757647975,
    -0.0001265267302709192,
    5.100337955390545e-05,
    -1.262079199503938e-05,
    4.864389730743955e-06,
    -4.589206373019714e-06,
    1.5256570218429972e-06,
)


_ERF_PARTS = (_ERF_OVER_Y[0:8], _ERF_OVER_Y[8:16], _ERF_OVER_Y[16:] + (0.0,))  # 8 powers of u each


@numba.njit(fastmath={"contract"}, inline="always")
def _horner_8(c, u):
    """c[0] + c[1] u + ... + c[7] u^7."""
    p = c[7]
    for j in range(6, -1, -1):
        p = p * u + c[j]
    return p


@numba.njit(fastmath={"contract"}, inline="always")
def _erf_f64(y):
    """erf(y) in float64 to about 4e-13, for y clamped to [-4, 4]: the polynomial in three parts of 8
    powers, P0 + u^8 (P1 + u^8 P2) (a Horner loop over all 23 is not unrolled, and the loop over the values
    then does not vectorise)."""
    y = min(max(y, -4.0), 4.0)
    u = y * y * 0.125 - 1.0
    u8 = ((u * u) * (u * u)) * ((u * u) * (u * u))
    low, mid, high = _ERF_PARTS
    return y * (_horner_8(low, u) + u8 * (_horner_8(mid, u) + u8 * _horner_8(high, u)))


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _gelu_erf_into(x, scale, out):
    """out = (1 + erf(x * scale)) * (0.5 * x) in float32, the reference's operations (x * scale, the
    float32 erf, + 1, times 0.5 * x), erf rounded from ``_erf_f64`` (NaN stays NaN): the reference's bits
    but where SciPy's float32 erf is not the float64 value correctly rounded (tested)."""
    for i in range(x.shape[0]):
        xi = x[i]
        y = xi * scale
        e = np.float32(_erf_f64(np.float64(y)))
        if y != y:
            e = y
        out[i] = (e + np.float32(1.0)) * (np.float32(0.5) * xi)


# The Taylor coefficients of sin(r) = r - r^3/3! + r^5/5! - ... up to r^13: on |r| <= pi/2 the first
# omitted term is below (pi/2)^15 / 15! = 6.7e-10, far under float32's rounding (6e-8).
_SIN_TAYLOR = (1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800)


@numba.njit(fastmath=FASTMATH, inline="always")
def _sin_up_to_sign(z):
    """sin(z) up to its sign (enough for sin^2), in float64 for a float32 z: with k the integer nearest
    z / pi, sin(z) = (-1)^k sin(z - k pi) and |z - k pi| <= pi / 2, where a 7-term polynomial is exact
    to float32 precision."""
    zd = np.float64(z)
    r = zd - np.rint(zd * (1.0 / np.pi)) * np.pi  # (np.rint: the same integers as rounding by hand, faster)
    r2 = r * r
    p = _SIN_TAYLOR[6]
    for j in range(5, -1, -1):
        p = p * r2 + _SIN_TAYLOR[j]
    return np.float32(r * p)


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta``: x + 1 / (beta + 1e-9) * sin(alpha * x)^2.  Float32: a Numba pass over each row
    (``_snake_rows_into``: the sine by range reduction and a polynomial, vectorised), in pieces of about
    ``ELEMENTWISE_PIECE`` samples side by side (``run_pieces``); float64 (explicit backend): the reference."""
    if x_bct.dtype != np.float32:
        return nn.snake_beta.reference(x_bct, log_alpha_c, log_beta_c)
    x_bct = np.ascontiguousarray(x_bct)
    B, C, T = x_bct.shape
    alpha_c, inv_beta_c = _snake_params(log_alpha_c, log_beta_c)
    no_bias = np.zeros(C, np.float32)
    out_bct = new_output(x_bct.shape)
    rows = max(1, ELEMENTWISE_PIECE // max(T, 1))  # channels per piece

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        _snake_rows_into(x_bct[b, c0:c1], no_bias[c0:c1], alpha_c[c0:c1], inv_beta_c[c0:c1], out_bct[b, c0:c1])

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return out_bct


def _snake_params(log_alpha_c, log_beta_c):
    """(alpha, 1 / (beta + 1e-9)) in float32, as ``snake_beta`` computes them."""
    alpha_c = np.exp(log_alpha_c).astype(np.float32)
    return alpha_c, (1.0 / (np.exp(log_beta_c) + np.float32(1e-9))).astype(np.float32)


@numba.njit(fastmath=FASTMATH, inline="always")
def _snake_row_into(x_t, T, start, bias, alpha, inv_beta, out_n):
    """out[j] = SnakeBeta(x[start + j] + bias) where 0 <= start + j < T, else 0 (the causal conv's zero
    padding, which the reference applies to SnakeBeta's output).  The loop runs over two 1-D views from
    index 0: written with an offset (``x[start + j]``), LLVM's run-time test that the rows do not overlap
    failed where the output began within a row after the input's end (h and SnakeBeta(h), allocated one
    after the other, in the residual unit), and the scalar loop ran."""
    N = out_n.shape[0]
    j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)  # x exists for j0 <= j < j1
    out_n[:j0] = 0.0
    if j1 > j0:
        x_m, out_m = x_t[start + j0 : start + j1], out_n[j0:j1]
        for j in range(x_m.shape[0]):  # (no branch inside: the loop vectorises)
            y = x_m[j] + bias
            s = _sin_up_to_sign(alpha * y)
            out_m[j] = y + inv_beta * (s * s)
    out_n[max(j1, j0) :] = 0.0


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_rows_into(x_ct, bias_c, alpha_c, inv_beta_c, out_ct):
    """out[c] = SnakeBeta(x[c] + bias[c]) (``_snake_row_into`` of every row)."""
    for c in range(x_ct.shape[0]):
        _snake_row_into(x_ct[c], x_ct.shape[1], 0, bias_c[c], alpha_c[c], inv_beta_c[c], out_ct[c])


# The pass that ends the codecs' fused steps: bias, then residual.


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_residual(h_cn, bias_c, x_ct, start, out_ct):
    """out[c, start + j] = (h[c, j] + bias[c]) + x[c, start + j] (the reference's order: bias, then residual):
    ``_add_bias_and_residual_rows`` over all of h's columns."""
    _add_bias_and_residual_rows(h_cn, h_cn.shape[1], bias_c, x_ct, start, out_ct)


@numba.njit(inline="always")
def _add_bias_and_residual_rows(sums_cw, n, bias_c, x_ct, t0, out_ct):
    """out[c, t0 + j] = (sums[c, j] + bias[c]) + x[c, t0 + j] for j < n (sums may be wider: the tiles' sums),
    row by row over 1-D views from index 0 (written x[c, t0 + j], the loop ran scalar: see
    ``_snake_row_into``)."""
    for c in range(sums_cw.shape[0]):
        bias, sums_n, x_n, out_n = bias_c[c], sums_cw[c, :n], x_ct[c, t0 : t0 + n], out_ct[c, t0 : t0 + n]
        for j in range(n):
            out_n[j] = (sums_n[j] + bias) + x_n[j]
