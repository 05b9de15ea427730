"""Colour maps and PNG files: the palettes of the spectrograms and an indexed-colour PNG writer
(zlib + struct), embedded as ``data:`` URIs."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np

# colours of a colour map (its PNG palette holds one more, grey, for a missing value): odd, so that 0 dB of the
# difference is the white in the middle; 1.25 dB a step over the 80 dB of the reference
LEVELS = 65


def _ramp(anchors: list, n: int = LEVELS) -> np.ndarray:
    """n colours interpolated linearly through evenly spaced anchor colours ("#rrggbb"), plus the colour of
    a missing value (grey) at index n: a [n + 1, 3] uint8 palette."""
    rgb = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in anchors], dtype=np.float64)
    at = np.linspace(0, len(anchors) - 1, n)
    colours = np.stack([np.interp(at, np.arange(len(anchors)), rgb[:, k]) for k in range(3)], axis=1)
    return np.vstack([np.rint(colours), [[150, 150, 150]]]).astype(np.uint8)


# a magma-like sequential map for levels, a red-blue diverging one (white at 0) for differences
MAGMA = _ramp(["#000004", "#2c115f", "#721f81", "#b73779", "#f1605d", "#feb078", "#fcfdbf"])
DIVERGING = _ramp(["#053061", "#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b", "#67001f"])


def _png_uri(index_hw: np.ndarray, palette: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_indexed(index_hw, palette)).decode("ascii")


def png_indexed(index_hw: np.ndarray, palette: np.ndarray) -> bytes:
    """A PNG file of 8-bit palette indices [H, W] and their [N <= 256, 3] colours (no filtering)."""
    h, w = index_hw.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = np.hstack([np.zeros((h, 1), np.uint8), index_hw.astype(np.uint8)])  # filter byte 0 on each row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
        + chunk(b"PLTE", palette.astype(np.uint8).tobytes())
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + chunk(b"IEND", b"")
    )
