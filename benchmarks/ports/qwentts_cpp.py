"""The qwentts.cpp port (its CPU wheel ``realtimetts-qwen-native-cpu`` 0.4.2 from PyPI, GGML on the CPU) graded by
the conformance suite, in one command:

    python benchmarks/ports/qwentts_cpp.py --suite ports-runs/suite --results ports-runs/qwentts-results \\
        --port-source QWENTTS_CPP_CHECKOUT
    python benchmarks/ports/qwentts_cpp.py --suite ports-runs/suite-06b --results ports-runs/qwentts-06b \\
        --port-source QWENTTS_CPP_CHECKOUT --model DIR-0.6B-CV

1. the suite: ``--suite`` is used as it is, or made there first (``refimpl conformance make``, with the
   ``--model`` checkpoints when given, else the tiny embedded ones);
2. qwentts.cpp's environment: ``benchmarks/ports/.envs/realtimetts-qwen-native-cpu-0.4.2/`` (git-ignored), the
   pinned wheel; its converter's packages (``torch==2.13.0 gguf==0.19.0 safetensors==0.8.0``, wheels) are
   added to it when a checkpoint must be converted; nothing of it enters the project's environment;
3. each checkpoint the cases need, converted by the port's own converter, ``convert.py`` of a checkout of
   its repository (``--port-source``; it is not in the wheel), run in that environment on the checkpoint (an
   older one through a view, below), to F32 GGUF files cached beside the environment; ``--quant BF16`` then runs the
   port's own ``quantize`` tool (``--quantize-tool``, built from the same checkout; not in the wheel either);
4. each case qwentts.cpp supports, in its own process (``qwentts_cpp_worker.py`` in its environment) under a
   time and a memory limit: greedy (``do_sample=False, subtalker_do_sample=False``) with the checkpoint's
   ``repetition_penalty`` and sampling values passed through, its text feed (the whole text prefilled,
   except in a clone in context), 2 threads, its ``dump_dir`` set: the audio its API returns, and its debug
   dumps read by ``refimpl.porting.adapters.qwentts_cpp`` into ``RESULTS/<case>/qwentts-dump.safetensors``
   (the codes, the Talker's prompt, layers, final norm and first logits). A case that crashes or hangs is
   recorded with its message and the others go on; when it crashes after dumping its codes, the codes are
   graded (the case is "partial");
5. ``refimpl conformance grade SUITE RESULTS --precision float32 --behaviour length=natural`` (bfloat16 for
   ``--quant BF16``; it generates ``max_new_tokens`` frames, one more than the official), printed, with
   ``RESULTS/report.json``, ``report.html`` and ``qwentts-cpp-run.json``.

The view: ``convert.py`` reads three config keys that the released configs have and the official code does not
read: ``talker_config.position_id_per_seconds`` (13), ``decoder_config.num_semantic_quantizers`` (1) and
``decoder_config.vector_quantization_hidden_dimension`` (the decoder's ``codebook_dim``, 512). Our synthetic
checkpoints carry them (``refimpl.porting.presets``); one written before they did (a ``bench-checkpoints/``
folder is written once, a suite keeps its copies) is converted through a view that links every file and adds
the keys it lacks, with the values refimpl writes now, to copies of its two ``config.json``, nothing else.
``--no-config-view`` gives the converter an older checkpoint as it is (it stops at the first key).
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

PACKAGE, VERSION, MODULE = "realtimetts-qwen-native-cpu", "0.4.2", "qwentts_cpp_cpu"
ENV_NAME = f"{PACKAGE}-{VERSION}"
CONVERTER_REQUIREMENT = "torch==2.13.0 gguf==0.19.0 safetensors==0.8.0"
WORKER = harness.HERE / "qwentts_cpp_worker.py"
PRECISIONS = {"F32": "float32", "BF16": "bfloat16"}  # the rule each GGUF type computes under (README)
BEHAVIOURS = ["length=natural", "decode=official"]  # max_new_tokens frames; one pass up to its 24 s chunks
# convert.py reads checkpoints/ and writes models/ in the folder it runs in: run it as a script from there
IN_FOLDER = (
    "import os, runpy, sys; os.chdir(sys.argv[1]); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
MODEL_TYPES = {"custom_voice": "CustomVoice", "base": "Base", "voice_design": "VoiceDesign"}

NO_DECODE = (
    "qwentts.cpp's C ABI decodes only the codes it generates (qt_synthesize takes text); the repository's "
    "qwen-codec tool is not in the wheel"
)
RESAMPLE = "a 16 kHz input: qt_extract_voice_ref takes 24 kHz samples, and the resampling is the caller's"
NEEDS_BASE = (
    "qt_extract_voice_ref, its one way to the codec encoder and the speaker encoder, runs on a Base model only "
    "('voice references are only valid for base models'), and the suite has no Base checkpoint"
)
STREAMING_FEED = (
    "the streaming text feed (non_streaming_mode=False): qwentts.cpp prefills the whole text of a custom voice, "
    "a voice design and an x-vector clone"
)
BATCH = "a padded batch of prompts: qt_synthesize runs one request (its batching is for separate requests)"
SAMPLED = "sampling replayed from recorded uniforms: qwentts.cpp draws from its own Philox generator"


def plan_case(case: dict, dirs: dict, include_streaming_feed: bool, same_tokenizer: bool) -> tuple:
    """(action for qwentts_cpp_worker, checkpoint kind) or (None, why qwentts.cpp cannot run the case)."""
    stage, options = case["stage"], case["options"]
    if stage == "codec-decode":
        return None, NO_DECODE
    if stage in ("codec-encode", "speaker"):
        if options.get("sample_rate", 24000) != 24000:
            return None, RESAMPLE
        return harness.on_base_plan(stage, dirs, same_tokenizer, NEEDS_BASE)
    reasons = []
    in_context = stage == "clone" and not options.get("x_vector_only_mode")
    if harness.text_feed(case) == "streaming" and not in_context and not include_streaming_feed:
        reasons.append(STREAMING_FEED)
    return harness.generation_plan(case, "clone" if stage == "clone" else "say", reasons, BATCH, SAMPLED)


# ----------------------------------------------------------------------------- the conversion


def ensure_converter(python: Path) -> None:
    """The converter's packages in the port's environment (installed once, from wheels)."""
    done = harness.ENVS / ENV_NAME / ".converter-installed"
    if done.is_file() and done.read_text() == CONVERTER_REQUIREMENT:
        return
    print(f"adding {CONVERTER_REQUIREMENT} to {ENV_NAME} for the port's converter ...", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
    subprocess.run(pip + ["--only-binary", ":all:", *CONVERTER_REQUIREMENT.split()], check=True)
    done.write_text(CONVERTER_REQUIREMENT)


def keys_written_since(section: str, block: dict) -> dict:
    """The keys of ``section`` (talker_config, decoder_config) that convert.py reads and a checkpoint written
    before our presets carried them lacks, with the values refimpl writes now."""
    from refimpl.porting import presets

    if section == "talker_config":
        wanted = {"position_id_per_seconds": presets.RELEASED_POSITION_ID_PER_SECONDS}
    else:  # the decoder's split RVQ as it is decoded: one semantic layer, projections at codebook_dim
        semantic = presets.RELEASED_SPEECH_TOKENIZER["decoder_config"]["num_semantic_quantizers"]
        wanted = {"num_semantic_quantizers": semantic, "vector_quantization_hidden_dimension": block["codebook_dim"]}
    return {key: value for key, value in wanted.items() if key not in block}


def checkpoint_for_converter(directory: Path, target: Path, section: str, as_is: bool) -> dict:
    """``target``: ``directory`` linked, or, when it was written before our presets carried the keys convert.py
    reads (and not ``as_is``), a view of it: every file linked, its config.json with those keys of ``section``
    added. Returns the keys added."""
    config = json.loads((directory / "config.json").read_text())
    added = {} if as_is else keys_written_since(section, config[section])
    if not added:
        os.symlink(directory.resolve(), target)
        return {}
    target.mkdir(parents=True)
    for src in sorted(directory.iterdir()):
        if src.name != "config.json" and src.name != "speech_tokenizer":
            os.symlink(src.resolve(), target / src.name)
    config[section].update(added)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {f"{section}.{key}": value for key, value in added.items()}


def checkpoint_names(directory: Path) -> tuple:
    """(talker folder name, GGUF stem) in the form convert.py derives its output names from."""
    config = json.loads((directory / "config.json").read_text())
    size = str(config.get("tts_model_size", "0b6")).replace("b", ".").upper() + "B"  # 0b6 -> 0.6B
    kind = MODEL_TYPES.get(config.get("tts_model_type"), "Base")
    return f"Qwen3-TTS-12Hz-{size}-{kind}", f"qwen-talker-{size.lower()}-{kind.lower()}"


def convert(python: Path, kind: str, directory: Path, sha: str, args) -> tuple:
    """((talker GGUF, codec GGUF), the conversion's record): the port's convert.py (and its quantize tool for
    BF16), cached beside the environment by weights hash and type."""
    models = harness.ENVS / ENV_NAME / "models" / f"{kind}-{sha[:16]}"
    talker_dir, stem = checkpoint_names(directory)
    f32 = (models / f"{stem}-F32.gguf", models / "qwen-tokenizer-12hz-F32.gguf")
    want = tuple(p.with_name(p.name.replace("-F32.", f"-{args.quant}.")) for p in f32)
    record = {"kind": kind, "checkpoint": directory.name, "quant": args.quant, "files": [p.name for p in want]}
    if all(p.is_file() for p in want):
        return want, dict(record, cached=True)
    if not all(p.is_file() for p in f32):
        t0 = time.perf_counter()
        error = run_converter(python, directory, talker_dir, models, args)
        record["convert_s"] = round(time.perf_counter() - t0, 2)
        if error:
            return None, dict(record, error=error)
        record["view"] = json.loads((models / "view.json").read_text())
    if args.quant != "F32":
        if not args.quantize_tool:
            why = f"--quant {args.quant} needs the port's quantize tool (tools/quantize.cpp), which the wheel lacks"
            return None, dict(record, error=why + ": build it from the checkout and pass --quantize-tool")
        for src, dst in zip(f32, want, strict=True):
            partial = dst.with_name(dst.name + ".partial")
            argv = [str(args.quantize_tool), str(src), str(partial), args.quant]
            run = harness.run_limited(argv, args.timeout * 3, args.memory_gib * harness.GIB, harness.child_env(2))
            record.setdefault("quantize_s", []).append(run["seconds"])
            if run["rc"] != 0 or not partial.is_file():
                partial.unlink(missing_ok=True)
                return None, dict(record, error=f"quantize: {harness.last_line(run)}")
            os.replace(partial, dst)
    return want, record


def run_converter(python: Path, directory: Path, talker_dir: str, models: Path, args) -> str | None:
    """Run ``PORT_SOURCE/convert.py`` where it looks for its inputs (``checkpoints/<name>/``, the talker and
    ``Qwen3-TTS-Tokenizer-12Hz``) and writes its outputs (``models/``); the F32 files land in ``models``.
    Returns the error, or None."""
    convert_py = Path(args.port_source or "") / "convert.py"
    if not args.port_source or not convert_py.is_file():
        return (
            "the port's converter is needed: pass --port-source, a checkout of qwentts.cpp's repository "
            "(git clone https://github.com/ServeurpersoCom/qwentts.cpp), whose convert.py it runs"
            + (f"; {convert_py} is not a file" if args.port_source else "")
        )
    ensure_converter(python)
    work = Path(tempfile.mkdtemp(prefix="qwentts-convert-", dir=harness.ENVS / ENV_NAME))
    try:
        checkpoints = work / "checkpoints"
        checkpoints.mkdir()
        as_is = args.no_config_view
        added = checkpoint_for_converter(directory, checkpoints / talker_dir, "talker_config", as_is)
        tokenizer, target = directory / "speech_tokenizer", checkpoints / "Qwen3-TTS-Tokenizer-12Hz"
        added.update(checkpoint_for_converter(tokenizer, target, "decoder_config", as_is))
        argv = [str(python), "-I", "-c", IN_FOLDER, str(work), str(convert_py.resolve())]
        older = f" (written before our presets carried them, config keys added: {added})" if added else ""
        print(f"converting {directory.name}{older} with the port's convert.py ...", flush=True)
        env = harness.child_env(args.threads)
        run = harness.run_limited(argv, args.timeout * 3, args.convert_memory_gib * harness.GIB, env)
        made = [work / "models" / p for p in ("qwen-tokenizer-12hz-F32.gguf",)]
        made += sorted((work / "models").glob("qwen-talker-*-F32.gguf"))
        if run["rc"] != 0 or len(made) != 2 or not all(p.is_file() for p in made):
            return f"convert.py: {harness.last_line(run)}"
        models.mkdir(parents=True, exist_ok=True)
        (models / "view.json").write_text(json.dumps({"config_keys_added": added}) + "\n")
        for p in made:
            os.replace(p, models / p.name)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- the cases


def generation_settings(directory: Path) -> dict:
    """Greedy, with the checkpoint's repetition penalty and sampling values (the official settings)."""
    path = directory / "generation_config.json"
    g = json.loads(path.read_text()) if path.is_file() else {}
    return {
        "do_sample": False,
        "subtalker_do_sample": False,
        "repetition_penalty": float(g.get("repetition_penalty", 1.05)),
        "temperature": float(g.get("temperature", 0.9)),
        "top_k": int(g.get("top_k", 50)),
        "top_p": float(g.get("top_p", 1.0)),
        "subtalker_temperature": float(g.get("subtalker_temperature", 0.9)),
        "subtalker_top_k": int(g.get("subtalker_top_k", 50)),
        "subtalker_top_p": float(g.get("subtalker_top_p", 1.0)),
    }


def samples_file(path: Path, jobs: Path, name: str) -> str:
    """The suite's WAV as a .npy of float32 samples for the worker (its environment reads no float WAV)."""
    import numpy as np

    from refimpl.io.audio import read_wav

    samples, rate = read_wav(path)
    if samples.ndim != 1 or rate != 24000:
        raise SystemExit(f"{path}: {rate} Hz, {samples.shape}; qwentts.cpp takes mono 24 kHz samples")
    out = jobs / f"{name}.samples.npy"
    np.save(out, samples.astype(np.float32))
    return str(out)


def job_of(case: dict, action: str, files: tuple, directory: Path, out: Path, jobs: Path, args) -> dict:
    options, case_dir = case["options"], Path(args.suite) / "cases" / case["name"]
    job = {"case": case["name"], "action": action, "talker": str(files[0]), "codec": str(files[1])}
    job.update(threads=args.threads, out=str(out), dump=str(out / ".dump"))
    if action in ("speaker", "encode"):
        return dict(job, ref_audio=samples_file(case_dir / case["inputs"]["audio"], jobs, case["name"]))
    reference = harness.reference_input(Path(args.suite), case)
    job.update(text=options["text"], lang=(options.get("language") or "auto").lower())
    job.update(max_new_tokens=options["max_new_tokens"], sampling=generation_settings(directory))
    if action == "say":
        job.update(speaker=reference.get("speaker") or options.get("speaker"), instruct=options.get("instruct"))
    else:
        job["ref_audio"] = samples_file(case_dir / case["inputs"]["ref_audio"], jobs, case["name"])
        job["ref_text"] = None if options.get("x_vector_only_mode") else options.get("ref_text")
    return job


def read_dump(out: Path, entry: dict) -> bool:
    """The worker's dump (``out/.dump``) as ``out/qwentts-dump.safetensors`` under our names, less the audio
    when the API's own is in ``waveform.npy`` (the dump's copy is compared with it); True when it held codes."""
    import numpy as np

    from refimpl.porting.adapters.qwentts_cpp import read_qwentts_dump
    from refimpl.porting.trace_files import Trace

    dump = out / ".dump"
    if not dump.is_dir() or not any(dump.glob("*.bin")):
        return False
    trace = read_qwentts_dump(dump)
    items = [(k, v) for k, v in trace.items if not k.startswith("qwentts.")]
    if (out / "waveform.npy").is_file() and "refimpl.waveform.0" in trace.keys:
        given = np.load(out / "waveform.npy")
        entry["dump_audio_equal"] = bool(np.array_equal(given, trace["refimpl.waveform.0"]))
        items = [(k, v) for k, v in items if k != "refimpl.waveform.0"]
    entry["dumped"] = [k for k, _ in items]
    Trace(items, trace.metadata).save(out / "qwentts-dump.safetensors")
    return "refimpl.codes.0" in trace.keys


def child_env(threads: int) -> dict:
    """The port's environment for a worker: GGML prints its assertion, not a debugger's backtrace after it."""
    return dict(harness.child_env(threads), GGML_NO_BACKTRACE="1")


def run_cases(python: Path, manifest: dict, dirs: dict, args) -> dict:
    from refimpl.io.files import InputError

    results = Path(args.results)
    same = harness.same_codec_tokenizer(manifest, dirs)
    port = f"{PACKAGE} {VERSION} (qwentts.cpp, CPU), {args.quant} GGUF"
    record = {"port": port, "machine": harness.machine(), "conversions": {}, "cases": {}}
    models = {}
    jobs = Path(tempfile.mkdtemp(prefix="qwentts-jobs-"))
    try:
        planned = harness.planned_cases(
            manifest, args, results, record, dirs, lambda c: plan_case(c, dirs, args.include_streaming_feed, same)
        )
        for case, out, action, kind in planned:
            name = case["name"]
            if kind not in models:
                sha = manifest["checkpoints"][kind]["weights_sha256"]
                models[kind], record["conversions"][kind] = convert(python, kind, dirs[kind], sha, args)
            if models[kind] is None:
                record["cases"][name] = {"status": "failed", "message": "the conversion failed (see conversions)"}
                continue
            job = job_of(case, action, models[kind], dirs[kind], out, jobs, args)
            print(f"{name}: qwentts.cpp {action} ...", flush=True)
            run = harness.run_job(python, WORKER, jobs, name, job, args, child_env(args.threads))
            entry = {"status": "ran", "action": action, "seconds": run["seconds"]}
            in_context = action == "clone" and job.get("ref_text")
            if harness.text_feed(case) == "streaming" and not in_context:
                entry["note"] = "run with qwentts.cpp's feed (the whole text prefilled); the reference used streaming"
            note = out / ".qwentts-case.json"
            if note.is_file():
                entry["qwentts"] = json.loads(note.read_text())
            try:
                codes = action in ("say", "clone") and read_dump(out, entry)
            except InputError as e:
                codes, entry["dump_error"] = False, str(e)
            if run["rc"] != 0 and codes:
                last = f"codes only (from its dump), then: {harness.ggml_error_line(run)}"
                entry.update(status="partial", message=last, output=run["output"])
            elif run["rc"] != 0:
                harness.failed(entry, run, out, harness.ggml_error_line(run))
            record["cases"][name] = entry
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    record["machine"]["load_average_1min_after"] = round(harness.load_average(), 2)
    return record


def conversion_line(kind: str, c: dict) -> str:
    """The summary's line of a conversion."""
    steps = [f"convert.py {c['convert_s']} s"] if "convert_s" in c else []
    steps += [f"quantize {sum(c['quantize_s']):.1f} s"] if "quantize_s" in c else []
    how = "cached" if c.get("cached") else ", ".join(steps) or "the F32 files cached"
    return f"  convert {kind} ({c['checkpoint']}, {c['quant']}): {c.get('error') or how}"


def ran(c: dict) -> str:
    """The summary's line of a case qwentts.cpp ran (in whole or in part)."""
    q = c.get("qwentts", {})
    steps = [f"load {q['load_s']} s"] if "load_s" in q else []
    steps += [f"extract {q['extract_s']} s"] if "extract_s" in q else []
    steps += [f"synthesize {q['synthesize_s']} s ({q['frames']:g} frames)"] if "synthesize_s" in q else []
    more = f"; {c['message']}" if c["status"] == "partial" else ""
    more += f"; {c['note']}" if c.get("note") else ""
    return f"qwentts.cpp {c['action']} in {c['seconds']} s ({', '.join(steps)}){more}"


def summary(record: dict) -> list:
    """What the script did (``harness.summary``), its conversions first."""
    return harness.summary(record, ran, [conversion_line(k, c) for k, c in record["conversions"].items()])


def main(argv=None) -> int:
    ap = harness.port_arguments(__doc__, "qwentts.cpp")  # --timeout: a conversion gets 3 times it
    ap.add_argument("--port-source", help="a checkout of qwentts.cpp's repository: its convert.py converts")
    ap.add_argument("--quant", choices=sorted(PRECISIONS), default="F32", help="the GGUF type run (default F32)")
    ap.add_argument("--quantize-tool", help="the port's quantize binary (built from --port-source), for --quant BF16")
    ap.add_argument("--convert-memory-gib", type=int, default=24, help="address-space limit of the converter")
    ap.add_argument("--no-config-view", action="store_true", help="convert an older checkpoint as it is (see above)")
    ap.add_argument(
        "--include-streaming-feed",
        action="store_true",
        help="also run the streaming-feed cases with qwentts.cpp's feed (they fail: the report shows where)",
    )
    args = ap.parse_args(argv)
    suite, results, manifest, dirs = harness.prepare(args)
    python = harness.ensure_venv(ENV_NAME, f"{PACKAGE}=={VERSION}", MODULE, VERSION)
    t0 = time.perf_counter()
    record = run_cases(python, manifest, dirs, args)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return harness.finish("qwentts-cpp", record, suite, results, PRECISIONS[args.quant], BEHAVIOURS, summary(record))


if __name__ == "__main__":
    sys.exit(main())
