"""``--stream -o -`` reaches the listener: each chunk goes to standard output as it is decoded (a WAV header
of unknown length first), read here from the pipe with time stamps; the streamed bytes are the samples a
file gets; a file is still written whole and atomically; a failure half way is one error line."""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import time
import wave

import numpy as np
import pytest
from scipy.io import wavfile
from test_cli import ENV

from refimpl import cli
from refimpl.io.audio import read_wav, read_wav_bytes
from refimpl.tts.model import Qwen3TTS

HEADER_BYTES = 44  # a 16-bit PCM header: RIFF, fmt (16 bytes), data
FRAME_BYTES = 1920 * 2  # one 80 ms frame of 16-bit samples at 24 kHz
# the numpy backend: no kernel compiled on a first run, so the first chunk costs what the others do
SAY = ["say", "A longer sentence to speak for a while, for the streaming test.", "--greedy", "--backend", "numpy"]


def sizes_unknown(wav: bytes) -> bytes:
    """The bytes of a WAV with its RIFF and data sizes set to 0xFFFFFFFF (a 44-byte header)."""
    unknown = struct.pack("<I", 0xFFFFFFFF)
    return wav[:4] + unknown + wav[8:40] + unknown + wav[HEADER_BYTES:]


def read_pipe_with_times(command: list[str]):
    """Run ``refimpl COMMAND`` and read its standard output as it arrives: a list of (time, bytes so far,
    whether the process was still running), the bytes, the stderr text and the exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "refimpl", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    arrivals, pieces, total = [], [], 0
    while piece := os.read(proc.stdout.fileno(), 1 << 16):
        now, running = time.monotonic(), proc.poll() is None
        total += len(piece)
        pieces.append(piece)
        arrivals.append((now, total, running))
    stderr = proc.stderr.read().decode()  # a few lines: the bars of a log are sparse
    return arrivals, b"".join(pieces), stderr, proc.wait(timeout=300)


@pytest.mark.parametrize("command", ["say", "codec decode"])
def test_the_first_chunk_is_read_from_the_pipe_while_the_rest_is_made(tmp_path, command):
    """The first chunk's bytes arrive while the process runs, and the arrivals spread over at least half
    of the time the command says it took to make the audio (without streaming they all arrive at the end,
    within milliseconds).  The margin holds on a loaded machine: load slows the generation between the
    first and the last chunk as much as the rest."""
    if command == "say":
        args = [*SAY, "--max-new-tokens", "201", "--stream"]  # 200 frames (greedy: no end), 50 chunks
    else:
        np.save(tmp_path / "codes.npy", np.random.default_rng(0).integers(0, 64, size=(1000, 16)))
        args = ["codec", "decode", str(tmp_path / "codes.npy"), "--backend", "numpy", "--stream"]
    arrivals, data, stderr, status = read_pipe_with_times([*args, "-o", "-"])
    assert status == 0, stderr
    made_in = float(re.search(r" s of audio in ([0-9.]+) s", stderr).group(1))
    first = next(i for i, (_, total, _) in enumerate(arrivals) if total >= HEADER_BYTES + 4 * FRAME_BYTES)
    first_time, _, running = arrivals[first]
    assert running, "the first chunk came only when the process ended"
    assert arrivals[-1][0] - first_time >= made_in / 2, (made_in, arrivals[:3], arrivals[-3:])
    assert len(data) > HEADER_BYTES + 40 * 4 * FRAME_BYTES

    # the same samples as the same command writing a file (whole, atomically): the bytes differ only in
    # the two sizes, which a pipe cannot know when it starts
    r = subprocess.run(
        [sys.executable, "-m", "refimpl", *args, "-q", "-o", tmp_path / "whole.wav"], env=ENV, timeout=300
    )
    assert r.returncode == 0
    whole = (tmp_path / "whole.wav").read_bytes()
    assert data == sizes_unknown(whole)
    (tmp_path / "piped.wav").write_bytes(data)  # what `> piped.wav` saves: read back by our reader and `wave`
    np.testing.assert_array_equal(read_wav(tmp_path / "piped.wav")[0], read_wav(tmp_path / "whole.wav")[0])
    with wave.open(str(tmp_path / "piped.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.readframes(len(data)) == data[HEADER_BYTES:]


@pytest.mark.parametrize("stream", [True, False])
def test_the_reader_sees_the_end_when_the_audio_is_written(stream):
    """Standard output ends with the command's work, not with the interpreter: a process whose exit takes
    three seconds more (an exit handler that waits) has its reader see the end of the WAV first.  (``main``
    called in a process that goes on leaves it open.)"""
    script = "import atexit, sys, time; atexit.register(time.sleep, 3); from refimpl.cli import run; sys.exit(run())"
    args = ["say", "Hello there.", "--greedy", "--max-new-tokens", "4", "--backend", "numpy", "-q", "-o", "-"]
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args, *(["--stream"] if stream else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    data = proc.stdout.read()  # (until the end of the stream)
    ended = time.monotonic()
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    assert time.monotonic() - ended >= 2, "the reader saw the end only when the process had exited"
    assert read_wav_bytes(data)[0].shape == (3 * 1920,)


def test_main_leaves_standard_output_open_for_its_caller(tmp_path):
    script = (
        "import sys; from refimpl.cli import main; "
        "status = main(['info', '--model', 'default']); print('after main'); sys.exit(status)"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("after main")


def test_the_progress_bar_comes_after_the_first_audio(tmp_path, capsysbinary, monkeypatch):
    """A stream's bar is made once its first chunk is written (making it imports tqdm: not on the way to
    the first audio), for say and codec decode alike; it counts every chunk."""
    from refimpl.cli import commands, output

    events = []
    write, bar = commands.AudioOutput.write, output.Reporter.bar

    def logged_write(self, chunk):
        events.append("write")
        return write(self, chunk)

    def logged_bar(self, *args, **kwargs):
        events.append("bar")
        return bar(self, *args, **kwargs)

    monkeypatch.setattr(commands.AudioOutput, "write", logged_write)
    monkeypatch.setattr(output.Reporter, "bar", logged_bar)
    np.save(tmp_path / "codes.npy", np.random.default_rng(0).integers(0, 64, size=(5, 16)))
    say = ["say", "Hello.", "--greedy", "--max-new-tokens", "5"]  # 4 frames
    decode = ["codec", "decode", str(tmp_path / "codes.npy")]  # 5 frames
    for command, chunks in ((say, 2), (decode, 3)):
        events.clear()
        assert cli.main([*command, "--stream", "--chunk-frames", "2", "-o", "-"]) == 0
        assert events == ["write", "bar"] + ["write"] * (chunks - 1), command
        assert "first chunk after" in capsysbinary.readouterr().err.decode() or command is decode


@pytest.mark.parametrize("float_wav", [False, True])
def test_streamed_output_equals_the_file_for_every_synthesis_command(tmp_path, capsysbinary, float_wav):
    """say, design, clone and codec decode: ``--stream -o -`` writes the samples ``--stream -o FILE``
    writes (16-bit and float)."""
    rng = np.random.default_rng(1)
    wavfile.write(tmp_path / "ref.wav", 24000, (0.1 * rng.standard_normal(24000)).astype(np.float32))
    np.save(tmp_path / "codes.npy", rng.integers(0, 64, size=(9, 16)))
    commands = [
        ["say", "Hello there.", "--max-new-tokens", "8", "--seed", "3", "--chunk-frames", "3"],
        ["design", "Good morning.", "--instruct", "A calm voice.", "--max-new-tokens", "6", "--seed", "3"],
        [
            "clone",
            "Now in my voice.",
            "--ref-audio",
            str(tmp_path / "ref.wav"),
            "--x-vector-only",
            "--max-new-tokens",
            "6",
        ],
        ["codec", "decode", str(tmp_path / "codes.npy"), "--chunk-frames", "2"],
    ]
    for n, command in enumerate(commands):
        args = [*command, "--stream", "-q", *(["--float-wav"] if float_wav else [])]
        assert cli.main([*args, "-o", str(tmp_path / f"{n}.wav")]) == 0
        assert cli.main([*args, "-o", "-"]) == 0
        out = capsysbinary.readouterr()
        assert out.err == b""
        whole = (tmp_path / f"{n}.wav").read_bytes()
        np.testing.assert_array_equal(read_wav_bytes(out.out)[0], read_wav_bytes(whole)[0])
        if not float_wav:
            assert out.out == sizes_unknown(whole)
        else:  # the float header has no fact chunk (its count is not known yet), as FFmpeg's on a pipe
            assert out.out[12:38] == whole[12:38] and out.out[38:46] == b"data\xff\xff\xff\xff"
            assert out.out[46:] == whole[58:]


def test_no_chunk_is_an_empty_wav(capsysbinary, tmp_path):
    np.save(tmp_path / "none.npy", np.zeros((0, 16), np.int64))
    assert cli.main(["codec", "decode", str(tmp_path / "none.npy"), "--stream", "-q", "-o", "-"]) == 0
    out = capsysbinary.readouterr().out
    assert len(out) == HEADER_BYTES and read_wav_bytes(out)[0].shape == (0,)
    with wave.open(io.BytesIO(out)) as w:
        assert w.readframes(100) == b""


def test_a_failure_half_way(tmp_path, capsysbinary, monkeypatch):
    """The generation fails after its first chunk: one error line and status 1.  Standard output has the
    header and the first chunk (a WAV of what was heard); an existing file is left as it was."""
    original = Qwen3TTS.stream_custom_voice

    def failing(self, *args, **kwargs):
        chunks = original(self, *args, **kwargs)
        yield next(chunks)
        raise ValueError("the decoder produced NaN samples")

    monkeypatch.setattr(Qwen3TTS, "stream_custom_voice", failing)
    args = ["say", "Hello there.", "--max-new-tokens", "9", "--stream", "--chunk-frames", "2", "-q"]
    assert cli.main([*args, "-o", "-"]) == 1
    out = capsysbinary.readouterr()
    assert out.err.decode().splitlines() == ["refimpl: error: the decoder produced NaN samples"]
    assert len(out.out) == HEADER_BYTES + 2 * FRAME_BYTES and read_wav_bytes(out.out)[0].shape == (2 * 1920,)
    (tmp_path / "good.wav").write_bytes(b"a good file")
    assert cli.main([*args, "-o", str(tmp_path / "good.wav")]) == 1
    assert (tmp_path / "good.wav").read_bytes() == b"a good file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.wav"]  # no temporary file left


def test_clipping_is_reported_once_for_the_whole_stream(tmp_path, capsysbinary, monkeypatch):
    monkeypatch.setattr(cli.output, "stderr_is_a_terminal", lambda: False)
    monkeypatch.setattr(Qwen3TTS, "stream_custom_voice", lambda self, *a, **k: iter([np.full(4, 2.0)] * 3))
    assert cli.main(["say", "Hello.", "--stream", "-o", "-"]) == 0
    err = capsysbinary.readouterr().err.decode()
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        "warning: 12 of 12 samples were outside [-1, 1] and clipped to 16-bit full scale (largest |sample| 2; "
        "a float WAV keeps them)"
    ]


def test_closed_reader_ends_the_stream_quietly():
    """The player quits (``| head -c``): the generation stops, status 1, nothing on stderr."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refimpl", *SAY, "--max-new-tokens", "400", "--stream", "-q", "-o", "-"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert len(reader.read(HEADER_BYTES + 100)) == HEADER_BYTES + 100
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 1 and stderr == b"", stderr
