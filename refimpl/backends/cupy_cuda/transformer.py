"""The norm and the rotation of a transformer layer on the GPU, one launch each (the kernels of
``kernels/rms_norm_and_rope.cu``) where the reference's formulas are several CuPy operations: a generation
step on the device is mostly launches, four norms and two rotations in each layer."""

from __future__ import annotations

import numpy as np

from ... import nn
from . import device

CU_FILE = "rms_norm_and_rope.cu"
ROWS_KERNELS = {
    np.dtype(np.float32): ("rms_norm_rows<float>", "rope_rows<float>"),
    np.dtype(np.float64): ("rms_norm_rows<double>", "rope_rows<double>"),
}
INSTANCES = tuple(name for pair in ROWS_KERNELS.values() for name in pair)
ROPE_THREADS, ROPE_MAX_BLOCKS = 256, 4096  # a grid-stride loop over the values


def _kernel(name: str):
    """The compiled kernel ``name`` of kernels/rms_norm_and_rope.cu (the file compiled once, on first use)."""
    return device.kernel(CU_FILE, name, INSTANCES)


def rms_norm_threads(C: int) -> int:
    """Threads of a row's block: a whole number of warps, one value each up to 256 of them."""
    return min(256, -(-C // 32) * 32)


def rms_norm(x, w, eps: float):
    """``nn.rms_norm``: w * x / sqrt(mean(x^2) + eps) over the last axis, one block of ``rms_norm_rows`` per
    row (the reference's six CuPy operations in one launch); a weight of another dtype or shape runs the
    reference."""
    x, w = device.on_device(x, w)
    dtype, C = x.dtype, x.shape[-1]
    if dtype not in ROWS_KERNELS or w.dtype != dtype or w.shape != (C,) or x.size == 0:
        return nn.rms_norm.reference(x, w, eps)
    x_rc = device.contiguous(x).reshape(-1, C)
    out_rc = device.array_module().empty_like(x_rc)
    kernel = _kernel(ROWS_KERNELS[dtype][0])
    kernel((x_rc.shape[0],), (rms_norm_threads(C),), (x_rc, device.contiguous(w), out_rc, np.int32(C), dtype.type(eps)))
    return out_rc.reshape(x.shape)


def apply_rope(x_bhtd, cos_td, sin_td):
    """``nn.apply_rope``: x * cos + rotate_half(x) * sin, for x [B, H, T, D] and cos, sin [T, D] or [B or 1, 1,
    T, D] (a layer's q and k): ``rope_rows`` in one launch; other shapes run the reference."""
    x_bhtd, cos_td, sin_td = device.on_device(x_bhtd, cos_td, sin_td)
    dtype = x_bhtd.dtype
    if dtype not in ROWS_KERNELS or x_bhtd.ndim != 4 or x_bhtd.size == 0 or x_bhtd.shape[-1] % 2:
        return nn.apply_rope.reference(x_bhtd, cos_td, sin_td)
    B, H, T, D = x_bhtd.shape
    cos_batches = _rope_batches(cos_td, B, T, D)
    if cos_batches is None or sin_td.shape != cos_td.shape or cos_td.dtype != dtype or sin_td.dtype != dtype:
        return nn.apply_rope.reference(x_bhtd, cos_td, sin_td)
    x_bhtd = device.contiguous(x_bhtd)
    out_bhtd = device.array_module().empty_like(x_bhtd)
    n = x_bhtd.size
    blocks = min(ROPE_MAX_BLOCKS, -(-n // ROPE_THREADS))
    sizes = (np.int64(n), np.int32(H), np.int32(T), np.int32(D), np.int32(cos_batches))
    kernel = _kernel(ROWS_KERNELS[dtype][1])
    kernel((blocks,), (ROPE_THREADS,), (x_bhtd, device.contiguous(cos_td), device.contiguous(sin_td), out_bhtd, *sizes))
    return out_bhtd


def _rope_batches(cos, B: int, T: int, D: int):
    """How many batches of angles ``rope_rows`` reads for x [B, H, T, D] (1 or B), or None where cos does not
    broadcast against x as [T, D] or [B or 1, 1, T, D]."""
    if cos.shape == (T, D):
        return 1
    if cos.ndim == 4 and cos.shape[1:] == (1, T, D) and cos.shape[0] in (1, B):
        return cos.shape[0]
    return None
