"""The float32 exp and expm1 in plain arithmetic (``intrinsics._exp_f32``, ``_expm1_f32``) against the exact
functions."""

from __future__ import annotations

import numba
import numpy as np

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import numba_cpu


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
