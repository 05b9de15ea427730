"""The whole target table of the performance work, from one command, ours and the official side by side.

    .oracle-venv/bin/python benchmarks/bench_table.py [--repeats 3] [--frames 20] [--quick] [--no-ports]

Every row is a ratio taken in this one process, in the same minutes, each side keeping the best of
``--repeats`` runs and the two sides taking turns by blocks of runs (ours, official, ours, official; each
block's first run untimed: ``common.alternate``), so that the machine's changing speed falls on both alike:

    per frame / floor          our time per frame (Talker step + 15 code-predictor steps, greedy; best of 3) against
                               the read kernel over the same weights (bench_floor.py), measured around it
                               (the note: our frame against a pass run after each frame, the same seconds,
                               and against the read of the bytes a frame reads now, the code predictor's
                               matrices packed: bench_floor.frame_bytes_as_read)
    batch of 4                 the time of one generation step for 4 different texts at once against one
                               text's (bench_batch.py, which also runs B = 2 and 8), greedy; the note says
                               whether each text's codes equal its single run's
    end to end / official      generate_custom_voice, greedy, --frames frames, with the codec decode
    first frame / official     the same with max_new_tokens=2: prompt, prefill, one frame, its decode
    codec decoder / official   125 frames (10 s) of random codes
    codec encoder / official   10 s of audio (bench_codec_encoder.test_audio)
    speaker encoder / official 10 s of audio, the 0.6B-Base speaker encoder (3 x --repeats runs, at least 9:
                               a short call); each of these three rows'
                               notes gives its products' compute floor (compute_floor.py): their GFLOP,
                               the seconds they take at this machine's peak rate of float32 multiply-adds
                               on the threads used, and that floor as a ratio of the official's time
    streaming                  time to the first chunk of stream_custom_voice (default schedule: the first
                               chunk after one frame) / our time of the 1-frame generation, the two
                               taken in turn
    peak RSS / files read      a fresh process: load, 10 frames, decode (its VmHWM), against the bytes of
                               model.safetensors + speech_tokenizer/model.safetensors

Threads: 2 on each side unless set before the start (``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
torch's ``set_num_threads``); the load average is printed before each row (measure at load below 1: a
shared VM's other work slows the two sides unevenly).  Without the official package (not the oracle
environment) the official column stays empty.  ``--quick`` (a check that the script runs): 3 frames, one
repeat, a 2 s codec decode and 2 s encodes.

``--write-results`` records the table as this kind of machine's entry of ``benchmarks/results.json``
(``results_file.py``; never for ``--quick`` or without the official side); ``python docs/tools/results.py``
then rewrites the tables of README.md and docs/ that quote it (docs/benchmarks.md).

Then the peers' columns: for each public port whose wheel is installed in its own environment under
``benchmarks/ports/.envs/`` (``ports/speed.py``'s ``PEERS``: qwentts.cpp with its BF16 GGUF files, vox,
candle-tts, mlx-audio), ``benchmarks/ports/speed.py`` with ``--repeats`` runs: per frame, the generation
alone, the first audio in a fresh process and the codec decode, the port's figure beside ours, each in fresh
processes (the port's in its environment, ours in the project's); with ``--write-results`` each port's entry
too.  A port not installed is named and left out; ``--no-ports`` leaves them all out (``--quick`` runs none).
``--port-source`` and ``--quantize-tool`` go to qwentts.cpp's run where its GGUF files are not made yet.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "2")  # before NumPy, Numba or torch start their thread pools

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import common  # noqa: E402, F401  (OpenBLAS's idle spin set before NumPy loads it)
import compute_floor  # noqa: E402
import numpy as np  # noqa: E402
import results_file  # noqa: E402
from bench_batch import TEXTS, best_steps, predictor_share, step_seconds  # noqa: E402
from bench_codec_encoder import test_audio  # noqa: E402
from bench_floor import (  # noqa: E402
    ReadKernel,
    frame_bytes_as_read,
    frame_words,
    per_frame_seconds,
    per_frame_with_reads_between,
)
from bench_talker import GREEDY, LANGUAGE, SPEAKER, TEXT  # noqa: E402
from common import (  # noqa: E402
    REPO,
    alternate,
    official_available,
    released_custom_voice_0_6b,
    released_speaker_encoder,
)

TARGETS = {
    "per frame / floor": 1.12,
    "batch of 4: per frame / one text's": 1.4,
    "end to end / official": 0.36,
    "first frame / official": 0.5,
    "codec decoder / official": 0.5,
    "codec encoder / official": 0.75,
    "speaker encoder / official": 0.7,
    "streaming: first audio / 1-frame generation": 1.15,
    "peak RSS / files read": 1.05,
}

RSS_PROBE = r"""
import sys
import numpy as np
from refimpl import Qwen3TTS
from refimpl.backends.host_memory import wait_for_huge_pages
tts = Qwen3TTS.from_pretrained(sys.argv[1])
wait_for_huge_pages()  # the weights' copy in huge pages made, as a long-running process has it
tts.generate_custom_voice(sys.argv[2], speaker=sys.argv[3], language=sys.argv[4], max_new_tokens=11,
                          do_sample=False, subtalker_dosample=False)
# VmHWM, not ru_maxrss: after fork + exec Linux keeps the parent's peak in ru_maxrss (the benchmark's own
# process, with both models loaded), while VmHWM belongs to this program's memory alone
print(int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1]) * 1024)
"""


def load_average() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class Table:
    def __init__(self):
        self.rows = []

    def add(self, what: str, ours: float, other: float | None, unit: str, note: str = "") -> None:
        ratio = None if other is None else ours / other
        self.rows.append((what, ours, other, ratio, unit, note))
        other_s = "-" if other is None else f"{other:.3g} {unit}"
        ratio_s = "-" if ratio is None else f"{ratio:.2f}"
        print(f"  {what}: {ours:.3g} {unit} / {other_s} = {ratio_s}  {note}  ({load_average()})", flush=True)

    def markdown(self) -> str:
        lines = ["| what | ours | against | ratio | target | met? |", "|---|---|---|---|---|---|"]
        for what, ours, other, ratio, unit, note in self.rows:
            target = TARGETS.get(what)
            met = "-" if ratio is None or target is None else ("yes" if ratio <= target else "no")
            lines.append(
                f"| {what} | {ours:.3g} {unit} | {'-' if other is None else f'{other:.3g} {unit}'} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} | {'' if target is None else f'<= {target}'} | {met} |"
                + (f" {note}" if note else "")
            )
        return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 frames, one repeat, 2 s of audio: does it run?")
    ap.add_argument(
        "--write-results",
        action="store_true",
        help="record the table as this machine's entry of benchmarks/results.json (not with --quick)",
    )
    ap.add_argument("--no-ports", action="store_true", help="leave out the installed ports (ports/speed.py)")
    ap.add_argument("--port-source", help="qwentts.cpp: a checkout of its repository (its GGUF files not made yet)")
    ap.add_argument("--quantize-tool", help="qwentts.cpp: its quantize binary (its BF16 files not made yet)")
    args = ap.parse_args()
    if args.quick and args.write_results:
        ap.error("--write-results records a full run, not --quick")
    start_load = os.getloadavg()[0]
    frames, repeats = (3, 1) if args.quick else (args.frames, args.repeats)
    decode_frames, seconds = (25, 2.0) if args.quick else (125, 10.0)

    import numba

    from refimpl import Qwen3TTS, SpeechTokenizer
    from refimpl.backends import host_memory
    from refimpl.io.checkpoint import huge_pages_enabled
    from refimpl.tts.speaker_encoder import SpeakerEncoder

    path = released_custom_voice_0_6b()
    speaker_path = released_speaker_encoder()
    official = official_available()
    torch = None
    if official:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(
        f"{os.cpu_count()} cpus, {load_average()}; threads: numba {numba.get_num_threads()}, OpenBLAS "
        f"{os.environ['OPENBLAS_NUM_THREADS']}, torch {torch.get_num_threads() if torch else '-'}; bf16 words in "
        f"{'2 MB huge pages' if huge_pages_enabled() else 'the memory map'}; official: "
        f"{'qwen-tts, torch ' + torch.__version__ if official else 'not importable (ours only)'}",
        flush=True,
    )
    table = Table()
    t0 = time.perf_counter()
    tts = Qwen3TTS.from_pretrained(path)
    print(f"  loading ours: {time.perf_counter() - t0:.2f} s", flush=True)
    host_memory.wait_for_huge_pages()  # the steady state: the weights' copy in huge pages made (it runs when idle)
    off = off_tok = None
    if official:
        from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer

        t0 = time.perf_counter()
        off = Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32)
        off_tok = Qwen3TTSTokenizer.from_pretrained(str(path / "speech_tokenizer"), dtype=torch.float32)
        print(f"  loading the official: {time.perf_counter() - t0:.2f} s", flush=True)

    # per frame / floor
    kernel = ReadKernel(frame_words(tts))
    per_frame_seconds(tts, 1)  # the kernels compiled or loaded from the cache, the pages touched
    # the best of 3 runs, the floor read before and after each: a VM's bandwidth moves from minute to minute, and
    # a floor read only before and after the three could miss the fast moment a run had
    floor, runs = kernel.seconds(), []
    for _ in range(3):
        runs.append(per_frame_seconds(tts, frames))
        floor = min(floor, kernel.seconds())
    frame, n = min(runs)
    paired, between, _ = per_frame_with_reads_between(tts, frames, kernel)  # (the same seconds: a note)
    as_read = ReadKernel(frame_bytes_as_read(tts))  # the bytes a frame reads now (the code predictor packed)
    read_now = as_read.seconds()
    table.add(
        "per frame / floor",
        1000 * frame,
        1000 * floor,
        "ms",
        f"({kernel.nbytes / 1e9:.2f} GB per frame read at {kernel.nbytes / floor / 1e9:.1f} GB/s; {n} frames; "
        f"a pass between frames {1000 * between:.0f} ms, {1000 * paired:.0f} / {1000 * between:.0f} = "
        f"{paired / between:.2f}; the {as_read.nbytes / 1e9:.2f} GB it reads now, packed, in "
        f"{1000 * read_now:.0f} ms: {frame / read_now:.2f})",
    )

    # a batch of 4 texts against one, step by step, alternating
    singles = [step_seconds(tts, [text], frames)[1][0] for text in TEXTS[:4]]  # (the warm-up too)
    step_seconds(tts, TEXTS[:4], 1)
    steps, predictor, codes = best_steps(tts, (1, 4), frames, repeats)
    floor_4 = compute_floor.predictor_floor(tts, 4, compute_floor.fma_peak(numba.config.NUMBA_NUM_THREADS))
    same = all(np.array_equal(c, s) for c, s in zip(codes[4], singles, strict=True))
    table.add(
        "batch of 4: per frame / one text's",
        1000 * steps[4],
        1000 * steps[1],
        "ms",
        f"(a step for 4 texts against a step for 1; {predictor_share(predictor[4], steps[1], floor_4)}; codes equal "
        f"to the single runs: {same}; {frames} frames)",
    )

    # end to end and first frame, with the codec decode; the official's decoded codes are kept
    captured = []
    if official:
        decode = off.model.speech_tokenizer.decode

        def recording_decode(items):
            captured[:] = [item["audio_codes"].numpy() for item in items]
            return decode(items)

        off.model.speech_tokenizer.decode = recording_decode

    def generation(max_new_tokens):
        gen = dict(GREEDY, max_new_tokens=max_new_tokens)

        def ours():
            wavs, _, codes = tts.generate_custom_voice(
                TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True, **gen
            )
            return wavs[0], codes[0]

        def theirs():
            with torch.inference_mode():
                return off.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, **gen)[0][0]

        return ours, theirs if official else None

    def codes_note(results):
        if "official" not in results:
            return ""
        codes, theirs = results["ours"][1], captured[0]
        same = codes.shape == theirs.shape and np.array_equal(codes, theirs)
        wav_diff = np.max(np.abs(results["ours"][0] - results["official"])) if same else float("nan")
        return f"(greedy codes equal: {same}, {codes.shape[0]} frames; waveform max diff {wav_diff:.1e})"

    ours_e2e, off_e2e, res = alternate(*generation(frames + 1), repeats)
    table.add("end to end / official", ours_e2e, off_e2e, "s", codes_note(res))
    ours_first, off_first, res = alternate(*generation(2), repeats)
    table.add("first frame / official", ours_first, off_first, "s", codes_note(res))

    # streaming: the time to the first chunk of the default schedule against the 1-frame generation, the two
    # taken in turn (the drift of a shared machine falls on both alike), three times as many rounds as the
    # other rows: each is short (the stream is closed after its first chunk), and the row is a small
    # difference of two like times
    def first_audio():
        t0 = time.perf_counter()
        stream = tts.stream_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, max_new_tokens=frames + 1, **GREEDY)
        first = next(stream)
        elapsed = time.perf_counter() - t0
        stream.close()
        return elapsed, len(first)

    one_frame = generation(2)[0]
    best_first, best_one = float("inf"), float("inf")
    first_audio()  # warm-up: the streaming decoder's first use
    for _ in range(3 * repeats):
        elapsed, first_n = first_audio()
        best_first = min(best_first, elapsed)
        t0 = time.perf_counter()
        one_frame()
        best_one = min(best_one, time.perf_counter() - t0)
    table.add(
        "streaming: first audio / 1-frame generation",
        best_first,
        best_one,
        "s",
        f"(first chunk {first_n / tts.sample_rate * 1000:.0f} ms of audio)",
    )

    # codec decoder, encoder, speaker encoder, each with its products' compute floor (the peak timed again
    # here, beside the rows that use it, as for the batch row: the VM's speed moves from minute to minute)
    peak = compute_floor.fma_peak(numba.config.NUMBA_NUM_THREADS)
    print(f"  peak of float32 multiply-adds: {peak / 1e9:.0f} GFLOP/s ({numba.config.NUMBA_NUM_THREADS} threads)")

    def floor_note(run, official_s):
        return compute_floor.floor_note(compute_floor.products_gflop(run), peak, official_s)

    tok: SpeechTokenizer = tts.speech_tokenizer
    codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(decode_frames, tok.num_quantizers))
    codes_t = torch.from_numpy(codes) if official else None

    def off_decode():
        with torch.inference_mode():
            return off_tok.decode([{"audio_codes": codes_t}])[0][0]

    ours_t, off_t, res = alternate(lambda: tok.decode(codes), off_decode if official else None, repeats)
    note = f"(max diff {np.max(np.abs(res['ours'] - res['official'])):.1e})" if official else ""
    note = f"{note} {floor_note(lambda: tok.decode(codes), off_t)}"
    table.add("codec decoder / official", ours_t, off_t, "s", f"({decode_frames} frames) {note}")

    audio = test_audio(seconds)
    tok.encode(audio[:1920], sr=24000)  # loads the encoder weights

    def off_encode():
        with torch.inference_mode():
            return off_tok.encode(audio, sr=24000).audio_codes[0].numpy()

    ours_t, off_t, res = alternate(
        lambda: tok.encode_detailed(audio, sr=24000).codes, off_encode if official else None, repeats
    )
    note = f"(codes equal: {int((res['ours'] == res['official']).sum())} / {res['official'].size})" if official else ""
    note = f"{note} {floor_note(lambda: tok.encode(audio, sr=24000), off_t)}"
    table.add("codec encoder / official", ours_t, off_t, "s", f"({seconds:g} s) {note}")

    enc = SpeakerEncoder.from_pretrained(speaker_path)
    off_speaker = None
    if official:
        import types

        from bench_speaker_encoder import official_encoder
        from qwen_tts.core.models import modeling_qwen3_tts as mq

        owner = types.SimpleNamespace(
            speaker_encoder=official_encoder(speaker_path), device=torch.device("cpu"), dtype=torch.float32
        )

        def off_speaker():
            with torch.inference_mode():
                return mq.Qwen3TTSForConditionalGeneration.extract_speaker_embedding(owner, audio=audio, sr=24000)

    # a short call, each side's time moving from run to run on a shared VM: more runs, so that the minimum is
    # the call's and not the moment's
    ours_t, off_t, res = alternate(lambda: enc.embed(audio), off_speaker, max(3 * repeats, 9))
    note = f"(max diff {np.max(np.abs(res['ours'] - res['official'].numpy())):.1e})" if official else ""
    note = f"{note} {floor_note(lambda: enc.embed(audio), off_t)}"
    table.add("speaker encoder / official", ours_t, off_t, "s", note.strip())

    # peak RSS in a fresh process (ours only: nothing of the official is loaded there)
    r = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(path), TEXT, SPEAKER, LANGUAGE],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    if r.returncode != 0:
        raise RuntimeError(f"the peak-memory probe failed:\n{r.stderr[-2000:]}")
    files = os.path.getsize(path / "model.safetensors") + os.path.getsize(
        path / "speech_tokenizer" / "model.safetensors"
    )
    table.add("peak RSS / files read", int(r.stdout.split()[-1]) / 1e9, files / 1e9, "GB", "(load, 10 frames, decode)")

    print()
    print(table.markdown())
    if args.write_results:
        write_results(table, start_load, official, torch)
    if not (args.quick or args.no_ports):
        peers(repeats, args.write_results and official, args.port_source, args.quantize_tool)


def settle(most_s: float = 180.0) -> None:
    """Wait, at most ``most_s``, for the 1-minute load average to fall below 1: the rows just run leave it
    high for a minute or so, and each port's entry records the load at its start."""
    t0 = time.perf_counter()
    while os.getloadavg()[0] >= 1 and time.perf_counter() - t0 < most_s:
        time.sleep(5)


def peers(runs: int, write: bool, port_source: str | None, quantize_tool: str | None) -> None:
    """The ports' columns: ``benchmarks/ports/speed.py`` for each port whose wheel is installed in its own
    environment (``speed.PEERS``), one after another once the load has fallen (``settle``), in fresh processes
    (the port's in its environment, ours in the project's), each printing its rows and, with ``write``,
    recording its entry."""
    sys.path.insert(0, str(REPO / "benchmarks" / "ports"))
    import speed

    project = REPO / ".venv" / "bin" / "python"  # ours: the project's environment where it has one
    python = str(project) if project.exists() else sys.executable
    for name, argv in speed.peer_runs(runs, write, port_source, quantize_tool):
        if argv is None:
            print(f"\n{name}: its wheel is not installed (benchmarks/ports/README.md): no columns", flush=True)
            continue
        settle()
        print(f"\n{name} beside refimpl: benchmarks/ports/speed.py {' '.join(argv)}  ({load_average()})", flush=True)
        r = subprocess.run([python, str(REPO / "benchmarks" / "ports" / "speed.py"), *argv], cwd=REPO)
        if r.returncode != 0:
            print(f"{name}: speed.py failed (exit status {r.returncode}); the other rows stand", flush=True)


def write_results(table: Table, start_load: float, official: bool, torch) -> None:
    """This machine's entry of benchmarks/results.json, from a full run with the official side."""
    if not official:
        print("\nresults not written: without the official package the table has no ratios", flush=True)
        return
    import numba

    cpu = results_file.cpu_info()
    kind = results_file.machine_kind(cpu)
    threads = {
        "numba": numba.get_num_threads(),
        "openblas": int(os.environ["OPENBLAS_NUM_THREADS"]),
        "torch": torch.get_num_threads(),
    }
    rows = [
        (what, ours, other, ratio, unit, note, TARGETS.get(what)) for what, ours, other, ratio, unit, note in table.rows
    ]
    entry = results_file.entry(rows, cpu=cpu, threads=threads, load=start_load, extra={"torch": torch.__version__})
    results_file.write_entry(kind, entry)
    print(
        f"\nwritten: entry {kind!r} of {results_file.RESULTS.relative_to(REPO)}; "
        "python docs/tools/results.py rewrites the docs' tables from it",
        flush=True,
    )


if __name__ == "__main__":
    main()
