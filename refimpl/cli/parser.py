"""The command line's arguments: every command, its options and its help (``argparse``)."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..backends import BACKENDS
from ..io.validate import count
from .commands import cmd_clone, cmd_codec_decode, cmd_codec_encode, cmd_design, cmd_info, cmd_say

EPILOG = """\
examples:
  refimpl say "Hello there." -o hello.wav
  refimpl say "你好" --speaker vivian --language chinese --seed 7 -o hi.wav
  refimpl say "Streaming, chunk by chunk." --stream -o s.wav
  echo "Played while it is made." | refimpl say - --stream -o - | aplay
  refimpl design "Good morning." --instruct "A calm, deep male voice." -o design.wav
  refimpl clone "Now in my voice." --ref-audio me.wav --ref-text "What I said in me.wav." -o clone.wav
  refimpl codec encode speech.wav -o codes.npy
  refimpl codec decode codes.npy -o back.wav --stream
  refimpl info --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice     # a repo id in the Hugging Face cache

Without --model, each command uses a tiny checkpoint embedded in the package: random weights in the
real layout, so the whole pipeline runs with no download, but the output is noise, not speech.

input and output:
  TEXT "-" reads the text from standard input (UTF-8), "-o -" writes the WAV (or the .npy of
  "codec encode") to standard output, and "codec encode -" / "codec decode -" read standard input.
  With --stream, "-o -" gets each chunk as it is decoded (a WAV header of unknown length, 0xFFFFFFFF,
  first), so that a player reading the pipe starts after the first chunk.
  Output files are written atomically: a failed write leaves an existing file as it was.
  Limits (text and audio lengths, sample rates, amplitudes): docs/limits.md.

exit status:
  0  success
  1  bad input or environment: one line "refimpl: error: ..." naming the problem
  2  usage error (unknown option, missing or malformed argument)
  3  internal error: a bug in refimpl (set REFIMPL_DEBUG=1 for the traceback and please report it)
  a closed output pipe (e.g. "| head -c 100") ends quietly with status 1; Ctrl-C ends with 130
"""


def build_parser() -> argparse.ArgumentParser:
    # trace, compare, golden: the port author's tools; --text-feed is theirs and the synthesis commands'
    from ..porting.commands import add_commands, add_text_feed_option

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--model",
        metavar="MODEL",
        help="a Qwen3-TTS checkpoint: a directory, an embedded "
        "model name (default, default-base, default-voicedesign) or a Hugging Face repo id in "
        "the local cache (Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice); default: the small random "
        "checkpoint embedded in the package",
    )
    common.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float32",
        help="compute precision (float64 is the high-precision oracle mode; default float32)",
    )
    common.add_argument(
        "-q", "--quiet", action="store_true", help="nothing on stderr but errors: no progress bars, notes or warnings"
    )
    common.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="which implementation of the primitives runs: numpy (the plain formulas), numba "
        "(the fast CPU twins) or cupy (a CUDA GPU; needs CuPy, see docs/backends.md); default: "
        "$REFIMPL_BACKEND, else numba for float32 and numpy for float64 (see 'refimpl info')",
    )

    synth = argparse.ArgumentParser(add_help=False)
    synth.add_argument(
        "-o", "--output", required=True, metavar="WAV", help="output WAV file (24 kHz mono); - for standard output"
    )
    synth.add_argument("--language", metavar="L", help="language name from the checkpoint (default: auto)")
    synth.add_argument("--seed", type=count(0), default=0, help="random seed for sampling, >= 0 (default 0)")
    synth.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    add_text_feed_option(synth)
    synth.add_argument(
        "--max-new-tokens",
        type=count(1),
        metavar="N",
        help="generation budget: at most N - 1 frames of 80 ms (the official rule: the "
        "code drawn at the last step is not expanded into a frame)",
    )
    synth.add_argument(
        "--stream",
        action="store_true",
        help="decode audio while the codes are generated (exact streaming decoder); "
        'with "-o -" each chunk is written as soon as it is decoded',
    )
    synth.add_argument(
        "--chunk-frames",
        type=count(1),
        metavar="N",
        help="frames per streamed chunk (default: 1, then 2, then 4 = 320 ms: the first audio after one frame)",
    )
    synth.add_argument("--float-wav", action="store_true", help="write 32-bit float WAV instead of 16-bit PCM")

    p = argparse.ArgumentParser(
        prog="refimpl",
        description="Qwen3-TTS reference implementation in NumPy: text to 24 kHz speech, and the 12 Hz speech codec.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"refimpl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "say",
        parents=[common, synth],
        help="speak TEXT with a preset speaker (CustomVoice model)",
        description="Speak TEXT with one of the checkpoint's preset speakers.",
    )
    s.add_argument("text", metavar="TEXT", help='the text to speak ("-": read it from standard input)')
    s.add_argument("--speaker", metavar="NAME", help="preset speaker (see 'refimpl info'; default: the first)")
    s.add_argument("--instruct", metavar="TEXT", help="a style instruction, e.g. 'Speak slowly and warmly.'")
    s.set_defaults(func=cmd_say)

    d = sub.add_parser(
        "design",
        parents=[common, synth],
        help="speak TEXT in a voice described by --instruct (VoiceDesign model)",
        description="Speak TEXT in a voice described in words.",
    )
    d.add_argument("text", metavar="TEXT", help='the text to speak ("-": read it from standard input)')
    d.add_argument("--instruct", required=True, metavar="TEXT", help="the voice description")
    d.set_defaults(func=cmd_design)

    c = sub.add_parser(
        "clone",
        parents=[common, synth],
        help="speak TEXT in the voice of --ref-audio (Base model)",
        description="Speak TEXT in the voice of a reference recording.",
    )
    c.add_argument("text", metavar="TEXT", help='the text to speak ("-": read it from standard input)')
    c.add_argument("--ref-audio", required=True, metavar="WAV", help="reference recording (any sample rate)")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--ref-text", metavar="TEXT", help="transcript of the reference (in-context cloning)")
    g.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding only")
    c.set_defaults(func=cmd_clone)

    codec = sub.add_parser(
        "codec",
        help="the 12 Hz speech codec: audio <-> codes",
        description="Encode audio to codes (16 per 80 ms frame) or decode codes to audio.",
    )
    csub = codec.add_subparsers(dest="codec_command", metavar="ACTION")
    ce = csub.add_parser(
        "encode",
        parents=[common],
        help="WAV -> codes.npy ([frames, 16] int64)",
        description="Encode a WAV file (any sample rate; stereo is mixed down) into the 12 Hz "
        "codes: an int64 array [frames, 16] saved as .npy, one frame per 80 ms.",
    )
    ce.add_argument("input", metavar="WAV", help='input WAV file ("-": standard input)')
    ce.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="NPY",
        help="output .npy file, written under exactly this name (no .npy is added); - for standard output",
    )
    ce.set_defaults(func=cmd_codec_encode)
    cd = csub.add_parser(
        "decode",
        parents=[common],
        help="codes.npy -> WAV",
        description="Decode codes [frames, 16] (a .npy file) into a 24 kHz mono WAV, like the "
        "official decode, or chunk by chunk with the exact streaming decoder (--stream).",
    )
    cd.add_argument("input", metavar="NPY", help='codes [frames, 16] as a .npy file ("-": standard input)')
    cd.add_argument("-o", "--output", required=True, metavar="WAV", help="output WAV file; - for standard output")
    cd.add_argument(
        "--stream",
        action="store_true",
        help='decode with the streaming decoder, chunk by chunk (with "-o -" each chunk is written at once)',
    )
    cd.add_argument("--chunk-frames", type=count(1), default=4, metavar="N", help="frames per chunk with --stream")
    cd.add_argument("--float-wav", action="store_true", help="write 32-bit float WAV instead of 16-bit PCM")
    cd.set_defaults(func=cmd_codec_decode)
    codec.set_defaults(func=lambda args, say: _usage(codec))

    i = sub.add_parser(
        "info",
        parents=[common],
        help="describe a checkpoint: type, size, speakers, languages",
        description="Describe a checkpoint: model type and size, speakers, languages, dtype, parameters and memory.",
    )
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_info)

    add_commands(sub, common)
    return p


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2
