"""The cold start: a fresh process to its first audio, and to the end of a short generation, with the time
of each phase.

    python benchmarks/bench_cold_start.py [--runs 5] [--frames 10] [--write-results] [--package-cache]

Runs ``--runs`` fresh Python processes one after another on the full-size 0.6B CustomVoice (random weights,
bf16 on disk) and its speech tokenizer, greedy, each one: ``import refimpl``, ``from_pretrained``,
``stream_custom_voice`` (default schedule: the first chunk after one frame) to its first chunk, then on to the
end of ``--frames`` frames and their decode.  A probe inside the process takes the time stamps and wraps the
functions each phase runs (the huge-page copy, the finiteness check, the packing, the kernels loaded ahead,
every Numba kernel's first call and its cache load...), so that each phase has its own time; each figure is
the minimum over the runs.  A first run compiles the kernels into a Numba cache of the run's own
(``common.own_numba_cache``: what a user's first run leaves; ``--package-cache``: the package's cache, which
also holds the test suite's overloads) and brings the files into the page cache: what is measured is the
start with kernels cached and files in memory.  That first run is the command line below, and in the run's
own cache it is a first run on the machine: its time, one run, is the row "a first run on the machine"
(the kernels compiled, the files as the page cache holds them).  Then
``--runs`` runs of the command line, ``refimpl say TEXT --stream -o -``, its standard output read with time
stamps: the time to the first audio bytes (after the WAV header) and to the end of the stream.  And one
``python -X importtime -c "import refimpl; ..."`` counted by top-level package (the import's own time of
each).

Threads: 2 each (``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``) unless set before the start; the load
average is printed.  ``--write-results`` records the totals and the phases as the entry
``<machine kind>-cold-start`` of ``benchmarks/results.json`` (``results_file.py``);
``python docs/tools/results.py`` then rewrites docs/performance.md's table "The cold start" from it.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "2")  # the children inherit them

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import common  # noqa: E402  (the repository on sys.path; the checkpoints)
import results_file  # noqa: E402
from bench_talker import LANGUAGE, SPEAKER, TEXT  # noqa: E402

TARGETS = {"first audio, API": 1.0, "first audio, command line": 1.0, "10 frames and their decode": 2.0}

# The probe: a fresh process, time stamps from its first line (``time.time()``, comparable with the parent's
# clock at the start) and the seconds spent in the wrapped functions.  argv: model directory, text, speaker,
# language, frames, the parent's start time.
PROBE = r"""
import time
STARTED = time.time()
import json, sys
t_import = time.perf_counter()
import refimpl
imported = time.perf_counter()
import importlib
spent = {}  # what -> [calls, seconds]
first_calls = []  # (kernel, seconds of its first call, of which the cache load)

def wrap(module_name, owner_name, attr, what):
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    owner = getattr(module, owner_name) if owner_name else module
    fn = getattr(owner, attr, None)
    if fn is None:
        return
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            entry = spent.setdefault(what, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t
    setattr(owner, attr, timed)

# the phases of loading (module functions are looked up at each call, so wrapping them here counts)
wrap("refimpl.tts.model", None, "read_checkpoint_weights", "the model's weights read")
wrap("refimpl.io.checkpoint", None, "_read_copies", "the huge-page copy")
wrap("refimpl.io.checkpoint", None, "non_finite_tensors", "the finiteness check")
wrap("refimpl.backends.host_memory", None, "copy_into_huge_pages", "the huge-page copy, in the background")
wrap("refimpl.codec.speech_tokenizer", "SpeechTokenizer", "from_pretrained", "the codec loaded")
wrap("refimpl.tts.model", None, "load_text_tokenizer", "the text tokenizer loaded")
wrap("refimpl.tts.model", "Qwen3TTS", "_tokenize", "the text tokenized")
wrap("refimpl.tts.generate", None, "talker_step", "Talker passes")

def kernel_loads():
    # every Numba kernel's first call (typing its arguments, the cache load or a compilation) and the
    # cache load within it
    import numba.core.dispatcher as dispatcher
    from numba.core.caching import Cache
    import threading
    compile_for_args, load_overload = dispatcher.Dispatcher._compile_for_args, Cache.load_overload
    mine = threading.local()  # .loading: this thread's cache loads within its kernel's first call
    def first_call(self, *a, **k):
        t, mine.loading = time.perf_counter(), 0.0
        try:
            return compile_for_args(self, *a, **k)
        finally:
            first_calls.append((self.py_func.__name__, time.perf_counter() - t, mine.loading))
    def load(self, *a, **k):
        t = time.perf_counter()
        try:
            return load_overload(self, *a, **k)
        finally:
            mine.loading = getattr(mine, "loading", 0.0) + time.perf_counter() - t
    dispatcher.Dispatcher._compile_for_args = first_call
    Cache.load_overload = load

numba_import = [None, None]
class NumbaWatch:  # the import of numba, whenever it happens: its time and when
    def find_spec(self, name, path=None, target=None):
        if name == "numba" and numba_import[0] is None:
            numba_import[0] = time.perf_counter()
        return None
if "numba" in sys.modules:
    numba_import[:] = [imported, imported]
    kernel_loads()
else:
    sys.meta_path.insert(0, NumbaWatch())
    def after_numba():
        if numba_import[1] is None and "numba" in sys.modules and hasattr(sys.modules["numba"], "njit"):
            numba_import[1] = time.perf_counter()
            kernel_loads()
    # numba and the backend's setup are done when the first kernel module is imported
    class KernelsWatch:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("refimpl.backends.numba_cpu."):
                after_numba()
            return None
    sys.meta_path.insert(0, KernelsWatch())

wrap("refimpl.backends.numba_cpu.packed_words", None, "_pack_all", "the packing")  # (the thread's work)
wrap("refimpl.backends.numba_cpu.cached_kernels", None, "_load_first_audio", "the kernels loaded ahead")

from refimpl import Qwen3TTS
path, text, speaker, language, frames = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
t0 = time.perf_counter()
tts = Qwen3TTS.from_pretrained(path)
loaded = time.perf_counter()
import refimpl.codec.speech_tokenizer as st
push = st.DecodeStream.push
pushes = []
def timed_push(self, codes):
    t = time.perf_counter()
    try:
        return push(self, codes)
    finally:
        pushes.append(time.perf_counter() - t)
st.DecodeStream.push = timed_push
talker_steps = []
import refimpl.tts.generate as generate
step = generate.talker_step
def timed_step(*a, **k):
    t = time.perf_counter()
    try:
        return step(*a, **k)
    finally:
        talker_steps.append((t, time.perf_counter()))
generate.talker_step = timed_step
stream = tts.stream_custom_voice(text, speaker=speaker, language=language, max_new_tokens=frames + 1,
                                 do_sample=False, subtalker_dosample=False)
called = time.perf_counter()
first = next(stream)
first_audio = time.perf_counter()
rest = list(stream)
ended = time.perf_counter()
import numpy as np
print(json.dumps({
    "started": STARTED, "import": imported - t_import, "load": loaded - t0, "stream call": called - loaded,
    "to first chunk": first_audio - called, "first audio": first_audio - t_import,
    "prefill": talker_steps[0][1] - talker_steps[0][0],
    "first frame": first_audio - talker_steps[0][1] - pushes[0],
    "first push": pushes[0], "rest": ended - first_audio, "end": ended - t_import,
    "samples": int(sum(len(c) for c in [first, *rest])), "first samples": len(first),
    "numba import": None if numba_import[1] is None else numba_import[1] - numba_import[0],
    "spent": spent, "first calls": first_calls,
    "checksum": float(np.concatenate([first, *rest]).astype(np.float64).sum()),
}))
"""

IMPORT_PROBE = "import refimpl; from refimpl import Qwen3TTS; import refimpl.backends.numba_cpu"


def load_average() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def environment() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")])))


def probe_run(path, frames: int) -> dict:
    started = time.time()
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), TEXT, SPEAKER, LANGUAGE, str(frames)],
        capture_output=True,
        text=True,
        cwd=common.REPO,
        env=environment(),
    )
    if r.returncode != 0:
        raise RuntimeError(f"the probe failed:\n{r.stderr[-3000:]}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    result["interpreter"] = result["started"] - started  # the interpreter's start, until the probe's first line
    return result


def cli_run(path, frames: int) -> dict:
    """``refimpl say ... --stream -o -`` with its standard output read as it comes: the seconds from the
    start to the first audio bytes (after the 44-byte WAV header) and to the end."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "refimpl", "say", TEXT, "--model", str(path), "--speaker", SPEAKER]
        + ["--language", LANGUAGE, "--greedy", "--max-new-tokens", str(frames + 1), "--stream", "-o", "-", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=common.REPO,
        env=environment(),
    )
    received, first = 0, None
    while True:
        data = p.stdout.read1(1 << 16)
        if not data:
            break
        received += len(data)
        if first is None and received > 44:
            first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    err = p.stderr.read()
    if p.wait() != 0:
        raise RuntimeError(f"refimpl say failed:\n{err.decode(errors='replace')[-3000:]}")
    return {"first audio": first, "end": end, "bytes": received}


def import_times() -> list:
    """(package, seconds) of ``IMPORT_PROBE`` under ``-X importtime``: each module's own time, summed by its
    top-level package, largest first."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", IMPORT_PROBE],
        capture_output=True,
        text=True,
        cwd=common.REPO,
        env=environment(),
    )
    by_package = collections.Counter()
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line[len("import time:") :].split("|")
        by_package[name.strip().split(".")[0]] += int(own) / 1e6
    return by_package.most_common()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="fresh processes of each kind (the minimum is kept)")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--write-results", action="store_true", help="record the entry of benchmarks/results.json")
    ap.add_argument(
        "--package-cache",
        action="store_true",
        help="load the kernels from the package's Numba cache (with the test suite's overloads), not the run's own",
    )
    args = ap.parse_args()
    os.environ.update(common.own_numba_cache(args.package_cache))  # (the children inherit it)
    start_load = os.getloadavg()[0]
    path = common.released_custom_voice_0_6b()
    print(
        f"{os.cpu_count()} cpus, {load_average()}; threads: numba {os.environ['NUMBA_NUM_THREADS']}, OpenBLAS "
        f"{os.environ['OPENBLAS_NUM_THREADS']}; {args.runs} runs, {args.frames} frames",
        flush=True,
    )
    first_run = cli_run(path, args.frames)  # the kernels compiled and cached, the files read
    if not args.package_cache:
        print(f"  a first run: first audio {first_run['first audio']:.2f} s, end {first_run['end']:.2f} s", flush=True)
    runs = []
    for i in range(args.runs):
        runs.append(probe_run(path, args.frames))
        print(f"  run {i + 1}: first audio {runs[-1]['first audio']:.2f} s, end {runs[-1]['end']:.2f} s", flush=True)
    checksums = {r["checksum"] for r in runs}
    cli = [cli_run(path, args.frames) for _ in range(args.runs)]

    def best(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return min(values) if values else None

    def best_spent(what):
        values = [r["spent"][what][1] for r in runs if what in r["spent"]]
        return min(values) if values else None

    kernels = min(runs, key=lambda r: sum(t for _, t, _ in r["first calls"]))["first calls"]
    interpreter = best("interpreter")
    phases = [  # (what, seconds, note): the timeline, then what lies inside it
        ("interpreter start", interpreter, "until the first line of the program"),
        ("import refimpl", best("import"), ""),
        ("load (from_pretrained)", best("load"), ""),
        ("  the model's weights read", best_spent("the model's weights read"), "the Talker's file: map, copies"),
        ("    the huge-page copy", best_spent("the huge-page copy"), "bf16 matrices into 2 MB pages"),
        ("  the finiteness check", best_spent("the finiteness check"), "every weight read once"),
        ("  the codec loaded", best_spent("the codec loaded"), "in a thread, beside the Talker's check"),
        ("  the text tokenizer loaded", best_spent("the text tokenizer loaded"), ""),
        ("the stream's call", best("stream call"), "the prompt built and embedded"),
        ("  the text tokenized", best_spent("the text tokenized"), ""),
        ("the prompt (prefill)", best("prefill"), "the first Talker pass"),
        ("the first frame", best("first frame"), "code predictor's 15 steps, a Talker step"),
        ("the first chunk's decode", best("first push"), "one frame through the streaming decoder"),
        ("  import numba", best("numba import"), "and the numba backend's setup"),
        (
            "  the kernels' first calls",
            min(sum(t for _, t, _ in r["first calls"]) for r in runs),
            f"{len(kernels)} first calls; their cache loads "
            f"{min(sum(c for _, _, c in r['first calls']) for r in runs):.3f} s",
        ),
        ("  the kernels loaded ahead", best_spent("the kernels loaded ahead"), "from the cache, in a thread (load)"),
        ("  the packing", best_spent("the packing"), "the code predictor's words in 12 bits (in a thread)"),
        ("the rest of the frames and the decode", best("rest"), f"to {args.frames} frames"),
    ]
    background = best_spent("the huge-page copy, in the background")
    if background is not None:
        phases.insert(5, ("    the huge-page copy, in the background", background, "not on the path"))
    cli_first = min(r["first audio"] for r in cli)
    cli_end = min(r["end"] for r in cli)
    totals = [
        ("first audio, API", interpreter + best("first audio"), "a fresh process: import, load, first chunk"),
        ("first audio, command line", cli_first, "refimpl say --stream -o -: the first audio bytes"),
        (f"{args.frames} frames and their decode", interpreter + best("end"), "the same process, to the end"),
        (f"{args.frames} frames, command line", cli_end, "refimpl say --stream -o -: the end of the stream"),
    ]
    if not args.package_cache:  # (the package's cache already holds the kernels: no first run there)
        totals.append(
            (
                "a first run on the machine",
                first_run["end"],
                f"refimpl say --stream -o -, the kernels compiled into an empty Numba cache (one run; its first audio "
                f"{first_run['first audio']:.1f} s)",
            )
        )
    print("\nthe phases (seconds, minimum over the runs; indented: inside the line above):")
    for what, seconds, note in phases:
        print(f"  {what:45s} {'-' if seconds is None else f'{seconds:7.3f}'}  {note}")
    print("\nthe kernels' first calls (the fastest run; seconds, of which the cache load):")
    for name, seconds, loading in sorted(kernels, key=lambda k: -k[1])[:12]:
        print(f"  {name:40s} {seconds:7.3f}  {loading:7.3f}")
    print("\nimport refimpl and the kernels' modules (-X importtime, the modules' own times by package):")
    for package, seconds in import_times()[:10]:
        print(f"  {package:40s} {seconds:7.3f}")
    print("\ntotals:")
    for what, seconds, note in totals:
        target = TARGETS.get(what)
        print(f"  {what:45s} {seconds:7.3f} s  {'' if target is None else f'(target <= {target} s)'}  {note}")
    print(f"  (the same audio in every run: {len(checksums) == 1}; {load_average()})", flush=True)
    if args.write_results:
        write_results(totals, phases, start_load, args)


def write_results(totals: list, phases: list, start_load: float, args) -> None:
    """The entry ``<kind>-cold-start`` of benchmarks/results.json: the totals (against the target), then
    each phase (against the first audio of the API run: its share)."""
    cpu = results_file.cpu_info()
    kind = results_file.machine_kind(cpu) + "-cold-start"
    first_audio = totals[0][1]
    rows = [(what, seconds, None, None, "s", note, TARGETS.get(what)) for what, seconds, note in totals]
    rows += [
        (what.strip(), seconds, first_audio, seconds / first_audio, "s", note, None)
        for what, seconds, note in phases
        if seconds is not None
    ]
    threads = {"numba": int(os.environ["NUMBA_NUM_THREADS"]), "openblas": int(os.environ["OPENBLAS_NUM_THREADS"])}
    title = f"{results_file.entry([], cpu=cpu, threads={}, load=0)['title']}: the cold start"
    entry = results_file.entry(
        rows,
        cpu=cpu,
        threads=threads,
        load=start_load,
        extra={"title": title, "source": f"benchmarks/bench_cold_start.py, {args.runs} runs"},
    )
    results_file.write_entry(kind, entry)
    print(f"\nwritten: entry {kind!r} of {results_file.RESULTS.relative_to(common.REPO)}", flush=True)


if __name__ == "__main__":
    main()
