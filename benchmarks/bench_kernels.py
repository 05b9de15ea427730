"""Kernel-level speed of the numba backend against the plain NumPy primitives, and the machine's limits.

    python benchmarks/bench_kernels.py [--repeats 20]

For the memory-bound kernels the useful unit is bytes of weights read per second (GB/s), compared with the
machine's own streaming bandwidth (measured here with a large array copy, reads + writes); for SnakeBeta,
samples per second; for the convolutions, GFLOP/s.  Shapes: one generation step of the 0.6B Talker (q/k/v/o,
gate/up/down of 4 layers), the largest SnakeBeta of the codec decoder (96 channels at 24 kHz, 10 s) and its
largest convolutions.  Threads: NUMBA_NUM_THREADS and
OPENBLAS_NUM_THREADS as set in the environment (printed).
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (puts the repository on sys.path)
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
