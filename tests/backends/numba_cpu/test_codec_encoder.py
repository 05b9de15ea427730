"""The codec encoder's fused twins (the residual block, ELU into a strided causal conv) against their
references, in pieces and on the AMX tiles."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.codec import encoder as codec_encoder
from refimpl.io.checkpoint import WeightView

from .cases import needs_tiles, within_float32_noise


def block_reference(x, w1, b1, w2, b2, dilation, pad_mode):
    """``codec_encoder.resnet_block``'s reference (identity shortcut) on plain arrays, as
    ``numba_cpu.codec_encoder.resnet_block_offline`` takes them."""
    w = {"block.1.conv.weight": w1, "block.1.conv.bias": b1, "block.3.conv.weight": w2, "block.3.conv.bias": b2}
    cfg = types.SimpleNamespace(use_conv_shortcut=False, pad_mode=pad_mode)
    b = WeightView({k: v for k, v in w.items() if v is not None})
    return codec_encoder.resnet_block.reference(b, cfg, dilation, x)


def elu_conv_reference(x, w_oik, b_o, stride, pad_mode):
    """``codec_encoder.elu_causal_conv``'s reference on plain arrays, as
    ``numba_cpu.codec_encoder.elu_causal_conv_offline`` takes them."""
    w = {"c.conv.weight": w_oik} | ({} if b_o is None else {"c.conv.bias": b_o})
    cfg = types.SimpleNamespace(pad_mode=pad_mode)
    return codec_encoder.elu_causal_conv.reference(WeightView(w), cfg, "a", "c.", stride, x)


def elu_conv_case(C, O, K, stride, T, with_bias, seed):
    """Random input (and a copy with one NaN), float32 weights and bias, and the numpy backend's float32
    reference, float64 reference and NaN pattern of the ELU + causal strided conv on them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, C, T)).astype(np.float32)
    w = rng.standard_normal((O, C, K)) / np.sqrt(C * K)
    b = rng.standard_normal(O) * 0.1 if with_bias else None
    w32, b32 = w.astype(np.float32), None if b is None else b.astype(np.float32)
    x_nan = x.copy()
    x_nan[0, 0, T // 2] = np.nan
    with kernels.use_backend("numpy"):
        ref = elu_conv_reference(x, w32, b32, stride, "constant")
        exact = elu_conv_reference(x.astype(np.float64), w, b, stride, "constant")
        nan_ref = np.isnan(elu_conv_reference(x_nan, w32, b32, stride, "constant"))
    return x, x_nan, w32, b32, ref, exact, nan_ref


def _resnet_block_case(seed, B, C, H, T, dilation):
    """A random encoder block's input, float32 arguments and the reference's float32 and float64 outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    args = (rng.standard_normal((H, C, 3)) / np.sqrt(3 * C), rng.standard_normal(H) * 0.1)
    args += (rng.standard_normal((C, H, 1)) / np.sqrt(H), rng.standard_normal(C) * 0.1)
    args32 = [a.astype(np.float32) for a in args]
    with kernels.use_backend("numpy"):
        ref = block_reference(x, *args32, dilation, "constant")
        exact = block_reference(x.astype(np.float64), *args, dilation, "constant")
    return x, args32, ref, exact


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 10),  # channels
    st.integers(1, 6),  # hidden channels
    st.integers(1, 900),
    st.sampled_from((1, 2, 3)),
    st.integers(0, 2**31),
)
def test_resnet_block_twin_equals_reference(B, C, H, T, dilation, seed):
    """The fused encoder block against its reference (the plain formulas), in pieces of 256 steps (the
    smallest) so that the left context crosses piece boundaries: within the float32 reference's own noise
    (``within_float32_noise``); other pad modes and missing biases go to the reference."""
    x, args32, ref, exact = _resnet_block_case(seed, B, C, H, T, dilation)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_encoder, "CONV_PIECE_BYTES", 1)
        got = numba_cpu.codec_encoder.resnet_block_offline(x, *args32, dilation, "constant")
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    x[0, 0, T // 2] = np.nan  # spoils the conv's outputs around it, through both ELUs: the same ones on both sides
    with kernels.use_backend("numpy"):
        nan_ref = np.isnan(block_reference(x, *args32, dilation, "constant"))
    np.testing.assert_array_equal(
        np.isnan(numba_cpu.codec_encoder.resnet_block_offline(x, *args32, dilation, "constant")), nan_ref
    )
    assert numba_cpu.codec_encoder.resnet_block_offline(x, *args32, dilation, "replicate") is NotImplemented
    assert (
        numba_cpu.codec_encoder.resnet_block_offline(x, args32[0], None, *args32[2:], dilation, "constant")
        is NotImplemented
    )


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 8),  # channels in
    st.integers(1, 9),  # channels out
    st.sampled_from(((2, 1), (4, 2), (8, 4), (3, 1), (1, 1))),  # (kernel, stride)
    st.integers(1, 700),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_elu_causal_conv_twin_equals_reference(B, C, O, kernel_stride, T, with_bias, seed):
    """The encoder's ELU + causal (strided) conv in one call against its reference (ELU, zero padding, conv),
    in pieces of 256 output columns (the smallest) so that the taps cross piece boundaries and the padding
    sits in the first and last pieces: within the float32 reference's own noise (``within_float32_noise``);
    other pad modes and float64 go to the reference."""
    K, stride = kernel_stride
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    w = rng.standard_normal((O, C, K)) / np.sqrt(C * K)
    b = rng.standard_normal(O) * 0.1 if with_bias else None
    w32, b32 = w.astype(np.float32), None if b is None else b.astype(np.float32)
    with kernels.use_backend("numpy"):
        ref = elu_conv_reference(x, w32, b32, stride, "constant")
        exact = elu_conv_reference(x.astype(np.float64), w, b, stride, "constant")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_encoder, "CONV_PIECE_BYTES", 1)
        got = numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
    assert got.shape == ref.shape == (B, O, -(-T // stride)) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "replicate") is NotImplemented
    assert (
        numba_cpu.codec_encoder.elu_causal_conv_offline(x.astype(np.float64), w, b, stride, "constant")
        is NotImplemented
    )


@settings(max_examples=80, deadline=None)
@given(
    C=st.integers(1, 5),
    T=st.integers(1, 60),
    first=st.integers(-12, 50),
    n=st.integers(1, 30),
    K=st.integers(1, 8),
    stride=st.integers(1, 5),
    dilation=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_elu_taps_are_the_padded_elu_stacked_bit_for_bit(C, T, first, n, K, stride, dilation, seed):
    """The encoder twins' ELU taken as the taps are stacked: exactly ``elu``'s output, zero-padded on both
    sides, read at first + j * stride + k * dilation (spans before x's start and past its end included; a NaN
    sample stays NaN)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((C, T)).astype(np.float32)
    x[0, T // 2] = np.nan
    got = numba_cpu.codec_encoder._elu_taps(x, first, stride, dilation, K, n)
    span = (n - 1) * stride + (K - 1) * dilation + 1
    pad = max(0, -first)
    padded = np.zeros((C, pad + max(T, first + span)), np.float32)
    padded[:, pad : pad + T] = nn.elu.reference(x)
    start = pad + first
    want = np.stack(
        [padded[:, start + k * dilation : start + k * dilation + (n - 1) * stride + 1 : stride] for k in range(K)],
        axis=1,
    )
    assert got.shape == (C, K, n)
    np.testing.assert_array_equal(got, want)


@needs_tiles
@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from((32, 64)),  # channels in
    st.sampled_from((32, 64)),  # channels out
    st.sampled_from(((4, 2), (8, 4), (10, 5), (6, 3), (3, 1))),  # (kernel, stride)
    st.integers(1, 700),
    st.booleans(),
    st.sampled_from((32, 64)),
    st.integers(0, 2**31),
)
def test_elu_causal_conv_on_tiles_equals_reference(C, O, kernel_stride, T, with_bias, piece, seed):
    """The encoder's ELU + causal strided conv on the tiles (the ELU's span split phase by phase, each tap a
    shift of one phase; ``_convs_take_tiles`` made to take every length, pieces of ``piece`` outputs so
    that the taps cross piece boundaries and the padding sits in the first and last pieces) against its
    reference: within the float32 reference's own noise, not the BLAS path's bits (the tiles ran); a NaN
    spoils the same outputs on both sides."""
    K, stride = kernel_stride
    x, x_nan, w32, b32, ref, exact, nan_ref = elu_conv_case(C, O, K, stride, T, with_bias, seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx_conv, "UNIT_TILES_MIN_STEPS", 1)
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_PIECE_VALUES", piece * C * stride)
        got = numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
        got_nan = numba_cpu.codec_encoder.elu_causal_conv_offline(x_nan, w32, b32, stride, "constant")
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        blas = numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
    assert got.shape == ref.shape == (1, O, -(-T // stride)) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert got.shape[-1] < 4 or not np.array_equal(got, blas)
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


@needs_tiles
@settings(max_examples=10, deadline=None)
@given(
    st.sampled_from((64, 128)),
    st.integers(1, 300),
    st.sampled_from((1, 2, 3)),
    st.sampled_from((32, 64)),
    st.integers(0, 2**31),
)
def test_resnet_block_on_tiles_equals_reference(C, T, dilation, piece, seed):
    """The encoder's block on the tiles (``_convs_take_tiles`` made to take every length, pieces of ``piece``
    steps so that the left context crosses their boundaries and the last piece is partial; its ELUs with
    ``_expm1_f32``) against its reference: within the float32 reference's own noise, not the bits of the
    BLAS path (the tiles ran); a NaN spoils the same outputs on both sides."""
    x, args32, ref, exact = _resnet_block_case(seed, 1, C, C // 2, T, dilation)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx_conv, "UNIT_TILES_MIN_STEPS", 1)
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_PIECE_VALUES", piece * C)
        got = numba_cpu.codec_encoder.resnet_block_offline(x, *args32, dilation, "constant")
        x_nan = x.copy()
        x_nan[0, 0, T // 2] = np.nan
        got_nan = numba_cpu.codec_encoder.resnet_block_offline(x_nan, *args32, dilation, "constant")
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        blas = numba_cpu.codec_encoder.resnet_block_offline(x, *args32, dilation, "constant")
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert T < 4 or not np.array_equal(got, blas)
    with kernels.use_backend("numpy"):
        nan_ref = np.isnan(block_reference(x_nan, *args32, dilation, "constant"))
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from((8, 16, 64)),
    st.integers(1, 300),
    st.sampled_from((1, 3)),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_resnet_block_on_the_direct_kernel_equals_reference(C, T, dilation, blas_1x1, seed):
    """The encoder's block on the direct kernel (no tiles; pieces of 64 steps so that the left context
    crosses their boundaries and the last piece is partial; its ELUs with ``_expm1_f32``; the 1x1 conv on
    it or on BLAS) against its reference: within the float32 reference's own noise, every piece on the
    direct kernel; a NaN spoils the same outputs on both sides."""
    x, args32, ref, exact = _resnet_block_case(seed, 1, C, C // 2, T, dilation)
    block, pieces = numba_cpu.codec_encoder.resnet_block_offline, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_DIRECT_VALUES", 64 * C)
        mp.setattr(numba_cpu.conv, "DIRECT_1X1_MAX_IN", 0 if blas_1x1 else 128)
        kernel = numba_cpu.codec_encoder._resnet_convs_direct
        mp.setattr(numba_cpu.codec_encoder, "_resnet_convs_direct", lambda *a: pieces.append(a[1]) or kernel(*a))
        got = block(x, *args32, dilation, "constant")
        x_nan = x.copy()
        x_nan[0, 0, T // 2] = np.nan
        got_nan = block(x_nan, *args32, dilation, "constant")
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert pieces[: -(-T // 64)] == list(range(0, T, 64))
    with kernels.use_backend("numpy"):
        nan_ref = np.isnan(block_reference(x_nan, *args32, dilation, "constant"))
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from((4, 16, 64)),  # channels in
    st.sampled_from((4, 8, 32)),  # channels out
    st.sampled_from(((4, 2), (8, 4), (10, 5), (6, 3), (3, 1))),  # (kernel, stride)
    st.integers(1, 700),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_elu_causal_conv_on_the_direct_kernel_equals_reference(C, O, kernel_stride, T, with_bias, seed):
    """The encoder's ELU + causal strided conv on the direct kernel (no tiles; the ELU's span in its phases,
    each tap a shift of one phase; pieces of 64 outputs so that the taps cross piece boundaries and the
    padding sits in the first and last pieces) against its reference: within the float32 reference's own
    noise, every piece on the direct kernel; a NaN spoils the same outputs on both sides."""
    K, stride = kernel_stride
    x, x_nan, w32, b32, ref, exact, nan_ref = elu_conv_case(C, O, K, stride, T, with_bias, seed)
    conv, pieces = numba_cpu.codec_encoder.elu_causal_conv_offline, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_DIRECT_VALUES", 64 * C * stride)
        kernel = numba_cpu.codec_encoder._elu_phases_into
        mp.setattr(numba_cpu.codec_encoder, "_elu_phases_into", lambda *a: pieces.append(a[1]) or kernel(*a))
        got = conv(x, w32, b32, stride, "constant")
        got_nan = conv(x_nan, w32, b32, stride, "constant")
    assert got.shape == ref.shape == (1, O, -(-T // stride)) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert pieces[: -(-got.shape[-1] // 64)] == list(range(0, got.shape[-1], 64))
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


def test_phase_weight_is_kept_for_read_only_weights():
    """The strided conv's weight in its phases' order, made once for a read-only weight (a model's)."""
    w = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8).copy()
    phases = numba_cpu.codec_encoder._phase_weight(w, 4)
    assert phases.shape == (2, 12, 2) and phases[1, 2 * 4 + 3, 1] == w[1, 2, 3 + 4 * 1]
    w.flags.writeable = False
    assert numba_cpu.codec_encoder._phase_weight(w, 4) is numba_cpu.codec_encoder._phase_weight(w, 4)
