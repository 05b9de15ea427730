"""The speaker encoder (refimpl.tts.speaker_encoder) and its mel front end (refimpl.tts.mel) against the
official implementation's recorded outputs.

golden/speaker_encoder.npz is written by golden/oracle/record_speaker_encoder.py (the official
mel_spectrogram + Qwen3TTSSpeakerEncoder, float32 and float64 runs) on the committed tiny checkpoint
golden/checkpoints/tiny-speaker-encoder and on the released dimensions with random weights.

Tolerances: the shared rule of docs/golden.md (conftest.assert_close_to_oracle): float64 within
1e-10 x scale of the official float64 run; float32 within 4 x the measured official float32 noise
(|official_f32 - official_f64| of the same array) + 4 eps32 x scale, of both official runs.  The measured
numbers are in docs/speaker_encoder.md.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from conftest import CHECKPOINTS, assert_close_to_oracle
from conftest import GOLDEN as GOLDEN_DIR

from refimpl.io.checkpoint import CheckpointError, read_checkpoint_weights
from refimpl.porting import presets, synthetic
from refimpl.tts import mel
from refimpl.tts import speaker_encoder as speaker

GOLDEN = np.load(GOLDEN_DIR / "speaker_encoder.npz")
TINY_DIR = CHECKPOINTS / "tiny-speaker-encoder"

SIGNALS = sorted(
    k[: -len("/audio")] for k in GOLDEN.files if k.endswith("/audio") and not k.startswith(("sr", "released"))
)
STAGE_SIGNALS = sorted({k.split("/")[0] for k in GOLDEN.files if "/stage/" in k})


@pytest.fixture(scope="module")
def encoders():
    return {
        "f32": speaker.SpeakerEncoder.from_pretrained(TINY_DIR, np.float32),
        "f64": speaker.SpeakerEncoder.from_pretrained(TINY_DIR, np.float64),
    }


@pytest.fixture(scope="module")
def runs(encoders, backend):
    """x-vector and trace of every recorded signal, in both precisions (computed once per backend)."""
    out = {}
    for key in SIGNALS:
        for prec, enc in encoders.items():
            trace = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the loud signal warns (tested separately)
                xvec = enc.embed(GOLDEN[f"{key}/audio"], trace=trace)
            out[key, prec] = xvec, trace
    return out


def assert_close_to_official(ours, key_f32, key_f64, prec, what):
    """The shared tolerance rule, for one recorded check; also checks the compute dtype."""
    assert ours.dtype == (np.float32 if prec == "f32" else np.float64), f"{what}: dtype {ours.dtype}"
    assert_close_to_oracle(ours, GOLDEN[key_f32], GOLDEN[key_f64], prec, what)


# ----------------------------------------------------------------------------- the mel filterbank


def test_filterbank_float32_is_librosa_to_one_ulp():
    ours = mel.mel_filterbank(24000, 1024, 128, 0, 12000)
    assert ours.dtype == np.float32 and ours.shape == (128, 513)
    np.testing.assert_array_max_ulp(ours, GOLDEN["filterbank/f32"], maxulp=1)


@pytest.mark.parametrize(
    "args, key",
    [((24000, 1024, 128, 0, 12000), "filterbank/f64"), ((16000, 512, 80, 20, None), "filterbank/other/f64")],
)
def test_filterbank_float64_matches_librosa(args, key):
    ours = mel.mel_filterbank(*args, dtype=np.float64)
    np.testing.assert_allclose(ours, GOLDEN[key], rtol=1e-12, atol=1e-15)


def test_mel_scale_round_trip_and_break_point():
    f = np.array([0.0, 500.0, 1000.0, 4000.0, 12000.0])
    np.testing.assert_allclose(mel.mel_to_hz(mel.hz_to_mel(f)), f, rtol=1e-12, atol=1e-9)
    assert mel.hz_to_mel(1000.0) == pytest.approx(15.0)  # 1000 Hz / (200/3 Hz per mel)


def test_the_front_end_is_importable_from_the_speaker_encoder_as_before():
    for name in ("hz_to_mel", "mel_to_hz", "mel_filterbank", "hann_window", "mel_spectrogram", "mel_frame_count"):
        assert getattr(speaker, name) is getattr(mel, name) and name in speaker.__all__


def test_hann_window_is_periodic():
    w = mel.hann_window(8, np.float64)
    np.testing.assert_allclose(w, 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8))
    assert w[0] == 0 and w[4] == 1  # periodic: the peak is at n / 2 and the last sample is not 0


# ----------------------------------------------------------------------------- mel spectrogram and x-vector


@pytest.mark.parametrize("prec", ["f32", "f64"])
@pytest.mark.parametrize("key", SIGNALS)
def test_mel_spectrogram_matches_official(runs, key, prec):
    _, trace = runs[key, prec]
    assert_close_to_official(trace["mel"], f"{key}/f32/mel", f"{key}/f64/mel", prec, f"{key} mel")


@pytest.mark.parametrize("prec", ["f32", "f64"])
@pytest.mark.parametrize("key", SIGNALS)
def test_xvector_matches_official(runs, key, prec):
    xvec, _ = runs[key, prec]
    assert_close_to_official(xvec, f"{key}/f32/xvec", f"{key}/f64/xvec", prec, f"{key} x-vector")


@pytest.mark.parametrize("prec", ["f32", "f64"])
@pytest.mark.parametrize("key", STAGE_SIGNALS)
def test_every_stage_matches_official(runs, key, prec):
    _, trace = runs[key, prec]
    recorded = sorted(k.split("/stage/")[1] for k in GOLDEN.files if k.startswith(f"{key}/{prec}/stage/"))
    assert set(recorded) == set(speaker.STAGES), "the golden file and STAGES name different stages"
    for name in speaker.STAGES:
        assert_close_to_official(
            trace[name][0], f"{key}/f32/stage/{name}", f"{key}/f64/stage/{name}", prec, f"{key} stage {name}"
        )


def test_public_mel_spectrogram_defaults_and_batch():
    a = GOLDEN["noise_6000/audio"]
    b = GOLDEN["voiced_9000/audio"][:6000]
    single = mel.mel_spectrogram(a)  # the official settings are the defaults
    assert single.dtype == np.float64 and single.shape == (128, mel.mel_frame_count(6000))
    assert_close_to_official(single.T, "noise_6000/f32/mel", "noise_6000/f64/mel", "f64", "public mel")
    batch = mel.mel_spectrogram(np.stack([a, b]).astype(np.float32))
    assert batch.dtype == np.float32 and batch.shape == (2,) + single.shape
    for row, audio in zip(batch, (a, b), strict=True):  # rows are independent: equal to one-at-a-time in float32
        np.testing.assert_allclose(row, mel.mel_spectrogram(audio.astype(np.float32)), rtol=0, atol=1e-6)


def test_shortest_accepted_length_is_the_official_one(encoders):
    enc = encoders["f32"]
    rng = np.random.default_rng(0)
    for n, accepted in zip(GOLDEN["lengths/n"], GOLDEN["lengths/accepted"], strict=True):
        audio = 0.1 * rng.standard_normal(int(n))
        if accepted:
            assert enc.embed(audio).shape == (24,)
        else:
            with pytest.raises(ValueError, match="too short"):
                enc.embed(audio)
    assert enc.min_samples == int(GOLDEN["lengths/n"][GOLDEN["lengths/accepted"]].min())


# ----------------------------------------------------------------------------- resampling


@pytest.mark.needs_soxr
@pytest.mark.parametrize("key, sr", [("sr16000", 16000), ("sr44100", 44100), ("sr16000_noise", 16000)])
def test_resampling_equals_the_official_soxr(key, sr):
    audio, official = GOLDEN[f"{key}/audio"], GOLDEN[f"{key}/resampled"]
    ours = speaker.resample(audio, sr, 24000)
    assert ours.shape == official.shape and ours.dtype == np.float32  # librosa's length rule: ceil(N * ratio)
    np.testing.assert_array_equal(ours, official)
    np.testing.assert_array_equal(speaker.resample(audio.astype(np.float64), sr, 24000), official)


@pytest.mark.parametrize("key, sr", [("sr16000", 16000), ("sr44100", 44100), ("sr16000_noise", 16000)])
def test_polyphase_fallback_is_close_to_the_official_soxr(key, sr):
    audio, official = GOLDEN[f"{key}/audio"], GOLDEN[f"{key}/resampled"]
    ours = speaker.resample(audio, sr, 24000, method="polyphase")
    assert ours.shape == official.shape and ours.dtype == np.float32
    rel_rms = np.sqrt(np.mean((ours.astype(np.float64) - official) ** 2) / np.mean(official.astype(np.float64) ** 2))
    assert rel_rms < 3e-3, f"resampled audio differs from soxr by {rel_rms:.2e} rms (relative)"


def assert_xvector_of_other_rate(encoders, key, sr, audio, rate):
    """The x-vector of the {sr} Hz signal ``key`` given as ``audio`` at ``rate`` Hz, in both precisions, against
    the official: the same tolerance as every float32 check (the official wrapper's resampled audio, or our own
    resampling of the original: the same samples, with soxr)."""
    assert_close_to_official(
        encoders["f32"].embed(audio, sr=rate),
        f"{key}/f32/xvec",
        f"{key}/f64/xvec",
        "f32",
        f"x-vector of {sr} Hz audio (given at {rate} Hz)",
    )
    assert_close_to_official(
        encoders["f64"].embed(audio, sr=rate),
        f"{key}/f32/xvec",
        f"{key}/f64/xvec",
        "f64",
        f"x-vector of {sr} Hz audio (given at {rate} Hz)",
    )


@pytest.mark.parametrize("key, sr", [("sr16000", 16000), ("sr44100", 44100)])
def test_xvector_of_audio_the_official_resampled(encoders, key, sr):
    assert_xvector_of_other_rate(encoders, key, sr, GOLDEN[f"{key}/resampled"], 24000)


@pytest.mark.needs_soxr
@pytest.mark.parametrize("key, sr", [("sr16000", 16000), ("sr44100", 44100)])
def test_xvector_of_other_rates(encoders, key, sr):
    assert_xvector_of_other_rate(encoders, key, sr, GOLDEN[f"{key}/audio"], sr)


def test_polyphase_fallback_xvector_is_close(encoders):
    official = GOLDEN["sr16000/f32/xvec"]
    audio = speaker.resample(GOLDEN["sr16000/audio"], 16000, 24000, method="polyphase")
    rel = np.linalg.norm(encoders["f32"].embed(audio) - official) / np.linalg.norm(official)
    assert rel < 5e-3, f"x-vector from the polyphase fallback differs from the official by {rel:.2e} (relative)"


# ----------------------------------------------------------------------------- the released dimensions


@pytest.mark.parametrize("prec", ["f32", "f64"])
def test_released_dimensions(prec):
    cfg = speaker.SpeakerEncoderConfig.from_dict(presets.RELEASED_SPEAKER_ENCODER)
    tensors = synthetic.random_weights(speaker.speaker_encoder_checkpoint_spec(cfg), 1234)
    weights = {k[len(speaker.CHECKPOINT_PREFIX) :]: v for k, v in tensors.items()}
    enc = speaker.SpeakerEncoder(cfg, weights, np.float32 if prec == "f32" else np.float64)
    trace = {}
    xvec = enc.embed(GOLDEN["released/audio"], trace=trace)
    assert xvec.shape == (1024,)
    assert_close_to_official(trace["mel"], "released/f32/mel", "released/f64/mel", prec, "released mel")
    assert_close_to_official(xvec, "released/f32/xvec", "released/f64/xvec", prec, "released x-vector")


@pytest.mark.parametrize("prec", ["f32", "f64"])
def test_released_dimensions_with_bf16_weights(backend, prec, tmp_path):
    """The released dimensions with bfloat16 weights as the released checkpoints store them (written by the
    synthetic generator, read by the loader), 2 s of audio, nothing traced: on the fast backend the TDNNs of
    512 and 1536 outputs run on the AMX tiles where the machine has them (the weights' bf16 words as the A
    tiles, the signal in three exact parts), and the x-vector keeps the rule of every other one."""
    synthetic.write_speaker_encoder(tmp_path, presets.preset(presets.RELEASED_SPEAKER_ENCODER), 4321, "bfloat16")
    enc = speaker.SpeakerEncoder.from_pretrained(tmp_path, np.float32 if prec == "f32" else np.float64)
    xvec = enc.embed(GOLDEN["released_bf16/audio"])
    what = "released x-vector, bf16 weights"
    assert_close_to_official(xvec, "released_bf16/f32/xvec", "released_bf16/f64/xvec", prec, what)
    if backend == "numba" and prec == "f32":
        from refimpl.backends import numba_cpu

        assert (id(enc.weights["mfa.conv.weight"]) in numba_cpu.amx_conv._TDNN_TILES) == numba_cpu.amx.USE_TILES


# ----------------------------------------------------------------------------- checkpoint and config


def test_committed_checkpoint_is_the_seeded_synthetic_one():
    config = json.loads((TINY_DIR / "config.json").read_text())
    assert config["speaker_encoder_config"] == presets.TINY_SPEAKER_ENCODER
    cfg = speaker.SpeakerEncoderConfig.from_dict(config["speaker_encoder_config"])
    expected = synthetic.random_weights(speaker.speaker_encoder_checkpoint_spec(cfg), 1234)
    stored = read_checkpoint_weights(TINY_DIR, np.float32)
    assert sorted(stored) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(stored[name], expected[name])


def test_released_config_shapes():
    for preset, enc_dim in ((presets.RELEASED_SPEAKER_ENCODER, 1024), (presets.RELEASED_SPEAKER_ENCODER_1_7B, 2048)):
        cfg = speaker.SpeakerEncoderConfig.from_dict(preset)
        spec = {s.name: s.shape for s in speaker.speaker_encoder_weight_spec(cfg)}
        assert len(spec) == 76
        assert spec["fc.weight"] == (enc_dim, 3072, 1)
        assert spec["asp.tdnn.conv.weight"] == (128, 4608, 1)
        assert spec["blocks.3.res2net_block.blocks.6.conv.weight"] == (64, 64, 3)
    assert speaker.SpeakerEncoderConfig.from_dict({}).enc_dim == 1024  # the official default


@pytest.mark.parametrize(
    "change, message",
    [
        ({"enc_channels": [16, 16, 16, 16, 40]}, "sum"),
        ({"enc_channels": [16, 16, 8, 16, 40]}, "equal"),
        ({"enc_res2net_scale": 3}, "divisible"),
        ({"enc_dilations": [1, 2, 3, 1]}, "same length"),
    ],
)
def test_bad_configs(change, message):
    with pytest.raises(ValueError, match=message):
        speaker.SpeakerEncoderConfig.from_dict({**presets.TINY_SPEAKER_ENCODER, **change})


def test_loader_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        speaker.SpeakerEncoder.from_pretrained(tmp_path / "nothing")
    (tmp_path / "config.json").write_text(json.dumps({"tts_model_type": "custom_voice"}))
    with pytest.raises(CheckpointError, match="only Base models"):
        speaker.SpeakerEncoder.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"talker_config": {}}))
    with pytest.raises(CheckpointError, match="no speaker_encoder_config"):
        speaker.SpeakerEncoder.from_pretrained(tmp_path)
    cfg = speaker.SpeakerEncoderConfig.from_dict(presets.TINY_SPEAKER_ENCODER)
    tensors = synthetic.random_weights(speaker.speaker_encoder_checkpoint_spec(cfg), 1)
    del tensors["speaker_encoder.fc.bias"]
    synthetic.write_checkpoint(tmp_path, {"speaker_encoder_config": presets.TINY_SPEAKER_ENCODER}, tensors)
    with pytest.raises(CheckpointError, match="fc.bias"):
        speaker.SpeakerEncoder.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        speaker.SpeakerEncoder.from_pretrained(TINY_DIR, np.float16)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.soxr_optional  # the 16 kHz case resamples (either resampler gives 1200 samples: too short)
@pytest.mark.parametrize(
    "audio, sr, message",
    [
        (np.full(4000, np.nan), 24000, "NaN or infinite"),
        (np.concatenate([np.zeros(3000), [np.inf]]), 24000, "NaN or infinite"),
        (np.zeros((2, 4000)), 24000, "rank 1"),
        (np.float64(0.5), 24000, "rank 1"),
        (np.array(["a"] * 4000), 24000, "numeric"),
        (np.zeros(4000, dtype=complex), 24000, "numeric"),
        (np.zeros(1279), 24000, "too short.*1280"),
        (np.zeros(0), 24000, "too short"),
        (np.zeros(800), 16000, "too short"),  # 1200 samples after resampling
        (np.zeros(4000), 0, "sample rate"),
        (np.zeros(4000), -16000, "sample rate"),
        (np.zeros(4000), 22050.5, "sample rate"),
        (np.zeros(4000), "24000", "sample rate"),
        (np.zeros(4000), True, "sample rate"),
    ],
)
def test_bad_audio_is_a_value_error(encoders, audio, sr, message):
    with pytest.raises(ValueError, match=message):
        encoders["f32"].embed(audio, sr=sr)


def test_float_sample_rate_and_integer_audio(encoders):
    audio = GOLDEN["noise_6000/audio"]
    np.testing.assert_array_equal(encoders["f32"].embed(audio, sr=24000.0), encoders["f32"].embed(audio))
    # integer PCM is scaled to [-1, 1) as reading it from a WAV file would (x / 32768), not used as raw numbers
    pcm = np.round(audio * 10000).astype(np.int16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(encoders["f32"].embed(pcm), encoders["f32"].embed(pcm / 32768.0))


def test_out_of_range_audio_warns_and_is_used_as_is(encoders):
    with pytest.warns(UserWarning, match=r"exceeds \[-1, 1\]"):
        xvec = encoders["f32"].embed(GOLDEN["loud_5000/audio"])
    assert np.all(np.isfinite(xvec))


def test_mel_spectrogram_bad_input():
    with pytest.raises(ValueError, match="too short"):
        mel.mel_spectrogram(np.zeros(384))
    with pytest.raises(ValueError, match="NaN"):
        mel.mel_spectrogram(np.array([0.0] * 999 + [np.nan]))
    with pytest.raises(ValueError, match=r"\[N\] or \[B, N\]"):
        mel.mel_spectrogram(np.zeros((1, 1, 2000)))


def test_forward_checks_mel_shape(encoders):
    with pytest.raises(ValueError, match="mels must be"):
        encoders["f32"].forward(np.zeros((1, 10, 80)))
    with pytest.raises(ValueError, match="too few"):
        encoders["f32"].forward(np.zeros((1, 4, 128)))
