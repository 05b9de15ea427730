"""bfloat16 as the released checkpoints store it, and the one upload of a model's weights to a device.

A bfloat16 number is the upper 16 bits of a float32, so widening is a shift (``float32_bits = bf16_bits
<< 16``) and exact; rounding float32 to bfloat16 is round-to-nearest-even on the dropped half.  The
kernels of this package read ``BF16Matrix`` words directly; the checkpoint reader (``refimpl/io``)
makes them.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def bf16_bits_to_float32(bits_u16: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bit patterns (uint16) to float32, exactly."""
    wide = bits_u16.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even, like torch) and return the uint16 bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding_bias = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = np.where(np.isnan(x), bits | np.uint32(0x00400000), bits + rounding_bias)
    return (rounded >> 16).astype(np.uint16)


class BF16Matrix:
    """A bfloat16 matrix kept as it is stored: its 16-bit words [O, I] (a read-only view of the memory
    map, nothing copied; on a device backend, the words uploaded once), widened to float32 only where it
    is used.

    Widening is exact (a bfloat16 is the upper half of a float32), so every use computes the official
    float32 math from half the bytes.  The fast backend's ``linear`` reads the words directly
    (``refimpl/backends/numba_cpu.py``, ``refimpl/backends/cupy_cuda.py``); everything else sees float32:
    ``np.asarray(m)`` widens the whole matrix (host words), ``m[ids]`` only the rows asked for (an embedding
    lookup), ``m.T`` the transpose (host or device words)."""

    __slots__ = ("bits",)
    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, bits_oi):  # numpy.ndarray on the host, a device array after upload_weights
        if bits_oi.dtype != np.uint16 or bits_oi.ndim != 2 or not bits_oi.flags.c_contiguous:
            raise ValueError(f"BF16Matrix holds C-contiguous uint16 words [O, I], got {bits_oi.dtype} {bits_oi.shape}")
        self.bits = bits_oi

    @property
    def shape(self) -> tuple:
        return self.bits.shape

    @property
    def size(self) -> int:
        return self.bits.size

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def __array__(self, dtype=None, copy=None):
        wide = bf16_bits_to_float32(self.bits)
        return wide if dtype is None else wide.astype(dtype, copy=False)

    def __getitem__(self, index):
        return bf16_bits_to_float32(self.bits[index])

    def widened(self):
        """The whole matrix in float32, where its words are (host or device)."""
        return bf16_bits_to_float32(self.bits)

    @property
    def T(self):
        return self.widened().T

    def astype(self, dtype, copy: bool = True):
        if np.dtype(dtype) == self.dtype and not copy:
            return self
        return self.widened().astype(dtype)

    def __repr__(self) -> str:
        return f"BF16Matrix(shape={self.shape})"


def upload_weights(weights: Mapping[str, np.ndarray]) -> dict:
    """The weights of a model on the active backend, moved once at load: on a device backend every
    tensor is uploaded, a ``BF16Matrix`` as its 16-bit words (half the bytes; the device's ``linear``
    reads them, every other use widens what it takes, exactly); on the host backends the dict is returned
    as it is."""
    from ..backends import device_backend, to_device

    if device_backend() is None:
        return weights
    return {
        name: BF16Matrix(to_device(arr.bits))
        if isinstance(arr, BF16Matrix)
        else to_device(arr)
        if isinstance(arr, np.ndarray)
        else arr
        for name, arr in weights.items()
    }
