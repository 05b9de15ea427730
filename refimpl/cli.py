"""The ``refimpl`` command line (also ``python -m refimpl``).

Every command runs without ``--model`` on the small checkpoints embedded in the package (random
weights: they show the pipeline working, they do not speak).  Point ``--model`` at a released
Qwen3-TTS checkpoint directory for real speech.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import __version__
from .backends import BACKENDS, active_backend, use_backend
from .environment import check_switches, switch
from .io.files import MAX_INPUT_BYTES, load_npy_codes, read_limited, user_cache_dir, write_atomically
from .io.hub import DATA, KIND_TO_EMBEDDED, embedded_model, resolve_model
from .io.validate import count

# model kind a command needs -> the embedded tiny checkpoint of that kind (refimpl/data/)
DEFAULT_MODELS = {kind: embedded_model(kind) for kind in KIND_TO_EMBEDDED}
RELEASED_HINT = (
    "pass --model with a released checkpoint for real speech: a directory, or a repo id already "
    "in the Hugging Face cache (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, -Base, -1.7B-VoiceDesign)"
)

EPILOG = """\
examples:
  refimpl say "Hello there." -o hello.wav
  refimpl say "你好" --speaker vivian --language chinese --seed 7 -o hi.wav
  refimpl say "Streaming, chunk by chunk." --stream -o s.wav
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
  Output files are written atomically: a failed write leaves an existing file as it was.
  Limits (text and audio lengths, sample rates, amplitudes): docs/limits.md.

exit status:
  0  success
  1  bad input or environment: one line "refimpl: error: ..." naming the problem
  2  usage error (unknown option, missing or malformed argument)
  3  internal error: a bug in refimpl (set REFIMPL_DEBUG=1 for the traceback and please report it)
  a closed output pipe (e.g. "| head -c 100") ends quietly with status 1; Ctrl-C ends with 130
"""

STDIO = "-"  # as an input or output path: standard input / standard output
MAX_WAV_BYTES = 2**32 + 8  # the largest WAV file: RIFF sizes are 32-bit (a longer stream is refused)
MAX_TEXT_BYTES = 1 << 24  # 16 MiB of text on standard input, far more than a prompt of 32768 positions holds


class CliError(Exception):
    """An error reported as one line on stderr, with exit status 1."""


# ----------------------------------------------------------------------------- output helpers


# progress bars: redrawn in place (at most 10 times a second) on a terminal; in a log (stderr is a file or
# a pipe) one plain line at the start, then at most one every LOG_INTERVAL_S seconds, and one at the end
LOG_INTERVAL_S = 10.0
UNITS = {
    "generating frames": " frames",
    "decoding 300-frame chunks": " chunks",
    "decoding": " frames",
    "streamed audio": " s",
    "tracing cases": " cases",
}


class LogLines:
    """A file for tqdm when stderr is not a terminal: each redraw becomes one line (no carriage return),
    so a log reads as a few plain lines instead of one line of overwritten updates."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def stderr_is_a_terminal() -> bool:
    """stderr is a terminal with a width (a pseudo-terminal of width 0 would show empty bars)."""
    try:
        return sys.stderr.isatty() and os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


class Reporter:
    """Notes, warnings and progress bars on stderr, all silenced by -q."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, message: str, end: str = "\n") -> None:
        if not self.quiet:
            print(message, file=sys.stderr, end=end, flush=True)

    def bar(self, iterable=None, desc: str = "", total=None):
        """A ``tqdm`` progress bar on stderr (None under -q): in place on a terminal, sparse lines in a log."""
        if self.quiet:
            return None
        from tqdm import tqdm

        terminal = stderr_is_a_terminal()
        return tqdm(
            iterable,
            desc=desc,
            total=total,
            unit=UNITS.get(desc, " steps"),
            leave=True,
            file=sys.stderr if terminal else LogLines(sys.stderr),
            dynamic_ncols=terminal,
            mininterval=0.1 if terminal else LOG_INTERVAL_S,
            maxinterval=LOG_INTERVAL_S,
        )

    def progress(self, iterable, desc: str, total=None):
        """The library's ``progress=`` hook (``progress(iterable, desc) -> iterable``): a bar, or the
        iterable itself under -q."""
        return iterable if self.quiet else self.bar(iterable, desc, total)

    def warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """``warnings.showwarning`` for the command line: one line "warning: ..." (NumPy's and ours)."""
        self(f"warning: {message}")


# The embedded models are for trying the pipeline; the note that they speak noise is shown once per user
# (a marker file in the user's cache directory), always by 'refimpl info', never under -q.
EMBEDDED_NOTE = "note: the embedded default model has random weights: noise, not speech (see 'refimpl info')"
NOTE_MARKER = "embedded-model-note-shown"


def first_time_for_this_user(marker: str) -> bool:
    """True unless the marker file exists in the user cache directory; creates it.  Never fails: when
    the cache cannot be written, every run is the first."""
    directory = user_cache_dir()
    if directory is None:
        return True
    try:
        if (directory / marker).exists():
            return False
        directory.mkdir(parents=True, exist_ok=True)
        (directory / marker).touch()
    except OSError:
        pass
    return True


def embedded_model_note(say: Reporter, always: bool = False) -> None:
    """EMBEDDED_NOTE on stderr: the first time for this user (``always``: every time); never under -q."""
    if not say.quiet and (always or first_time_for_this_user(NOTE_MARKER)):
        say(EMBEDDED_NOTE)


def model_dir(args, kind: str, say: Reporter) -> Path:
    """The model directory of a command: ``--model`` is a directory, an embedded model name ("default" is the
    embedded model of the command's ``kind``, or "default-base", ...) or a Hugging Face repo id found in the
    local cache (``refimpl.io.hub.resolve_model``); without ``--model``, ``DEFAULT_MODELS[kind]``."""
    path = resolve_model(args.model, kind) if args.model else DEFAULT_MODELS[kind]
    if path.resolve().parent == DATA:
        embedded_model_note(say)
    return path


def check_output_path(path: str) -> None:
    """Refuse an output path that cannot be written before any work is done."""
    if path == STDIO:
        if isinstance(getattr(sys.stdout, "buffer", None), ClosedStream):
            raise CliError("cannot write standard output: it is closed")
        return
    if os.path.isdir(path):
        raise CliError(f"cannot write {path}: it is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) and not (os.path.exists(path) and not os.path.isfile(path)):
        raise CliError(f"cannot write {path}: directory {parent} is not writable")


def write_output(path: str, data: bytes) -> None:
    """Bytes to a file (atomically) or, for "-", to standard output: every byte, or an error (a short
    write, e.g. past a file-size limit, is not a success)."""
    if path == STDIO:
        try:
            written = sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise CliError(f"cannot write standard output: {e.strerror or e}") from None
        if written is not None and written != len(data):
            raise CliError(f"cannot write standard output: only {written} of {len(data)} bytes were written")
        return
    try:
        write_atomically(path, data)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def output_name(path: str) -> str:
    return "standard output" if path == STDIO else path


def write_audio(path: str, wav: np.ndarray, sr: int, float_wav: bool) -> None:
    from .io.audio import wav_bytes

    write_output(path, wav_bytes(wav, sr, "float" if float_wav else "pcm16"))


def read_text_argument(text: str) -> str:
    """TEXT as given, or for "-" standard input decoded as UTF-8 (one trailing newline dropped), read up to
    ``files.MAX_INPUT_BYTES``."""
    if text != STDIO:
        return text
    raw = read_limited(sys.stdin.buffer, MAX_TEXT_BYTES, "standard input", CliError)
    try:
        return raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as e:
        raise CliError(
            f"standard input is not valid UTF-8 text (byte {e.start}: {raw[e.start : e.start + 1]!r})"
        ) from None


def input_bytes(path: str, what: str, magic: bytes, limit: int = MAX_INPUT_BYTES) -> bytes | None:
    """Standard input's bytes for "-" (at most ``limit``: more, from an endless stream, is an error), else
    None (the caller reads the file).  Input that does not start with ``magic`` is not read further: its
    first bytes go to the parser, which names the problem (so ``/dev/zero`` is refused at once)."""
    if path != STDIO:
        return None
    head = b""
    while len(head) < len(magic):
        piece = sys.stdin.buffer.read(len(magic) - len(head))
        if not piece:
            break
        head += piece
    if head != magic:
        data = head
    else:
        data = head + read_limited(sys.stdin.buffer, limit - len(head), "standard input", CliError)
    if not data:
        raise CliError(f"standard input is empty: expected {what}")
    return data


def load_tts(path: Path, dtype):
    from .tts.model import Qwen3TTS

    return Qwen3TTS.from_pretrained(path, dtype=dtype)


def generation_kwargs(args) -> dict:
    from .porting.commands import TEXT_FEEDS

    kw = {"seed": args.seed}
    if args.greedy:
        kw.update(do_sample=False, subtalker_dosample=False)
    if args.max_new_tokens is not None:
        kw["max_new_tokens"] = args.max_new_tokens
    if args.text_feed is not None:
        kw["non_streaming_mode"] = TEXT_FEEDS[args.text_feed]
    return kw


def run_synthesis(args, say: Reporter, kind: str, method: str, make_call) -> int:
    """Shared body of say / design / clone: load, generate (or stream) with ``make_call(tts)`` as the
    arguments, with progress bars, and write the WAV."""
    path = model_dir(args, kind, say)
    t0 = time.perf_counter()
    tts = load_tts(path, args.dtype_np)
    say(f"loaded {path} in {time.perf_counter() - t0:.1f} s")
    call = dict(make_call(tts), **generation_kwargs(args))
    if "text" in call:
        call["text"] = read_text_argument(call["text"])
    t0 = time.perf_counter()
    if args.stream:
        chunks = getattr(tts, "stream_" + method)(chunk_frames=args.chunk_frames, **call)
        wav = collect_stream(chunks, tts.sample_rate, say)
        sr = tts.sample_rate
    else:
        wavs, sr, codes = getattr(tts, "generate_" + method)(return_codes=True, progress=say.progress, **call)
        wav = wavs[0]
    elapsed = time.perf_counter() - t0
    seconds = wav.shape[0] / sr
    rtf = f", real-time factor {elapsed / seconds:.2f}" if seconds > 0 else ""
    say(f"{seconds:.2f} s of audio in {elapsed:.2f} s{rtf}")
    write_audio(args.output, wav, sr, args.float_wav)
    say(f"wrote {output_name(args.output)}")
    return 0


def collect_stream(chunks, sample_rate: int, say: Reporter) -> np.ndarray:
    """The streamed waveform chunks concatenated, with a bar counting seconds of audio (and the time to the
    first chunk, the latency a listener would wait)."""
    pieces, t0 = [], time.perf_counter()
    bar = say.bar(desc="streamed audio")
    for chunk in chunks:
        if not pieces and bar is not None:
            bar.set_postfix_str(f"first chunk after {time.perf_counter() - t0:.2f} s", refresh=False)
        pieces.append(chunk)
        if bar is not None:
            bar.update(round(chunk.shape[0] / sample_rate, 2))
    if bar is not None:
        bar.close()
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


# ----------------------------------------------------------------------------- commands


def cmd_say(args, say: Reporter) -> int:
    def call(tts):
        speaker = args.speaker
        if speaker is None:
            speakers = tts.get_supported_speakers() or []
            if not speakers:
                raise CliError(
                    "this checkpoint has no preset speakers: 'say' needs a CustomVoice checkpoint "
                    "(use 'design' or 'clone' for the other model types)"
                )
            speaker = sorted(speakers)[0]
            say(f"speaker: {speaker} (choose with --speaker; see 'refimpl info')")
        if args.instruct and tts.tts_model_size is not None and tts.tts_model_size in "0b6":
            say("note: --instruct is ignored by 0.6B CustomVoice models (as by the official)")
        return dict(text=args.text, speaker=speaker, language=args.language, instruct=args.instruct)

    return run_synthesis(args, say, "custom_voice", "custom_voice", call)


def cmd_design(args, say: Reporter) -> int:
    return run_synthesis(
        args,
        say,
        "voice_design",
        "voice_design",
        lambda tts: dict(text=args.text, instruct=args.instruct, language=args.language),
    )


def cmd_clone(args, say: Reporter) -> int:
    from .io.audio import read_wav

    if args.ref_text is None and not args.x_vector_only:
        raise CliError("clone needs --ref-text (the transcript of --ref-audio) or --x-vector-only")
    audio, sr = read_wav(args.ref_audio)
    if audio.ndim == 2:
        say(f"note: {audio.shape[1]}-channel reference audio mixed down to mono")
        audio = audio.mean(axis=1)
    return run_synthesis(
        args,
        say,
        "base",
        "voice_clone",
        lambda tts: dict(
            text=args.text,
            language=args.language,
            ref_audio=(audio, sr),
            ref_text=args.ref_text,
            x_vector_only_mode=args.x_vector_only,
        ),
    )


def cmd_codec_encode(args, say: Reporter) -> int:
    from .codec.speech_tokenizer import SpeechTokenizer
    from .io.audio import read_wav, read_wav_bytes

    data = input_bytes(args.input, "a WAV file", b"RIFF", MAX_WAV_BYTES)
    audio, sr = read_wav(args.input) if data is None else read_wav_bytes(data, "standard input")
    if audio.ndim == 2:
        say(f"note: {audio.shape[1]}-channel audio mixed down to mono")
        audio = audio.mean(axis=1)
    tok = SpeechTokenizer.from_pretrained(model_dir(args, "custom_voice", say), dtype=args.dtype_np)
    if sr != tok.input_sample_rate:
        say(f"note: resampling {sr} Hz to {tok.input_sample_rate} Hz")
    t0 = time.perf_counter()
    say(f"encoding {audio.shape[0] / sr:.2f} s of audio (one pass: no progress bar)")
    codes = tok.encode(audio, sr=sr)
    say(
        f"encoded {audio.shape[0] / sr:.2f} s into {codes.shape[0]} frames x {codes.shape[1]} codes "
        f"in {time.perf_counter() - t0:.2f} s"
    )
    buffer = io.BytesIO()
    np.save(buffer, codes)
    write_output(args.output, buffer.getvalue())
    say(f"wrote {output_name(args.output)}")
    return 0


def read_codes(path: str) -> np.ndarray:
    """A .npy array of codes (from a file or, for "-", standard input); anything else names the file."""
    data = input_bytes(path, "a .npy file of codes", b"\x93NUMPY")
    if data is not None:
        return load_npy_codes(data, "standard input")
    return load_npy_codes(read_limited(path, MAX_INPUT_BYTES, f"codes file {path}", CliError), path)


def cmd_codec_decode(args, say: Reporter) -> int:
    from .codec.speech_tokenizer import SpeechTokenizer

    codes = read_codes(args.input)
    tok = SpeechTokenizer.from_pretrained(model_dir(args, "custom_voice", say), dtype=args.dtype_np)
    t0 = time.perf_counter()
    if args.stream:
        stream, pieces = tok.stream(), []
        bar = say.bar(desc="decoding", total=len(codes))
        for start in range(0, len(codes), args.chunk_frames):
            piece = codes[start : start + args.chunk_frames]
            pieces.append(stream.push(piece))
            if bar is not None:
                bar.update(len(piece))
        if bar is not None:
            bar.close()
        wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if len(codes) == 0:
            tok.decode_full(codes)  # validates the (empty) array's shape
    else:
        wav = tok.decode(codes, progress=say.progress)
    elapsed = time.perf_counter() - t0
    seconds = wav.shape[0] / tok.sample_rate
    say(
        f"{seconds:.2f} s of audio in {elapsed:.2f} s"
        + (f", real-time factor {elapsed / seconds:.2f}" if seconds else "")
    )
    write_audio(args.output, wav, tok.sample_rate, args.float_wav)
    say(f"wrote {output_name(args.output)}")
    return 0


def cmd_info(args, say: Reporter) -> int:
    from .io.model_info import describe_model

    path = model_dir(args, "custom_voice", Reporter(quiet=True))
    if path.resolve().parent == DATA:  # 'refimpl info' always says what the embedded model is
        embedded_model_note(say, always=True)
        say(f"note: {RELEASED_HINT}")
    info = describe_model(path, args.dtype_np)
    backend, why = active_backend()
    info["backend"] = f"{backend} ({why})"
    if args.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(map(str, value)) if value else "(none)"
        print(f"{key:<{width}}  {value}")
    return 0


# ----------------------------------------------------------------------------- argument parsing


def build_parser() -> argparse.ArgumentParser:
    # trace, compare, golden: the port author's tools; --text-feed is theirs and the synthesis commands'
    from .porting.commands import add_commands, add_text_feed_option

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
        "--stream", action="store_true", help="decode audio while the codes are generated (exact streaming decoder)"
    )
    synth.add_argument(
        "--chunk-frames", type=count(1), default=4, metavar="N", help="frames per streamed chunk (default 4 = 320 ms)"
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
    cd.add_argument("--stream", action="store_true", help="decode with the streaming decoder, chunk by chunk")
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


def one_line(e: BaseException) -> str:
    return " ".join(line.strip() for line in str(e).strip().splitlines()) or type(e).__name__


def quiet_after_closed_pipe() -> int:
    """Standard output was closed by its reader (``| head``): end without a message or a traceback (and
    without the interpreter's own complaint when it flushes standard output at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 1


class ClosedStream(io.RawIOBase):
    """Stands in for a standard stream that was closed when refimpl started: reading or writing it is an
    error naming it (its file descriptor is held open on /dev/null, so that no file opened later takes it)."""

    def __init__(self, name: str):
        super().__init__()
        self.stream_name = name

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer):
        raise OSError(f"cannot read standard {self.stream_name}: it is closed")

    def write(self, data):
        raise OSError(f"cannot write standard {self.stream_name}: it is closed")


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def settle_standard_streams() -> None:
    """What a careful Unix tool does before any work: a closed stdin, stdout or stderr gets /dev/null on its
    descriptor (so that no output file is opened as descriptor 1); reading a closed stdin or writing a
    closed stdout is then an error (``ClosedStream``), while notes for a closed stderr are dropped (never
    sent to stdout).  An unbuffered stdout (``PYTHONUNBUFFERED``, ``-u``) gets a buffer again: a raw write
    may write only part of its bytes, and the buffered writer writes the rest or raises."""
    for fd, name, attribute in ((0, "input", "stdin"), (1, "output", "stdout"), (2, "error", "stderr")):
        if getattr(sys, attribute) is not None and fd_is_open(fd):
            continue
        if not fd_is_open(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if attribute == "stderr":
            sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
        else:
            setattr(sys, attribute, io.TextIOWrapper(ClosedStream(name), encoding="utf-8", write_through=True))
    raw = getattr(sys.stdout, "buffer", None)
    if sys.stdout is sys.__stdout__ and isinstance(raw, io.FileIO):  # the interpreter's own, unbuffered
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding=sys.stdout.encoding, errors=sys.stdout.errors, line_buffering=True
        )


def debug_requested() -> bool:
    """REFIMPL_DEBUG=1: an internal error shows its traceback (a value that is not a switch was refused at
    the start)."""
    try:
        return switch("REFIMPL_DEBUG")
    except ValueError:
        return False


def main(argv=None) -> int:
    settle_standard_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    say = Reporter(getattr(args, "quiet", False))
    args.dtype_np = np.float64 if getattr(args, "dtype", "float32") == "float64" else np.float32
    try:
        check_switches()  # a REFIMPL_ switch that is not 1 or 0: one error before any work
        # golden's and conformance make's -o name a directory
        if getattr(args, "output", None) is not None and args.command not in ("golden", "conformance"):
            check_output_path(args.output)
        with (
            warnings.catch_warnings(),
            use_backend(args.backend, "--backend") if getattr(args, "backend", None) else contextlib.nullcontext(),
        ):
            if say.quiet:
                warnings.simplefilter("ignore")
            else:
                warnings.showwarning = say.warning
            status = args.func(args, say)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        return quiet_after_closed_pipe()
    except (CliError, ValueError, OSError) as e:  # CheckpointError and NonFiniteError are ValueErrors
        print(f"refimpl: error: {one_line(e)}", file=sys.stderr)
        return 1
    except MemoryError:
        print("refimpl: error: out of memory (a shorter input needs less; see docs/limits.md)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("refimpl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not a user error: still one line, unless REFIMPL_DEBUG asks for the traceback
        if debug_requested():
            raise
        print(
            f"refimpl: internal error: {type(e).__name__}: {e} (set REFIMPL_DEBUG=1 for the traceback; "
            f"please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
