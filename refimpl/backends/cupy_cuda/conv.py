"""The convolution of ``refimpl/nn.py`` on the GPU: the depthwise case as a multiply-add per tap; every other
convolution is the reference's formula, run by CuPy."""

from __future__ import annotations

from ... import nn
from . import device


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d``: out[b, o, t] = b[o] + sum_{i,k} W[o, i, k] x[b, g(o) I + i, stride t + dilation k].
    A depthwise conv (groups = channels, one input channel each) is a multiply-add per tap k (the reference
    would run a batch of 1 x 1 matrix products per tap); every other conv is the reference's formula, one
    batched cuBLAS product per tap."""
    xp = device.array_module()
    x_bct, w_oik, b_o = device.on_device(x_bct, w_oik, b_o)
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    if not (groups == C and I == 1 and O == C):
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    last = stride * (T_out - 1) + 1  # tap k reads x[..., k * dilation : k * dilation + last : stride]
    out = xp.zeros((B, O, T_out), dtype=x_bct.dtype)
    for k in range(K):
        out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation : k * dilation + last : stride]
    return out + b_o[None, :, None] if b_o is not None else out
