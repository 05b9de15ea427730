"""The CuPy backend's code, checked on a machine without a GPU (and without CuPy).

- every twin has the signature of its primitive;
- every CUDA source of refimpl/backends/cupy_cuda.py compiles with ``nvcc`` for float32 and float64 (skipped,
  saying so, where nvcc is not installed): the elementwise operations inside a wrapper that declares their
  parameters as CuPy's ElementwiseKernel does, the attention module with both template instances;
- the attention kernel's index arithmetic, replayed in NumPy thread by thread (``emulate_attention_rows``: the
  same flat offsets, warps, lanes and shuffle order), run through the twin's own launch code with NumPy in
  place of CuPy, equals ``nn.attention`` (window, grouped-query heads, padding, rows with no visible key);
- the twins that are the reference's formula with ``xp`` for ``numpy`` give the reference's result when
  ``xp`` is NumPy;
- the twins inside the whole pipeline on the backend layer's strict stand-in device (NumPy underneath, as
  strict as CuPy about host round trips; the kernels replayed): decode, streaming, encode and greedy
  text-to-speech equal to the numpy backend (needs the stand-in: skipped, saying so, in a tree without it);
- asking for the backend without CuPy, or without a device, is one error naming what is missing;
- importing refimpl does not import CuPy.
The same twins on a real GPU: tests/backends/test_cuda.py (python -m pytest -m cuda).
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from attention_cases import CASES, attention_case
from conftest import REPO

from refimpl import nn
from refimpl.backends import cupy_cuda

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(
    NVCC is None,
    reason="nvcc (the CUDA toolkit's compiler) is not installed here: the CUDA sources are compiled only where it is",
)
CTYPES = {np.float32: "float", np.float64: "double"}


def test_every_twin_has_the_signature_of_its_primitive():
    for name, twin in cupy_cuda.TWINS.items():
        primitive = getattr(nn, name)
        assert hasattr(primitive, "reference"), f"nn.{name} is not a @primitive"
        assert inspect.signature(twin) == inspect.signature(primitive.reference), name
        assert f"nn.{name}" in twin.__doc__, f"the docstring of the {name} twin does not name its primitive"


# ----------------------------------------------------------------------------- compiling the CUDA sources


def elementwise_check_source(spec: cupy_cuda.ElementwiseSpec, ctype: str) -> str:
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


def nvcc_compile(tmp_path, name: str, source: str) -> None:
    path = tmp_path / f"{name}.cu"
    path.write_text(source)
    cubin = path.with_suffix(".cubin")
    command = [NVCC, "-arch=sm_90", "-cubin", "-Werror", "all-warnings", "-o", str(cubin), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"nvcc rejected {name}:\n{done.stderr}\n--- source ---\n{source}"


@needs_nvcc
@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("spec", cupy_cuda.ELEMENTWISE_SPECS, ids=lambda s: s.name)
def test_elementwise_operations_compile(tmp_path, spec, dtype):
    nvcc_compile(tmp_path, spec.name, elementwise_check_source(spec, CTYPES[dtype]))


@needs_nvcc
def test_bf16_module_compiles(tmp_path):
    nvcc_compile(tmp_path, "bf16", cupy_cuda.BF16_SOURCE)


@needs_nvcc
def test_attention_module_compiles_for_both_dtypes(tmp_path):
    # taking the address of each instance makes nvcc compile it, as CuPy's name_expressions make NVRTC do
    names = list(cupy_cuda.ATTENTION_KERNELS.values()) + [
        n for pair in cupy_cuda.ATTENTION_SPLIT_KERNELS.values() for n in pair
    ]
    keep = ", ".join(f"(void*)&{name}" for name in names)
    nvcc_compile(tmp_path, "attention", cupy_cuda.ATTENTION_SOURCE + f"\nvoid* kernels_to_compile[] = {{{keep}}};\n")


@needs_nvcc
def test_rows_module_compiles_for_both_dtypes(tmp_path):
    names = [name for pair in cupy_cuda.ROWS_KERNELS.values() for name in pair]
    keep = ", ".join(f"(void*)&{name}" for name in names)
    nvcc_compile(tmp_path, "rows", cupy_cuda.ROWS_SOURCE + f"\nvoid* kernels_to_compile[] = {{{keep}}};\n")


# ----------------------------------------------------------------------------- the twins' Python code, with NumPy as xp


def warp_sum(lanes_32):
    """The butterfly of ``warp_sum`` (__shfl_xor_sync with offsets 16, 8, 4, 2, 1) over the last axis, a warp's
    32 lanes (any warps before it side by side): every lane ends with the sum."""
    for offset in (16, 8, 4, 2, 1):
        lanes_32 = lanes_32 + lanes_32[..., np.arange(32) ^ offset]
    return lanes_32


def device_memory_from(array):
    """The memory a kernel sees from a (possibly strided) array's first element on: a flat view running
    up to its last element, read through the array's own buffer."""
    if array.size == 0:
        return array.reshape(-1)
    span = 1 + sum((n - 1) * s for n, s in zip(array.shape, array.strides)) // array.itemsize
    assert all(s >= 0 for s in array.strides)
    return np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,), writeable=False)


def emulate_attention_rows(grid, block, args):
    """ATTENTION_SOURCE's ``attention_rows`` replayed in NumPy: the same arguments (flat device buffers), the
    same index arithmetic, one block after another; the threads of a block as loops in the kernel's order."""
    (
        q,
        k,
        v,
        query_pos,
        key_pos,
        key_valid,
        scores,
        out,
        H,
        G,
        Tq,
        S,
        D,
        Dv,
        ksb,
        ksg,
        vsb,
        vsg,
        window,
        has_key_valid,
        scale,
    ) = args
    q, key_valid, scores, out = (a.reshape(-1) for a in (q, key_valid, scores, out))
    k, v = device_memory_from(k), device_memory_from(v)
    H, G, Tq, S, D, Dv, window, has_key_valid = map(int, (H, G, Tq, S, D, Dv, window, has_key_valid))
    ksb, ksg, vsb, vsg = map(int, (ksb, ksg, vsb, vsg))
    T = q.dtype.type
    n_threads = block[0]
    n_warps = n_threads // 32
    neg_inf = T(-np.inf)
    for row in range(grid[0]):
        t = row % Tq
        h = (row // Tq) % H
        b = row // (Tq * H)
        g = h // (H // G)
        q_row, k_bg, v_bg, score_row = row * D, b * ksb + g * ksg, b * vsb + g * vsg, row * S
        p = query_pos[t]
        for warp in range(n_warps):
            for s in range(warp, S, n_warps):
                lanes = np.zeros(32, dtype=q.dtype)
                for lane in range(32):
                    for d in range(lane, D, 32):
                        lanes[lane] += q[q_row + d] * k[k_bg + s * D + d]
                dot = warp_sum(lanes)[0]
                ks = key_pos[s]
                visible = (
                    ks <= p and (window < 0 or ks > p - window) and (not has_key_valid or key_valid[b * S + s] != 0)
                )
                scores[score_row + s] = dot * scale if visible else neg_inf
        m = max((scores[score_row + s] for s in range(S)), default=neg_inf)
        with np.errstate(invalid="ignore"):
            finite = m - m == 0
        if not finite:
            m = T(0)
        total = T(0)
        for s in range(S):
            scores[score_row + s] = np.exp(scores[score_row + s] - m)
            total += scores[score_row + s]
        if total == 0:
            total = T(1)
        for s in range(S):
            scores[score_row + s] = scores[score_row + s] / total
        for d in range(Dv):
            acc = T(0)
            for s in range(S):
                acc += scores[score_row + s] * v[v_bg + s * Dv + d]
            out[row * Dv + d] = acc


def emulate_attention_split_partials(grid, block, args):
    """ATTENTION_SOURCE's ``attention_split_partials`` replayed in NumPy: block (row, j) over keys
    j * chunk <= s < min(S, (j + 1) * chunk), the same index arithmetic and warp order as the row kernel."""
    (q, k, v, query_pos, key_pos, key_valid, scores, part_max, part_sum, part_out) = args[:10]
    H, G, Tq, S, D, Dv, ksb, ksg, vsb, vsg, window, has_key_valid = map(int, args[10:22])
    scale, chunk = args[22], int(args[23])
    q, key_valid, scores = (a.reshape(-1) for a in (q, key_valid, scores))
    part_max, part_sum, part_out = (a.reshape(-1) for a in (part_max, part_sum, part_out))
    k, v = device_memory_from(k), device_memory_from(v)
    T = q.dtype.type
    n_warps, n_splits = block[0] // 32, grid[1]
    for row in range(grid[0]):
        t, h, b = row % Tq, (row // Tq) % H, row // (Tq * H)
        g = h // (H // G)
        q_row, k_bg, v_bg, score_row = row * D, b * ksb + g * ksg, b * vsb + g * vsg, row * S
        p = query_pos[t]
        for split in range(n_splits):
            s0, s1 = split * chunk, min(S, split * chunk + chunk)
            for warp in range(n_warps):
                for s in range(s0 + warp, s1, n_warps):
                    lanes = np.zeros(32, dtype=q.dtype)
                    for lane in range(32):
                        for d in range(lane, D, 32):
                            lanes[lane] += q[q_row + d] * k[k_bg + s * D + d]
                    ks = key_pos[s]
                    visible = (
                        ks <= p and (window < 0 or ks > p - window) and (not has_key_valid or key_valid[b * S + s] != 0)
                    )
                    scores[score_row + s] = warp_sum(lanes)[0] * scale if visible else T(-np.inf)
            m = max((scores[score_row + s] for s in range(s0, s1)), default=T(-np.inf))
            with np.errstate(invalid="ignore"):
                m = m if m - m == 0 else T(0)
            total = T(0)
            for s in range(s0, s1):
                scores[score_row + s] = np.exp(scores[score_row + s] - m)
                total += scores[score_row + s]
            part = row * n_splits + split
            for d in range(Dv):
                acc = T(0)
                for s in range(s0, s1):
                    acc += scores[score_row + s] * v[v_bg + s * Dv + d]
                part_out[part * Dv + d] = acc
            part_max[part], part_sum[part] = m, total


def emulate_attention_split_combine(grid, block, args):
    """ATTENTION_SOURCE's ``attention_split_combine`` replayed in NumPy, one row after another."""
    part_max, part_sum, part_out, out = (a.reshape(-1) for a in args[:4])
    n_splits, Dv = int(args[4]), int(args[5])
    T = out.dtype.type
    for row in range(grid[0]):
        m_row, l_row = part_max[row * n_splits : (row + 1) * n_splits], part_sum[row * n_splits : (row + 1) * n_splits]
        M = max((m for m, l in zip(m_row, l_row) if l > 0), default=T(-np.inf))
        with np.errstate(invalid="ignore"):
            M = M if M - M == 0 else T(0)
        total = T(0)
        for j in range(n_splits):
            total += np.exp(m_row[j] - M) * l_row[j] if l_row[j] > 0 else T(0)
        total = total if total != 0 else T(1)
        for d in range(Dv):
            acc = T(0)
            for j in range(n_splits):
                if l_row[j] > 0:
                    acc += np.exp(m_row[j] - M) * part_out[(row * n_splits + j) * Dv + d]
            out[row * Dv + d] = acc / total


def kernel_emulations(unwrap=lambda emulation: emulation) -> dict:
    """{kernel name of ATTENTION_SOURCE / BF16_SOURCE: its NumPy replay} (``unwrap`` adapts the launch)."""
    emulations = {name: emulate_attention_rows for name in cupy_cuda.ATTENTION_KERNELS.values()}
    for partials, combine in cupy_cuda.ATTENTION_SPLIT_KERNELS.values():
        emulations[partials], emulations[combine] = emulate_attention_split_partials, emulate_attention_split_combine
    emulations["bf16_rows_times"] = emulate_bf16_rows_times
    for norm, rope in cupy_cuda.ROWS_KERNELS.values():
        emulations[norm], emulations[rope] = emulate_rms_norm_rows, emulate_rope_rows
    return {name: unwrap(emulation) for name, emulation in emulations.items()}


def emulate_rms_norm_rows(grid, block, args):
    """ROWS_SOURCE's ``rms_norm_rows`` replayed in NumPy: block = row r; thread k sums x[r, c]^2 over c = k,
    k + threads, ... in that order, each warp's butterfly, the warps' sums added in order by thread 0, then
    w * (x / sqrt(sum / C + eps)); every row at once, as arrays [R, threads]."""
    x, w, out, C, eps = args
    C, R, threads = int(C), grid[0], block[0]
    assert threads % 32 == 0 and threads <= 1024
    x_rc = x.reshape(-1)[: R * C].reshape(R, C)
    lanes = np.zeros((R, threads), dtype=x.dtype)
    for start in range(0, C, threads):  # the loop "for (c = threadIdx.x; c < C; c += blockDim.x)"
        stop = min(C, start + threads)
        lanes[:, : stop - start] += x_rc[:, start:stop] * x_rc[:, start:stop]
    warps = warp_sum(lanes.reshape(R, threads // 32, 32))
    total = np.zeros(R, dtype=x.dtype)
    for k in range(threads // 32):
        total = total + warps[:, k, 0]
    root = np.sqrt(total / x.dtype.type(C) + eps)
    out.reshape(-1)[: R * C] = (w.reshape(-1)[:C] * (x_rc / root[:, None])).reshape(-1)


def emulate_rope_rows(grid, block, args):
    """ROWS_SOURCE's ``rope_rows`` replayed in NumPy: the grid-stride loop's every index i < n at once, with the
    kernel's arithmetic for j, the row, t, b and the angle's index k."""
    x, cos, sin, out, n, H, Tn, D, cos_batches = args
    n, H, Tn, D, cos_batches = (int(v) for v in (n, H, Tn, D, cos_batches))
    assert grid[0] * block[0] >= 1
    i = np.arange(n)
    j, row = i % D, i // D
    t = row % Tn
    b = np.zeros_like(row) if cos_batches == 1 else row // (Tn * H)
    k = (b * Tn + t) * D + j
    half = D // 2
    flat = x.reshape(-1)
    rotated = np.where(j < half, -flat[np.minimum(i + half, n - 1)], flat[np.maximum(i - half, 0)])
    out.reshape(-1)[:n] = flat[:n] * cos.reshape(-1)[k] + rotated * sin.reshape(-1)[k]


def emulate_bf16_rows_times(grid, block, args):
    """BF16_SOURCE's ``bf16_rows_times`` replayed in NumPy: warp = output channel o (the grid's warps cover
    o < grid * warps per block), lane l sums x[n, i] * widen(bits[o, i]) over i = l, l + 32, ... in that order
    (float32), then the shuffle butterfly; every warp at once, as arrays [N, O, 32 lanes]."""
    x, bits, out, N, O, I = args
    N, O, I = int(N), int(O), int(I)
    x_ni = x.reshape(-1)[: N * I].reshape(N, I)
    w_oi = (bits.reshape(-1)[: O * I].astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(O, I)
    covered = min(O, grid[0] * (block[0] // 32))  # the warps launched
    lanes_no32 = np.zeros((N, covered, 32), dtype=np.float32)
    for start in range(0, I, 32):  # the loop "for (i = lane; i < I; i += 32)", all lanes side by side
        stop = min(I, start + 32)
        lanes_no32[:, :, : stop - start] += x_ni[:, None, start:stop] * w_oi[None, :covered, start:stop]
    lanes_no32 = warp_sum(lanes_no32)
    out.reshape(N, O)[:, :covered] = lanes_no32[..., 0]


@pytest.fixture
def numpy_as_xp(monkeypatch):
    """The twins' module with NumPy in place of CuPy (NumPy arrays playing the device arrays), and the
    kernels replaced by their emulations."""
    monkeypatch.setattr(cupy_cuda, "array_module", lambda: np)
    monkeypatch.setattr(cupy_cuda, "_is_host", lambda array: False)
    emulations = kernel_emulations()
    monkeypatch.setattr(cupy_cuda, "_attention_named", emulations.__getitem__)
    monkeypatch.setattr(cupy_cuda, "_bf16_function", lambda: emulations["bf16_rows_times"])
    monkeypatch.setattr(cupy_cuda, "_rows_named", emulations.__getitem__)
    return cupy_cuda


@pytest.mark.parametrize("split_keys", [None, 3], ids=["one block per row", "keys split over blocks"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_attention_kernel_equals_the_reference(numpy_as_xp, monkeypatch, case, dtype, split_keys):
    if split_keys:  # parts of 3 keys: several blocks per row, parts with no visible key among them
        monkeypatch.setattr(cupy_cuda, "ATTENTION_SPLIT_KEYS", split_keys)
    q, k, v, mask = attention_case(len(case), dtype, **CASES[case])
    S = k.shape[2]
    assert (cupy_cuda.attention_splits(q.shape[0] * q.shape[1] * q.shape[2], S)[0] > 1) == bool(split_keys)
    ref = nn.attention.reference(q, k, v, mask, scale=0.125)
    got = numpy_as_xp.attention_rows_kernel(q, k, v, mask, 0.125)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-13  # sums in another order only
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol)
    if case == "padded":
        assert np.all(got[-1] == 0) and np.any(got[0] != 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["causal", "window", "padded", "mqa_window_padded"])
def test_attention_formula_path_equals_the_reference(numpy_as_xp, case, dtype):
    q, k, v, mask = attention_case(7, dtype, **{**CASES[case], "Tq": 20, "S": 30})
    ref = nn.attention.reference(q, k, v, mask, scale=0.3)
    assert q.shape[2] > cupy_cuda.DECODE_MAX_QUERIES  # the dispatcher takes the cuBLAS formula
    np.testing.assert_array_equal(numpy_as_xp.attention(q, k, v, mask, 0.3), ref)
    dense = mask.rows(0, q.shape[2])  # an explicit boolean mask
    np.testing.assert_array_equal(numpy_as_xp.attention(q, k, v, dense, 0.3), ref)


def test_attention_refuses_heads_that_do_not_share(numpy_as_xp):
    q, k, v, mask = attention_case(0, np.float32, H=4, G=3)
    with pytest.raises(ValueError, match="3 key/value heads"):
        numpy_as_xp.attention(q, k, v, mask, 0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_formula_twins_equal_the_reference_with_numpy_as_xp(numpy_as_xp, dtype):
    rng = np.random.default_rng(3)
    r = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    x_btc, w_oi, b_o = r(2, 5, 8), r(6, 8), r(6)
    np.testing.assert_array_equal(numpy_as_xp.linear(x_btc, w_oi, b_o), nn.linear.reference(x_btc, w_oi, b_o))
    for groups, (C, O, I) in {1: (4, 6, 4), 2: (4, 6, 2), 4: (4, 4, 1)}.items():  # dense, grouped, depthwise
        x, wk, bias = r(2, C, 12), r(O, I, 3), r(O)
        got = numpy_as_xp.conv1d(x, wk, bias, 2, 2, groups)
        np.testing.assert_allclose(
            got,
            nn.conv1d.reference(x, wk, bias, 2, 2, groups),
            rtol=1e-5 if dtype == np.float32 else 1e-13,
            err_msg=f"conv1d groups={groups}",
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 9, 64), (3, 5, 8, 128), (2, 3, 1000), (1, 1, 20)])
def test_rms_norm_kernel_equals_the_reference(numpy_as_xp, shape, dtype):
    """The norm's kernel, replayed: rows of one warp, of several, longer than a block (each thread several
    values), shorter than a warp; within the reference's own rounding of a sum of C squares, against float64."""
    rng = np.random.default_rng(sum(shape))
    x, w = (rng.standard_normal(shape) * 3).astype(dtype), rng.standard_normal(shape[-1]).astype(dtype)
    got = numpy_as_xp.rms_norm(x, w, 1e-6)
    exact = nn.rms_norm.reference(x.astype(np.float64), w.astype(np.float64), 1e-6)
    ref = nn.rms_norm.reference(x, w, 1e-6)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    eps = np.finfo(dtype).eps
    bound = (shape[-1] + 4) * eps * np.abs(exact)  # (the sum's C terms, the root, the division and the product)
    assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
    assert numpy_as_xp.rms_norm(x, w.astype(np.float16), 1e-6).dtype == ref.dtype  # another dtype: the reference


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_kernel_equals_the_reference_to_the_bit(numpy_as_xp, dtype):
    """The rotation's kernel, replayed: x [B, H, T, D] read through a transpose (a layer's q), angles [T, D],
    [1, 1, T, D] and one set per batch [B, 1, T, D]: the reference's arithmetic, so the same bits; shapes the
    kernel does not take (angles that would broadcast over the heads, an odd D) run the reference."""
    rng = np.random.default_rng(5)
    x_bhtd = rng.standard_normal((2, 9, 4, 64)).astype(dtype).transpose(0, 2, 1, 3)
    positions = np.stack([np.arange(9), np.arange(3, 12)])
    cos_td, sin_td = nn.rope_cos_sin(positions[0], 64, 10000.0, dtype)
    both = [nn.rope_cos_sin(p, 64, 10000.0, dtype) for p in positions]
    cos_b1td, sin_b1td = (np.stack([pair[i] for pair in both])[:, None] for i in (0, 1))
    for cos, sin in ((cos_td, sin_td), (cos_td[None, None], sin_td[None, None]), (cos_b1td, sin_b1td)):
        assert numpy_as_xp._rope_batches(cos, 2, 9, 64) in (1, 2)
        got = numpy_as_xp.apply_rope(x_bhtd, cos, sin)
        np.testing.assert_array_equal(got, nn.apply_rope.reference(x_bhtd, cos, sin))
    assert numpy_as_xp._rope_batches(cos_b1td[:, 0], 2, 9, 64) is None  # [2, T, D] would pair with the heads
    odd = rng.standard_normal((1, 2, 3, 5)).astype(dtype)
    cos5, sin5 = rng.standard_normal((3, 5)).astype(dtype), rng.standard_normal((3, 5)).astype(dtype)
    np.testing.assert_array_equal(numpy_as_xp.apply_rope(odd, cos5, sin5), nn.apply_rope.reference(odd, cos5, sin5))


@pytest.mark.parametrize("rows", [1, 3, 17])  # the kernel up to MATVEC_MAX_ROWS = 16, then widen + cuBLAS
def test_bf16_linear_equals_the_reference(numpy_as_xp, rows):
    from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

    rng = np.random.default_rng(rows)
    w = BF16Matrix(float32_to_bf16_bits(rng.standard_normal((11, 70)).astype(np.float32)))
    x, b = rng.standard_normal((rows, 70)).astype(np.float32), rng.standard_normal(11).astype(np.float32)
    ref = nn.linear.reference(x, np.asarray(w), b)
    got = numpy_as_xp.linear(x, w, b)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(numpy_as_xp.widen_bf16(w.bits), np.asarray(w))  # widening is exact
    assert numpy_as_xp.bf16_rows_times(x[:0], w.bits).shape == (0, 11)


def test_linear_refuses_host_bf16_words_and_non_arrays(monkeypatch):
    from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

    monkeypatch.setattr(cupy_cuda, "array_module", lambda: np)
    w = BF16Matrix(float32_to_bf16_bits(np.ones((3, 4), np.float32)))
    with pytest.raises(TypeError, match="still on the host"):
        cupy_cuda.linear(np.ones((2, 4), np.float32), w)
    with pytest.raises(TypeError, match="as an array on the device, got list"):
        cupy_cuda.linear(np.ones((2, 4), np.float32), [[1.0] * 4])


# ----------------------------------------------------------------------------- asking for the backend


@pytest.fixture
def fresh_availability():
    cupy_cuda.available.cache_clear()
    yield
    cupy_cuda.available.cache_clear()


def test_without_cupy_the_error_names_the_extras(monkeypatch, fresh_availability):
    monkeypatch.setitem(sys.modules, "cupy", None)  # "import cupy" fails as when it is not installed
    with pytest.raises(cupy_cuda.BackendUnavailable, match=r"CuPy is not installed.*\[cuda12\].*\[cuda13\]"):
        cupy_cuda.available()
    with pytest.raises(RuntimeError, match="CuPy is not installed"):
        cupy_cuda.to_device(np.zeros(3))
    with pytest.raises(cupy_cuda.BackendUnavailable):
        cupy_cuda.xp


def fake_cupy(device_count):
    """A stand-in ``cupy`` whose CUDA runtime raises as CuPy's does on a machine without a driver or device."""

    def get_device_count():
        if isinstance(device_count, Exception):
            raise device_count
        return device_count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    return types.SimpleNamespace(__version__="99.0.0", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize(
    "count, said",
    [
        (
            RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"),
            "cudaErrorNoDevice: no CUDA-capable device is detected",
        ),
        (0, "reports 0 devices"),
    ],
)
def test_without_a_device_the_error_says_what_cupy_said(monkeypatch, fresh_availability, count, said):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(count))
    with pytest.raises(cupy_cuda.BackendUnavailable) as raised:
        cupy_cuda.available()
    assert "CuPy 99.0.0 is installed but found no usable CUDA device" in str(raised.value)
    assert said in str(raised.value)


def test_to_host_keeps_numpy_arrays_and_calls_get():
    a = np.arange(3)
    assert cupy_cuda.to_host(a) is a
    assert cupy_cuda.to_host(types.SimpleNamespace(get=lambda: a)) is a
    with pytest.raises(AttributeError, match="no attribute 'cupy'"):
        cupy_cuda.cupy


def test_importing_refimpl_and_the_backend_module_does_not_import_cupy():
    code = (
        "import sys, refimpl, refimpl.backends.cupy_cuda, refimpl.tts; "
        "assert 'cupy' not in sys.modules, 'cupy imported'; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ----------------------------------------------------------------------------- the twins inside the whole pipeline


def put_these_twins_on_the_strict_stand_in(setattr_, strict) -> dict:
    """Make the backend "strict" (``strict``: NumPy underneath, as strict as CuPy about host round trips) run
    THESE twins: CuPy replaced by the stand-in's namespace, the CUDA kernels by their NumPy replays (given the
    stand-in's underlying buffers, which they fill in place), the elementwise kernels by their formulas.
    ``setattr_`` does the patching (monkeypatch's, or the builtin for a whole session: see
    tests/backends/cupy_twins_on_strict.py).  Returns {twin: calls}."""
    from refimpl import backends as kernels

    setattr_(cupy_cuda, "array_module", lambda: strict.xp)

    def launch(emulation):
        return lambda grid, block, args: emulation(grid, block, tuple(getattr(a, "_data", a) for a in args))

    emulations = kernel_emulations(launch)
    setattr_(cupy_cuda, "_attention_named", emulations.__getitem__)
    setattr_(cupy_cuda, "_bf16_function", lambda: emulations["bf16_rows_times"])
    setattr_(cupy_cuda, "_rows_named", emulations.__getitem__)
    formulas = {
        cupy_cuda.SNAKE_BETA: lambda x, alpha, inv_beta: x + inv_beta * np.sin(alpha * x) ** 2,
        cupy_cuda.ELU: nn.elu.reference,
        cupy_cuda.SILU: nn.silu.reference,
        cupy_cuda.GELU_ERF: nn.gelu_erf.reference,
    }
    setattr_(cupy_cuda, "_elementwise", formulas.__getitem__)
    calls = dict.fromkeys(cupy_cuda.TWINS, 0)

    def counted(name, twin):
        def call(*args, **kwargs):
            calls[name] += 1
            return twin(*args, **kwargs)

        return call

    setattr_(kernels.REGISTRY["strict"], "twins", {n: counted(n, t) for n, t in cupy_cuda.TWINS.items()})
    return calls


@pytest.fixture
def cupy_twins_on_the_strict_stand_in(monkeypatch):
    strict = pytest.importorskip(
        "refimpl.backends.strict_device", reason="the strict stand-in of the backend layer is not in this tree"
    )
    return put_these_twins_on_the_strict_stand_in(monkeypatch.setattr, strict)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_pipeline_with_these_twins_on_device_arrays_equals_numpy(cupy_twins_on_the_strict_stand_in, dtype):
    """Decode (one pass and streamed), encode and greedy text-to-speech with the twins on device arrays: the
    twins take what the stages hand them (no host array reaches the device but through to_device, no device
    array is read implicitly) and give the numpy backend's results (float32: within the reordered sums)."""
    from conftest import CHECKPOINTS

    from refimpl import Qwen3TTS, SpeechTokenizer
    from refimpl.backends import use_backend

    calls = cupy_twins_on_the_strict_stand_in
    tol = 1e-12 if dtype == np.float64 else 2e-5  # float32: the decoder parity tests' waveform tolerance
    with use_backend("numpy"):
        cpu_tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=dtype)
        cpu_tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=dtype)
    with use_backend("strict"):
        dev_tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=dtype)
        dev_tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=dtype)
    codes = np.random.default_rng(0).integers(0, cpu_tok.codebook_size, size=(23, cpu_tok.num_quantizers))
    wav = dev_tok.decode(codes)
    assert isinstance(wav, np.ndarray)
    np.testing.assert_allclose(wav, cpu_tok.decode(codes), rtol=0, atol=tol)
    stream = dev_tok.stream()
    np.testing.assert_allclose(
        np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, 23, 4)]), wav, rtol=0, atol=tol
    )
    audio = (0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
    np.testing.assert_array_equal(dev_tok.encode(audio, sr=24000), cpu_tok.encode(audio, sr=24000))
    greedy = dict(
        text="The GPU speaks as the CPU does.",
        speaker="vivian",
        language="english",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=8,
        return_codes=True,
    )
    dev_wavs, _, dev_codes = dev_tts.generate_custom_voice(**greedy)
    cpu_wavs, _, cpu_codes = cpu_tts.generate_custom_voice(**greedy)
    np.testing.assert_array_equal(dev_codes[0], cpu_codes[0])
    np.testing.assert_allclose(dev_wavs[0], cpu_wavs[0], rtol=0, atol=tol)
    ran = {name for name, n in calls.items() if n}
    assert ran == set(cupy_cuda.TWINS), sorted(set(calls) - ran)  # every twin ran


@pytest.fixture(scope="module")
def bf16_custom_voice(tmp_path_factory):
    """The tiny CustomVoice model with its weights stored in bfloat16, as the released checkpoints store them
    (the talker's and code predictor's matrices then load as BF16Matrix)."""
    import shutil

    from conftest import CHECKPOINTS

    from refimpl.io.checkpoint import read_safetensors_file, write_safetensors_file

    source, path = CHECKPOINTS / "tiny-customvoice", tmp_path_factory.mktemp("bf16") / "tiny-customvoice-bf16"
    shutil.copytree(source, path, ignore=lambda folder, names: ["model.safetensors"] if folder == str(source) else [])
    weights = read_safetensors_file(source / "model.safetensors", np.float32)
    write_safetensors_file(path / "model.safetensors", weights, "bfloat16")
    return path


def generate_greedy(model, frames: int = 4):
    wavs, _, codes = model.generate_custom_voice(
        "Half the bytes.", speaker="vivian", language="english", do_sample=False, subtalker_dosample=False,
        max_new_tokens=frames, return_codes=True,
    )  # fmt: skip
    return wavs[0], codes[0]


@pytest.mark.parametrize("twins", ["cupy twins", "reference formulas"])
def test_bf16_words_stay_bf16_on_the_device(bf16_custom_voice, monkeypatch, twins):
    """A bf16 checkpoint on a device backend keeps its matrices as 16-bit words on the device (half the bytes of
    float32): with the cupy twins the bf16 kernel reads them in every generation step (replayed here), with the
    reference formulas every use widens what it takes; greedy generation equals the host's either way."""
    from refimpl import Qwen3TTS
    from refimpl.backends import strict_device, use_backend
    from refimpl.backends.bf16 import BF16Matrix

    launches = []
    if twins == "cupy twins":
        put_these_twins_on_the_strict_stand_in(monkeypatch.setattr, strict_device)
        replay = cupy_cuda._bf16_function()
        monkeypatch.setattr(cupy_cuda, "_bf16_function", lambda: lambda *a: launches.append(1) or replay(*a))
    with use_backend("numpy"):
        cpu = Qwen3TTS.from_pretrained(bf16_custom_voice, dtype=np.float32)
    with use_backend("strict"):
        dev = Qwen3TTS.from_pretrained(bf16_custom_voice, dtype=np.float32)
    for weights in (dev.talker.weights, dev.talker.code_predictor.weights):
        kept = [w for w in weights.values() if isinstance(w, BF16Matrix)]
        assert kept and all(isinstance(w.bits, strict_device.StrictArray) for w in kept)
    assert isinstance(dev.talker.weights["codec_head.weight"], BF16Matrix)
    dev_wav, dev_codes = generate_greedy(dev)
    cpu_wav, cpu_codes = generate_greedy(cpu)
    np.testing.assert_array_equal(dev_codes, cpu_codes)
    np.testing.assert_allclose(dev_wav, cpu_wav, rtol=0, atol=2e-5)
    assert bool(launches) == (twins == "cupy twins")
