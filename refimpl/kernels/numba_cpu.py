"""The CPU twins of the primitives of ``refimpl/nn.py``: same names, same signatures, faster.

Every twin computes what its reference computes (the same formula); only the order of a few float
sums may differ, and ``tests/test_kernels.py`` bounds that difference from the reduction length.

For now the twins here are NumPy rearrangements that avoid allocations and small matrix products;
jitted kernels take their places where they measurably beat them (see docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from .. import nn

IM2COL_MAX_ROWS = 64  # conv1d stacks its taps when in_channels * kernel_size is at most this


def elu(x, alpha: float = 1.0):
    """``nn.elu`` with one temporary: max(x, 0) + alpha * expm1(min(x, 0)) (one term is always 0)."""
    negative = np.minimum(x, 0)
    np.expm1(negative, out=negative)
    if alpha != 1.0:
        negative *= x.dtype.type(alpha)
    positive = np.maximum(x, 0)
    positive += negative
    return positive


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta`` computed in place in one temporary: the same operations in the same order as
    x + inv_beta * sin(alpha * x)^2 (bit-identical), without the four full-size temporaries (these
    arrays reach 96 x 1920T samples in the codec decoder)."""
    alpha = np.exp(log_alpha_c)[None, :, None]
    inv_beta = 1.0 / (np.exp(log_beta_c)[None, :, None] + x_bct.dtype.type(1e-9))
    s = x_bct * alpha
    np.sin(s, out=s)
    np.square(s, out=s)
    s *= inv_beta
    s += x_bct
    return s


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d`` by one of three arrangements chosen by shape:

    - in_channels x k small (the codec encoder's first convs, at the audio rate): the taps are stacked
      ("im2col", [I * K, T_out]) and multiplied at once, since a product with an inner dimension of a few
      channels is mostly memory traffic;
    - dense: one matrix product per tap, accumulated through one reused buffer;
    - depthwise (groups = channels): a multiply-add per tap, no matrix product at all.
    Other group counts go to the reference."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    end = lambda k: k * dilation + stride * (T_out - 1) + 1  # noqa: E731 - last input index used by tap k, +1
    if groups == 1 and I * K <= IM2COL_MAX_ROWS:
        taps_bikt = np.stack([x_bct[:, :, k * dilation:end(k):stride] for k in range(K)], axis=2)
        out = np.matmul(w_oik.reshape(O, I * K), taps_bikt.reshape(B, I * K, T_out))
    elif groups == 1:
        out = np.matmul(w_oik[:, :, 0], x_bct[:, :, 0:end(0):stride])
        product = np.empty_like(out)  # reused for every further tap
        for k in range(1, K):
            out += np.matmul(w_oik[:, :, k], x_bct[:, :, k * dilation:end(k):stride], out=product)
    elif groups == C and I == 1 and O == C:
        out = np.zeros((B, O, T_out), dtype=x_bct.dtype)
        for k in range(K):
            out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation:end(k):stride]
    else:
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    if b_o is not None:
        out += b_o[None, :, None]
    return out


TWINS = {"elu": elu, "snake_beta": snake_beta, "conv1d": conv1d}
