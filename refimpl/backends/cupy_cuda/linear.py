"""The matrix product of ``refimpl/nn.py`` on the GPU: float weights are the reference's formula (one cuBLAS
product); a ``BF16Matrix`` whose 16-bit words are on the device is read as it is by the kernel of
``kernels/bf16_rows_times.cu`` for the few rows of a generation step (half the bytes of float32 weights),
else widened and multiplied by cuBLAS."""

from __future__ import annotations

import numpy as np

from ... import nn
from ..bf16 import BF16Matrix
from . import device

CU_FILE = "bf16_rows_times.cu"
BF16_WARPS = 8  # output channels per block of 256 threads
MATVEC_MAX_ROWS = 16  # up to this many rows of x: the bf16 kernel; more: widen, then cuBLAS


def _is_host(array) -> bool:
    """True for a NumPy array (host memory)."""
    return isinstance(array, np.ndarray)


def linear(x, w_oi, b_o=None):
    """``nn.linear``: y = x @ W^T + b over the last axis.  W on the device in the compute dtype: one cuBLAS
    product.  A ``BF16Matrix`` whose words are on the device (uint16 [O, I]): for up to MATVEC_MAX_ROWS rows
    of float32 x (a generation step) the kernel ``bf16_rows_times`` reads the words as they are (half the
    bytes); otherwise the words are widened (exactly: a bfloat16 is the upper half of a float32) and cuBLAS
    runs."""
    if isinstance(w_oi, BF16Matrix):
        if _is_host(w_oi.bits):
            raise TypeError(
                "cupy backend: linear got a bfloat16 matrix still on the host; its words go to the "
                "device once, when the model is loaded (BF16Matrix(to_device(bits)))"
            )
        x, b_o = device.on_device(x, b_o)
        O, I = w_oi.shape
        x_ni = x.reshape(-1, I)
        if x.dtype == np.float32 and x_ni.shape[0] <= MATVEC_MAX_ROWS:
            y = bf16_rows_times(x_ni, w_oi.bits).reshape(x.shape[:-1] + (O,))
        else:
            y = x @ widen_bf16(w_oi.bits).astype(x.dtype, copy=False).T
    elif not hasattr(w_oi, "ndim"):
        raise TypeError(f"cupy backend: linear needs the weight as an array on the device, got {type(w_oi).__name__}")
    else:
        return nn.linear.reference(*device.on_device(x, w_oi, b_o))  # float32 or float64 weights: the formula
    if b_o is not None:
        y = y + b_o
    return y


def widen_bf16(bits):
    """The float32 values of bfloat16 words (uint16, any shape): each word shifted into the upper half (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_rows_times(x_ni, bits_oi):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) for float32 x [N, I] and device words [O, I] (the kernel
    of kernels/bf16_rows_times.cu: the weights are read once per row of x, as 16-bit words)."""
    xp = device.array_module()
    x_ni = device.contiguous(x_ni)
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    out_no = xp.empty((N, O), dtype=np.float32)
    if out_no.size == 0:
        return out_no
    if I == 0:
        out_no[...] = 0
        return out_no
    kernel = device.kernel(CU_FILE, "bf16_rows_times")
    kernel(
        ((O + BF16_WARPS - 1) // BF16_WARPS,),
        (32 * BF16_WARPS,),
        (x_ni, device.contiguous(bits_oi), out_no, np.int32(N), np.int32(O), np.int32(I)),
    )
    return out_no
