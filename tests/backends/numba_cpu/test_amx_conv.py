"""Convolutions on the AMX tiles: the pair split, the conv kernel's bound, and which weights' tiles are made
and kept."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import float32_to_bf16_bits

from .cases import bf16_values, needs_tiles


@numba.njit(fastmath=numba_cpu.intrinsics.FASTMATH)
def _split_pairs_as_the_unit_does(a_t, b_t, parts_pqt):
    """``_split_pair_into`` inlined into a function of the residual unit's fastmath flags (as
    ``_unit_piece_on_tiles`` has it), for one pair of rows."""
    numba_cpu.amx_conv._split_pair_into(a_t, b_t, 0, parts_pqt)


def test_pair_split_is_exact():
    """Two channels' rows split into the B tiles' pairs (part p of a[t] in the low half of parts[p, 0, t], of
    b[t] in the high half): hi + mid + lo = x exactly, each part a bf16 word, for values of every size,
    signed zeros, the smallest normal and huge values; an infinity keeps its sign and a NaN stays a NaN
    (in the hi part), the mid and lo parts of both 0."""
    rng = np.random.default_rng(1)
    special = [0.0, -0.0, 1.0, -3.14159, 1e-30, 1.17549435e-38, 3.4e38, -2.5e-12, 65504.123, np.inf, -np.inf, np.nan]
    a = np.concatenate([rng.standard_normal(52) * np.exp(rng.uniform(-40, 40, 52)), special]).astype(np.float32)
    b = -a[::-1].copy()
    parts = np.zeros((3, 1, 64), np.uint32)
    _split_pairs_as_the_unit_does(a, b, parts)
    for half, x in ((0, a), (16, b)):
        words = (parts[:, 0, :] >> np.uint32(half)) & np.uint32(0xFFFF)  # [p, t]
        values = (words << np.uint32(16)).view(np.float32).astype(np.float64)
        finite = np.isfinite(x)
        np.testing.assert_array_equal(values.sum(axis=0)[finite], x[finite].astype(np.float64))
        np.testing.assert_array_equal(values[0][np.isinf(x)], x[np.isinf(x)])
        assert np.isnan(values[0][np.isnan(x)]).all()
        assert not values[1:, ~finite].any()


def _tile_conv(w_oik, z_ct, dilation, steps):
    """``_tile_conv_into`` of a float32 weight and signal (split here as the residual unit splits them)."""
    O, C, K = w_oik.shape
    z_pqt = np.zeros((3, C // 2, numba_cpu.amx_conv._pair_row_length(z_ct.shape[1])), np.uint32)
    for c in range(0, C, 2):
        numba_cpu.amx_conv._split_pair_into(z_ct[c], z_ct[c + 1], c // 2, z_pqt)
    out = np.full((O, numba_cpu.amx_conv._pair_row_length(steps)), np.nan, np.float32)
    numba_cpu.amx_conv._tile_conv_into(numba_cpu.amx_conv._weight_tiles(w_oik), z_pqt, K, dilation, 1, steps, out)
    return out[:, :steps]


@needs_tiles
@pytest.mark.parametrize(
    "O, C, K, dilation, steps", [(32, 32, 7, 1, 32), (64, 64, 7, 9, 96), (32, 256, 7, 3, 64), (96, 96, 1, 0, 64)]
)
def test_tile_conv_within_the_bound(O, C, K, dilation, steps):
    """The residual unit's conv on the tiles (weight and signal in three exact bf16 parts, six products of
    parts summed in float32 tiles): within the reduction-length bound of the float64 conv, for one block of
    channels, several, more than ``TILE_CONV_STEPS`` steps (256 channels x 7 taps: the sums stored and
    taken up again) and a 1x1 conv."""
    rng = np.random.default_rng(O + C + K + steps)
    w = (rng.standard_normal((O, C, K)) / np.sqrt(C * K)).astype(np.float32)
    z = rng.standard_normal((C, steps + (K - 1) * dilation)).astype(np.float32)
    got = _tile_conv(w, z, dilation, steps)
    taps = np.stack([z[:, k * dilation : k * dilation + steps] for k in range(K)], axis=1)  # [C, K, steps]
    w64, taps64 = w.astype(np.float64).reshape(O, C * K), taps.astype(np.float64).reshape(C * K, steps)
    exact = w64 @ taps64
    bound = 2 * (C * K + 1) * np.finfo(np.float32).eps * (np.abs(w64) @ np.abs(taps64))
    assert np.all(np.abs(got - exact) <= bound)
    assert np.max(np.abs(got - exact) / (np.abs(w64) @ np.abs(taps64))) < 1e-6  # (a lost part: ~4e-3)


def test_conv_weight_tiles_kept_while_read_only():
    """A conv weight's tiles (``_weight_tiles``): split again for each call where the weight is writable or a
    read-only view of a writable array (it may change), made once and kept for a read-only one (a model's
    weights) and dropped when it dies; the kept tiles are the split of a fresh call, to the bit."""
    import gc

    w = np.random.default_rng(11).standard_normal((64, 32, 7)).astype(np.float32)
    fresh = numba_cpu.amx_conv._weight_tiles(w)
    assert id(w) not in numba_cpu.amx_conv._WEIGHT_TILES and numba_cpu.amx_conv._weight_tiles(w) is not fresh
    view = w[:]
    view.flags.writeable = False  # read-only, but w can still change it
    assert numba_cpu.amx_conv._weight_tiles(view) is not numba_cpu.amx_conv._weight_tiles(view)
    assert id(view) not in numba_cpu.amx_conv._WEIGHT_TILES
    del view
    w.flags.writeable = False
    kept = numba_cpu.amx_conv._weight_tiles(w)
    assert numba_cpu.amx_conv._weight_tiles(w) is kept and id(w) in numba_cpu.amx_conv._WEIGHT_TILES
    np.testing.assert_array_equal(kept, fresh)
    key = id(w)
    del w
    gc.collect()
    assert key not in numba_cpu.amx_conv._WEIGHT_TILES


@pytest.mark.parametrize("T", [255, 256, 1023, 1024])
def test_short_signals_take_the_tiles_only_with_kept_weight_tiles(T):
    """From ``KEPT_TILES_MIN_STEPS`` steps the convs take the tiles where every weight is read-only (their
    tiles kept), from ``UNIT_TILES_MIN_STEPS`` where one is writable or a view of a writable array (split
    for the call); never for channels that are not whole tiles, nor where the tiles are not granted."""
    writable, read_only = np.zeros((32, 32, 7), np.float32), np.zeros((32, 32, 1), np.float32)
    read_only.flags.writeable = False
    frozen = read_only[:, :, :].reshape(32, 32, 1)
    tiles, kept_from, split_from = (
        numba_cpu.amx.USE_TILES,
        numba_cpu.amx_conv.KEPT_TILES_MIN_STEPS,
        numba_cpu.amx_conv.UNIT_TILES_MIN_STEPS,
    )
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, read_only, frozen) == (tiles and kept_from <= T)
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, writable, read_only) == (tiles and split_from <= T)
    view_of_writable = writable[:]
    view_of_writable.flags.writeable = False  # writable through its base
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, view_of_writable) == (tiles and split_from <= T)
    assert not numba_cpu.amx_conv._convs_take_tiles(48, 32, T, read_only)


def test_tdnn_tiles_only_for_bf16_weights_of_whole_tiles_and_kept_while_read_only():
    """The A tiles of a TDNN's weight: none where a weight is not a bf16 value or O or I K is no multiple of 32
    (the BLAS path then); kept for a read-only weight (the same array on the next call) and dropped when it
    dies; made again for a writable one (it may change between calls)."""
    import gc

    rng = np.random.default_rng(7)
    assert numba_cpu.amx_conv._tdnn_weight_tiles(rng.standard_normal((256, 64, 1)).astype(np.float32)) is None
    assert numba_cpu.amx_conv._tdnn_weight_tiles(bf16_values(rng, (272, 64, 1))) is None  # 272 = 17 x 16
    assert numba_cpu.amx_conv._tdnn_weight_tiles(bf16_values(rng, (256, 20, 1))) is None
    w = bf16_values(rng, (256, 64, 3)).copy()  # (its own memory: a view of a writable array is never kept)
    w[5, 7, 2] = np.float32(1.0 + 2.0**-20)  # one weight that is no bf16 value
    assert numba_cpu.amx_conv._tdnn_weight_tiles(w) is None
    w[5, 7, 2] = 1.0
    tiles = numba_cpu.amx_conv._tdnn_weight_tiles(w)
    words = float32_to_bf16_bits(w.reshape(256, 192))
    np.testing.assert_array_equal(tiles.transpose(0, 2, 1, 3).reshape(256, 192), words)
    assert id(w) not in numba_cpu.amx_conv._TDNN_TILES and numba_cpu.amx_conv._tdnn_weight_tiles(w) is not tiles
    w.flags.writeable = False
    kept = numba_cpu.amx_conv._tdnn_weight_tiles(w)
    assert numba_cpu.amx_conv._tdnn_weight_tiles(w) is kept and id(w) in numba_cpu.amx_conv._TDNN_TILES
    key = id(w)
    del w
    gc.collect()
    assert key not in numba_cpu.amx_conv._TDNN_TILES
