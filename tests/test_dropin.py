"""The drop-in (``refimpl.Qwen3TTSModel``, ``refimpl.Qwen3TTSTokenizer``) against what the official package
returned for its own README examples on the tiny checkpoints (golden/dropin.json, recorded by
golden/oracle/record_dropin.py): the same return types and shapes, the same codes, the same waveforms."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from conftest import CHECKPOINTS, GOLDEN

import refimpl
import refimpl as qwen_tts
from golden.dropin_cases import Placeholders, reference_pcm16, write_pcm16
from refimpl import official_api
from refimpl.io.hub import ModelNotFoundError

GOLD = json.loads((GOLDEN / "dropin.json").read_text(encoding="utf-8"))
WAVEFORM_ATOL = 2e-5  # as tests/tts/test_talker.py: official float32 waveform vs ours on equal codes
SPK_ATOL = 1e-5  # as tests/tts/test_talker.py: x-vectors
PROMPT_ATOL = 1e-5  # the prompt vectors summed over the (tiny) hidden axis: float32 rounding only


@pytest.fixture(scope="module")
def ref_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("dropin") / "ref.wav"
    write_pcm16(path, reference_pcm16(), 24000)
    return path


def check_wavs_sr(out, expected: dict, what: str) -> None:
    assert type(out).__name__ == expected["type"] and len(out) == expected["len"], what
    wavs, sr = out
    assert type(wavs).__name__ == expected["wavs_type"], what
    assert sr == expected["sr"] and type(sr).__name__ == expected["sr_type"], what
    assert [type(w).__name__ for w in wavs] == expected["wav_types"], what
    assert [str(w.dtype) for w in wavs] == expected["wav_dtypes"], what
    assert [list(w.shape) for w in wavs] == expected["wav_shapes"], what
    for w, s in zip(wavs, expected["wavs"], strict=True):
        np.testing.assert_allclose(w[:8], s["first"], rtol=0, atol=WAVEFORM_ATOL, err_msg=what)
        assert abs(float(np.sqrt(np.mean(w.astype(np.float64) ** 2))) - s["rms"]) <= WAVEFORM_ATOL, what
        assert abs(float(np.max(np.abs(w))) - s["peak"]) <= WAVEFORM_ATOL, what


def check_prompt(items, expected: dict, what: str) -> None:
    assert type(items).__name__ == expected["type"], what
    assert [type(i).__name__ for i in items] == expected["item_types"], what
    assert list(items[0].__dataclass_fields__) == expected["fields"], what
    for item, e in zip(items, expected["items"], strict=True):
        if e["ref_code"] is None:
            assert item.ref_code is None, what
        else:
            assert item.ref_code.dtype == np.int64 and e["ref_code_dtype"] == "torch.int64", what
            np.testing.assert_array_equal(item.ref_code, e["ref_code"], err_msg=what)
        assert list(item.ref_spk_embedding.shape) == e["spk_shape"], what
        np.testing.assert_allclose(item.ref_spk_embedding[:8], e["spk_first"], rtol=0, atol=SPK_ATOL, err_msg=what)
        assert (item.x_vector_only_mode, item.icl_mode, item.ref_text) == (
            e["x_vector_only_mode"],
            e["icl_mode"],
            e["ref_text"],
        ), what


def check_encoded(enc, expected: dict, what: str) -> None:
    if expected["type"] == "tuple":
        assert type(enc) is tuple and len(enc) == expected["len"], what
        codes = enc[0]
    else:
        assert type(enc).__name__ == expected["type"], what
        assert list(enc.keys()) == expected["keys"] and len(enc) == expected["len"], what
        assert list(iter(enc)) == expected["iter"] and type(enc[0]).__name__ == expected["item0_type"], what
        assert type(enc.audio_codes).__name__ == expected["codes_type"], what
        assert len(enc.to_tuple()) == expected["to_tuple_len"] and enc["audio_codes"] is enc.audio_codes, what
        codes = enc.audio_codes
    assert [c.dtype for c in codes] == [np.int64] * len(codes)
    assert all(d == "torch.int64" for d in expected["code_dtypes"])
    assert len(codes) == len(expected["codes"]), what
    for c, e in zip(codes, expected["codes"], strict=True):
        np.testing.assert_array_equal(c, e, err_msg=what)


@pytest.fixture(scope="module")
def models():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", official_api.IgnoredArgumentWarning)
        return {
            kind: qwen_tts.Qwen3TTSModel.from_pretrained(
                str(CHECKPOINTS / f"tiny-{kind}"), device_map="cpu", dtype="float32", attn_implementation="sdpa"
            )
            for kind in ("customvoice", "voicedesign", "base")
        }


def test_supported_speakers_and_languages_as_the_official(models):
    for kind, expected in GOLD["model"]["supported"].items():
        assert models[kind].get_supported_speakers() == expected["speakers"], kind
        assert models[kind].get_supported_languages() == expected["languages"], kind


def test_official_model_examples(models, ref_wav):
    """Every README example of Qwen3TTSModel, in order (later ones use earlier results), greedy."""
    ph = Placeholders(ref_wav)
    for case in GOLD["model"]["cases"]:
        call = {k: ph.value(v) for k, v in case["kwargs"].items()}
        method = getattr(models[case["model"]], case["method"])
        if case["method"] == "create_voice_clone_prompt":
            out = method(**call)
            check_prompt(out, case["returns"], case["name"])
        else:
            out = method(**call, **GOLD["greedy"], return_codes=True)
            assert [c.tolist() for c in out[2]] == case["codes"], case["name"]
            np.testing.assert_allclose(
                models[case["model"]].last_log.prompt_embeds.sum(axis=-1),
                case["prompt_sums"],
                rtol=0,
                atol=PROMPT_ATOL,
                err_msg=case["name"],
            )
            out = out[:2]
            check_wavs_sr(out, case["returns"], case["name"])
        ph.outputs[case["name"]] = out


@pytest.mark.soxr_optional  # a 16 kHz example is resampled; what is checked holds with either resampler
def test_official_tokenizer_examples(ref_wav):
    tok = qwen_tts.Qwen3TTSTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    rates = GOLD["tokenizer"]["rates"]
    assert (
        tok.get_model_type(),
        tok.get_input_sample_rate(),
        tok.get_output_sample_rate(),
        tok.get_encode_downsample_rate(),
        tok.get_decode_upsample_rate(),
    ) == (rates["model_type"], rates["input"], rates["output"], rates["encode_downsample"], rates["decode_upsample"])
    ph = Placeholders(ref_wav)
    for case in GOLD["tokenizer"]["cases"]:
        out = getattr(tok, case["method"])(**{k: ph.value(v) for k, v in case["kwargs"].items()})
        if case["method"] == "encode":
            check_encoded(out, case["returns"], case["name"])
        else:
            check_wavs_sr(out, case["returns"], case["name"])
        ph.outputs[case["name"]] = out


# ----------------------------------------------------------------------------- loading as the official


def test_torch_only_arguments_are_noted_once(monkeypatch):
    monkeypatch.setattr(official_api, "_NOTED", set())
    with pytest.warns(official_api.IgnoredArgumentWarning, match="low_cpu_mem_usage") as record:
        qwen_tts.Qwen3TTSTokenizer.from_pretrained("default", low_cpu_mem_usage=True)
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no note
        qwen_tts.Qwen3TTSTokenizer.from_pretrained("default", low_cpu_mem_usage=True)


def test_device_map_cuda_loads_on_the_device_backend_or_says_why_not(monkeypatch):
    """device_map="cuda:0" asks for the cupy backend: where it cannot run, the model loads on the CPU and
    one note says what is missing; where it can (here: the cupy backend stood in by the strict device
    backend, so CI exercises the path), the weights are uploaded and the model runs there."""
    from refimpl import backends as kernels

    monkeypatch.setattr(official_api, "_NOTED", set())

    def no_cupy(name):
        raise kernels.BackendUnavailable("backend 'cupy': CuPy is not installed")

    monkeypatch.setattr(kernels, "device_module", no_cupy)
    with pytest.warns(official_api.IgnoredArgumentWarning, match="running on the CPU, since backend 'cupy'"):
        tok = qwen_tts.Qwen3TTSTokenizer.from_pretrained("default", device_map="cuda:0")
    assert tok.device == "cpu" and tok.tokenizer.backend is None
    monkeypatch.undo()

    monkeypatch.setattr(official_api, "backend_of_device", lambda device: "strict" if device == "cuda" else None)
    host = qwen_tts.Qwen3TTSTokenizer.from_pretrained("default")
    dev = qwen_tts.Qwen3TTSTokenizer.from_pretrained("default", device_map="cuda")
    assert dev.device == "cuda:0" and dev.tokenizer.backend == "strict" and host.tokenizer.backend is None
    codes = np.random.default_rng(0).integers(0, 64, size=(3, 16))
    (wav_dev,), sr = dev.decode({"audio_codes": [codes]})
    with refimpl.use_backend("numpy"):  # the strict device runs the reference formulas: the same bits
        (wav_host,), _ = host.decode({"audio_codes": [codes]})
    assert isinstance(wav_dev, np.ndarray) and np.array_equal(wav_dev, wav_host)


class FakeTorchDtype:
    """What str() of a torch dtype looks like (the tests never import torch)."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


def test_dtype_mapping(monkeypatch):
    monkeypatch.setattr(official_api, "_NOTED", set())
    assert official_api.compute_dtype_of(FakeTorchDtype("float32")) is np.float32
    assert official_api.compute_dtype_of(FakeTorchDtype("float64")) is np.float64
    assert official_api.compute_dtype_of(None) is np.float32
    with pytest.warns(official_api.IgnoredArgumentWarning, match="float32 from the stored weights"):
        assert official_api.compute_dtype_of(FakeTorchDtype("bfloat16")) is np.float32
    with pytest.raises(ValueError, match="dtype must be"):
        official_api.compute_dtype_of("int8")
    with pytest.raises(TypeError, match="pass dtype or torch_dtype"):
        qwen_tts.Qwen3TTSModel.from_pretrained("default", dtype="float32", torch_dtype="float32")
    with pytest.raises(TypeError, match="quantization_config"):
        qwen_tts.Qwen3TTSModel.from_pretrained("default", quantization_config={})


def test_flash_attention_selects_the_sliding_codec_encoder():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", official_api.IgnoredArgumentWarning)
        assert (
            qwen_tts.Qwen3TTSTokenizer.from_pretrained(
                "default", attn_implementation="flash_attention_2"
            ).encoder_attention
            == "sliding"
        )
        assert (
            qwen_tts.Qwen3TTSTokenizer.from_pretrained("default", attn_implementation="sdpa").encoder_attention
            == "full"
        )


def test_bad_audio_inputs_are_clear_errors(tmp_path):
    tok = qwen_tts.Qwen3TTSTokenizer.from_pretrained("default")
    with pytest.raises(ValueError, match="does not use the network"):
        tok.encode("https://example.com/a.wav")
    with pytest.raises(ValueError, match="provide `sr`"):
        tok.encode(np.zeros(1000, dtype=np.float32))
    with pytest.raises(TypeError, match="Mixed input types"):
        tok.encode([np.zeros(1000, dtype=np.float32), "a.wav"], sr=24000)
    with pytest.raises(ValueError, match="neither a file path nor valid base64"):
        tok.encode("!" * 300)
    with pytest.raises(TypeError, match="encode output, a dict, or a list of dicts"):
        tok.decode(np.zeros((3, 16), dtype=np.int64))
    model = refimpl.Qwen3TTSModel.from_pretrained("default-base")
    with pytest.raises(ValueError, match="does not use the network"):
        model.create_voice_clone_prompt("http://example.com/a.wav", x_vector_only_mode=True)


def test_names_resolve_to_the_embedded_models():
    assert qwen_tts.Qwen3TTSModel.from_pretrained("default").tts_model_type == "custom_voice"
    assert qwen_tts.Qwen3TTSModel.from_pretrained("default-voicedesign").tts_model_type == "voice_design"
    with pytest.raises(ModelNotFoundError, match="did you mean the repo id 'Qwen/Qwen3-TTS-12Hz-0.6B-Base'"):
        qwen_tts.Qwen3TTSModel.from_pretrained("Qwen3-TTS-12Hz-0.6B-Base")
