"""A generation on a busy machine: the same greedy 10 frames alone and beside processes that keep every core
busy, by how long Numba's OpenMP threads spin when they wait, and with one Numba thread.

    python benchmarks/bench_busy.py [--frames 10] [--repeats 3] [--write-results]

Each setting runs in a fresh process (GNU OpenMP reads its spin count when it loads): the full-size synthetic
0.6B CustomVoice (bf16 on disk), greedy, codes only, one generation of ``--frames`` frames to warm up, then
the best of ``--repeats``.  The settings: GNU OpenMP's default (300,000 rounds before a waiting thread
sleeps; refimpl leaves it), ``GOMP_SPINCOUNT=10000``, and one Numba thread (no waits at all).  First
alone, then beside one spinning process per core (``while True: pass``, ordinary priority): a desktop's
compile, another user's job.  Threads: 2 each (``NUMBA_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``) unless set; the load average before the quiet runs is printed and recorded.

``--write-results`` records the entry ``<machine kind>-busy`` of ``benchmarks/results.json``: each setting
against GNU OpenMP's default under the same conditions (``python docs/tools/results.py`` then rewrites
docs/performance.md's table "A busy machine").
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "2")  # the children inherit them

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import common  # noqa: E402  (the repository on sys.path; the checkpoints)
import results_file  # noqa: E402

# a fresh process: the model loaded, one warm-up generation, then the best of the repeats (argv: model
# directory, frames, repeats)
CHILD = r"""
import json, sys, time
sys.path.insert(0, "benchmarks")
from bench_talker import GREEDY, LANGUAGE, SPEAKER, TEXT
from refimpl import Qwen3TTS
tts = Qwen3TTS.from_pretrained(sys.argv[1])
frames, repeats = int(sys.argv[2]), int(sys.argv[3])
def run():
    t = time.perf_counter()
    tts.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True,
                              max_new_tokens=frames, **GREEDY)
    return time.perf_counter() - t
run()
print(json.dumps(min(run() for _ in range(repeats))))
"""

SETTINGS = (  # (name, environment changes; None: removed)
    ("GNU OpenMP's default (300,000 rounds)", {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}),
    ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000", "OMP_WAIT_POLICY": None}),
    ("one Numba thread", {"NUMBA_NUM_THREADS": "1", "GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}),
)
BASELINE = SETTINGS[0][0]


def seconds_of(directory, frames: int, repeats: int, changes: dict) -> float:
    """The best generation time of a fresh process run with the environment ``changes``."""
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), str(frames), str(repeats)],
        cwd=common.REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def spinners(n: int) -> list:
    """``n`` processes that keep a core busy each, at ordinary priority."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write-results", action="store_true", help="record the entry <kind>-busy of results.json")
    args = ap.parse_args(argv)
    directory = common.released_custom_voice_0_6b()
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    print(
        f"{cores} cpus, load {load:.2f}; threads: numba {os.environ['NUMBA_NUM_THREADS']}, "
        f"OpenBLAS {os.environ['OPENBLAS_NUM_THREADS']}; {args.frames} frames, best of {args.repeats}",
        flush=True,
    )
    found = {}
    for where in ("alone", f"beside {cores} busy processes"):
        busy = spinners(cores) if where != "alone" else []
        try:
            for name, changes in SETTINGS:
                found[where, name] = seconds_of(directory, args.frames, args.repeats, changes)
                print(f"  {where:28s} {name:48s} {found[where, name]:6.2f} s", flush=True)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    if args.write_results:
        write_results(found, load, args)


def write_results(found: dict, load: float, args) -> None:
    """The entry ``<kind>-busy``: each setting's time against GNU OpenMP's default in the same conditions."""
    cpu = results_file.cpu_info()
    kind = results_file.machine_kind(cpu) + "-busy"
    rows = [
        (f"{where}: {name}", seconds, found[where, BASELINE], seconds / found[where, BASELINE], "s", "", None)
        for (where, name), seconds in found.items()
    ]
    threads = {"numba": int(os.environ["NUMBA_NUM_THREADS"]), "openblas": int(os.environ["OPENBLAS_NUM_THREADS"])}
    title = f"{results_file.entry([], cpu=cpu, threads={}, load=0)['title']}: a busy machine"
    source = f"benchmarks/bench_busy.py, {args.frames} frames, best of {args.repeats}"
    entry = results_file.entry(rows, cpu=cpu, threads=threads, load=load, extra={"title": title, "source": source})
    results_file.write_entry(kind, entry)
    print(f"\nwritten: entry {kind!r} of {results_file.RESULTS.relative_to(common.REPO)}", flush=True)


if __name__ == "__main__":
    main()
