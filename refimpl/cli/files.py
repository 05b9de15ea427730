"""The command line's inputs and outputs: a path, or "-" for standard input or output.

Outputs are checked before any work (``check_output_path``) and written atomically or to standard output
in full (``write_output``); streamed audio reaches standard output chunk by chunk (``AudioOutput``).
Inputs from standard input are read up to a limit, and refused at their first bytes when they are not
what the command reads (``input_bytes``)."""

from __future__ import annotations

import os
import sys

import numpy as np

from ..io.files import MAX_INPUT_BYTES, load_npy_codes, read_limited, write_atomically
from .output import CliError
from .streams import ClosedStream

STDIO = "-"  # as an input or output path: standard input / standard output
MAX_WAV_BYTES = 2**32 + 8  # the largest WAV file: RIFF sizes are 32-bit (a longer stream is refused)
MAX_TEXT_BYTES = 1 << 24  # 16 MiB of text on standard input, far more than a prompt of 32768 positions holds


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


def write_stdout(data: bytes) -> None:
    """Bytes to standard output, flushed: every byte, or an error (a short write, e.g. past a file-size
    limit, is not a success; a reader that has gone raises ``BrokenPipeError``, ended quietly by ``main``)."""
    try:
        written = sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise CliError(f"cannot write standard output: {e.strerror or e}") from None
    if written is not None and written != len(data):
        raise CliError(f"cannot write standard output: only {written} of {len(data)} bytes were written")


def write_output(path: str, data: bytes) -> None:
    """Bytes to a file (atomically) or, for "-", to standard output (``write_stdout``)."""
    if path == STDIO:
        write_stdout(data)
        return
    try:
        write_atomically(path, data)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def output_name(path: str) -> str:
    return "standard output" if path == STDIO else path


def write_audio(path: str, wav: np.ndarray, sr: int, float_wav: bool) -> None:
    from ..io.audio import wav_bytes

    write_output(path, wav_bytes(wav, sr, "float" if float_wav else "pcm16"))


class AudioOutput:
    """Where a streamed waveform goes, chunk by chunk (``write``, then ``close``).  Standard output gets
    each chunk as it comes: a WAV header of unknown length (``refimpl.io.audio.StreamedWav``) with the
    first, then each chunk's samples, flushed, so that a player at the other end of the pipe starts after
    the first chunk.  A file gets the whole WAV at the end, atomically, as without streaming: a failed
    run never leaves half a file in place of a good one."""

    def __init__(self, path: str, sample_rate: int, float_wav: bool):
        from ..io.audio import StreamedWav

        self.path, self.sample_rate, self.float_wav = path, sample_rate, float_wav
        self.streamed = StreamedWav(sample_rate, "float" if float_wav else "pcm16") if path == STDIO else None
        self.chunks: list[np.ndarray] = []  # collected for a file
        self.header_written = False
        self.samples = 0

    def write(self, chunk: np.ndarray) -> None:
        self.samples += chunk.shape[0]
        if self.streamed is None:
            self.chunks.append(chunk)
            return
        data = self.streamed.samples(chunk)
        write_stdout(data if self.header_written else self.streamed.header + data)
        self.header_written = True

    def close(self) -> None:
        if self.streamed is None:
            wav = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
            write_audio(self.path, wav, self.sample_rate, self.float_wav)
            return
        if not self.header_written:  # no chunk came: the header alone, an empty WAV
            write_stdout(self.streamed.header)
            self.header_written = True
        self.streamed.finish()


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


def read_codes(path: str) -> np.ndarray:
    """A .npy array of codes (from a file or, for "-", standard input); anything else names the file."""
    data = input_bytes(path, "a .npy file of codes", b"\x93NUMPY")
    if data is not None:
        return load_npy_codes(data, "standard input")
    return load_npy_codes(read_limited(path, MAX_INPUT_BYTES, f"codes file {path}", CliError), path)
