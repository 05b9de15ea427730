"""The candle-tts port (``candle-tts`` 0.1.3 from PyPI: Rust and candle, descended from qwen3-tts-rs) graded
by the conformance suite, in one command:

    python benchmarks/ports/candle_tts.py --suite ports-runs/suite --results ports-runs/candle-results

1. the suite: ``--suite`` is used as it is, or made there first (``refimpl conformance make``, with the
   ``--model`` checkpoints when given, else the tiny embedded ones);
2. candle-tts's environment: ``benchmarks/ports/.envs/candle-tts-0.1.3/`` (git-ignored),
   ``pip install candle-tts==0.1.3`` from a wheel (it needs no NumPy); nothing of it enters the project's
   environment;
3. no conversion: candle-tts reads the Hugging Face folder itself (``Engine.load(DIR, "qwen3", "cpu")``);
4. each case it supports, in its own process (``candle_tts_worker.py`` in its environment) under a time and
   a memory limit. Its Python route is the Base model's voice clone only: ``Engine.extract_voice(pcm,
   sample_rate, transcript)`` returns a voice JSON whose payload holds ``speaker_embedding`` (the x-vector)
   and, with a transcript, ``ref_codes`` (the codec encoder's codes of the reference, [T, 16]);
   ``Engine.synthesize(text, voice, options)`` gives the audio. Greedy: options ``{"seed": 0,
   "temperature": 0, "max_tokens": max_new_tokens, "language": ...}`` (temperature 0 is argmax; there is no
   separate option for the code predictor). The clone cases give ``waveform.npy``, ``speaker_encoder.npy``
   and, in context, the reference's codes under the encoder quantizer's per-layer keys; the speaker case
   ``x_vector.npy``; the codec-encode cases ``codes.npy`` (the ``ref_codes`` of a clone in context with a
   placeholder transcript). A case that crashes or hangs is recorded with its message and the others go on;
   a case candle-tts cannot run is left out (the card says "not run") and the reason printed;
5. ``refimpl conformance grade SUITE RESULTS --precision float32`` (candle-tts computes in float32 on the
   CPU, and the suite's tiny weights are stored in float32), printed, with ``RESULTS/report.json``,
   ``report.html`` and ``candle-tts-run.json`` (what ran, how long, the load).

**candle-tts hard-codes the released sizes** (measured with 0.1.3 on the tiny checkpoints): the codec
decoder's transformer must have 8 layers (``Missing weight: decoder.pre_transformer.layers.4...``), the
codec encoder is built from a fixed Mimi configuration (``shape mismatch for encoder.layers.0.conv.weight,
expected: [64, 1, 7], got: [4, 1, 7]``), and ``synthesize`` takes only a 1024-value x-vector (``Qwen prompt
requires 1024 finite speaker values``). The Talker, the code predictor and the speaker encoder are built
from config.json. So on the tiny suite the clone and codec-encode cases run on the suite's checkpoint as it
is and fail to load, recorded with candle-tts's message; the speaker case runs on an **x-vector view** of the
Base checkpoint (``--no-xvector-view`` turns it off): the same files, hard-linked, except
``speech_tokenizer/model.safetensors``, whose codec encoder is left out (candle-tts then loads without one;
its x-vector route never needs it) and whose decoder transformer layers are repeated up to the 8 it loads
(never run: extracting a voice decodes nothing). The speaker encoder's weights are the suite's, untouched.
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

PACKAGE, VERSION = "candle-tts", "0.1.3"
ENV_NAME = f"{PACKAGE}-{VERSION}"
WORKER = harness.HERE / "candle_tts_worker.py"
PRECISION = "float32"  # candle-tts computes in float32 on the CPU (its default CPU dtype; no option)
BEHAVIOURS: list = []  # the official defaults: no generation or decode case of the tiny suite runs (see below)
CANDLE_DECODER_LAYERS = 8  # the codec decoder transformer's layers candle-tts 0.1.3 loads, whatever config.json says
PLACEHOLDER_REF_TEXT = "reference"  # cloning in context needs a transcript; the codes do not depend on it
SEMANTIC = "refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes"
ACOUSTIC = "refimpl.encoder.quantizer.acoustic_residual_vector_quantizer.layers.{}.codes"

NO_DECODE = "candle-tts decodes only the codes it generates: its Python API takes text, not codes"
BASE_ONLY = (
    "candle-tts's Python route is the Base model's voice clone only (extract_voice + synthesize): no preset "
    "speaker (CustomVoice) and no instruct (VoiceDesign)"
)
BATCH = "a batch of prompts: synthesize takes one text"
SAMPLED = "sampling replayed from recorded uniforms: candle-tts draws from its own seeded generator"
NEEDS_BASE = "candle-tts encodes audio only in extract_voice, which needs a Base checkpoint, and the suite has none"


def plan_case(case: dict, dirs: dict, same_tokenizer: bool) -> tuple:
    """(action for candle_tts_worker, checkpoint kind) or (None, why candle-tts cannot run the case)."""
    stage = case["stage"]
    if stage == "codec-decode":
        return None, NO_DECODE
    if stage in ("codec-encode", "speaker"):
        return harness.on_base_plan(stage, dirs, same_tokenizer, NEEDS_BASE)
    return harness.generation_plan(case, "clone", [] if stage == "clone" else [BASE_ONLY], BATCH, SAMPLED)


def xvector_view(directory: Path, sha: str) -> tuple:
    """(the folder, what was changed): ``directory`` with its codec encoder left out and its codec decoder
    transformer's layers repeated up to the CANDLE_DECODER_LAYERS that candle-tts loads; every other file
    hard-linked (or copied). Made once, beside the environment, by weights hash."""
    from refimpl.io.checkpoint import read_safetensors_file, write_safetensors_file

    view = harness.ENVS / ENV_NAME / "views" / f"xvector-{sha[:16]}"
    tokenizer = directory / "speech_tokenizer" / "model.safetensors"
    header_names = _tensor_names(tokenizer)
    prefix = "decoder.pre_transformer.layers."
    layers = sorted({int(n[len(prefix) :].split(".")[0]) for n in header_names if n.startswith(prefix)})
    changes = {"encoder_left_out": sum(n.startswith("encoder.") for n in header_names), "decoder_layers": len(layers)}
    if (view / ".made").is_file():
        return view, dict(changes, cached=True)
    shutil.rmtree(view, ignore_errors=True)
    partial = view.with_name(view.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for src in sorted(directory.rglob("*")):
        dst = partial / src.relative_to(directory)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif src != tokenizer:
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)  # a hard link: the view outlives a suite that is moved or deleted
            except OSError:
                shutil.copy2(src, dst)
    tensors = read_safetensors_file(tokenizer)  # float32 (the speech tokenizers' own dtype), read-only views
    kept = {n: t for n, t in tensors.items() if not n.startswith("encoder.")}
    for name, t in tensors.items():
        if name.startswith(prefix):
            i, rest = name[len(prefix) :].split(".", 1)
            for j in range(len(layers), CANDLE_DECODER_LAYERS):
                if layers[j % len(layers)] == int(i):
                    kept[f"{prefix}{j}.{rest}"] = t
    (partial / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    write_safetensors_file(partial / "speech_tokenizer" / "model.safetensors", kept, dtype="keep")
    (partial / ".made").write_text(json.dumps(changes) + "\n")
    os.replace(partial, view)
    return view, changes


def _tensor_names(path: Path) -> list:
    from refimpl.io.checkpoint import read_safetensors_header

    header, _, _ = read_safetensors_header(path)
    return list(header)


def read_pcm(path: Path) -> tuple:
    """(samples as a list of floats, sample rate) of a suite's input WAV, mono."""
    from refimpl.io.audio import read_wav

    samples, rate = read_wav(path)
    if samples.ndim != 1:
        raise SystemExit(f"{path}: {samples.shape[1]} channels; the suite's inputs are mono")
    return [float(v) for v in samples], int(rate)


def job_of(case: dict, action: str, model: Path, out: Path) -> dict:
    options, case_dir = case["options"], Path(case["_suite"]) / "cases" / case["name"]
    job = {"case": case["name"], "action": action, "model": str(model), "out": str(out)}
    audio = case["inputs"]["ref_audio" if action == "clone" else "audio"]
    job["pcm"], job["sample_rate"] = read_pcm(case_dir / audio)
    if action == "speaker":
        return dict(job, transcript=None)
    if action == "encode":
        return dict(job, transcript=PLACEHOLDER_REF_TEXT)
    job["transcript"] = None if options.get("x_vector_only_mode") else options.get("ref_text")
    job["text"] = options["text"]
    language = options.get("language") or "auto"
    job["options"] = {"seed": 0, "temperature": 0, "max_tokens": options["max_new_tokens"], "language": language}
    return job


def write_outputs(action: str, given: dict, out: Path) -> None:
    """The suite's plain names from what the worker wrote (``.candle-case.json``)."""
    import numpy as np

    voice = given["voice"]
    x_vector = np.asarray(voice["speaker_embedding"], dtype=np.float32)
    if action == "speaker":
        np.save(out / "x_vector.npy", x_vector)
    elif action == "encode":
        np.save(out / "codes.npy", np.asarray(voice["ref_codes"], dtype=np.int64))
    else:
        np.save(out / "speaker_encoder.npy", x_vector[None])
        if voice.get("ref_codes"):
            codes = np.asarray(voice["ref_codes"], dtype=np.int64)  # [T, 16]: codebook 0 semantic, 1..15 acoustic
            np.save(out / f"{SEMANTIC}.npy", codes[None, :, 0])
            for j in range(1, codes.shape[1]):
                np.save(out / f"{ACOUSTIC.format(j - 1)}.npy", codes[None, :, j])
        if given["sample_rate"] != 24000:
            raise ValueError(f"candle-tts gave audio at {given['sample_rate']} Hz; the suite's is 24 kHz")
        np.save(out / "waveform.npy", np.asarray(given["samples"], dtype=np.float32))


def child_env(threads: int) -> dict:
    return dict(harness.child_env(threads), RAYON_NUM_THREADS=str(threads))


def run_cases(python: Path, manifest: dict, dirs: dict, args) -> dict:
    suite, results = Path(args.suite), Path(args.results)
    same = harness.same_codec_tokenizer(manifest, dirs)
    record = {"port": f"{PACKAGE} {VERSION}", "machine": harness.machine(), "views": {}, "cases": {}}
    jobs = Path(tempfile.mkdtemp(prefix="candle-jobs-"))
    try:
        planned = harness.planned_cases(manifest, args, results, record, dirs, lambda c: plan_case(c, dirs, same))
        for case, out, action, kind in planned:
            name = case["name"]
            model = dirs[kind]
            entry = {"status": "ran", "action": action, "checkpoint": str(model)}
            if action == "speaker" and args.xvector_view:
                sha = manifest["checkpoints"][kind]["weights_sha256"]
                model, changes = xvector_view(dirs[kind], sha)
                record["views"][kind] = dict(changes, folder=str(model))
                entry.update(checkpoint=str(model), view="x-vector view of " + kind)
            job = job_of(dict(case, _suite=str(suite)), action, model, out)
            print(f"{name}: candle-tts {action} ...", flush=True)
            run = harness.run_job(python, WORKER, jobs, name, job, args, child_env(args.threads))
            entry["seconds"] = run["seconds"]
            if run["rc"] == 0:
                given = json.loads((out / ".candle-case.json").read_text())
                try:
                    write_outputs(action, given, out)
                except (KeyError, TypeError, ValueError) as e:  # the voice JSON or audio is not what we read
                    run.update(rc=1, output=f"{run['output']}\nreading candle-tts's output: {e!r}")
                else:
                    given.pop("samples", None)
                    entry["candle"] = {k: v for k, v in given.items() if k != "voice"}
                    entry["candle"]["voice_sizes"] = {k: _size(v) for k, v in given["voice"].items()}
            if run["rc"] != 0:
                lines = run["output"].strip().splitlines()
                # the error line: the last one naming an error, before a Rust backtrace when there is one
                harness.failed(entry, run, out, next((x for x in reversed(lines) if "Error" in x), None))
            record["cases"][name] = entry
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
    record["machine"]["load_average_1min_after"] = round(harness.load_average(), 2)
    return record


def _size(value):
    """The shape of a voice payload field, for the record: [rows, columns], [n], or the value itself."""
    if isinstance(value, list):
        return [len(value), len(value[0])] if value and isinstance(value[0], list) else [len(value)]
    return value


def view_line(kind: str, v: dict) -> str:
    """The summary's line of an x-vector view."""
    how = "cached" if v.get("cached") else "made"
    return (
        f"  x-vector view of {kind} ({how}): {v['encoder_left_out']} codec encoder tensors left out, "
        f"decoder transformer's {v['decoder_layers']} layers repeated to {CANDLE_DECODER_LAYERS}"
    )


def ran(c: dict) -> str:
    """The summary's line of a case candle-tts ran."""
    v = c["candle"]
    steps = [f"load {v['load_s']} s", f"voice {v['voice_s']} s"]
    steps += [f"synthesize {v['synthesize_s']} s"] if "synthesize_s" in v else []
    view = f"; {c['view']}" if c.get("view") else ""
    return f"candle-tts {c['action']} in {c['seconds']} s ({', '.join(steps)}){view}"


def summary(record: dict) -> list:
    """What the script did (``harness.summary``), its x-vector views first."""
    return harness.summary(record, ran, [view_line(k, v) for k, v in record["views"].items()])


def main(argv=None) -> int:
    ap = harness.port_arguments(__doc__, "candle-tts")
    ap.add_argument(
        "--no-xvector-view",
        dest="xvector_view",
        action="store_false",
        help="run the speaker case on the suite's checkpoint as it is (it fails to load where candle-tts's "
        "hard-coded codec sizes are not the checkpoint's)",
    )
    args = ap.parse_args(argv)
    suite, results, manifest, dirs = harness.prepare(args)
    python = harness.ensure_venv(ENV_NAME, f"{PACKAGE}=={VERSION}", "candle_tts", VERSION)
    t0 = time.perf_counter()
    record = run_cases(python, manifest, dirs, args)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return harness.finish("candle-tts", record, suite, results, PRECISION, BEHAVIOURS, summary(record))


if __name__ == "__main__":
    sys.exit(main())
