"""What the command line prints: progress bars (sparse lines in a log, nothing under -q, nothing from the
library unless asked), the embedded-model note (once per user, always in 'refimpl info'), warnings as
one line (silenced by -q), the library's log notes, the clipping report, and -o naming the file actually written."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.io import wavfile

from refimpl import cli
from refimpl.codec.speech_tokenizer import SpeechTokenizer
from refimpl.io.audio import ClippingWarning, wav_bytes
from refimpl.tts.model import Qwen3TTS

SAY = ["say", "Hello there.", "--max-new-tokens", "6", "--seed", "1"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cli.output, "stderr_is_a_terminal", lambda: False)  # as in a log, whatever runs the tests


def run(capsys, *args):
    status = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize("stream", [False, True])
def test_progress_in_a_log_is_a_few_plain_lines(tmp_path, capsys, stream):
    status, err = run(capsys, *SAY, "-o", tmp_path / "o.wav", *(["--stream"] if stream else []))
    assert status == 0 and "\r" not in err
    bar = "streamed audio: " if stream else "generating frames: "
    lines = [line for line in err.splitlines() if line.startswith(bar)]
    assert len(lines) == 2, err  # the start and the end (a line at most every LOG_INTERVAL_S between)
    assert lines[-1].startswith("streamed audio: 0.4 s [" if stream else "generating frames: 5 frames"), lines
    if not stream:
        assert "decoding 300-frame chunks: 100%" in err
    assert run(capsys, *SAY, "-o", tmp_path / "q.wav", "-q", *(["--stream"] if stream else [])) == (0, "")


def test_codec_decode_progress_counts_frames(tmp_path, capsys):
    np.save(tmp_path / "codes.npy", np.random.default_rng(0).integers(0, 64, size=(7, 16)))
    status, err = run(
        capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav", "--stream", "--chunk-frames", "3"
    )
    assert status == 0 and "decoding: 100%|##########| 7/7 [" in err and " frames/s]" in err, err


def test_the_library_prints_nothing_unless_asked(capsys):
    tts = Qwen3TTS.from_pretrained(cli.DEFAULT_MODELS["custom_voice"])
    plain = tts.generate_custom_voice("Hello.", speaker="dylan", seed=1, max_new_tokens=5)[0][0]
    assert capsys.readouterr().err == ""
    seen = []

    def progress(iterable, desc):
        seen.append(desc)
        return iterable

    hooked = tts.generate_custom_voice("Hello.", speaker="dylan", seed=1, max_new_tokens=5, progress=progress)[0][0]
    assert seen == ["generating frames", "decoding 300-frame chunks"]
    np.testing.assert_array_equal(hooked, plain)  # the hook only watches


def test_the_embedded_model_note_once_per_user(tmp_path, capsys, monkeypatch):
    note = cli.EMBEDDED_NOTE
    assert len(note) <= 100
    assert note in run(capsys, *SAY, "-o", tmp_path / "a.wav")[1]
    assert (tmp_path / "cache" / "refimpl" / cli.NOTE_MARKER).is_file()
    assert note not in run(capsys, *SAY, "-o", tmp_path / "a.wav")[1]
    status, err = run(capsys, "info")
    assert status == 0 and note in err and "pass --model" in err  # info always says it, with the advice
    assert run(capsys, "info", "-q")[1] == ""
    # a new user, quiet: no note, and the note is still due
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    assert run(capsys, *SAY, "-o", tmp_path / "a.wav", "-q") == (0, "")
    assert not (tmp_path / "cache2").exists()
    # a cache that cannot be written (a file where the directory should be): shown every time, no error
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    for _ in range(2):
        status, err = run(capsys, *SAY, "-o", tmp_path / "a.wav")
        assert status == 0 and note in err
    # a relative XDG_CACHE_HOME is ignored (the XDG rule): ~/.cache is used
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert note in run(capsys, *SAY, "-o", tmp_path / "a.wav")[1]
    assert (tmp_path / "home" / ".cache" / "refimpl" / cli.NOTE_MARKER).is_file()


def test_note_only_for_the_embedded_model(tmp_path, capsys, monkeypatch):
    """The note is about the embedded model, whichever way it is named; a copy of it elsewhere (a model
    directory of the user's) gets no note."""
    import shutil

    shutil.copytree(cli.DEFAULT_MODELS["custom_voice"], tmp_path / "mine")
    status, err = run(capsys, *SAY, "--model", tmp_path / "mine", "-o", tmp_path / "a.wav")
    assert status == 0 and cli.EMBEDDED_NOTE not in err
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    status, err = run(capsys, *SAY, "--model", "default", "-o", tmp_path / "b.wav")
    assert status == 0 and cli.EMBEDDED_NOTE in err


def noting_decode(self, codes, progress=None):
    """A decoder standing in for one that logs as the numba backend does when it compiles: a note at INFO,
    from another thread (the packing thread compiles its kernel beside the load), a line at DEBUG and one at
    WARNING."""
    import logging
    import threading

    logger = logging.getLogger("refimpl")
    for frame in progress(range(len(codes)), "decoding") if progress is not None else range(len(codes)):
        if frame == 1:  # (a bar drawn)
            note = threading.Thread(target=logger.info, args=("compiling %s", "kernels"))
            note.start()
            note.join()
            logger.debug("not for the command line")
            logger.warning("a %s", "warning")
    return np.zeros(1920 * len(codes), np.float32)


@pytest.mark.parametrize("terminal", [False, True])
def test_the_library_notes_show_as_notes_and_quiet_silences_them(tmp_path, capsys, monkeypatch, terminal):
    """What the library logs at INFO and above (the numba backend's note that it compiles its kernels) is a
    "note: ..." line ("warning: ..." from WARNING), on its own line beside a progress bar drawn in place;
    nothing under -q; the logger as it was after the command."""
    import logging
    import re

    monkeypatch.setattr(SpeechTokenizer, "decode", noting_decode)
    monkeypatch.setattr(cli.output, "stderr_is_a_terminal", lambda: terminal)
    np.save(tmp_path / "codes.npy", np.zeros((3, 16), np.int64))
    logger = logging.getLogger("refimpl")
    before = (logger.level, list(logger.handlers))
    status, err = run(capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav")
    assert status == 0 and (logger.level, logger.handlers) == before
    pieces = [p.strip() for p in re.split(r"[\r\n]", err)]
    assert any(p.startswith("decoding: ") for p in pieces), err
    assert pieces.count("note: compiling kernels") == 1 and "not for the command line" not in err, err
    assert pieces.count("warning: a warning") == 1, err
    assert run(capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav", "-q") == (0, "")
    assert (logger.level, logger.handlers) == before


def overflowing_decode(self, codes, progress=None):
    """A decoder standing in for one that overflows (a NumPy warning) and goes past full scale."""
    with np.errstate(over="warn"):
        np.float32(3e38) * np.float32(10)
    return np.array([0.5, 1.5, -2.0, 0.0, 1.0, 1.25], np.float32)


def test_warnings_are_one_line_and_quiet_silences_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SpeechTokenizer, "decode", overflowing_decode)
    np.save(tmp_path / "codes.npy", np.zeros((1, 16), np.int64))
    status, err = run(capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav")
    assert status == 0 and "Traceback" not in err and "RuntimeWarning" not in err
    assert "warning: overflow encountered in scalar multiply" in err.splitlines()
    assert (
        "warning: 3 of 6 samples were outside [-1, 1] and clipped to 16-bit full scale (largest |sample| 2; "
        "a float WAV keeps them)"
    ) in err.splitlines()
    # the 16-bit PCM rule, by definition: round(clip(x, -1, 1) * 32767)
    np.testing.assert_array_equal(wavfile.read(tmp_path / "o.wav")[1], [16384, 32767, -32767, 0, 32767, 32767])
    status, err = run(capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "f.wav", "--float-wav")
    assert status == 0 and "clipped" not in err
    assert run(capsys, "codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav", "-q") == (0, "")


def test_wav_bytes_counts_what_it_clips():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wav_bytes(np.array([0.0, 1.0, -1.0, 0.999]), 24000)
        assert caught == []
        wav_bytes(np.array([1.0001, -1.5, 0.2]), 24000)
    assert len(caught) == 1 and caught[0].category is ClippingWarning
    assert str(caught[0].message).startswith("2 of 3 samples were outside [-1, 1]")


def test_output_is_the_name_given(tmp_path, capsys, monkeypatch):
    """-o names the file written: no extension added (codes.npy would not be where the user said)."""
    monkeypatch.chdir(tmp_path)
    wavfile.write(tmp_path / "in.wav", 24000, np.zeros(2400, np.float32))
    status, err = run(capsys, "codec", "encode", "in.wav", "-o", "codes")
    assert status == 0 and "wrote codes\n" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["codes", "in.wav"]
    assert np.load(tmp_path / "codes").shape == (2, 16)
    status, err = run(capsys, "codec", "decode", "codes", "-o", "back")
    assert status == 0 and "wrote back\n" in err and (tmp_path / "back").is_file()


@pytest.mark.parametrize("action, words", [("encode", "Encode a WAV file"), ("decode", "Decode codes")])
def test_codec_help_describes_the_action(capsys, action, words):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["codec", action, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and words in out


def test_trace_and_golden_show_progress(tmp_path, capsys):
    status, err = run(
        capsys,
        "trace",
        "say",
        "Hello.",
        "--speaker",
        "dylan",
        "--max-new-tokens",
        "4",
        "-o",
        tmp_path / "say.safetensors",
    )
    assert status == 0 and "generating frames: 3 frames [" in err, err
    (tmp_path / "cases.jsonl").write_text(
        '{"name": "a", "stage": "codec-decode", "input": [[1, 2, 3, 4, 5, 6, 7, 8, 9, '
        '10, 11, 12, 13, 14, 15, 16]]}\n{"name": "b", "stage": "codec-decode", '
        '"input": [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]}\n'
    )
    status, err = run(capsys, "golden", "--cases", tmp_path / "cases.jsonl", "-o", tmp_path / "corpus")
    assert status == 0 and "tracing cases: 100%|##########| 2/2 [" in err, err
    assert run(capsys, "golden", "--cases", tmp_path / "cases.jsonl", "-o", tmp_path / "corpus", "-q") == (0, "")
