"""The vox port (``vox-tts`` 0.19.5 from PyPI, a C++ engine) graded by the conformance suite, in one command:

    python benchmarks/ports/vox.py --suite ports-runs/suite --results ports-runs/vox-results
    python benchmarks/ports/vox.py --suite ports-runs/s06b --results ports-runs/vox-06b --model DIR-0.6B-CV

1. the suite: ``--suite`` is used as it is, or made there first (``refimpl conformance make``, with the
   ``--model`` checkpoints when given, else the tiny embedded ones);
2. vox's environment: ``benchmarks/ports/.envs/vox-tts-0.19.5/`` (git-ignored), ``pip install vox-tts==0.19.5``
   from a wheel; nothing of vox enters the project's environment;
3. each checkpoint the cases need, converted by vox's own converter (``python -m vox build``) into a ``.tmod``
   cached beside the environment; weights stored in bfloat16 are converted as bf16 (exact), others as f32;
4. each case vox supports, in its own process (``vox_worker.py`` in vox's environment) under a time and a
   memory limit: greedy (``temperature=0, sub_temperature=0``), the streaming text feed (the only one vox
   implements), the official 300/25 decode (``decoder_mode="reference"``), 2 threads; what it gives goes
   to ``RESULTS/<case>/`` under the suite's plain names. A case that crashes or hangs is recorded with its
   message and the others go on; a case vox cannot run is left out (the card says "not run") and the
   reason printed;
5. ``refimpl conformance grade SUITE RESULTS --precision float32 --behaviour length=natural`` (vox computes
   in float32 with bf16 or f32 weights; it takes ``max_frames``, the frames it returns, and its converter
   sets it from ``max_new_tokens``, so it gives max_new_tokens frames, one more than the official), printed,
   with ``RESULTS/report.json``, ``report.html`` and ``vox-run.json`` (what ran, how long, the load).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness

PACKAGE, VERSION = "vox-tts", "0.19.5"
ENV_NAME = f"{PACKAGE}-{VERSION}"
WORKER = harness.HERE / "vox_worker.py"
PRECISION = "float32"  # vox widens bf16 / f32 weights to float32 and computes in float32 on the CPU
BEHAVIOURS = ["length=natural", "decode=official"]

NO_DECODE = (
    "vox decodes only the codes it generates: its Python API takes text, not codes, and the wheel has no "
    "command line (the source distribution's `vox verify` decodes a dump's codes)"
)
NON_STREAMING = "the non-streaming text feed (non_streaming_mode=True): vox implements only the streaming feed"
BATCH = "a batch of prompts: a vox session synthesizes one text (synthesize_many runs texts apart, unpadded)"
SAMPLED = "sampling replayed from recorded uniforms: vox draws from its own Philox generator"
NEEDS_BASE = "vox encodes audio only when it clones a voice, which needs a Base checkpoint, and the suite has none"


def plan_case(case: dict, dirs: dict, include_non_streaming: bool, same_tokenizer: bool) -> tuple:
    """(action for vox_worker, checkpoint kind) or (None, why vox cannot run the case)."""
    stage = case["stage"]
    if stage == "codec-decode":
        return None, NO_DECODE
    if stage in ("codec-encode", "speaker"):
        return harness.on_base_plan(stage, dirs, same_tokenizer, NEEDS_BASE)
    reasons = []
    if harness.text_feed(case) == "non-streaming" and not include_non_streaming:
        reasons.append(NON_STREAMING)
    return harness.generation_plan(case, "clone" if stage == "clone" else "say", reasons, BATCH, SAMPLED)


def checkpoint_dtype(directory: Path) -> str:
    """bf16 when every floating tensor of the checkpoint is stored in bfloat16 (the conversion is exact), else f32."""
    from refimpl.io.checkpoint import read_safetensors_header

    dtypes = set()
    for f in sorted(directory.glob("*.safetensors")):
        header, _, _ = read_safetensors_header(f)
        dtypes |= {h["dtype"] for h in header.values() if h["dtype"].startswith(("F", "BF"))}
    return "bf16" if dtypes == {"BF16"} else "f32"


def convert(python: Path, kind: str, directory: Path, sha: str, dtype: str, args) -> tuple:
    """(the .tmod, the conversion's record): ``python -m vox build``, cached by weights hash and dtype."""
    models = harness.ENVS / ENV_NAME / "models"
    models.mkdir(parents=True, exist_ok=True)
    tmod = models / f"{kind}-{sha[:16]}-{dtype}.tmod"
    record = {"kind": kind, "checkpoint": directory.name, "dtype": dtype, "tmod": tmod.name}
    if tmod.is_file():
        return tmod, dict(record, cached=True)
    partial = tmod.with_name(tmod.name + ".partial")
    argv = [str(python), "-I", "-m", "vox", "build", "--model", str(directory), "--dtype", dtype, "-o", str(partial)]
    print(f"converting {directory.name} ({kind}) with vox's converter, --dtype {dtype} ...", flush=True)
    run = harness.run_limited(argv, args.timeout * 3, args.memory_gib * harness.GIB, harness.child_env(args.threads))
    record.update(command="python -m vox build --model DIR --dtype " + dtype, seconds=run["seconds"])
    if run["rc"] != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        return None, dict(record, error=run["output"].strip() or f"exit status {run['rc']}", timed_out=run["timed_out"])
    os.replace(partial, tmod)
    return tmod, record


def job_of(case: dict, action: str, tmod: Path, out: Path, reference: dict, args) -> dict:
    options, case_dir = case["options"], Path(args.suite) / "cases" / case["name"]
    job = {"case": case["name"], "action": action, "model": str(tmod), "threads": args.threads, "out": str(out)}
    if action in ("encode", "speaker"):
        return dict(job, ref_audio=str(case_dir / case["inputs"]["audio"]))
    job.update(text=options["text"], language=options.get("language") or "auto")
    job["max_frames"] = options["max_new_tokens"]  # vox's converter maps max_new_tokens to max_frames
    if action == "say":
        job.update(speaker=reference.get("speaker") or options.get("speaker"), instruct=options.get("instruct"))
    else:
        job.update(ref_audio=str(case_dir / case["inputs"]["ref_audio"]), ref_text=options.get("ref_text"))
        job["x_vector_only"] = bool(options.get("x_vector_only_mode"))
    return job


def run_cases(python: Path, manifest: dict, dirs: dict, args) -> dict:
    suite, results = Path(args.suite), Path(args.results)
    same = harness.same_codec_tokenizer(manifest, dirs)
    record = {"port": f"{PACKAGE} {VERSION}", "machine": harness.machine(), "conversions": {}, "cases": {}}
    tmods = {}
    jobs = Path(tempfile.mkdtemp(prefix="vox-jobs-"))
    try:
        planned = harness.planned_cases(
            manifest, args, results, record, dirs, lambda c: plan_case(c, dirs, args.include_non_streaming, same)
        )
        for case, out, action, kind in planned:
            name = case["name"]
            if kind not in tmods:
                sha = manifest["checkpoints"][kind]["weights_sha256"]
                dtype = args.dtype if args.dtype != "auto" else checkpoint_dtype(dirs[kind])
                tmods[kind], record["conversions"][kind] = convert(python, kind, dirs[kind], sha, dtype, args)
            if tmods[kind] is None:
                record["cases"][name] = {"status": "failed", "message": "the conversion failed (see conversions)"}
                continue
            job = job_of(case, action, tmods[kind], out, harness.reference_input(suite, case), args)
            print(f"{name}: vox {action} ...", flush=True)
            run = harness.run_job(python, WORKER, jobs, name, job, args, harness.child_env(args.threads))
            entry = {"status": "ran", "action": action, "seconds": run["seconds"]}
            if harness.text_feed(case) == "non-streaming":
                entry["note"] = "run with vox's streaming feed; the reference used the non-streaming feed"
            if run["rc"] != 0:
                harness.failed(entry, run, out)
            else:
                entry["vox"] = json.loads((out / ".vox-case.json").read_text())
            record["cases"][name] = entry
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    record["machine"]["load_average_1min_after"] = round(harness.load_average(), 2)
    return record


def conversion_line(kind: str, c: dict) -> str:
    """The summary's line of a conversion."""
    how = "cached" if c.get("cached") else f"{c.get('seconds')} s"
    return f"  convert {kind} ({c['checkpoint']}, --dtype {c['dtype']}): {c.get('error') or how}"


def ran(c: dict) -> str:
    """The summary's line of a case vox ran."""
    v = c["vox"]
    steps = [f"load {v['load_s']} s"]
    steps += [f"voice {v['voice_s']} s"] if c["action"] != "say" else []
    steps += [f"synthesize {v['synthesize_s']} s ({v['frames']:g} frames)"] if "synthesize_s" in v else []
    note = f"; {c['note']}" if c.get("note") else ""
    return f"vox {c['action']} in {c['seconds']} s ({', '.join(steps)}){note}"


def summary(record: dict) -> list:
    """What the script did (``harness.summary``), its conversions first."""
    return harness.summary(record, ran, [conversion_line(k, c) for k, c in record["conversions"].items()])


def main(argv=None) -> int:
    ap = harness.port_arguments(__doc__, "vox")  # --timeout: a conversion gets 3 times it
    ap.add_argument("--dtype", choices=["auto", "f32", "bf16"], default="auto", help="vox build --dtype (auto: exact)")
    ap.add_argument(
        "--include-non-streaming",
        action="store_true",
        help="also run the non-streaming-feed cases with vox's streaming feed (they fail: the report shows where)",
    )
    args = ap.parse_args(argv)
    suite, results, manifest, dirs = harness.prepare(args)
    python = harness.ensure_venv(ENV_NAME, f"{PACKAGE}=={VERSION}", "vox", VERSION)
    t0 = time.perf_counter()
    record = run_cases(python, manifest, dirs, args)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return harness.finish("vox", record, suite, results, PRECISION, BEHAVIOURS, summary(record))


if __name__ == "__main__":
    sys.exit(main())
