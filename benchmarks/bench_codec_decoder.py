"""Decode 10 s of audio (125 frames) with the full-size released decoder (random weights).

    python benchmarks/bench_codec_decoder.py [--frames 125] [--repeats 3]

Prints our time and real-time factor (RTF = compute time / audio time); when the official package is
importable (the oracle environment, golden/README.md), runs it on the same codes in the same process, the
two sides taking turns (``common.alternate``), and prints the ratio our best time / its best time, plus the
largest difference between the two waveforms.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from common import alternate, best_time, official_available, released_speech_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=125)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from refimpl import SpeechTokenizer

    path = released_speech_tokenizer()
    tok = SpeechTokenizer.from_pretrained(path)
    codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(args.frames, tok.num_quantizers))
    seconds = args.frames * tok.samples_per_frame / tok.sample_rate

    def decode():
        return tok.decode(codes)

    stream_t, streamed = best_time(
        lambda: np.concatenate([s.push(codes[i : i + 5]) for s in [tok.stream()] for i in range(0, args.frames, 5)]), 1
    )
    if not official_available():
        ours_t, _ = best_time(decode, args.repeats)
        print_ours(args, seconds, ours_t, stream_t)
        print("official qwen-tts not importable: no side-by-side ratio (run in the oracle environment)")
        return
    import torch
    from qwen_tts import Qwen3TTSTokenizer

    off_tok = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)
    codes_t = torch.from_numpy(codes)

    def official():
        with torch.inference_mode():
            return off_tok.decode([{"audio_codes": codes_t}])[0][0]

    ours_t, off_t, results = alternate(decode, official, args.repeats)
    ours, off = results["ours"], results["official"]
    print_ours(args, seconds, ours_t, stream_t)
    print(
        f"official decode: {off_t:.2f} s, RTF {off_t / seconds:.3f}  (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print(
        f"ratio refimpl / official: {ours_t / off_t:.2f}x   max |refimpl - official| = {np.max(np.abs(ours - off)):.2e}"
        f"   max |stream - decode| = {np.max(np.abs(streamed - ours)):.2e}"
    )


def print_ours(args, seconds: float, ours_t: float, stream_t: float) -> None:
    print(f"refimpl  decode {args.frames} frames ({seconds:.1f} s audio): {ours_t:.2f} s, RTF {ours_t / seconds:.3f}")
    print(f"refimpl  streaming decode, 5-frame pushes: {stream_t:.2f} s, RTF {stream_t / seconds:.3f}")


if __name__ == "__main__":
    main()
