"""The command line does what the Python API does with the same options: each option is checked by
comparing the CLI's output file with the API's result for the same arguments (same seed -> the same
samples, bit for bit; a different value -> different samples, so an option the CLI dropped would fail).

The commands run in this process (``refimpl.cli.main``): the same code path as the console script
without an interpreter start per call; tests/cli/test_cli.py runs the real entry point in a subprocess."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import CHECKPOINTS
from scipy.io import wavfile

from refimpl import cli
from refimpl.codec.speech_tokenizer import SpeechTokenizer
from refimpl.tts.model import Qwen3TTS

TEXT = "Good morning, everyone."


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test has its own user cache directory (the embedded-model note's marker)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def models():
    """The embedded default models through the API, loaded once (float32), and float64 where needed."""
    return {
        "custom_voice": Qwen3TTS.from_pretrained(cli.DEFAULT_MODELS["custom_voice"]),
        "voice_design": Qwen3TTS.from_pretrained(cli.DEFAULT_MODELS["voice_design"]),
        "base": Qwen3TTS.from_pretrained(cli.DEFAULT_MODELS["base"]),
    }


def cli_wav(tmp_path, capsys, *args) -> np.ndarray:
    """Run ``refimpl ARGS -o OUT.wav --float-wav -q`` and return the float32 samples written."""
    out = tmp_path / f"out{len(list(tmp_path.glob('out*.wav')))}.wav"
    status = cli.main([*map(str, args), "-o", str(out), "--float-wav", "-q"])
    captured = capsys.readouterr()
    assert status == 0 and captured.err == "", captured.err
    sr, data = wavfile.read(out)
    assert sr == 24000 and data.dtype == np.float32
    return data


def api_wav(tts, method: str, **kwargs) -> np.ndarray:
    if method.startswith("stream_"):
        return np.concatenate(list(getattr(tts, method)(**kwargs)))
    return getattr(tts, method)(**kwargs)[0][0]


def test_say_seed_speaker_language_and_budget_reach_the_generation(tmp_path, capsys, models):
    tts = models["custom_voice"]
    base = dict(text=TEXT, speaker="serena", language="english", max_new_tokens=9)
    ours = cli_wav(
        tmp_path,
        capsys,
        "say",
        TEXT,
        "--speaker",
        "serena",
        "--language",
        "english",
        "--seed",
        5,
        "--max-new-tokens",
        9,
    )
    np.testing.assert_array_equal(ours, api_wav(tts, "generate_custom_voice", seed=5, **base))
    other_seed = cli_wav(
        tmp_path,
        capsys,
        "say",
        TEXT,
        "--speaker",
        "serena",
        "--language",
        "english",
        "--seed",
        6,
        "--max-new-tokens",
        9,
    )
    np.testing.assert_array_equal(other_seed, api_wav(tts, "generate_custom_voice", seed=6, **base))
    assert not np.array_equal(ours, other_seed)
    # without --seed: seed 0; without --speaker: the first speaker in sorted order (dylan, not serena)
    default = cli_wav(tmp_path, capsys, "say", TEXT, "--language", "english", "--max-new-tokens", 9)
    np.testing.assert_array_equal(
        default, api_wav(tts, "generate_custom_voice", seed=0, **dict(base, speaker=tts.get_supported_speakers()[0]))
    )
    # the options matter: another speaker, language or budget gives other samples
    for change in (dict(speaker="dylan"), dict(language="auto"), dict(max_new_tokens=5)):
        assert not np.array_equal(ours, api_wav(tts, "generate_custom_voice", seed=5, **dict(base, **change))), change


def test_greedy_is_the_apis_greedy(tmp_path, capsys, models):
    tts = models["custom_voice"]
    ours = cli_wav(tmp_path, capsys, "say", TEXT, "--greedy", "--seed", 1, "--max-new-tokens", 6)
    greedy = dict(text=TEXT, speaker="dylan", max_new_tokens=6, do_sample=False, subtalker_dosample=False)
    np.testing.assert_array_equal(ours, api_wav(tts, "generate_custom_voice", seed=99, **greedy))  # seed unused
    assert not np.array_equal(
        ours, api_wav(tts, "generate_custom_voice", seed=1, text=TEXT, speaker="dylan", max_new_tokens=6)
    )


def test_text_feed_is_the_apis_non_streaming_mode(tmp_path, capsys, models):
    """--text-feed streaming|non-streaming is non_streaming_mode False|True (True: say's default); --stream
    passes the same keywords to stream_*."""
    tts = models["custom_voice"]
    call = dict(text=TEXT, speaker="dylan", seed=3, max_new_tokens=6)
    args = ["say", TEXT, "--seed", 3, "--max-new-tokens", 6]
    fed = cli_wav(tmp_path, capsys, *args, "--text-feed", "streaming")
    np.testing.assert_array_equal(fed, api_wav(tts, "generate_custom_voice", non_streaming_mode=False, **call))
    whole = cli_wav(tmp_path, capsys, *args, "--text-feed", "non-streaming")
    np.testing.assert_array_equal(whole, api_wav(tts, "generate_custom_voice", **call))
    assert not np.array_equal(fed, whole)


def test_instruct_reaches_the_model(tmp_path, capsys, models):
    tts = models["custom_voice"]  # a 1.7B CustomVoice model: it reads instruct
    ours = cli_wav(tmp_path, capsys, "say", TEXT, "--instruct", "Speak slowly.", "--seed", 2, "--max-new-tokens", 6)
    call = dict(text=TEXT, speaker="dylan", seed=2, max_new_tokens=6)
    np.testing.assert_array_equal(ours, api_wav(tts, "generate_custom_voice", instruct="Speak slowly.", **call))
    assert not np.array_equal(ours, api_wav(tts, "generate_custom_voice", **call))


def test_instruct_on_a_small_model_is_ignored_and_said_so(tmp_path, capsys):
    """0.6B CustomVoice models ignore instruct (the official rule): the CLI says so."""
    model = tmp_path / "cv-0b6"
    shutil.copytree(CHECKPOINTS / "tiny-customvoice", model)
    config = json.loads((model / "config.json").read_text())
    config["tts_model_size"] = "0b6"
    (model / "config.json").write_text(json.dumps(config))
    args = ["say", TEXT, "--model", str(model), "--max-new-tokens", "4", "--float-wav"]
    assert cli.main([*args, "--instruct", "Whisper.", "-o", str(tmp_path / "a.wav")]) == 0
    assert "note: --instruct is ignored by 0.6B CustomVoice models" in capsys.readouterr().err
    assert cli.main([*args, "-q", "-o", str(tmp_path / "b.wav")]) == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_float64_synthesis_is_the_apis_float64(tmp_path, capsys, models):
    ours = cli_wav(
        tmp_path,
        capsys,
        "design",
        TEXT,
        "--instruct",
        "A calm voice.",
        "--dtype",
        "float64",
        "--seed",
        3,
        "--max-new-tokens",
        6,
    )
    call = dict(text=TEXT, instruct="A calm voice.", seed=3, max_new_tokens=6)
    tts64 = Qwen3TTS.from_pretrained(cli.DEFAULT_MODELS["voice_design"], dtype=np.float64)
    np.testing.assert_array_equal(ours, api_wav(tts64, "generate_voice_design", **call).astype(np.float32))
    assert not np.array_equal(ours, api_wav(models["voice_design"], "generate_voice_design", **call))


def test_design_stream_and_chunk_frames(tmp_path, capsys, models):
    """The streamed waveform's float32 rounding depends on the chunk size: equality with the API's stream
    of the same chunk size shows --chunk-frames reached it (chunks of 2 and 3 differ in the last bits)."""
    tts = models["voice_design"]
    call = dict(text=TEXT, instruct="An excited child.", seed=4, max_new_tokens=8)
    ours = cli_wav(
        tmp_path,
        capsys,
        "design",
        TEXT,
        "--instruct",
        "An excited child.",
        "--seed",
        4,
        "--max-new-tokens",
        8,
        "--stream",
        "--chunk-frames",
        2,
    )
    np.testing.assert_array_equal(ours, api_wav(tts, "stream_voice_design", chunk_frames=2, **call))
    other = api_wav(tts, "stream_voice_design", chunk_frames=3, **call)
    assert not np.array_equal(ours, other)
    np.testing.assert_allclose(ours, other, atol=2e-5)  # the same audio: the streaming decoder is exact


@pytest.mark.soxr_optional  # the CLI and the API resample the reference alike, with either resampler
@pytest.mark.parametrize("mode", ["--x-vector-only", "--ref-text"])
def test_clone_and_clone_stream_are_the_apis(tmp_path, capsys, models, mode):
    tts = models["base"]
    t = np.arange(16000) / 16000
    ref = (0.3 * np.sin(2 * np.pi * 200 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    wavfile.write(tmp_path / "ref.wav", 16000, ref)
    given = ["--x-vector-only"] if mode == "--x-vector-only" else ["--ref-text", "A reference."]
    call = dict(
        text=TEXT,
        ref_audio=(ref, 16000),
        seed=7,
        max_new_tokens=6,
        **({"x_vector_only_mode": True} if mode == "--x-vector-only" else {"ref_text": "A reference."}),
    )
    args = ["clone", TEXT, "--ref-audio", tmp_path / "ref.wav", *given, "--seed", 7, "--max-new-tokens", 6]
    np.testing.assert_array_equal(cli_wav(tmp_path, capsys, *args), api_wav(tts, "generate_voice_clone", **call))
    np.testing.assert_array_equal(
        cli_wav(tmp_path, capsys, *args, "--stream", "--chunk-frames", 2),
        api_wav(tts, "stream_voice_clone", chunk_frames=2, **call),
    )


def test_codec_with_dtype_is_the_apis(tmp_path, capsys):
    audio = (0.2 * np.random.default_rng(5).standard_normal(12000)).astype(np.float32)
    wavfile.write(tmp_path / "in.wav", 24000, audio)
    tok = {
        dt: SpeechTokenizer.from_pretrained(cli.DEFAULT_MODELS["custom_voice"], dtype=dt)
        for dt in (np.float32, np.float64)
    }
    for name, dt in (("float32", np.float32), ("float64", np.float64)):
        assert (
            cli.main(
                [
                    "codec",
                    "encode",
                    str(tmp_path / "in.wav"),
                    "-o",
                    str(tmp_path / f"{name}.npy"),
                    "--dtype",
                    name,
                    "-q",
                ]
            )
            == 0
        )
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), tok[dt].encode(audio, sr=24000))
    codes = np.load(tmp_path / "float64.npy")
    ours = cli_wav(tmp_path, capsys, "codec", "decode", tmp_path / "float64.npy", "--dtype", "float64")
    np.testing.assert_array_equal(ours, tok[np.float64].decode(codes).astype(np.float32))
    assert not np.array_equal(ours, tok[np.float32].decode(codes))
    streamed = cli_wav(tmp_path, capsys, "codec", "decode", tmp_path / "float64.npy", "--stream", "--chunk-frames", 2)
    stream = tok[np.float32].stream()
    np.testing.assert_array_equal(streamed, np.concatenate([stream.push(codes[i : i + 2]) for i in range(0, 7, 2)]))
