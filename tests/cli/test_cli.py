"""The command line, run as a user would: the real entry point in a subprocess."""

from __future__ import annotations

import atexit
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import CHECKPOINTS, REPO
from scipy.io import wavfile

# the commands run with a user cache directory of their own (where the embedded-model note leaves its
# marker), removed at exit: the tests never write into the real user's cache
CACHE = tempfile.mkdtemp(prefix="refimpl-test-cache-")
atexit.register(shutil.rmtree, CACHE, True)
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), XDG_CACHE_HOME=CACHE)


def run(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "refimpl", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV if env is None else env,
        cwd=cwd,
        timeout=300,
    )


def read_wav(path):
    sr, data = wavfile.read(path)
    return sr, data


def assert_one_line_error(result, *fragments):
    assert result.returncode == 1, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("refimpl: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_help_teaches():
    r = run("--help")
    assert r.returncode == 0
    for word in ("say", "design", "clone", "codec", "info", "--model", "random weights"):
        assert word in r.stdout
    r = run("say", "--help")
    assert r.returncode == 0 and "--speaker" in r.stdout and "--stream" in r.stdout and "--greedy" in r.stdout


def test_no_command_prints_usage():
    r = run()
    assert r.returncode == 2 and "COMMAND" in r.stderr


@pytest.mark.parametrize("stream", [False, True])
def test_say_on_the_embedded_default_writes_a_wav(tmp_path, stream):
    out = tmp_path / "hello.wav"
    args = ["say", "Hello there.", "-o", out, "--max-new-tokens", "12", "--seed", "3"] + (
        ["--stream"] if stream else []
    )
    r = run(*args, env=dict(ENV, XDG_CACHE_HOME=str(tmp_path / "cache")))  # a user who never ran refimpl
    assert r.returncode == 0, r.stderr
    assert "random weights" in r.stderr and "noise, not speech" in r.stderr  # says plainly it is not a real model
    sr, data = read_wav(out)
    assert sr == 24000 and data.dtype == np.int16
    assert data.shape[0] % 1920 == 0 and 0 < data.shape[0] <= 11 * 1920
    assert np.std(data) > 100


def test_quiet_and_float_output(tmp_path):
    out = tmp_path / "q.wav"
    r = run("say", "Quiet please.", "-o", out, "--max-new-tokens", "5", "-q", "--float-wav", "--greedy")
    assert r.returncode == 0 and r.stderr == ""
    sr, data = read_wav(out)
    assert sr == 24000 and data.dtype == np.float32 and data.shape[0] == 4 * 1920


def test_design_and_clone(tmp_path):
    r = run(
        "design",
        "Good morning.",
        "--instruct",
        "A calm, deep voice.",
        "-o",
        tmp_path / "d.wav",
        "--max-new-tokens",
        "6",
    )
    assert r.returncode == 0, r.stderr
    assert read_wav(tmp_path / "d.wav")[1].shape[0] % 1920 == 0
    # a 44.1 kHz stereo reference: resampled and mixed down
    t = np.arange(44100) / 44100
    ref = np.stack([0.3 * np.sin(2 * np.pi * 220 * t), 0.2 * np.sin(2 * np.pi * 330 * t)], axis=1)
    wavfile.write(tmp_path / "ref.wav", 44100, (ref * 32767).astype(np.int16))
    r = run(
        "clone",
        "Now in my voice.",
        "--ref-audio",
        tmp_path / "ref.wav",
        "--ref-text",
        "A reference.",
        "-o",
        tmp_path / "c.wav",
        "--max-new-tokens",
        "6",
    )
    assert r.returncode == 0, r.stderr
    r = run(
        "clone",
        "Now in my voice.",
        "--ref-audio",
        tmp_path / "ref.wav",
        "--x-vector-only",
        "-o",
        tmp_path / "x.wav",
        "--max-new-tokens",
        "6",
    )
    assert r.returncode == 0, r.stderr
    assert read_wav(tmp_path / "x.wav")[0] == 24000


def test_codec_round_trip(tmp_path):
    codes = np.random.default_rng(0).integers(0, 64, size=(9, 16))
    np.save(tmp_path / "codes.npy", codes)
    for extra in ([], ["--stream"]):
        out = tmp_path / f"back{len(extra)}.wav"
        r = run("codec", "decode", tmp_path / "codes.npy", "-o", out, "--float-wav", *extra)
        assert r.returncode == 0, r.stderr
        assert read_wav(out)[1].shape == (9 * 1920,)
    offline, streamed = read_wav(tmp_path / "back0.wav")[1], read_wav(tmp_path / "back1.wav")[1]
    np.testing.assert_allclose(streamed, offline, atol=2e-5)
    # 16 kHz input is resampled; T = ceil(samples at 24 kHz / 1920)
    wavfile.write(
        tmp_path / "in.wav", 16000, (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    )
    r = run("codec", "encode", tmp_path / "in.wav", "-o", tmp_path / "enc.npy")
    assert r.returncode == 0, r.stderr
    enc = np.load(tmp_path / "enc.npy")
    assert enc.shape == (13, 16) and enc.dtype == np.int64 and enc.min() >= 0 and enc.max() < 64


def test_info(tmp_path):
    r = run("info")
    assert r.returncode == 0
    for word in ("custom_voice", "serena", "english", "parameters", "memory", "float32"):
        assert word in r.stdout
    r = run("info", "--model", CHECKPOINTS / "tiny-voicedesign", "--json", "--dtype", "float64")
    assert r.returncode == 0
    import json

    info = json.loads(r.stdout)
    assert (
        info["model type"] == "voice_design" and info["stored dtype"] == "BF16" and info["compute dtype"] == "float64"
    )


def test_backend_option_picks_the_primitives(tmp_path):
    """--backend reaches the primitives: info reports it, and the two backends decode the same codes to
    samples that agree to float32 summation order (the decoder's streaming tolerance), not bit for bit."""
    env_free = dict(ENV)
    env_free.pop("REFIMPL_BACKEND", None)
    r = subprocess.run(
        [sys.executable, "-m", "refimpl", "info", "--backend", "numpy", "--json"],
        capture_output=True,
        text=True,
        env=env_free,
        timeout=300,
    )
    import json

    assert r.returncode == 0 and json.loads(r.stdout)["backend"] == "numpy (--backend)"
    r = subprocess.run(
        [sys.executable, "-m", "refimpl", "info", "--json"],
        capture_output=True,
        text=True,
        env=dict(env_free, REFIMPL_BACKEND="numba"),
        timeout=300,
    )
    assert json.loads(r.stdout)["backend"] == "numba (environment variable REFIMPL_BACKEND)"
    np.save(tmp_path / "codes.npy", np.random.default_rng(3).integers(0, 64, size=(6, 16)))
    wavs = {}
    for backend in ("numpy", "numba"):
        out = tmp_path / f"{backend}.wav"
        assert (
            run("codec", "decode", tmp_path / "codes.npy", "-o", out, "--float-wav", "--backend", backend).returncode
            == 0
        )
        wavs[backend] = read_wav(out)[1]
    assert not np.array_equal(wavs["numpy"], wavs["numba"])  # different kernels really ran
    np.testing.assert_allclose(wavs["numba"], wavs["numpy"], atol=2e-5)
    r = run("info", "--backend", "cuda")
    assert r.returncode == 2 and "invalid choice: 'cuda'" in r.stderr


def test_error_paths_are_one_line(tmp_path):
    assert_one_line_error(run("info", "--model", tmp_path / "missing"), "does not exist")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run("say", "hi", "-o", tmp_path / "o.wav", "--model", tmp_path / "empty"), "config.json")
    assert_one_line_error(run("say", "hi", "--speaker", "bob", "-o", tmp_path / "o.wav"), "bob")
    assert_one_line_error(run("say", "hi", "--language", "klingon", "-o", tmp_path / "o.wav"), "klingon")
    assert_one_line_error(run("say", "", "-o", tmp_path / "o.wav"), "empty")
    assert_one_line_error(
        run(
            "clone",
            "hi",
            "--model",
            CHECKPOINTS / "tiny-customvoice",
            "--ref-audio",
            tmp_path / "nope.wav",
            "--x-vector-only",
            "-o",
            tmp_path / "o.wav",
        ),
        "nope.wav",
    )
    (tmp_path / "bad.wav").write_bytes(b"RIFF0000WAVEjunk")
    assert_one_line_error(run("codec", "encode", tmp_path / "bad.wav", "-o", tmp_path / "c.npy"), "bad.wav")
    wavfile.write(tmp_path / "ok.wav", 24000, np.zeros(4800, np.float32))
    assert_one_line_error(
        run(
            "clone",
            "hi",
            "--model",
            CHECKPOINTS / "tiny-customvoice",
            "--ref-audio",
            tmp_path / "ok.wav",
            "--x-vector-only",
            "-o",
            tmp_path / "o.wav",
        ),
        "base",
    )
    assert_one_line_error(
        run("clone", "hi", "--ref-audio", tmp_path / "ok.wav", "-o", tmp_path / "o.wav"), "--ref-text"
    )
    np.save(tmp_path / "bad.npy", np.full((3, 16), 999))
    assert_one_line_error(run("codec", "decode", tmp_path / "bad.npy", "-o", tmp_path / "o.wav"), "outside")
    assert_one_line_error(
        run("say", "hi", "-o", tmp_path / "no-such-dir" / "o.wav", "--max-new-tokens", "3"), "cannot write"
    )


def test_embedded_defaults_are_the_tested_tiny_checkpoints():
    """The package's default models are byte-identical to the tiny checkpoints the golden files were
    recorded on (golden/make_checkpoints.py writes both), so the end-to-end parity tests cover them."""
    for kind in ("customvoice", "base", "voicedesign"):
        cmp = filecmp.dircmp(REPO / "refimpl" / "data" / f"default-{kind}", CHECKPOINTS / f"tiny-{kind}")
        assert not (cmp.left_only or cmp.right_only or cmp.diff_files), kind
        for sub in cmp.subdirs.values():
            assert not (sub.left_only or sub.right_only or sub.diff_files), kind
        _, mismatch, errors = filecmp.cmpfiles(
            REPO / "refimpl" / "data" / f"default-{kind}",
            CHECKPOINTS / f"tiny-{kind}",
            ["model.safetensors", "config.json"],
            shallow=False,
        )
        assert not mismatch and not errors


def test_installed_console_script_runs(tmp_path):
    """`pip install .` provides the `refimpl` command: found next to this interpreter (a virtual
    environment need not be activated) or on PATH; run with this working tree first on the path, it
    writes the WAV of what the Python API returns for the same options."""
    exe = Path(sys.executable).parent / "refimpl"
    exe = str(exe) if exe.is_file() else shutil.which("refimpl")
    if exe is None:
        pytest.skip(
            f"no refimpl console script next to {sys.executable} or on PATH: the package is not "
            "installed in this environment (pip install . provides it; CI installs it)"
        )
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and "codec" in r.stdout
    args = ["say", "Hello.", "--speaker", "serena", "--max-new-tokens", "4", "--seed", "2", "-q", "-o"]
    r = subprocess.run([exe, *args, str(tmp_path / "script.wav")], capture_output=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    from refimpl.io.audio import wav_bytes
    from refimpl.tts.model import Qwen3TTS

    tts = Qwen3TTS.from_pretrained(REPO / "refimpl" / "data" / "default-customvoice")
    wavs, sr = tts.generate_custom_voice("Hello.", speaker="serena", max_new_tokens=4, seed=2)
    assert (tmp_path / "script.wav").read_bytes() == wav_bytes(wavs[0], sr)
