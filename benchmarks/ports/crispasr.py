"""CrispASR's qwen3-tts (its wheel ``crispasr`` 0.8.45 from PyPI, GGML on the CPU) graded by the conformance
suite, in one command:

    python benchmarks/ports/crispasr.py --suite ports-runs/suite-06b --results ports-runs/crispasr-06b \\
        --port-source CRISPASR_CHECKOUT --model DIR-0.6B-CV [--teacher-forced]

1. the suite: ``--suite`` is used as it is, or made there first (``refimpl conformance make``, with the
   ``--model`` checkpoints when given, else the tiny embedded ones);
2. CrispASR's environment: ``benchmarks/ports/.envs/crispasr-0.8.45/`` (git-ignored), the pinned wheel; its
   converters' packages (``torch==2.13.0 gguf==0.19.0 safetensors==0.8.0 huggingface_hub==2.4.0``, wheels) are
   added to it when a checkpoint must be converted; nothing of it enters the project's environment;
3. each checkpoint the cases need, converted by the port's own converters, ``models/convert-qwen3-tts-to-gguf.py``
   and ``models/convert-qwen3-tts-tokenizer-to-gguf.py`` of a checkout of its repository (``--port-source``;
   they are not in the wheel), ``--outtype f32``, cached beside the environment;
4. each case CrispASR can run (a custom voice: ``Session.set_speaker_name``), in its own process
   (``crispasr_worker.py`` in its environment) under a time and a memory limit, with its debug switches on:
   ``CRISPASR_QWEN3_TTS_GREEDY=1`` (the Talker picks by argmax; its code predictor always samples, from its own
   generator: there is no switch for it), ``_MAX_FRAMES`` = the case's ``max_new_tokens``, ``_DUMP_DIR`` and
   ``_DUMP_LOGITS``; the watermarked audio of ``synthesize`` unless the person running the script passes
   ``--accept-marking-responsibility`` (then ``synthesize_raw``'s unmarked audio).
   Its dumps are read by ``refimpl.porting.adapters.crispasr`` into ``RESULTS/<case>/crispasr-dump.safetensors``
   (the prompt, the Talker's logits of every frame, the code predictor's, its codes). A case that crashes or
   hangs is recorded with its message and the others go on;
5. ``refimpl conformance grade SUITE RESULTS --precision float32 --behaviour length=natural
   --behaviour decode=official``, printed, with ``RESULTS/report.json``, ``report.html`` and
   ``crispasr-run.json``.

``--teacher-forced`` replays the reference's codes (``CRISPASR_QWEN3_TTS_REPLAY_CODES``, written by
``write_replay_codes``): every frame's 16 codes are the reference's, so the card grades CrispASR's arithmetic
on our history: its Talker's logits at every frame, its code predictor's first step of every frame (its later
steps are fed its own picks), the prompt, and its decoder's audio on our codes. The replayed codes are not given
to the grader (they are ours).

``--released-ids``: CrispASR takes the special tokens' ids from a table of the released tokenizer's
(``<|im_start|>`` 151644, ``<|im_end|>`` 151645), not from the checkpoint's tokenizer; full-size synthetic
checkpoints written before their tokenizer took the released ids number them 673 and 674 (the config's
``im_start_token_id``, ``im_end_token_id``). The option copies the text embedding's rows of the checkpoint's ids
to the released ids in a copy of the converted Talker GGUF (nothing else changes), so that its prompt holds our
tokens' embeddings, as it would on the released model. On a checkpoint whose ids are the released ones it copies
nothing and changes nothing; it stays for the suites made on the older checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

PACKAGE, VERSION, MODULE = "crispasr", "0.8.45", "crispasr"
ENV_NAME = f"{PACKAGE}-{VERSION}"
CONVERTER_REQUIREMENT = "torch==2.13.0 gguf==0.19.0 safetensors==0.8.0 huggingface_hub==2.4.0"
CONVERTERS = ("models/convert-qwen3-tts-to-gguf.py", "models/convert-qwen3-tts-tokenizer-to-gguf.py")
WORKER = harness.HERE / "crispasr_worker.py"
PRECISION = "float32"  # F32 GGUF files; the rule of the precision the weights are computed in
BEHAVIOURS = ["length=natural", "decode=official"]  # it returns max_new_tokens frames; one decode pass

NO_DECODE = "CrispASR's Python API decodes only the codes it generates (Session.synthesize takes text)"
NO_VOICE_OUTPUT = (
    "Session.set_voice loads a reference for a clone, but the API returns neither its codes nor its x-vector"
)
NOT_CUSTOM_VOICE = "only the custom-voice path is run here (a voice design or a clone: not yet in this script)"
BATCH = "a padded batch of prompts: a session synthesizes one text"
SAMPLED = "sampling replayed from recorded uniforms: CrispASR draws from its own xorshift generator"


def plan_case(case: dict) -> tuple:
    """(True, checkpoint kind) or (None, why CrispASR is not run on the case)."""
    stage = case["stage"]
    if stage == "codec-decode":
        return None, NO_DECODE
    if stage in ("codec-encode", "speaker"):
        return None, NO_VOICE_OUTPUT
    if stage != "say":
        return None, NOT_CUSTOM_VOICE
    return harness.generation_plan(case, True, [], BATCH, SAMPLED)


# ----------------------------------------------------------------------------- the conversion


def ensure_converter(python: Path) -> None:
    """The converters' packages in the port's environment (installed once, from wheels)."""
    done = harness.ENVS / ENV_NAME / ".converter-installed"
    if done.is_file() and done.read_text() == CONVERTER_REQUIREMENT:
        return
    print(f"adding {CONVERTER_REQUIREMENT} to {ENV_NAME} for the port's converters ...", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
    subprocess.run(pip + ["--only-binary", ":all:", *CONVERTER_REQUIREMENT.split()], check=True)
    done.write_text(CONVERTER_REQUIREMENT)


def convert(python: Path, kind: str, directory: Path, sha: str, args) -> tuple:
    """((talker GGUF, codec GGUF), the conversion's record), cached by weights hash."""
    models = harness.ENVS / ENV_NAME / "models" / f"{kind}-{sha[:16]}"
    want = (models / "talker-f32.gguf", models / "codec-f32.gguf")
    record = {"kind": kind, "checkpoint": directory.name, "files": [p.name for p in want]}
    if all(p.is_file() for p in want):
        return want, dict(record, cached=True)
    scripts = [Path(args.port_source or "") / s for s in CONVERTERS]
    if not args.port_source or not all(s.is_file() for s in scripts):
        why = "the port's converters are needed: pass --port-source, a checkout of CrispASR's repository"
        return None, dict(record, error=f"{why} (https://github.com/CrispStrobe/CrispASR), whose {CONVERTERS} it runs")
    ensure_converter(python)
    models.mkdir(parents=True, exist_ok=True)
    for script, source, target in zip(scripts, (directory, directory / "speech_tokenizer"), want, strict=True):
        partial = target.with_name(target.name + ".partial")
        argv = [str(python), "-I", str(script), "--input", str(source), "--output", str(partial), "--outtype", "f32"]
        print(f"converting {source.name} with the port's {script.name} ...", flush=True)
        run = harness.run_limited(argv, args.timeout * 3, args.convert_memory_gib * harness.GIB, harness.child_env(2))
        record.setdefault("convert_s", []).append(run["seconds"])
        if run["rc"] != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            return None, dict(record, error=f"{script.name}: {harness.last_line(run)}")
        os.replace(partial, target)
    return want, record


# its table of special-token ids (the released tokenizer's), and the rows of its text embedding they pick
RELEASED_IDS = {"im_start_token_id": 151644, "im_end_token_id": 151645}
COPY_ROWS = (  # run in the port's environment: copy rows of the GGUF's text embedding, in place
    "import sys; from gguf import GGUFReader; r = GGUFReader(sys.argv[1], 'r+'); "
    "t = next(t for t in r.tensors if t.name == 'talker.token_embd_text.weight'); "
    "pairs = [int(a) for a in sys.argv[2:]]; "
    "[t.data.__setitem__(pairs[i + 1], t.data[pairs[i]].copy()) for i in range(0, len(pairs), 2)]; "
    "r.data.flush()"
)


def with_released_ids(python: Path, files: tuple, directory: Path, args) -> tuple:
    """``--released-ids``: a copy of the Talker GGUF whose text-embedding rows at the released special ids
    (``RELEASED_IDS``) are the rows of the checkpoint's own ids, so that its hard-coded ids pick our tokens'
    embeddings (the released tokenizer has them there; our synthetic one does not). Cached beside the file."""
    config = json.loads((directory / "config.json").read_text())
    pairs = [(int(config[k]), v) for k, v in RELEASED_IDS.items() if k in config and int(config[k]) != v]
    if not pairs:
        return files, None
    patched = files[0].with_name(files[0].stem + "-released-ids.gguf")
    if not patched.is_file():
        partial = patched.with_name(patched.name + ".partial")
        shutil.copyfile(files[0], partial)
        argv = [str(python), "-I", "-c", COPY_ROWS, str(partial), *[str(x) for p in pairs for x in p]]
        run = harness.run_limited(argv, args.timeout, args.convert_memory_gib * harness.GIB, harness.child_env(2))
        if run["rc"] != 0:
            partial.unlink(missing_ok=True)
            raise SystemExit(f"--released-ids: copying the rows failed: {harness.last_line(run)}")
        os.replace(partial, patched)
    return (patched, files[1]), {f"row {released}": f"row {ours}" for ours, released in pairs}


# ----------------------------------------------------------------------------- the cases


def job_of(case: dict, files: tuple, out: Path, replay: Path | None, args) -> dict:
    options = case["options"]
    reference = harness.reference_input(Path(args.suite), case)
    job = {"case": case["name"], "model": str(files[0]), "codec": str(files[1]), "threads": args.threads}
    job.update(out=str(out), text=options["text"], language=options.get("language") or reference.get("language"))
    job.update(speaker=reference.get("speaker") or options.get("speaker"), instruct=options.get("instruct"))
    job.update(
        max_frames=options["max_new_tokens"],
        replay=str(replay) if replay else None,
        raw=args.accept_marking_responsibility,
    )
    return job


def replay_file(suite: Path, case: dict, jobs: Path) -> Path:
    """The reference's codes as CrispASR's replay file."""
    import numpy as np

    from refimpl.porting import trace_files
    from refimpl.porting.adapters.crispasr import write_replay_codes

    reference = trace_files.load_trace(suite / "cases" / case["name"] / case["references"]["float64"])
    codes = np.asarray(reference[case["outputs"]["codes"]])
    return write_replay_codes(codes.reshape(codes.shape[-2:]), jobs / f"{case['name']}.replay.txt")


def read_dump(out: Path, directory: Path, teacher_forced: bool, entry: dict) -> None:
    """The worker's dumps as ``out/crispasr-dump.safetensors`` under our names (its own names left out)."""
    from refimpl.io.checkpoint import read_config
    from refimpl.porting.adapters.crispasr import read_crispasr_dump
    from refimpl.porting.trace_files import Trace

    dump, logits = out / "crispasr-dump", out / "crispasr-logits"
    if not any(dump.glob("*.bin")) and not any(logits.glob("*.f32")):
        return
    hidden = int(read_config(directory)["talker_config"]["hidden_size"])
    trace = read_crispasr_dump(dump, hidden, logits, teacher_forced=teacher_forced)
    items = [(k, v) for k, v in trace.items if not k.startswith("crispasr.")]
    entry["dumped"] = len(items)
    entry["crispasr_files"] = len(trace.metadata["crispasr_files"])
    Trace(items, {k: v for k, v in trace.metadata.items() if k != "crispasr_files"}).save(
        out / "crispasr-dump.safetensors"
    )
    shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(logits, ignore_errors=True)


def run_cases(python: Path, manifest: dict, dirs: dict, args) -> dict:
    from refimpl.io.files import InputError

    suite, results = Path(args.suite), Path(args.results)
    port = f"{PACKAGE} {VERSION} (CrispASR qwen3-tts, CPU), F32 GGUF"
    port += ", teacher-forced" if args.teacher_forced else ""
    record = {"port": port, "machine": harness.machine(), "conversions": {}, "cases": {}}
    models = {}
    jobs = Path(tempfile.mkdtemp(prefix="crispasr-jobs-"))
    env = dict(harness.child_env(args.threads), GGML_NO_BACKTRACE="1")
    try:
        planned = harness.planned_cases(manifest, args, results, record, dirs, plan_case)
        for case, out, _, kind in planned:
            name = case["name"]
            if kind not in models:
                sha = manifest["checkpoints"][kind]["weights_sha256"]
                models[kind], record["conversions"][kind] = convert(python, kind, dirs[kind], sha, args)
            if models[kind] is None:
                record["cases"][name] = {"status": "failed", "message": "the conversion failed (see conversions)"}
                continue
            if args.released_ids and kind not in record["conversions"].get("released_ids", {}):
                models[kind], copied = with_released_ids(python, models[kind], dirs[kind], args)
                record["conversions"].setdefault("released_ids", {})[kind] = copied
            replay = replay_file(suite, case, jobs) if args.teacher_forced else None
            job = job_of(case, models[kind], out, replay, args)
            print(f"{name}: CrispASR say{' (teacher-forced)' if replay else ''} ...", flush=True)
            run = harness.run_job(python, WORKER, jobs, name, job, args, env)
            entry = {"status": "ran", "seconds": run["seconds"]}
            note = out / ".crispasr-case.json"
            if note.is_file():
                entry["crispasr"] = json.loads(note.read_text())
            if run["rc"] != 0:
                harness.failed(entry, run, out, harness.ggml_error_line(run))
            else:
                try:
                    read_dump(out, dirs[kind], args.teacher_forced, entry)
                except InputError as e:
                    entry["dump_error"] = str(e)
            record["cases"][name] = entry
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    record["machine"]["load_average_1min_after"] = round(harness.load_average(), 2)
    return record


def conversion_line(kind: str, c) -> str:
    """The summary's line of a conversion (or of the copy of --released-ids)."""
    if kind == "released_ids":
        return f"  --released-ids: text-embedding rows copied in its Talker GGUF: {c}"
    how = "cached" if c.get("cached") else " + ".join(f"{s} s" for s in c.get("convert_s", []))
    return f"  convert {kind} ({c['checkpoint']}, f32): {c.get('error') or how}"


def ran(c: dict) -> str:
    """The summary's line of a case CrispASR ran."""
    r = c.get("crispasr", {})
    steps = [f"load {r['load_s']} s"] if "load_s" in r else []
    steps += [f"synthesize {r['synthesize_s']} s ({r['frames']:g} frames)"] if "synthesize_s" in r else []
    more = f"; its dump: {c['dump_error']}" if c.get("dump_error") else ""
    return f"CrispASR in {c['seconds']} s ({', '.join(steps)}){more}"


def summary(record: dict) -> list:
    """What the script did (``harness.summary``), its conversions first."""
    return harness.summary(record, ran, [conversion_line(k, c) for k, c in record["conversions"].items()])


def main(argv=None) -> int:
    ap = harness.port_arguments(__doc__, "CrispASR")  # --timeout: a conversion gets 3 times it
    ap.add_argument("--port-source", help="a checkout of CrispASR's repository: its models/ converters convert")
    ap.add_argument("--convert-memory-gib", type=int, default=24, help="address-space limit of a converter")
    ap.add_argument("--teacher-forced", action="store_true", help="replay the reference's codes (see above)")
    ap.add_argument(
        "--accept-marking-responsibility",
        action="store_true",
        help="you, running this, accept CrispASR's marking responsibility: grade its unwatermarked audio "
        "(synthesize_raw) instead of the watermarked (synthesize)",
    )
    ap.add_argument(
        "--released-ids",
        action="store_true",
        help="copy the text embedding's rows of the checkpoint's <|im_start|>, <|im_end|> ids to the released ids "
        "CrispASR hard-codes, in a copy of its converted Talker (see docs/ports.md); nothing to do on a checkpoint "
        "that has the released ids",
    )
    args = ap.parse_args(argv)
    suite, results, manifest, dirs = harness.prepare(args)
    python = harness.ensure_venv(ENV_NAME, f"{PACKAGE}=={VERSION}", MODULE, VERSION, distribution=PACKAGE)
    t0 = time.perf_counter()
    record = run_cases(python, manifest, dirs, args)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return harness.finish("crispasr", record, suite, results, PRECISION, BEHAVIOURS, summary(record))


if __name__ == "__main__":
    sys.exit(main())
