"""A port's speed beside refimpl's, measured the same way in the same command:

    python benchmarks/ports/speed.py --port vox [--model DIR] [--runs 3] [--write-results]
    python benchmarks/ports/speed.py --port qwentts_cpp --port-source QWENTTS_CPP_CHECKOUT
    python benchmarks/ports/speed.py --port qwentts_cpp --port-source QWENTTS_CPP_CHECKOUT --quant BF16 \
        --quantize-tool QWENTTS_CPP_CHECKOUT/build/quantize
    python benchmarks/ports/speed.py --port candle_tts
    python benchmarks/ports/speed.py --port mlx_audio

Each figure is the minimum over ``--runs`` fresh processes (``speed_worker.py``: the port's in its own
environment, refimpl's in the project's), the two sides alternating, after one run of each that is not
counted (the files in the page cache, Numba's cache written); the threads fixed in both:
``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``RAYON_NUM_THREADS``
and the port's own setting (vox's ``Engine(threads)``, qwentts.cpp's ``cpu_threads``), ``--threads`` each.
mlx-audio runs as its grading script runs it, widened to float32. qwentts.cpp runs its F32 GGUF files, or
with ``--quant BF16`` its BF16 ones (made by its ``quantize`` tool, ``--quantize-tool``, as qwentts_cpp.py makes
them).

- **per frame**: in one process, after a warm-up generation of the long length, a generation of
  ``--short-frames`` frames and one of ``--long-frames``, greedy, the same text, the port's own text feed
  (refimpl run with it); each gives its whole audio, decode included; (long - short seconds) / (long - short
  frames), the frames counted in the audio (1920 samples each), the two times each the minimum over the runs;
- **per frame, generation only**: the same from the same generations' Talker and code predictor alone, the
  decode left out, where the port reports its stages: qwentts.cpp's own stage timings of each call (its
  "[Perf]" log: Talker steps, code predictor, host work), refimpl's time less its decode's; for qwentts.cpp's
  BF16 files printed also as refimpl / port against the target of ``GENERATION_TARGETS``;
- **first audio in a fresh process**: from just before the process starts to the first audio the port gives:
  its streaming API's first chunk where it has one (refimpl's ``stream_*``, first chunk after one frame),
  else the whole audio of a ``--first-frames`` generation (refimpl then the same);
- **codec decode** of ``--decode-frames`` frames of codes (fixed random codes), after a warm-up decode of their
  first 10 frames in the same process, where the port's API decodes codes; refimpl's is measured in every case.

Printed: the CPU, the load average at the start and the end, the threads, and per figure the port's seconds,
refimpl's and port / refimpl. ``--write-results`` records them as the entry ``<machine kind>-ports-speed-<name>``
of benchmarks/results.json (``results_file.py``), the name the port's, with the GGUF type where it is not F32
(``qwentts_cpp-bf16``: ``entry_name``), so that each type keeps its entry; ``python docs/tools/results.py``
renders docs/ports.md's table "Speed, side by side" from it. Run it on a quiet machine only (CONTRIBUTING.md,
"Benchmarking").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(harness.HERE.parent))  # benchmarks/: common, results_file, bench_talker

FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz
WORKER = harness.HERE / "speed_worker.py"
MEASURES = ("per frame", "per frame, generation only", "first audio in a fresh process", "codec decode")
QUANTS = ("F32", "BF16")  # qwentts.cpp's GGUF types (qwentts_cpp.PRECISIONS); the other ports have one form
# refimpl / port per frame, generation only, that a run is held to: the GGML port's BF16 (issue 50's target)
GENERATION_TARGETS = {"qwentts_cpp-bf16": 0.7}


@dataclasses.dataclass(frozen=True)
class Port:
    """What speed.py needs of a port."""

    name: str  # --port, the worker's class (speed_worker.PORTS)
    label: str  # package and version
    checkpoint: str  # custom_voice (a preset speaker) or base (a clone from the x-vector)
    feed: str  # its text feed: streaming, non-streaming, or "its own" (refimpl then the official default)
    stream: bool  # it has a streaming API
    no_decode: str | None  # why its API cannot decode codes; None: it can
    threads_setting: str | None  # its own thread setting, beside the environment's variables
    extra_token: bool = False  # its max-token value gives one frame fewer (the official's count)
    stages: str | None = None  # how its worker tells the generation alone from the decode (None: it cannot)
    quantized: bool = False  # it runs GGUF files of --quant's type
    env: dict = dataclasses.field(default_factory=dict)  # more environment for its process


def ports(quant: str = "F32") -> dict:
    """Every port of ``--port``; qwentts.cpp's label names the GGUF type ``quant`` it runs."""
    import candle_tts
    import mlx_audio
    import qwentts_cpp
    import vox

    q, m = qwentts_cpp, mlx_audio
    found = [
        Port(
            "vox", f"{vox.PACKAGE} {vox.VERSION}", "custom_voice", "streaming", True, vox.NO_DECODE, "Engine(threads)"
        ),
        Port(
            "qwentts_cpp",
            f"{q.PACKAGE} {q.VERSION} (qwentts.cpp, {quant} GGUF)",
            "custom_voice",
            "non-streaming",
            True,
            q.NO_DECODE,
            "cpu_threads",
            env={"GGML_NO_BACKTRACE": "1"},
            stages='own stage timings of each call (its "[Perf]" log: TalkerDecode + CodePredictor + HostCompose)',
            quantized=True,
        ),
        Port(
            "candle_tts",
            f"{candle_tts.PACKAGE} {candle_tts.VERSION}",
            "base",
            "its own",
            False,
            candle_tts.NO_DECODE,
            "RAYON_NUM_THREADS",
            extra_token=True,
        ),
        Port(
            "mlx_audio",
            f"{m.PACKAGE} {m.VERSION} (mlx {m.MLX}, CPU, float32)",
            "custom_voice",
            "non-streaming",
            True,
            None,
            None,
        ),
    ]
    return {p.name: p for p in found}


def entry_name(port: str, quant: str = "F32") -> str:
    """The name of a run's results entry (``<machine kind>-ports-speed-<name>``) and of its row in docs/ports.md:
    the port's, with the GGUF type where it is not the default F32 (``qwentts_cpp-bf16``)."""
    return port if quant == "F32" else f"{port}-{quant.lower()}"


# ----------------------------------------------------------------------------- the pure parts (tests/benchmarks)


def last_json(output: str) -> dict:
    """The worker's result: the last line of its output that is a JSON object."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON result in the worker's output: " + (output.strip().splitlines() or [""])[-1])


def per_frame(runs: list, key: str = "seconds") -> dict:
    """The steady state's seconds a frame from the frames measure's results, one per process: each holds
    [short, long] as {"seconds", "samples"} (and "generation_s", the generation alone: ``key``). The minimum
    of each length over the runs, then (long - short seconds) / (long - short frames). Raises ValueError when
    the lengths differ from run to run (greedy is deterministic) or when the long one has no more frames than
    the short."""
    shorts, longs = [r["runs"][0] for r in runs], [r["runs"][1] for r in runs]
    for what, given in (("short", shorts), ("long", longs)):
        if len({g["samples"] for g in given}) != 1:
            raise ValueError(f"the {what} generation's length differs between runs: {[g['samples'] for g in given]}")
    frames = (shorts[0]["samples"] / FRAME, longs[0]["samples"] / FRAME)
    if frames[1] <= frames[0]:
        raise ValueError(f"the long generation has {frames[1]:g} frames, the short {frames[0]:g}: no frames between")
    seconds = (min(s[key] for s in shorts), min(s[key] for s in longs))
    return {"seconds": (seconds[1] - seconds[0]) / (frames[1] - frames[0]), "frames": frames, "times": seconds}


def ratio(port: float | None, ours: float | None) -> float | None:
    return None if port is None or ours is None or ours <= 0 else port / ours


def against_target(name: str, figures: dict) -> str | None:
    """refimpl / port per frame, generation only, against the target of the entry ``name``
    (``GENERATION_TARGETS``): "refimpl / port 0.81, target ≤ 0.7 (not met)"; None where it has no target."""
    target = GENERATION_TARGETS.get(name)
    if target is None:
        return None
    port, ours = figures.get("per frame, generation only", (None, None))
    r = ratio(ours, port)
    met = "" if r is None else (" (met)" if r <= target else " (not met)")
    return f"refimpl / port {'-' if r is None else f'{r:.2f}'}, target ≤ {target}{met}"


def result_rows(figures: dict, notes: dict) -> list:
    """results_file rows ``(what, port's seconds, refimpl's seconds, port / refimpl, "s", note, None)``, one
    per measure, from ``figures[measure] = (port's, refimpl's)`` (None: not measured) and ``notes[measure]``."""
    rows = []
    for what in MEASURES:
        port, ours = figures.get(what, (None, None))
        rows.append((what, port, ours, ratio(port, ours), "s", notes.get(what, ""), None))
    return rows


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def format_rows(rows: list, label: str) -> list:
    lines = [f"  {'':32s} {label[:14]:>14s} {'refimpl':>14s} {'port / refimpl':>15s}"]
    for what, port, ours, r, _, note, _ in rows:
        cell = "-" if r is None else f"{r:.2f}"
        lines.append(f"  {what:32s} {seconds(port):>14s} {seconds(ours):>14s} {cell:>15s}  {note}")
    return lines


# ----------------------------------------------------------------------------- the runs


def run_worker(python, job: dict, jobs: Path, args, env: dict, isolated: bool) -> dict:
    """One fresh process of ``speed_worker.py``; its JSON result, or {"error": its last line}."""
    path = jobs / f"{job['port']}-{job['measure']}.json"
    argv = [str(python)] + (["-I"] if isolated else []) + [str(WORKER), str(path)]
    path.write_text(json.dumps(dict(job, started=time.time())))  # just before the process starts
    run = harness.run_limited(argv, args.timeout, args.memory_gib * harness.GIB, env)
    try:
        if run["rc"] != 0:
            raise ValueError(("timed out; " if run["timed_out"] else f"exit status {run['rc']}; ") + run["output"])
        return last_json(run["output"])
    except ValueError as e:
        lines = [x for x in str(e).strip().splitlines() if x.strip()]
        return {"error": lines[-1] if lines else str(e), "output": run["output"]}


def environments(port: Port, threads: int, package_cache: bool = False) -> tuple:
    """(the port's environment, refimpl's): the same thread counts in both; refimpl's Numba cache one of the
    run's own (``common.own_numba_cache``: what a user's first run leaves) unless ``package_cache``."""
    import common

    n = str(threads)
    common_env = dict(harness.child_env(threads), NUMBA_NUM_THREADS=n, RAYON_NUM_THREADS=n, **port.env)
    ours = dict(common_env, PYTHONPATH=str(harness.REPO), **common.own_numba_cache(package_cache))
    return common_env, ours


def port_model(port: Port, python: Path, directory: Path, args):
    """What the port's worker loads: vox's .tmod and qwentts.cpp's GGUF files from their own converters (the
    grading scripts' caches), the checkpoint folder as it is for candle-tts and mlx-audio."""
    from refimpl.porting.trace_files import weights_hash

    if port.name in ("candle_tts", "mlx_audio"):
        return str(directory)
    kind = "base" if port.checkpoint == "base" else "customvoice"  # the suite's kind names: the same caches
    sha = weights_hash(directory)
    if port.name == "vox":
        import vox

        model, record = vox.convert(python, kind, directory, sha, vox.checkpoint_dtype(directory), args)
    else:
        import qwentts_cpp

        model, record = qwentts_cpp.convert(python, kind, directory, sha, args)
    if model is None:
        raise SystemExit(f"{port.label}: the conversion failed: {record.get('error')}")
    return [str(p) for p in model] if isinstance(model, tuple) else str(model)


def environment_of(port: Port) -> tuple:
    """(environment name, requirement, module, version, distribution): what ``harness.ensure_venv`` makes the
    port's environment of (the distribution where its module has no ``__version__``, else None)."""
    import candle_tts
    import mlx_audio
    import qwentts_cpp
    import vox

    if port.name == "mlx_audio":
        m = mlx_audio
        return m.ENV_NAME, m.REQUIREMENT, "mlx_audio", m.VERSION, m.PACKAGE
    if port.name == "vox":
        return vox.ENV_NAME, f"{vox.PACKAGE}=={vox.VERSION}", "vox", vox.VERSION, None
    if port.name == "qwentts_cpp":
        q = qwentts_cpp
        return q.ENV_NAME, f"{q.PACKAGE}=={q.VERSION}", q.MODULE, q.VERSION, None
    c = candle_tts
    return c.ENV_NAME, f"{c.PACKAGE}=={c.VERSION}", "candle_tts", c.VERSION, None


def port_python(port: Port) -> Path:
    name, requirement, module, version, distribution = environment_of(port)
    return harness.ensure_venv(name, requirement, module, version, distribution=distribution)


def installed(port: Port) -> bool:
    """Whether the port's environment is made (its wheel installed): a look, nothing installed."""
    name, requirement = environment_of(port)[:2]
    return harness.installed(name, requirement)


# The ports bench_table.py runs beside its table where they are installed, and the GGUF type of each:
# qwentts.cpp's BF16 files, the type issue 50's per-frame target is set against.
PEERS = (("qwentts_cpp", "BF16"), ("vox", "F32"), ("candle_tts", "F32"), ("mlx_audio", "F32"))


def peer_runs(runs: int, write: bool, port_source: str | None = None, quantize_tool: str | None = None) -> list:
    """[(port name, speed.py's arguments or None where its wheel is not installed)] for ``PEERS``: what
    bench_table.py runs after its own rows, each port the way its own command measures it."""
    found = []
    for name, quant in PEERS:
        port = ports(quant)[name]
        if not installed(port):
            found.append((name, None))
            continue
        argv = ["--port", name, "--runs", str(runs)]
        if port.quantized:
            argv += ["--quant", quant]
            argv += ["--port-source", port_source] if port_source else []
            argv += ["--quantize-tool", quantize_tool] if quantize_tool and quant != "F32" else []
        found.append((name, argv + (["--write-results"] if write else [])))
    return found


def speaker_of(directory: Path, wanted: str) -> str:
    """``wanted`` where the checkpoint has that speaker, else its first by name (the tiny checkpoints')."""
    config = json.loads((directory / "config.json").read_text())
    speakers = sorted((config.get("talker_config") or {}).get("spk_id") or {})
    return wanted if wanted in speakers or not speakers else speakers[0]


def reference_audio(seconds_: float = 3.0) -> list:
    """A clone's reference: a fixed 24 kHz signal (a tone and noise; random weights take any voice)."""
    import numpy as np

    rng = np.random.default_rng(0)
    t = np.arange(int(seconds_ * 24000)) / 24000
    samples = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)
    return [float(v) for v in samples.astype(np.float32)]


def decode_codes(directory: Path, frames: int, path: Path) -> Path:
    """``frames`` frames of fixed random codes in the speech tokenizer's codebooks, as a [T, 16] .npy."""
    import numpy as np

    config = json.loads((directory / "speech_tokenizer" / "config.json").read_text())
    size = int(config.get("decoder_config", config).get("codebook_size", 2048))
    np.save(path, np.random.default_rng(0).integers(0, size, (frames, 16), dtype=np.int64))
    return path


def measure(port: Port, args) -> dict:
    import common
    from bench_talker import LANGUAGE, SPEAKER, TEXT

    directory = Path(args.model) if args.model else None
    if directory is None:
        directory = common.released_base_0_6b() if port.checkpoint == "base" else common.released_custom_voice_0_6b()
    python = port_python(port)
    model = port_model(port, python, directory, args)
    env_port, env_ours = environments(port, args.threads, args.package_cache)
    base = {"threads": args.threads, "text": TEXT, "language": LANGUAGE.lower()}
    if port.checkpoint == "base":
        base.update(mode="clone", ref_audio=reference_audio())
    else:
        base.update(mode="say", speaker=speaker_of(directory, SPEAKER))
    ours_feed = "streaming" if port.feed == "its own" else port.feed  # the official clone default: streaming
    jobs_of = {
        "port": dict(base, port=port.name, model=model),
        "ours": dict(base, port="refimpl", model=str(directory), feed=ours_feed),
    }
    if port.name == "qwentts_cpp":
        import qwentts_cpp

        jobs_of["port"]["sampling"] = qwentts_cpp.generation_settings(directory)
    sides = {"port": (python, env_port, True, port.extra_token), "ours": (sys.executable, env_ours, False, True)}
    jobs = Path(tempfile.mkdtemp(prefix="speed-jobs-"))
    found = {"port": {}, "ours": {}}
    try:

        def run(side: str, what: str, **job) -> dict:
            py, env, isolated, extra = sides[side]
            plus = 1 if extra else 0
            if "lengths" in job:
                job["lengths"] = [n + plus for n in job["lengths"]]
            if "first" in job:
                job["first"] += plus
            result = run_worker(py, dict(jobs_of[side], measure=what, **job), jobs, args, env, isolated)
            if "error" in result:
                print(f"  {side} {what}: FAILED: {result['error']}", flush=True)
            return result

        def alternate(key: str, what: str, which: list, **job) -> None:  # the sides in turn, --runs times
            for _ in range(args.runs):
                for side in which:
                    found[side].setdefault(key, []).append(run(side, what, **dict(job)))

        # a stream runs to the short length (its first chunk is the port's choice), else the short audio
        first = {"stream": port.stream, "first": args.short_frames if port.stream else args.first_frames}
        for side in sides:  # not counted: the files read, the caches written
            run(side, "first-audio", **first)
        alternate("first", "first-audio", list(sides), **first)
        alternate("frames", "frames", list(sides), lengths=[args.long_frames, args.short_frames, args.long_frames])
        codes = decode_codes(directory, args.decode_frames, jobs / "codes.npy")
        alternate("decode", "decode", [s for s in sides if s == "ours" or not port.no_decode], codes=str(codes))
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    return {"found": found, "directory": directory}


def figures_of(port: Port, found: dict, args) -> tuple:
    """(figures, notes, errors): ``result_rows``'s figures and notes from the workers' results, a side that
    failed None, and what failed."""
    figures, notes, errors = {}, {}, []

    def ok(results):
        bad = [r["error"] for r in results if "error" in r]
        errors.extend(bad)
        return results and not bad

    pair = []
    for side in ("port", "ours"):
        f = found[side].get("frames", [])
        try:
            pair.append(per_frame(f) if ok(f) else None)
        except ValueError as e:
            errors.append(str(e))
            pair.append(None)
    figures["per frame"] = tuple(p and p["seconds"] for p in pair)
    spans = [f"{p['frames'][0]:g} to {p['frames'][1]:g}" for p in pair if p]
    notes["per frame"] = f"greedy, frames {' / '.join(spans) or '-'} (port / refimpl), their decode included; " + (
        f"the {port.feed} text feed" if port.feed != "its own" else "its text feed; refimpl's the streaming one"
    )
    pair = []
    for side in ("port", "ours"):
        f = found[side].get("frames", [])
        told = bool(f) and all("error" not in r and all("generation_s" in g for g in r["runs"]) for r in f)
        try:
            pair.append(per_frame(f, "generation_s") if told else None)
        except ValueError:  # the lengths: reported with the per frame figure
            pair.append(None)
    what = "per frame, generation only"
    figures[what] = tuple(p and p["seconds"] for p in pair)
    if not port.stages:
        how = "the port does not report its stages"
    else:
        how = f"the port's {port.stages}" + ("" if pair[0] else " (not found in its runs)")
    target = against_target(entry_name(port.name, args.quant), figures)
    notes[what] = f"the same generations without their decode: {how}; refimpl's time less its decode's" + (
        f"; {target}" if target else ""
    )
    pair = []
    for side in ("port", "ours"):
        f = found[side].get("first", [])
        pair.append(min(r["first_audio_s"] for r in f) if ok(f) else None)
    figures["first audio in a fresh process"] = tuple(pair)
    notes["first audio in a fresh process"] = (
        "its stream's first chunk; refimpl's stream_* (first chunk after one frame)"
        if port.stream
        else f"it does not stream: the whole audio of {args.first_frames} frame(s), refimpl's too"
    )
    pair = []
    for side in ("port", "ours"):
        f = found[side].get("decode", [])
        pair.append(min(r["seconds"] for r in f) if ok(f) else None)
    figures["codec decode"] = tuple(pair)
    notes["codec decode"] = f"{args.decode_frames} frames of fixed random codes" + (
        f"; the port: {port.no_decode}" if port.no_decode else ""
    )
    return figures, notes, errors


def write_results(port: Port, rows: list, load_start: float, load_end: float, args, directory: Path, path=None) -> str:
    """Record ``rows`` as the entry ``<machine kind>-ports-speed-<name>`` of the results file (``path``, by
    default benchmarks/results.json), the name ``entry_name``'s; returns the entry's key."""
    import results_file

    cpu = results_file.cpu_info()
    name = entry_name(port.name, args.quant)
    kind = f"{results_file.machine_kind(cpu)}-ports-speed-{name}"
    threads = {"numba": args.threads, "openblas": args.threads, "omp": args.threads}
    if port.threads_setting:
        threads[port.name] = args.threads
    title = f"{results_file.entry([], cpu=cpu, threads={}, load=0)['title']}: {port.label} beside refimpl"
    quant = f" --quant {args.quant}" if args.quant != "F32" else ""
    extra = {
        "title": title,
        "source": f"benchmarks/ports/speed.py --port {port.name}{quant}, {args.runs} runs",
        "port": port.name,
        "port_label": port.label,
        **({"gguf": args.quant} if port.quantized else {}),
        "checkpoint": directory.name,
        "load_end": round(load_end, 2),
    }
    entry = results_file.entry(rows, cpu=cpu, threads=threads, load=load_start, extra=extra)
    results_file.write_entry(kind, entry, path or results_file.RESULTS)
    return kind


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", required=True, choices=("vox", "qwentts_cpp", "candle_tts", "mlx_audio"))
    ap.add_argument("--model", help="checkpoint directory (default: the full-size 0.6B CustomVoice, or Base)")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes of each measure and side (minimum kept)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--short-frames", type=int, default=10, help="at least 1")
    ap.add_argument("--long-frames", type=int, default=35, help="more than --short-frames")
    ap.add_argument("--first-frames", type=int, default=1, help="a port that does not stream: the short audio")
    ap.add_argument("--decode-frames", type=int, default=125, help="at least 1")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per process")
    ap.add_argument("--memory-gib", type=int, default=16, help="address-space limit of each process")
    ap.add_argument("--write-results", action="store_true", help="record the entry of benchmarks/results.json")
    ap.add_argument("--package-cache", action="store_true", help="refimpl's kernels from the package's Numba cache")
    # qwentts.cpp's GGUF files (qwentts_cpp.py's options; its files are cached by weights hash and type)
    ap.add_argument("--port-source", help="qwentts.cpp: a checkout of its repository (its convert.py)")
    ap.add_argument("--quant", choices=QUANTS, default="F32", help="qwentts.cpp: the GGUF type run (default F32)")
    ap.add_argument("--quantize-tool", help="qwentts.cpp: its quantize binary (built from --port-source), for BF16")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked: the lengths that give a per-frame figure, ``--quant`` for a port with GGUF types."""
    ap = parser()
    args = ap.parse_args(argv)
    if args.runs < 1 or args.short_frames < 1 or args.first_frames < 1 or args.decode_frames < 1:
        ap.error("--runs, --short-frames, --first-frames and --decode-frames must be at least 1")
    if args.long_frames <= args.short_frames:
        ap.error(f"--long-frames ({args.long_frames}) must be more than --short-frames ({args.short_frames})")
    if args.quant != "F32" and not ports()[args.port].quantized:
        ap.error(f"--quant {args.quant}: {args.port} runs one form of its model (only qwentts_cpp takes --quant)")
    args.no_config_view, args.convert_memory_gib = False, 24  # qwentts_cpp.convert's other options
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import results_file

    port = ports(args.quant)[args.port]
    cpu = results_file.cpu_info()
    load_start = harness.load_average()
    own = f"the port's {port.threads_setting}" if port.threads_setting else "the port has no setting of its own"
    print(
        f"{port.label} beside refimpl: {cpu['model']}, {os.cpu_count()} cpus; load {load_start:.2f} at the start; "
        f"threads {args.threads} each (NUMBA_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, {own}); "
        f"{args.runs} runs",
        flush=True,
    )
    measured = measure(port, args)
    figures, notes, errors = figures_of(port, measured["found"], args)
    load_end = harness.load_average()
    rows = result_rows(figures, notes)
    print(f"\n{port.label} on {measured['directory'].name} (minimum over {args.runs} runs):")
    print("\n".join(format_rows(rows, port.name)))
    target = against_target(entry_name(port.name, args.quant), figures)
    if target:
        print(f"  per frame, generation only: {target}")
    print(f"load {load_start:.2f} at the start, {load_end:.2f} at the end")
    for e in errors:
        print(f"  error: {e}")
    if args.write_results and errors:
        print("not written to benchmarks/results.json: a measure failed")
    elif args.write_results:
        kind = write_results(port, rows, load_start, load_end, args, measured["directory"])
        print(f"written: entry {kind!r} of benchmarks/results.json")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
