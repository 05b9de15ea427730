"""The elementwise twins (silu, elu, gelu_erf, snake_beta, softmax, rms_norm) against their references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import nn
from refimpl.backends import numba_cpu

from .cases import DTYPES


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


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(1, 700), st.sampled_from((0.1, 10.0, 100.0)), st.integers(0, 2**31))
def test_silu_twin_is_bit_identical(dtype, n, amplitude, seed):
    """x * expit(x) to the bit, in pieces or not: ±0, ±inf, NaN, the overflow of exp(-x) and the values
    around it among random ones."""
    x = (amplitude * np.random.default_rng(seed).standard_normal(n)).astype(dtype)
    x[: min(n, 8)] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -88.8, -709.8, 1e-40], dtype)[: min(n, 8)]
    with np.errstate(all="ignore"):
        ref = nn.silu.reference(x)
    np.testing.assert_array_equal(numba_cpu.elementwise.silu(x), ref)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu.elementwise, "ELEMENTWISE_PIECE", 7)  # pieces, the last one short
        np.testing.assert_array_equal(numba_cpu.elementwise.silu(x.reshape(1, -1)), ref.reshape(1, -1))


def test_silu_twin_is_bit_identical_across_every_float32_exponent():
    """Every 4093rd float32 bit pattern (all exponents, both signs, subnormals, infinities and NaNs among
    them): the C library's expf, as SciPy's expit calls it, to the bit."""
    x = np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        ref = nn.silu.reference(x)
    got = numba_cpu.elementwise.silu(x)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), x[~same][:10]


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


def test_rms_norm_passes_every_weight_read_only(monkeypatch):
    """A writable weight (a norm widened from bf16 at the load) and a read-only one (a mapped checkpoint's)
    reach the kernel as one Numba type, so one compiled kind serves both; the caller's weight stays writable
    and the bits are the reference's."""
    import numba

    kernel, kinds = numba_cpu.elementwise._rms_norm_rows, []

    def typed(x_rc, w_c, eps, out_rc):
        kinds.append(numba.typeof(w_c))
        return kernel(x_rc, w_c, eps, out_rc)

    monkeypatch.setattr(numba_cpu.elementwise, "_rms_norm_rows", typed)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    writable = rng.standard_normal(16).astype(np.float32)
    read_only = writable.copy()
    read_only.flags.writeable = False
    for w in (writable, read_only):
        np.testing.assert_array_equal(numba_cpu.elementwise.rms_norm(x, w, 1e-6), nn.rms_norm.reference(x, w, 1e-6))
    assert len(kinds) == 2 and kinds[0] == kinds[1] and not kinds[0].mutable
    assert writable.flags.writeable
