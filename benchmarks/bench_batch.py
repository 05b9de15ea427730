"""Batches: the time per generation step (Talker step + 15 code-predictor steps) for B texts at once.

    python benchmarks/bench_batch.py [--frames 10] [--repeats 3] [--batches 1 2 4 8] [--write-results]

The full-size synthetic 0.6B CustomVoice (bf16 on disk), greedy, B different texts of different lengths
(left-padded into one batch: ``refimpl.tts.generate``).  For each B it prints the time of one step, which
makes one frame for every row, its ratio to B = 1 (the target: B = 4 within 1.4 times one text's step), the
bytes of weights a step reads against ``bench_floor.py``'s read kernel over them (the memory floor: where
the step's time leaves it, the step stops being memory-bound), the code predictor's part of the step against
one text's whole step (where that part alone passes the target, no Talker step could bring the row within it:
the code predictor's steps for several texts are bound by the arithmetic of its packed words, not by their
bytes) and the seconds that part's products take at the machine's peak rate of float32 multiply-adds
(``compute_floor.py``: how far the part is from its arithmetic's floor), and whether each row's codes equal
the single run of its text.  Each B keeps the best of
``--repeats`` runs; the B are run in turn, round after round, so that the machine's drift falls on all alike.

``--write-results`` records the row "batch of 4: per frame / one text's" in this machine's entry of
``benchmarks/results.json`` (``results_file.write_row``); ``python docs/tools/results.py`` then rewrites the
docs' tables.  ``--quick``: 2 frames, one repeat, B = 1 and 2 (does it run?).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "2")  # before NumPy or Numba start their thread pools

import argparse  # noqa: E402
import time  # noqa: E402

import common  # noqa: E402, F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import compute_floor  # noqa: E402
import numpy as np  # noqa: E402
import results_file  # noqa: E402
from bench_floor import ReadKernel, frame_bytes_as_read  # noqa: E402
from bench_talker import GREEDY, LANGUAGE, SPEAKER, TEXT, StageTimer  # noqa: E402
from common import released_custom_voice_0_6b  # noqa: E402

TEXTS = (  # different lengths: the batch is left-padded
    TEXT,
    "A second, shorter text.",
    "The third text of the batch is the longest of them all, by a few words more.",
    "Four.",
    "Five texts make a batch of more than four.",
    "Six: the sixth text.",
    "Seven is a number too, and this is its text.",
    "Eight, the last one.",
)
ROW = "batch of 4: per frame / one text's"
TARGET = 1.4


def step_seconds(tts, texts, frames: int) -> tuple:
    """The time of one generation step for the batch ``texts`` (a Talker step + the code predictor's frame,
    each the mean over the run; prompt and sampling left out), and each row's codes."""
    talker, predictor, codes = step_parts(tts, texts, frames)
    return talker + predictor, codes


def step_parts(tts, texts, frames: int) -> tuple:
    """``step_seconds``'s two parts, (the Talker's step, the code predictor's 15 steps), and each row's codes."""
    timer = StageTimer(tts)
    try:
        codes = tts.generate_custom_voice(
            list(texts),
            speaker=[SPEAKER] * len(texts),
            language=[LANGUAGE] * len(texts),
            return_codes=True,
            max_new_tokens=frames + 1,
            **GREEDY,
        )[2]
    finally:
        for obj in (tts.talker, tts.talker.code_predictor):
            for name in ("forward", "logits", "predict_frame"):
                obj.__dict__.pop(name, None)  # unwrap
    s, c = timer.seconds, timer.calls
    return s["talker step"] / max(c["talker step"], 1), s["code predictor"] / max(c["code predictor"], 1), codes


def best_steps(tts, batches, frames: int, repeats: int) -> tuple:
    """For each B of ``batches`` (the first B texts), the best of ``repeats`` steps (``step_parts``: the B
    taken in turn, round after round, so that the machine's drift falls on all alike), the code predictor's
    part of that best step, and the rows' codes of each B's last run: three dicts by B."""
    best, predictor, codes = dict.fromkeys(batches, float("inf")), {}, {}
    for _ in range(repeats):
        for B in batches:
            talker, predictor_s, codes[B] = step_parts(tts, TEXTS[:B], frames)
            if talker + predictor_s < best[B]:
                best[B], predictor[B] = talker + predictor_s, predictor_s
    return best, predictor, codes


def predictor_share(predictor_4: float, step_1: float, floor_4: float) -> str:
    """The note's words for the code predictor's part of a step for 4 texts against one text's whole step:
    where it passes the target alone, no Talker step could bring the row within it; and what its products
    take at the machine's peak (``floor_4``, ``compute_floor.predictor_floor``), against the same step: how
    far the part is from being bound by its arithmetic."""
    share = f"the code predictor's steps for 4 texts alone: {predictor_4 / step_1:.2f} x one text's step"
    return f"{share}, their products at the peak {floor_4 / step_1:.2f} x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-results", action="store_true", help="record the B = 4 row in benchmarks/results.json")
    args = ap.parse_args()
    if args.quick and args.write_results:
        ap.error("--write-results records a full run, not --quick")
    frames, repeats, batches = (2, 1, [1, 2]) if args.quick else (args.frames, args.repeats, args.batches)
    if max(batches) > len(TEXTS) or min(batches) < 1:
        ap.error(f"batches from 1 to {len(TEXTS)}")
    if args.write_results and not {1, 4} <= set(batches):
        ap.error("--write-results needs B = 1 and B = 4")
    start_load = os.getloadavg()[0]

    import numba

    from refimpl import Qwen3TTS

    tts = Qwen3TTS.from_pretrained(released_custom_voice_0_6b())
    tts.speech_tokenizer.decode = lambda codes, **_: np.zeros(len(codes) * 1920, dtype=np.float32)  # codes only
    print(
        f"{os.cpu_count()} cpus, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; threads: numba "
        f"{numba.get_num_threads()}, OpenBLAS {os.environ['OPENBLAS_NUM_THREADS']}; {frames} frames, greedy",
        flush=True,
    )
    singles = [step_seconds(tts, [t], frames)[1][0] for t in TEXTS[: max(batches)]]  # (also the warm-up)
    for B in batches:
        step_seconds(tts, TEXTS[:B], 1)  # each batch size's kernels compiled or loaded, once
    kernel = ReadKernel(frame_bytes_as_read(tts))  # the bytes a step reads, the code predictor packed
    floor = kernel.seconds()
    best, predictor, codes = best_steps(tts, batches, frames, repeats)
    peak = compute_floor.fma_peak(numba.get_num_threads())
    floors = {B: compute_floor.predictor_floor(tts, B, peak) for B in batches}
    equal = {B: all(np.array_equal(c, s) for c, s in zip(codes[B], singles, strict=False)) for B in batches}
    floor = min(floor, kernel.seconds())
    print(f"the weights a step reads: {kernel.nbytes / 1e9:.2f} GB, read alone in {1000 * floor:.0f} ms (the floor)")
    print(f"the peak of float32 multiply-adds ({numba.get_num_threads()} threads): {peak / 1e9:.0f} GFLOP/s")
    for B in batches:
        print(
            f"  B = {B}: {1000 * best[B]:.0f} ms a step ({1000 * best[B] / B:.1f} ms a frame of one row), "
            f"{best[B] / best[batches[0]]:.2f} x B = {batches[0]}, {best[B] / floor:.2f} x the floor; its code "
            f"predictor's steps {1000 * predictor[B]:.0f} ms, {predictor[B] / best[batches[0]]:.2f} x B = "
            f"{batches[0]}'s whole step (their products at the peak {1000 * floors[B]:.0f} ms); codes equal to "
            f"the single runs: {equal[B]}",
            flush=True,
        )
    if args.write_results:
        others = [B for B in batches if B > 1]
        against_one = ", ".join(f"{best[B] / best[1]:.2f}" for B in others)
        against_floor = ", ".join(f"{best[B] / floor:.2f}" for B in batches)
        note = (
            f"(a step for B = {', '.join(map(str, others))} texts: {against_one} x one text's; a step for "
            f"B = {', '.join(map(str, batches))} against the read of its {kernel.nbytes / 1e9:.2f} GB of weights: "
            f"{against_floor}; {predictor_share(predictor[4], best[1], floors[4])}; codes equal to the single runs: "
            f"{all(equal.values())}; {frames} frames; start load "
            f"{start_load:.2f})"
        )
        kind = results_file.machine_kind(results_file.cpu_info())
        results_file.write_row(kind, (ROW, 1000 * best[4], 1000 * best[1], best[4] / best[1], "ms", note, TARGET))
        print(f"written: the row {ROW!r} of entry {kind!r} of benchmarks/results.json", flush=True)
    print(f"({time.strftime('%H:%M:%S')}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
