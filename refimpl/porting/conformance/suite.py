"""Making and reading a conformance suite: the cases, their inputs in plain formats, the reference traces in
float64 and float32, and the manifest (docs/conformance.md).

    SUITE/
      manifest.json                 the suite's version, the versions it agrees with, the checkpoints' hashes,
                                    the tolerance table, every case (inputs, options, outputs, references)
      README.md                     for the port author: what to run, what to dump, how to name it
      checkpoints/<kind>/           the checkpoints the cases run on (only for the embedded tiny ones)
      cases/<name>/case.json        the case's own entry of the manifest
      cases/<name>/<inputs>         codes.npy, audio.wav, ref_audio.wav, uniforms.npy
      cases/<name>/reference.float64.safetensors, reference.float32.safetensors

A case asks the port for a few plain outputs (``codes``, ``waveform``, ``x_vector``; ``.0``/``.1`` per item
of a batch) and takes any other tensor the port dumps under the official names (``refimpl trace``'s keys).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from ...io.files import MAX_JSON_BYTES, InputError, parse_json, plain_file_name, read_limited, write_atomically
from .. import trace_files
from ..compare import EPS, F64_REL, NOISE_FACTOR, NOISE_SIZES, PRECISIONS

if TYPE_CHECKING:  # for the annotations only: the models are imported when a suite is made
    from ...codec.speech_tokenizer import Progress, SpeechTokenizer
    from ...tts.model import Qwen3TTS

__all__ = [
    "SUITE_FORMAT",
    "SUITE_VERSION",
    "CASES",
    "Case",
    "make_suite",
    "read_manifest",
    "SuiteError",
]

SUITE_FORMAT = "qwen3-tts-conformance-suite"
SUITE_VERSION = 1  # raised whenever a case, an input, an option or a tolerance changes
# the official implementation every reference of this version agrees with (docs/golden.md, docs/parity.md)
AGREES_WITH = {"qwen-tts": "0.1.1", "transformers": "4.57.3", "torch": "2.13.0"}
EMBEDDED = Path(__file__).resolve().parents[2] / "data"
EMBEDDED_CHECKPOINTS = {
    "customvoice": "default-customvoice",
    "base": "default-base",
    "voicedesign": "default-voicedesign",
}
MODEL_KINDS = {"custom_voice": "customvoice", "base": "base", "voice_design": "voicedesign"}
REFERENCE_FILES = {"float64": "reference.float64.safetensors", "float32": "reference.float32.safetensors"}


class SuiteError(InputError):
    """A suite that cannot be used: a missing or malformed manifest, case or reference file."""


# ----------------------------------------------------------------------------- the cases


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    stage: str  # the ``refimpl trace`` stage it exercises
    checkpoint: str  # customvoice / base / voicedesign
    title: str
    covers: str  # the official behaviour it pins down (docs/official_behaviours.md)
    options: dict = dataclasses.field(default_factory=dict)  # the Python API's keywords
    outputs: tuple = ()  # the plain outputs the port is asked for


GREEDY = {"do_sample": False, "subtalker_dosample": False}
SHORT = 12  # max_new_tokens: 11 frames without an EOS (the official length convention)
TEXT = "Hello from the conformance suite."

CASES = (
    Case("codec-decode", "codec-decode", "customvoice", "Codec decode, one causal pass",
         "the decoder's forward over every frame (decoder.* traced)", {"frames": 4}, ("waveform",)),
    Case("codec-decode-chunked", "codec-decode", "customvoice", "Codec decode, the official 300/25 chunking",
         "Qwen3TTSTokenizer.decode: chunks of 300 frames with 25 frames of left context, trimmed",
         {"frames": 330, "decode": "official"}, ("waveform",)),
    Case("codec-decode-stream", "codec-decode", "customvoice", "Codec decode, exact stream in 1/2/4-frame pushes",
         "a streamed decode that carries the decoder's whole state: equal to the one-pass decode",
         {"frames": 40, "pushes": [1, 2, 4]}, ("waveform",)),
    Case("codec-encode", "codec-encode", "customvoice", "Codec encode, 24 kHz",
         "the encoder and its split RVQ", {"seconds": 0.6, "sample_rate": 24000}, ("codes",)),
    Case("codec-encode-16k", "codec-encode", "customvoice", "Codec encode, 16 kHz resampled",
         "resampling to 24 kHz as the official (soxr HQ)", {"seconds": 0.6, "sample_rate": 16000}, ("codes",)),
    Case("speaker", "speaker", "base", "Speaker encoder x-vector",
         "the 128-bin log mel front end and the ECAPA-TDNN", {"seconds": 2.0, "sample_rate": 24000}, ("x_vector",)),
    Case("say-greedy", "say", "customvoice", "Custom voice, greedy, non-streaming text feed",
         "greedy under the official rules: repetition penalty, min_new_tokens, suppressed ids, the length",
         dict(GREEDY, text=TEXT, max_new_tokens=SHORT), ("codes", "waveform")),
    Case("say-streaming-feed", "say", "customvoice", "Custom voice, greedy, streaming text feed",
         "the text fed one token per frame (non_streaming_mode=False)",
         dict(GREEDY, text=TEXT, max_new_tokens=SHORT, non_streaming_mode=False), ("codes", "waveform")),
    Case("say-batch", "say", "customvoice", "Custom voice, a batch of two with left padding",
         "two prompts of different lengths, the shorter padded on the left",
         dict(GREEDY, text=[TEXT, "Two."], max_new_tokens=SHORT), ("codes.0", "codes.1", "waveform.0", "waveform.1")),
    Case("say-sampled", "say", "customvoice", "Custom voice, sampled, with the recorded uniforms",
         "top-k/top-p/temperature sampling replayed from uniforms.npy (docs/port_authors.md)",
         dict(text=TEXT, max_new_tokens=SHORT, seed=7), ("codes", "waveform")),
    Case("design-greedy", "design", "voicedesign", "Voice design, greedy",
         "the instruct prompt", dict(GREEDY, text=TEXT, instruct="A calm, deep voice.", max_new_tokens=SHORT),
         ("codes", "waveform")),
    Case("clone-x-vector", "clone", "base", "Voice clone, x-vector only",
         "the reference's x-vector in the prompt", dict(GREEDY, text=TEXT, x_vector_only_mode=True,
                                                        max_new_tokens=SHORT), ("codes", "waveform")),
    Case("clone-icl", "clone", "base", "Voice clone, in-context (reference text and codes)",
         "the reference's codes and text continued; the waveform cut after decoding both",
         dict(GREEDY, text=TEXT, ref_text="This is the reference.", max_new_tokens=SHORT), ("codes", "waveform")),
)  # fmt: skip


def output_keys(case: Case) -> dict[str, str]:
    """Plain output name -> the reference trace's key it is compared with."""
    keys = {}
    for out in case.outputs:
        name, _, item = out.partition(".")
        item = item or "0"
        if name == "waveform":
            keys[out] = "decoder" if case.name == "codec-decode" else f"refimpl.waveform.{item}"
        elif name == "codes":
            keys[out] = f"refimpl.codes.{item}"
        elif name == "x_vector":
            keys[out] = "speaker_encoder"
    return keys


# ----------------------------------------------------------------------------- inputs


def speech_like(seconds: float, sr: int, seed: int) -> np.ndarray:
    """A deterministic voiced signal: a gliding harmonic tone with a syllable envelope and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    f0 = 140 + 30 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t) ** 2
    return (0.15 * voiced * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def random_codes(frames: int, codebook_size: int, groups: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, codebook_size, size=(frames, groups), dtype=np.int64)


def case_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


# ----------------------------------------------------------------------------- references


class Models:
    """The checkpoints of a suite, loaded once per (kind, dtype)."""

    def __init__(self, directories: dict[str, Path]) -> None:
        self.directories = directories  # kind -> Path
        self.loaded: dict[tuple[str, str, str], Any] = {}  # (what, kind, dtype name) -> the model

    def keep_only(self, kind: str | None, dtype: DTypeLike | None = None) -> None:
        """Drop every model but those of checkpoint ``kind`` in ``dtype`` (None: drop all)."""
        name = None if dtype is None else np.dtype(dtype).name
        self.loaded = {k: v for k, v in self.loaded.items() if k[1] == kind and name in (None, k[2])}

    def tts(self, kind: str, dtype: DTypeLike) -> Qwen3TTS:
        from ...tts.model import Qwen3TTS

        key = ("tts", kind, np.dtype(dtype).name)
        if key not in self.loaded:
            self.loaded[key] = Qwen3TTS.from_pretrained(self.directories[kind], dtype=dtype)
        return self.loaded[key]

    def tokenizer(self, kind: str, dtype: DTypeLike) -> SpeechTokenizer:
        from ...codec.speech_tokenizer import SpeechTokenizer

        key = ("tokenizer", kind, np.dtype(dtype).name)
        if key not in self.loaded:
            self.loaded[key] = SpeechTokenizer.from_pretrained(self.directories[kind], dtype=dtype)
        return self.loaded[key]


def case_inputs(case: Case, models: Models) -> dict[str, tuple[np.ndarray, int | None]]:
    """The case's input arrays: name -> (array, sample rate or None)."""
    seed = case_seed(case.name)
    opts = case.options
    if case.stage == "codec-decode":
        tok = models.tokenizer(case.checkpoint, np.float64)
        return {"codes": (random_codes(opts["frames"], tok.codebook_size, tok.num_quantizers, seed), None)}
    if case.stage in ("codec-encode", "speaker"):
        return {"audio": (speech_like(opts["seconds"], opts["sample_rate"], seed), opts["sample_rate"])}
    if case.stage == "clone":
        return {"ref_audio": (speech_like(0.8, 24000, seed), 24000)}
    return {}


def generation_keywords(case: Case, inputs: dict) -> dict[str, Any]:
    kwargs = dict(case.options)
    if "ref_audio" in inputs:
        kwargs["ref_audio"] = inputs["ref_audio"]
    if case.stage == "say":
        kwargs.setdefault("speaker", None)
    return kwargs


def reference_trace(
    case: Case, models: Models, inputs: dict, dtype: DTypeLike, random_draws: np.ndarray | None = None
) -> trace_files.Trace:
    """Run the case in ``dtype`` and return its trace (the outputs of ``output_keys`` included)."""
    opts = case.options
    if case.stage == "codec-decode":
        tok = models.tokenizer(case.checkpoint, dtype)
        codes = inputs["codes"][0]
        if case.name == "codec-decode":
            return trace_files.trace_codec_decode(tok, codes)
        if opts.get("decode") == "official":  # also the exact one-pass decode: the 'decode=exact' behaviour
            items = [("refimpl.waveform.0", tok.decode(codes)), ("refimpl.waveform_exact.0", tok.decode_full(codes))]
        else:
            items = [("refimpl.waveform.0", stream_decode(tok, codes, opts["pushes"]))]
        meta = trace_files.base_metadata(
            case.stage, tok.directory, tok.dtype, {"codes_sha256": trace_files.array_hash(codes), **opts}
        )
        return trace_files.Trace(items, meta)
    if case.stage == "codec-encode":
        tok = models.tokenizer(case.checkpoint, dtype)
        audio, sr = inputs["audio"]
        trace = trace_files.trace_codec_encode(tok, audio, sr)
        trace.items.append(("refimpl.codes.0", np.asarray(tok.encode(audio, sr), dtype=np.int64)))
        return trace
    tts = models.tts(case.checkpoint, dtype)
    if case.stage == "speaker":
        return trace_files.trace_speaker(tts, *inputs["audio"])
    kwargs = generation_keywords(case, inputs)
    if case.stage == "say" and kwargs.get("speaker") is None:
        first = tts.get_supported_speakers()[0]
        kwargs["speaker"] = [first] * len(kwargs["text"]) if isinstance(kwargs["text"], list) else first
    if random_draws is not None:
        kwargs["random_draws"] = random_draws
    return trace_files.trace_generation(tts, case.stage, decoder=False, **kwargs)


def stream_decode(tok: SpeechTokenizer, codes: np.ndarray, pushes: list[int]) -> np.ndarray:
    """Push ``codes`` through ``tok.stream()`` in pushes of the sizes of ``pushes``, the last repeated."""
    stream, chunks, t, i = tok.stream(), [], 0, 0
    while t < len(codes):
        n = pushes[min(i, len(pushes) - 1)]
        chunks.append(stream.push(codes[t : t + n]))
        t, i = t + n, i + 1
    return np.concatenate(chunks)


# ----------------------------------------------------------------------------- the tolerance table


def tolerance_table(size: str = "tiny") -> dict[str, dict[str, float]]:
    """The rule of ``refimpl.porting.compare.tolerance`` as numbers for checkpoints of ``size``: per precision
    and network, the allowed max |port - reference| as a fraction of scale = max(1, max |reference|)."""
    table = {"float64": {"all": F64_REL}}
    for precision in PRECISIONS[1:]:
        eps = EPS[precision]
        table[precision] = {
            net: NOISE_FACTOR * ratio * eps + NOISE_FACTOR * eps for net, ratio in NOISE_SIZES[size][precision].items()
        }
    return table


# ----------------------------------------------------------------------------- making a suite


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def resolve_checkpoints(model_dirs: list[str | os.PathLike[str]] | None) -> tuple[dict[str, Path], bool]:
    """({kind: directory}, embedded?): the embedded tiny checkpoints, or the given ones by their type."""
    if not model_dirs:
        return {kind: EMBEDDED / name for kind, name in EMBEDDED_CHECKPOINTS.items()}, True
    from ...io.checkpoint import read_config

    found: dict[str, Path] = {}
    for d in model_dirs:
        kind = MODEL_KINDS.get(read_config(d).get("tts_model_type"))  # type: ignore[arg-type]  # None: no kind
        if kind is None:
            raise InputError(f"{d}: config.json's tts_model_type is not one of {sorted(MODEL_KINDS)}")
        if kind in found:
            raise InputError(f"two checkpoints of type {kind}: {found[kind]} and {d}")
        found[kind] = Path(d)
    return found, False


def checkpoint_entry(directory: Path, copied_to: str | None) -> dict:
    return {
        "name": directory.name,
        "path": copied_to,
        "weights_sha256": trace_files.weights_hash(directory),
        "config_sha256": sha256_of(directory / "config.json"),
    }


MAKING = "making.json"  # in a suite being made: what it is made from, and the cases that failed


def make_suite(
    out_dir: str | os.PathLike[str],
    model_dirs: list[str | os.PathLike[str]] | None = None,
    progress: Progress | None = None,
    noise: str | None = None,
) -> dict:
    """Write a conformance suite to ``out_dir`` (created; must be empty or absent, or an unfinished suite)
    and return its manifest.  ``model_dirs``: checkpoints by type (any of CustomVoice, Base, VoiceDesign);
    without them the embedded tiny checkpoints, copied into the suite.  Cases whose checkpoint is not given
    are left out.  ``noise``: whose measured official noise the suite's tolerances allow
    (``compare.NOISE_SIZES``): by default "tiny" for the embedded checkpoints, "released" for given ones.

    Resumable: while the suite is made, ``out_dir/making.json`` names the checkpoints (their SHA-256) and the
    refimpl making it; a case is complete once its ``case.json`` is written (last, atomically).  Made again
    into a folder that holds ``making.json`` (a run that was stopped, or whose cases failed) from the same
    checkpoints by the same refimpl, the cases whose ``case.json`` matches and whose files have their
    recorded SHA-256 are kept, the others made again.  A case that fails does not stop the others: they are
    made, ``making.json`` lists the failures, no manifest is written, and the error (``SuiteIncomplete``, or
    a ``RuntimeError`` when one was a bug) names them; the manifest (and README) come when every case is
    made, and ``making.json`` then goes."""
    from ..._version import __version__

    out = Path(out_dir)
    directories, embedded = resolve_checkpoints(model_dirs)
    noise = noise or ("tiny" if embedded else "released")
    if noise not in NOISE_SIZES:
        raise InputError(f"noise must be one of {list(NOISE_SIZES)}, not {noise!r}")
    copies = {kind: f"checkpoints/{kind}" if embedded else None for kind in directories}
    making = {
        "format": SUITE_FORMAT,
        "version": SUITE_VERSION,
        "refimpl": __version__,
        "checkpoints": {kind: checkpoint_entry(d, copies[kind]) for kind, d in directories.items()},
    }
    check_suite_folder(out, making)
    # the codec cases run on the CustomVoice checkpoint's speech tokenizer, else on any (they are the same)
    codec_kind = "customvoice" if "customvoice" in directories else next(iter(directories))
    models = Models(directories)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / MAKING, (json.dumps(making, indent=1) + "\n").encode("utf-8"))
    t0 = time.perf_counter()
    for kind, directory in directories.items():
        copy = copies[kind]
        if copy is not None:
            shutil.rmtree(out / copy, ignore_errors=True)  # a copy cut short is made again whole
            shutil.copytree(directory, out / copy)
    selected = [
        dataclasses.replace(c, checkpoint=codec_kind) if c.stage.startswith("codec") else c
        for c in CASES
        if c.checkpoint in directories or c.stage.startswith("codec")
    ]
    kept = {c.name: e for c in selected if (e := complete_case(c, out / "cases" / c.name)) is not None}
    cases = list(kept.values())
    # checkpoint by checkpoint, every float64 reference and then every float32 one: one model in memory at a
    # time (at the released sizes a 1.7B model takes 14 GB in float64).  Each case alone, never batched with
    # another: a reference is a trace, and a batch's row does not trace as its case alone does
    # (docs/performance.md, "Batches"; say-batch is the batch its case asks for)
    work = [
        (kind, dtype, c)
        for kind in directories
        for dtype in (np.float64, np.float32)
        for c in selected
        if c.checkpoint == kind and c.name not in kept
    ]
    started: dict[str, dict] = {}
    failed: list[dict] = []
    for kind, dtype, case in progress(work, "making cases") if progress else work:
        directory = out / "cases" / case.name
        if dtype is np.float32 and case.name not in started:
            continue  # its float64 reference failed
        try:
            models.keep_only(kind, dtype)
            if dtype is np.float64:
                shutil.rmtree(directory, ignore_errors=True)  # what a stopped or failed run left of it
                started[case.name] = start_case(case, models, directory)
            else:
                cases.append(finish_case(case, models, directory, started.pop(case.name)))
        except Exception as e:  # the case failed, not the suite: named at the end, the others made first
            started.pop(case.name, None)
            models.keep_only(None)  # a model that ran out of memory half-way is not used again
            failed.append(failed_case(case, e))
            making["failed"] = failed
            write_atomically(out / MAKING, (json.dumps(making, indent=1) + "\n").encode("utf-8"))
    models.keep_only(None)
    if failed:
        (out / "manifest.json").unlink(missing_ok=True)
        listed = "; ".join(f"{f['name']}: {f['error']}" for f in failed)
        made = f"{len(cases)} of {len(selected)} cases are made in {out}"
        again = "the same command again makes the others"
        if any(f["internal"] for f in failed):
            raise RuntimeError(f"{len(failed)} case(s) hit a bug: {listed} ({made}; {again})")
        raise SuiteIncomplete(f"{len(failed)} case(s) failed: {listed} ({made}; {again})")
    cases.sort(key=lambda c: [x.name for x in CASES].index(c["name"]))
    manifest = {
        "format": SUITE_FORMAT,
        "version": SUITE_VERSION,
        "made_by": {"refimpl": __version__, "seconds": round(time.perf_counter() - t0, 1)},
        "agrees_with": AGREES_WITH,
        "checkpoints": making["checkpoints"],
        "noise": noise,
        "tolerances": tolerance_table(noise),
        "behaviours": BEHAVIOURS,
        "cases": cases,
    }
    write_atomically(out / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    from .readme import suite_readme

    write_atomically(out / "README.md", suite_readme(manifest).encode("utf-8"))
    (out / MAKING).unlink()
    return manifest


class SuiteIncomplete(InputError):
    """Cases of a suite that failed while it was made (the others are made; making again retries them)."""


def failed_case(case: Case, e: Exception) -> dict:
    internal = not isinstance(e, (ValueError, OSError, MemoryError))
    message = " ".join(str(e).split()) or type(e).__name__
    return {"name": case.name, "error": f"{type(e).__name__}: {message}" if internal else message, "internal": internal}


def check_suite_folder(out: Path, making: dict) -> bool:
    """Whether ``out`` is an unfinished suite to resume (it holds ``making.json`` of the same checkpoints,
    suite version and refimpl); False for an absent or empty folder; anything else is refused."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    path = out / MAKING
    if not out.is_dir() or not path.is_file():
        raise InputError(
            f"cannot make a suite in {out}: it exists and is not an empty directory (nor an unfinished suite, "
            f"which holds {MAKING})"
        )
    before = parse_json(read_limited(path, MAX_JSON_BYTES, f"{path}", regular_only=True), f"{path}")
    if not isinstance(before, dict) or any(before.get(k) != making[k] for k in making):
        raise InputError(
            f"cannot resume the suite in {out}: {MAKING} says it was begun from other checkpoints, another "
            "suite version or another refimpl; make it in an empty folder"
        )
    return True


def complete_case(case: Case, directory: Path) -> dict | None:
    """The entry of a case already made in ``directory`` (a stopped run's): its ``case.json`` says what this
    refimpl would write for the case, and every file it lists has its recorded SHA-256; else None."""
    path = directory / "case.json"
    try:
        entry = parse_json(read_limited(path, MAX_JSON_BYTES, f"{path}", regular_only=True), f"{path}")
    except InputError:
        return None
    expected = {
        "name": case.name,
        "stage": case.stage,
        "title": case.title,
        "covers": case.covers,
        "checkpoint": case.checkpoint,
        "options": json.loads(json.dumps(dict(case.options))),
        "outputs": output_keys(case),
        "references": dict(REFERENCE_FILES),
    }
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in expected.items()):
        return None
    hashes = entry.get("sha256")
    inputs = entry.get("inputs")
    if not isinstance(hashes, dict) or not isinstance(inputs, dict):
        return None
    needed = set(inputs.values()) | set(REFERENCE_FILES.values())
    if not needed <= set(hashes) or not all(plain_file_name(f) for f in hashes):
        return None
    for name, digest in hashes.items():
        file = directory / name
        try:
            if file.is_symlink() or not file.is_file() or sha256_of(file) != digest:
                return None
        except OSError:
            return None
    return entry


# the official behaviours a port may choose differently, and the choice graded by default (the first)
BEHAVIOURS = {
    "length": {
        "official": "max_new_tokens - 1 frames when no EOS comes",
        "natural": "max_new_tokens frames: the common frames are compared",
    },
    "decode": {
        "official": "over 300 frames: chunks of 300 with 25 frames of left context",
        "exact": "one causal pass (or an exact stream) whatever the length",
    },
}


def start_case(case: Case, models: Models, directory: Path) -> dict:
    """Write one case's inputs and its float64 reference; return what ``finish_case`` needs."""
    from ...io.audio import read_wav, write_wav

    directory.mkdir(parents=True)
    inputs = case_inputs(case, models)
    files = {}
    for name, (array, sr) in inputs.items():
        if sr is None:
            files[name] = f"{name}.npy"
            np.save(directory / files[name], array)
        else:
            files[name] = f"{name}.wav"
            write_wav(directory / files[name], array, sr, sample_format="float")
            inputs[name] = read_wav(directory / files[name])  # the reference runs on what the port reads
    ref64 = reference_trace(case, models, inputs, np.float64)
    draws = ref64["refimpl.random_draws"] if "refimpl.random_draws" in ref64.keys else None
    if draws is not None and draws.size:
        files["uniforms"] = "uniforms.npy"
        np.save(directory / files["uniforms"], draws)
    else:
        draws = None
    ref64.save(directory / REFERENCE_FILES["float64"])
    codes = {k: v for k, v in ref64.items if k.startswith("refimpl.codes.")}
    return {"inputs": inputs, "files": files, "draws": draws, "codes": codes, "frames": frames_of(ref64, case)}


def finish_case(case: Case, models: Models, directory: Path, started: dict) -> dict:
    """Write the case's float32 reference (the same uniforms) and case.json; return its manifest entry."""
    ref32 = reference_trace(case, models, started["inputs"], np.float32, random_draws=started["draws"])
    check_codes_agree(case, started["codes"], ref32)
    ref32.save(directory / REFERENCE_FILES["float32"])
    files = started["files"]
    entry = {
        "name": case.name,
        "stage": case.stage,
        "title": case.title,
        "covers": case.covers,
        "checkpoint": case.checkpoint,
        "inputs": files,
        "options": dict(case.options),
        "outputs": output_keys(case),
        "references": dict(REFERENCE_FILES),
        "frames": started["frames"],
        "sha256": {f: sha256_of(directory / f) for f in sorted(set(files.values()) | set(REFERENCE_FILES.values()))},
    }
    write_atomically(directory / "case.json", (json.dumps(entry, indent=1) + "\n").encode("utf-8"))
    return entry


def frames_of(trace: trace_files.Trace, case: Case) -> list[int] | None:
    """The generated frames per item (generation cases), as the reference made them."""
    codes = [v for k, v in trace.items if k.startswith("refimpl.codes.")]
    return [int(c.shape[0]) for c in codes] if codes else None


def check_codes_agree(case: Case, codes64: dict[str, np.ndarray], ref32: trace_files.Trace) -> None:
    """The float32 reference's codes must equal the float64 one's: a case on a near tie would grade a
    correct float32 port as failing, so it has no place in the suite."""
    for key, codes in codes64.items():
        if not np.array_equal(codes, ref32[key]):
            raise RuntimeError(f"case {case.name}: the float32 and float64 codes differ ({key}): a near tie")


# ----------------------------------------------------------------------------- reading a suite


MANIFEST_KEYS = ("format", "version", "agrees_with", "checkpoints", "tolerances", "behaviours", "cases")
CASE_KEYS = ("name", "stage", "title", "inputs", "options", "outputs", "references")


def read_manifest(suite_dir: str | os.PathLike[str]) -> dict:
    """The manifest of ``suite_dir``, checked: its format and version, every case's name and file names
    plain names of files inside the suite (nothing outside SUITE is ever read), outputs a map of names."""
    suite = Path(suite_dir)
    if not suite.is_dir():
        raise SuiteError(f"{suite} is not a directory (a suite is the folder 'refimpl conformance make' wrote)")
    path = suite / "manifest.json"
    if not path.is_file():
        raise SuiteError(f"{suite} has no manifest.json: not a conformance suite")
    raw = read_limited(path, MAX_JSON_BYTES, f"the manifest {path}", SuiteError, regular_only=True)
    manifest = parse_json(raw, f"the manifest {path}", SuiteError)
    if not isinstance(manifest, dict) or manifest.get("format") != SUITE_FORMAT:
        raise SuiteError(f"{path} is not a conformance suite's manifest (format must be {SUITE_FORMAT!r})")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise SuiteError(f"{path}: missing {missing}")
    version = manifest["version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SUITE_VERSION:
        raise SuiteError(
            f"{path}: suite version {version!r} is not one this refimpl reads (1 to {SUITE_VERSION}): "
            "grade it with the refimpl that made it, or make the suite again"
        )
    for field in ("agrees_with", "checkpoints", "tolerances", "behaviours"):
        if not isinstance(manifest[field], dict):
            raise SuiteError(f"{path}: {field} must be a JSON object, found a JSON {type(manifest[field]).__name__}")
    if manifest.get("noise", "tiny") not in NOISE_SIZES:
        raise SuiteError(f"{path}: noise must be one of {list(NOISE_SIZES)}, not {manifest.get('noise')!r}")
    if not isinstance(manifest["cases"], list) or not manifest["cases"]:
        raise SuiteError(f"{path}: cases must be a non-empty list")
    names = set()
    for i, case in enumerate(manifest["cases"]):
        check_case_entry(case, f"{path}: case {i}")
        if case["name"] in names:
            raise SuiteError(f"{path}: two cases named {case['name']!r}")
        names.add(case["name"])
    return manifest


def check_case_entry(case: object, where: str) -> None:
    if not isinstance(case, dict):
        raise SuiteError(f"{where} is not a JSON object")
    missing = [k for k in CASE_KEYS if k not in case]
    if missing:
        raise SuiteError(f"{where}: missing {missing}")
    if not plain_file_name(case["name"]):
        raise SuiteError(f"{where}: name {case['name']!r} is not a plain file name")
    where = f"{where} ({case['name']})"
    for field in ("stage", "title"):
        if not isinstance(case[field], str):
            raise SuiteError(f"{where}: {field} must be a string")
    for field in ("inputs", "references", "outputs", "options", "sha256"):
        if not isinstance(case.get(field, {}), dict):
            raise SuiteError(f"{where}: {field} must be a JSON object")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in case.get("sha256", {}).items()):
        raise SuiteError(f"{where}: sha256 must map file names to hex digests")
    frames = case.get("frames")
    if frames is not None and not (
        isinstance(frames, list) and all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in frames)
    ):
        raise SuiteError(f"{where}: frames must be a list of frame counts")
    for field in ("inputs", "references"):
        for k, f in case[field].items():
            if not plain_file_name(f):
                raise SuiteError(f"{where}: {field}.{k} {f!r} is not a plain file name inside the case's folder")
    for precision in case["references"]:
        if precision not in PRECISIONS:
            raise SuiteError(f"{where}: reference precision {precision!r} is not one of {PRECISIONS}")
    if "float64" not in case["references"]:
        raise SuiteError(f"{where}: no float64 reference")
    for out, key in case["outputs"].items():
        if not (plain_file_name(out) and isinstance(key, str) and key):
            raise SuiteError(f"{where}: outputs must map plain names to reference keys, got {out!r}: {key!r}")
