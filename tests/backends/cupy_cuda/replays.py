"""The cupy backend without a GPU: its CUDA kernels replayed in NumPy thread by thread (the same flat offsets,
warps, lanes and shuffle order), NumPy or the strict stand-in device in place of CuPy, and ``nvcc`` where it
is installed.  Shared by tests/backends/cupy_cuda/test_*.py and the plugin twins_on_strict.py; not a test
module.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

import numpy as np
import pytest

from refimpl import nn
from refimpl.backends import cupy_cuda
from refimpl.backends.cupy_cuda import attention as cuda_attention
from refimpl.backends.cupy_cuda import device as cuda_device
from refimpl.backends.cupy_cuda import elementwise as cuda_elementwise
from refimpl.backends.cupy_cuda import linear as cuda_linear
from refimpl.backends.cupy_cuda import transformer as cuda_transformer

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(
    NVCC is None,
    reason="nvcc (the CUDA toolkit's compiler) is not installed here: the CUDA sources are compiled only where it is",
)
CTYPES = {np.float32: "float", np.float64: "double"}


def nvcc_compile(tmp_path, name: str, source: str) -> None:
    path = tmp_path / f"{name}.cu"
    path.write_text(source)
    cubin = path.with_suffix(".cubin")
    command = [NVCC, "-arch=sm_90", "-cubin", "-Werror", "all-warnings", "-o", str(cubin), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"nvcc rejected {name}:\n{done.stderr}\n--- source ---\n{source}"


# ----------------------------------------------------------------------------- the kernels, replayed in NumPy


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
    span = 1 + sum((n - 1) * s for n, s in zip(array.shape, array.strides, strict=True)) // array.itemsize
    assert all(s >= 0 for s in array.strides)
    return np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,), writeable=False)


def emulate_attention_rows(grid, block, args):
    """``attention_rows`` of kernels/attention.cu replayed in NumPy: the same arguments (flat device buffers), the
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
    """``attention_split_partials`` of kernels/attention.cu replayed in NumPy: block (row, j) over keys
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
    """``attention_split_combine`` of kernels/attention.cu replayed in NumPy, one row after another."""
    part_max, part_sum, part_out, out = (a.reshape(-1) for a in args[:4])
    n_splits, Dv = int(args[4]), int(args[5])
    T = out.dtype.type
    for row in range(grid[0]):
        m_row, l_row = part_max[row * n_splits : (row + 1) * n_splits], part_sum[row * n_splits : (row + 1) * n_splits]
        M = max((m for m, l in zip(m_row, l_row, strict=True) if l > 0), default=T(-np.inf))
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
    """{name of a kernel of kernels/*.cu: its NumPy replay} (``unwrap`` adapts the launch)."""
    emulations = dict.fromkeys(cuda_attention.ATTENTION_KERNELS.values(), emulate_attention_rows)
    for partials, combine in cuda_attention.ATTENTION_SPLIT_KERNELS.values():
        emulations[partials], emulations[combine] = emulate_attention_split_partials, emulate_attention_split_combine
    emulations["bf16_rows_times"] = emulate_bf16_rows_times
    for norm, rope in cuda_transformer.ROWS_KERNELS.values():
        emulations[norm], emulations[rope] = emulate_rms_norm_rows, emulate_rope_rows
    return {name: unwrap(emulation) for name, emulation in emulations.items()}


def emulate_rms_norm_rows(grid, block, args):
    """``rms_norm_rows`` of kernels/rms_norm_and_rope.cu replayed in NumPy: block = row r; thread k sums
    x[r, c]^2 over c = k, k + threads, ... in that order, each warp's butterfly, the warps' sums added in order
    by thread 0, then w * (x / sqrt(sum / C + eps)); every row at once, as arrays [R, threads]."""
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
    """``rope_rows`` of kernels/rms_norm_and_rope.cu replayed in NumPy: the grid-stride loop's every index
    i < n at once, with the kernel's arithmetic for j, the row, t, b and the angle's index k."""
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
    """``bf16_rows_times`` of kernels/bf16_rows_times.cu replayed in NumPy: warp = output channel o (the grid's
    warps cover o < grid * warps per block), lane l sums x[n, i] * widen(bits[o, i]) over i = l, l + 32, ... in
    that order (float32), then the shuffle butterfly; every warp at once, as arrays [N, O, 32 lanes]."""
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


@functools.cache
def defines_kernel(file_name: str, name: str) -> bool:
    """Does kernels/<file_name> (read as the package reads it) define the kernel ``name`` ("rope_rows<float>":
    the template ``rope_rows``)?"""
    return (
        re.search(rf"__global__ void {re.escape(name.split('<')[0])}\(", cuda_device.cuda_source(file_name)) is not None
    )


def replay_kernels(setattr_, unwrap=lambda emulation: emulation) -> None:
    """Make ``device.kernel`` give each kernel's NumPy replay (``unwrap`` adapts the launch), once the file the
    room names is found to define it."""
    emulations = kernel_emulations(unwrap)

    def kernel(file_name, name, instances=()):
        assert defines_kernel(file_name, name), f"kernels/{file_name} defines no kernel {name}"
        return emulations[name]

    setattr_(cuda_device, "kernel", kernel)


def numpy_in_place_of_cupy(setattr_) -> None:
    """The twins with NumPy in place of CuPy (NumPy arrays playing the device arrays), and the kernels replaced
    by their replays."""
    setattr_(cuda_device, "array_module", lambda: np)
    setattr_(cuda_linear, "_is_host", lambda array: False)
    replay_kernels(setattr_)


# ----------------------------------------------------------------------------- the twins on the strict stand-in


def put_these_twins_on_the_strict_stand_in(setattr_, strict) -> dict:
    """Make the backend "strict" (``strict``: NumPy underneath, as strict as CuPy about host round trips) run
    THESE twins: CuPy replaced by the stand-in's namespace, the CUDA kernels by their NumPy replays (given the
    stand-in's underlying buffers, which they fill in place), the elementwise kernels by their formulas.
    ``setattr_`` does the patching (monkeypatch's, or the builtin for a whole session: see
    tests/backends/cupy_cuda/twins_on_strict.py).  Returns {twin: calls}."""
    from refimpl import backends as kernels

    setattr_(cuda_device, "array_module", lambda: strict.xp)

    def launch(emulation):
        return lambda grid, block, args: emulation(grid, block, tuple(getattr(a, "_data", a) for a in args))

    replay_kernels(setattr_, launch)
    formulas = {
        cuda_elementwise.SNAKE_BETA: lambda x, alpha, inv_beta: x + inv_beta * np.sin(alpha * x) ** 2,
        cuda_elementwise.ELU: nn.elu.reference,
        cuda_elementwise.SILU: nn.silu.reference,
        cuda_elementwise.GELU_ERF: nn.gelu_erf.reference,
    }
    setattr_(cuda_elementwise, "_elementwise", formulas.__getitem__)
    calls = dict.fromkeys(cupy_cuda.TWINS, 0)

    def counted(name, twin):
        def call(*args, **kwargs):
            calls[name] += 1
            return twin(*args, **kwargs)

        return call

    setattr_(kernels.REGISTRY["strict"], "twins", {n: counted(n, t) for n, t in cupy_cuda.TWINS.items()})
    return calls
