"""The twins of ``nn.conv1d`` and ``nn.conv_transpose1d`` against their references, in each of their
arrangements (pieces, a few columns, one channel, the direct kernel)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu

from .cases import DTYPES, within_float32_noise


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


@settings(max_examples=30, deadline=None)
@given(
    I=st.integers(1, 40),
    J=st.integers(1, 80),
    F=st.integers(1, numba_cpu.conv.FEW_FRAMES),
    seed=st.integers(0, 2**31),
)
def test_few_frames_kernel_sums_in_the_same_order_whatever_its_strips(I, J, F, seed):
    """Each of the few-frames kernel's sums is the same chain of multiply-adds (rows in order) whether its
    column is in a strip's vectors of 16 or one of its last columns, taken one at a time: the same bits for
    strips of 1, 3, 16 columns and the default width; and a plain NumPy sum row by row in order is within
    one rounding per row of them (the kernel's are fused)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((I, F)).astype(np.float32)
    w = rng.standard_normal((I, J)).astype(np.float32)
    results = []
    for columns in (1, 3, 16, numba_cpu.conv.FEW_FRAMES_COLUMNS):
        z = np.full((J, F), np.nan, np.float32)
        numba_cpu.conv._few_frames_times(x, w, 0, J, columns, z)
        results.append(z)
    assert all(np.array_equal(z, results[0]) for z in results[1:])
    plain = np.zeros((J, F), np.float32)
    for i in range(I):  # the plain twin: the same order, each product rounded before its sum
        plain += w[i][:, None] * x[i][None, :]
    bound = 2 * I * np.finfo(np.float32).eps * (np.abs(w.T).astype(np.float64) @ np.abs(x).astype(np.float64))
    assert np.all(np.abs(results[0] - plain) <= bound)


def test_transposed_conv_of_every_channel_shares_its_frames_out_evenly():
    """A transposed conv whose pieces take every channel (a small weight over a long signal: the decoder's
    last, over a 4-frame push) cuts its frames into pieces as even as steps of 16 frames allow, one round
    per thread here, rather than a full piece and a short one; the output is the reference's, within its
    bound."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 12, 2560)).astype(np.float32)
    w = rng.standard_normal((12, 6, 6)).astype(np.float32)
    taken = []

    def run_pieces(piece, pieces):
        taken.extend(pieces)
        for p in pieces:
            piece(*p)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.pieces, "_piece_threads", lambda: 2)
        mp.setattr(numba_cpu.conv, "_piece_threads", lambda: 2)
        mp.setattr(numba_cpu.conv, "TRANSPOSED_PIECE_BYTES", 4 * 6 * 6 * 1820)  # pieces of 1820 frames at most
        mp.setattr(numba_cpu.conv, "run_pieces", run_pieces)
        got = numba_cpu.conv.conv_transpose1d(x, w, None, 3)
    assert [n for *_, n in taken] == [1296, 1265]  # 2561 frames; not 1820 and 741
    ref = nn.conv_transpose1d.reference(x, w, None, 3)
    bound = 2 * 12 * 2 * np.finfo(np.float32).eps * nn.conv_transpose1d.reference(np.abs(x), np.abs(w), None, 3)
    assert np.all(np.abs(got - ref) <= bound)


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
    B=st.integers(1, 3),
    O=st.integers(1, 70),
    K=st.integers(1, 9),
    dilation=st.integers(1, 3),
    T_out=st.integers(1, 3 * 2048 + 5),  # up to three spans of ONE_CHANNEL_SPAN columns and a short one
    with_bias=st.booleans(),
    pieces=st.sampled_from([1, 3, 8]),
    seed=st.integers(0, 2**31),
)
def test_one_channel_conv_is_the_reference_bit_for_bit(B, O, K, dilation, T_out, with_bias, pieces, seed):
    """A stride-1 conv of one input channel (the encoder's first, 1 -> 64 x 7 taps) by the direct kernel:
    the reference's operations in its order (taps summed in order, the bias last, no fused multiply-add),
    so the reference's bits, over pieces and spans with a short last one; infinities and NaN where the
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


needs_direct = pytest.mark.skipif(
    not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512) on this machine"
)


@needs_direct
@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40),  # input channels
    st.sampled_from((4, 8, 12)),  # output channels (whole blocks of DIRECT_OUT)
    st.sampled_from((1, 3, 7)),
    st.sampled_from((1, 3, 9)),
    st.integers(1, 200),  # steps (a partial last block of 64)
    st.integers(0, 2**31),
)
def test_direct_conv_kernel_equals_the_conv_formula(I, O, K, dilation, n, seed):
    """``_direct_conv_into`` (the taps read as shifts of the rows, the sums in registers) against
    ``nn.conv1d``'s reference on the same rows: within 2 n eps sum|terms| (``cases``' rule, n = I K), over every
    column it writes (n rounded up to whole blocks); the same bits for the last block alone."""
    rng = np.random.default_rng(seed)
    W = numba_cpu.conv.direct_width(n)
    x = rng.standard_normal((I, (K - 1) * dilation + W)).astype(np.float32)
    w = rng.standard_normal((O, I, K)).astype(np.float32)
    out = np.full((O, W), np.nan, np.float32)
    numba_cpu.conv._direct_conv_into(x, w, dilation, n, out)
    ref = nn.conv1d.reference(x[None], w, None, 1, dilation, 1)[0]
    abs_sum = nn.conv1d.reference(np.abs(x[None]).astype(np.float64), np.abs(w).astype(np.float64), None, 1, dilation)
    assert out.shape == ref.shape
    assert np.all(np.abs(out - ref) <= 2 * I * K * np.finfo(np.float32).eps * abs_sum[0])
    last = np.empty((O, 64), np.float32)  # the last block alone, from the samples it reads
    numba_cpu.conv._direct_conv_into(np.ascontiguousarray(x[:, W - 64 :]), w, dilation, 1, last)
    assert np.array_equal(last, out[:, W - 64 :])


@needs_direct
@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 40),  # input channels
    st.sampled_from((4, 8, 12)),  # output channels (whole blocks of DIRECT_OUT)
    st.sampled_from((1, 3, 7)),
    st.sampled_from((1, 3, 9)),
    st.integers(1, 200),  # steps (a last block of 32 where n ends in its first half)
    st.integers(0, 2**31),
)
def test_direct_conv_kernel_with_a_last_half_block_keeps_its_sums(I, O, K, dilation, n, seed):
    """``_direct_conv_into`` into rows of ``direct_half_width(n)`` steps (a last block of 32 steps where n ends
    in a block's first half): every column the same bits as with rows of whole blocks, and within the conv
    formula's bound (2 n eps sum|terms|, ``cases``' rule)."""
    rng = np.random.default_rng(seed)
    W, half = numba_cpu.conv.direct_width(n), numba_cpu.conv.direct_half_width(n)
    assert n <= half <= W and half % 32 == 0 and (half == W or W - half == 32)
    x = rng.standard_normal((I, (K - 1) * dilation + W)).astype(np.float32)
    w = rng.standard_normal((O, I, K)).astype(np.float32)
    whole, out = np.full((O, W), np.nan, np.float32), np.full((O, half), np.nan, np.float32)
    numba_cpu.conv._direct_conv_into(x, w, dilation, n, whole)
    numba_cpu.conv._direct_conv_into(np.ascontiguousarray(x[:, : (K - 1) * dilation + half]), w, dilation, n, out)
    assert np.array_equal(out, whole[:, :half])
    ref = nn.conv1d.reference(x[None, :, : (K - 1) * dilation + half], w, None, 1, dilation, 1)[0]
    abs_sum = nn.conv1d.reference(np.abs(x[None]).astype(np.float64), np.abs(w).astype(np.float64), None, 1, dilation)
    assert np.all(np.abs(out - ref) <= 2 * I * K * np.finfo(np.float32).eps * abs_sum[0, :, :half])


def test_direct_conv_rule():
    """The direct kernel takes whole blocks of outputs, every conv with taps and 1x1 convs of up to
    ``DIRECT_1X1_MAX_IN`` inputs, where the processor has 512-bit vectors and no AMX tiles are granted."""
    conv = numba_cpu.conv
    here = numba_cpu.runtime.machine().packed_compiled and not numba_cpu.amx.USE_TILES
    assert conv.direct_conv_takes(96, 96, 7) == here and conv.direct_conv_takes(64, 128, 1) == here
    assert not conv.direct_conv_takes(6, 96, 7) and not conv.direct_conv_takes(384, 384, 1)
