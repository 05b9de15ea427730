"""The cupy backend's twins inside the whole pipeline, on a machine without a GPU: the backend layer's strict
stand-in device (NumPy underneath, as strict as CuPy about host round trips) runs THESE twins, their CUDA
kernels replayed in NumPy (tests/backends/cupy_cuda/replays.py).  Decode, streaming, encode and greedy
text-to-speech equal the numpy backend, and a bf16 checkpoint keeps its words on the device (needs the
stand-in: skipped, saying so, in a tree without it).  The whole parity suite the same way:
tests/backends/cupy_cuda/twins_on_strict.py; the same twins on a real GPU: tests/backends/test_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.backends import cupy_cuda
from refimpl.backends.cupy_cuda import device as cuda_device

from .replays import put_these_twins_on_the_strict_stand_in


@pytest.fixture
def cupy_twins_on_the_strict_stand_in(monkeypatch):
    strict = pytest.importorskip(
        "refimpl.backends.strict_device", reason="the strict stand-in of the backend layer is not in this tree"
    )
    return put_these_twins_on_the_strict_stand_in(monkeypatch.setattr, strict)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_pipeline_with_these_twins_on_device_arrays_equals_numpy(cupy_twins_on_the_strict_stand_in, dtype):
    """Decode (one pass and streamed), encode and greedy text-to-speech with the twins on device arrays: the
    twins take what the stages hand them (no host array reaches the device but through to_device, no device
    array is read implicitly) and give the numpy backend's results (float32: within the reordered sums)."""
    from conftest import CHECKPOINTS

    from refimpl import Qwen3TTS, SpeechTokenizer
    from refimpl.backends import use_backend

    calls = cupy_twins_on_the_strict_stand_in
    tol = 1e-12 if dtype == np.float64 else 2e-5  # float32: the decoder parity tests' waveform tolerance
    with use_backend("numpy"):
        cpu_tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=dtype)
        cpu_tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=dtype)
    with use_backend("strict"):
        dev_tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=dtype)
        dev_tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=dtype)
    codes = np.random.default_rng(0).integers(0, cpu_tok.codebook_size, size=(23, cpu_tok.num_quantizers))
    wav = dev_tok.decode(codes)
    assert isinstance(wav, np.ndarray)
    np.testing.assert_allclose(wav, cpu_tok.decode(codes), rtol=0, atol=tol)
    stream = dev_tok.stream()
    np.testing.assert_allclose(
        np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, 23, 4)]), wav, rtol=0, atol=tol
    )
    audio = (0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
    np.testing.assert_array_equal(dev_tok.encode(audio, sr=24000), cpu_tok.encode(audio, sr=24000))
    greedy = dict(
        text="The GPU speaks as the CPU does.",
        speaker="vivian",
        language="english",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=8,
        return_codes=True,
    )
    dev_wavs, _, dev_codes = dev_tts.generate_custom_voice(**greedy)
    cpu_wavs, _, cpu_codes = cpu_tts.generate_custom_voice(**greedy)
    np.testing.assert_array_equal(dev_codes[0], cpu_codes[0])
    np.testing.assert_allclose(dev_wavs[0], cpu_wavs[0], rtol=0, atol=tol)
    ran = {name for name, n in calls.items() if n}
    assert ran == set(cupy_cuda.TWINS), sorted(set(calls) - ran)  # every twin ran


@pytest.fixture(scope="module")
def bf16_custom_voice(tmp_path_factory):
    """The tiny CustomVoice model with its weights stored in bfloat16, as the released checkpoints store them
    (the talker's and code predictor's matrices then load as BF16Matrix)."""
    import shutil

    from conftest import CHECKPOINTS

    from refimpl.io.checkpoint import read_safetensors_file, write_safetensors_file

    source, path = CHECKPOINTS / "tiny-customvoice", tmp_path_factory.mktemp("bf16") / "tiny-customvoice-bf16"
    shutil.copytree(source, path, ignore=lambda folder, names: ["model.safetensors"] if folder == str(source) else [])
    weights = read_safetensors_file(source / "model.safetensors", np.float32)
    write_safetensors_file(path / "model.safetensors", weights, "bfloat16")
    return path


def generate_greedy(model, frames: int = 4):
    wavs, _, codes = model.generate_custom_voice(
        "Half the bytes.", speaker="vivian", language="english", do_sample=False, subtalker_dosample=False,
        max_new_tokens=frames, return_codes=True,
    )  # fmt: skip
    return wavs[0], codes[0]


@pytest.mark.parametrize("twins", ["cupy twins", "reference formulas"])
def test_bf16_words_stay_bf16_on_the_device(bf16_custom_voice, monkeypatch, twins):
    """A bf16 checkpoint on a device backend keeps its matrices as 16-bit words on the device (half the bytes of
    float32): with the cupy twins the bf16 kernel reads them in every generation step (replayed here), with the
    reference formulas every use widens what it takes; greedy generation equals the host's either way."""
    from refimpl import Qwen3TTS
    from refimpl.backends import strict_device, use_backend
    from refimpl.backends.bf16 import BF16Matrix

    launches = []
    if twins == "cupy twins":
        put_these_twins_on_the_strict_stand_in(monkeypatch.setattr, strict_device)
        replay = cuda_device.kernel

        def counted(file_name, name, instances=()):
            launch = replay(file_name, name, instances)
            return (lambda *a: launches.append(1) or launch(*a)) if name == "bf16_rows_times" else launch

        monkeypatch.setattr(cuda_device, "kernel", counted)
    with use_backend("numpy"):
        cpu = Qwen3TTS.from_pretrained(bf16_custom_voice, dtype=np.float32)
    with use_backend("strict"):
        dev = Qwen3TTS.from_pretrained(bf16_custom_voice, dtype=np.float32)
    for weights in (dev.talker.weights, dev.talker.code_predictor.weights):
        kept = [w for w in weights.values() if isinstance(w, BF16Matrix)]
        assert kept and all(isinstance(w.bits, strict_device.StrictArray) for w in kept)
    assert isinstance(dev.talker.weights["codec_head.weight"], BF16Matrix)
    dev_wav, dev_codes = generate_greedy(dev)
    cpu_wav, cpu_codes = generate_greedy(cpu)
    np.testing.assert_array_equal(dev_codes, cpu_codes)
    np.testing.assert_allclose(dev_wav, cpu_wav, rtol=0, atol=2e-5)
    assert bool(launches) == (twins == "cupy twins")
