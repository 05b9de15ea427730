"""Kernel-level speed of the numba backend against the plain NumPy primitives, and the machine's limits.

    python benchmarks/bench_kernels.py [--repeats 20]

For the memory-bound kernels the useful unit is bytes of weights read per second (GB/s), compared with the
machine's own streaming bandwidth (measured here with a large array copy, reads + writes); for SnakeBeta,
samples per second; for the convolutions, GFLOP/s.  Shapes: one generation step of the 0.6B Talker (q/k/v/o,
gate/up/down of 4 layers), the largest SnakeBeta of the codec decoder (96 channels at 24 kHz, 10 s) and its
largest convolutions, its fused residual units and transposed convolutions, and sgemm.  Threads: NUMBA_NUM_THREADS and
OPENBLAS_NUM_THREADS as set in the environment (printed).
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (puts the repository on sys.path, sets OpenBLAS's idle spin before NumPy loads it)
import numpy as np

from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

# (rows, columns) of every matrix one 0.6B Talker layer multiplies a hidden state by
TALKER_LAYER = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072)]


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import numba

    print(
        f"numba {numba.__version__}, {numba.get_num_threads()} threads; OPENBLAS_NUM_THREADS="
        f"{os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}; load average {os.getloadavg()[0]:.2f}"
    )
    rng = np.random.default_rng(0)

    big = np.ones(256 * 2**20 // 4, np.float32)  # 256 MB
    out = np.empty_like(big)
    t = best(lambda: np.copyto(out, big), max(3, args.repeats // 4))
    copy_gbs = 2 * big.nbytes / t / 1e9
    print(f"machine: array copy {copy_gbs:.1f} GB/s (read + write)")

    mats = [rng.standard_normal(shape).astype(np.float32) for shape in TALKER_LAYER * 4]  # 4 layers, > cache
    bf16 = [BF16Matrix(float32_to_bf16_bits(w)) for w in mats]
    f32 = [np.asarray(m) for m in bf16]
    x = {n: rng.standard_normal((1, n)).astype(np.float32) for n in (1024, 2048, 3072)}
    nbytes_bf16 = sum(m.nbytes for m in bf16)
    nbytes_f32 = sum(w.nbytes for w in f32)
    t_numpy = best(lambda: [nn.linear.reference(x[w.shape[1]], w) for w in f32], args.repeats)
    t_bf16 = best(lambda: [numba_cpu.linear(x[m.shape[1]], m) for m in bf16], args.repeats)
    print(f"talker step matrices (4 layers, {len(bf16)} products, batch 1):")
    print(f"  numpy, float32 weights : {1e3 * t_numpy:7.2f} ms  {nbytes_f32 / t_numpy / 1e9:5.1f} GB/s of weights")
    print(
        f"  numba, bf16 as stored  : {1e3 * t_bf16:7.2f} ms  {nbytes_bf16 / t_bf16 / 1e9:5.1f} GB/s of weights  "
        f"(x{t_numpy / t_bf16:.2f})"
    )

    x_bct = (2 * rng.standard_normal((1, 96, 240000))).astype(np.float32)
    la, lb = (0.3 * rng.standard_normal((2, 96))).astype(np.float32)
    n = x_bct.size
    t_ref = best(lambda: nn.snake_beta.reference(x_bct, la, lb), max(3, args.repeats // 4))
    t_nb = best(lambda: numba_cpu.snake_beta(x_bct, la, lb), max(3, args.repeats // 4))
    print(
        f"SnakeBeta [1, 96, 240000]: numpy {1e3 * t_ref:.1f} ms ({n / t_ref / 1e9:.2f} G samples/s), "
        f"numba {1e3 * t_nb:.1f} ms ({n / t_nb / 1e9:.2f} G samples/s, x{t_ref / t_nb:.2f}); "
        f"bytes moved by numba {8 * n / t_nb / 1e9:.1f} GB/s"
    )
    conv_gflops(args.repeats)
    sgemm_gflops(rng)
    decoder_pieces_gflops(max(3, args.repeats // 6))


def sgemm_gflops(rng) -> None:
    """The machine's matrix-product limit: OpenBLAS sgemm 2048^3 with its threads and with one (the rate of
    one piece of ``run_pieces``)."""
    import threadpoolctl

    a, b = (rng.standard_normal((2, 2048, 2048))).astype(np.float32)
    out = np.empty_like(a)
    flops = 2 * 2048**3
    t_all = best(lambda: np.matmul(a, b, out=out), 5)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        t_one = best(lambda: np.matmul(a, b, out=out), 3)
    print(f"machine: sgemm 2048^3 {flops / t_all / 1e9:.0f} GFLOP/s (BLAS threads), {flops / t_one / 1e9:.0f} (one)")


def decoder_pieces_gflops(repeats: int) -> None:
    """The codec decoder's fused residual units (each block's channels at its rate, 10 s of audio) against
    the same unit primitive by primitive, and its transposed convolutions, in GFLOP/s of their products."""
    from refimpl.codec import decoder

    rng = np.random.default_rng(2)
    for C, T in ((768, 4000), (384, 20000), (192, 80000), (96, 240000)):
        x = rng.standard_normal((1, C, T)).astype(np.float32)
        args = [(0.3 * rng.standard_normal(C)).astype(np.float32) for _ in range(2)]
        args += [(rng.standard_normal((C, C, 7)) / np.sqrt(7 * C)).astype(np.float32), np.zeros(C, np.float32)]
        args += [(0.3 * rng.standard_normal(C)).astype(np.float32) for _ in range(2)]
        args += [(rng.standard_normal((C, C, 1)) / np.sqrt(C)).astype(np.float32), np.zeros(C, np.float32)]
        flops = 2 * C * C * 8 * T
        t_parts = best(lambda: decoder.residual_unit_push.reference(x, *args, 3), repeats)
        t_fused = best(lambda: numba_cpu.residual_unit_push(x, *args, 3), repeats)
        print(
            f"residual unit C={C} T={T}: primitive by primitive {flops / t_parts / 1e9:.0f} GFLOP/s "
            f"({1e3 * t_parts:.0f} ms), fused {flops / t_fused / 1e9:.0f} GFLOP/s ({1e3 * t_fused:.0f} ms)"
        )
    for I, rate, T in ((1536, 8, 500), (768, 5, 4000), (384, 4, 20000), (192, 3, 80000)):
        x = rng.standard_normal((1, I, T)).astype(np.float32)
        w = (rng.standard_normal((I, I // 2, 2 * rate)) / np.sqrt(I)).astype(np.float32)
        flops = 2 * I * (I // 2) * 2 * rate * T
        t_ref = best(lambda: nn.conv_transpose1d.reference(x, w, None, rate), repeats)
        t_twin = best(lambda: numba_cpu.conv_transpose1d(x, w, None, rate), repeats)
        print(
            f"conv_transpose1d {I}->{I // 2} k{2 * rate} s{rate} T={T}: reference {flops / t_ref / 1e9:.0f} GFLOP/s, "
            f"twin {flops / t_twin / 1e9:.0f} GFLOP/s ({1e3 * t_twin:.0f} ms)"
        )


def conv_gflops(repeats: int) -> None:
    """The codec decoder's largest convolutions (10 s of audio): residual-unit k7 convs of each block."""
    rng = np.random.default_rng(1)
    for C, T, dilation in ((768, 4000, 1), (384, 20000, 3), (192, 80000, 9)):
        x = rng.standard_normal((1, C, T + 6 * dilation)).astype(np.float32)
        w = (0.05 * rng.standard_normal((C, C, 7))).astype(np.float32)
        flops = 2 * C * C * 7 * T
        t_ref = best(lambda: nn.conv1d.reference(x, w, None, 1, dilation), max(3, repeats // 6))
        t_twin = best(lambda: numba_cpu.conv1d(x, w, None, 1, dilation), max(3, repeats // 6))
        print(
            f"conv1d k7 C={C} T={T} d={dilation}: reference {flops / t_ref / 1e9:.0f} GFLOP/s, "
            f"twin {flops / t_twin / 1e9:.0f} GFLOP/s ({1e3 * t_twin:.0f} ms)"
        )


if __name__ == "__main__":
    main()
