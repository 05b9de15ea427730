"""bfloat16 as the released checkpoints store it, and the one upload of a model's weights to a device.

A bfloat16 number is the upper 16 bits of a float32, so widening is a shift (``float32_bits = bf16_bits
<< 16``) and exact; rounding float32 to bfloat16 is round-to-nearest-even on the dropped half.  The
kernels of this package read ``BF16Matrix`` words directly; the checkpoint reader (``refimpl/io``)
makes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

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
    (``refimpl/backends/numba_cpu/``, ``refimpl/backends/cupy_cuda/linear.py``); everything else sees float32:
    ``np.asarray(m)`` widens the whole matrix (host words), ``m[ids]`` only the rows asked for (an embedding
    lookup), ``m.T`` the transpose (host or device words).  ``read_packed``: read whole at every generation
    step and by no prompt (the code predictor's layers and heads), so that the numba backend may read it
    from a packed copy of its words (``PackedWords``: the same numbers from three quarters of the bytes)."""

    __slots__ = ("bits", "read_packed", "__weakref__")  # (weakly held by the copy into huge pages in waiting)
    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, bits_oi, read_packed: bool = False):  # bits: host words, or a device array (upload_weights)
        if bits_oi.dtype != np.uint16 or bits_oi.ndim != 2 or not bits_oi.flags.c_contiguous:
            raise ValueError(f"BF16Matrix holds C-contiguous uint16 words [O, I], got {bits_oi.dtype} {bits_oi.shape}")
        self.bits = bits_oi
        self.read_packed = read_packed

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


def mark_read_packed(weights: dict, names) -> dict:
    """``weights`` with the ``BF16Matrix`` of each of ``names`` marked ``read_packed`` (a new matrix over the
    same words): the matrices a model reads whole at every generation step and in no prompt."""
    out = dict(weights)
    for name in names:
        if isinstance(out.get(name), BF16Matrix):
            out[name] = BF16Matrix(out[name].bits, read_packed=True)
    return out


# ----------------------------------------------------------------------------- packed words
#
# A generation step reads every weight of the code predictor from memory, 15 times a frame, and does
# little arithmetic with each: its time is the bytes read.  Most of a bf16 word's high byte (the sign and
# the exponent's upper 7 bits) takes few values in a matrix: in a window of 8 consecutive values of those
# exponent bits lie all but about 4e-5 of the weights of the released sizes' random (normal) matrices.
# So a packed matrix keeps each word's low byte (the exponent's last bit and the 7 mantissa bits) as it
# is and its high byte as a 4-bit code: 12 bits a word, lossless, with the few words the codes cannot hold
# listed apart, row by row, as their float32 values.

PACK_WINDOW = 8  # values of the exponent's upper bits the codes hold (with the sign: 16 codes)


class PackedWords(NamedTuple):
    """The words of a bf16 matrix [O, I] (I a multiple of 64) in 12 bits each, lossless (``unpack_words``).

    low_oi    uint8 [O, I]      each word's low byte (0 for a listed word)
    codes_oh  uint8 [O, I / 2]  each word's 4-bit code, two a byte: in each block of 64 words, byte j holds
                                the code of the word stored at place j (low nibble) and at 32 + j (high)
                                Both hold a block's words in ``stored_order``: the order in which 512-bit
                                unpacks (bytes to words to float32, within 128-bit lanes) give them back.
    high_64   uint8 [64]        the high byte of each code (16 entries, repeated 4 times: one per 128-bit
                                lane of a 512-bit vector): code c is sign c // 8 and the exponent's upper
                                bits base + c % 8
    rows_e    int32 [E]         the words the codes cannot hold (any other high byte: +-0, subnormals,
    cols_e    int32 [E]         infinities, NaN and what lies outside the window), row by row in column
    values_e  float32 [E]       order: their row, column and value.  Their place in the dense part holds
                                code 0 and low byte 0, the word ``high_64[0] << 8``, which the products
                                take back out."""

    low_oi: np.ndarray
    codes_oh: np.ndarray
    high_64: np.ndarray
    rows_e: np.ndarray
    cols_e: np.ndarray
    values_e: np.ndarray


def stored_order() -> np.ndarray:
    """order[p] = the word of a block of 64 stored at place p: place 16 j + 4 k + t holds word 16 k + 4 j + t
    (j, k, t < 4).  Unpacking 64 bytes into words within each 128-bit lane (low bytes 0..7, then 8..15, of
    lane j) and the words into float32 (words 0..3, then 4..7) gives floats of places 16 j + 4 k + t for
    k = 0, 1, 2, 3 in four vectors, lane 4 j + t of vector k: in this order they are words 16 k + 4 j + t,
    the natural order of the four vectors.  (Its own inverse.)"""
    p = np.arange(64)
    return 16 * ((p // 4) % 4) + 4 * (p // 16) + p % 4


def unpack_words(packed: PackedWords) -> np.ndarray:
    """The bf16 words [O, I] (uint16) of a ``PackedWords``: the high byte of each code above the low byte,
    each block back in the natural order, then the listed words put back."""
    O, I = packed.low_oi.shape
    blocks = packed.codes_oh.reshape(O, I // 64, 32)
    codes = np.stack([blocks & 15, blocks >> 4], axis=2).reshape(O, I)  # places j, then 32 + j, of each block
    stored = (packed.high_64[codes].astype(np.uint16) << 8) | packed.low_oi
    words = np.empty_like(stored).reshape(O, I // 64, 64)
    words[:, :, stored_order()] = stored.reshape(O, I // 64, 64)
    words = words.reshape(O, I)
    words[packed.rows_e, packed.cols_e] = (packed.values_e.view(np.uint32) >> 16).astype(np.uint16)
    return words


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
