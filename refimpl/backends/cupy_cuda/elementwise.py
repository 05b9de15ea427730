"""The activations of ``refimpl/nn.py`` on the GPU, one ``cupy.ElementwiseKernel`` pass each (the reference's
formula is one CuPy operation, and one temporary array, per step).  Each kernel is the one line of CUDA C of
its ``ElementwiseSpec``, compiled on first call for the float type of the arguments."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import device


@dataclass(frozen=True)
class ElementwiseSpec:
    """The four strings of a ``cupy.ElementwiseKernel``.  ``T`` is the float type of the call (float32 or
    float64, taken from the arguments); every argument broadcasts like a NumPy ufunc's."""

    name: str
    in_params: str
    out_params: str
    operation: str


SNAKE_BETA = ElementwiseSpec(
    "refimpl_snake_beta", "T x, T alpha, T inv_beta", "T y", "const T s = sin(alpha * x);  y = x + inv_beta * (s * s);"
)

ELU = ElementwiseSpec("refimpl_elu", "T x, T alpha", "T y", "y = x > (T)0 ? x : alpha * expm1(x);")

SILU = ElementwiseSpec("refimpl_silu", "T x", "T y", "y = x * ((T)1 / ((T)1 + exp(-x)));")

GELU_ERF = ElementwiseSpec(
    "refimpl_gelu_erf", "T x", "T y", "y = (T)0.5 * x * ((T)1 + erf(x * (T)0.70710678118654752440));"
)

ELEMENTWISE_SPECS = (SNAKE_BETA, ELU, SILU, GELU_ERF)


@functools.cache
def _elementwise(spec: ElementwiseSpec):
    """The compiled-on-first-call ``cupy.ElementwiseKernel`` of ``spec``."""
    return device.array_module().ElementwiseKernel(spec.in_params, spec.out_params, spec.operation, spec.name)


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta``: x + 1 / (beta + 1e-9) * sin(alpha * x)^2 with alpha = exp(log_alpha),
    beta = exp(log_beta) per channel.  alpha and 1 / (beta + 1e-9) are computed per channel in the dtype of
    x (as the reference does), then one kernel pass over x (ElementwiseKernel SNAKE_BETA)."""
    xp = device.array_module()
    x_bct, log_alpha_c, log_beta_c = device.on_device(x_bct, log_alpha_c, log_beta_c)
    dtype = x_bct.dtype
    alpha_1c1 = xp.exp(log_alpha_c.astype(dtype, copy=False))[None, :, None]
    inv_beta_1c1 = (1.0 / (xp.exp(log_beta_c.astype(dtype, copy=False)) + dtype.type(1e-9)))[None, :, None]
    return _elementwise(SNAKE_BETA)(x_bct, alpha_1c1, inv_beta_1c1)


def elu(x, alpha: float = 1.0):
    """``nn.elu``: x for x > 0, alpha * (exp(x) - 1) otherwise (ElementwiseKernel ELU, expm1 as the reference)."""
    (x,) = device.on_device(x)
    return _elementwise(ELU)(x, x.dtype.type(alpha))


def silu(x):
    """``nn.silu``: x * sigmoid(x) = x * (1 / (1 + exp(-x))) (ElementwiseKernel SILU)."""
    (x,) = device.on_device(x)
    return _elementwise(SILU)(x)


def gelu_erf(x):
    """``nn.gelu_erf``: the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))) (ElementwiseKernel GELU_ERF)."""
    (x,) = device.on_device(x)
    return _elementwise(GELU_ERF)(x)
