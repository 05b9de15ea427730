"""Record the official speaker encoder (mel spectrogram + ECAPA-TDNN) -> golden/speaker_encoder.npz.

Runs the official ``Qwen3TTSForConditionalGeneration.extract_speaker_embedding`` code path (the
official ``mel_spectrogram`` with its fixed settings, then ``Qwen3TTSSpeakerEncoder``) on the tiny
checkpoint, for several signals and lengths, in float32 (the official precision: the inference
wrapper hands float32 audio) and float64 (float64 audio, the module cast to double), so that the
tests can measure the official float32 noise.  Also recorded:

- every stage of the encoder for two short inputs (forward hooks on the official modules);
- librosa's mel filterbank (float32, its default and what the official uses, and float64);
- which audio lengths the official accepts (around the shortest one that works);
- the official wrapper's resampling (librosa.resample, soxr) of 16 and 44.1 kHz signals and their x-vectors;
- the released speaker-encoder dimensions with random weights (0.6B-Base, enc_dim 1024): the mel and
  x-vector of one short input; and with bfloat16 weights (as released), the x-vector of 2 s.

Float64 run: the official ``mel_spectrogram`` pins the filterbank to float32 (``.float()``) and makes
the Hann window in the default dtype; for that run only, the default dtype is float64 and the module's
``torch.matmul`` promotes the float32 filterbank to float64 (its values unchanged).
"""

from __future__ import annotations

import json
import tempfile
import types
from pathlib import Path

import librosa
from common import CHECKPOINTS, np, save_golden, to_numpy, torch  # noqa: I001
from qwen_tts.core.models import modeling_qwen3_tts as mq
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
from safetensors.torch import load_file

SR = 24000
PREFIX = "speaker_encoder."
# module outputs recorded per stage (the names of the official submodules)
BLOCK_PARTS = ("tdnn1", "res2net_block", "tdnn2", "se_block")
STAGES_FOR = ("noise_1500", "noise_6000")


def load_official_encoder(directory: Path):
    config = json.loads((directory / "config.json").read_text())["speaker_encoder_config"]
    module = mq.Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**config))
    state = {
        k[len(PREFIX) :]: v for k, v in load_file(str(directory / "model.safetensors")).items() if k.startswith(PREFIX)
    }
    module.load_state_dict(state, strict=True)
    return module.eval()


class _PromotingTorch:
    """``torch`` for the official module namespace with a ``matmul`` that promotes mixed dtypes."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def matmul(a, b):
        dtype = torch.promote_types(a.dtype, b.dtype)
        return torch.matmul(a.to(dtype), b.to(dtype))


def official_embedding(encoder, audio: np.ndarray, precision: str, hooks: dict | None = None):
    """The official extract_speaker_embedding on a stand-in ``self`` holding only what it reads."""
    owner = types.SimpleNamespace(
        speaker_encoder=encoder,
        device=torch.device("cpu"),
        dtype=torch.float32 if precision == "f32" else torch.float64,
    )
    handles = []
    if hooks is not None:
        handles.append(encoder.register_forward_pre_hook(lambda m, inp: hooks.__setitem__("mel", inp[0])))
        names = dict(encoder.named_modules())
        for name, module in names.items():
            wanted = name in ("mfa", "asp", "asp.tdnn", "asp.conv", "fc") or (
                name.startswith("blocks.") and (name.count(".") == 1 or name.split(".")[-1] in BLOCK_PARTS)
            )
            if wanted:
                handles.append(module.register_forward_hook(lambda m, inp, out, _n=name: hooks.__setitem__(_n, out)))
        handles.append(
            names["asp.tdnn"].register_forward_hook(lambda m, inp, out: hooks.__setitem__("asp.context", inp[0]))
        )
    saved_torch, saved_default = mq.torch, torch.get_default_dtype()
    try:
        if precision == "f64":
            mq.torch = _PromotingTorch()
            torch.set_default_dtype(torch.float64)
        audio = audio.astype(np.float32 if precision == "f32" else np.float64)
        xvec = mq.Qwen3TTSForConditionalGeneration.extract_speaker_embedding(owner, audio=audio, sr=SR)
    finally:
        mq.torch = saved_torch
        torch.set_default_dtype(saved_default)
        for h in handles:
            h.remove()
    if hooks is not None:  # the attention weights: the softmax over time of asp.conv (no padding mask bites)
        hooks["asp.weights"] = torch.softmax(hooks["asp.conv"], dim=2)
    return xvec


def signals(rng) -> dict:
    """Test signals at 24 kHz, named kind_length."""
    t = lambda n: np.arange(n) / SR  # noqa: E731
    out = {}
    for n in (1280, 1500, 6000, 30000):  # the shortest accepted length, 5 frames, 23 frames, 1.25 s
        out[f"noise_{n}"] = 0.1 * rng.standard_normal(n)
    n = 36000  # a 1.5 s linear chirp 100 Hz -> 8 kHz
    out[f"chirp_{n}"] = 0.5 * np.sin(2 * np.pi * (100 * t(n) + (8000 - 100) / (2 * 1.5) * t(n) ** 2))
    n = 9000  # a voiced-like sound: 140 Hz harmonics with vibrato and a syllable envelope
    f0 = 140 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t(n)))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    out[f"voiced_{n}"] = 0.3 * np.sin(np.pi * t(n) / t(n)[-1]) * sum(np.sin(k * phase) / k for k in range(1, 12))
    out["quiet_12000"] = 1e-4 * rng.standard_normal(12000)  # mostly under the log clamp
    out["zeros_4000"] = np.zeros(4000)  # constant mels: the std clamp (1e-12) bites
    out["loud_5000"] = 2.0 * np.sin(2 * np.pi * 440 * t(5000))  # outside [-1, 1]: the official warns
    return out


def main() -> None:
    rng = np.random.default_rng(20260205)
    golden = {}
    tiny = load_official_encoder(CHECKPOINTS / "tiny-speaker-encoder")
    tiny64 = load_official_encoder(CHECKPOINTS / "tiny-speaker-encoder").double()

    # librosa's filterbank with the official settings
    mel_args = dict(sr=SR, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    golden["filterbank/f32"] = librosa.filters.mel(**mel_args)
    golden["filterbank/f64"] = librosa.filters.mel(**mel_args, dtype=np.float64)
    golden["filterbank/other/f64"] = librosa.filters.mel(
        sr=16000, n_fft=512, n_mels=80, fmin=20, fmax=None, dtype=np.float64
    )

    for key, audio in signals(rng).items():
        golden[f"{key}/audio"] = audio
        for prec, enc in (("f32", tiny), ("f64", tiny64)):
            hooks = {}
            xvec = official_embedding(enc, audio, prec, hooks)
            golden[f"{key}/{prec}/xvec"] = to_numpy(xvec)
            golden[f"{key}/{prec}/mel"] = to_numpy(hooks["mel"][0])  # [T, 128]
            if key in STAGES_FOR:
                for name, value in hooks.items():
                    if name != "mel":
                        golden[f"{key}/{prec}/stage/{name}"] = to_numpy(value[0])

    # which lengths the official accepts (reflect padding needs pad < length at every layer)
    lengths, accepted = [255, 256, 384, 385, 1023, 1024, 1279, 1280], []
    for n in lengths:
        try:
            official_embedding(tiny, 0.1 * rng.standard_normal(n), "f32")
            accepted.append(True)
        except Exception:  # noqa: BLE001 - any failure of the official code counts as "not accepted"
            accepted.append(False)
    golden["lengths/n"], golden["lengths/accepted"] = np.array(lengths), np.array(accepted)

    # the official wrapper resamples other rates with librosa.resample (soxr_hq) before the encoder
    for sr in (16000, 44100):
        n = sr  # one second: a rising chirp plus a little noise
        t = np.arange(n) / sr
        audio = 0.4 * np.sin(2 * np.pi * (200 * t + 1500 * t**2)) + 0.05 * rng.standard_normal(n)
        audio = audio.astype(np.float32)  # the wrapper's dtype
        resampled = librosa.resample(y=audio, orig_sr=sr, target_sr=SR)
        golden[f"sr{sr}/audio"] = audio
        golden[f"sr{sr}/resampled"] = resampled
        golden[f"sr{sr}/f32/xvec"] = to_numpy(official_embedding(tiny, resampled, "f32"))
        golden[f"sr{sr}/f64/xvec"] = to_numpy(official_embedding(tiny64, resampled, "f64"))
    noise = (0.1 * rng.standard_normal(16000)).astype(np.float32)  # white noise: fills the transition band
    golden["sr16000_noise/audio"] = noise
    golden["sr16000_noise/resampled"] = librosa.resample(y=noise, orig_sr=16000, target_sr=SR)

    # the released dimensions (0.6B-Base), random weights written by the repo's synthetic generator
    from refimpl.porting import presets, synthetic

    with tempfile.TemporaryDirectory() as tmp:
        synthetic.write_speaker_encoder(Path(tmp), presets.preset(presets.RELEASED_SPEAKER_ENCODER), seed=1234)
        big = load_official_encoder(Path(tmp))
        big64 = load_official_encoder(Path(tmp)).double()
    audio = 0.1 * rng.standard_normal(4800)
    golden["released/audio"] = audio
    for prec, enc in (("f32", big), ("f64", big64)):
        record = {}
        golden[f"released/{prec}/xvec"] = to_numpy(official_embedding(enc, audio, prec, record))
        golden[f"released/{prec}/mel"] = to_numpy(record["mel"][0])

    # the released dimensions with bfloat16 weights, as the released checkpoints store them (the official
    # module widens them to float32 at load), and 2 s of audio (188 mel frames): what our fast backend
    # computes on the AMX tiles where the machine has them, checked by the same rule as every x-vector
    with tempfile.TemporaryDirectory() as tmp:
        preset = presets.preset(presets.RELEASED_SPEAKER_ENCODER)
        synthetic.write_speaker_encoder(Path(tmp), preset, seed=4321, dtype="bfloat16")
        big = load_official_encoder(Path(tmp))
        big64 = load_official_encoder(Path(tmp)).double()
    audio = 0.1 * rng.standard_normal(2 * SR)
    golden["released_bf16/audio"] = audio
    for prec, enc in (("f32", big), ("f64", big64)):
        golden[f"released_bf16/{prec}/xvec"] = to_numpy(official_embedding(enc, audio, prec))
    save_golden("speaker_encoder", golden)


if __name__ == "__main__":
    main()
