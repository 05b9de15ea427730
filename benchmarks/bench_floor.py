"""The memory-bandwidth floor of one generated frame, measured on the model's own weights.

    python benchmarks/bench_floor.py [--frames 10] [--repeats 5]

A frame reads the Talker's layers and codec head once and, for each of the 15 code-predictor steps,
the code predictor's 5 layers and one of its heads: about 3.3 GB of bfloat16 words at the released
0.6B sizes.  ``frame_words`` lists those arrays in the order a frame reads them (the loaded model's
own ``BF16Matrix`` words: memory-mapped, or the huge-page copy of ``refimpl/io/checkpoint.py``), and
``read_kernel`` is a Numba reduction that streams them on the same threads as the matrix-vector
kernel, doing nothing else: its time is the least a frame can take on this machine at this moment.
``main`` prints the floor, our time per frame (Talker step + code predictor, from a greedy run) and
their ratio (the first row of ``bench_table.py``), and the rates of the generation kernels on the
Talker's 28 layers of real (cold) weights: the matrix-vector kernel one matrix per call (GB/s, against
the read kernel over the same matrices) and the prompt's block kernel with 28 rows (GFLOP/s).

The floor of the first row is the best pass before and after the frames.  On a VM whose memory bandwidth
moves from one minute to the next (an AMD EPYC VM here: the read kernel 35 to 60 GB/s within minutes),
that best pass may come from a faster moment than the frames: ``per_frame_with_reads_between`` also runs
one pass after each frame, outside the frame's time, and the second line prints our frame against the
mean of those passes, the two taken in the same seconds.
"""

from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numba
import numpy as np
from common import best_time, released_custom_voice_0_6b
from numba import prange

import refimpl.backends.numba_cpu  # noqa: F401  (Numba under refimpl's settings: 512-bit vectors)

CHUNK_WORDS = 1 << 17  # 256 KB of words per parallel work item


@numba.njit(parallel=True, cache=True)
def _sum_words(arrays, chunks_n3):
    """Sum of every 16-bit word of ``arrays[k][start:stop]`` for each chunk (k, start, stop): a pure read
    (the sum only keeps the compiler from dropping the loads), parallel over chunks."""
    total = np.uint64(0)
    for c in prange(chunks_n3.shape[0]):
        words = arrays[chunks_n3[c, 0]][chunks_n3[c, 1] : chunks_n3[c, 2]]
        s = np.uint32(0)
        for i in range(words.size):  # indices from 0: no wrap-around check, so the loop is vectorised
            s += np.uint32(words[i])
        total += np.uint64(s)
    return total


def frame_words(tts) -> list:
    """The bfloat16 word arrays (flat, uint16) one generation frame reads, in its order: the Talker's
    28 layers and codec_head, then for each code-predictor step g its 5 layers and lm_head[g]."""
    from refimpl.backends.bf16 import BF16Matrix

    talker = tts.talker
    predictor = talker.code_predictor

    def matrices(weights, prefix):
        return [w.bits.reshape(-1) for n, w in weights.items() if n.startswith(prefix) and isinstance(w, BF16Matrix)]

    arrays = matrices(talker.weights, "model.layers.") + matrices(talker.weights, "codec_head.")
    layers = matrices(predictor.weights, "model.layers.") + matrices(predictor.weights, "small_to_mtp_projection.")
    for g in range(predictor.n_groups):
        arrays += layers + matrices(predictor.weights, f"lm_head.{g}.")
    return [np.asarray(a).view(np.ndarray) for a in arrays]


def frame_bytes_as_read(tts) -> list:
    """``frame_words`` with each matrix the numba backend reads packed (the code predictor's, once packed:
    ``refimpl.backends.numba_cpu.packed_words``) replaced by the arrays it reads instead (low bytes, codes,
    the listed words), as 16-bit words: the bytes a frame reads now."""
    from refimpl.backends import numba_cpu
    from refimpl.backends.bf16 import BF16Matrix

    packed = {}
    for weights in (tts.talker.weights, tts.talker.code_predictor.weights):
        for m in weights.values():
            p = numba_cpu.packed_words.packed_words(m) if isinstance(m, BF16Matrix) else None
            if p is not None:  # (by the address of its words: frame_words gives flat views of them)
                packed[m.bits.__array_interface__["data"][0]] = (p.low_oi, p.codes_oh, p.rows_e, p.cols_e, p.values_e)
    out = []
    for a in frame_words(tts):
        arrays = packed.get(a.__array_interface__["data"][0])
        out += [np.ascontiguousarray(b).reshape(-1).view(np.uint16) for b in arrays] if arrays else [a]
    return [a for a in out if a.size]


class ReadKernel:
    """The floor: ``seconds()`` is the best time of ``repeats`` passes over ``arrays`` (flat uint16 words;
    ``frame_words(tts)``: a frame's)."""

    def __init__(self, arrays: list):
        self.nbytes = sum(a.nbytes for a in arrays)
        self.arrays = numba.typed.List(arrays)
        self.chunks = np.array(
            [(k, s, min(s + CHUNK_WORDS, a.size)) for k, a in enumerate(arrays) for s in range(0, a.size, CHUNK_WORDS)],
            dtype=np.int64,
        )
        _sum_words(self.arrays, self.chunks[:1])  # compiled (or loaded from the cache) before timing

    def seconds(self, repeats: int = 5) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            _sum_words(self.arrays, self.chunks)
            best = min(best, time.perf_counter() - t0)
        return best


def per_frame_seconds(tts, frames: int) -> tuple:
    """Our greedy time per frame (a Talker step + the 15 code-predictor steps, each the mean over the run,
    prompt and sampling left out) over ``frames`` frames, from ``bench_talker.StageTimer``; and the frames
    made."""
    from bench_talker import GREEDY, LANGUAGE, SPEAKER, TEXT, StageTimer

    timer = StageTimer(tts)
    try:
        codes = tts.generate_custom_voice(
            TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True, max_new_tokens=frames + 1, **GREEDY
        )[2][0]
    finally:
        for obj in (tts.talker, tts.talker.code_predictor):
            for name in ("forward", "logits", "predict_frame"):
                obj.__dict__.pop(name, None)  # unwrap
    s, c = timer.seconds, timer.calls
    # each stage by its own count: the last frame's Talker step, whose code 0 no frame would expand, is not
    # run (refimpl.tts.generate.wants_last_step), so there is one Talker step fewer than frames
    step = s["talker step"] / max(c["talker step"], 1)
    return step + s["code predictor"] / max(c["code predictor"], 1), len(codes)


def per_frame_with_reads_between(tts, frames: int, kernel: ReadKernel) -> tuple:
    """``per_frame_seconds`` with one pass of ``kernel`` after each frame's code-predictor steps: (our
    time per frame without the passes, the mean time of a pass, the frames made)."""
    predictor = tts.talker.code_predictor
    predict_frame = predictor.predict_frame
    passes = []

    def frame_then_read(*args, **kwargs):
        codes = predict_frame(*args, **kwargs)
        passes.append(kernel.seconds(1))
        return codes

    predictor.predict_frame = frame_then_read  # (per_frame_seconds times it with the pass and unwraps it)
    with_passes, n = per_frame_seconds(tts, frames)
    mean_pass = sum(passes) / max(len(passes), 1)
    return with_passes - mean_pass, mean_pass, n  # (one pass per code-predictor call, in its mean)


def talker_matrices(tts) -> list:
    """The bf16 word matrices ([O, I] uint16) of the Talker's layers, in the order a step reads them."""
    from refimpl.backends.bf16 import BF16Matrix

    w = tts.talker.weights
    return [
        np.asarray(m.bits).view(np.ndarray)
        for n, m in w.items()
        if n.startswith("model.layers.") and isinstance(m, BF16Matrix)
    ]


def kernel_rates(tts, repeats: int = 5) -> str:
    """The matrix-vector kernel (one row of x, one matrix per call) and the block kernel (28 rows) over the
    Talker's layers, best of ``repeats`` passes, with the read kernel over the same words for comparison."""
    from refimpl.backends import numba_cpu

    mats = talker_matrices(tts)
    nbytes = sum(m.nbytes for m in mats)
    xs = {I: np.random.default_rng(0).standard_normal((28, I)).astype(np.float32) for I in {m.shape[1] for m in mats}}
    pairs = [(m, np.empty((28, m.shape[0]), np.float32)) for m in mats]  # (matrix, its output)
    threads = numba.get_num_threads()

    def best(fn):
        fn()  # compiled or loaded before timing
        return best_time(fn, repeats)[0]

    read = ReadKernel([m.reshape(-1) for m in mats]).seconds(repeats)
    matvec = best(lambda: [numba_cpu.linear._matvec_bf16_into(xs[m.shape[1]][0], m, o[0]) for m, o in pairs])
    block = best(lambda: [numba_cpu.linear._bf16_block_times(xs[m.shape[1]], m, o, threads) for m, o in pairs])
    flops = sum(2 * 28 * m.size for m in mats)
    return (
        f"Talker's {len(mats)} matrices ({nbytes / 1e9:.2f} GB): read kernel {nbytes / read / 1e9:.1f} GB/s, "
        f"matrix-vector kernel {nbytes / matvec / 1e9:.1f} GB/s, "
        f"block kernel (28 rows) {flops / block / 1e9:.0f} GFLOP/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from refimpl import Qwen3TTS
    from refimpl.backends.host_memory import wait_for_huge_pages

    tts = Qwen3TTS.from_pretrained(released_custom_voice_0_6b())
    wait_for_huge_pages()  # the steady state: the weights' copy in huge pages made
    tts.speech_tokenizer.decode = lambda codes, **_: np.zeros(len(codes) * 1920, dtype=np.float32)
    kernel = ReadKernel(frame_words(tts))
    per_frame_seconds(tts, 1)  # warm-up: the kernels compiled or loaded from the cache
    floor_before = kernel.seconds(args.repeats)
    frame, n = per_frame_seconds(tts, args.frames)
    floor = min(floor_before, kernel.seconds(args.repeats))
    print(
        f"floor: {kernel.nbytes / 1e9:.2f} GB of bf16 words per frame, read at {kernel.nbytes / floor / 1e9:.1f} GB/s "
        f"({numba.get_num_threads()} threads) = {1000 * floor:.0f} ms; ours {1000 * frame:.0f} ms per frame "
        f"({n} frames): {frame / floor:.2f} x the floor"
    )
    frame, between, n = per_frame_with_reads_between(tts, args.frames, kernel)
    print(
        f"read between the frames: {1000 * between:.0f} ms a pass ({kernel.nbytes / between / 1e9:.1f} GB/s, the "
        f"mean); ours {1000 * frame:.0f} ms per frame in the same seconds: {frame / between:.2f} x"
    )
    print(kernel_rates(tts, args.repeats))


if __name__ == "__main__":
    main()
