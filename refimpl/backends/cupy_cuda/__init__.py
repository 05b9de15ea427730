"""The cupy backend: GPU twins of the primitives of ``refimpl/nn.py`` on CuPy (same names, same signatures,
device arrays in and out), one room per kind of primitive, as in the numba backend:

    room            twins                             how
    elementwise.py  snake_beta, elu, silu, gelu_erf   one ElementwiseKernel each (a line of CUDA C)
    linear.py       linear                            a BF16Matrix on the device and a few rows: the kernel of
                                                      kernels/bf16_rows_times.cu; else cuBLAS
    conv.py         conv1d                            depthwise: a multiply-add per tap; else the formula
    attention.py    attention                         a generation step: the kernels of kernels/attention.cu;
                                                      else the formula (cuBLAS)
    transformer.py  rms_norm, apply_rope              one launch each, kernels/rms_norm_and_rope.cu
    device.py       (none: what the rooms share)      CuPy imported on first use, available(), the transfers,
                                                      the .cu files read and compiled

Each twin's docstring gives its formula (its primitive's).  A twin exists only where it is faster than the
reference or must differ from it; every other primitive (``softmax``, ``layer_norm``, ``conv_transpose1d``, ...)
is the reference itself, whose NumPy calls CuPy runs on device arrays through NumPy's dispatch
(``__array_ufunc__``, ``__array_function__``): the formula is written once, in ``refimpl/nn.py``.  Every twin
takes CuPy arrays and returns CuPy arrays (a host array handed to a twin is uploaded; the stages keep
everything on the device, so that happens only when a twin is called directly).

What the backend layer (``refimpl/backends/__init__.py``) finds here: ``xp`` (the ``cupy`` module),
``special`` (``cupyx.scipy.special``), ``to_device``, ``to_host``, ``available()`` and ``TWINS``.  Importing
this package does not import CuPy (``device.py`` says when it is).  The tests without a GPU are
tests/backends/cupy_cuda/test_*.py (the kernels compiled with ``nvcc`` where it is installed and replayed in
NumPy); on a GPU, tests/backends/test_cuda.py.
"""

from __future__ import annotations

from . import attention, conv, device, elementwise, linear, transformer
from .device import BackendUnavailable, array_module, available, to_device, to_host

__all__ = ["BackendUnavailable", "available", "array_module", "to_device", "to_host", "TWINS"]  # and xp, special


def __getattr__(name):
    """``cupy_cuda.xp`` is the ``cupy`` module and ``cupy_cuda.special`` its ``cupyx.scipy.special``, both
    imported on first use (a module-level attribute hook)."""
    if name == "xp":
        return array_module()
    if name == "special":
        return device.special_module()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TWINS = {
    "snake_beta": elementwise.snake_beta,
    "elu": elementwise.elu,
    "silu": elementwise.silu,
    "gelu_erf": elementwise.gelu_erf,
    "linear": linear.linear,
    "conv1d": conv.conv1d,
    "attention": attention.attention,
    "rms_norm": transformer.rms_norm,
    "apply_rope": transformer.apply_rope,
}
