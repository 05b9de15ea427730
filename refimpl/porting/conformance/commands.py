"""``refimpl conformance make`` and ``refimpl conformance grade`` (docs/conformance.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ...backends import BACKENDS
from ..compare import NOISE_SIZES, PRECISIONS

__all__ = ["add_conformance_parser"]

EPILOG = """\
examples:
  refimpl conformance make -o suite                         # the tiny embedded checkpoints, in seconds
  refimpl conformance make -o suite --model DIR-CustomVoice --model DIR-Base --model DIR-VoiceDesign
  refimpl conformance grade suite results --precision float32 --html report.html
  refimpl conformance grade suite results --behaviour decode=exact --json

RESULTS holds one folder per case (RESULTS/<case>/codes.npy, waveform.npy, ... or any official key), or
RESULTS/<case>.safetensors; suite/README.md says what each case asks for.
"""


def cmd_make(args, say) -> int:
    from .suite import make_suite

    t0 = time.perf_counter()
    manifest = make_suite(args.output, args.model, progress=say.progress, noise=args.noise)
    say(
        f"made conformance suite version {manifest['version']}: {len(manifest['cases'])} cases in "
        f"{time.perf_counter() - t0:.1f} s -> {args.output}/manifest.json (README.md says what to run)"
    )
    return 0


def cmd_grade(args, say) -> int:
    from .grade import exit_status, format_report, grade_suite

    try:
        report = grade_suite(args.suite, args.results, args.precision, args.map, args.behaviour)
    except (OSError, ValueError) as e:  # the suite or the results folder as a whole
        print(f"refimpl conformance grade: unusable input: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.html:
        from .report_html import write_html

        write_html(report, args.html)
    if args.json:
        print(json.dumps(json_safe(report), indent=1))
    else:
        print(format_report(report))
        if args.html:
            say(f"report -> {args.html}")
    return exit_status(report)


def json_safe(value):
    """NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def behaviour(text: str) -> str:
    from .suite import BEHAVIOURS

    name, _, value = text.partition("=")
    if name not in BEHAVIOURS or value not in BEHAVIOURS[name]:
        known = "; ".join(f"{n}={'|'.join(o)}" for n, o in BEHAVIOURS.items())
        raise argparse.ArgumentTypeError(f"{text!r} is not a known behaviour ({known})")
    return text


def add_conformance_parser(sub) -> None:
    c = sub.add_parser(
        "conformance",
        help="make a conformance suite, or grade a port's outputs against one",
        description="A versioned, port-neutral suite of cases with reference traces (make), and a report "
        "card of a port's outputs against it (grade).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = c.add_subparsers(dest="conformance_command", metavar="COMMAND")
    m = csub.add_parser(
        "make",
        help="write the suite: inputs, float64 and float32 references, manifest, README",
        description="Write a conformance suite to OUTDIR (absent, empty, or a suite left unfinished, which is "
        "resumed): every case in float64 and float32.",
    )
    m.add_argument("-o", "--output", required=True, metavar="OUTDIR")
    m.add_argument("-q", "--quiet", action="store_true", help="nothing on stderr but errors")
    m.add_argument("--backend", choices=BACKENDS, default=None, help="as for the other commands (refimpl info)")
    m.add_argument(
        "--noise",
        choices=list(NOISE_SIZES),
        default=None,
        help="whose measured official float32 noise the tolerances allow: tiny (default for the embedded "
        "checkpoints) or released (default with --model)",
    )
    m.add_argument(
        "--model",
        action="append",
        metavar="DIR",
        help="a checkpoint (CustomVoice, Base or VoiceDesign; repeat for each); default: the tiny embedded ones",
    )
    m.set_defaults(func=cmd_make)
    g = csub.add_parser(
        "grade",
        help="grade a port's outputs: the report card",
        description="Grade RESULTS (one folder per case) against SUITE. Exit 0: every case run passes; "
        "1: a case fails; 2: unusable input (the suite, the results, or a case's results).",
    )
    g.add_argument("suite", metavar="SUITE")
    g.add_argument("results", metavar="RESULTS")
    g.add_argument("--precision", choices=PRECISIONS, default="float32", help="what the port computes in")
    g.add_argument("--map", metavar="FILE", help="a name map from the port's names to the official ones")
    g.add_argument(
        "--behaviour",
        action="append",
        type=behaviour,
        metavar="NAME=CHOICE",
        help="an official behaviour the port chose differently: length=natural, decode=exact",
    )
    g.add_argument("--json", action="store_true", help="the report as JSON")
    g.add_argument("--html", metavar="REPORT.html", help="also write the report as one self-contained HTML file")
    g.set_defaults(func=cmd_grade)
    c.set_defaults(func=lambda args, say: usage(c))


def usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2
