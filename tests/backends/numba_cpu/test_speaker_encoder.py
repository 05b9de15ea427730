"""The speaker encoder's twins (TDNN, Res2Net, gated residual, pooling statistics, the front end's FFT and
spectral magnitude) against their references, and the TDNNs on the AMX tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import float32_to_bf16_bits
from refimpl.tts import mel, speaker_encoder

from .cases import bf16_values, needs_tiles, within_float32_noise


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
    ref = speaker_encoder.tdnn.reference(x, w, b, dilation)
    got = numba_cpu.speaker_encoder.tdnn(x, w, b, dilation)
    assert got.shape == ref.shape == (B, O, T) and got.dtype == np.float32
    padded = np.pad(np.abs(x).astype(np.float64), ((0, 0), (0, 0), (left, right)), mode="reflect")
    abs_sum = nn.conv1d.reference(padded, np.abs(w).astype(np.float64), np.abs(b).astype(np.float64), dilation=dilation)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)
    x[0, 0, T // 2] = np.nan
    nan_ref = np.isnan(speaker_encoder.tdnn.reference(x, w, b, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.tdnn(x, w, b, dilation)), nan_ref)
    assert nan_ref.any()


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=30, deadline=None)
@given(
    C=st.integers(1, 40),
    O=st.sampled_from((4, 8, 12, 36)),
    K=st.sampled_from((1, 3, 5)),
    dilation=st.integers(1, 4),
    extra=st.integers(0, 150),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_tdnn_on_the_direct_kernel_reads_the_reflected_taps_of_the_reference(C, O, K, dilation, extra, threads, seed):
    """A TDNN on the direct kernel (no tiles; its output channels in shares of whole blocks for 1 to 3
    threads): within the bound of two sums of the same I * K terms of the reference; the same bits
    whatever the shares; a NaN frame spoils the same outputs on both sides."""
    rng = np.random.default_rng(seed)
    left, right = speaker_encoder.same_padding(K, dilation)
    T = max(left, right) + 1 + extra
    x = rng.standard_normal((1, C, T)).astype(np.float32)
    w = rng.standard_normal((O, C, K)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    ref = speaker_encoder.tdnn.reference(x, w, b, dilation)
    ran = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        direct = numba_cpu.speaker_encoder._tdnn_direct
        mp.setattr(numba_cpu.speaker_encoder, "_tdnn_direct", lambda *a: ran.append(1) or direct(*a))
        mp.setattr(numba_cpu.speaker_encoder, "_piece_threads", lambda: threads)
        got = numba_cpu.speaker_encoder.tdnn(x, w, b, dilation)
        mp.setattr(numba_cpu.speaker_encoder, "_piece_threads", lambda: 1)
        assert np.array_equal(numba_cpu.speaker_encoder.tdnn(x, w, b, dilation), got)
        x_nan = x.copy()
        x_nan[0, 0, T // 2] = np.nan
        got_nan = numba_cpu.speaker_encoder.tdnn(x_nan, w, b, dilation)
    assert ran and got.shape == ref.shape == (1, O, T) and got.dtype == np.float32
    padded = np.pad(np.abs(x).astype(np.float64), ((0, 0), (0, 0), (left, right)), mode="reflect")
    abs_sum = nn.conv1d.reference(padded, np.abs(w).astype(np.float64), np.abs(b).astype(np.float64), dilation=dilation)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)
    np.testing.assert_array_equal(np.isnan(got_nan), np.isnan(speaker_encoder.tdnn.reference(x_nan, w, b, dilation)))


@pytest.mark.parametrize(("C", "K"), [(128, 5), (64, 5), (128, 4)])
def test_tdnn_of_many_stacked_taps_runs_on_blas(C, K):
    """Without tiles, a TDNN of ``TDNN_DIRECT_MAX_TAPS`` stacked taps or more (the released encoder's first: 128
    mel bins x 5 taps) takes BLAS's product of its stacked taps, fewer the direct kernel; within the bound of
    two sums of the same I * K terms either way."""
    rng = np.random.default_rng(C * K)
    x = rng.standard_normal((1, C, 50)).astype(np.float32)
    w = rng.standard_normal((8, C, K)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    ran = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        direct = numba_cpu.speaker_encoder._tdnn_direct
        mp.setattr(numba_cpu.speaker_encoder, "_tdnn_direct", lambda *a: ran.append(1) or direct(*a))
        got = numba_cpu.speaker_encoder.tdnn(x, w, b, 2)
    many = C * K >= numba_cpu.speaker_encoder.TDNN_DIRECT_MAX_TAPS
    assert bool(ran) == (not many and numba_cpu.conv.direct_kernel_takes(8, C, K))
    left, right = speaker_encoder.same_padding(K, 2)
    padded = np.pad(np.abs(x).astype(np.float64), ((0, 0), (0, 0), (left, right)), mode="reflect")
    abs_sum = nn.conv1d.reference(padded, np.abs(w).astype(np.float64), np.abs(b).astype(np.float64), dilation=2)
    ref = speaker_encoder.tdnn.reference(x, w, b, 2)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)


def test_tdnn_twin_leaves_what_it_has_no_kernel_for_to_the_reference():
    x = np.zeros((1, 3, 2), np.float32)
    w = np.zeros((2, 3, 5), np.float32)
    assert (
        numba_cpu.speaker_encoder.tdnn(x, w, np.zeros(2, np.float32), 1) is NotImplemented
    )  # 2 frames, a padding of 2
    assert numba_cpu.speaker_encoder.tdnn(x.astype(np.float64), w.astype(np.float64), np.zeros(2), 1) is NotImplemented
    with pytest.raises(ValueError, match="too few for a reflect padding"):
        speaker_encoder.tdnn(x, w, np.zeros(2, np.float32), 1)  # the reference's error


@needs_tiles
@pytest.mark.parametrize(
    "O, C, K, dilation, T", [(256, 32, 1, 1, 33), (256, 64, 3, 2, 150), (288, 384, 3, 1, 300), (256, 128, 5, 1, 129)]
)
def test_tdnn_on_the_tiles_is_the_tile_kernel_of_its_stacked_taps(O, C, K, dilation, T, monkeypatch):
    """A TDNN with bf16 weights and at least ``TILE_TDNN_MIN_OUT`` outputs runs on the tiles: its taps
    mirrored at both edges read in place and split in blocks of ``TILE_TDNN_STEPS`` steps (one pair of
    tiles, several blocks, a last block of one step, 1152 > ``TILE_K_SPAN`` columns), bias and ReLU in the
    same pass: the same bits as the prompt's tile kernel on the reflect-padded, stacked rows, then bias and
    ReLU; within the bound of two sums of the same I K terms; not the BLAS path's bits (the tiles ran); a
    NaN frame spoils the same outputs as in the reference."""
    rng = np.random.default_rng(O + C + K + T)
    x = rng.standard_normal((1, C, T)).astype(np.float32)
    w = bf16_values(rng, (O, C, K))
    w.flags.writeable = False
    b = rng.standard_normal(O).astype(np.float32)
    got = numba_cpu.speaker_encoder.tdnn(x, w, b, dilation)
    left, right = speaker_encoder.same_padding(K, dilation)
    padded = np.pad(x[0], ((0, 0), (left, right)), mode="reflect")
    stacked = np.stack([padded[:, k * dilation : k * dilation + T] for k in range(K)], axis=1)  # [C, K, T]
    rows = np.ascontiguousarray(stacked.reshape(C * K, T).T)
    sums = np.empty((T, O), np.float32)
    numba_cpu.amx._tile_bf16_times(rows, float32_to_bf16_bits(w.reshape(O, C * K)), sums, 2)
    with_bias = sums.T + b[:, None]
    np.testing.assert_array_equal(got[0], np.where(with_bias <= 0, np.float32(0), with_bias))
    ref = speaker_encoder.tdnn.reference(x, w, b, dilation)
    abs_sum = np.abs(w.reshape(O, C * K)).astype(np.float64) @ np.abs(rows.T) + np.abs(b)[:, None]
    assert np.all(np.abs(got[0].astype(np.float64) - ref[0]) <= 2 * (C * K + 1) * np.finfo(np.float32).eps * abs_sum)
    monkeypatch.setattr(numba_cpu.amx, "USE_TILES", False)
    assert not np.array_equal(numba_cpu.speaker_encoder.tdnn(x, w, b, dilation), got)
    monkeypatch.setattr(numba_cpu.amx, "USE_TILES", True)
    x[0, 0, T // 2] = np.nan
    nan_ref = np.isnan(speaker_encoder.tdnn.reference(x, w, b, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.tdnn(x, w, b, dilation)), nan_ref)
    assert nan_ref.any()


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
    got = numba_cpu.speaker_encoder.res2net(x, ws, bs, dilation)
    with kernels.use_backend("numpy"):
        ref = speaker_encoder.res2net.reference(x, ws, bs, dilation)
    exact = speaker_encoder.res2net.reference(
        x.astype(np.float64), tuple(w.astype(np.float64) for w in ws), tuple(b.astype(np.float64) for b in bs), dilation
    )
    assert got.shape == ref.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got[:, :width], x[:, :width])
    assert within_float32_noise(got, ref, exact)
    group_by_group = [x[:, :width]]
    for j in range(1, groups):
        inp = x[:, j * width : (j + 1) * width] + (group_by_group[-1] if j > 1 else 0)
        group_by_group.append(numba_cpu.speaker_encoder.tdnn(inp, ws[j - 1], bs[j - 1], dilation))
    np.testing.assert_array_equal(got, np.concatenate(group_by_group, axis=1))
    x[0, width, T // 2] = np.nan  # in group 1: it spoils every later group through the cascade
    with kernels.use_backend("numpy"):
        nan_ref = np.isnan(speaker_encoder.res2net.reference(x, ws, bs, dilation))
    np.testing.assert_array_equal(np.isnan(numba_cpu.speaker_encoder.res2net(x, ws, bs, dilation)), nan_ref)
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
    for g, r, e in zip(got, ref, exact, strict=True):
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


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    C=st.integers(1, 40),
    A=st.integers(1, 12),
    T=st.integers(1, 300),
    seed=st.integers(0, 2**31),
)
def test_attentive_pooling_twin_adds_the_logits_bias_in_its_statistics(B, C, A, T, seed):
    """The attentive pooling with the TDNN's bias, ReLU and tanh in place and the logits' bias added inside
    the softmax's statistics: the same bits as the reference on the numba backend (its products, roundings
    and sums are that one's), AMX tiles or not, within float32 noise of the plain NumPy formula; a NaN sample
    spoils its item's x-vector statistics as in the reference; for float64, the reference."""
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.standard_normal((B, C, T)), 0).astype(np.float32)
    weights = {
        "tdnn.conv.weight": (rng.standard_normal((A, 3 * C, 1)) / np.sqrt(3 * C)).astype(np.float32),
        "tdnn.conv.bias": rng.standard_normal(A).astype(np.float32),
        "conv.weight": (3 * rng.standard_normal((C, A, 1)) / np.sqrt(A)).astype(np.float32),
        "conv.bias": rng.standard_normal(C).astype(np.float32),
    }
    a = speaker_encoder.WeightView(weights)
    pooling = speaker_encoder.attentive_statistics_pooling.reference
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.amx, "USE_TILES", False)
        got = numba_cpu.speaker_encoder.attentive_statistics_pooling(a, x)
        np.testing.assert_array_equal(got, pooling(a, x, speaker_encoder.NULL_RECORDER))
        x_nan = x.copy()
        x_nan[-1, 0, T // 2] = np.nan
        got_nan = numba_cpu.speaker_encoder.attentive_statistics_pooling(a, x_nan)
        mp.setattr(numba_cpu.amx, "USE_TILES", True)  # (no product of the pooling runs on them)
        np.testing.assert_array_equal(numba_cpu.speaker_encoder.attentive_statistics_pooling(a, x), got)
        np.testing.assert_array_equal(pooling(a, x, speaker_encoder.NULL_RECORDER), got)
    with kernels.use_backend("numpy"):
        ref = pooling(a, x, speaker_encoder.NULL_RECORDER)
        nan_ref = np.isnan(pooling(a, x_nan, speaker_encoder.NULL_RECORDER))
    exact = pooling(
        speaker_encoder.WeightView({k: v.astype(np.float64) for k, v in weights.items()}),
        x.astype(np.float64),
        speaker_encoder.NULL_RECORDER,
    )
    assert got.shape == ref.shape == (B, 2 * C, 1) and got.dtype == np.float32
    assert within_float32_noise(got, ref, exact)
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)
    assert nan_ref[-1].all()
    assert numba_cpu.speaker_encoder.attentive_statistics_pooling(a, x.astype(np.float64)) is NotImplemented


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


@pytest.mark.skipif(not numba_cpu.runtime.machine().packed_compiled, reason="no 512-bit vectors (AVX-512)")
@settings(max_examples=30, deadline=None)
@given(
    width=st.sampled_from((4, 8, 64)),
    groups=st.integers(2, 8),
    K=st.sampled_from((1, 3, 5)),
    dilation=st.integers(1, 4),
    extra=st.integers(0, 400),
    threads=st.integers(1, 3),
    tiles=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_res2net_on_the_direct_kernel_is_its_groups_tdnns(width, groups, K, dilation, extra, threads, tiles, seed):
    """A Res2Net on the direct kernel, the AMX tiles granted or not (its groups are too small for them), each
    thread all its groups over its own range of steps (widened by the padding's reach once per later group,
    from the fewest frames the padding allows): the same bits as its groups' TDNN twins on the direct kernel
    one by one over the whole signal, whatever the ranges; within float32 noise of the formula; a NaN spoils
    the same outputs as in the reference."""
    rng = np.random.default_rng(seed)
    T = max(speaker_encoder.same_padding(K, dilation)) + 1 + extra
    x = rng.standard_normal((1, groups * width, T)).astype(np.float32)
    ws = tuple(
        (rng.standard_normal((width, width, K)) / np.sqrt(width * K)).astype(np.float32) for _ in range(groups - 1)
    )
    bs = tuple(rng.standard_normal(width).astype(np.float32) for _ in range(groups - 1))
    ran = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.speaker_encoder, "_piece_threads", lambda: threads)
        mp.setattr(numba_cpu.speaker_encoder, "RES2NET_PIECE_MIN_STEPS", 16)  # short ranges too
        kernel = numba_cpu.speaker_encoder._res2net_range_direct
        mp.setattr(numba_cpu.speaker_encoder, "_res2net_range_direct", lambda *a: ran.append(a[4:6]) or kernel(*a))
        mp.setattr(numba_cpu.amx, "USE_TILES", tiles)  # (the twin does not ask for tiles: none run here)
        got = numba_cpu.speaker_encoder.res2net(x, ws, bs, dilation)
        mp.setattr(numba_cpu.amx, "USE_TILES", False)  # the groups' TDNNs on the direct kernel
        group_by_group = [x[:, :width]]
        for j in range(1, groups):
            inp = x[:, j * width : (j + 1) * width] + (group_by_group[-1] if j > 1 else 0)
            group_by_group.append(numba_cpu.speaker_encoder.tdnn(inp, ws[j - 1], bs[j - 1], dilation))
        x_nan = x.copy()
        x_nan[0, width, T // 2] = np.nan  # in group 1: it spoils every later group through the cascade
        got_nan = numba_cpu.speaker_encoder.res2net(x_nan, ws, bs, dilation)
    assert ran and ran[0][0] == 0 and ran[-1][1] == T
    np.testing.assert_array_equal(got, np.concatenate(group_by_group, axis=1))
    ref = speaker_encoder.res2net.reference(x, ws, bs, dilation)
    as64 = [tuple(a.astype(np.float64) for a in arrays) for arrays in (ws, bs)]
    exact = speaker_encoder.res2net.reference(x.astype(np.float64), *as64, dilation)
    assert within_float32_noise(got, ref, exact)
    nan_ref = np.isnan(speaker_encoder.res2net.reference(x_nan, ws, bs, dilation))
    np.testing.assert_array_equal(np.isnan(got_nan), nan_ref)
    assert nan_ref.any()


def test_res2net_twin_leaves_what_it_has_no_kernel_for_to_the_reference():
    x = np.zeros((1, 4, 2), np.float32)
    w = (np.zeros((2, 2, 5), np.float32),)
    b = (np.zeros(2, np.float32),)
    assert numba_cpu.speaker_encoder.res2net(x, w, b, 1) is NotImplemented  # 2 frames, a padding of 2
    assert numba_cpu.speaker_encoder.res2net(np.zeros((1, 5, 9), np.float32), w, b, 1) is NotImplemented  # 5 / 2 groups
    assert numba_cpu.speaker_encoder.res2net(x.astype(np.float64), w, b, 1) is NotImplemented
    with pytest.raises(ValueError, match="too few for a reflect padding"):
        speaker_encoder.res2net(x, w, b, 1)  # the reference's error


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
    for g, r, e in zip(got, ref, exact, strict=True):
        assert g.shape == r.shape == (B, C) and g.dtype == np.float32
        assert within_float32_noise(g.astype(np.float64), r.astype(np.float64), e)
    constant = np.ones((1, 2, 8), np.float32)
    assert np.all(
        numba_cpu.speaker_encoder.mean_and_std(constant, np.full((1, 1, 8), 1 / 8, np.float32))[1] == np.float32(1e-6)
    )


@pytest.mark.parametrize(
    "B, T, sr, n_fft, M, fmax",
    [(1, 937, 24000, 1024, 128, 12000), (2, 5, 16000, 512, 40, None), (1, 1, 8000, 64, 8, 3000)],
)
def test_mel_bands_twin_sums_each_bands_nonzero_bins(B, T, sr, n_fft, M, fmax):
    """The filterbank's product over each band's nonzero bins alone, 16 frames a vector (a last piece of
    fewer): within the bound of two sums of the same terms of the reference's product; a band of zeros
    gives zeros; what it has no kernel for goes back to the reference."""
    rng = np.random.default_rng(T + M)
    basis = mel.mel_filterbank(sr, n_fft, M, 0, fmax)
    basis[M // 2] = 0  # a band of zeros
    magnitude = np.swapaxes(np.abs(rng.standard_normal((B, T, n_fft // 2 + 1))).astype(np.float32), 1, 2)
    got = numba_cpu.speaker_encoder.mel_bands(basis, magnitude)
    ref = mel.mel_bands.reference(basis, magnitude)
    assert got.shape == ref.shape == (B, M, T) and got.dtype == np.float32
    abs_sum = np.abs(basis).astype(np.float64) @ np.abs(magnitude).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= 2 * basis.shape[1] * np.finfo(np.float32).eps * abs_sum)
    assert np.all(got[:, M // 2] == 0)
    assert numba_cpu.speaker_encoder.mel_bands(basis.astype(np.float64), magnitude) is NotImplemented


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_fft_twin_splits_the_frames_and_keeps_every_bit(dtype):
    """SciPy's FFT on the twin's threads: each frame's transform is the reference's, so the same bits."""
    frames = np.random.default_rng(0).standard_normal((2, 937, 1024)).astype(dtype)
    ref = mel.real_fft.reference(frames)
    got = numba_cpu.speaker_encoder.real_fft(frames)
    assert got.dtype == ref.dtype == np.result_type(dtype, np.complex64) and got.shape == (2, 937, 513)
    np.testing.assert_array_equal(got, ref)
