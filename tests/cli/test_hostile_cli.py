"""The command line under hostile use: one exit-status convention, standard input and output, closed pipes,
failed writes that keep the previous file, and every bad input a one-line error naming the problem."""

from __future__ import annotations

import io
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHECKPOINTS, REPO
from scipy.io import wavfile
from test_cli import ENV, assert_one_line_error, run


def run_bytes(*args, stdin: bytes = b"", limit_file_size: int | None = None):
    def limit():
        if limit_file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    args = [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    return subprocess.run(
        [sys.executable, "-m", "refimpl", *args],
        input=stdin,
        capture_output=True,
        env=ENV,
        timeout=300,
        preexec_fn=limit,
    )


def assert_usage_error(result, fragment):
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_help_documents_the_exit_statuses():
    r = run("--help")
    assert r.returncode == 0
    for line in ("0  success", "1  bad input or environment", "2  usage error", "3  internal error"):
        assert line in r.stdout
    assert "standard input" in r.stdout and "standard output" in r.stdout


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == "refimpl 0.2.0"  # refimpl/_version.py


@pytest.mark.parametrize(
    "option, value, fragment",
    [
        ("--seed", "-1", "must be an integer >= 0, got -1"),
        ("--seed", "x", "expected an integer, got 'x'"),
        ("--max-new-tokens", "0", "must be an integer >= 1, got 0"),
        ("--chunk-frames", "-4", "must be an integer >= 1, got -4"),
    ],
)
def test_bad_numbers_are_usage_errors(tmp_path, option, value, fragment):
    assert_usage_error(run("say", "hi", "-o", tmp_path / "o.wav", option, value), fragment)


def test_wav_to_standard_output_equals_the_file(tmp_path):
    args = ["say", "Hello there.", "--max-new-tokens", "5", "--seed", "2", "-q"]
    to_file = run_bytes(*args, "-o", tmp_path / "a.wav")
    to_stdout = run_bytes(*args, "-o", "-")
    assert to_file.returncode == 0 and to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout == (tmp_path / "a.wav").read_bytes()
    sr, data = wavfile.read(io.BytesIO(to_stdout.stdout))
    assert sr == 24000 and data.shape[0] % 1920 == 0


def test_progress_and_notes_never_reach_standard_output(tmp_path):
    """Without -q the bars, notes and summary all go to stderr: the WAV on standard output is intact."""
    args = ["say", "Hello there.", "--max-new-tokens", "5", "--seed", "2"]
    to_stdout = run_bytes(*args, "-o", "-")
    assert to_stdout.returncode == 0 and b"generating frames: 4 frames" in to_stdout.stderr, to_stdout.stderr
    assert run_bytes(*args, "-q", "-o", tmp_path / "a.wav").returncode == 0
    assert to_stdout.stdout == (tmp_path / "a.wav").read_bytes()


def test_text_from_standard_input(tmp_path):
    args = ["--max-new-tokens", "5", "--seed", "2", "-q", "-o"]
    a = run_bytes("say", "Grüße, 世界.", *args, tmp_path / "a.wav")
    b = run_bytes("say", "-", *args, tmp_path / "b.wav", stdin="Grüße, 世界.\n".encode())
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_standard_input_that_is_not_utf8(tmp_path):
    r = run_bytes("say", "-", "-o", tmp_path / "o.wav", stdin=b"caf\xe9")
    assert r.returncode == 1 and b"standard input is not valid UTF-8 text (byte 3" in r.stderr


def test_undecodable_argument_bytes_are_a_clear_error(tmp_path):
    r = run_bytes("say", b"abc\xff", "-o", tmp_path / "o.wav", "--max-new-tokens", "3")
    assert r.returncode == 1 and b"refimpl: error: text is not valid Unicode: lone surrogate U+DCFF" in r.stderr
    assert not (tmp_path / "o.wav").exists()


def test_codec_through_standard_input_and_output(tmp_path):
    rng = np.random.default_rng(4)
    buffer = io.BytesIO()
    wavfile.write(buffer, 16000, (0.1 * rng.standard_normal(8000)).astype(np.float32))
    enc = run_bytes("codec", "encode", "-", "-o", "-", "-q", stdin=buffer.getvalue())
    assert enc.returncode == 0, enc.stderr
    codes = np.load(io.BytesIO(enc.stdout))
    assert codes.shape == (7, 16)
    dec = run_bytes("codec", "decode", "-", "-o", "-", "-q", stdin=enc.stdout)
    assert dec.returncode == 0, dec.stderr
    assert wavfile.read(io.BytesIO(dec.stdout))[1].shape == (7 * 1920,)
    empty = run_bytes("codec", "decode", "-", "-o", "-", stdin=b"")
    assert empty.returncode == 1 and b"standard input is empty" in empty.stderr


@pytest.mark.parametrize("command", [["codec", "decode", "CODES", "-o", "-"], ["info"], ["info", "--json"]])
def test_closed_pipe_ends_quietly(tmp_path, command):
    """The reader of standard output has gone (``| head``): status 1, nothing on stderr, no traceback."""
    np.save(tmp_path / "codes.npy", np.zeros((3, 16), np.int64))
    command = [str(tmp_path / "codes.npy") if c == "CODES" else c for c in command]
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refimpl", *command, "-q"], stdout=write_end, stderr=subprocess.PIPE, env=ENV
    )
    os.close(read_end)
    os.close(write_end)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 1
    assert stderr == b"", stderr


def test_dev_null_is_a_fine_output():
    r = run("say", "Hello.", "-o", os.devnull, "--max-new-tokens", "3", "-q")
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize("command", [["say", "A longer sentence to fill the file."], ["codec", "encode"]])
def test_failed_write_keeps_the_previous_file(tmp_path, command):
    """A file-size limit (as a full disk or quota would) stops the write: exit 1 naming the file, the old
    output untouched, no temporary file left behind."""
    if command[0] == "codec":
        wavfile.write(tmp_path / "in.wav", 24000, np.zeros(24000 * 20, np.float32))
        out, args = tmp_path / "codes.npy", ["codec", "encode", tmp_path / "in.wav"]
        limit = 1000  # the .npy of 250 frames is 32 kB
    else:
        out, args = tmp_path / "out.wav", command + ["--max-new-tokens", "12"]
        limit = 20_000
    out.write_bytes(b"previous good output")
    r = run_bytes(*args, "-o", out, "-q", limit_file_size=limit)
    assert r.returncode == 1 and b"refimpl: error: cannot write" in r.stderr and b"too large" in r.stderr, r.stderr
    assert out.read_bytes() == b"previous good output"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["in.wav", out.name] if command[0] == "codec" else [out.name]
    )


def test_output_problems_are_reported_before_any_work(tmp_path):
    assert_one_line_error(run("say", "hi", "-o", tmp_path / "missing" / "o.wav"), "cannot write", "does not exist")
    assert_one_line_error(run("say", "hi", "-o", tmp_path), "cannot write", "is a directory")


def test_empty_and_wrong_npy_files(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    assert_one_line_error(
        run("codec", "decode", tmp_path / "empty.npy", "-o", tmp_path / "o.wav"), "empty.npy", "not a .npy file"
    )
    np.savez(tmp_path / "two.npz", a=np.zeros(3), b=np.zeros(3))
    assert_one_line_error(
        run("codec", "decode", tmp_path / "two.npz", "-o", tmp_path / "o.wav"), "two.npz", "several arrays"
    )
    assert_one_line_error(
        run("codec", "decode", tmp_path / "nope.npy", "-o", tmp_path / "o.wav"), "nope.npy", "does not exist"
    )
    lying = io.BytesIO()  # a header claiming 10^9 frames in front of 4 frames of data
    np.lib.format.write_array_header_1_0(lying, {"descr": "<i8", "fortran_order": False, "shape": (10**9, 16)})
    lying.write(np.zeros((4, 16), np.int64).tobytes())
    (tmp_path / "lying.npy").write_bytes(lying.getvalue())
    assert_one_line_error(
        run("codec", "decode", tmp_path / "lying.npy", "-o", tmp_path / "o.wav"),
        "lying.npy",
        "claims shape (1000000000, 16)",
        "holds only 512",
    )
    np.save(tmp_path / "objects.npy", np.array([[None] * 16], dtype=object), allow_pickle=True)
    assert_one_line_error(
        run("codec", "decode", tmp_path / "objects.npy", "-o", tmp_path / "o.wav"), "objects.npy", "Python objects"
    )
    np.save(tmp_path / "u64.npy", np.full((2, 16), np.iinfo(np.uint64).max, np.uint64))
    assert_one_line_error(
        run("codec", "decode", tmp_path / "u64.npy", "-o", tmp_path / "o.wav"), "18446744073709551615", "outside"
    )


def test_malformed_wav_headers_are_one_line_errors(tmp_path):
    body = b"WAVE" + b"fmt " + struct.pack("<I", 12) + b"\x01\x00\x01\x00" + b"\0" * 8
    (tmp_path / "fmt.wav").write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    r = run("codec", "encode", tmp_path / "fmt.wav", "-o", tmp_path / "c.npy")
    assert_one_line_error(r, "fmt.wav", "malformed fmt chunk: 12 bytes")
    assert not r.stderr.strip().endswith("as WAV:")
    wavfile.write(tmp_path / "ok.wav", 24000, np.zeros(4800, np.int16))
    raw = bytearray((tmp_path / "ok.wav").read_bytes())
    raw[40:44] = struct.pack("<I", 10**8)  # the data chunk's size
    (tmp_path / "lying.wav").write_bytes(bytes(raw))
    assert_one_line_error(
        run("codec", "encode", tmp_path / "lying.wav", "-o", tmp_path / "c.npy"),
        "lying.wav",
        "data chunk claims 100000000 bytes",
    )


def test_damaged_checkpoint_files_name_the_file(tmp_path):
    from refimpl.porting import presets, synthetic

    d = tmp_path / "st"
    synthetic.write_speech_tokenizer(d, presets.preset(presets.TINY_SPEECH_TOKENIZER), seed=3, max_shard_bytes=400_000)
    np.save(tmp_path / "codes.npy", np.zeros((2, 16), np.int64))
    (d / "model.safetensors.index.json").write_text("[]")
    assert_one_line_error(
        run("codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav", "--model", d),
        "model.safetensors.index.json",
        "expected a JSON object",
    )
    m = tmp_path / "m"
    shutil.copytree(CHECKPOINTS / "tiny-customvoice", m)
    (m / "config.json").write_bytes(b'{"talker_config": \xff}')
    assert_one_line_error(run("say", "hi", "-o", tmp_path / "o.wav", "--model", m), "config.json", "not valid")


def test_prompt_longer_than_the_model_supports_is_refused_before_work(tmp_path):
    r = run("say", "Hello.", "-o", tmp_path / "o.wav", "--max-new-tokens", "40000")
    assert_one_line_error(r, "max_position_embeddings 32768", "lower max_new_tokens")
    assert not (tmp_path / "o.wav").exists()


def test_internal_errors_are_status_3_only(tmp_path):
    """Status 3 is kept for bugs: simulate one by breaking a function the command calls."""
    script = (
        "import sys, refimpl.cli as c\n"
        "c.cmd_info = lambda args, say: 1 / 0\n"
        "c.build_parser().parse_args(['info']).func\n"
        "sys.argv = ['refimpl', 'info']\n"
        "p = c.build_parser\n"
        "def patched():\n"
        "    parser = p()\n"
        "    for action in parser._subparsers._group_actions:\n"
        "        action.choices['info'].set_defaults(func=c.cmd_info)\n"
        "    return parser\n"
        "c.build_parser = patched\n"
        "sys.exit(c.main())\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    assert r.returncode == 3 and "refimpl: internal error: ZeroDivisionError" in r.stderr


# ----------------------------------------------------------------------------- closed and unbuffered streams


def run_with_closed(fds, *args, stdout=subprocess.PIPE, env=None):
    """``refimpl ARGS`` with the descriptors ``fds`` closed in the child (as ``>&-`` does)."""

    def close():
        for fd in fds:
            os.close(fd)

    return subprocess.run(
        [sys.executable, "-m", "refimpl", *map(str, args)],
        stdin=subprocess.DEVNULL if 0 not in fds else None,
        stdout=stdout if 1 not in fds else None,
        stderr=subprocess.PIPE if 2 not in fds else None,
        env=env or ENV,
        timeout=300,
        preexec_fn=close,
    )


SAY = ["say", "Hello there.", "--max-new-tokens", "4", "--seed", "2"]


def test_closed_stdout_with_an_output_file_succeeds(tmp_path):
    """stdout closed (``>&-``): the WAV written to a file is whole and the status 0; no file is opened on
    descriptor 1 by accident (it is held on /dev/null)."""
    r = run_with_closed([1], *SAY, "-o", tmp_path / "a.wav")
    assert r.returncode == 0, r.stderr
    assert run_bytes(*SAY, "-q", "-o", tmp_path / "b.wav").returncode == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


@pytest.mark.parametrize("command", [[*SAY, "-o", "-"], [*SAY, "--stream", "-o", "-"], ["info"]])
def test_closed_stdout_as_the_output_is_an_error(command):
    r = run_with_closed([1], *command)
    assert r.returncode == 1, r.stderr
    assert b"refimpl: error: cannot write standard output: it is closed" in r.stderr and b"Traceback" not in r.stderr


def test_closed_stdin_read_as_text_is_an_error(tmp_path):
    r = run_with_closed([0], "say", "-", "-o", tmp_path / "a.wav")
    assert r.returncode == 1 and b"refimpl: error: cannot read standard input: it is closed" in r.stderr, r.stderr
    assert not (tmp_path / "a.wav").exists()


def test_closed_stderr_keeps_notes_out_of_the_wav_on_stdout(tmp_path):
    """Without stderr the notes and bars are dropped: standard output holds exactly the WAV."""
    r = run_with_closed([2], *SAY, "-o", "-")
    assert r.returncode == 0
    assert run_bytes(*SAY, "-q", "-o", tmp_path / "b.wav").returncode == 0
    assert r.stdout == (tmp_path / "b.wav").read_bytes()


UNBUFFERED = dict(ENV, PYTHONUNBUFFERED="1")
LONG_SAY = ["say", "A longer sentence, to make a WAV of several hundred kilobytes.", "--max-new-tokens", "40", "-q"]


def test_unbuffered_closed_pipe_is_not_a_success():
    """PYTHONUNBUFFERED=1: a raw write to a pipe whose reader has gone writes part of the WAV; the rest
    must fail (status 1, quietly, as for a closed pipe), not exit 0."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refimpl", *LONG_SAY, "-o", "-"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env=UNBUFFERED,
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert len(reader.read(100)) == 100
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 1, stderr
    assert stderr == b"", stderr


def test_unbuffered_short_write_past_a_file_size_limit_is_an_error(tmp_path):
    """PYTHONUNBUFFERED=1 and stdout a file under a 64 KiB size limit: the first raw write stops at the
    limit; the rest raises, so the status is 1 naming the problem (not 0 with a third of a WAV)."""
    out = tmp_path / "out.wav"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    with open(out, "wb") as f:
        r = subprocess.run(
            [sys.executable, "-m", "refimpl", *LONG_SAY, "-o", "-"],
            stdout=f,
            stderr=subprocess.PIPE,
            env=UNBUFFERED,
            timeout=300,
            preexec_fn=limit,
        )
    assert out.stat().st_size == 65536
    assert r.returncode == 1 and b"refimpl: error: cannot write standard output: File too large" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "command, fragment",
    [
        (["codec", "decode", "-", "-o", "OUT.wav"], b"not a .npy file"),
        (["codec", "encode", "-", "-o", "OUT.npy"], b"not a RIFF/WAVE file"),
        (["say", "-", "-o", "OUT.wav"], b"standard input is over the limit of 16777216 bytes"),
    ],
)
def test_endless_standard_input_is_refused_in_bounded_memory(tmp_path, command, fragment):
    """/dev/zero on standard input: refused from its first bytes (not .npy, not RIFF) or after the text
    limit, under a 3 GiB address space."""
    command = [str(tmp_path / c) if c.startswith("OUT") else c for c in command]

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    with open("/dev/zero", "rb") as zero:
        r = subprocess.run(
            [sys.executable, "-m", "refimpl", *command],
            stdin=zero,
            capture_output=True,
            env=ENV,
            timeout=300,
            preexec_fn=limit,
        )
    assert r.returncode == 1 and fragment in r.stderr and b"MemoryError" not in r.stderr, r.stderr
