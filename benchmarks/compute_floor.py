"""The compute floor of a network: its products' multiply-adds, counted as the reference runs them, at the
machine's peak rate of float32 fused multiply-adds.

    python benchmarks/compute_floor.py [--threads 2]

Prints the peak (``fma_peak``) and, for the released-size codec decoder (125 frames), codec encoder (10 s)
and speaker encoder (10 s), the products' GFLOP (``count_products``) and the seconds they would take at
that peak.  ``bench_table.py`` adds the same to its codec and speaker rows: no implementation that computes
every product in float32, as ours and the official's do, runs faster than that floor on the machine, so a
row's ratio to the official cannot fall below floor / the official's time.  The floor leaves out all that
is not a product (SnakeBeta's sines, norms, the mel front end, moving data), so it is a lower bound."""

from __future__ import annotations

import contextlib
import math
import threading
import time

import common  # noqa: F401  (the repository on sys.path, refimpl before NumPy)
import numba
import numpy as np

import refimpl
from refimpl import nn
from refimpl.backends.numba_cpu.intrinsics import _v16_fma, _v16_load, _v16_store

FMA_CHAINS = 12  # independent 16-lane chains a thread keeps in flight: more than a core's latency x throughput


@numba.njit(fastmath={"contract"}, nogil=True, cache=True)
def _fma_chains(n, x, out):
    """n rounds of 12 fused multiply-adds of 16 lanes, each on its own chain (x[16:] the 12 chains' starts,
    x[:16] the factor): nothing but the multiply-add units' rate, no memory traffic in the loop."""
    w = _v16_load(x, 0)
    a0, a1, a2, a3 = _v16_load(x, 16), _v16_load(x, 17), _v16_load(x, 18), _v16_load(x, 19)
    a4, a5, a6, a7 = _v16_load(x, 20), _v16_load(x, 21), _v16_load(x, 22), _v16_load(x, 23)
    a8, a9, a10, a11 = _v16_load(x, 24), _v16_load(x, 25), _v16_load(x, 26), _v16_load(x, 27)
    s = x[2]
    for _ in range(n):
        a0, a1, a2, a3 = _v16_fma(a0, w, s), _v16_fma(a1, w, s), _v16_fma(a2, w, s), _v16_fma(a3, w, s)
        a4, a5, a6, a7 = _v16_fma(a4, w, s), _v16_fma(a5, w, s), _v16_fma(a6, w, s), _v16_fma(a7, w, s)
        a8, a9, a10, a11 = _v16_fma(a8, w, s), _v16_fma(a9, w, s), _v16_fma(a10, w, s), _v16_fma(a11, w, s)
    for i, a in enumerate((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11)):  # (every chain kept: stored)
        _v16_store(out, 16 * i, a)


def fma_peak(threads: int, rounds: int = 10_000_000, repeats: int = 7) -> float:
    """FLOP/s (a multiply-add counted as two) of ``threads`` threads each running ``_fma_chains`` at once: the
    best of ``repeats``."""
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1e-3, 1e-3, 44).astype(np.float32) for _ in range(threads)]
    outputs = [np.empty(16 * FMA_CHAINS, np.float32) for _ in range(threads)]
    _fma_chains(1, inputs[0], outputs[0])  # (compiled, or loaded from the cache, before the clock)
    best = math.inf
    for _ in range(repeats):
        workers = [threading.Thread(target=_fma_chains, args=(rounds, inputs[i], outputs[i])) for i in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return threads * rounds * FMA_CHAINS * 16 * 2 / best


# ----------------------------------------------------------------------------- counting the products


def _conv1d_shape(x_bct, w_oik, stride: int = 1, dilation: int = 1) -> tuple:
    B, _, T = x_bct.shape
    O, _, K = w_oik.shape
    return B, O, (T - dilation * (K - 1) - 1) // stride + 1


@contextlib.contextmanager
def _counting_products(counts: dict):
    """The reference's product primitives (``nn.conv1d``, ``nn.conv_transpose1d``, ``nn.linear``) replaced by
    ones that add their multiply-adds to ``counts`` and return zeros of the output's shape (their values
    never needed: only the shapes that follow)."""
    saved = {name: getattr(nn, name) for name in ("conv1d", "conv_transpose1d", "linear")}

    def conv1d(x_bct, w_oik, b_o=None, stride=1, dilation=1, groups=1):
        B, O, T_out = _conv1d_shape(x_bct, w_oik, stride, dilation)
        counts["conv1d"] = counts.get("conv1d", 0) + B * O * T_out * w_oik.shape[1] * w_oik.shape[2]
        return np.zeros((B, O, T_out), x_bct.dtype)

    def conv_transpose1d(x_bct, w_iok, b_o=None, stride=1):
        B, _, T = x_bct.shape
        I, O, K = w_iok.shape
        counts["conv_transpose1d"] = counts.get("conv_transpose1d", 0) + B * T * I * O * K
        return np.zeros((B, O, (T - 1) * stride + K), x_bct.dtype)

    def linear(x, w_oi, b_o=None):
        O, I = w_oi.shape
        counts["linear"] = counts.get("linear", 0) + math.prod(x.shape[:-1]) * O * I
        return np.zeros(x.shape[:-1] + (O,), x.dtype)

    try:
        nn.conv1d, nn.conv_transpose1d, nn.linear = conv1d, conv_transpose1d, linear
        yield counts
    finally:
        for name, f in saved.items():
            setattr(nn, name, f)


def count_products(run) -> dict:
    """The multiply-adds of the products ``run()`` makes on the reference (NumPy) backend, by primitive:
    {"conv1d": n, "conv_transpose1d": n, "linear": n}.  Products made by other means (an attention's scores,
    a quantizer's distances) are not counted."""
    counts: dict = {}
    with refimpl.use_backend("numpy", "counting products"), _counting_products(counts):
        run()
    return counts


def products_gflop(run) -> float:
    """``count_products(run)``'s multiply-adds in GFLOP (two operations each)."""
    return 2 * sum(count_products(run).values()) / 1e9


def predictor_floor(tts, B: int, peak_flops: float) -> float:
    """The seconds the code predictor's products for one frame of B rows (a batch's step; ``tts`` a loaded
    ``Qwen3TTS``) take at ``peak_flops``, counted as the reference makes them (inputs of zeros: the shapes
    alone matter)."""
    cp = tts.talker.code_predictor
    h_bc = np.zeros((B, tts.talker.cfg.hidden_size), np.float32)
    gflop = products_gflop(lambda: cp.predict_frame(h_bc, h_bc, lambda g, logits: np.zeros(B, np.int64)))
    return gflop * 1e9 / peak_flops


def floor_note(gflop: float, peak_flops: float, official_s: float | None) -> str:
    """The note a table row carries: the products, the seconds they take at the peak, and that floor as a
    ratio of the official's time where there is one."""
    floor_s = gflop * 1e9 / peak_flops
    against = f", {floor_s / official_s:.2f} of the official's time" if official_s else ""
    return f"(products {gflop:.1f} GFLOP: {floor_s:.3g} s at the peak {peak_flops / 1e9:.0f} GFLOP/s{against})"


def main() -> None:
    import argparse

    from bench_codec_encoder import test_audio
    from common import released_speaker_encoder, released_speech_tokenizer

    from refimpl.codec.speech_tokenizer import SpeechTokenizer
    from refimpl.tts.speaker_encoder import SpeakerEncoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    args = ap.parse_args()
    peak = fma_peak(args.threads)
    print(f"peak of float32 multiply-adds on {args.threads} threads: {peak / 1e9:.0f} GFLOP/s")
    tok = SpeechTokenizer.from_pretrained(released_speech_tokenizer())
    codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(125, tok.num_quantizers))
    audio = test_audio(10.0)
    enc = SpeakerEncoder.from_pretrained(released_speaker_encoder())
    for what, run in (
        ("codec decoder, 125 frames", lambda: tok.decode(codes)),
        ("codec encoder, 10 s", lambda: tok.encode(audio, sr=24000)),
        ("speaker encoder, 10 s", lambda: enc.embed(audio)),
    ):
        gflop = products_gflop(run)
        print(f"{what}: {floor_note(gflop, peak, None)}")


if __name__ == "__main__":
    main()
