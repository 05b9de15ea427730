"""The port author's commands: ``refimpl trace``, ``refimpl compare`` and ``refimpl golden``
(docs/port_authors.md).  ``refimpl.cli`` adds them with ``add_commands``."""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..io.files import (
    MAX_INPUT_BYTES,
    InputError,
    Signalled,
    load_npy_codes,
    parse_json,
    plain_file_name,
    read_limited,
    signals_raise,
    write_atomically,
)
from ..io.validate import count
from . import trace_files
from .compare import NOISE_SIZES, PRECISIONS, compare_traces, metadata_mismatches, prefix_hint, report_json
from .name_maps import load_map

__all__ = ["add_commands", "run_case", "run_cases", "read_cases"]

TRACE_EPILOG = """\
examples:
  refimpl trace codec-decode codes.npy -o decode.safetensors
  refimpl trace codec-encode speech.wav --model DIR -o encode.safetensors
  refimpl trace speaker me.wav --model Qwen3-TTS-12Hz-0.6B-Base -o speaker.safetensors
  refimpl trace say "Hello." --speaker vivian --seed 3 -o say.safetensors
  refimpl trace say "Hello." --speaker vivian --replay say.safetensors -o again.safetensors
  refimpl trace say "Hello." --greedy --force-codes port_codes.npy -o forced.safetensors
  refimpl trace design "Hi." --instruct "A calm voice." --dtype float64 -o design64.safetensors
  refimpl trace clone "Hi." --ref-audio me.wav --x-vector-only -o clone.safetensors

Keys are the official module paths (named_modules() of the official Qwen3TTSTokenizer.model or
Qwen3TTSModel.model), ':N' on every call of a module called more than once; 'refimpl.*' keys are
tensors no module outputs (prompt, masks, sampling scores, random draws...).  See docs/port_authors.md.
"""

# stage -> the embedded checkpoint it uses without --model (the same as the refimpl command of that stage)
EMBEDDED = Path(__file__).resolve().parents[1] / "data"
STAGE_MODELS = {
    "codec-decode": "default-customvoice",
    "codec-encode": "default-customvoice",
    "speaker": "default-base",
    "say": "default-customvoice",
    "design": "default-voicedesign",
    "clone": "default-base",
}


# ----------------------------------------------------------------------------- running one case


def read_codes(path) -> np.ndarray:
    """The codes array of a .npy file, checked like ``refimpl codec decode`` input (``files.load_npy_codes``),
    read up to ``files.MAX_INPUT_BYTES`` (a larger file, or an endless stream, is refused)."""
    return load_npy_codes(read_limited(path, MAX_INPUT_BYTES, f"codes file {path}"), str(path))


def read_mono(path) -> tuple:
    from ..io.audio import read_wav

    audio, sr = read_wav(path)
    return (audio.mean(axis=1) if audio.ndim == 2 else audio), sr


def trace_case(model, stage: str, inp, options: dict, dtype) -> "trace_files.Trace":
    """One traced run.  ``inp``: codes path / array (codec-decode), WAV path or (audio, sr) (codec-encode,
    speaker), text (say, design, clone); ``options``: the generation keywords of the Python API (for
    clone ``ref_audio`` may be a WAV path); ``random_draws`` replays recorded uniforms."""
    model = Path(model) if model else EMBEDDED / STAGE_MODELS[stage]
    if stage in ("codec-decode", "codec-encode"):
        from ..codec.speech_tokenizer import SpeechTokenizer

        tok = SpeechTokenizer.from_pretrained(model, dtype=dtype)
        if stage == "codec-decode":
            return trace_files.trace_codec_decode(
                tok,
                read_codes(inp) if isinstance(inp, (str, Path)) else np.asarray(inp),
                bool(options.get("attention")),
            )
        audio, sr = read_mono(inp) if isinstance(inp, (str, Path)) else inp
        return trace_files.trace_codec_encode(tok, audio, sr, bool(options.get("attention")))
    from ..tts.model import Qwen3TTS

    tts = Qwen3TTS.from_pretrained(model, dtype=dtype)
    if stage == "speaker":
        audio, sr = read_mono(inp) if isinstance(inp, (str, Path)) else inp
        return trace_files.trace_speaker(tts, audio, sr)
    options = dict(options)
    if stage == "say" and options.get("speaker") is None and tts.get_supported_speakers():
        options["speaker"] = tts.get_supported_speakers()[0]  # as ``refimpl say``: the first preset speaker
    if stage == "clone" and isinstance(options.get("ref_audio"), (str, Path)):
        options["ref_audio"] = read_mono(options["ref_audio"])
    return trace_files.trace_generation(tts, stage, text=inp, **options)


# ----------------------------------------------------------------------------- refimpl trace


# the options whose dest is the Python keyword, passed as given (not given: not passed, the model's default)
KEYWORD_FLAGS = (
    "seed",
    "max_new_tokens",
    "language",
    "repetition_penalty",
    "temperature",
    "top_k",
    "top_p",
    "subtalker_temperature",
    "subtalker_top_k",
    "subtalker_top_p",
    "eos_token_id",
)
# --text-feed: how the Talker reads the text (the generate methods' non_streaming_mode)
TEXT_FEEDS = {"streaming": False, "non-streaming": True}


def add_text_feed_option(parser) -> None:
    """--text-feed, for ``refimpl trace say|design|clone`` and ``refimpl say|design|clone`` alike."""
    parser.add_argument(
        "--text-feed",
        choices=list(TEXT_FEEDS),
        help="non-streaming: the whole text in the prompt; streaming: its first token in the prompt, the "
        "others one per generated frame (non_streaming_mode=False; default: the API's, non-streaming for "
        "say and design, streaming for clone)",
    )


def generation_options(args) -> dict:
    """The Python keywords of the generation options, the replayed draws, the forced codes and the mode's
    own options.  ``non_streaming_mode`` is always given (--text-feed, else the method's default), so that
    the trace's metadata say which prompt layout ran."""
    given = {k: getattr(args, k) for k in KEYWORD_FLAGS}
    opts = {k: v for k, v in given.items() if v is not None}
    if args.greedy:
        opts["do_sample"] = False
    subtalker_greedy = args.subtalker_greedy
    if subtalker_greedy is None and args.greedy:
        subtalker_greedy = True  # --greedy holds for the code predictor too, unless --[no-]subtalker-greedy
    if subtalker_greedy is not None:
        opts["subtalker_dosample"] = not subtalker_greedy
    feed = args.text_feed
    opts["non_streaming_mode"] = trace_files.text_feed_default(args.stage) if feed is None else TEXT_FEEDS[feed]
    if args.stage == "say":
        opts.update(speaker=args.speaker, instruct=args.instruct)
    elif args.stage == "design":
        opts["instruct"] = args.instruct
    elif args.stage == "clone":
        opts.update(ref_audio=args.ref_audio, ref_text=args.ref_text, x_vector_only_mode=args.x_vector_only)
    if args.force_codes:
        opts["forced_codes"] = read_forced_codes(args.force_codes)
    if args.replay:
        replayed = trace_files.load_trace(args.replay)
        check_replay(replayed, args.stage, args.input, opts, args.replay)
        opts["random_draws"] = replayed["refimpl.random_draws"]
    return opts


def read_forced_codes(path) -> list:
    """--force-codes: a codes .npy [T, 16], or a trace whose ``refimpl.codes.{i}`` are the codes."""
    if str(path).endswith(".npy"):
        return [read_codes(path)]
    trace = trace_files.load_trace(path)
    codes = [v for k, v in trace.items if k.startswith("refimpl.codes.")]
    if not codes:
        raise ValueError(f"{path} is neither a codes .npy nor a trace with refimpl.codes.* tensors")
    return codes


# what a replay must share with the recorded run (the seed does not matter: the draws replace it)
NOT_REPLAYED = ("seed", "random_draws", "progress", "forced_codes", "attention", "decoder")


def check_replay(replayed, stage: str, text: str, opts: dict, name) -> None:
    """--replay reproduces a run only with its text and options: refuse anything else, naming it."""
    meta = replayed.metadata
    if "refimpl.random_draws" not in replayed.keys:
        raise ValueError(f"{name} has no refimpl.random_draws (not a trace of a generation)")
    if replayed["refimpl.random_draws"].size == 0:
        raise ValueError(f"{name} is a greedy run: it consumed no random numbers, there is nothing to replay")
    if meta.get("stage") not in (None, stage):
        raise ValueError(f"{name} is a trace of {meta['stage']!r}, not of {stage!r}")
    recorded = {k: v for k, v in (meta.get("input") or {}).items() if k not in NOT_REPLAYED}
    now = {k: v for k, v in dict(opts, text=text).items() if k not in NOT_REPLAYED and not k.startswith("ref_audio")}
    recorded = {k: v for k, v in recorded.items() if not k.startswith("ref_audio") and v is not None}
    now = {k: v for k, v in now.items() if v is not None}
    if "speaker" not in now:  # the default speaker: the model's first, as recorded then
        recorded.pop("speaker", None)
    # a trace written before the metadata always held non_streaming_mode ran the method's default
    recorded.setdefault("non_streaming_mode", trace_files.text_feed_default(stage))
    differ = [
        f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}"
        for k in sorted(set(recorded) | set(now))
        if recorded.get(k) != now.get(k)
    ]
    if differ:
        raise ValueError(f"--replay {name}: the recorded run had other input or options ({'; '.join(differ)})")


def cmd_trace(args, say) -> int:
    if args.stage == "clone" and args.ref_text is None and not args.x_vector_only:
        raise ValueError("trace clone needs --ref-text or --x-vector-only")
    options = generation_options(args) if args.stage in ("say", "design", "clone") else {}
    if options:
        options["progress"] = say.progress  # a bar over the generated frames (none under -q)
        options["decoder"] = not args.no_decoder
    if getattr(args, "attention", False):
        options["attention"] = True
    t0 = time.perf_counter()
    trace = trace_case(args.model, args.stage, args.input, options, args.dtype_np)
    path = trace.save(args.output, args.format)
    modules = sum(not k.startswith("refimpl.") for k in trace.keys)
    say(
        f"traced {args.stage} in {time.perf_counter() - t0:.2f} s: {modules} module outputs and "
        f"{len(trace.keys) - modules} refimpl.* tensors -> {path}"
    )
    return 0


def add_trace_parser(sub, common) -> None:
    t = sub.add_parser(
        "trace",
        help="dump every module's output under the official module names",
        description="Run one stage and write every module output (official names, official "
        "layouts) with metadata to a safetensors (or npz) file.",
        epilog=TRACE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = t.add_subparsers(dest="stage", metavar="STAGE")
    gen = argparse.ArgumentParser(add_help=False)
    gen.add_argument("--language", metavar="L")
    gen.add_argument("--seed", type=count(0), default=0, help="random seed for sampling, >= 0 (default 0)")
    add_text_feed_option(gen)
    gen.add_argument(
        "--greedy",
        action="store_true",
        help="greedy decoding instead of sampling, for the Talker and the code predictor (do_sample=False; "
        "subtalker_dosample=False unless --no-subtalker-greedy)",
    )
    gen.add_argument("--max-new-tokens", type=count(1), metavar="N")
    gen.add_argument("--repetition-penalty", type=float, metavar="X")
    gen.add_argument("--temperature", type=float, metavar="T")
    gen.add_argument("--top-k", type=count(0), metavar="K")
    gen.add_argument("--top-p", type=float, metavar="P")
    gen.add_argument(
        "--subtalker-greedy",
        action=argparse.BooleanOptionalAction,
        help="the code predictor (codes 1..15) greedy, or with --no-subtalker-greedy sampling, whatever "
        "--greedy says (subtalker_dosample; default: as --greedy)",
    )
    gen.add_argument("--subtalker-temperature", type=float, metavar="T", help="the code predictor's temperature")
    gen.add_argument("--subtalker-top-k", type=count(0), metavar="K", help="the code predictor's top-k")
    gen.add_argument("--subtalker-top-p", type=float, metavar="P", help="the code predictor's top-p")
    gen.add_argument(
        "--eos-token-id",
        type=count(0),
        metavar="ID",
        help="the code 0 that ends the generation (default: the checkpoint's codec_eos_token_id)",
    )
    gen.add_argument(
        "--force-codes",
        metavar="CODES",
        help="teacher forcing: continue every step with these codes (a .npy [T, 16], or a trace's "
        "refimpl.codes.*) so that every step stays comparable with the port that made them",
    )
    gen.add_argument(
        "--replay",
        metavar="TRACE",
        help="take the random uniforms from this trace's "
        "refimpl.random_draws (reproduces its sampled codes; give the same options)",
    )
    gen.add_argument(
        "--no-decoder", action="store_true", help="leave out the codec decoder of the generated codes (decoder.*)"
    )
    attention = argparse.ArgumentParser(add_help=False)
    attention.add_argument(
        "--attention",
        action="store_true",
        help="also record each attention layer's post-RoPE q/k and probabilities (refimpl.*.q_rope, "
        ".k_rope, .attn_probs; large)",
    )
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("-o", "--output", required=True, metavar="TRACE")
    out.add_argument(
        "--format",
        choices=["safetensors", "npz"],
        default=None,
        help="file format (default: from the name, safetensors unless it ends in .npz)",
    )
    helps = {
        "codec-decode": ("CODES.npy", "codes [T, 16] -> waveform"),
        "codec-encode": ("WAV", "waveform -> codes"),
        "speaker": ("WAV", "waveform -> x-vector (a Base model)"),
        "say": ("TEXT", "CustomVoice generation"),
        "design": ("TEXT", "VoiceDesign generation"),
        "clone": ("TEXT", "Base voice-clone generation"),
    }
    for stage, (metavar, text) in helps.items():
        parents = [common, out] + ([gen] if stage in ("say", "design", "clone") else [])
        parents += [attention] if stage != "speaker" else []
        s = tsub.add_parser(stage, parents=parents, help=text, description=f"Trace {text}.")
        s.add_argument("input", metavar=metavar)
        if stage == "say":
            s.add_argument("--speaker", metavar="NAME", help="preset speaker (default: the first, as 'refimpl say')")
            s.add_argument("--instruct", metavar="TEXT")
        if stage == "design":
            s.add_argument("--instruct", required=True, metavar="TEXT")
        if stage == "clone":
            s.add_argument("--ref-audio", required=True, metavar="WAV")
            g = s.add_mutually_exclusive_group()
            g.add_argument("--ref-text", metavar="TEXT")
            g.add_argument("--x-vector-only", action="store_true")
        s.set_defaults(func=cmd_trace)
    t.set_defaults(func=lambda args, say: usage(t))


def usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2


# ----------------------------------------------------------------------------- refimpl compare


def cmd_compare(args, say) -> int:
    try:
        reference = trace_files.load_trace(args.reference)
        candidate = trace_files.load_trace(args.candidate)
        notes = []
        if args.map:
            reference, candidate, notes = load_map(args.map).apply(reference, candidate)
    except (OSError, ValueError, KeyError) as e:
        print(f"refimpl compare: unusable input: {e}", file=sys.stderr)
        return 2
    mismatches = metadata_mismatches(reference.metadata, candidate.metadata, args.precision)
    report = compare_traces(reference, candidate, args.precision, size=args.noise)
    report.notes[:0] = notes
    report.metadata_mismatches = mismatches
    if not report.rows:
        hint = prefix_hint(reference.keys, candidate.keys)
        print(
            "refimpl compare: unusable input: the two traces have no key in common" + (f" ({hint})" if hint else ""),
            file=sys.stderr,
        )
        return 2
    if report.covered < len(candidate.keys) // 2:
        hint = prefix_hint(reference.keys, report.missing_in_reference)
        if hint:
            report.notes.append(hint)
    if mismatches and not args.force:
        for line in report.header_lines():
            print(line, file=sys.stderr)
        print(
            "refimpl compare: unusable input: the traces are not runs of the same checkpoint, input and "
            "precision (--force compares them anyway)",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(report_json(report))
    else:
        print(report.format(failures=args.failures, context=args.context, list_missing=args.list_missing))
    return report.exit_status()


def add_compare_parser(sub) -> None:
    c = sub.add_parser(
        "compare",
        help="compare two traces key by key; find the first divergence",
        description="Compare CANDIDATE with REFERENCE tensor by tensor in execution order. "
        "Exit 0: every common tensor within tolerance; 1: something fails (the first failure in "
        "execution order is marked, a shape mismatch included; differing codes get their frame, codebook and "
        "verdict, a waveform its first divergent frame and sample); 2: unusable input (also: the metadata say "
        "another checkpoint, input or precision, unless --force; a differing max_new_tokens is only a note).",
    )
    c.add_argument("reference", metavar="REFERENCE")
    c.add_argument("candidate", metavar="CANDIDATE")
    c.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="what the candidate computes in (sets the tolerance; default float32)",
    )
    c.add_argument(
        "--noise",
        choices=list(NOISE_SIZES),
        default="tiny",
        help="whose measured official noise the tolerance allows: the tiny checkpoints' (default) or the "
        "released size's (use it for full-size checkpoints; docs/conformance.md)",
    )
    c.add_argument("--json", action="store_true", help="machine-readable report")
    c.add_argument(
        "--map", metavar="FILE", help="a name map (JSON or TOML) from the candidate's names to the official ones"
    )
    c.add_argument("--failures", action="store_true", help="show only the failing rows (and every differing code)")
    c.add_argument("--context", type=int, metavar="N", help="show the first failure with N rows either side")
    c.add_argument("--list-missing", action="store_true", help="list every missing key instead of a summary")
    c.add_argument("--force", action="store_true", help="compare even when the metadata say the runs differ")
    c.set_defaults(func=cmd_compare)


# ----------------------------------------------------------------------------- refimpl golden


# the keywords a case's options may hold, per stage (the Python keywords of the stage, as ``refimpl trace``)
CALL_OPTIONS = ("non_streaming_mode", "eos_token_id") + trace_files.GENERATION_KEYWORDS
CASE_OPTIONS = {
    "codec-decode": (),
    "codec-encode": (),
    "speaker": (),
    "say": ("speaker", "language", "instruct") + CALL_OPTIONS,
    "design": ("language", "instruct") + CALL_OPTIONS,
    "clone": ("language", "ref_audio", "ref_text", "x_vector_only_mode") + CALL_OPTIONS,
}
CASE_KEYS = ("name", "stage", "input", "options")
# the options' types (null, as in the API: the default, except for the booleans); ranges: SamplingSettings
TEXT_OPTIONS = ("speaker", "language", "instruct", "ref_text")
BOOLEAN_OPTIONS = ("x_vector_only_mode", "non_streaming_mode", "do_sample", "subtalker_dosample")
INTEGER_OPTIONS = {"seed": 0, "max_new_tokens": 1, "eos_token_id": 0, "top_k": 0, "subtalker_top_k": 0}
NUMBER_OPTIONS = ("repetition_penalty", "temperature", "top_p", "subtalker_temperature", "subtalker_top_p")
MAX_CODE = 2**63 - 1  # inline codes become int64; the codebook range is checked when the case runs


def read_cases(path) -> list:
    """CASES.jsonl: one JSON object per line: name, stage, input, options (optional).  Relative file
    paths (codes, WAV, ref_audio) are relative to the cases file.  Every case is checked here, before any
    runs (``check_case``); an error names the line and the case.  The file is read up to
    ``files.MAX_INPUT_BYTES``."""
    path = Path(path)
    data = read_limited(path, MAX_INPUT_BYTES, f"cases file {path}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cases file {path} is not valid UTF-8 text (byte {e.start})") from None
    cases, lines = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        case = parse_json(line, f"{path}:{n}: the line", unique_keys=True)
        case = check_case(case, f"{path}:{n}", path.parent)
        if case["name"] in lines:
            raise InputError(
                f"{path}:{n}: case {case['name']!r} has the name of the case on line {lines[case['name']]}"
            )
        lines[case["name"]] = n
        cases.append(case)
    if not cases:
        raise InputError(f"cases file {path} holds no case")
    return cases


def check_case(case, where: str, base: Path) -> dict:
    """One case, checked and normalised: an object with a plain-file-name ``name`` (it becomes
    OUTDIR/<name>.<format>), a known ``stage``, an ``input`` of the stage's kind (a path, inline codes,
    a text) and ``options`` among the stage's keywords with values of their types; the returned copy has
    paths made relative to ``base`` and ``options`` always present."""
    if not isinstance(case, dict):
        raise InputError(f"{where}: a case must be a JSON object, found a JSON {type(case).__name__}")
    name = case.get("name")
    if not plain_file_name(name):
        raise InputError(
            f"{where}: case name {name!r} must be a plain file name (1 to 200 characters, no '/', '\\', "
            "'..', absolute path or control character): it names the output file"
        )
    where = f"{where}: case {name!r}"
    unknown = [k for k in case if k not in CASE_KEYS]
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; a case has {list(CASE_KEYS)}")
    stage = case.get("stage")
    if stage not in STAGE_MODELS:
        raise InputError(f"{where}: stage must be one of {list(STAGE_MODELS)}, got {stage!r}")
    if "input" not in case:
        raise InputError(f"{where}: no input")
    options = case.get("options", {})
    if not isinstance(options, dict):
        raise InputError(f"{where}: options must be a JSON object, found a JSON {type(options).__name__}")
    bad = [k for k in options if k not in CASE_OPTIONS[stage]]
    if bad:
        allowed = list(CASE_OPTIONS[stage]) or "none"
        raise InputError(f"{where}: option(s) {bad} are not options of stage {stage} (allowed: {allowed})")
    checked = {"name": name, "stage": stage, "input": check_case_input(stage, case["input"], where, base)}
    checked["options"] = check_case_options(stage, dict(options), where, base)
    return checked


def check_case_input(stage: str, inp, where: str, base: Path):
    if stage == "codec-decode" and isinstance(inp, list):
        return inline_codes(inp, where)
    if not isinstance(inp, str) or not inp:
        kind = "a codes .npy path or inline codes [[...], ...]" if stage == "codec-decode" else None
        kind = kind or ("a WAV path" if stage in ("codec-encode", "speaker") else "the text (a non-empty string)")
        raise InputError(f"{where}: input must be {kind}, got {inp!r}")
    if stage == "codec-decode":
        path = base / inp
        try:
            read_codes(path)  # the same checks as 'refimpl trace codec-decode', before any runs
        except ValueError as e:
            raise InputError(f"{where}: {e}") from None
        return str(path)
    if stage in ("codec-encode", "speaker"):
        return existing_file(base / inp, where, "input")
    return inp


def inline_codes(rows, where: str) -> np.ndarray:
    """Codes written in the cases file: a non-empty list of equally long lists of JSON integers in
    [0, 2^63) (no floats, no booleans), as int64 [T, groups]."""
    if not rows or not all(isinstance(r, list) and r and len(r) == len(rows[0]) for r in rows):
        raise InputError(f"{where}: inline codes must be a non-empty list of equally long lists of integers")
    for t, row in enumerate(rows):
        for q, code in enumerate(row):
            if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= MAX_CODE:
                raise InputError(
                    f"{where}: inline code {code!r} at frame {t}, group {q} is not an integer in [0, 2^63)"
                )
    return np.asarray(rows, dtype=np.int64)


def existing_file(path: Path, where: str, what: str) -> str:
    if not path.is_file():
        raise InputError(f"{where}: {what} {path} is not a file" + ("" if path.exists() else " (it does not exist)"))
    return str(path)


def check_case_options(stage: str, options: dict, where: str, base: Path) -> dict:
    """The option values' types and ranges, and what the stage needs (say: a speaker; design: an
    instruct; clone: a ref_audio and a ref_text or x_vector_only_mode), as ``refimpl trace`` checks them."""
    from ..sampling import SamplingSettings

    for key in TEXT_OPTIONS:
        if key in options and not (options[key] is None or isinstance(options[key], str)):
            raise InputError(f"{where}: options.{key} must be a string, got {options[key]!r}")
    for key, minimum in INTEGER_OPTIONS.items():
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise InputError(f"{where}: options.{key} must be an integer >= {minimum}, got {value!r}")
    for key in NUMBER_OPTIONS:
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{where}: options.{key} must be a number, got {value!r}")
    for key in BOOLEAN_OPTIONS:
        if key in options and not isinstance(options[key], bool):
            raise InputError(f"{where}: options.{key} must be true or false, got {options[key]!r}")
    sampling = {k: v for k, v in options.items() if k in trace_files.GENERATION_KEYWORDS and k != "seed"}
    try:
        SamplingSettings(**sampling).validate()
    except ValueError as e:
        raise InputError(f"{where}: options: {e}") from None
    needs = {"say": "speaker", "design": "instruct"}.get(stage)
    if needs and not options.get(needs):
        raise InputError(f"{where}: a {stage} case needs options.{needs} (as 'refimpl trace {stage} --{needs}')")
    if stage == "clone":
        if not isinstance(options.get("ref_audio"), str):
            raise InputError(f"{where}: a clone case needs options.ref_audio, a WAV path")
        options["ref_audio"] = existing_file(base / options["ref_audio"], where, "options.ref_audio")
        if options.get("ref_text") is None and not options.get("x_vector_only_mode"):
            raise InputError(f"{where}: a clone case needs options.ref_text or options.x_vector_only_mode")
    return options


def run_case(model, case: dict, out_dir: str, fmt: str, dtype: str) -> dict:
    """Trace one case into ``out_dir/<name>.<fmt>``; returns its index entry (runs in a worker process).
    The name must be a plain file name, so the file lands in ``out_dir`` and nowhere else."""
    if not plain_file_name(case.get("name")):
        raise InputError(f"case name {case.get('name')!r} is not a plain file name")
    t0 = time.perf_counter()
    inp = case["input"]
    if case["stage"] == "codec-decode" and isinstance(inp, list):
        inp = inline_codes(inp, f"case {case['name']!r}")
    trace = trace_case(model, case["stage"], inp, case["options"], np.dtype(dtype).type)
    path = trace.save(Path(out_dir) / f"{case['name']}.{fmt}", fmt)
    return {
        "name": case["name"],
        "stage": case["stage"],
        "file": path.name,
        "tensors": len(trace.keys),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def run_case_or_fail(model, case: dict, out_dir: str, fmt: str, dtype: str) -> dict:
    """``run_case``, with a failure returned as an entry ``{name, stage, error, internal}`` (so that one
    bad case does not lose the others); ``internal`` marks an exception that is a bug, not bad input."""
    try:
        return run_case(model, case, out_dir, fmt, dtype)
    except Exception as e:  # reported by name, with the case; a bug stays marked as one
        internal = not isinstance(e, (ValueError, OSError, MemoryError))
        message = " ".join(str(e).split()) or type(e).__name__
        return {
            "name": case.get("name"),
            "stage": case.get("stage"),
            "error": f"{type(e).__name__}: {message}" if internal else message,
            "internal": internal,
        }


WORKER_DIED = (
    "its worker process died before the case finished (killed from outside, or by the system when memory ran "
    "out), and again when the case ran alone"
)


def run_cases(
    model,
    cases: list,
    out_dir,
    fmt: str = "safetensors",
    dtype: str = "float32",
    jobs: int = 1,
    dask_address: str | None = None,
    *,
    progress=None,
    note=None,
    run=None,
) -> list:
    """Every case in parallel: ``jobs`` local processes (concurrent.futures), or the workers of the Dask
    scheduler at ``dask_address`` (dask.distributed).  Returns the index entries in case order; a case
    that failed has ``error`` (and no file) instead of ``file``.
    ``progress``: None or ``progress(iterable, desc) -> iterable``, wrapped around the finished cases;
    ``note``: None or ``note(text)``, told when cases run again.  ``run`` (tests): what runs one case in a
    worker, ``run_case_or_fail`` by default.

    A worker process that dies (killed from outside, or by the system when memory runs out) loses the
    cases in flight: those and the cases not started yet run again, each alone in a fresh process, and a
    case whose process dies again is listed as failed (``WORKER_DIED``).  SIGTERM or SIGHUP (or Ctrl-C)
    to this process stops every worker first (a trace being written removes its temporary file), so that
    none goes on writing after the command has ended."""
    args = [(str(model) if model else None, case, str(out_dir), fmt, dtype) for case in cases]
    progress = progress or (lambda iterable, desc: iterable)
    run = run or run_case_or_fail
    if dask_address:
        try:
            from distributed import Client
        except ImportError:
            raise ValueError("--dask needs dask.distributed: pip install 'qwen3-tts-refimpl[dask]'") from None
        with Client(dask_address) as client:
            futures = [client.submit(run, *a, pure=False) for a in args]
            return [dask_result(f, case) for f, case in zip(progress(futures, "tracing cases"), cases)]
    if jobs <= 1:
        return list(progress((run(*a) for a in args), "tracing cases"))
    entries = in_processes(run, args, jobs, progress)
    lost = [i for i, e in enumerate(entries) if e is None]
    if lost and note:
        note(f"note: a worker process died; {len(lost)} case(s) it lost or had not started run again, each alone")
    for i in lost:  # alone, each in a fresh process: a case that kills its worker again is named
        entries[i] = in_processes(run, [args[i]], 1, lambda iterable, desc: iterable)[0] or failed_entry(
            cases[i], WORKER_DIED
        )
    return entries


def failed_entry(case: dict, error: str, internal: bool = False) -> dict:
    return {"name": case.get("name"), "stage": case.get("stage"), "error": error, "internal": internal}


def dask_result(future, case: dict) -> dict:
    """A Dask future's index entry; a worker that died (``KilledWorker``) or a lost connection fails the
    case, not the corpus."""
    try:
        return future.result()
    except Exception as e:  # raised by Dask about the worker, not by the case (run_case_or_fail catches those)
        return failed_entry(case, f"the Dask worker failed: {type(e).__name__}: {' '.join(str(e).split())}")


def in_processes(run, args: list, jobs: int, progress) -> list:
    """``run(*a)`` for every ``a`` of ``args`` in ``jobs`` spawned processes; the entries in order, None for
    a case whose worker process died first."""
    import gc
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    stopped, futures = None, []
    # spawned, not forked: a fork of a process whose Numba kernels already started OpenMP threads is unsafe
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            with signals_raise():
                futures = [pool.submit(run, *a) for a in args]
                for _ in progress(as_completed(futures), "tracing cases"):
                    pass
        except (Signalled, KeyboardInterrupt) as e:
            stop_workers(pool)
            stopped = e
    if stopped is not None:
        del pool, futures  # the pool's queues released now (their semaphores), not left to the tracker
        gc.collect()
        if isinstance(stopped, Signalled):  # the handlers are restored: the default action ends the process here
            signal.raise_signal(stopped.signum)
            raise InterruptedError(4, f"interrupted by signal {stopped.signum}") from None
        raise stopped
    return [None if isinstance(f.exception(), BrokenProcessPool) else f.result() for f in futures]


def stop_workers(pool) -> None:
    """End the worker processes of a ``ProcessPoolExecutor`` now (SIGTERM, then SIGKILL after 10 s) and wait
    for them: ``shutdown`` would wait for the cases they are running."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # CPython's pool keeps them there
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def cmd_golden(args, say) -> int:
    """Check every case first (nothing runs when one is bad), run them, and write OUTDIR/index.json
    (atomically) listing the cases done (``cases``) and those that failed (``failed``, with the error).
    Status 0: all done; 1: a case failed on bad input; 3: a case hit a bug."""
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    cases = read_cases(args.cases)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(f"cannot write the corpus to {out}: it exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    entries = run_cases(
        args.model,
        cases,
        out,
        args.format,
        args.dtype,
        args.jobs,
        args.dask,
        progress=functools.partial(say.progress, total=len(cases)),
        note=say,
    )
    done = [e for e in entries if "error" not in e]
    failed = [e for e in entries if "error" in e]
    index = {
        "model": str(args.model) if args.model else "(embedded default)",
        "dtype": args.dtype,
        "cases": done,
        "failed": failed,
    }
    write_atomically(out / "index.json", (json.dumps(index, indent=1) + "\n").encode("utf-8"))
    where = f"on the Dask cluster {args.dask}" if args.dask else f"in {args.jobs} process(es)"
    say(f"traced {len(done)} of {len(entries)} cases {where} in {time.perf_counter() - t0:.1f} s -> {out}/index.json")
    for entry in failed:
        print(f"refimpl golden: case {entry['name']!r} ({entry['stage']}) failed: {entry['error']}", file=sys.stderr)
    if any(e["internal"] for e in failed):
        return 3
    return 1 if failed else 0


def add_golden_parser(sub, common) -> None:
    g = sub.add_parser(
        "golden",
        parents=[common],
        help="trace many cases (CASES.jsonl) into a golden corpus",
        description="Trace every case of CASES.jsonl (one JSON object a line: name, stage, input, "
        "options) into OUTDIR/<name>.safetensors plus OUTDIR/index.json, in parallel processes "
        "or on a Dask cluster.",
    )
    g.add_argument("--cases", required=True, metavar="CASES.jsonl")
    g.add_argument("-o", "--output", required=True, metavar="OUTDIR")
    g.add_argument("--jobs", type=int, default=1, metavar="N", help="local worker processes (default 1)")
    g.add_argument("--dask", metavar="ADDRESS", help="run the cases on this Dask scheduler (tcp://host:8786)")
    g.add_argument("--format", choices=["safetensors", "npz"], default="safetensors")
    g.set_defaults(func=cmd_golden)


def add_commands(sub, common) -> None:
    """The port author's subcommands, for ``refimpl.cli.build_parser``."""
    from .conformance.commands import add_conformance_parser

    add_trace_parser(sub, common)
    add_compare_parser(sub)
    add_golden_parser(sub, common)
    add_conformance_parser(sub)
