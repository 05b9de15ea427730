"""The port author's commands: ``refimpl trace``, ``refimpl compare`` and ``refimpl golden``
(docs/port_authors.md).  ``refimpl.cli`` adds them with ``add_commands``.  What a traced case is, the
cases file and the parallel runs are ``golden_cases``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..io.files import InputError
from ..io.validate import count
from . import trace_files
from .compare import NOISE_SIZES, PRECISIONS, compare_traces, metadata_mismatches, prefix_hint, report_json
from .golden_cases import make_corpus, read_cases, read_codes, run_case, run_cases, trace_case
from .name_maps import load_map

# run_case, run_cases and read_cases: importable from here as before (their home is golden_cases)
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


def cmd_golden(args, say) -> int:
    """Check every case first (nothing runs when one is bad), run those not already done in OUTDIR
    (``make_corpus``: resumable), and write OUTDIR/index.json (atomically) listing the cases done
    (``cases``) and those that failed (``failed``, with the error).
    Status 0: all done; 1: a case failed on bad input; 3: a case hit a bug."""
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    cases = read_cases(args.cases)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(f"cannot write the corpus to {out}: it exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index = make_corpus(
        args.model, cases, out, args.format, args.dtype, args.jobs, args.dask, progress=say.progress, note=say
    )
    done, failed = index["cases"], index["failed"]
    where = f"on the Dask cluster {args.dask}" if args.dask else f"in {args.jobs} process(es)"
    say(f"traced {len(done)} of {len(cases)} cases {where} in {time.perf_counter() - t0:.1f} s -> {out}/index.json")
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
    """The port author's subcommands, for ``refimpl.cli.parser.build_parser``."""
    from .conformance.commands import add_conformance_parser

    add_trace_parser(sub, common)
    add_compare_parser(sub)
    add_golden_parser(sub, common)
    add_conformance_parser(sub)
