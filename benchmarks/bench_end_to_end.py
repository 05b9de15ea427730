"""Text -> waveform with the full-size 0.6B CustomVoice model (random weights, bf16 on disk) and the
full-size speech tokenizer, greedy.

    python benchmarks/bench_end_to_end.py [--frames 25] [--repeats 2] [--chunk-frames 4]

Prints our time and real-time factor (RTF = compute time / audio time) for ``generate_custom_voice``,
and for ``stream_custom_voice(..., chunk_frames=4)`` the time to the first chunk and the total; when the
official package is importable (the oracle environment, golden/README.md), runs its
``Qwen3TTSModel.generate_custom_voice`` on the same directory, text and settings in the same process and
prints its time and RTF, the ratio our time / its time, and the largest waveform difference (meaningful
when the greedy codes agree, which is checked).  ``--frames N``: max_new_tokens = N + 1 (N frames
unless the random talker picks EOS earlier).
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from bench_talker import GREEDY, LANGUAGE, SPEAKER, TEXT
from common import best_time, official_available, peak_rss_gb, released_custom_voice_0_6b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-frames", type=int, default=4)
    args = ap.parse_args()
    gen = dict(GREEDY, max_new_tokens=args.frames + 1)

    from refimpl import Qwen3TTS
    from refimpl.backends.host_memory import wait_for_huge_pages

    path = released_custom_voice_0_6b()
    tts = Qwen3TTS.from_pretrained(path)
    wait_for_huge_pages()  # the steady state: the weights' copy in huge pages made

    def ours():
        wavs, sr, codes = tts.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True, **gen)
        return wavs[0], codes[0]

    ours_t, (wav, codes) = best_time(ours, args.repeats)
    seconds = len(wav) / tts.sample_rate
    print(
        f"refimpl  text -> {len(codes)} frames -> {seconds:.2f} s audio ({os.cpu_count()} cpus): {ours_t:.2f} s, "
        f"RTF {ours_t / seconds:.2f}"
    )

    def stream():
        t0 = time.perf_counter()
        first, chunks = None, []
        for chunk in tts.stream_custom_voice(
            TEXT, speaker=SPEAKER, language=LANGUAGE, chunk_frames=args.chunk_frames, **gen
        ):
            if first is None:
                first = (time.perf_counter() - t0, len(chunk))
            chunks.append(chunk)
        return first, np.concatenate(chunks)

    stream_t, ((first_t, first_n), streamed) = best_time(stream, args.repeats)
    print(
        f"refimpl  streaming, chunk_frames={args.chunk_frames}: first chunk "
        f"({first_n / tts.sample_rate * 1000:.0f} ms of audio) after {first_t:.2f} s, total "
        f"{stream_t:.2f} s, RTF {stream_t / seconds:.2f};  max |stream - generate| = "
        f"{np.max(np.abs(streamed - wav)) if streamed.shape == wav.shape else float('nan'):.2e}"
    )
    print(f"refimpl  peak memory (ru_maxrss, before the official is loaded): {peak_rss_gb():.2f} GB")

    if not official_available():
        print("official qwen-tts not importable: no side-by-side ratio (run in the oracle environment)")
        return
    import torch
    from qwen_tts import Qwen3TTSModel

    off = Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)
    decode, captured = off.model.speech_tokenizer.decode, []

    def recording_decode(items):  # the official decode, with its input codes kept for the comparison
        captured[:] = [item["audio_codes"].numpy() for item in items]
        return decode(items)

    off.model.speech_tokenizer.decode = recording_decode

    def official():
        with torch.inference_mode():
            wavs, sr = off.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, **gen)
        return wavs[0]

    off_t, off_wav = best_time(official, args.repeats)
    off_seconds = len(off_wav) / 24000
    print(
        f"official text -> {len(captured[0])} frames -> {off_seconds:.2f} s audio: {off_t:.2f} s, "
        f"RTF {off_t / off_seconds:.2f}  (torch {torch.__version__}, {torch.get_num_threads()} threads)"
    )
    same = captured[0].shape == codes.shape and np.array_equal(captured[0], codes)
    diff = np.max(np.abs(off_wav - wav)) if same and off_wav.shape == wav.shape else float("nan")
    print(
        f"ratio refimpl / official: {ours_t / off_t:.2f}   greedy codes equal: {same}   "
        f"max |refimpl - official| waveform = {diff:.2e}"
    )


if __name__ == "__main__":
    main()
