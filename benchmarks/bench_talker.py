"""Greedy generation of codec frames with the full-size 0.6B CustomVoice talker (random weights, bf16 on disk).

    python benchmarks/bench_talker.py [--frames 25] [--repeats 2]

Times text -> codes only (the speech-tokenizer decode is replaced by a stub on both sides; see
bench_end_to_end.py for the whole pipeline).  Prints our time per frame, split into the talker prefill
(the prompt), the talker steps (one position each, with the KV cache) and the code predictor (codes 1..15
of every frame), and our peak memory; when the official package is importable (the oracle environment,
golden/README.md), runs its ``Qwen3TTSModel.generate_custom_voice`` on the same directory, text and
settings in the same process and prints the ratio our time / its time and whether the greedy codes agree
(a difference can only come from a near-tie: the top-2 logit gap at the first differing code is printed).
``--frames N`` asks for N frames (max_new_tokens = N + 1: the code 0 drawn at the last step is never
expanded into a frame); a run stops earlier if the random talker happens to pick EOS.
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from common import best_time, official_available, peak_rss_gb, released_custom_voice_0_6b

TEXT = "Hello, world! This is a tiny text for a tiny tokenizer."
SPEAKER, LANGUAGE = "ryan", "english"  # greedy, this random talker reaches EOS only after 40 frames
GREEDY = dict(do_sample=False, subtalker_dosample=False)


class StageTimer:
    """Wall time spent in a few of our model's methods (wrapped on the instances, for one run)."""

    def __init__(self, tts):
        self.seconds = {"prefill": 0.0, "talker step": 0.0, "code predictor": 0.0}
        self.calls = dict.fromkeys(self.seconds, 0)
        talker = tts.talker
        self._wrap(talker, "forward", lambda: "prefill" if self.calls["prefill"] == 0 else "talker step")
        self._wrap(
            talker, "logits", lambda: "prefill" if self.calls["talker step"] == 0 else "talker step", count=False
        )
        self._wrap(talker.code_predictor, "predict_frame", lambda: "code predictor")

    def _wrap(self, obj, name, stage_of, count=True):
        method = getattr(obj, name)

        def timed(*args, **kwargs):
            stage = stage_of()
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0
                self.calls[stage] += count

        setattr(obj, name, timed)


def top2_gap(logits_v) -> float:
    top = np.sort(np.asarray(logits_v, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    gen = dict(GREEDY, max_new_tokens=args.frames + 1)

    from refimpl import Qwen3TTS
    from refimpl.backends.host_memory import wait_for_huge_pages

    path = released_custom_voice_0_6b()
    t0 = time.perf_counter()
    tts = Qwen3TTS.from_pretrained(path)
    tts.keep_logits = True  # the near-tie report below reads the logits of the run
    load_t = time.perf_counter() - t0
    wait_for_huge_pages()  # the steady state: the weights' copy in huge pages made
    tts.speech_tokenizer.decode = lambda codes, **_: np.zeros(len(codes) * 1920, dtype=np.float32)  # stub: codes only

    def ours():
        return tts.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True, **gen)[2][0]

    ours_t, codes = best_time(ours, args.repeats)
    n = len(codes)
    prompt_len = tts.last_log.prompt_embeds.shape[1]
    print(
        f"refimpl  0.6B CustomVoice (load {load_t:.1f} s), prompt {prompt_len} positions, {n} frames "
        f"({n / 12.5:.2f} s audio), {os.cpu_count()} cpus: {ours_t:.2f} s, {1000 * ours_t / max(n, 1):.0f} ms/frame, "
        f"RTF {ours_t / max(n / 12.5, 1e-9):.2f}"
    )
    timer = StageTimer(tts)
    split_t, _ = best_time(ours, 1)
    s, c = timer.seconds, timer.calls
    print(
        f"refimpl  split (one more run): prefill {1000 * s['prefill']:.0f} ms; talker step "
        f"{1000 * s['talker step'] / max(c['talker step'], 1):.0f} ms x {c['talker step']}; code predictor "
        f"{1000 * s['code predictor'] / max(c['code predictor'], 1):.0f} ms/frame x {c['code predictor']}; "
        f"rest (prompt building, sampling) {1000 * (split_t - sum(s.values())):.0f} ms; total {split_t:.2f} s"
    )
    print(f"refimpl  peak memory (ru_maxrss, before the official is loaded): {peak_rss_gb():.2f} GB")

    if not official_available():
        print("official qwen-tts not importable: no side-by-side ratio (run in the oracle environment)")
        return
    import torch
    from qwen_tts import Qwen3TTSModel

    off = Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)
    captured = []

    def stub_decode(items):
        captured[:] = [item["audio_codes"].numpy() for item in items]
        return [np.zeros(len(c) * 1920, dtype=np.float32) for c in captured], 24000

    off.model.speech_tokenizer.decode = stub_decode

    def official():
        with torch.inference_mode():
            off.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, **gen)
        return captured[0]

    off_t, off_codes = best_time(official, args.repeats)
    print(
        f"official {len(off_codes)} frames: {off_t:.2f} s, {1000 * off_t / max(len(off_codes), 1):.0f} ms/frame "
        f"(torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"attention {off.model.config.talker_config._attn_implementation})"
    )
    print(f"ratio refimpl / official: {ours_t / off_t:.2f}")
    if off_codes.shape == codes.shape and np.array_equal(off_codes, codes):
        print(f"greedy codes equal: all {codes.size} ({n} frames x 16)")
        return
    m = min(len(off_codes), n)
    diff = np.argwhere(off_codes[:m] != codes[:m])
    print(f"greedy codes DIFFER: shapes {codes.shape} vs {off_codes.shape}, {len(diff)} of {m * 16} differ")
    if len(diff):
        f, g = diff[0]
        log = tts.last_log
        logits = (
            (log.prefill_logits if f == 0 else log.step_logits[f - 1])[0]
            if g == 0
            else log.predictor_logits[f][0, g - 1]
        )
        print(
            f"first difference at frame {f}, group {g}: ours {codes[f, g]}, official {off_codes[f, g]}; "
            f"our top-2 raw logit gap there {top2_gap(logits):.3g}"
        )


if __name__ == "__main__":
    main()
