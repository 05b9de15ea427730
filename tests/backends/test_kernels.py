"""The backend layer: every twin against its plain NumPy reference, and the backend switch.

Tolerance of a twin that reorders a sum (conv1d, linear): both sides are sums of the same n products in
another order, so each is within gamma_n * sum|terms| of the exact value (gamma_n ~ n * eps / 2); we allow
2 * n * eps * sum|terms| for their difference.  Twins that keep the reference's operations and order (elu,
and snake_beta in float64) must be bit-identical; the float32 SnakeBeta evaluates its own sine (see its test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from attention_cases import CASES, attention_case
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn, transformer
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, bf16_bits_to_float32, float32_to_bf16_bits
from refimpl.codec import decoder as codec_decoder
from refimpl.codec import encoder as codec_encoder
from refimpl.codec import quantization
from refimpl.tts import speaker_encoder

DTYPES = (np.float32, np.float64)


def test_every_twin_has_a_reference_of_the_same_name_and_signature():
    import inspect

    assert set(numba_cpu.TWINS) == {
        *("conv1d", "conv_transpose1d", "snake_beta", "elu", "gelu_erf", "linear"),
        *("decoder_layer_step", "decoder_stack_step", "residual_unit_push", "resnet_block_offline"),
        *("elu_causal_conv_offline",),
        *("snake_causal_conv_push", "softmax", "tdnn_offline", "res2net_offline", "mean_and_std", "nearest_rows"),
        *("softmax_mean_and_std", "gated_residual", "spectral_magnitude", "attention", "rms_norm"),
    }
    for name, twin in numba_cpu.TWINS.items():
        # decoder_layer_step is a transformer primitive, residual_unit_push and snake_causal_conv_push the
        # codec decoder's, resnet_block_offline and elu_causal_conv_offline the codec encoder's,
        # tdnn_offline, res2net_offline, mean_and_std, softmax_mean_and_std, gated_residual and
        # spectral_magnitude the speaker encoder's, nearest_rows the codec's quantizer's
        stages = (nn, transformer, codec_decoder, codec_encoder, speaker_encoder, quantization)
        reference = next(getattr(m, name) for m in stages if hasattr(m, name))
        reference = reference.reference
        assert inspect.signature(twin) == inspect.signature(reference), name


def within_float32_noise(got, ref, exact) -> bool:
    """A fused float32 twin's output ``got`` is as close to the float64 result ``exact`` as the float32
    reference ``ref`` is, within 4 times its distance, plus 16 float32 ulps of the output's scale: on a tiny
    case the reference can be luckily close (2 channels, seed 2900 of the residual unit: its error 2.3e-7
    where the twin's order of sums gave 1.9e-6, through SnakeBeta's slope), while a wrong tap or offset is
    off by the signal itself."""
    scale = max(1.0, float(np.max(np.abs(exact))))
    return np.max(np.abs(got - exact)) <= 4 * np.max(np.abs(ref - exact)) + 16 * np.finfo(np.float32).eps * scale


@st.composite
def conv_case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(("dense_small", "dense", "depthwise", "grouped")))
    K = draw(st.integers(1, 7))
    stride, dilation = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    B = draw(st.integers(1, 2))
    if kind == "dense_small":  # I * K <= 64 (the stacked taps of a piece: a few rows)
        groups, I = 1, draw(st.integers(1, 64 // K))
        O = draw(st.integers(1, 12))  # up to PER_TAP_MAX_OUT = 8 a product per tap, more in pieces
    elif kind == "dense":  # I * K > 64
        groups, I = 1, draw(st.integers(64 // K + 1, 80))
        O = draw(st.integers(1, 12))
    elif kind == "depthwise":
        groups = I_total = draw(st.integers(1, 12))
        I, O = 1, I_total
    else:  # other groupings go back to the reference
        groups, I = draw(st.integers(2, 4)), draw(st.integers(1, 3))
        O = groups * draw(st.integers(1, 3))
    span = dilation * (K - 1) + 1
    T = draw(st.integers(span, span + 3 * stride + 5))  # length equal to the span included
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal((B, I * groups, T)).astype(dtype)
    w = rng.standard_normal((O, I, K)).astype(dtype)
    b = rng.standard_normal(O).astype(dtype) if draw(st.booleans()) else None
    return x, w, b, stride, dilation, groups


@settings(max_examples=150, deadline=None)
@given(conv_case())
def test_conv1d_twin_equals_reference(case):
    x, w, b, stride, dilation, groups = case
    ref = nn.conv1d.reference(x, w, b, stride, dilation, groups)
    got = numba_cpu.conv.conv1d(x, w, b, stride, dilation, groups)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    n = w.shape[1] * w.shape[2]
    # sum|terms| per output: the same products computed in float64 with absolute values
    abs_sum = nn.conv1d.reference(
        np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), None, stride, dilation, groups
    )
    tol = 2 * n * np.finfo(x.dtype).eps * (abs_sum + (np.abs(b)[None, :, None] if b is not None else 0))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.integers(1, 2),  # batch
    st.integers(1, 9),  # in channels
    st.integers(1, 6),  # out channels
    st.integers(1, 5),  # stride
    st.integers(1, 3),  # taps per phase (K = J * stride; K = 2 * stride in the codec)
    st.integers(1, 40),  # input frames
    st.booleans(),
    st.integers(0, 2**31),
    st.integers(1, 6),  # output channels per piece
    st.integers(1, 20),  # output frames per piece
)
def test_conv_transpose1d_twin_equals_reference(dtype, B, I, O, stride, J, T, with_bias, seed, step, n_piece):
    with pytest.MonkeyPatch.context() as mp:  # pieces of every shape: some channels, some frames
        mp.setattr(numba_cpu.conv, "_transposed_pieces", lambda *shape: (step, n_piece))
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((B, I, T)).astype(dtype)
        w = rng.standard_normal((I, O, J * stride)).astype(dtype)
        b = rng.standard_normal(O).astype(dtype) if with_bias else None
        ref = nn.conv_transpose1d.reference(x, w, b, stride)
        got = numba_cpu.conv.conv_transpose1d(x, w, b, stride)
        if dtype != np.float32:
            assert got is NotImplemented  # the reference runs (below, through the explicit backend)
            with kernels.use_backend("numba"):
                assert np.array_equal(nn.conv_transpose1d(x, w, b, stride), ref)
            return
        assert got.shape == ref.shape and got.dtype == ref.dtype
        abs_sum = nn.conv_transpose1d.reference(
            np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), None, stride
        )
        tol = 2 * I * J * np.finfo(dtype).eps * (abs_sum + (np.abs(b)[None, :, None] if b is not None else 0))
        assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)


@settings(max_examples=40, deadline=None)
@given(
    I=st.integers(1, 40),
    J=st.integers(1, 60),
    F=st.integers(1, numba_cpu.conv.FEW_FRAMES),
    columns=st.sampled_from((1, 3, 16, 256)),
    n_threads=st.integers(1, 70),
    seed=st.integers(0, 2**31),
)
def test_few_frames_kernel_sums_every_column_strip_in_order(I, J, F, columns, n_threads, seed):
    """The transposed conv's products for a few frames, z = w^T x: strips of every width (a last one cut
    short), ranges of columns of every size (empty ones too), within the bound of a sum of I products; a NaN
    weight spoils its own column only."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((I, F)).astype(np.float32)
    w = rng.standard_normal((I, J)).astype(np.float32)
    z = np.full((J, F), np.nan, np.float32)

    def run(w):
        for t in range(n_threads):  # as conv_transpose1d shares the columns out (a thread's range may be empty)
            numba_cpu.conv._few_frames_times(x, w, J * t // n_threads, J * (t + 1) // n_threads, columns, z)

    run(w)
    exact = w.T.astype(np.float64) @ x.astype(np.float64)
    bound = 2 * I * np.finfo(np.float32).eps * (np.abs(w.T).astype(np.float64) @ np.abs(x).astype(np.float64))
    assert np.all(np.abs(z - exact) <= bound)
    w[I // 2, J // 2] = np.nan
    run(w)
    np.testing.assert_array_equal(np.isnan(z).any(axis=1), np.arange(J) == J // 2)


def test_transposed_pieces_split_channels_where_the_weight_outweighs_the_products():
    """The released decoder's transposed convs (2 threads): a big weight over few frames is cut into shares
    of the channels, a small weight over a long signal into pieces of frames with every channel."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.conv, "_piece_threads", lambda: 2)
        assert numba_cpu.conv._transposed_pieces(768, 16, 501, 1536 * 768 * 16 * 4) == (384, 682)  # 75 MB, 500 frames
        assert numba_cpu.conv._transposed_pieces(768, 16, 5, 1536 * 768 * 16 * 4)[0] == 384  # one frame piece: shares
        assert numba_cpu.conv._transposed_pieces(192, 8, 20001, 384 * 192 * 8 * 4) == (192, 682)  # 2.4 MB, 20000 frames


def test_conv_transpose1d_twin_leaves_other_tap_counts_to_the_reference():
    x, w = np.ones((1, 2, 5), np.float32), np.ones((2, 3, 5), np.float32)  # K = 5 with stride 2
    assert numba_cpu.conv.conv_transpose1d(x, w, None, 2) is NotImplemented
    assert np.array_equal(nn.conv_transpose1d(x, w, None, 2), nn.conv_transpose1d.reference(x, w, None, 2))


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
        ref, _ = codec_decoder.residual_unit_push(x, *args32, dilation, context32)
        exact, _ = codec_decoder.residual_unit_push(x.astype(np.float64), *args, dilation, context)
    with kernels.use_backend("numba"):
        _, kept = codec_decoder.residual_unit_push.reference(x, *args32, dilation, context32)
    return x, args, args32, context, context32, ref, exact, kept


def _resnet_block_case(seed, B, C, H, T, dilation):
    """A random encoder block's input, float32 arguments and the reference's float32 and float64 outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    args = (rng.standard_normal((H, C, 3)) / np.sqrt(3 * C), rng.standard_normal(H) * 0.1)
    args += (rng.standard_normal((C, H, 1)) / np.sqrt(H), rng.standard_normal(C) * 0.1)
    args32 = [a.astype(np.float32) for a in args]
    with kernels.use_backend("numpy"):
        ref = codec_encoder.resnet_block_offline(x, *args32, dilation, "constant")
        exact = codec_encoder.resnet_block_offline(x.astype(np.float64), *args, dilation, "constant")
    return x, args32, ref, exact


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
def test_residual_unit_twin_equals_reference(B, C, T, dilation, tile, with_context, seed):
    """The fused unit against its reference (run on the plain formulas), pieces of ``tile`` steps so that
    the left context crosses piece boundaries, at the signal's start or after a push (a context): within the
    float32 reference's own noise (``within_float32_noise``); the next context is what the
    numba path primitive by primitive keeps, to the bit."""
    x, args, args32, context, context32, ref, exact, kept = _residual_unit_case(seed, B, C, T, dilation, with_context)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE", tile)
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
def test_snake_causal_conv_twin_equals_reference(B, C, O, T, tile, with_bias, with_context, seed):
    """The fused last SnakeBeta + conv against its reference (the plain formulas), pieces of ``tile`` steps
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
        ref, _ = codec_decoder.snake_causal_conv_push(x, *args32, context32)
        exact, _ = codec_decoder.snake_causal_conv_push(x.astype(np.float64), *args, context)
    with kernels.use_backend("numba"):
        _, kept = codec_decoder.snake_causal_conv_push.reference(x, *args32, context32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.codec_decoder, "UNIT_PIECE", tile)
        got, got_context = numba_cpu.codec_decoder.snake_causal_conv_push(x, *args32, context32)
        trimmed = np.concatenate([x, np.full((B, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(numba_cpu.codec_decoder.snake_causal_conv_push(trimmed, *args32, context32)[0], got)
    assert got.shape == ref.shape == (B, O, T) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert got_context.shape == (B, C, 6) and np.array_equal(got_context, kept)
    assert numba_cpu.codec_decoder.snake_causal_conv_push(x.astype(np.float64), *args, context) is NotImplemented


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
        nan_ref = np.isnan(codec_encoder.resnet_block_offline(x, *args32, dilation, "constant"))
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
        ref = codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
        exact = codec_encoder.elu_causal_conv_offline(x.astype(np.float64), w, b, stride, "constant")
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


def test_two_callers_lending_blas_at_once_leave_it_its_threads():
    """Two threads decoding at once: the first in sets BLAS to one thread, the one that leaves first must
    not restore it while the other's pieces still run, and the last out restores the count from before."""
    import threadpoolctl

    def threads():
        return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]

    before = threads()
    if min(before, default=1) < 2:
        pytest.skip("BLAS runs one thread here: nothing is lent")
    controllers = numba_cpu.pieces._blas_controller()
    first, second = numba_cpu.pieces._blas_lent(controllers), numba_cpu.pieces._blas_lent(controllers)
    first.__enter__()
    second.__enter__()
    assert max(threads()) == 1
    first.__exit__(None, None, None)  # the first out, while the other's pieces still run
    assert max(threads()) == 1
    second.__exit__(None, None, None)
    assert threads() == before


def test_pieces_run_in_a_forked_child_after_the_parent_used_its_pool():
    """A forked process has none of the parent's threads: its pieces get a pool of their own (the parent's
    would accept them and never run them: a hang)."""
    import multiprocessing

    numba_cpu.pieces.run_pieces(lambda i: None, [(i,) for i in range(4)])  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_sum_in_pieces, (10,))
        assert result.get(timeout=60) == sum(range(10))


def _sum_in_pieces(n):
    seen = []
    numba_cpu.pieces.run_pieces(lambda i: seen.append(i), [(i,) for i in range(n)])
    return sum(seen)


def test_importing_refimpl_first_lets_idle_openblas_threads_sleep_unless_the_user_says_otherwise():
    code = "import os, refimpl, numpy; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    for preset, expected in ((None, "4"), ("12", "12")):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        env.update({"PYTHONPATH": str(REPO)} | ({"OPENBLAS_THREAD_TIMEOUT": preset} if preset else {}))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.split() == [expected], r.stderr


def test_pieces_run_side_by_side_and_their_errors_reach_the_caller():
    seen = set()

    def piece(i):
        seen.add(i)
        if i == 7:
            raise ValueError("piece 7")

    with pytest.raises(ValueError, match="piece 7"):
        numba_cpu.pieces.run_pieces(piece, [(i,) for i in range(10)])
    assert 7 in seen
    seen.clear()
    numba_cpu.pieces.run_pieces(lambda i: seen.add(i), [(i,) for i in range(10)])
    assert seen == set(range(10))


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.integers(1, 2),  # batch
    st.integers(1, 6),  # in channels
    st.integers(1, 5),  # out channels
    st.integers(1, 7),  # taps
    st.integers(1, 4),  # stride
    st.integers(1, 3),  # dilation
    st.integers(128, 400),  # output columns: two pieces of 64 at least
    st.booleans(),
    st.integers(0, 2**31),
)
def test_conv1d_twin_in_pieces_equals_reference(dtype, B, I, O, K, stride, dilation, T_out, with_bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, I, (T_out - 1) * stride + dilation * (K - 1) + 1)).astype(dtype)
    w = rng.standard_normal((O, I, K)).astype(dtype)
    b = rng.standard_normal(O).astype(dtype) if with_bias else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.conv, "PER_TAP_MAX_OUT", 0)  # even one output channel in pieces
        mp.setattr(numba_cpu.conv, "MIN_PIECES", 1)  # even two pieces side by side
        mp.setattr(numba_cpu.conv, "CONV_PIECE_MIN_COLUMNS", 64)  # pieces of 64 columns, the last one short
        mp.setattr(numba_cpu.conv, "CONV_PIECE_BYTES", 1)
        got = numba_cpu.conv.conv1d(x, w, b, stride, dilation)
    ref = nn.conv1d.reference(x, w, b, stride, dilation)
    assert got.shape == ref.shape == (B, O, T_out) and got.dtype == ref.dtype
    abs_sum = nn.conv1d.reference(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), None, stride, dilation)
    tol = 2 * I * K * np.finfo(dtype).eps * (abs_sum + (np.abs(b)[None, :, None] if b is not None else 0))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)


@pytest.mark.parametrize("T_out", [1, 2, 4, 8, 9])
@pytest.mark.parametrize("stride, dilation, with_bias", [(1, 1, True), (2, 3, False)])
def test_conv1d_of_a_few_columns_reads_the_weight_once(monkeypatch, T_out, stride, dilation, with_bias):
    """2 to 8 output columns and a weight of a megabyte or more (the decoder's first conv over a 1-frame
    decode): the stacked taps times the weight by the few-rows kernel, within float32 noise of the
    reference; other column counts keep the stacked-taps product."""
    rng = np.random.default_rng(T_out * 7 + stride)
    O, I, K = 64, 600, 7  # 1.07 MB of float32
    w = (rng.standard_normal((O, I, K)) / 30).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if with_bias else None
    x = rng.standard_normal((1, I, (T_out - 1) * stride + dilation * (K - 1) + 1)).astype(np.float32)
    taken = []
    few = numba_cpu.conv._few_columns_conv
    monkeypatch.setattr(numba_cpu.conv, "_few_columns_conv", lambda *a: taken.append(1) or few(*a))
    got = numba_cpu.conv.conv1d(x, w, b, stride, dilation)
    assert bool(taken) == (2 <= T_out <= 8)
    ref = nn.conv1d.reference(x, w, b, stride, dilation)
    exact = nn.conv1d.reference(x.astype(np.float64), w.astype(np.float64), b, stride, dilation)
    assert got.shape == ref.shape == (1, O, T_out) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    taken.clear()
    numba_cpu.conv.conv1d(x.astype(np.float64), w.astype(np.float64), b, stride, dilation)
    assert not taken  # float64: the stacked-taps product as before


def test_conv1d_twin_and_reference_refuse_the_same_bad_shapes():
    x = np.zeros((1, 8, 10), np.float32)
    for f in (nn.conv1d.reference, numba_cpu.conv.conv1d):
        with pytest.raises(ValueError, match="do not fit"):
            f(x, np.zeros((4, 3, 2), np.float32), groups=2)  # 2 groups of 3 channels is not 8
        with pytest.raises(ValueError, match="shorter than the kernel span"):
            f(x, np.zeros((4, 8, 6), np.float32), dilation=2)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.integers(1, 5),
    st.integers(0, 40),
    st.sampled_from((0.5, 3.0, 300.0)),
    st.integers(0, 2**31),
)
def test_snake_beta_twin(dtype, C, T, amplitude, seed):
    """float64: the reference itself.  float32: the twin's sine (angle reduction and polynomial in float64,
    rounded to float32) and NumPy's float32 sine are each within about one float32 rounding of sin(z), so
    their squares differ by at most ~4 eps * sin^2 <= 4 eps; scaled by 1/beta and added to x (one more
    rounding of the result): |twin - reference| <= 8 eps / beta + 2 eps |reference|."""
    rng = np.random.default_rng(seed)
    x = (amplitude * rng.standard_normal((2, C, T))).astype(dtype)
    la, lb = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    got, ref = numba_cpu.elementwise.snake_beta(x, la, lb), nn.snake_beta.reference(x, la, lb)
    assert got.dtype == ref.dtype == dtype and got.shape == ref.shape
    if dtype == np.float64:
        np.testing.assert_array_equal(got, ref)
        return
    eps = np.finfo(np.float32).eps
    inv_beta = 1 / (np.exp(lb.astype(np.float64)) + 1e-9)
    tol = 8 * eps * inv_beta[None, :, None] + 2 * eps * np.abs(ref.astype(np.float64))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol)


def test_snake_beta_twin_sine_is_accurate_over_many_periods():
    """The reduced-angle polynomial, on its own: |sin| within two float32 roundings over 1200 periods."""
    z = np.linspace(-2000, 2000, 4001, dtype=np.float32)
    got = np.array([abs(numba_cpu.elementwise._sin_up_to_sign(v)) for v in z], dtype=np.float64)
    assert np.max(np.abs(got - np.abs(np.sin(z.astype(np.float64))))) <= 2 * np.finfo(np.float32).eps


@st.composite
def linear_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    O, I = draw(st.integers(1, 70)), draw(st.one_of(st.integers(1, 300), st.sampled_from((1024, 1500, 2100))))
    # <= 16 rows: the matrix-vector kernel; <= 64: the block kernel (remainders of its 4 x 6 tile, sums in
    # chunks of BLOCK_I_CHUNK columns: 1500 and 2100 end in a partial chunk); more: BLAS
    rows = draw(st.sampled_from(((1,), (3,), (2, 8), (17,), (18,), (19,), (20,), (31,), (64,), (3, 40), (65,))))
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32)))
    x = rng.standard_normal(rows + (I,)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if draw(st.booleans()) else None
    return x, w, b


@settings(max_examples=80, deadline=None)
@given(linear_case())
def test_linear_twin_reads_bf16_weights_as_stored(case):
    x, w, b = case
    wide = np.asarray(w)  # the exact float32 values of the bfloat16 words
    ref = nn.linear.reference(x, wide, b)
    got = numba_cpu.linear.linear(x, w, b)
    assert got.shape == ref.shape == x.shape[:-1] + (w.shape[0],) and got.dtype == np.float32
    n = w.shape[1]
    abs_sum = np.abs(x.astype(np.float64)) @ np.abs(wide.astype(np.float64)).T + (np.abs(b) if b is not None else 0)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (n + 1) * np.finfo(np.float32).eps * abs_sum)


needs_tiles = pytest.mark.skipif(not numba_cpu.amx.USE_TILES, reason="no AMX tiles on this machine (or REFIMPL_AMX=0)")


def test_tile_split_is_exact():
    """x = hi + mid + lo exactly, each part a bfloat16 word in the tiles' pair layout (parts[p, k, n, j] is
    part p of x[n, 2 k + j], the padding rows zero), for values of every size, signed zeros and the
    smallest normal; an infinity keeps its sign and a NaN stays a NaN (in the hi part)."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, -3.14159, 1e-30, 1.17549435e-38, 3.4e38, -2.5e-12, 65504.123, np.inf, -np.inf, np.nan]
    x = np.concatenate([rng.standard_normal(52) * np.exp(rng.uniform(-40, 40, 52)), special]).astype(np.float32)
    x = np.stack([x, x[::-1], -x])  # 3 rows of 64 columns
    parts = np.empty((3, 32, 32, 2), np.uint16)
    numba_cpu.amx._split_into_pairs(x, parts)
    words = parts.transpose(0, 2, 1, 3).reshape(3, 32, 64)  # [p, n, i]
    values = (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert not values[:, 3:].any()  # the padding rows
    total = values[0, :3] + values[1, :3] + values[2, :3]
    finite = np.isfinite(x)
    np.testing.assert_array_equal(total[finite], x[finite].astype(np.float64))
    np.testing.assert_array_equal(total[np.isinf(x)], x[np.isinf(x)])
    assert np.isnan(total[np.isnan(x)]).all()


@needs_tiles
@pytest.mark.parametrize("N, O, I", [(17, 32, 32), (28, 64, 1024), (33, 96, 2080), (70, 32, 96), (28, 2048, 1024)])
def test_tile_kernel_within_the_bound_and_each_row_alone(N, O, I):
    """The AMX tile kernel (x in three exact bf16 parts, the sums in float32 tiles, ``TILE_K_CHUNK`` columns
    at a time): within linear's reduction-length bound of the float64 product of the same bf16 words,
    for rows that fill no whole tile, several groups of 32 rows, several column chunks (2080 > 1024); each
    row's bits the same computed alone or among the others in another order (no row's sum sees another)."""
    rng = np.random.default_rng(N + O + I)
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    x = rng.standard_normal((N, I)).astype(np.float32)
    got = np.full((N, O), np.nan, np.float32)
    numba_cpu.amx._tile_bf16_times(x, bits, got, 2)
    w = np.asarray(BF16Matrix(bits), np.float64)
    exact = x.astype(np.float64) @ w.T
    bound = 2 * (I + 1) * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    assert np.all(np.abs(got - exact) <= bound)
    alone = np.empty((1, O), np.float32)
    numba_cpu.amx._tile_bf16_times(np.ascontiguousarray(x[-1:]), bits, alone, 1)
    np.testing.assert_array_equal(alone[0], got[-1])
    order = rng.permutation(N)
    shuffled = np.empty((N, O), np.float32)
    numba_cpu.amx._tile_bf16_times(np.ascontiguousarray(x[order]), bits, shuffled, 2)
    np.testing.assert_array_equal(shuffled, got[order])


@needs_tiles
@pytest.mark.parametrize("T", [17, 30])
def test_fused_layer_on_tiles_equals_the_layer(T, monkeypatch):
    """A prompt's fused layer whose matrices fit the tiles (C = 64, F = 128: every O and I a multiple of 32)
    against the composition transformer_layer in float64 (the exact values of the same bf16 weights): on
    the tiles and on the block kernel (``USE_TILES`` off) within twice the float32 composition's distance
    plus the rounding floor of the longest reduction, and the two paths not the same bits (the tiles ran)."""
    C, H, G, D, F = 64, 4, 2, 16, 128
    out = {}
    for dtype in (np.float32, np.float64):
        lw, cfg = random_qwen3_layer(np.random.default_rng(T), C, H, G, D, F, dtype)
        x = np.random.default_rng(T + 1).standard_normal((1, T, C)).astype(dtype)
        cos, sin = nn.rope_cos_sin(np.arange(3, 3 + T), D, 10000.0, dtype)
        past = np.random.default_rng(T + 2).standard_normal((2, 1, G, 3, D)).astype(dtype)
        kinds = (
            (("tiles", True), ("block", False), ("reference", None)) if dtype == np.float32 else (("reference", None),)
        )
        for kind, tiles in kinds:
            cache = transformer.KVCache(1, G, D, dtype, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            if tiles is not None:
                monkeypatch.setattr(numba_cpu.amx, "USE_TILES", tiles)
            step = (
                numba_cpu.transformer.decoder_layer_step
                if tiles is not None
                else transformer.decoder_layer_step.reference
            )
            with kernels.use_backend("numpy"):
                out[kind, np.dtype(dtype).name] = step(x, lw, cfg, cos[None], sin[None], cache, 1e-6)
    exact = out["reference", "float64"].astype(np.float64)
    composition = out["reference", "float32"].astype(np.float64)
    floor = 2 * F * np.finfo(np.float32).eps * np.max(np.abs(exact))
    for kind in ("tiles", "block"):
        got = out[kind, "float32"].astype(np.float64)
        assert np.max(np.abs(got - exact)) <= 2 * np.max(np.abs(composition - exact)) + floor, kind
    assert not np.array_equal(out["tiles", "float32"], out["block", "float32"])


@needs_tiles
def test_linear_takes_the_tiles_for_a_prompt_and_keeps_infinities():
    """``linear`` on bf16 words takes the tile kernel from 17 rows where the shapes fit (its bits), the
    block kernel for 17 rows of a shape that does not (O = 40), BLAS's widened blocks no more for 100 rows;
    an infinity or a NaN in x gives the non-finite outputs of the float32 product."""
    rng = np.random.default_rng(7)
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((64, 96)).astype(np.float32)))
    for rows in (17, 100):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        tiles = np.empty((rows, 64), np.float32)
        numba_cpu.amx._tile_bf16_times(x, w.bits, tiles, numba.get_num_threads())
        np.testing.assert_array_equal(numba_cpu.linear.linear(x, w), tiles)
    odd = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((40, 96)).astype(np.float32)))
    x = rng.standard_normal((17, 96)).astype(np.float32)
    block = np.empty((17, 40), np.float32)
    numba_cpu.linear._bf16_block_times(x, odd.bits, block, numba.get_num_threads())
    np.testing.assert_array_equal(numba_cpu.linear.linear(x, odd), block)
    x = rng.standard_normal((20, 96)).astype(np.float32)
    x[3, 5], x[8, 0], x[11, 95] = np.inf, -np.inf, np.nan
    got, ref = numba_cpu.linear.linear(x, w), nn.linear.reference(x, np.asarray(w))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    np.testing.assert_array_equal(np.sign(got[np.isinf(ref)]), np.sign(ref[np.isinf(ref)]))


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
        mp.setattr(numba_cpu.codec_decoder, "UNIT_TILE_VALUES", piece * C)
        got, got_context = numba_cpu.codec_decoder.residual_unit_push(x, *args32, dilation, context32)
        trimmed = np.concatenate([x, np.full((1, C, 5), np.nan, np.float32)], axis=-1)[:, :, :T]
        assert np.array_equal(numba_cpu.codec_decoder.residual_unit_push(trimmed, *args32, dilation, context32)[0], got)
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        blas, _ = numba_cpu.codec_decoder.residual_unit_push(x, *args32, dilation, context32)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert np.array_equal(got_context, kept)
    assert T < 4 or not np.array_equal(got, blas)


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


@pytest.mark.parametrize("T", [63, 64, 1023, 1024])
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
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, read_only, frozen) == (tiles and T >= kept_from)
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, writable, read_only) == (tiles and T >= split_from)
    view_of_writable = writable[:]
    view_of_writable.flags.writeable = False  # writable through its base
    assert numba_cpu.amx_conv._convs_take_tiles(32, 32, T, view_of_writable) == (tiles and T >= split_from)
    assert not numba_cpu.amx_conv._convs_take_tiles(48, 32, T, read_only)


@needs_tiles
def test_decoder_keeps_its_units_tiles_and_runs_a_short_decode_on_them(speech_tokenizers):
    """A model's decoder (read-only weights) splits its residual units' weights once: after a decode of
    a few frames their tiles are kept (the units took the tiles below ``UNIT_TILES_MIN_STEPS``), and a second
    decode gives the same samples, to the bit."""
    tok = speech_tokenizers["f32"]
    codes = np.random.default_rng(3).integers(0, 64, size=(3, 16))  # 96 steps in the first block's units
    units = [w for name, w in tok.decoder_weights.items() if ".block." in name and name.endswith("conv1.conv.weight")]
    numba_cpu.amx_conv._WEIGHT_TILES.clear()
    with kernels.use_backend("numba"):
        first = tok.decode_full(codes)
        assert units and all(numba_cpu.kept._read_only(w) for w in units)
        takes = [w.shape[0] % 32 == 0 for w in units]
        assert [id(w) in numba_cpu.amx_conv._WEIGHT_TILES for w in units] == takes
        np.testing.assert_array_equal(tok.decode_full(codes), first)


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
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, C, T)).astype(np.float32)
    w = rng.standard_normal((O, C, K)) / np.sqrt(C * K)
    b = rng.standard_normal(O) * 0.1 if with_bias else None
    w32, b32 = w.astype(np.float32), None if b is None else b.astype(np.float32)
    x_nan = x.copy()
    x_nan[0, 0, T // 2] = np.nan
    with kernels.use_backend("numpy"):
        ref = codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
        exact = codec_encoder.elu_causal_conv_offline(x.astype(np.float64), w, b, stride, "constant")
        nan_ref = np.isnan(codec_encoder.elu_causal_conv_offline(x_nan, w32, b32, stride, "constant"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx_conv, "UNIT_TILES_MIN_STEPS", 1)
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_TILE_VALUES", piece * C * stride)
        got = numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
        got_nan = numba_cpu.codec_encoder.elu_causal_conv_offline(x_nan, w32, b32, stride, "constant")
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        blas = numba_cpu.codec_encoder.elu_causal_conv_offline(x, w32, b32, stride, "constant")
    assert got.shape == ref.shape == (1, O, -(-T // stride)) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    assert got.shape[-1] < 4 or not np.array_equal(got, blas)
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


@numba.njit(fastmath={"contract"})
def _expm1_as_the_block_does(x, out):
    for i in range(x.shape[0]):
        out[i] = numba_cpu.intrinsics._expm1_f32(x[i])


def test_float32_expm1_within_two_ulp():
    """The encoder block's float32 expm1 (for ELU's x <= 0, in plain arithmetic that vectorises): within 2 ulp
    of the exact value over 0 .. -110 (densely, around the switch at -0.5, tiny and subnormal values); -inf
    gives -1 and NaN stays NaN.  (NumPy's own float32 expm1 is within 2.2 ulp on the same points.)"""
    x = np.concatenate(
        [-np.linspace(0, 110, 1_000_001), -np.logspace(-45, 0, 20_001), [-0.5, -0.49999997, -0.50000006]]
    )
    x = x.astype(np.float32)
    got = np.empty_like(x)
    _expm1_as_the_block_does(x, got)
    exact = np.expm1(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= 2 * ulp)
    special = np.array([-np.inf, np.nan], np.float32)
    _expm1_as_the_block_does(special, out := np.empty(2, np.float32))
    assert out[0] == -1.0 and np.isnan(out[1])


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
        mp.setattr(numba_cpu.codec_encoder, "BLOCK_TILE_VALUES", piece * C)
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
        nan_ref = np.isnan(codec_encoder.resnet_block_offline(x_nan, *args32, dilation, "constant"))
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)


@pytest.mark.parametrize("I", [1024, 1040, 1001])
@pytest.mark.parametrize("shift", [0, 1, 4, 8])
def test_block_kernel_gives_the_same_bits_wherever_its_rows_start(I, shift):
    """The block kernel multiplies rows starting on 64-byte boundaries: x where its rows do (I a multiple of
    16 floats, the start aligned), else a copy whose rows do; its widened buffer always.  Any start of x
    (shifted by 4 to 32 bytes: the 16- and 32-byte starts of NumPy's and Numba's arrays) gives the bits of
    the aligned x, and those are within the bound of the float64 product."""
    rng = np.random.default_rng(I + shift)
    N, O = 29, 40
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    x = rng.standard_normal((N, I)).astype(np.float32)
    aligned = numba_cpu.intrinsics._line_aligned_rows(x)
    assert aligned.ctypes.data % 64 == 0 and aligned.strides[0] % 64 == 0
    np.testing.assert_array_equal(aligned[:, :I], x)
    store = np.empty(N * I + 64, np.float32)
    first = shift + (-store.ctypes.data // 4) % 16  # x's start: shift floats past a 64-byte boundary
    shifted = store[first : first + N * I].reshape(N, I)
    shifted[:] = x
    assert shifted.ctypes.data % 64 == 4 * shift
    expected = np.empty((N, O), np.float32)
    numba_cpu.linear._bf16_block_times(aligned[:, :I] if I % 16 == 0 else x, bits, expected, 2)
    got = np.empty((N, O), np.float32)
    numba_cpu.linear._bf16_block_times(shifted, bits, got, 2)
    np.testing.assert_array_equal(got, expected)
    wide = np.asarray(BF16Matrix(bits), dtype=np.float64)
    exact, abs_sum = x.astype(np.float64) @ wide.T, np.abs(x.astype(np.float64)) @ np.abs(wide).T
    assert np.all(np.abs(got - exact) <= 2 * (I + 1) * np.finfo(np.float32).eps * abs_sum)
    assert numba_cpu.intrinsics._line_aligned_empty(3, 5).ctypes.data % 64 == 0


@settings(max_examples=40, deadline=None)
@given(
    shape=st.sampled_from(((2,), (3,), (1, 2), (2, 4), (8,), (1, 1), (9,), (1, 3, 3))),
    O=st.integers(1, 70),
    I=st.integers(1, 70),
    with_bias=st.booleans(),
    n_threads=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_float32_linear_of_a_few_rows_reads_each_weight_row_once(shape, O, I, with_bias, n_threads, seed):
    """Float32 weights and 2 to 8 rows of x (a big weight: here every size): each output within the bound of
    a sum of I products of the reference's; 1 row or more than 8 stay BLAS's (the reference, bit for bit)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape, I)).astype(np.float32)
    w = rng.standard_normal((O, I)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if with_bias else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.linear, "F32_FEW_ROWS_MIN_BYTES", 0)
        mp.setattr(numba_cpu.linear, "_piece_threads", lambda: n_threads)
        got = numba_cpu.linear.linear(x, w, b)
        few = numba_cpu.linear._few_rows_f32(x, w, b)
    ref = nn.linear.reference(x, w, b)
    assert got.shape == ref.shape and got.dtype == np.float32
    if not 2 <= int(np.prod(shape)) <= 8:
        assert few is None and np.array_equal(got, ref)
        return
    assert few is not None
    bound = (
        2
        * (I + 1)
        * np.finfo(np.float32).eps
        * (np.abs(x).astype(np.float64) @ np.abs(w).T + (np.abs(b) if with_bias else 0))
    )
    assert np.all(
        np.abs(got.astype(np.float64) - (x.astype(np.float64) @ w.T.astype(np.float64) + (b if with_bias else 0)))
        <= bound
    )
    if O > 1 and I > 1:
        assert numba_cpu.linear._few_rows_f32(x, np.asfortranarray(w), b) is None  # (a layout it has no kernel for)


def test_linear_twin_edge_shapes():
    """No rows (an empty time axis), one weight row, one input channel: the kernel and the BLAS path agree
    with the reference on shapes and values."""
    rng = np.random.default_rng(5)
    for O, I, rows in ((3, 5, (0,)), (1, 7, (2,)), (4, 1, (20,)), (1, 1, (17,)), (5, 2, (66,)), (2, 3, (1, 0, 3))):
        w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32)))
        x = rng.standard_normal(rows + (I,)).astype(np.float32)
        got, ref = numba_cpu.linear.linear(x, w), nn.linear.reference(x, np.asarray(w))
        assert got.shape == ref.shape == rows + (O,)
        abs_sum = np.abs(x.astype(np.float64)) @ np.abs(np.asarray(w, dtype=np.float64)).T
        assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (I + 1) * np.finfo(np.float32).eps * abs_sum)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), O=st.integers(1, 70), I=st.integers(1, 300))
def test_matvec_kernel_of_the_fused_step_is_the_linear_kernel(seed, O, I):
    """The one-row matrix-vector kernel of decoder_layer_step and of linear's single rows (one parallel loop
    per matrix, rows prefetched ahead, widths that are and are not a multiple of the vector length) gives
    the bits of linear's kernel for a few rows, row by row (a row's output does not depend on the rows
    beside it), and so stays within the reduction-length bound of the float64 product of the same bf16
    weights."""
    rng = np.random.default_rng(seed)
    bits = float32_to_bf16_bits(rng.standard_normal((O, I)).astype(np.float32))
    x = rng.standard_normal(I).astype(np.float32)
    out = np.full(O, np.nan, np.float32)
    numba_cpu.linear._matvec_bf16_into(x, bits, out)
    np.testing.assert_array_equal(out, numba_cpu.linear.linear(x[None], BF16Matrix(bits))[0])
    rows = np.stack([x, rng.standard_normal(I).astype(np.float32)])
    few = np.full((2, O), np.nan, np.float32)
    numba_cpu.linear._bf16_rows_times(rows, bits, few)
    np.testing.assert_array_equal(out, few[0])
    np.testing.assert_array_equal(few, numba_cpu.linear.linear(rows, BF16Matrix(bits)))
    w = np.asarray(BF16Matrix(bits), np.float64)
    x64 = x.astype(np.float64)
    assert np.all(np.abs(out - w @ x64) <= (I + 1) * np.finfo(np.float32).eps * (np.abs(w) @ np.abs(x64)))


@pytest.mark.parametrize("n", [0, 1, 40, 200])
@pytest.mark.parametrize("T", [1, 2, 28])
def test_attention_of_the_new_positions_is_the_softmax_formula(n, T):
    """The fused step's attention (``_attend_new_positions``: 16 heads of 128 over 8 key groups, the sizes of
    the 0.6B Talker) for T new positions after n cached ones: softmax(q k^T / sqrt(D)) v over the keys up
    to each position's own, ``nn.attention`` (the reference) in float32 and in float64; the kernel within
    twice the float32 composition's distance from the float64 one, plus the float32 rounding of the longer
    reduction at the output's scale.  The cache's rows past n + T hold NaN: a read past a position's keys
    would show."""
    H, G, D = 16, 8, 128
    rng = np.random.default_rng(n + 100 * T)
    q = rng.standard_normal((T, H * D)).astype(np.float32)
    k = np.full((G, n + T + 9, D), np.nan, np.float32)
    v = np.full((G, n + T + 9, D), np.nan, np.float32)
    k[:, : n + T] = rng.standard_normal((G, n + T, D))
    v[:, : n + T] = rng.standard_normal((G, n + T, D))
    out = np.full((T, H * D), np.nan, np.float32)
    numba_cpu.attention._attend_new_positions(q, k, v, n, out)
    allowed = nn.AttentionMask(nn.arange(n, n + T), nn.arange(n + T))

    def formula(dtype):  # nn.attention itself: [1, H, T, D] queries over [1, G, n + T, D] keys and values
        q_bhtd = q.reshape(T, H, D).transpose(1, 0, 2)[None].astype(dtype)
        k_bgsd, v_bgsd = (a[None, :, : n + T].astype(dtype) for a in (k, v))
        y_bhtd = nn.attention.reference(q_bhtd, k_bgsd, v_bgsd, allowed, D**-0.5)
        return y_bhtd[0].transpose(1, 0, 2).reshape(T, H * D).astype(np.float64)

    exact, composition = formula(np.float64), formula(np.float32)
    floor = 2 * max(D, n + T) * np.finfo(np.float32).eps * np.max(np.abs(exact))
    assert np.max(np.abs(out - exact)) <= 2 * np.max(np.abs(composition - exact)) + floor


def random_qwen3_layer(rng, C, H, G, D, F, dtype):
    """One Qwen3 layer's weights (bf16-rounded matrices as BF16Matrix for float32, their exact float64
    values for float64) in a WeightView, and its config."""
    import types

    from refimpl.io.checkpoint import WeightView

    spec = transformer.qwen3_layer_weight_spec("", C, F, H, G, D, bias=False)
    weights = {}
    for ws in spec:
        w = (rng.standard_normal(ws.shape) * (1.0 if ws.init == "norm" else ws.shape[-1] ** -0.5)).astype(np.float32)
        if len(ws.shape) == 2:
            bits = float32_to_bf16_bits(w)
            weights[ws.name] = BF16Matrix(bits) if dtype == np.float32 else np.asarray(BF16Matrix(bits), np.float64)
        else:
            weights[ws.name] = (1 + 0.1 * w if ws.init == "norm" else w).astype(dtype)
    cfg = types.SimpleNamespace(num_attention_heads=H, num_key_value_heads=G, head_dim=D)
    return WeightView(weights), cfg


@pytest.mark.parametrize("n_cached", [0, 1, 16, 40])
@pytest.mark.parametrize("T", [1, 2, 5, 17, 30])  # 17 and 30: a prompt's positions, by the block kernel
@pytest.mark.parametrize("seed", [0, 1])
def test_decoder_layer_step_twin_equals_the_layer(n_cached, T, seed):
    """The fused layer for T new positions (bf16 words) against the composition transformer_layer, both in float32,
    each measured against the same layer in float64 (the exact values of the same bf16 weights): the twin
    may be off by no more than twice the float32 composition, plus a floor of the float32 rounding of the
    longest reduction (the MLP's, F terms) at the output's scale.  The new keys and values land in the
    cache like cache.append's, and the length grows by T."""
    C, H, G, D, F = 48, 4, 2, 16, 96
    eps = 1e-6
    out = {}
    for dtype in (np.float32, np.float64):
        lw, cfg = random_qwen3_layer(np.random.default_rng(seed), C, H, G, D, F, dtype)
        x = np.random.default_rng(seed + 7).standard_normal((1, T, C)).astype(dtype)
        cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, dtype)
        past = np.random.default_rng(seed + 9).standard_normal((2, 1, G, n_cached, D)).astype(dtype)
        for kind in ("twin", "reference") if dtype == np.float32 else ("reference",):
            cache = transformer.KVCache(1, G, D, dtype, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            step = (
                numba_cpu.transformer.decoder_layer_step if kind == "twin" else transformer.decoder_layer_step.reference
            )
            with kernels.use_backend("numpy"):
                y = step(x, lw, cfg, cos[None], sin[None], cache, eps)
            assert y.shape == (1, T, C) and y.dtype == dtype and cache.length == n_cached + T
            out[kind, np.dtype(dtype).name] = (
                y,
                cache.k[:, :, : n_cached + T].copy(),
                cache.v[:, :, : n_cached + T].copy(),
            )
    exact = [a.astype(np.float64) for a in out["reference", "float64"]]
    for i, what in enumerate(("output", "keys", "values")):
        twin = out["twin", "float32"][i].astype(np.float64)
        composition = out["reference", "float32"][i].astype(np.float64)
        floor = 2 * F * np.finfo(np.float32).eps * np.max(np.abs(exact[i]))
        assert np.max(np.abs(twin - exact[i])) <= 2 * np.max(np.abs(composition - exact[i])) + floor, what


@pytest.mark.parametrize("n_cached", [0, 7])
@pytest.mark.parametrize("T", [1, 2, 5, 17, 30])
def test_fused_layer_for_the_last_position_alone_keeps_its_bits(n_cached, T):
    """``last_only``: the fused layer's output at the last position, computed for it alone past the keys
    and values, has the bits of the full layer's last row (the kernel is chosen by the layer's T), and the
    cache holds the same keys and values; the reference returns its full output's last row."""
    C, H, G, D, F = 48, 4, 2, 16, 96
    lw, cfg = random_qwen3_layer(np.random.default_rng(T), C, H, G, D, F, np.float32)
    x = np.random.default_rng(T + 1).standard_normal((1, T, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, np.float32)
    past = np.random.default_rng(T + 2).standard_normal((2, 1, G, n_cached, D)).astype(np.float32)
    out = {}
    for kind, step in (
        ("twin", numba_cpu.transformer.decoder_layer_step),
        ("reference", transformer.decoder_layer_step.reference),
    ):
        for last_only in (False, True):
            cache = transformer.KVCache(1, G, D, np.float32, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            with kernels.use_backend("numpy"):
                y = step(x, lw, cfg, cos[None], sin[None], cache, 1e-6, last_only)
            out[kind, last_only] = (y, cache.k[:, :, : n_cached + T].copy(), cache.v[:, :, : n_cached + T].copy())
    for kind in ("twin", "reference"):
        full, last = out[kind, False], out[kind, True]
        assert last[0].shape == (1, 1, C)
        np.testing.assert_array_equal(last[0], full[0][:, -1:])
        np.testing.assert_array_equal(last[1], full[1])
        np.testing.assert_array_equal(last[2], full[2])


def test_the_stack_returns_the_last_position_alone_with_the_same_bits():
    """transformer_stack(..., last_only=True): the full stack's last row, bit for bit, on the fused path (a
    28-position prompt of two layers) and on the layer by layer path (a recorder given), the caches alike."""
    from refimpl.recorder import Recorder

    C, H, G, D, F = 32, 4, 2, 8, 64
    lw, cfg = random_qwen3_layer(np.random.default_rng(5), C, H, G, D, F, np.float32)
    x = np.random.default_rng(6).standard_normal((1, 28, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(nn.arange(0, 28), D, 10000.0, np.float32)
    mask = nn.AttentionMask(nn.arange(0, 28), nn.arange(28))
    for record in (Recorder(None), Recorder({})):
        outs = {}
        for last_only in (False, True):
            caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in range(2)]
            with kernels.use_backend("numba"):
                y = transformer.transformer_stack(
                    [lw, lw], transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches, 1e-6, record, last_only
                )
            outs[last_only] = (y, [c.k[:, :, :28].copy() for c in caches])
        assert outs[True][0].shape == (1, 1, C)
        np.testing.assert_array_equal(outs[True][0], outs[False][0][:, -1:])
        for a, b in zip(outs[True][1], outs[False][1]):
            np.testing.assert_array_equal(a, b)


def test_the_stack_takes_the_fused_step_only_where_it_fits():
    """transformer_stack runs decoder_stack_step (the layers fused, one call for the stack) for up to 64 new
    positions of one row with bf16 layers and plain caches, nothing recorded; a longer prompt (65 positions),
    a recorder or float32 matrices take the layer by layer path.  Over a prompt, a 30-position continuation,
    a 2-position step and two 1-position steps the two paths give the same values (float32 bound)."""
    from refimpl.recorder import Recorder

    rng = np.random.default_rng(3)
    C, H, G, D, F = 32, 4, 2, 8, 64
    lw, cfg = random_qwen3_layer(rng, C, H, G, D, F, np.float32)
    layers = [lw, lw]
    calls = []
    fused = numba_cpu.transformer.decoder_stack_step

    def counting(*args):
        calls.append(1)
        return fused(*args)

    results = {}
    for path in ("fused", "layer by layer"):
        caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        many = transformer.STEP_MAX_POSITIONS + 1
        xs = np.random.default_rng(4).standard_normal((1, many + 34, C)).astype(np.float32)
        outs = []
        for start, stop in (
            (0, many),
            (many, many + 30),
            (many + 30, many + 32),
            (many + 32, many + 33),
            (many + 33, many + 34),
        ):
            pos = nn.arange(start, stop)
            cos, sin = nn.rope_cos_sin(pos, D, 10000.0, np.float32)
            mask = nn.AttentionMask(pos, nn.arange(stop))
            record = Recorder({}) if path == "layer by layer" else Recorder(None)
            table = kernels.REGISTRY["numba"].twins  # the table the registry reads (numba_cpu.TWINS)
            table["decoder_stack_step"] = counting
            try:
                with kernels.use_backend("numba"):
                    outs.append(
                        transformer.transformer_stack(
                            layers,
                            transformer.QWEN3,
                            cfg,
                            xs[:, start:stop],
                            cos[None],
                            sin[None],
                            mask,
                            caches,
                            1e-6,
                            record,
                        )
                    )
            finally:
                table["decoder_stack_step"] = fused
        results[path] = np.concatenate(outs, axis=1)
        assert len(calls) == 4  # the four steps, not the 65-position prompt; unchanged with a recorder given
    np.testing.assert_allclose(results["fused"], results["layer by layer"], rtol=1e-4, atol=1e-5)


def test_several_new_positions_take_the_fused_step_only_in_the_cache_order():
    """Two new positions are fused where they are the cache's next two and see the keys causally; queries at
    other positions (a mask not the cache's order), caches of different lengths, two rows or more than
    STEP_MAX_POSITIONS positions take the layer by layer path."""
    from refimpl.recorder import Recorder

    lw, _ = random_qwen3_layer(np.random.default_rng(0), 16, 2, 1, 8, 32, np.float32)
    caches = [transformer.KVCache(1, 1, 8, np.float32, capacity=8) for _ in range(2)]
    for c in caches:
        c.append(*np.zeros((2, 1, 1, 3, 8), np.float32))
    fits = lambda x, mask, cs=caches: transformer._fused_step_fits(  # noqa: E731
        [lw, lw], transformer.QWEN3, x, mask, cs, Recorder(None)
    )
    two = np.zeros((1, 2, 16), np.float32)
    assert fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(5)))
    assert not fits(two, nn.AttentionMask(nn.arange(4, 6), nn.arange(6)))  # not the cache's next positions
    assert not fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(1, 6)))  # keys not the cache's
    uneven = [caches[0], transformer.KVCache(1, 1, 8, np.float32, capacity=8)]
    assert not fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(5)), uneven)
    assert not fits(np.zeros((2, 2, 16), np.float32), nn.AttentionMask(nn.arange(3, 5), nn.arange(5)))
    many = transformer.STEP_MAX_POSITIONS + 1
    assert not fits(np.zeros((1, many, 16), np.float32), nn.AttentionMask(nn.arange(3, 3 + many), nn.arange(3 + many)))


def test_float32_exp_of_the_fused_silu_is_within_one_ulp():
    """The fused layer's exp (``_exp_f32``, plain arithmetic that vectorises): within 1 ulp of the exact exp
    over the normal range and beyond it where its result is subnormal, NumPy's value at the edges (inf, 0,
    NaN); the SiLU it serves within a few ulps of the reference's (``nn.silu``)."""
    x = np.concatenate([np.linspace(-103.0, 88.72, 200_001), np.random.default_rng(0).uniform(-87, 88, 100_000)])
    x = x.astype(np.float32)
    got = np.array([numba_cpu.intrinsics._exp_f32(v) for v in x[::50]], np.float32)
    exact = np.exp(x[::50].astype(np.float64))
    spacing = np.spacing(np.maximum(exact, np.finfo(np.float32).smallest_subnormal).astype(np.float32))
    assert np.all(np.abs(got - exact) <= spacing.astype(np.float64))
    edges = np.array([np.nan, np.inf, -np.inf, 88.7229, 89.0, -104.0, -200.0, 0.0, -0.0], np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal([numba_cpu.intrinsics._exp_f32(v) for v in edges], np.exp(edges))
    gate = (4 * np.random.default_rng(1).standard_normal((3, 500))).astype(np.float32)
    act = np.random.default_rng(2).standard_normal((3, 500)).astype(np.float32)
    with kernels.use_backend("numpy"):
        ref = nn.silu.reference(gate) * act
    numba_cpu.transformer._silu_times_into(gate, act)
    assert np.all(np.abs(act - ref) <= 4 * np.finfo(np.float32).eps * np.abs(ref) + np.finfo(np.float32).tiny)


def test_bf16_matrix_widens_exactly_where_used():
    bits = float32_to_bf16_bits(np.array([[1.5, -2.0, 3.140625], [0.0, 1e-3, 65280.0]], np.float32))
    m = BF16Matrix(bits)
    wide = np.asarray(m)
    assert wide.dtype == np.float32 and wide.tolist() == [[1.5, -2.0, 3.140625], [0.0, wide[1, 1], 65280.0]]
    np.testing.assert_array_equal(m[[1, 0]], wide[[1, 0]])
    np.testing.assert_array_equal(m.T, wide.T)
    assert m.astype(np.float32, copy=False) is m
    x = np.array([[0.5, 2.0, -1.0]], np.float32)
    np.testing.assert_array_equal(nn.linear.reference(x, m), x @ wide.T)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from((1.0, 0.5, 2.0)), st.integers(0, 2**31))
def test_elu_twin_is_bit_identical(dtype, alpha, seed):
    x = (10 * np.random.default_rng(seed).standard_normal((3, 50))).astype(dtype)
    x[0, :3] = (0.0, -0.0, 100.0)
    np.testing.assert_array_equal(numba_cpu.elementwise.elu(x, alpha), nn.elu.reference(x, alpha))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.elementwise, "ELEMENTWISE_PIECE", 7)  # 22 pieces, the last one short
        np.testing.assert_array_equal(numba_cpu.elementwise.elu(x, alpha), nn.elu.reference(x, alpha))


def test_gelu_erf_twin_in_float64_is_bit_identical():
    x = 4 * np.random.default_rng(0).standard_normal((3, 50))
    x[0, :4] = (0.0, -0.0, 30.0, -30.0)
    np.testing.assert_array_equal(numba_cpu.elementwise.gelu_erf(x), nn.gelu_erf.reference(x))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.elementwise, "ELEMENTWISE_PIECE", 7)  # 22 pieces, the last one short
        np.testing.assert_array_equal(numba_cpu.elementwise.gelu_erf(x), nn.gelu_erf.reference(x))


def test_gelu_erf_twin_in_float32_differs_from_the_reference_only_by_one_step_of_erf():
    """The float32 twin computes erf by its polynomial (4e-13 from the float64 erf, rounded): on 4 million
    values (every 8e-6 from -8 to 8, 2 million normal draws of scale 3, and the specials) it gives the
    reference's bits but for a handful, where SciPy's float32 erf is one step off the rounded value, so
    1 + erf is at most one step of 2^-23 off, and the GELU 0.5 |x| times that, plus its own rounding."""
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, 30.0, -30.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan, 5.5, -5.5], np.float32)
    x = np.concatenate(
        [
            np.linspace(-8, 8, 2_000_001, dtype=np.float32),
            (3 * rng.standard_normal(2_000_000)).astype(np.float32),
            specials,
        ]
    )
    with np.errstate(invalid="ignore"):  # -inf: 0.5 * x * (1 + erf) = -inf * 0 = NaN, on both sides
        ref = nn.gelu_erf.reference(x)
    got = numba_cpu.elementwise.gelu_erf(x)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    assert got.dtype == np.float32 and np.count_nonzero(~same) <= 40  # measured: 9
    bound = 0.5 * np.abs(x[~same]) * 2.0**-23 + np.spacing(np.abs(ref[~same]))  # 1 + erf: a step of 2^-23
    assert np.all(np.abs(got[~same].astype(np.float64) - ref[~same]) <= bound)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.elementwise, "ELEMENTWISE_PIECE", 7)  # pieces, the last one short: the same values
        np.testing.assert_array_equal(numba_cpu.elementwise.gelu_erf(x[-300:]), got[-300:])


# ----------------------------------------------------------------------------- the switch


def _calls(monkeypatch):
    """Record which implementation of conv1d runs."""
    seen = []
    monkeypatch.setitem(
        kernels.REGISTRY["numba"].twins, "conv1d", lambda *a, **k: seen.append("twin") or numba_cpu.conv.conv1d(*a, **k)
    )
    return seen


def test_auto_uses_twins_for_float32_and_the_reference_for_float64(monkeypatch):
    monkeypatch.delenv("REFIMPL_BACKEND", raising=False)
    seen = _calls(monkeypatch)
    w = np.ones((1, 1, 1))
    assert kernels.active_backend()[0] == "auto"
    nn.conv1d(np.ones((1, 1, 4), np.float64), w)
    assert seen == []
    nn.conv1d(np.ones((1, 1, 4), np.float32), w.astype(np.float32))
    assert seen == ["twin"]
    for dtype, chosen in ((np.complex64, "numba"), (np.complex128, "numpy"), (np.float64, "numpy")):
        assert kernels.backend_for_call("auto", np.ones(2, dtype)) == chosen  # (a float32 spectrum: the twins)


def test_use_backend_and_the_environment_choose(monkeypatch):
    seen = _calls(monkeypatch)
    x, w = np.ones((1, 1, 4), np.float32), np.ones((1, 1, 1), np.float32)
    with kernels.use_backend("numpy"):
        assert kernels.active_backend() == ("numpy", "refimpl.use_backend()")
        nn.conv1d(x, w)
    assert seen == []
    monkeypatch.setenv("REFIMPL_BACKEND", "numba")
    assert kernels.active_backend()[0] == "numba"
    nn.conv1d(x.astype(np.float64), w.astype(np.float64))  # an explicit backend serves float64 too
    assert seen == ["twin"]
    with kernels.use_backend("numpy"):  # the context manager wins over the environment
        nn.conv1d(x, w)
    assert seen == ["twin"]


def test_unknown_backends_are_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'cuda'.*numpy, numba"):
        with kernels.use_backend("cuda"):
            pass
    monkeypatch.setenv("REFIMPL_BACKEND", "fast")
    with pytest.raises(ValueError, match="REFIMPL_BACKEND: unknown backend 'fast'"):
        nn.silu(np.zeros(3))


# ----------------------------------------------------------------------------- compiled-kernel cache


def test_cache_dir_falls_back_to_a_writable_place(monkeypatch, tmp_path):
    """A read-only package directory sends the compiled kernels to the user cache, else to a temp dir."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    package_cache = Path(numba_cpu.__file__).resolve().parent / "__pycache__"
    monkeypatch.setattr(numba_cpu.runtime, "_writable", lambda d: Path(d) != package_cache)
    numba_cpu.runtime._choose_cache_dir()
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "xdg" / "refimpl" / "numba")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setattr(numba_cpu.runtime, "_writable", lambda d: False)
    numba_cpu.runtime._choose_cache_dir()
    assert Path(os.environ["NUMBA_CACHE_DIR"]).name.startswith("refimpl-numba-")


def test_a_second_process_loads_the_kernels_instead_of_compiling(tmp_path):
    """cache=True: the first process compiles and saves, the next one only loads (NUMBA_DEBUG_CACHE)."""
    code = (
        "import numpy as np; from refimpl.backends import numba_cpu as k; "
        "from refimpl.backends.bf16 import BF16Matrix; "
        "k.elementwise.snake_beta(np.ones((1, 2, 8), np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)); "
        "k.linear.linear(np.ones((1, 4), np.float32), BF16Matrix(np.zeros((3, 4), np.uint16)))"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1", PYTHONPATH=str(REPO))
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert "data saved to" in runs[0].stdout
    assert "data saved to" not in runs[1].stdout and "data loaded from" in runs[1].stdout


def test_the_kernels_cache_entries_are_keyed_by_the_whole_package(tmp_path):
    """A compiled kernel holds the code of the kernels it calls from the package's other modules: its cache
    entries are keyed by all of the package's source files (an edited intrinsic compiles again the kernels
    that inline it); any other code's by its own file, as Numba keys it."""
    from numba.core import caching

    kernel = numba_cpu.conv._stack_taps_into
    stamp = caching.InTreeCacheLocator(kernel.py_func, numba_cpu.conv.__file__).get_source_stamp()
    assert stamp == numba_cpu.runtime._package_stamp()
    other = tmp_path / "other.py"
    other.write_text("def f():\n    return 1\n")
    locator = caching.InTreeCacheLocator(kernel.py_func, str(other))
    before = locator.get_source_stamp()
    other.write_text("def f():\n    return 10\n")
    assert before != locator.get_source_stamp() != stamp


@pytest.mark.skipif(
    "+avx512f" not in numba_cpu.runtime._compile_features(), reason="a processor without 512-bit vectors"
)
def test_a_program_importing_numba_first_still_gets_512_bit_vectors(tmp_path):
    """Numba reads the CPU features when it is imported: a program that imports it before refimpl's backend
    compiles with 512-bit vectors all the same (the backend has Numba read its configuration again), its
    own kernels included; without the backend, LLVM's default prefers 256-bit ones on most of these
    processors (on this VM's Xeon: ymm only)."""
    code = (
        "import sys, numba, numpy as np\n"
        "if sys.argv[1] == 'refimpl':\n"
        "    from refimpl.backends import numba_cpu\n"
        "@numba.njit(fastmath=True)\n"
        "def squares(a):\n"
        "    s = np.float32(0)\n"
        "    for i in range(a.size):\n"
        "        s += a[i] * a[i]\n"
        "    return s\n"
        "squares(np.ones(64, np.float32))\n"
        "print('zmm' in next(iter(squares.inspect_asm().values())))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", code, "refimpl"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True"]


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 2),
    C=st.integers(1, 9),
    O=st.integers(1, 9),
    K=st.sampled_from((1, 2, 3, 5)),
    dilation=st.integers(1, 4),
    extra=st.integers(0, 40),
    seed=st.integers(0, 2**31),
)
def test_tdnn_twin_reads_the_reflected_taps_of_the_reference(B, C, O, K, dilation, extra, seed):
    """The speaker encoder's TDNN without its padded copy: taps mirrored at both edges (from the fewest frames
    the padding allows), one product, bias and ReLU: within the bound of two sums of the same I * K terms;
    a NaN frame spoils the same outputs on both sides."""
    rng = np.random.default_rng(seed)
    left, right = speaker_encoder.same_padding(K, dilation)
    T = max(left, right) + 1 + extra
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    w = rng.standard_normal((O, C, K)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    ref = speaker_encoder.tdnn_offline.reference(x, w, b, dilation)
    got = numba_cpu.speaker_encoder.tdnn_offline(x, w, b, dilation)
    assert got.shape == ref.shape == (B, O, T) and got.dtype == np.float32
    padded = np.pad(np.abs(x).astype(np.float64), ((0, 0), (0, 0), (left, right)), mode="reflect")
    abs_sum = nn.conv1d.reference(padded, np.abs(w).astype(np.float64), np.abs(b).astype(np.float64), dilation=dilation)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)
    x[0, 0, T // 2] = np.nan
    nan_ref = np.isnan(speaker_encoder.tdnn_offline.reference(x, w, b, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.tdnn_offline(x, w, b, dilation)), nan_ref)
    assert nan_ref.any()


def test_tdnn_twin_leaves_what_it_has_no_kernel_for_to_the_reference():
    x = np.zeros((1, 3, 2), np.float32)
    w = np.zeros((2, 3, 5), np.float32)
    assert (
        numba_cpu.speaker_encoder.tdnn_offline(x, w, np.zeros(2, np.float32), 1) is NotImplemented
    )  # 2 frames, a padding of 2
    assert (
        numba_cpu.speaker_encoder.tdnn_offline(x.astype(np.float64), w.astype(np.float64), np.zeros(2), 1)
        is NotImplemented
    )
    with pytest.raises(ValueError, match="too few for a reflect padding"):
        speaker_encoder.tdnn_offline(x, w, np.zeros(2, np.float32), 1)  # the reference's error


def bf16_values(rng, shape):
    """Random float32 numbers that are bfloat16 values (their low 16 bits zero), as widened at load."""
    return bf16_bits_to_float32(float32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32)))


@needs_tiles
@pytest.mark.parametrize(
    "O, C, K, dilation, T", [(256, 32, 1, 1, 33), (256, 64, 3, 2, 150), (288, 384, 3, 1, 300), (256, 128, 5, 1, 129)]
)
def test_tdnn_on_the_tiles_is_the_tile_kernel_of_its_stacked_taps(O, C, K, dilation, T, monkeypatch):
    """A TDNN with bf16 weights and at least ``TILE_TDNN_MIN_OUT`` outputs runs on the tiles: its taps
    mirrored at both edges read in place and split in blocks of ``TILE_TDNN_STEPS`` steps (one pair of
    tiles, several blocks, a last block of one step, 1152 > ``TILE_K_CHUNK`` columns), bias and ReLU in the
    same pass: the same bits as the prompt's tile kernel on the reflect-padded, stacked rows, then bias and
    ReLU; within the bound of two sums of the same I K terms; not the BLAS path's bits (the tiles ran); a
    NaN frame spoils the same outputs as in the reference."""
    rng = np.random.default_rng(O + C + K + T)
    x = rng.standard_normal((1, C, T)).astype(np.float32)
    w = bf16_values(rng, (O, C, K))
    w.flags.writeable = False
    b = rng.standard_normal(O).astype(np.float32)
    got = numba_cpu.speaker_encoder.tdnn_offline(x, w, b, dilation)
    left, right = speaker_encoder.same_padding(K, dilation)
    padded = np.pad(x[0], ((0, 0), (left, right)), mode="reflect")
    stacked = np.stack([padded[:, k * dilation : k * dilation + T] for k in range(K)], axis=1)  # [C, K, T]
    rows = np.ascontiguousarray(stacked.reshape(C * K, T).T)
    sums = np.empty((T, O), np.float32)
    numba_cpu.amx._tile_bf16_times(rows, float32_to_bf16_bits(w.reshape(O, C * K)), sums, 2)
    with_bias = sums.T + b[:, None]
    np.testing.assert_array_equal(got[0], np.where(with_bias <= 0, np.float32(0), with_bias))
    ref = speaker_encoder.tdnn_offline.reference(x, w, b, dilation)
    abs_sum = np.abs(w.reshape(O, C * K)).astype(np.float64) @ np.abs(rows.T) + np.abs(b)[:, None]
    assert np.all(np.abs(got[0].astype(np.float64) - ref[0]) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)
    monkeypatch.setattr(numba_cpu.amx, "USE_TILES", False)
    assert not np.array_equal(numba_cpu.speaker_encoder.tdnn_offline(x, w, b, dilation), got)
    monkeypatch.setattr(numba_cpu.amx, "USE_TILES", True)
    x[0, 0, T // 2] = np.nan
    nan_ref = np.isnan(speaker_encoder.tdnn_offline.reference(x, w, b, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.tdnn_offline(x, w, b, dilation)), nan_ref)
    assert nan_ref.any()


@needs_tiles
def test_one_by_one_conv_with_bf16_weights_on_the_tiles(monkeypatch):
    """A 1x1 conv with bf16 weights and at least ``TILE_TDNN_MIN_OUT`` outputs (the speaker encoder's pooling
    conv, 128 -> 1536) runs on the tiles, for each item of a batch, with and without a bias: the same bits as
    the prompt's tile kernel (plus the bias), no ReLU (negative outputs kept), within the reduction bound of
    the reference; not the BLAS path's bits (the tiles ran)."""
    rng = np.random.default_rng(3)
    B, I, O, T = 2, 128, 256, 70
    x = rng.standard_normal((B, I, T)).astype(np.float32)
    w = bf16_values(rng, (O, I, 1))
    w.flags.writeable = False
    for bias in (rng.standard_normal(O).astype(np.float32), None):
        got = numba_cpu.conv.conv1d(x, w, bias)
        assert got.shape == (B, O, T) and (got < 0).any()
        for i in range(B):
            sums = np.empty((T, O), np.float32)
            numba_cpu.amx._tile_bf16_times(np.ascontiguousarray(x[i].T), float32_to_bf16_bits(w[:, :, 0]), sums, 2)
            np.testing.assert_array_equal(got[i], sums.T if bias is None else sums.T + bias[:, None])
        ref = nn.conv1d.reference(x, w, bias)
        abs_sum = np.abs(w[:, :, 0]).astype(np.float64) @ np.abs(x.astype(np.float64)) + (
            0 if bias is None else np.abs(bias)[:, None]
        )
        assert np.all(np.abs(got - ref) <= 2 * (I + 1) * np.finfo(np.float32).eps * abs_sum)
        monkeypatch.setattr(numba_cpu.amx, "USE_TILES", False)
        assert not np.array_equal(numba_cpu.conv.conv1d(x, w, bias), got)
        monkeypatch.setattr(numba_cpu.amx, "USE_TILES", True)


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


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    groups=st.integers(2, 8),
    width=st.integers(1, 6),
    K=st.sampled_from((1, 3, 5)),
    dilation=st.integers(1, 4),
    extra=st.integers(0, 40),
    seed=st.integers(0, 2**31),
)
def test_res2net_twin_writes_each_group_where_the_reference_concatenates_it(B, groups, width, K, dilation, extra, seed):
    """The speaker encoder's Res2Net in one call: group 0 passed through bit for bit, each later group's TDNN
    (on its channels plus the previous group's output) within float32 noise of the plain NumPy formula, and
    the same bits as the TDNN twin applied group by group (the products are the same calls); a NaN spoils
    the same outputs on both sides."""
    rng = np.random.default_rng(seed)
    T = max(speaker_encoder.same_padding(K, dilation)) + 1 + extra  # from the fewest frames the padding allows
    x = rng.standard_normal((B, groups * width, T)).astype(np.float32)
    ws = tuple(
        (rng.standard_normal((width, width, K)) / np.sqrt(width * K)).astype(np.float32) for _ in range(groups - 1)
    )
    bs = tuple(rng.standard_normal(width).astype(np.float32) for _ in range(groups - 1))
    got = numba_cpu.speaker_encoder.res2net_offline(x, ws, bs, dilation)
    with kernels.use_backend("numpy"):
        ref = speaker_encoder.res2net_offline.reference(x, ws, bs, dilation)
    exact = speaker_encoder.res2net_offline.reference(
        x.astype(np.float64), tuple(w.astype(np.float64) for w in ws), tuple(b.astype(np.float64) for b in bs), dilation
    )
    assert got.shape == ref.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got[:, :width], x[:, :width])
    assert within_float32_noise(got, ref, exact)
    group_by_group = [x[:, :width]]
    for j in range(1, groups):
        inp = x[:, j * width : (j + 1) * width] + (group_by_group[-1] if j > 1 else 0)
        group_by_group.append(numba_cpu.speaker_encoder.tdnn_offline(inp, ws[j - 1], bs[j - 1], dilation))
    np.testing.assert_array_equal(got, np.concatenate(group_by_group, axis=1))
    x[0, width, T // 2] = np.nan  # in group 1: it spoils every later group through the cascade
    with kernels.use_backend("numpy"):
        nan_ref = np.isnan(speaker_encoder.res2net_offline.reference(x, ws, bs, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.res2net_offline(x, ws, bs, dilation)), nan_ref)
    assert nan_ref.any()


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    C=st.integers(1, 40),
    T=st.integers(1, 300),
    scale=st.sampled_from((0.1, 3.0, 30.0)),
    seed=st.integers(0, 2**31),
)
def test_pooling_statistics_from_logits_never_make_the_weights(B, C, T, scale, seed):
    """The attentive pooling's mean and std from its logits in one pass (the softmax's weights folded into
    the sums): within float32 noise of mean_and_std(x, softmax(logits)) in NumPy, for flat and peaked
    softmaxes; a NaN logit or sample spoils its own row's statistics only; a constant row's std is sqrt(eps)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, T)).astype(np.float32)
    logits = (scale * rng.standard_normal((B, C, T))).astype(np.float32)
    got = numba_cpu.speaker_encoder.softmax_mean_and_std(x, logits)
    with kernels.use_backend("numpy"):
        ref = speaker_encoder.softmax_mean_and_std.reference(x, logits)
    exact = speaker_encoder.softmax_mean_and_std.reference(x.astype(np.float64), logits.astype(np.float64))
    for g, r, e in zip(got, ref, exact):
        assert g.shape == (B, C) and g.dtype == np.float32 and within_float32_noise(g, r, e)
    x[0, 0, T // 2], logits[-1, -1, 0] = np.nan, np.nan
    nan_rows = np.zeros((B, C), bool)
    nan_rows[0, 0] = nan_rows[-1, -1] = True
    for g in numba_cpu.speaker_encoder.softmax_mean_and_std(x, logits):
        np.testing.assert_array_equal(np.isnan(g), nan_rows)
    constant = np.full((1, 1, T), 0.5, np.float32)
    assert numba_cpu.speaker_encoder.softmax_mean_and_std(constant, np.zeros_like(constant))[1][0, 0] == np.float32(
        1e-6
    )
    assert (
        numba_cpu.speaker_encoder.softmax_mean_and_std(x.astype(np.float64), logits.astype(np.float64))
        is NotImplemented
    )


@pytest.mark.parametrize("B, T, F", [(1, 937, 513), (2, 5, 3), (1, 1, 1), (1, 600, 1000)])
def test_spectral_magnitude_twin_is_bit_identical(B, T, F):
    """sqrt(re^2 + im^2 + 1e-9) in one pass, each step rounded as the reference's three, from spectra with
    tiny, huge and zero parts (1e-9 then decides, or re^2 overflows to inf as NumPy's does)."""
    rng = np.random.default_rng(B * T + F)
    scale = 10.0 ** rng.integers(-25, 19, (B, T, F))
    re, im = rng.standard_normal((2, B, T, F)) * scale
    spectrum = (re + 1j * im).astype(np.complex64)
    spectrum.flat[:: max(1, spectrum.size // 7)] = 0
    with np.errstate(over="ignore"):
        ref = speaker_encoder.spectral_magnitude.reference(spectrum)
        got = numba_cpu.speaker_encoder.spectral_magnitude(spectrum)
    assert got.dtype == ref.dtype == np.float32 and got.shape == (B, T, F)
    np.testing.assert_array_equal(got, ref)
    strided = np.swapaxes(np.swapaxes(spectrum, 1, 2).copy(), 1, 2)  # not contiguous
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(numba_cpu.speaker_encoder.spectral_magnitude(strided), ref)
    assert (
        numba_cpu.speaker_encoder.spectral_magnitude(spectrum.astype(np.complex128)) is NotImplemented
    )  # float64: the reference


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 2), C=st.integers(1, 40), T=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_gated_residual_twin_is_bit_identical(B, C, T, seed):
    """The squeeze-excitation's gating plus the residual in one pass: NumPy's bits (no fused multiply-add),
    a NaN sample spoiling its own output only; what it has no kernel for goes back to the reference."""
    rng = np.random.default_rng(seed)
    h, x = (rng.standard_normal((2, B, C, T)) * 10).astype(np.float32)
    gates = rng.uniform(0, 1, (B, C, 1)).astype(np.float32)
    h[0, 0, T // 2] = np.nan
    got = numba_cpu.speaker_encoder.gated_residual(h, gates, x)
    np.testing.assert_array_equal(got, speaker_encoder.gated_residual.reference(h, gates, x))
    assert np.isnan(got).sum() == 1
    assert numba_cpu.speaker_encoder.gated_residual(h.astype(np.float64), gates, x) is NotImplemented
    assert numba_cpu.speaker_encoder.gated_residual(h, gates[:, :, :1].repeat(2, axis=2), x) is NotImplemented


@needs_tiles
@pytest.mark.parametrize("dilation, T", [(2, 129), (4, 300), (3, 700)])
def test_res2net_on_the_tiles_is_its_groups_tdnns_on_the_tiles(dilation, T, monkeypatch):
    """A Res2Net with bf16 weights (k3, from ``TILE_RES2NET_MIN_STEPS`` steps) on the tiles, each thread all
    its groups over its own range of steps (widened by the dilation once per later group): the same bits
    as its groups' TDNNs run one by one on the tiles over the whole signal, and as one range over all steps;
    group 0 copied; within float32 noise of the formula; a NaN spoils the same outputs."""
    rng = np.random.default_rng(dilation + T)
    G, groups = 64, 8
    w_j = tuple(bf16_values(rng, (G, G, 3)) * np.float32(0.125) for _ in range(groups - 1))
    for w in w_j:
        w.flags.writeable = False
    b_j = tuple(rng.standard_normal(G).astype(np.float32) for _ in range(groups - 1))
    x = rng.standard_normal((1, groups * G, T)).astype(np.float32)
    got = numba_cpu.speaker_encoder.res2net_offline(x, w_j, b_j, dilation)
    whole = np.empty_like(got[0])
    tiles_j = numba_cpu.speaker_encoder._res2net_tiles(w_j, T)
    numba_cpu.speaker_encoder._res2net_range_on_tiles(x[0], tiles_j, b_j, dilation, 0, T, whole)
    np.testing.assert_array_equal(got[0], whole)
    np.testing.assert_array_equal(got[:, :G], x[:, :G])
    with monkeypatch.context() as mp:  # the groups one by one, each TDNN on the tiles
        mp.setattr(numba_cpu.speaker_encoder, "TILE_TDNN_MIN_OUT", 32)
        mp.setattr(numba_cpu.speaker_encoder, "_res2net_tiles", lambda w_joik, T: None)
        np.testing.assert_array_equal(numba_cpu.speaker_encoder.res2net_offline(x, w_j, b_j, dilation), got)
    ref = speaker_encoder.res2net_offline.reference(x, w_j, b_j, dilation)
    as64 = [tuple(a.astype(np.float64) for a in arrays) for arrays in (w_j, b_j)]
    exact = speaker_encoder.res2net_offline.reference(x.astype(np.float64), *as64, dilation)
    assert within_float32_noise(got, ref, exact)
    x[0, 3 * G, T // 2] = np.nan
    nan_ref = np.isnan(speaker_encoder.res2net_offline.reference(x, w_j, b_j, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.res2net_offline(x, w_j, b_j, dilation)), nan_ref)
    assert nan_ref.any()


def test_res2net_twin_leaves_what_it_has_no_kernel_for_to_the_reference():
    x = np.zeros((1, 4, 2), np.float32)
    w = (np.zeros((2, 2, 5), np.float32),)
    b = (np.zeros(2, np.float32),)
    assert numba_cpu.speaker_encoder.res2net_offline(x, w, b, 1) is NotImplemented  # 2 frames, a padding of 2
    assert (
        numba_cpu.speaker_encoder.res2net_offline(np.zeros((1, 5, 9), np.float32), w, b, 1) is NotImplemented
    )  # 5 / 2 groups
    assert numba_cpu.speaker_encoder.res2net_offline(x.astype(np.float64), w, b, 1) is NotImplemented
    with pytest.raises(ValueError, match="too few for a reflect padding"):
        speaker_encoder.res2net_offline(x, w, b, 1)  # the reference's error


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 2),
    C=st.integers(1, 40),
    T=st.integers(1, 300),
    per_channel=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_mean_and_std_twin_is_within_float32_noise(B, C, T, per_channel, seed):
    """The attentive pooling's weighted statistics, both in one kernel call per row: as close to the float64
    result as the reference (NumPy's pairwise sums), for one row of weights for all channels (the plain
    statistics) and for a row per channel (the softmax's)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((B, C, T)) * 3 + 1).astype(np.float32)
    w = rng.random((B, C if per_channel else 1, T)).astype(np.float32)
    w /= w.sum(axis=2, keepdims=True)
    got = numba_cpu.speaker_encoder.mean_and_std(x, w)
    ref = speaker_encoder.mean_and_std.reference(x, w)
    exact = speaker_encoder.mean_and_std.reference(x.astype(np.float64), w.astype(np.float64))
    for g, r, e in zip(got, ref, exact):
        assert g.shape == r.shape == (B, C) and g.dtype == np.float32
        assert within_float32_noise(g.astype(np.float64), r.astype(np.float64), e)
    constant = np.ones((1, 2, 8), np.float32)
    assert np.all(
        numba_cpu.speaker_encoder.mean_and_std(constant, np.full((1, 1, 8), 1 / 8, np.float32))[1] == np.float32(1e-6)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 700), (1300, 300)])
def test_softmax_twin_is_the_reference_bit_for_bit(dtype, shape):
    """The reference's operations on pieces of rows (the 1300 x 300 case in several pieces): the same bits,
    rows of -inf included (zeros), over the last axis named either way; another axis is the reference's."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    x.reshape(-1, shape[-1])[0] = -np.inf
    for axis in (-1, len(shape) - 1):
        np.testing.assert_array_equal(numba_cpu.elementwise.softmax(x, axis=axis), nn.softmax.reference(x, axis=axis))
    assert not np.any(numba_cpu.elementwise.softmax(x).reshape(-1, shape[-1])[0])
    if len(shape) > 1:
        assert numba_cpu.elementwise.softmax(x, axis=0) is NotImplemented


@settings(max_examples=60, deadline=None)
@given(
    N=st.integers(1, 40), K=st.integers(2, 300), D=st.integers(1, 20), ties=st.booleans(), seed=st.integers(0, 2**31)
)
def test_nearest_rows_twin_is_the_reference_bit_for_bit(N, K, D, ties, seed):
    """The quantizer's choice and margin without a partition: the same indices and margins, bit for bit,
    duplicated codebook rows (ties: the lowest index, a margin of 0) included; a NaN goes to the reference."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    e = rng.standard_normal((K, D)).astype(np.float32)
    if ties:
        e[K // 2] = e[0]
        x[0] = e[0]
    got, ref = numba_cpu.codec_quantization.nearest_rows(x, e), quantization.nearest_rows.reference(x, e)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[0].dtype == np.int64 and got[1].dtype == np.float32
    x[-1, 0] = np.nan
    assert numba_cpu.codec_quantization.nearest_rows(x, e) is NotImplemented


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    O=st.integers(1, 70),
    K=st.integers(1, 9),
    dilation=st.integers(1, 3),
    T_out=st.integers(1, 3 * 2048 + 5),  # up to three chunks of ONE_CHANNEL_CHUNK columns and a short one
    with_bias=st.booleans(),
    pieces=st.sampled_from([1, 3, 8]),
    seed=st.integers(0, 2**31),
)
def test_one_channel_conv_is_the_reference_bit_for_bit(B, O, K, dilation, T_out, with_bias, pieces, seed):
    """A stride-1 conv of one input channel (the encoder's first, 1 -> 64 x 7 taps) by the direct kernel:
    the reference's operations in its order (taps summed in order, the bias last, no fused multiply-add),
    so the reference's bits, over pieces and chunks with a short last one; infinities and NaN where the
    reference has them; strided or float64 convs keep their own paths."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((B, 1, T_out + dilation * (K - 1))) * 10).astype(np.float32)
    x[0, 0, rng.integers(x.shape[-1])] = [np.inf, -np.inf, np.nan][seed % 3]
    w = rng.standard_normal((O, 1, K)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32) if with_bias else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.conv, "MIN_PIECES", pieces)
        got = numba_cpu.conv.conv1d(x, w, b, 1, dilation)
    np.testing.assert_array_equal(got, nn.conv1d.reference(x, w, b, 1, dilation))
    assert numba_cpu.conv._one_channel_takes(x, w, b) and not numba_cpu.conv._one_channel_takes(
        x.astype(np.float64), w, b
    )


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("case", CASES)
def test_attention_twin_equals_the_reference(case):
    """softmax(q k^T * scale, masked) v with the mask read from its positions and one pass over each row of
    scores: the reference's float32 operations but for the order of the sums (within 1e-5, relative and
    absolute, of the reference: its inputs are standard normal), every grouping of heads, window, padding
    (the batch row that sees no key: zeros), a query before every key, D != Dv, a view of a KV cache."""
    q, k, v, mask = attention_case(len(case), np.float32, **CASES[case])
    ref = nn.attention.reference(q, k, v, mask, scale=0.125)
    got = numba_cpu.attention.attention(q, k, v, mask, 0.125)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    if case == "padded":
        assert np.all(got[-1] == 0) and np.any(got[0] != 0)


def test_attention_twin_over_blocks_and_pieces_and_its_non_finite_rows(monkeypatch):
    """Queries in several blocks (ATTENTION_QUERY_BLOCK) and rows in several pieces, side by side; a visible
    NaN or +inf score spoils its own row (NaN, as the reference's), a NaN key behind the mask nothing; a
    masked key's exp is 0 without its subnormal arithmetic (the outputs of rows whose keys are mostly
    masked are the reference's too); float64, an explicit boolean mask and key validity of another batch
    go to the reference."""
    monkeypatch.setattr(nn, "ATTENTION_QUERY_BLOCK", 7)
    monkeypatch.setattr(numba_cpu.attention, "ELEMENTWISE_PIECE", 64)
    q, k, v, mask = attention_case(5, np.float32, B=2, H=4, G=2, Tq=30, S=40, D=16, window=12, padded=True, start=10)
    q[0, 1, 20, 3] = np.nan  # query 20 of head 1: its whole row NaN
    k[1, 0, 5, 0] = np.inf  # key 5 of group 0, batch row 1: +-inf scores where it is seen
    k[0, 1, 39, 2] = np.nan  # the last key: behind the causal mask of every query but the last
    ref = nn.attention.reference(q, k, v, mask, scale=0.3)
    got = numba_cpu.attention.attention(q, k, v, mask, 0.3)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[0, 1, 20]).all() and not np.isnan(got[0, 1, :20]).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert numba_cpu.attention.attention(q.astype(np.float64), k, v, mask, 0.3) is NotImplemented
    assert numba_cpu.attention.attention(q, k, v, mask.rows(0, 30), 0.3) is NotImplemented
    other_rows = nn.AttentionMask(mask.query_positions_t, mask.key_positions_s, 12, np.ones((3, 40), bool))
    assert numba_cpu.attention.attention(q, k, v, other_rows, 0.3) is NotImplemented  # (the reference's own error then)


# ----------------------------------------------------------------------------- norms


@settings(max_examples=80, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 1024), (1, 2, 1024), (3, 5, 7), (2, 4, 9, 128), (4, 129), (1, 300, 2048), (6,)]),
    C=st.one_of(st.none(), st.integers(1, 5000)),
    scale=st.sampled_from([1e-22, 1e-3, 1.0, 1e3, 1e20]),
    special=st.sampled_from([None, np.nan, np.inf, 0.0]),
    pieces=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rms_norm_twin_is_the_reference_bit_for_bit(shape, C, scale, special, pieces, seed):
    """rms_norm with NumPy's pairwise mean written out: the reference's bits for every row length (the
    short sums, the 8-way blocks, the halvings of long rows), tiny and huge values (squares that underflow
    or overflow), a NaN, an infinity or zeros in a row, rows in pieces side by side; a non-contiguous x
    or a weight of another shape goes to the reference."""
    if C is not None:
        shape = shape[:-1] + (C,)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    if special is not None:
        x.reshape(-1)[rng.integers(x.size)] = special
    with pytest.MonkeyPatch.context() as mp, np.errstate(over="ignore", invalid="ignore"):
        if pieces:
            mp.setattr(numba_cpu.elementwise, "ELEMENTWISE_PIECE", 3 * shape[-1])  # pieces of 3 rows
        np.testing.assert_array_equal(numba_cpu.elementwise.rms_norm(x, w, 1e-6), nn.rms_norm.reference(x, w, 1e-6))
    if x.ndim > 1 and x.shape[0] > 1:
        assert numba_cpu.elementwise.rms_norm(x[::2], w, 1e-6) is NotImplemented or x[::2].flags.c_contiguous
    assert numba_cpu.elementwise.rms_norm(x, w[None], 1e-6) is NotImplemented
    assert numba_cpu.elementwise.rms_norm(x.astype(np.float64), w, 1e-6) is NotImplemented


def random_qwen3_stack(seed, L, C, H, G, D, F):
    """L different Qwen3 layers (``random_qwen3_layer``'s, float32 with bf16 matrices) in one weights dict
    under the checkpoints' names, as ``transformer.layer_views`` gives them, and their config."""
    weights = {}
    for i in range(L):
        lw, cfg = random_qwen3_layer(np.random.default_rng(seed + i), C, H, G, D, F, np.float32)
        weights.update({f"model.layers.{i}.{name}": tensor for name, tensor in lw.weights.items()})
    return weights, transformer.layer_views(weights, "model.layers.", L), cfg


@pytest.mark.parametrize("T", [1, 2, 17])  # a generation step, the code predictor's first pass, a prompt
@pytest.mark.parametrize("n_cached", [0, 3])
@pytest.mark.parametrize("last_only", [False, True])
def test_decoder_stack_step_twin_is_its_layers_one_call_each(T, n_cached, last_only):
    """The whole stack in one call (numba's decoder_stack_step) has the bits of its reference, the layer
    twin called once a layer: the output, every layer's new keys and values, and the caches' lengths, with
    caches that grow (capacity 2) and three layers of different weights."""
    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(11, 3, C, H, G, D, F)
    x = np.random.default_rng(T).standard_normal((1, T, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, np.float32)
    past = np.random.default_rng(T + 1).standard_normal((len(layers), 2, 1, G, n_cached, D)).astype(np.float32)
    out = {}
    for kind, stack in (
        ("twin", numba_cpu.transformer.decoder_stack_step),
        ("layers", transformer.decoder_stack_step.reference),
    ):
        caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        for cache, (k, v) in zip(caches, past):
            cache.append(k, v)
        with kernels.use_backend("numba"):
            y = stack(x, layers, cfg, cos[None], sin[None], caches, 1e-6, last_only)
        assert y is not NotImplemented and all(c.length == n_cached + T for c in caches)
        out[kind] = (y, [(c.k[:, :, : n_cached + T].copy(), c.v[:, :, : n_cached + T].copy()) for c in caches])
    assert out["twin"][0].shape == (1, 1 if last_only else T, C)
    np.testing.assert_array_equal(out["twin"][0], out["layers"][0])
    for (k1, v1), (k2, v2) in zip(out["twin"][1], out["layers"][1]):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(v1, v2)


def test_decoder_stack_step_twin_declines_layers_it_cannot_pass_as_one_tuple():
    """Layers of two weights dicts, caches of different lengths, or a tensor whose type differs from the
    other layers' (a read-only norm among writable ones: no tuple Numba could index at run time) get
    NotImplemented, and the stack then runs its layers one call each, with the same bits."""
    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(21, 2, C, H, G, D, F)
    x = np.random.default_rng(1).standard_normal((1, 1, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(0, 1), D, 10000.0, np.float32)

    def caches(lengths=(0, 0)):
        made = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        for c, n in zip(made, lengths):
            c.append(*np.zeros((2, 1, G, n, D), np.float32))
        return made

    def twin(layers, cs):
        return numba_cpu.transformer.decoder_stack_step(x, layers, cfg, cos[None], sin[None], cs, 1e-6)

    expected = twin(layers, caches())
    assert expected is not NotImplemented
    other = dict(weights)
    assert twin([layers[0], transformer.layer_views(other, "model.layers.", 2)[1]], caches()) is NotImplemented
    assert twin(layers, caches((0, 1))) is NotImplemented
    norm = weights["model.layers.1.input_layernorm.weight"].copy()
    norm.flags.writeable = False
    weights["model.layers.1.input_layernorm.weight"] = norm
    assert twin(layers, caches()) is NotImplemented
    mask = nn.AttentionMask(nn.arange(0, 1), nn.arange(1))
    with kernels.use_backend("numba"):
        y = transformer.transformer_stack(layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches(), 1e-6)
    np.testing.assert_array_equal(y, expected)
