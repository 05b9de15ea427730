"""The codec decoder's fused twins (the residual unit, SnakeBeta into a causal conv) against their references,
in pieces and on the AMX tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.codec import decoder as codec_decoder
from refimpl.io.checkpoint import WeightView

from .cases import needs_tiles, within_float32_noise


def unit_reference(x, a1, b1, w1, c1, a2, b2, w2, c2, dilation, context):
    """``codec_decoder.residual_unit``'s reference on plain arrays, streaming from ``context``: (y, the next
    context), as ``numba_cpu.codec_decoder.residual_unit_push`` returns them."""
    names = ("act1.alpha", "act1.beta", "conv1.conv.weight", "conv1.conv.bias")
    names += ("act2.alpha", "act2.beta", "conv2.conv.weight", "conv2.conv.bias")
    u = WeightView(dict(zip(names, (a1, b1, w1, c1, a2, b2, w2, c2), strict=True)))
    convs = {"conv1": nn.CausalConvState(context), "conv2": nn.CausalConvState()}
    y = codec_decoder.residual_unit.reference(u, dilation, x, codec_decoder.ConvStates(convs))
    return y, convs["conv1"].context_bct


def snake_conv_reference(x, alpha, beta, w, b, context):
    """``codec_decoder.snake_causal_conv``'s reference on plain arrays, streaming from ``context``: (y, the
    next context), as ``numba_cpu.codec_decoder.snake_causal_conv_push`` returns them."""
    weights = WeightView({"act.alpha": alpha, "act.beta": beta, "conv.conv.weight": w, "conv.conv.bias": b})
    convs = {"conv": nn.CausalConvState(context)}
    y = codec_decoder.snake_causal_conv.reference(weights, "act", "conv.", x, codec_decoder.ConvStates(convs))
    return y, convs["conv"].context_bct


def _residual_unit_case(seed, B, C, T, dilation, with_context):
    """A random residual unit's input, arguments (float64 and float32), left context (or None; both types),
    and the reference's outputs: float32, float64, and the next context the numba path keeps primitive by
    primitive."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    args = (
        *(rng.standard_normal(C) * 0.5, rng.standard_normal(C) * 0.5, rng.standard_normal((C, C, 7)) / np.sqrt(7 * C)),
        *(rng.standard_normal(C) * 0.1, rng.standard_normal(C) * 0.5, rng.standard_normal(C) * 0.5),
        *(rng.standard_normal((C, C, 1)) / np.sqrt(C), rng.standard_normal(C) * 0.1),
    )
    args32 = [a.astype(np.float32) for a in args]
    context = rng.standard_normal((B, C, 6 * dilation)) if with_context else None
    context32 = None if context is None else context.astype(np.float32)
    with kernels.use_backend("numpy"):
        ref, _ = unit_reference(x, *args32, dilation, context32)
        exact, _ = unit_reference(x.astype(np.float64), *args, dilation, context)
    with kernels.use_backend("numba"):
        _, kept = unit_reference(x, *args32, dilation, context32)
    return x, args, args32, context, context32, ref, exact, kept


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 12),
    st.integers(1, 60),
    st.sampled_from((1, 3, 9)),
    st.integers(1, 25),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_residual_unit_twin_equals_reference(B, C, T, dilation, piece, with_context, seed):
    """The fused unit against its reference (run on the plain formulas), pieces of ``piece`` steps so that
    the left context crosses piece boundaries, at the signal's start or after a push (a context): within the
    float32 reference's own noise (``within_float32_noise``); the next context is what the
    numba path primitive by primitive keeps, to the bit."""
    x, args, args32, context, context32, ref, exact, kept = _residual_unit_case(seed, B, C, T, dilation, with_context)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE", piece)
        got, got_context = numba_cpu.codec_decoder.residual_unit_push(x, *args32, dilation, context32)
        # a trimmed view (as the transposed conv's output is) is read in place: its NaN tail is never read
        trimmed = np.concatenate([x, np.full((B, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(numba_cpu.codec_decoder.residual_unit_push(trimmed, *args32, dilation, context32)[0], got)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert got_context.shape == (B, C, 6 * dilation) and np.array_equal(got_context, kept)
    assert numba_cpu.codec_decoder.residual_unit_push(x.astype(np.float64), *args, dilation, context) is NotImplemented


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 12),  # channels
    st.sampled_from((1, 2, 3, 9)),  # output channels (the decoder's last conv: 1; 9: the stacked taps)
    st.integers(1, 60),
    st.integers(1, 25),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_snake_causal_conv_twin_equals_reference(B, C, O, T, piece, with_bias, with_context, seed):
    """The fused last SnakeBeta + conv against its reference (the plain formulas), pieces of ``piece`` steps
    so that the taps cross piece boundaries, at the signal's start or after a push: within the float32
    reference's own noise (``within_float32_noise``); the next context to the bit."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    args = (
        *(rng.standard_normal(C) * 0.5, rng.standard_normal(C) * 0.5, rng.standard_normal((O, C, 7)) / np.sqrt(7 * C)),
        rng.standard_normal(O) * 0.1 if with_bias else None,
    )
    args32 = [None if a is None else a.astype(np.float32) for a in args]
    context = rng.standard_normal((B, C, 6)) if with_context else None
    context32 = None if context is None else context.astype(np.float32)
    with kernels.use_backend("numpy"):
        ref, _ = snake_conv_reference(x, *args32, context32)
        exact, _ = snake_conv_reference(x.astype(np.float64), *args, context)
    with kernels.use_backend("numba"):
        _, kept = snake_conv_reference(x, *args32, context32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE", piece)
        got, got_context = numba_cpu.codec_decoder.snake_causal_conv_push(x, *args32, context32)
        trimmed = np.concatenate([x, np.full((B, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(numba_cpu.codec_decoder.snake_causal_conv_push(trimmed, *args32, context32)[0], got)
    assert got.shape == ref.shape == (B, O, T) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert got_context.shape == (B, C, 6) and np.array_equal(got_context, kept)
    assert numba_cpu.codec_decoder.snake_causal_conv_push(x.astype(np.float64), *args, context) is NotImplemented


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from((4, 8, 32)),
    st.integers(1, 200),
    st.sampled_from((1, 3, 9)),
    st.sampled_from((64, 100)),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_residual_unit_on_the_direct_kernel_equals_reference(C, T, dilation, piece, with_context, seed):
    """The fused unit on the direct kernel (no tiles; pieces of ``piece`` steps so that the left context
    crosses their boundaries and blocks of 64 are partial) against its reference: within the float32
    reference's own noise; a trimmed view read in place; the next context the reference's, to the bit; the
    1x1 conv by BLAS (``DIRECT_1X1_MAX_IN`` below C) within the same noise; every piece on the direct kernel."""
    x, _, args32, _, context32, ref, exact, kept = _residual_unit_case(seed, 1, C, T, dilation, with_context)
    push, direct_pieces = numba_cpu.codec_decoder.residual_unit_push, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE", piece)
        kernel = numba_cpu.codec_decoder._unit_convs_direct
        mp.setattr(numba_cpu.codec_decoder, "_unit_convs_direct", lambda *a: direct_pieces.append(a[2]) or kernel(*a))
        got, got_context = push(x, *args32, dilation, context32)
        trimmed = np.concatenate([x, np.full((1, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(push(trimmed, *args32, dilation, context32)[0], got)
        mp.setattr(numba_cpu.conv, "DIRECT_1X1_MAX_IN", 0)
        blas_1x1, _ = push(x, *args32, dilation, context32)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact) and within_float32_noise(blas_1x1, ref, exact)
    assert np.array_equal(got_context, kept)
    pieces = numba_cpu.pieces.time_pieces(T, piece, numba_cpu.conv.DIRECT_STEPS)
    assert direct_pieces[: len(pieces)] == [t0 for t0, _ in pieces]


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from((8, 16, 24, 32)),  # channels: whole blocks of DIRECT_OUT for each of 2 threads
    st.integers(1, 200),
    st.sampled_from((1, 3, 9)),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_residual_unit_shared_by_outputs_equals_its_pieces_of_time(C, T, dilation, with_context, seed):
    """A short push's unit with its output channels shared between the threads (``_unit_by_outputs``) against
    the same unit in pieces of time (``_residual_unit_direct``'s pieces): the same bits with the direct 1x1
    conv; within the float32 reference's noise with BLAS's (its products of a share of the rows); the next
    context the reference's, to the bit."""
    x, _, args32, _, context32, ref, exact, kept = _residual_unit_case(seed, 1, C, T, dilation, with_context)
    push, decoder = numba_cpu.codec_decoder.residual_unit_push, numba_cpu.codec_decoder
    got = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        mp.setattr(decoder, "_piece_threads", lambda: 2)
        for shared in (False, True):
            mp.setattr(decoder, "_shares_outputs", lambda *_, shared=shared: shared)
            got[shared] = push(x, *args32, dilation, context32)
        mp.setattr(numba_cpu.conv, "DIRECT_1X1_MAX_IN", 0)
        blas_1x1, _ = push(x, *args32, dilation, context32)
    assert np.array_equal(got[True][0], got[False][0]) and np.array_equal(got[True][1], kept)
    assert within_float32_noise(got[True][0], ref, exact) and within_float32_noise(blas_1x1, ref, exact)


def test_short_pushes_share_the_units_outputs_where_their_time_shares_out_unevenly():
    """The released decoder's units on 2 threads: a streamed chunk of 1 or 2 frames at the first block (32,
    64 steps: one block of 64) and of 1 frame at the second (160 steps: 3 blocks) share the channels; an even
    number of blocks, a long push or channels that do not split into whole blocks share the time."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_decoder, "_piece_threads", lambda: 2)
        shares = numba_cpu.codec_decoder._shares_outputs
        assert shares(1, 768, 32) and shares(1, 768, 64) and shares(1, 384, 160) and shares(1, 384, 320)
        assert not shares(1, 768, 128) and not shares(1, 192, 640) and not shares(1, 96, 1920)
        assert not shares(1, 768, 4000) and not shares(1, 12, 32) and not shares(2, 768, 64)
        mp.setattr(numba_cpu.codec_decoder, "_piece_threads", lambda: 1)
        assert not shares(1, 768, 32)


@needs_tiles
@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from((32, 64)),
    st.integers(1, 200),
    st.sampled_from((1, 3, 9)),
    st.sampled_from((32, 64)),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_residual_unit_on_tiles_equals_reference(C, T, dilation, piece, with_context, seed):
    """The fused unit on the tiles (``_convs_take_tiles`` made to take every length, pieces of ``piece``
    steps so that the left context crosses their boundaries and the last piece is partial) against its
    reference: within the float32 reference's own noise; a trimmed view read in place; the next context
    the reference's, to the bit; and not the bits of the BLAS path (the tiles ran)."""
    x, _, args32, _, context32, ref, exact, kept = _residual_unit_case(seed, 1, C, T, dilation, with_context)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx_conv, "UNIT_TILES_MIN_STEPS", 1)
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE_VALUES", piece * C)
        got, got_context = numba_cpu.codec_decoder.residual_unit_push(x, *args32, dilation, context32)
        trimmed = np.concatenate([x, np.full((1, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(numba_cpu.codec_decoder.residual_unit_push(trimmed, *args32, dilation, context32)[0], got)
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        blas, _ = numba_cpu.codec_decoder.residual_unit_push(x, *args32, dilation, context32)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert np.array_equal(got_context, kept)
    assert T < 4 or not np.array_equal(got, blas)


def _push_pieces(mp, seed, C, T, dilation, kernel):
    """One push of a random unit (2 piece threads) with ``decoder.<kernel>``'s calls recorded: the output
    and the (t0, n) of each call, sorted."""
    x, _, args32, _, context32, _, _, _ = _residual_unit_case(seed, 1, C, T, dilation, True)
    decoder, pieces = numba_cpu.codec_decoder, []
    run = getattr(decoder, kernel)
    mp.setattr(numba_cpu.pieces, "_piece_threads", lambda: 2)
    mp.setattr(decoder, kernel, lambda *a: pieces.append(a[2:4]) or run(*a))
    got, _ = decoder.residual_unit_push(x, *args32, dilation, context32)
    mp.setattr(decoder, kernel, run)
    return got, sorted(pieces)


@needs_tiles
def test_a_short_push_on_the_tiles_shares_its_time_evenly():
    """A streamed chunk's unit on the tiles goes to the threads in even pieces of whole tiles of steps
    (``time_pieces``): one frame at the released decoder's second block (640 steps, at most 512 a piece)
    is two pieces of 320 on two threads, not 512 and 128; the output is that of the uneven split, to the bit."""
    C, T, decoder = 32, 640, numba_cpu.codec_decoder
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx_conv, "UNIT_TILES_MIN_STEPS", 1)
        mp.setattr(decoder, "UNIT_PIECE_VALUES", 512 * C)
        got, even = _push_pieces(mp, 5, C, T, 1, "_unit_piece_on_tiles")
        mp.setattr(decoder, "time_pieces", lambda T, most, step: [(t0, min(most, T - t0)) for t0 in range(0, T, most)])
        uneven, cut = _push_pieces(mp, 5, C, T, 1, "_unit_piece_on_tiles")
    assert even == [(0, 320), (320, 320)] and cut == [(0, 512), (512, 128)]
    assert np.array_equal(got, uneven)


def test_a_short_push_on_blas_shares_its_time_in_whole_tiles_of_steps():
    """A streamed chunk's unit on BLAS's products (no tiles, no direct kernel) goes to the threads in pieces
    of whole multiples of ``PRODUCT_STEPS``, as even as that allows: one frame at the released decoder's
    first 384-channel block (160 steps) is 96 and 64 steps on two threads (blocks of 64: 128 and 32)."""
    decoder = numba_cpu.codec_decoder
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        mp.setattr(decoder, "direct_conv_takes", lambda *_: False)
        _, pieces = _push_pieces(mp, 6, 8, 160, 3, "_snake_taps")
    assert decoder.PRODUCT_STEPS == 32 and pieces == [(0, 96), (96, 64)]


@needs_tiles
def test_decoder_keeps_its_units_tiles_and_runs_a_short_decode_on_them(speech_tokenizers):
    """A model's decoder (read-only weights) splits its residual units' weights once: after a decode of
    a few frames their tiles are kept (the units took the tiles below ``UNIT_TILES_MIN_STEPS``), and a second
    decode gives the same samples, to the bit."""
    tok = speech_tokenizers["f32"]
    frames = -(-numba_cpu.amx_conv.KEPT_TILES_MIN_STEPS // 32)  # (32 steps a frame in the first block's units)
    codes = np.random.default_rng(3).integers(0, 64, size=(frames, 16))
    units = [w for name, w in tok.decoder_weights.items() if ".block." in name and name.endswith("conv1.conv.weight")]
    numba_cpu.amx_conv._WEIGHT_TILES.clear()
    with kernels.use_backend("numba"):
        first = tok.decode_full(codes)
        assert units and all(numba_cpu.kept._read_only(w) for w in units)
        takes = [w.shape[0] % 32 == 0 for w in units]
        assert [id(w) in numba_cpu.amx_conv._WEIGHT_TILES for w in units] == takes
        np.testing.assert_array_equal(tok.decode_full(codes), first)
