"""Encode 10 s of audio with the full-size released encoder (random weights).

    python benchmarks/bench_codec_encoder.py [--seconds 10] [--repeats 3]

Prints our time and real-time factor (RTF = compute time / audio time); when the official package is
importable (the oracle environment, golden/README.md), runs its ``Qwen3TTSTokenizer.encode`` on the same
audio in the same process, the two sides taking turns (``common.alternate``), and prints the ratio our best
time / its best time, how many codes agree and the largest latent difference.  The checkpoint is written on
demand (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import os

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from common import alternate, best_time, official_available, released_speech_tokenizer


def test_audio(seconds: float, sr: int = 24000) -> np.ndarray:
    """A harmonic tone with vibrato and a slow envelope, plus a little noise (float32)."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * sr)) / sr
    phase = 180 * t + 2 * np.sin(2 * np.pi * 4 * t)
    tone = sum(np.sin(2 * np.pi * h * phase) / h for h in (1, 2, 3, 4))
    return (0.25 * (0.6 + 0.4 * np.sin(2 * np.pi * 0.7 * t)) * tone + 0.01 * rng.standard_normal(len(t))).astype(
        np.float32
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from refimpl import SpeechTokenizer

    path = released_speech_tokenizer()
    tok = SpeechTokenizer.from_pretrained(path)
    audio = test_audio(args.seconds)
    tok.encode(audio[:1920], sr=24000)  # loads the encoder weights

    def encode():
        return tok.encode_detailed(audio, sr=24000)

    if not official_available():
        ours_t, ours = best_time(encode, args.repeats)
        print_ours(args, audio, ours_t, ours)
        print("official qwen-tts not importable: no side-by-side ratio (run in the oracle environment)")
        return
    import torch
    from qwen_tts import Qwen3TTSTokenizer

    off_tok = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)

    def official():
        with torch.inference_mode():
            return off_tok.encode(audio, sr=24000).audio_codes[0].numpy()

    ours_t, off_t, results = alternate(encode, official, args.repeats)
    ours, off_codes = results["ours"], results["official"]
    print_ours(args, audio, ours_t, ours)
    print(
        f"official encode: {off_t:.2f} s, RTF {off_t / args.seconds:.3f}  (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, attention {off_tok.model.encoder.config._attn_implementation})"
    )
    print(f"ratio refimpl / official: {ours_t / off_t:.2f}")
    with torch.inference_mode():
        enc = off_tok.model.encoder
        h = enc.encoder(torch.from_numpy(audio)[None, None])
        latent = enc.downsample(enc.encoder_transformer(h.transpose(1, 2)).last_hidden_state.transpose(1, 2))
    latent_err = np.abs(ours.latent - latent[0].numpy().T).max()
    print(
        f"codes equal: {int((off_codes == ours.codes).sum())} / {off_codes.size}; latent max |refimpl - official| "
        f"{latent_err:.3g} (latent max {np.abs(ours.latent).max():.3g})"
    )


def print_ours(args, audio, ours_t: float, ours) -> None:
    print(
        f"refimpl  encode {args.seconds:g} s audio ({len(audio)} samples, {os.cpu_count()} cpus): {ours_t:.2f} s, "
        f"RTF {ours_t / args.seconds:.3f}; codes {ours.codes.shape}, smallest margin {ours.margins.min():.3g}"
    )


if __name__ == "__main__":
    main()
