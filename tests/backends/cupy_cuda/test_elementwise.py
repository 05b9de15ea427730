"""The elementwise twins of the cupy backend (refimpl/backends/cupy_cuda/elementwise.py), checked without a
GPU: each operation compiles with ``nvcc`` for float32 and float64 inside a wrapper that declares its
parameters as CuPy's ElementwiseKernel does (skipped, saying so, where nvcc is not installed).  Their results
on the device: tests/backends/test_cuda.py; inside the whole pipeline: tests/backends/cupy_cuda/test_pipeline.py.
"""

from __future__ import annotations

import pytest

from refimpl.backends.cupy_cuda import elementwise as cuda_elementwise

from .replays import CTYPES, needs_nvcc, nvcc_compile


def elementwise_check_source(spec: cuda_elementwise.ElementwiseSpec, ctype: str) -> str:
    """A kernel that declares the parameters of ``spec`` as CuPy's ElementwiseKernel does (inputs by value,
    outputs by reference, the index ``i``), with ``spec.operation`` as its body."""

    def params(text):
        return [p.split() for p in text.split(",")]

    ins, outs = params(spec.in_params), params(spec.out_params)
    assert all(len(p) == 2 and p[0] == "T" for p in ins + outs), spec  # only T-typed parameters are used
    pointers = [f"const T* {n}_in" for _, n in ins] + [f"T* {n}_out" for _, n in outs]
    reads = "".join(f"        const T {n} = {n}_in[i];\n" for _, n in ins)
    writes = "".join(f"        T& {n} = {n}_out[i];\n" for _, n in outs)
    return (
        f"typedef {ctype} T;\n"
        f'extern "C" __global__ void {spec.name}_check({", ".join(pointers)}, long long n) {{\n'
        f"    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;"
        f" i += (long long)gridDim.x * blockDim.x) {{\n{reads}{writes}        {spec.operation}\n    }}\n}}\n"
    )


@needs_nvcc
@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("spec", cuda_elementwise.ELEMENTWISE_SPECS, ids=lambda s: s.name)
def test_elementwise_operations_compile(tmp_path, spec, dtype):
    nvcc_compile(tmp_path, spec.name, elementwise_check_source(spec, CTYPES[dtype]))
