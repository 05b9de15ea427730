"""The mlx-audio port (``mlx-audio`` 0.6.2 with ``mlx`` / ``mlx-cpu`` 0.32.4 from PyPI, MLX on the CPU)
graded by the conformance suite, in one command:

    python benchmarks/ports/mlx_audio.py --suite ports-runs/suite --results ports-runs/mlx-results
    python benchmarks/ports/mlx_audio.py --suite ports-runs/s06b --results ports-runs/mlx-06b --model DIR-0.6B-CV

1. the suite: ``--suite`` is used as it is, or made there first (``refimpl conformance make``, with the
   ``--model`` checkpoints when given, else the tiny embedded ones);
2. mlx-audio's environment: ``benchmarks/ports/.envs/mlx-audio-0.6.2/`` (git-ignored), the three pinned
   wheels; nothing of it enters the project's environment;
3. no conversion: mlx-audio has no converter; ``load_model`` reads the Hugging Face folder and transposes
   the conv weights as it loads them;
4. each case mlx-audio supports, in its own process (``mlx_audio_worker.py`` in its environment) under a
   time and a memory limit: greedy (``temperature=0``), the non-streaming text feed (mlx-audio always
   prefills the whole text), the weights widened to float32 (``--dtype float32``, the default); what it
   gives goes to ``RESULTS/<case>/`` under the suite's plain names: the audio its API returns and the codes
   caught at the input of its ``speech_tokenizer.decode``. A case that crashes or hangs is recorded with its
   message and the others go on; a case mlx-audio cannot run is left out and the reason printed;
5. ``refimpl conformance grade SUITE RESULTS --precision float32 --behaviour length=natural`` (its
   ``max_tokens`` is the number of frames it generates, set from ``max_new_tokens``: one frame more than
   the official), printed, with ``RESULTS/report.json``, ``report.html`` and ``mlx-audio-run.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness

PACKAGE, VERSION, MLX = "mlx-audio", "0.6.2", "0.32.4"
REQUIREMENT = f"{PACKAGE}=={VERSION} mlx=={MLX} mlx-cpu=={MLX}"
ENV_NAME = f"{PACKAGE}-{VERSION}"
WORKER = harness.HERE / "mlx_audio_worker.py"
BEHAVIOURS = ["length=natural", "decode=official"]  # max_tokens frames; the 300/25 chunked decode

STREAMING_FEED = "the streaming text feed (non_streaming_mode=False): mlx-audio always prefills the whole text"
BATCH = "a padded batch of prompts: mlx-audio's batch_generate is not graded by this script"
SAMPLED = "sampling replayed from recorded uniforms: mlx-audio draws from MLX's own generator"
NO_BASE = "the suite has no Base checkpoint (mlx-audio's speaker encoder and codec encoder are reached through it)"
RESAMPLE = "a 16 kHz input: speech_tokenizer.encode takes 24 kHz samples, and the resampling is the caller's"
CLONE = (
    "voice clone, whose reference ran the streaming text feed (the official default for clone): mlx-audio "
    "always prefills the whole text"
)
STREAM = "an exact decoder stream: mlx-audio's streaming decode is reached only from a streaming generation"


def plan_case(case: dict, dirs: dict, include_streaming_feed: bool) -> tuple:
    """(action for mlx_audio_worker, checkpoint kind) or (None, why mlx-audio cannot run the case)."""
    stage, options = case["stage"], case["options"]
    if stage == "codec-decode":
        return (None, STREAM) if "pushes" in options else ("decode", case["checkpoint"])
    if stage == "codec-encode":
        return (None, RESAMPLE) if options.get("sample_rate") != 24000 else ("encode", case["checkpoint"])
    if stage == "speaker":
        return ("speaker", "base") if "base" in dirs else (None, NO_BASE)
    reasons = []
    if stage == "clone":
        reasons.append(CLONE)
    elif harness.text_feed(case) == "streaming" and not include_streaming_feed:
        reasons.append(STREAMING_FEED)
    return harness.generation_plan(case, "design" if stage == "design" else "say", reasons, BATCH, SAMPLED)


def job_of(case: dict, action: str, directory: Path, out: Path, reference: dict, args) -> dict:
    options, case_dir = case["options"], Path(args.suite) / "cases" / case["name"]
    job = {"case": case["name"], "action": action, "model": str(directory), "dtype": args.dtype, "out": str(out)}
    if action == "decode":
        return dict(job, codes=str(case_dir / case["inputs"]["codes"]))
    if action in ("encode", "speaker"):
        return dict(job, audio=str(case_dir / case["inputs"]["audio"]))
    job.update(text=options["text"], language=options.get("language") or "auto", instruct=options.get("instruct"))
    job["max_tokens"] = options["max_new_tokens"]  # mlx-audio's max_tokens: the frames it generates
    if action == "say":
        job["speaker"] = reference.get("speaker") or options.get("speaker")
    return job


def run_cases(python: Path, manifest: dict, dirs: dict, args) -> dict:
    suite, results = Path(args.suite), Path(args.results)
    record = {"port": f"{PACKAGE} {VERSION} (mlx {MLX}, CPU)", "machine": harness.machine(), "cases": {}}
    jobs = Path(tempfile.mkdtemp(prefix="mlx-audio-jobs-"))
    try:
        planned = harness.planned_cases(
            manifest, args, results, record, dirs, lambda c: plan_case(c, dirs, args.include_streaming_feed)
        )
        for case, out, action, kind in planned:
            name = case["name"]
            job = job_of(case, action, dirs[kind], out, harness.reference_input(suite, case), args)
            print(f"{name}: mlx-audio {action} ...", flush=True)
            run = harness.run_job(python, WORKER, jobs, name, job, args, harness.child_env(args.threads))
            entry = {"status": "ran", "action": action, "seconds": run["seconds"]}
            if harness.text_feed(case) == "streaming":
                entry["note"] = "run with mlx-audio's non-streaming feed; the reference used the streaming feed"
            if run["rc"] != 0:
                harness.failed(entry, run, out)
            else:
                entry["mlx"] = json.loads((out / ".mlx-case.json").read_text())
                if "decode_error" in entry["mlx"]:
                    entry.update(
                        status="partial", message=f"codes only, the decode failed: {entry['mlx']['decode_error']}"
                    )
            record["cases"][name] = entry
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    record["machine"]["load_average_1min_after"] = round(harness.load_average(), 2)
    return record


def ran(c: dict) -> str:
    """The summary's line of a case mlx-audio ran."""
    m = c["mlx"]
    steps = [f"load {m['load_s']} s", f"run {m['run_s']} s"]
    steps += [f"{m['frames']:g} frames"] if "frames" in m else []
    note = "".join(f"; {c[k]}" for k in ("message", "note") if c.get(k))
    return f"mlx-audio {c['action']} in {c['seconds']} s ({', '.join(steps)}){note}"


def summary(record: dict) -> list:
    """What the script did (``harness.summary``)."""
    return harness.summary(record, ran)


def main(argv=None) -> int:
    ap = harness.port_arguments(__doc__, "mlx-audio")
    ap.add_argument(
        "--dtype",
        choices=["float32", "stored"],
        default="float32",
        help="float32: the weights widened after loading (graded by the float32 rule); stored: as mlx-audio "
        "loads them (bf16 weights compute in bf16: graded by the bfloat16 rule)",
    )
    ap.add_argument(
        "--include-streaming-feed",
        action="store_true",
        help="also run say-streaming-feed with mlx-audio's non-streaming feed (it fails: the report shows where)",
    )
    args = ap.parse_args(argv)
    suite, results, manifest, dirs = harness.prepare(args)
    python = harness.ensure_venv(ENV_NAME, REQUIREMENT, "mlx_audio", VERSION, distribution=PACKAGE)
    precision = "float32"
    if args.dtype == "stored":
        from refimpl.io.checkpoint import read_safetensors_header

        stored = set()
        for d in dirs.values():
            for f in Path(d).glob("*.safetensors"):
                stored |= {h["dtype"] for h in read_safetensors_header(f)[0].values()}
        precision = "bfloat16" if "BF16" in stored else "float32"
    t0 = time.perf_counter()
    record = run_cases(python, manifest, dirs, args)
    record.update(seconds=round(time.perf_counter() - t0, 1), dtype=args.dtype)
    return harness.finish("mlx-audio", record, suite, results, precision, BEHAVIOURS, summary(record))


if __name__ == "__main__":
    sys.exit(main())
