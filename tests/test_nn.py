"""Direct tests of the numerical primitives of refimpl/nn.py.

Every primitive is checked against an independent definition written here as the most literal formula:
explicit Python loops over Python floats (float64) and the ``math`` module, never the NumPy expression
the implementation uses.  Inputs are generated in the dtype under test (float32 or float64); the reference
is computed from exactly those (rounded) inputs in float64, so the only differences left are the
implementation's own roundings, which the tolerances bound.

Tolerance rule (used throughout): a value computed as a sum of n rounded terms is within
gamma_n * sum|terms| of the exact value, gamma_n = n u / (1 - n u) with u = eps / 2 (Higham, Accuracy and
Stability of Numerical Algorithms, ch. 3).  The tests allow ``4 * n_terms * eps * sum|terms|`` (8 x gamma_n:
margin for the products' own roundings and, in float64, for the reference's own rounding of the same size).  Elementwise
functions are allowed a few eps relative to the value, widened where the formula itself cancels
(stated at each test).  An indexing or formula error changes a result by about one whole term, which is
orders of magnitude above these bounds.

The implementation under test comes from the ``nn_impl`` fixture, which runs the whole file once per
backend (``refimpl.backends.BACKENDS``): the reference primitives and their fast twins meet the same
literal definitions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import refimpl.nn
from refimpl.backends import installed_backends, use_backend

DTYPES = [np.float32, np.float64]
DTYPE_IDS = ["f32", "f64"]


@pytest.fixture(scope="module", params=installed_backends())
def nn_impl(request):
    """The primitives under test, once per backend: ``refimpl.nn`` with that backend active (its
    primitives hand each call to the backend's twin where one exists)."""
    with use_backend(request.param):
        yield refimpl.nn


def eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def tiny(dtype) -> float:
    """Smallest normal number: the absolute floor of every tolerance (results that underflow)."""
    return float(np.finfo(dtype).tiny)


def assert_within(got, ref, tol, dtype, what: str):
    """|got - ref| <= tol elementwise (NaN fails), and got has the reference's shape and the input's dtype."""
    got = np.asarray(got)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != reference {ref.shape}"
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype} != input dtype {np.dtype(dtype)}"
    err = np.abs(got.astype(np.float64) - ref)
    tol = np.broadcast_to(tol, err.shape)
    bad = ~(err <= tol)  # NaN counts as bad
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} values off; first at {i}: got {got[i]!r}, "
            f"reference {ref[i]!r}, |diff| {err[i]:.3e} > tol {tol[i]:.3e}"
        )


def randn(rng, shape, dtype, scale=1.0, offset=0.0):
    return (offset + scale * rng.standard_normal(shape)).astype(dtype)


def floats(dtype, lo, hi):
    """Hypothesis elements exactly representable in ``dtype``."""
    return st.floats(lo, hi, width=32 if dtype == np.float32 else 64)


dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
SMALL_SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)


def map_ref(fn, x):
    """fn applied to every element of x as a Python float; float64 result of x's shape."""
    return np.array([fn(float(v)) for v in np.asarray(x).ravel()], dtype=np.float64).reshape(np.shape(x))


# ============================================================================ elementwise


def ref_silu(v):
    return v / (1.0 + math.exp(-v))  # x * sigmoid(x)


def ref_gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_silu(nn_impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    x = data.draw(hnp.arrays(dtype, SMALL_SHAPES, elements=floats(dtype, -100, 100)))
    # x * sigmoid(x): an accurate sigmoid (a few ulp) times one rounding; no cancellation anywhere.  Below
    # x ~ -87 (float32) the sigmoid underflows to 0 (or a subnormal) while x * sigmoid(x) would still be a
    # normal number (up to |x| times the smallest normal): hence the floor (1 + |x|) * tiny
    tol = 8 * eps(dtype) * np.abs(map_ref(ref_silu, x)) + (1 + np.abs(x.astype(np.float64))) * tiny(dtype)
    assert_within(nn_impl.silu(x), map_ref(ref_silu, x), tol, dtype, "silu")


@dtypes
def test_silu_values(nn_impl, dtype):
    x = np.array([0.0, 1.0, -1.0, 20.0, -20.0], dtype=dtype)
    want = [0.0, 0.7310585786300049, -0.2689414213699951, 19.999999958776925, -4.122307236380407e-08]
    assert_within(nn_impl.silu(x), want, 4 * eps(dtype) * np.abs(want), dtype, "silu")


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_gelu_erf(nn_impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    x = data.draw(hnp.arrays(dtype, SMALL_SHAPES, elements=floats(dtype, -30, 30)))
    # The formula adds 0.5 x and 0.5 x erf(x / sqrt 2), terms of size |x| that cancel for x << 0 (the official
    # GELU does the same), so the error bound is a few eps times |x|, not times the (tiny) result.  Still far
    # below e.g. the tanh approximation's error (~1e-3 near |x| = 2).
    tol = 8 * eps(dtype) * np.abs(x.astype(np.float64)) + tiny(dtype)
    assert_within(nn_impl.gelu_erf(x), map_ref(ref_gelu, x), tol, dtype, "gelu_erf")


@dtypes
def test_gelu_erf_values(nn_impl, dtype):
    x = np.array([0.0, 1.0, -1.0, 2.0, 3.0], dtype=dtype)
    want = np.array([0.0, 0.8413447460685429, -0.15865525393145707, 1.9544997361036416, 2.99595030590511])
    assert_within(nn_impl.gelu_erf(x), want, 8 * eps(dtype) * np.abs(x.astype(np.float64)), dtype, "gelu_erf")
    # not the tanh approximation (which is ~1e-4 off at x = 2, 50 x the tolerance above)
    tanh_gelu = 0.5 * 2.0 * (1 + math.tanh(math.sqrt(2 / math.pi) * (2.0 + 0.044715 * 8.0)))
    assert abs(float(nn_impl.gelu_erf(np.array([2.0], dtype=dtype))[0]) - tanh_gelu) > 5e-5


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([1.0, 0.5, 2.0, 0.3]))
def test_elu(nn_impl, data, alpha):
    dtype = data.draw(st.sampled_from(DTYPES))
    x = data.draw(hnp.arrays(dtype, SMALL_SHAPES, elements=floats(dtype, -60, 60)))
    x_before = x.copy()
    ref = map_ref(lambda v: v if v > 0 else alpha * math.expm1(v), x)
    # expm1 (an ulp or two) times alpha (alpha itself rounded to dtype: half an ulp) times one rounding
    tol = 4 * eps(dtype) * np.abs(ref) + tiny(dtype)
    got = nn_impl.elu(x, alpha) if alpha != 1.0 else nn_impl.elu(x)
    assert_within(got, ref, tol, dtype, f"elu(alpha={alpha})")
    np.testing.assert_array_equal(x, x_before, err_msg="elu modified its input")


@dtypes
def test_elu_values(nn_impl, dtype):
    x = np.array([2.0, 0.0, -1.0, -50.0], dtype=dtype)
    assert_within(nn_impl.elu(x), [2.0, 0.0, math.exp(-1) - 1, math.exp(-50) - 1], 2 * eps(dtype), dtype, "elu")
    assert_within(
        nn_impl.elu(x, alpha=0.5),
        [2.0, 0.0, 0.5 * (math.exp(-1) - 1), 0.5 * (math.exp(-50) - 1)],
        2 * eps(dtype),
        dtype,
        "elu(alpha=0.5)",
    )


def ref_snake_beta(x, log_alpha, log_beta):
    B, C, T = x.shape
    out = np.empty((B, C, T))
    bound = np.empty((B, C, T))
    X, LA, LB = x.tolist(), log_alpha.tolist(), log_beta.tolist()
    for b in range(B):
        for c in range(C):
            alpha = math.exp(LA[c])
            inv_beta = 1.0 / (math.exp(LB[c]) + 1e-9)
            for t in range(T):
                v = X[b][c][t]
                out[b, c, t] = v + inv_beta * math.sin(alpha * v) ** 2
                # alpha * x carries ~2 eps |alpha x| of absolute error into sin, doubled by the square;
                # 1/beta, the product and the sum add a few eps of the terms
                bound[b, c, t] = abs(v) + inv_beta * (1.0 + abs(alpha * v))
    return out, bound


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_snake_beta(nn_impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    B, C, T = data.draw(st.tuples(st.integers(1, 2), st.integers(1, 5), st.integers(1, 7)))
    x = data.draw(hnp.arrays(dtype, (B, C, T), elements=floats(dtype, -20, 20)))
    la = data.draw(hnp.arrays(dtype, (C,), elements=floats(dtype, -3, 3)))
    lb = data.draw(hnp.arrays(dtype, (C,), elements=floats(dtype, -3, 3)))
    x_before = x.copy()
    ref, bound = ref_snake_beta(x, la, lb)
    assert_within(nn_impl.snake_beta(x, la, lb), ref, 8 * eps(dtype) * bound + tiny(dtype), dtype, "snake_beta")
    np.testing.assert_array_equal(x, x_before, err_msg="snake_beta modified its input")


@dtypes
def test_snake_beta_per_channel_and_epsilon(nn_impl, dtype):
    """Channels get their own alpha and beta (C != T so a wrong broadcast axis cannot pass), and beta
    tiny enough that the +1e-9 in 1 / (beta + 1e-9) dominates: 1/beta would be ~1e13, not ~1e9."""
    rng = np.random.default_rng(0)
    x = randn(rng, (2, 3, 5), dtype)
    la = np.array([0.0, 0.7, -1.2], dtype=dtype)
    lb = np.array([0.3, -0.5, -30.0], dtype=dtype)
    ref, bound = ref_snake_beta(x, la, lb)
    got = nn_impl.snake_beta(x, la, lb)
    assert_within(got, ref, 8 * eps(dtype) * bound + tiny(dtype), dtype, "snake_beta")
    without_eps = x[:, 2].astype(np.float64) + np.sin(x[:, 2].astype(np.float64)) ** 2 / math.exp(-30.0)
    assert np.all(np.abs(got[:, 2] - without_eps) > 1e3), "the +1e-9 in 1 / (beta + 1e-9) is missing"


def ref_softmax_rows(x2):
    """Softmax of each row of a 2-D float64 array; a row of all -inf gives zeros.  Also the relative error
    allowance of each output: exp(x - max) is evaluated at x - max rounded (error eps/2 |x - max|, which
    exp turns into a relative error), plus ~n eps for the sum and a few for exp and the division."""
    out = np.zeros(x2.shape)
    rel = np.zeros(x2.shape)
    n = x2.shape[1]
    for r, row in enumerate(x2.tolist()):
        m = max(row)
        if m == -math.inf:
            continue
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        for j, v in enumerate(row):
            out[r, j] = e[j] / s
            rel[r, j] = (abs(v - m) if v != -math.inf else 0.0) + n + 4
    return out, rel


def ref_softmax(x, axis):
    xm = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    out, rel = ref_softmax_rows(xm.reshape(-1, xm.shape[-1]))
    return (np.moveaxis(out.reshape(xm.shape), -1, axis), np.moveaxis(rel.reshape(xm.shape), -1, axis))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_softmax(nn_impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=7))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = data.draw(hnp.arrays(dtype, shape, elements=st.one_of(floats(dtype, -50, 50), st.just(-math.inf))))
    ref, rel = ref_softmax(x, axis)
    got = nn_impl.softmax(x, axis=axis)
    assert_within(got, ref, 4 * eps(dtype) * rel * ref + tiny(dtype), dtype, f"softmax(axis={axis})")
    sums = np.sum(got.astype(np.float64), axis=axis)
    ref_sums = np.sum(ref, axis=axis)  # 1, or 0 for rows that are entirely -inf
    n = shape[axis]
    assert np.all(np.abs(sums - ref_sums) <= 4 * eps(dtype) * np.sum(rel * ref, axis=axis) + n * tiny(dtype))


@dtypes
def test_softmax_edge_rows(nn_impl, dtype):
    inf = math.inf
    x = np.array(
        [
            [-inf, -inf, -inf],  # fully masked: zeros, not NaN
            [1e4, 1e4 - 1, -1e4],  # large values: no overflow
            [-inf, 3.0, -inf],  # one finite entry: exactly that one
            [-1e4, -1e4, -1e4 - 2],
        ],  # large negative: no underflow to 0/0
        dtype=dtype,
    )
    got = nn_impl.softmax(x)
    e1 = math.exp(-1)
    e2 = math.exp(-2)
    want = [[0, 0, 0], [1 / (1 + e1), e1 / (1 + e1), 0], [0, 1, 0], [1 / (2 + e2), 1 / (2 + e2), e2 / (2 + e2)]]
    assert_within(got, want, 8 * eps(dtype), dtype, "softmax edge rows")
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[1:].sum(axis=-1), 1.0, rtol=0, atol=4 * eps(dtype))


# ============================================================================ linear and norms


def ref_linear(x, w, b):
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]).tolist()
    W = w.tolist()
    bias = b.tolist() if b is not None else None
    out = np.empty((len(rows), len(W)))
    mag = np.empty_like(out)
    for r, row in enumerate(rows):
        for o, wrow in enumerate(W):
            acc = bias[o] if bias is not None else 0.0
            m = abs(acc)
            for xi, wi in zip(row, wrow, strict=True):
                acc += xi * wi
                m += abs(xi * wi)
            out[r, o] = acc
            mag[r, o] = m
    return out.reshape(lead + (len(W),)), mag.reshape(lead + (len(W),))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_linear(nn_impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    lead = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    I, O = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 9))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x, w = randn(rng, lead + (I,), dtype), randn(rng, (O, I), dtype)
    b = randn(rng, (O,), dtype) if data.draw(st.booleans()) else None
    ref, mag = ref_linear(x, w, b)
    n_terms = I + (b is not None)
    assert_within(
        nn_impl.linear(x, w, b) if b is not None else nn_impl.linear(x, w),
        ref,
        4 * n_terms * eps(dtype) * mag,
        dtype,
        "linear",
    )


def ref_rms_norm(x, w, eps_):
    rows = x.reshape(-1, x.shape[-1]).tolist()
    W = w.tolist()
    out = np.empty((len(rows), len(W)))
    for r, row in enumerate(rows):
        mean_sq = sum(v * v for v in row) / len(row)
        inv = 1.0 / math.sqrt(mean_sq + eps_)
        for i, v in enumerate(row):
            out[r, i] = W[i] * v * inv
    return out.reshape(x.shape)


@dtypes
@pytest.mark.parametrize(
    "shape, scale, norm_eps", [((3, 8), 1.0, 1e-6), ((2, 3, 33), 5.0, 1e-5), ((4, 16), 1e-4, 1e-6), ((1, 1), 2.0, 1e-6)]
)
def test_rms_norm(nn_impl, dtype, shape, scale, norm_eps):
    rng = np.random.default_rng(1)
    x = randn(rng, shape, dtype, scale=scale)
    w = randn(rng, shape[-1:], dtype, offset=1.0, scale=0.3)
    # mean of n squares (positive terms: relative error <= n eps), sqrt halves it, then 3 more roundings:
    # relative error <= (n / 2 + 4) eps; allowed 2 (n + 8) eps, i.e. 4x
    n = shape[-1]
    ref = ref_rms_norm(x, w, norm_eps)
    assert_within(
        nn_impl.rms_norm(x, w, norm_eps), ref, 2 * (n + 8) * eps(dtype) * np.abs(ref) + tiny(dtype), dtype, "rms_norm"
    )


@dtypes
def test_rms_norm_zero_row_and_eps(nn_impl, dtype):
    x = np.zeros((2, 4), dtype=dtype)
    x[1] = 1e-3
    w = np.ones(4, dtype=dtype)
    got = nn_impl.rms_norm(x, w, 1e-6)
    # row 0: 0 / sqrt(eps) = 0; row 1: eps is comparable to mean(x^2) = 1e-6, giving 1e-3 / sqrt(2e-6)
    assert_within(got, [[0] * 4, [1e-3 / math.sqrt(2e-6)] * 4], 16 * eps(dtype), dtype, "rms_norm eps")


def ref_layer_norm(x, w, b, eps_):
    """Also the error allowance of each output.  x - mean carries the mean's error, ~(n+2) eps mean|x|
    (plus eps |x - mean|): call it D.  The output w (x - mean) / sd + b then errs by about
    |w| ((1 + |x_hat|) D / sd + |x_hat| n eps) (the variance's relative error is ~2 D / sd + n eps and
    enters through a square root) plus eps (|b| + |y|)."""
    rows = x.reshape(-1, x.shape[-1]).tolist()
    W = w.tolist()
    Bv = b.tolist() if b is not None else [0.0] * len(W)
    out = np.empty((len(rows), len(W)))
    bound = np.empty_like(out)
    for r, row in enumerate(rows):
        n = len(row)
        mean = sum(row) / n
        var = sum((v - mean) ** 2 for v in row) / n
        sd = math.sqrt(var + eps_)
        mean_abs = sum(abs(v) for v in row) / n
        max_c = max(abs(v - mean) for v in row)
        D = (n + 2) * (mean_abs + max_c)  # in units of eps
        for i, v in enumerate(row):
            xhat = (v - mean) / sd
            out[r, i] = W[i] * xhat + Bv[i]
            bound[r, i] = abs(W[i]) * ((1 + abs(xhat)) * D / sd + abs(xhat) * n) + abs(Bv[i]) + abs(out[r, i])
    return out.reshape(x.shape), bound.reshape(x.shape)


@dtypes
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(
    "shape, offset, norm_eps",
    [((3, 8), 0.0, 1e-5), ((2, 3, 40), 10.0, 1e-5), ((2, 5), -3.0, 1e-6), ((1, 2), 0.0, 1e-5)],
)
def test_layer_norm(nn_impl, dtype, with_bias, shape, offset, norm_eps):
    rng = np.random.default_rng(2)
    x = randn(rng, shape, dtype, offset=offset)
    w = randn(rng, shape[-1:], dtype, offset=1.0, scale=0.3)
    b = randn(rng, shape[-1:], dtype) if with_bias else None
    ref, bound = ref_layer_norm(x, w, b, norm_eps)
    assert_within(nn_impl.layer_norm(x, w, b, norm_eps), ref, 4 * eps(dtype) * bound + tiny(dtype), dtype, "layer_norm")


@dtypes
def test_layer_norm_constant_row(nn_impl, dtype):
    """A constant row has variance 0: the output is the bias (x - mean = 0 exactly), not NaN."""
    x = np.full((1, 6), 3.5, dtype=dtype)
    w = np.arange(1, 7, dtype=dtype)
    b = np.linspace(-1, 1, 6).astype(dtype)
    assert_within(nn_impl.layer_norm(x, w, b, 1e-5), b[None].astype(np.float64), 0, dtype, "layer_norm")


# ============================================================================ convolutions


def ref_conv1d(x, w, b=None, stride=1, dilation=1, groups=1):
    """out[b, o, t] = bias[o] + sum_{i, k} W[o, i, k] x[b, g(o) I + i, stride t + dilation k], the loop over
    (b, o, t, i, k); also sum|terms| of each output, for the tolerance."""
    B, C, T = x.shape
    O, I, K = w.shape
    assert I * groups == C and O % groups == 0
    span = dilation * (K - 1) + 1
    T_out = (T - span) // stride + 1
    X, W = x.tolist(), w.tolist()
    bias = b.tolist() if b is not None else [0.0] * O
    out = np.empty((B, O, T_out))
    mag = np.empty_like(out)
    o_per_group = O // groups
    for bb in range(B):
        for o in range(O):
            first = (o // o_per_group) * I
            for t in range(T_out):
                acc, m = bias[o], abs(bias[o])
                for i in range(I):
                    xrow = X[bb][first + i]
                    for k in range(K):
                        term = W[o][i][k] * xrow[stride * t + dilation * k]
                        acc += term
                        m += abs(term)
                out[bb, o, t] = acc
                mag[bb, o, t] = m
    return out, mag


def conv_tol(mag, n_terms, dtype):
    return 4 * n_terms * eps(dtype) * mag


def call_conv(fn, x, w, b, stride=1, dilation=1, groups=1):
    """Pass only the non-default arguments, by the names the brief fixes."""
    kw = {}
    if stride != 1:
        kw["stride"] = stride
    if dilation != 1:
        kw["dilation"] = dilation
    if groups != 1:
        kw["groups"] = groups
    return fn(x, w, b, **kw) if b is not None else fn(x, w, **kw)


@st.composite
def conv1d_cases(draw, causal=False):
    kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
    stride = draw(st.integers(1, 4))
    dilation = draw(st.integers(1, 3))
    # causal convs need span >= stride (the left padding span - stride is >= 0): K >= stride suffices
    K = draw(st.integers(stride if causal else 1, 8))
    if kind == "dense":
        groups, C, O = 1, draw(st.integers(1, 24)), draw(st.integers(1, 6))  # C K reaches 192: both sides of 64
    elif kind == "depthwise":
        C = draw(st.integers(1, 8))
        groups, O = C, C * draw(st.sampled_from([1, 1, 2]))  # channel multiplier 1 (true depthwise) or 2
    else:
        groups = draw(st.integers(2, 4))
        C, O = groups * draw(st.integers(1, 5)), groups * draw(st.integers(1, 3))
    span = dilation * (K - 1) + 1
    T = draw(st.integers(1, 3 * stride + 4)) if causal else span + draw(st.integers(0, 3 * stride + 3))
    B = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = randn(rng, (B, C, T), dtype)
    w = randn(rng, (O, C // groups, K), dtype)
    b = randn(rng, (O,), dtype) if draw(st.booleans()) else None
    return x, w, b, stride, dilation, groups


@settings(max_examples=80, deadline=None)
@given(conv1d_cases())
def test_conv1d(nn_impl, case):
    x, w, b, stride, dilation, groups = case
    ref, mag = ref_conv1d(x, w, b, stride, dilation, groups)
    n_terms = w.shape[1] * w.shape[2] + (b is not None)
    assert_within(
        call_conv(nn_impl.conv1d, x, w, b, stride, dilation, groups),
        ref,
        conv_tol(mag, n_terms, x.dtype),
        x.dtype,
        f"conv1d stride={stride} dil={dilation} groups={groups}",
    )


@dtypes
@pytest.mark.parametrize(
    "C, O, K, stride, dilation, groups, T",
    [
        (1, 4, 7, 1, 1, 1, 30),  # in_channels * k = 7: the small case (audio-rate first conv)
        (16, 3, 4, 2, 1, 1, 21),  # = 64, the largest "small" size
        (13, 5, 5, 1, 1, 1, 17),  # = 65, the smallest "large" size
        (9, 7, 7, 3, 2, 1, 40),  # 63 with stride and dilation
        (32, 4, 3, 1, 9, 1, 25),  # 96 with a wide dilation
        (24, 6, 7, 5, 1, 1, 31),  # 168 with stride
        (12, 12, 7, 1, 3, 12, 30),  # depthwise
        (12, 12, 1, 1, 1, 1, 5),  # pointwise
        (12, 8, 3, 2, 1, 4, 15),  # general groups
        (6, 12, 5, 1, 2, 6, 20),  # depthwise with channel multiplier 2
        (70, 2, 1, 1, 1, 1, 4),  # k = 1 with many channels
        (16, 3, 4, 2, 1, 1, 260),  # a longer sequence
    ],
)
def test_conv1d_explicit(nn_impl, dtype, C, O, K, stride, dilation, groups, T):
    rng = np.random.default_rng(C * 1000 + K)
    x = randn(rng, (2, C, T), dtype)
    w = randn(rng, (O, C // groups, K), dtype)
    b = randn(rng, (O,), dtype)
    x_before = x.copy()
    x_strided = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)  # same values, [B, T, C] memory
    for bias in (b, None):
        ref, mag = ref_conv1d(x, w, bias, stride, dilation, groups)
        n_terms = (C // groups) * K + 1
        for xin, layout in ((x, "contiguous"), (x_strided, "non-contiguous")):
            assert_within(
                call_conv(nn_impl.conv1d, xin, w, bias, stride, dilation, groups),
                ref,
                conv_tol(mag, n_terms, dtype),
                dtype,
                f"conv1d, {layout} input",
            )
    np.testing.assert_array_equal(x, x_before, err_msg="conv1d modified its input")


@dtypes
@pytest.mark.parametrize(
    "C, K, stride, dilation, groups",
    [(3, 5, 1, 1, 1), (20, 4, 3, 2, 1), (4, 3, 2, 3, 4), (6, 2, 1, 1, 2), (1, 1, 1, 1, 1)],
)
def test_conv1d_length_equal_to_span_and_shorter(nn_impl, dtype, C, K, stride, dilation, groups):
    rng = np.random.default_rng(3)
    span = dilation * (K - 1) + 1
    w = randn(rng, (2 * groups, C // groups, K), dtype)
    x = randn(rng, (1, C, span), dtype)
    ref, mag = ref_conv1d(x, w, None, stride, dilation, groups)
    assert ref.shape == (1, 2 * groups, 1)
    assert_within(
        call_conv(nn_impl.conv1d, x, w, None, stride, dilation, groups),
        ref,
        conv_tol(mag, C // groups * K, dtype),
        dtype,
        "conv1d with length == span",
    )
    if span > 1:
        with pytest.raises(ValueError, match="(?i)kernel|span|short"):
            call_conv(nn_impl.conv1d, x[:, :, :-1], w, None, stride, dilation, groups)


def ref_conv_transpose1d(x, w, b=None, stride=1):
    """Scatter: input frame t adds W[i, o, k] x[b, i, t] to output sample stride t + k; (T-1) stride + K outputs."""
    B, C, T = x.shape
    I, O, K = w.shape
    assert C == I
    L = (T - 1) * stride + K
    out = np.zeros((B, O, L))
    mag = np.zeros((B, O, L))
    X, W = x.tolist(), w.tolist()
    for bb in range(B):
        for i in range(I):
            for t in range(T):
                v = X[bb][i][t]
                for o in range(O):
                    for k in range(K):
                        term = W[i][o][k] * v
                        out[bb, o, stride * t + k] += term
                        mag[bb, o, stride * t + k] += abs(term)
    if b is not None:
        out += np.asarray(b, dtype=np.float64)[None, :, None]
        mag += np.abs(np.asarray(b, dtype=np.float64))[None, :, None]
    return out, mag


@st.composite
def conv_transpose_cases(draw, causal=False):
    stride = draw(st.integers(1, 5))
    K = draw(st.integers(stride if causal else 1, 10))
    C, O, T, B = draw(st.integers(1, 10)), draw(st.integers(1, 6)), draw(st.integers(1, 8)), draw(st.integers(1, 2))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x, w = randn(rng, (B, C, T), dtype), randn(rng, (C, O, K), dtype)
    b = randn(rng, (O,), dtype) if draw(st.booleans()) else None
    return x, w, b, stride


@settings(max_examples=60, deadline=None)
@given(conv_transpose_cases())
def test_conv_transpose1d(nn_impl, case):
    x, w, b, stride = case
    ref, mag = ref_conv_transpose1d(x, w, b, stride)
    T, (C, _, K) = x.shape[-1], w.shape
    assert ref.shape[-1] == (T - 1) * stride + K
    assert_within(
        call_conv(nn_impl.conv_transpose1d, x, w, b, stride),
        ref,
        conv_tol(mag, C * K + 1, x.dtype),
        x.dtype,
        f"conv_transpose1d stride={stride}",
    )


# ---------------------------------------------------------------------------- causal convolutions


@pytest.mark.parametrize(
    "K, stride, dilation",
    [(k, s, d) for k in range(1, 9) for s in range(1, 5) for d in range(1, 4) if d * (k - 1) + 1 >= s],
)
def test_causal_padding_and_extra_right_padding(nn_impl, K, stride, dilation):
    span = dilation * (K - 1) + 1
    left = nn_impl.causal_padding(K, stride, dilation)
    assert left == span - stride
    for length in range(1, 4 * stride + 12):
        right = nn_impl.extra_right_padding(length, K, stride, dilation)
        padded = left + length + right
        frames = math.ceil(length / stride)
        assert 0 <= right < stride, (length, right)
        assert padded >= span and (padded - span) % stride == 0, "no input samples left over on the right"
        assert (padded - span) // stride + 1 == frames
        if stride == 1:
            assert right == 0


def causal_reference(x, w, b, stride, dilation, groups):
    """Zero-pad the left by span - stride and the right up to ceil(T / stride) whole frames, then valid conv."""
    K, T = w.shape[-1], x.shape[-1]
    span = dilation * (K - 1) + 1
    frames = math.ceil(T / stride)
    right = (frames - 1) * stride + span - (span - stride) - T
    padded = np.concatenate(
        [np.zeros(x.shape[:2] + (span - stride,)), x.astype(np.float64), np.zeros(x.shape[:2] + (right,))], axis=-1
    )
    out, mag = ref_conv1d(padded, w, b, stride, dilation, groups)
    assert out.shape[-1] == frames
    return out, mag


@settings(max_examples=60, deadline=None)
@given(conv1d_cases(causal=True), st.data())
def test_causal_conv1d(nn_impl, case, data):
    x, w, b, stride, dilation, groups = case
    ref, mag = causal_reference(x, w, b, stride, dilation, groups)
    n_terms = w.shape[1] * w.shape[2] + 1
    got = call_conv(nn_impl.causal_conv1d, x, w, b, stride, dilation, groups)
    what = f"causal_conv1d stride={stride} dil={dilation} groups={groups}"
    assert_within(got, ref, conv_tol(mag, n_terms, x.dtype), x.dtype, what)

    # causality: output frame t reads inputs up to stride * t + stride - 1 (its last padded sample); perturbing
    # input s leaves every frame t with stride * (t + 1) - 1 < s bit-for-bit unchanged
    T = x.shape[-1]
    s = data.draw(st.integers(0, T - 1))
    x2 = x.copy()
    x2[:, :, s] += x.dtype.type(1.5)
    got2 = call_conv(nn_impl.causal_conv1d, x2, w, b, stride, dilation, groups)
    unchanged = s // stride  # frames 0 .. s // stride - 1
    np.testing.assert_array_equal(got2[..., :unchanged], got[..., :unchanged], err_msg=f"{what}: not causal")
    if dilation == 1:  # then frame s // stride has a tap on sample s
        assert np.any(got2[..., unchanged] != got[..., unchanged]), f"{what}: frame {unchanged} ignores sample {s}"


@settings(max_examples=40, deadline=None)
@given(conv_transpose_cases(causal=True), st.data())
def test_causal_conv_transpose1d(nn_impl, case, data):
    x, w, b, stride = case
    T = x.shape[-1]
    full, mag = ref_conv_transpose1d(x, w, b, stride)
    got = call_conv(nn_impl.causal_conv_transpose1d, x, w, b, stride)
    assert got.shape[-1] == T * stride
    C, K = w.shape[0], w.shape[-1]
    what = f"causal_conv_transpose1d stride={stride} K={K}"
    assert_within(got, full[..., : T * stride], conv_tol(mag[..., : T * stride], C * K + 1, x.dtype), x.dtype, what)

    # output p depends only on input frames <= p // stride
    s = data.draw(st.integers(0, T - 1))
    x2 = x.copy()
    x2[:, :, s] += x.dtype.type(1.5)
    got2 = call_conv(nn_impl.causal_conv_transpose1d, x2, w, b, stride)
    np.testing.assert_array_equal(got2[..., : s * stride], got[..., : s * stride], err_msg=f"{what}: not causal")
    assert np.any(got2[..., s * stride : (s + 1) * stride] != got[..., s * stride : (s + 1) * stride])


@dtypes
def test_causal_conv1d_streaming_prefix(nn_impl, dtype):
    """Causality seen from outside: the frames of a prefix of the input (a whole number of strides) are the
    first frames of the full input's output (to rounding: a shorter product may be summed in another order)."""
    rng = np.random.default_rng(4)
    x = randn(rng, (1, 5, 24), dtype)
    w = randn(rng, (3, 5, 8), dtype)
    full = nn_impl.causal_conv1d(x, w, None, 4)
    _, mag = causal_reference(x, w, None, 4, 1, 1)
    for cut in (4, 8, 20):
        frames = cut // 4
        assert_within(
            nn_impl.causal_conv1d(x[..., :cut], w, None, 4),
            full[..., :frames].astype(np.float64),
            2 * conv_tol(mag[..., :frames], 5 * 8, dtype),
            dtype,
            f"causal_conv1d of a prefix of {cut}",
        )


# ============================================================================ rotary embedding


def ref_inv_freq(j, head_dim, theta):
    return theta ** (-2.0 * j / head_dim)


@dtypes
@pytest.mark.parametrize("head_dim, theta", [(2, 10000.0), (8, 10000.0), (64, 10000.0), (128, 1000000.0), (16, 500.0)])
def test_rope_inverse_frequencies(nn_impl, dtype, head_dim, theta):
    got = nn_impl.rope_inverse_frequencies(head_dim, theta, dtype)
    ref = [ref_inv_freq(j, head_dim, theta) for j in range(head_dim // 2)]
    # theta^e with e = 2j/D rounded to dtype (relative error eps/2 in e, times |e ln theta| <= ln theta in the
    # result), the power and the reciprocal (an ulp or two each): relative error <= (ln theta / 2 + 3) eps
    tol = (math.log(theta) + 6) * eps(dtype) * np.abs(ref)
    assert_within(got, ref, tol, dtype, "rope_inverse_frequencies")


def rope_angle(p, j, head_dim, theta, dtype, impl):
    """The rotary angle of position p, pair j.  float64: p theta^(-2j/D) in float64.  float32: like the official
    code, the float32 product of float32(p) and the float32 inverse frequency (the float64 product of two
    float32 values is exact, so rounding it once to float32 is the correctly rounded float32 product)."""
    if dtype == np.float64:
        return p * ref_inv_freq(j, head_dim, theta)
    inv32 = float(impl.rope_inverse_frequencies(head_dim, theta, np.float32)[j])
    return float(np.float32(float(np.float32(p)) * inv32))


@dtypes
@pytest.mark.parametrize("head_dim, theta", [(8, 10000.0), (64, 1000000.0), (2, 10000.0)])
def test_rope_cos_sin(nn_impl, dtype, head_dim, theta):
    positions = np.array([0, 1, 2, 7, 3, 500, 4095, 65537, 123457])  # any order, large ones included
    cos, sin = nn_impl.rope_cos_sin(positions, head_dim, theta, dtype)
    half = head_dim // 2
    assert cos.shape == sin.shape == (len(positions), head_dim)
    angles = np.array(
        [[rope_angle(int(p), j, head_dim, theta, dtype, nn_impl) for j in range(half)] for p in positions]
    )
    # float64: the angle's relative error is that of the inverse frequency (~(ln theta + 6) eps), absolute
    # |angle| times that, passed 1:1 to cos/sin; float32: the angle is reproduced exactly, so only cos/sin's
    # own rounding (measured: half an ulp) remains
    if dtype == np.float64:
        tol = 4 * eps(dtype) * (1 + np.abs(angles) * (math.log(theta) + 6))
    else:
        tol = np.full(angles.shape, 4 * eps(dtype))
    for name, got, fn in (("cos", cos, math.cos), ("sin", sin, math.sin)):
        ref = np.vectorize(fn)(angles)
        assert_within(got[:, :half], ref, tol, dtype, f"rope {name}, first half")
        np.testing.assert_array_equal(got[:, half:], got[:, :half], err_msg=f"rope {name}: halves differ")
    if dtype == np.float32 and head_dim > 2:
        # the data above can tell the float32 product from the exact one (positions up to 1.2e5): cos of the
        # unrounded angle misses the check above by more than 10 x its tolerance somewhere
        exact = np.array(
            [
                [int(p) * float(nn_impl.rope_inverse_frequencies(head_dim, theta, np.float32)[j]) for j in range(half)]
                for p in positions
            ]
        )
        assert np.max(np.abs(np.cos(exact) - np.vectorize(math.cos)(angles))) > 10 * tol.max()


@dtypes
def test_rope_cos_sin_batched_positions(nn_impl, dtype):
    positions = np.array([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])
    cos, sin = nn_impl.rope_cos_sin(positions, 8, 10000.0, dtype)
    assert cos.shape == sin.shape == (2, 5, 8)
    for r in range(2):
        c1, s1 = nn_impl.rope_cos_sin(positions[r], 8, 10000.0, dtype)
        np.testing.assert_array_equal(cos[r], c1)
        np.testing.assert_array_equal(sin[r], s1)


def test_rotate_half(nn_impl):
    x = np.arange(2 * 3 * 8, dtype=np.float64).reshape(2, 3, 8) - 20
    got = nn_impl.rotate_half(x)
    want = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        for j in range(4):
            want[idx + (j,)] = -x[idx + (j + 4,)]
            want[idx + (j + 4,)] = x[idx + (j,)]
    np.testing.assert_array_equal(got, want)


@dtypes
@pytest.mark.parametrize("head_dim, theta", [(8, 10000.0), (2, 10000.0), (32, 1000000.0)])
def test_apply_rope_rotates_pairs(nn_impl, dtype, head_dim, theta):
    rng = np.random.default_rng(5)
    B, H, T = 2, 3, 6
    positions = np.array([0, 1, 5, 17, 40, 63])
    x = randn(rng, (B, H, T, head_dim), dtype)
    cos, sin = nn_impl.rope_cos_sin(positions, head_dim, theta, dtype)
    got = nn_impl.apply_rope(x, cos, sin)
    half = head_dim // 2
    want = np.empty(x.shape)
    bound = np.empty(x.shape)
    X = x.tolist()
    for b in range(B):
        for h in range(H):
            for t, p in enumerate(positions):
                for j in range(half):
                    a = int(p) * ref_inv_freq(j, head_dim, theta)
                    u, v = X[b][h][t][j], X[b][h][t][j + half]
                    want[b, h, t, j] = u * math.cos(a) - v * math.sin(a)
                    want[b, h, t, j + half] = v * math.cos(a) + u * math.sin(a)
                    # the table's angle is off by |a| (ln theta + 6) eps (see the tests above), cos/sin and the
                    # two products and the sum add a few eps of |u| + |v|
                    bound[b, h, t, [j, j + half]] = (abs(u) + abs(v)) * (2 + abs(a) * (math.log(theta) + 6))
    assert_within(got, want, 4 * eps(dtype) * bound, dtype, "apply_rope")
    # each pair keeps its norm
    g = got.astype(np.float64)
    x64 = x.astype(np.float64)
    n_got = np.hypot(g[..., :half], g[..., half:])
    n_x = np.hypot(x64[..., :half], x64[..., half:])
    assert np.all(np.abs(n_got - n_x) <= 8 * eps(dtype) * n_x + tiny(dtype))


def rope_vec(impl, vec, position, theta):
    cos, sin = impl.rope_cos_sin(np.array([position]), vec.shape[-1], theta, np.float64)
    return impl.apply_rope(vec[None, None, None, :], cos, sin)[0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2000),
    st.integers(0, 2000),
    st.integers(-500, 500),
    st.sampled_from([2, 4, 8, 64]),
    st.sampled_from([10000.0, 1000000.0]),
    st.integers(0, 2**32 - 1),
)
def test_rope_relative_position(nn_impl, m, n, shift, head_dim, theta, seed):
    """<rope(q, m), rope(k, n)> depends only on m - n: it equals
    sum_j (q_j k_j + q_j' k_j') cos((m - n) w_j) - (q_j' k_j - q_j k_j') sin((m - n) w_j), j' = j + D/2."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(head_dim), rng.standard_normal(head_dim)
    half = head_dim // 2
    rel = m - n
    want = sum(
        (q[j] * k[j] + q[j + half] * k[j + half]) * math.cos(rel * ref_inv_freq(j, head_dim, theta))
        - (q[j + half] * k[j] - q[j] * k[j + half]) * math.sin(rel * ref_inv_freq(j, head_dim, theta))
        for j in range(half)
    )
    # each rotated vector's angles are off by ~position (ln theta + 6) eps; the dot product adds D eps |q||k|
    top = max(m, n, m + shift, n + shift, 0)
    tol = 8 * eps(np.float64) * (top * (math.log(theta) + 6) + head_dim) * float(np.linalg.norm(q) * np.linalg.norm(k))
    d1 = float(np.dot(rope_vec(nn_impl, q, m, theta), rope_vec(nn_impl, k, n, theta)))
    assert abs(d1 - want) <= tol
    if min(m, n) + shift >= 0:
        d2 = float(np.dot(rope_vec(nn_impl, q, m + shift, theta), rope_vec(nn_impl, k, n + shift, theta)))
        assert abs(d2 - d1) <= 2 * tol


# ============================================================================ attention


def ref_window_mask(qpos, kpos, window):
    return np.array([[s <= p and (window is None or s > p - window) for s in kpos] for p in qpos], dtype=bool)


@pytest.mark.parametrize(
    "qpos, kpos", [(range(6), range(6)), (range(7, 10), range(10)), ([4], range(5)), (range(3), range(5))]
)
@pytest.mark.parametrize("window", [None, 1, 2, 4, 100])
def test_causal_window_mask(nn_impl, qpos, kpos, window):
    qpos, kpos = np.array(list(qpos)), np.array(list(kpos))
    got = (
        nn_impl.causal_window_mask(qpos, kpos, window) if window is not None else nn_impl.causal_window_mask(qpos, kpos)
    )
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref_window_mask(qpos.tolist(), kpos.tolist(), window))
    if window == 1:  # each query sees exactly the key at its own position (when that key exists)
        np.testing.assert_array_equal(got, qpos[:, None] == kpos[None, :])
    if window is not None:
        assert np.all(got.sum(axis=1) <= window)


def ref_attention(q, k, v, allowed, scale):
    """Per batch, per query head h (using kv head h // (H / G)), per query t: scores over the allowed keys,
    softmax in float64 (a row with no allowed key gives zeros), weighted sum of the values.  Also the error
    allowance of each output: the scores err by ~(D + 4) eps A (A: the largest scale sum_d |q_d k_d|), which
    the softmax turns into a relative error of twice that in each weight, plus ~(S + 4) eps for the
    normalisation and the weighted sum; all times sum_s p_s |v_s|."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    mask = np.broadcast_to(allowed, (B, H, T, S))
    Q, K_, V = q.tolist(), k.tolist(), v.tolist()
    out = np.zeros((B, H, T, D))
    bound = np.zeros((B, H, T, D))
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            for t in range(T):
                keys = [s for s in range(S) if mask[b, h, t, s]]
                if not keys:
                    continue
                scores = {s: scale * sum(Q[b][h][t][d] * K_[b][g][s][d] for d in range(D)) for s in keys}
                A = max(abs(scale) * sum(abs(Q[b][h][t][d] * K_[b][g][s][d]) for d in range(D)) for s in keys)
                top = max(scores.values())
                e = {s: math.exp(scores[s] - top) for s in keys}
                total = sum(e.values())
                for d in range(D):
                    out[b, h, t, d] = sum(e[s] / total * V[b][g][s][d] for s in keys)
                    bound[b, h, t, d] = (2 * (D + 4) * A + S + 4) * sum(e[s] / total * abs(V[b][g][s][d]) for s in keys)
    return out, bound


def check_attention(impl, q, k, v, allowed, scale, what):
    ref, bound = ref_attention(q, k, v, allowed, scale)
    got = impl.attention(q, k, v, allowed, scale)
    assert_within(got, ref, 4 * eps(q.dtype) * bound + tiny(q.dtype), q.dtype, what)
    return got


@st.composite
def attention_cases(draw):
    G = draw(st.integers(1, 3))
    H = G * draw(st.integers(1, 3))
    B, T, S = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    D = 2 * draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = randn(rng, (B, H, T, D), dtype)
    k = randn(rng, (B, G, S, D), dtype, scale=draw(st.sampled_from([1.0, 3.0])))
    v = randn(rng, (B, G, S, D), dtype)
    mask_shape = draw(st.sampled_from([(T, S), (B, 1, T, S), (1, H, T, S), (B, H, T, S)]))
    allowed = rng.random(mask_shape) < draw(st.sampled_from([0.5, 0.8, 1.0]))
    return q, k, v, allowed, draw(st.sampled_from([1.0 / math.sqrt(D), 0.5, 2.0]))


@settings(max_examples=60, deadline=None)
@given(attention_cases())
def test_attention(nn_impl, case):
    q, k, v, allowed, scale = case
    got = check_attention(
        nn_impl, q, k, v, allowed, scale, f"attention H={q.shape[1]} G={k.shape[1]} mask {allowed.shape}"
    )
    assert np.all(np.isfinite(got))


@dtypes
@pytest.mark.parametrize("H, G", [(6, 2), (6, 3), (6, 6), (6, 1), (3, 1), (3, 3), (5, 5), (5, 1), (1, 1)])
def test_attention_heads(nn_impl, dtype, H, G):
    rng = np.random.default_rng(H * 10 + G)
    B, T, S, D = 2, 4, 4, 8
    q, k, v = randn(rng, (B, H, T, D), dtype), randn(rng, (B, G, S, D), dtype), randn(rng, (B, G, S, D), dtype)
    causal = np.tril(np.ones((T, S), dtype=bool))
    check_attention(nn_impl, q, k, v, causal, 1 / math.sqrt(D), f"attention H={H} G={G}")
    # the head mapping seen directly: kv head g holds the constant value g, so query head h outputs h // (H / G)
    v_const = np.broadcast_to(np.arange(G, dtype=dtype)[None, :, None, None], v.shape).copy()
    got = nn_impl.attention(q, k, v_const, causal, 1 / math.sqrt(D))
    want = np.broadcast_to((np.arange(H) // (H // G)).astype(np.float64)[None, :, None, None], got.shape)
    assert_within(got, want, 4 * (S + 2) * eps(dtype) * want, dtype, "query head h uses kv head h // (H / G)")


@dtypes
def test_attention_masks_and_masked_rows(nn_impl, dtype):
    rng = np.random.default_rng(6)
    B, H, G, T, S, D = 2, 4, 2, 3, 5, 4
    q, k, v = randn(rng, (B, H, T, D), dtype), randn(rng, (B, G, S, D), dtype), randn(rng, (B, G, S, D), dtype)
    # [T, S] with a fully masked row (query 1): its output is zeros, not NaN
    ts = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    got = check_attention(nn_impl, q, k, v, ts, 0.5, "attention, [T, S] mask")
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got[:, :, 1], 0.0)
    # [B, 1, T, S]: a different mask per batch element, the same for every head; batch 1 fully masked
    b1ts = np.stack([ts, np.zeros_like(ts)])[:, None]
    got = check_attention(nn_impl, q, k, v, b1ts, 0.5, "attention, [B, 1, T, S] mask")
    np.testing.assert_array_equal(got[1], 0.0)
    assert np.all(np.isfinite(got))
    # a single allowed key: the output is exactly that key's value (weight exp(0) / exp(0) = 1)
    one = np.zeros((T, S), dtype=bool)
    one[:, 3] = True
    got = nn_impl.attention(q, k, v, one, 0.5)
    np.testing.assert_array_equal(got, np.repeat(v[:, :, 3:4], T, axis=2).repeat(H // G, axis=1))


@dtypes
def test_attention_large_scores_are_stable(nn_impl, dtype):
    """Scores in the thousands: the softmax subtracts the row maximum, so nothing overflows."""
    rng = np.random.default_rng(7)
    q, k, v = (
        randn(rng, (1, 2, 3, 4), dtype, scale=30),
        randn(rng, (1, 1, 5, 4), dtype, scale=30),
        randn(rng, (1, 1, 5, 4), dtype),
    )
    got = check_attention(nn_impl, q, k, v, np.ones((3, 5), dtype=bool), 1.0, "attention, large scores")
    assert np.all(np.isfinite(got))
