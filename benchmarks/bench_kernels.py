"""Kernel-level speed of the numba backend against the plain NumPy primitives, and the machine's limits.

    python benchmarks/bench_kernels.py [--repeats 20]

For the memory-bound kernels the useful unit is bytes of weights read per second (GB/s), compared with the
machine's own streaming bandwidth (measured here with a large array copy, reads + writes); for SnakeBeta,
samples per second; for the convolutions, GFLOP/s.  Shapes: one generation step of the 0.6B Talker (q/k/v/o,
gate/up/down of 4 layers), the largest SnakeBeta of the codec decoder (96 channels at 24 kHz, 10 s) and its
largest convolutions, its fused residual units and transposed convolutions, the fused step's attention
(a step over 40 and 200 cached positions, a 28-position prompt), sgemm, and where the processor
has AMX tiles their own limits (a multiply's rate with its operands in the registers, one step of the
prompt's tile kernel on operands in the cache) against the prompt's tile kernel on a Talker layer's
matrices, and the speaker encoder's TDNNs and a Res2Net with bf16 weights on the tiles against OpenBLAS.
Threads: NUMBA_NUM_THREADS and OPENBLAS_NUM_THREADS as set in the environment (printed).
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import common  # noqa: F401  (puts the repository on sys.path, sets OpenBLAS's idle spin before NumPy loads it)
import numba
import numpy as np

from refimpl import nn
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, bf16_bits_to_float32, float32_to_bf16_bits
from refimpl.backends.numba_cpu import amx

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
    t_bf16 = best(lambda: [numba_cpu.linear.linear(x[m.shape[1]], m) for m in bf16], args.repeats)
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
    t_nb = best(lambda: numba_cpu.elementwise.snake_beta(x_bct, la, lb), max(3, args.repeats // 4))
    print(
        f"SnakeBeta [1, 96, 240000]: numpy {1e3 * t_ref:.1f} ms ({n / t_ref / 1e9:.2f} G samples/s), "
        f"numba {1e3 * t_nb:.1f} ms ({n / t_nb / 1e9:.2f} G samples/s, x{t_ref / t_nb:.2f}); "
        f"bytes moved by numba {8 * n / t_nb / 1e9:.1f} GB/s"
    )
    conv_gflops(args.repeats)
    step_attention_rates(args.repeats)
    sgemm_gflops(rng)
    decoder_pieces_gflops(max(3, args.repeats // 6))
    tile_rates(rng, max(3, args.repeats // 4))
    tdnn_tile_rates(rng, max(3, args.repeats // 2))


def tdnn_tile_rates(rng, repeats: int) -> None:
    """The speaker encoder's TDNNs over 10 s (937 frames) with bf16 weights, as released: each shape through
    the twin on the AMX tiles (``_tdnn_into``) against the same twin without them (``USE_TILES`` off: OpenBLAS,
    or the direct kernel for the k5 TDNN where the processor has AVX-512), in ms and GFLOP/s of float32
    products, alternating.  (The Res2Nets run on the direct kernel, tiles or not.)"""
    if not numba_cpu.amx.USE_TILES:
        print("speaker encoder on the tiles: no tiles here (its TDNNs run on OpenBLAS)")
        return
    T = 937

    def bf16_weight(shape):
        w = bf16_bits_to_float32(float32_to_bf16_bits(0.05 * rng.standard_normal(shape).astype(np.float32)))
        w.flags.writeable = False  # (a model's weights: the twin keeps their tiles)
        return w

    cases = []
    for O, I, K, d in ((1536, 1536, 1, 1), (512, 512, 1, 1), (512, 128, 5, 1)):
        w, b = bf16_weight((O, I, K)), np.zeros(O, np.float32)
        x, out = rng.standard_normal((I, T)).astype(np.float32), np.empty((O, T), np.float32)
        run = lambda x=x, w=w, b=b, d=d, out=out: numba_cpu.speaker_encoder._tdnn_into(x, w, b, d, out)  # noqa: E731
        cases.append((f"TDNN {O} x {I} x {K}", 2 * O * I * K * T, run))
    for name, flops, run in cases:
        times = {}
        for tiles in (True, False) * 2:
            numba_cpu.amx.USE_TILES = tiles
            run()
            times[tiles] = min(times.get(tiles, np.inf), best(run, repeats))
        numba_cpu.amx.USE_TILES = True
        print(
            f"speaker encoder {name}, {T} frames: tiles {1e3 * times[True]:.2f} ms "
            f"({flops / times[True] / 1e9:.0f} GFLOP/s), without {1e3 * times[False]:.2f} ms "
            f"({flops / times[False] / 1e9:.0f} GFLOP/s)"
        )


UNPADDED = np.zeros(1, np.int64)  # the first valid key of one row: every key valid


def step_attention_rates(repeats: int) -> None:
    """The fused step's attention (``_attend_new_positions``) at the 0.6B Talker's sizes (16 heads of 128
    over 8 key groups): a generation step over 40 and 200 cached positions and a 28-position prompt, in
    microseconds and GFLOP/s (4 H D flops a key: the score and the weighted value), against the plain
    formula (``nn.attention.reference``: NumPy's products around the masked softmax)."""
    H, G, D = 16, 8, 128
    rng = np.random.default_rng(2)
    calls = 50
    for T, n in ((1, 40), (1, 200), (28, 0)):
        q = rng.standard_normal((T, H * D)).astype(np.float32)
        k, v = rng.standard_normal((2, G, n + T, D)).astype(np.float32)
        out = np.empty((T, H * D), np.float32)
        q_bhtd = np.ascontiguousarray(q.reshape(T, H, D).transpose(1, 0, 2)[None])
        allowed = nn.AttentionMask(nn.arange(n, n + T), nn.arange(n + T))

        def twin(q=q, k=k, v=v, n=n, out=out):
            for _ in range(calls):
                numba_cpu.attention._attend_new_positions(q, k[None], v[None], n, UNPADDED, out)

        twin()  # compiled or loaded before timing
        t_twin = best(twin, repeats) / calls
        t_ref = best(partial(nn.attention.reference, q_bhtd, k[None], v[None], allowed, D**-0.5), max(3, repeats // 4))
        flops = 4 * H * D * sum(n + t + 1 for t in range(T))
        print(
            f"step attention T={T} after n={n}: formula {1e6 * t_ref:.0f} us, twin {1e6 * t_twin:.1f} us "
            f"({flops / t_twin / 1e9:.1f} GFLOP/s, x{t_ref / t_twin:.0f})"
        )


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
    from refimpl.io.checkpoint import WeightView

    rng = np.random.default_rng(2)
    for C, T in ((768, 4000), (384, 20000), (192, 80000), (96, 240000)):
        x = rng.standard_normal((1, C, T)).astype(np.float32)
        args = [(0.3 * rng.standard_normal(C)).astype(np.float32) for _ in range(2)]
        args += [(rng.standard_normal((C, C, 7)) / np.sqrt(7 * C)).astype(np.float32), np.zeros(C, np.float32)]
        args += [(0.3 * rng.standard_normal(C)).astype(np.float32) for _ in range(2)]
        args += [(rng.standard_normal((C, C, 1)) / np.sqrt(C)).astype(np.float32), np.zeros(C, np.float32)]
        flops = 2 * C * C * 8 * T
        names = ("act1.alpha", "act1.beta", "conv1.conv.weight", "conv1.conv.bias")
        unit = WeightView(dict(zip(names + tuple(n.replace("1", "2") for n in names), args, strict=True)))
        t_parts = best(lambda unit=unit, x=x: decoder.residual_unit.reference(unit, 3, x, decoder.OFFLINE), repeats)
        t_fused = best(lambda x=x, args=args: numba_cpu.codec_decoder.residual_unit_push(x, *args, 3), repeats)
        print(
            f"residual unit C={C} T={T}: primitive by primitive {flops / t_parts / 1e9:.0f} GFLOP/s "
            f"({1e3 * t_parts:.0f} ms), fused {flops / t_fused / 1e9:.0f} GFLOP/s ({1e3 * t_fused:.0f} ms)"
        )
    for I, rate, T in ((1536, 8, 500), (768, 5, 4000), (384, 4, 20000), (192, 3, 80000)):
        x = rng.standard_normal((1, I, T)).astype(np.float32)
        w = (rng.standard_normal((I, I // 2, 2 * rate)) / np.sqrt(I)).astype(np.float32)
        flops = 2 * I * (I // 2) * 2 * rate * T
        t_ref = best(partial(nn.conv_transpose1d.reference, x, w, None, rate), repeats)
        t_twin = best(partial(numba_cpu.conv.conv_transpose1d, x, w, None, rate), repeats)
        print(
            f"conv_transpose1d {I}->{I // 2} k{2 * rate} s{rate} T={T}: reference {flops / t_ref / 1e9:.0f} GFLOP/s, "
            f"twin {flops / t_twin / 1e9:.0f} GFLOP/s ({1e3 * t_twin:.0f} ms)"
        )


TILE_MULTIPLY_FLOPS = 2 * 16 * 16 * 32  # one tile multiply (tdpbf16ps): 16 x 16 float32 sums of 32 bf16 products
STEP_OPERANDS = 4  # steps' worth of operands the step kernels cycle through (in the first-level cache)


@numba.njit(cache=True)
def _tile_multiplies(n, words):
    """4 n tile multiplies into the four sum tiles, their operands loaded once: the registers' own rate."""
    t = amx
    t._tile_config(t._tile_shapes())
    t._zero_c0(), t._zero_c1(), t._zero_c2(), t._zero_c3()
    t._load_a4(words, 0, 64), t._load_a5(words, 512, 64), t._load_b6(words, 1024, 64), t._load_b7(words, 1536, 64)
    for _ in range(n):
        t._dot_c0(), t._dot_c2(), t._dot_c1(), t._dot_c3()
    t._tile_release()


@numba.njit(cache=True)
def _prompt_steps(n, a_words, b_words, shift):
    """n steps of ``_tile_bf16_times``'s inner loop: two weight tiles (rows 64 bytes apart), then for each of
    x's three parts its two tiles (rows 128 bytes apart) and four multiplies; the tiles of x start
    ``shift`` words after a cache line."""
    t = amx
    t._tile_config(t._tile_shapes())
    t._zero_c0(), t._zero_c1(), t._zero_c2(), t._zero_c3()
    for i in range(n):
        a = (i % STEP_OPERANDS) * 1024
        t._load_a4(a_words, a, 64), t._load_a5(a_words, a + 512, 64)
        for p in range(3):
            b = (p * STEP_OPERANDS + i % STEP_OPERANDS) * 1024 + shift
            t._load_b6(b_words, b, 128), t._load_b7(b_words, b + 32, 128)
            t._dot_c0(), t._dot_c2(), t._dot_c1(), t._dot_c3()
    t._tile_release()


@numba.njit(cache=True)
def _conv_steps(n, a_words, z_pairs, shift):
    """n reduction steps of ``_tile_conv_into`` (the codecs' convs: six weight tiles, eight tiles of the
    split signal, 24 multiplies, in its order), the signal's tiles ``shift`` pairs after a cache line: a
    tap k of a conv with dilation d reads them k d pairs on."""
    t = amx
    t._tile_config(t._tile_shapes())
    t._zero_c0(), t._zero_c1(), t._zero_c2(), t._zero_c3()
    row = 48  # pairs a row of the signal (an odd number of lines)
    part = 16 * row * STEP_OPERANDS
    for i in range(n):
        a, z = (i % STEP_OPERANDS) * 3072, (i % STEP_OPERANDS) * 16 * row + shift
        t._load_a4(a_words, a + 1024, 64), t._load_a5(a_words, a + 2560, 64)  # the weight's lo part
        t._load_b6(z_pairs, z, 4 * row), t._load_b7(z_pairs, z + 16, 4 * row)  # the signal's hi part
        t._dot_c0(), t._dot_c1(), t._dot_c2(), t._dot_c3()
        t._load_a4(a_words, a + 512, 64), t._load_a5(a_words, a + 2048, 64)  # mid
        t._dot_c0(), t._dot_c1(), t._dot_c2(), t._dot_c3()
        t._load_b6(z_pairs, part + z, 4 * row), t._load_b7(z_pairs, part + z + 16, 4 * row)  # mid
        t._dot_c0(), t._dot_c2(), t._dot_c1(), t._dot_c3()
        t._load_a4(a_words, a, 64), t._load_a5(a_words, a + 1536, 64)  # hi
        t._dot_c0(), t._dot_c1(), t._dot_c2(), t._dot_c3()
        t._load_b6(z_pairs, 2 * part + z, 4 * row), t._load_b7(z_pairs, 2 * part + z + 16, 4 * row)  # lo
        t._dot_c0(), t._dot_c2(), t._dot_c1(), t._dot_c3()
        t._load_b6(z_pairs, z, 4 * row), t._load_b7(z_pairs, z + 16, 4 * row)  # hi
        t._dot_c0(), t._dot_c2(), t._dot_c1(), t._dot_c3()
    t._tile_release()


def _on_cache_lines(n: int, dtype) -> np.ndarray:
    """n zeros of ``dtype`` from a 64-byte boundary (NumPy's large arrays start 16 bytes past one here)."""
    raw = np.zeros(n + 64, dtype)
    per_line = 64 // raw.itemsize
    first = (per_line - raw.ctypes.data // raw.itemsize % per_line) % per_line
    return raw[first : first + n]


def tile_rates(rng, repeats: int) -> None:
    """The tiles' limits on one core against the kernels built on them.  A multiply's rate with its
    operands in the registers; one step of the prompt's kernel and of the codecs' conv kernel with their
    operands in the first-level cache, their rows on cache lines and shifted off them (a conv's tap reads
    its signal shifted by k dilation pairs); then the prompt's tile kernel (``_tile_bf16_times``) on 4
    Talker layers' bf16 matrices (126 MB, beyond the caches) for a 28-row prompt on all threads: GFLOP/s of
    the float32 products it computes (a third of its multiplies' flops: x in three bf16 parts) and its
    multiplies against the rate of that many cores."""
    if not numba_cpu.amx.USE_TILES:
        print("tiles: none here (no AMX, or not granted): the prompt's products run on the block kernel")
        return
    n = 20_000
    words = _on_cache_lines(2048, np.uint16)
    a_words = _on_cache_lines(STEP_OPERANDS * 3072 + 64, np.uint16)
    b_words = _on_cache_lines(3 * STEP_OPERANDS * 1024 + 64, np.uint16)
    z_pairs = _on_cache_lines(3 * 16 * 48 * STEP_OPERANDS + 64, np.uint32)
    _tile_multiplies(1, words), _prompt_steps(1, a_words, b_words, 0), _conv_steps(1, a_words, z_pairs, 0)
    t_mul = best(lambda: _tile_multiplies(n, words), repeats) / (4 * n)
    prompt = [best(partial(_prompt_steps, n, a_words, b_words, s), repeats) / n for s in (0, 16)]
    conv = [best(partial(_conv_steps, n, a_words, z_pairs, s), repeats) / n for s in (0, 1, 3)]
    print(
        f"tiles, one core: a multiply {1e9 * t_mul:.1f} ns ({TILE_MULTIPLY_FLOPS / t_mul / 1e9:.0f} GFLOP/s of bf16 "
        f"products); in the first-level cache, a step of the prompt kernel (12 multiplies, 8 loads) "
        f"{1e9 * prompt[0]:.0f} ns on cache lines, {1e9 * prompt[1]:.0f} 32 bytes off; of the conv kernel "
        f"(24 multiplies, 14 loads) {1e9 * conv[0]:.0f} ns on cache lines, {1e9 * conv[1]:.0f} and "
        f"{1e9 * conv[2]:.0f} a tap 1 and 3 pairs off (the multiplies alone: {1e9 * 12 * t_mul:.0f} and "
        f"{1e9 * 24 * t_mul:.0f})"
    )
    threads = numba.get_num_threads()
    shapes = TALKER_LAYER * 4
    mats = [BF16Matrix(float32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32))) for shape in shapes]
    rows = 28
    x = {c: rng.standard_normal((rows, c)).astype(np.float32) for c in (1024, 2048, 3072)}
    pairs = [(m, np.empty((rows, m.shape[0]), np.float32)) for m in mats]  # (matrix, its output)

    def run():
        return [numba_cpu.amx._tile_bf16_times(x[m.shape[1]], m.bits, o, threads) for m, o in pairs]

    run()
    t_run = best(run, repeats)
    flops = sum(2 * rows * m.shape[0] * m.shape[1] for m in mats)
    multiplies = sum(12 * (m.shape[0] // 32) * (m.shape[1] // 32) * ((rows + 31) // 32) for m in mats)
    nbytes = sum(m.bits.nbytes for m in mats)
    print(
        f"  prompt tile kernel, {rows} rows x 4 Talker layers ({nbytes / 1e6:.0f} MB), {threads} threads: "
        f"{1e3 * t_run:.1f} ms, {flops / t_run / 1e9:.0f} GFLOP/s of float32 products, {nbytes / t_run / 1e9:.1f} GB/s "
        f"of weights; its multiplies at {multiplies * t_mul / threads / t_run:.2f} of the tiles' rate"
    )


def conv_gflops(repeats: int) -> None:
    """The codec decoder's largest convolutions (10 s of audio): residual-unit k7 convs of each block."""
    rng = np.random.default_rng(1)
    for C, T, dilation in ((768, 4000, 1), (384, 20000, 3), (192, 80000, 9)):
        x = rng.standard_normal((1, C, T + 6 * dilation)).astype(np.float32)
        w = (0.05 * rng.standard_normal((C, C, 7))).astype(np.float32)
        flops = 2 * C * C * 7 * T
        t_ref = best(partial(nn.conv1d.reference, x, w, None, 1, dilation), max(3, repeats // 6))
        t_twin = best(partial(numba_cpu.conv.conv1d, x, w, None, 1, dilation), max(3, repeats // 6))
        print(
            f"conv1d k7 C={C} T={T} d={dilation}: reference {flops / t_ref / 1e9:.0f} GFLOP/s, "
            f"twin {flops / t_twin / 1e9:.0f} GFLOP/s ({1e3 * t_twin:.0f} ms)"
        )


if __name__ == "__main__":
    main()
