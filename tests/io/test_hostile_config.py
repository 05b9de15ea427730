"""Config values the math cannot work with, and NaN / infinity anywhere: one clear error naming the key (or
the tensor, or the network stage), never NaN output, an IndexError or a ZeroDivisionError."""

from __future__ import annotations

import contextlib
import json
import shutil

import numpy as np
import pytest
from conftest import CHECKPOINTS
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import CheckpointError, Qwen3TTS, SpeechTokenizer
from refimpl.io.checkpoint import read_safetensors_file, write_safetensors_file
from refimpl.io.validate import NonFiniteError
from refimpl.tts.speaker_encoder import SpeakerEncoder


def copy_model(tmp_path, name):
    target = tmp_path / name
    shutil.copytree(CHECKPOINTS / name, target)
    return target


def edit_config(path, edit):
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def set_key(section: list, key, value):
    def edit(config):
        node = config
        for part in section:
            node = node[part]
        node[key] = value

    return edit


TALKER = ["talker_config"]
PREDICTOR = ["talker_config", "code_predictor_config"]


MODEL_CASES = [
    (TALKER, "rms_norm_eps", -1e-6, "talker_config.rms_norm_eps must be a finite number > 0, got -1e-06"),
    (TALKER, "rms_norm_eps", 0, "talker_config.rms_norm_eps must be a finite number > 0, got 0"),
    (TALKER, "rope_theta", 0, "talker_config.rope_theta must be a finite number > 0, got 0"),
    (TALKER, "rope_theta", "1e6", "talker_config.rope_theta must be a finite number > 0, got '1e6'"),
    (TALKER, "codec_eos_token_id", 5000, "talker_config.codec_eos_token_id is 5000, outside the vocabulary [0, 1088)"),
    (TALKER, "codec_pad_id", -1, "talker_config.codec_pad_id is -1, outside the vocabulary"),
    (TALKER, "codec_language_id", {"english": 99999}, "codec_language_id['english'] is 99999"),
    (TALKER, "num_attention_heads", 0, "talker_config.num_attention_heads must be an integer >= 1, got 0"),
    (TALKER, "num_key_value_heads", 0, "talker_config.num_key_value_heads must be an integer >= 1, got 0"),
    (TALKER, "hidden_size", 24.5, "talker_config.hidden_size must be an integer >= 1, got 24.5"),
    (TALKER, "vocab_size", True, "talker_config.vocab_size must be an integer >= 1, got True"),
    (TALKER, "max_position_embeddings", 0, "talker_config.max_position_embeddings must be an integer >= 1"),
    (TALKER, "num_code_groups", 1, "talker_config.num_code_groups must be an integer in [2, 4096], got 1"),
    (TALKER, "num_hidden_layers", 2**40, "talker_config.num_hidden_layers must be an integer in [0, 4096]"),
    (TALKER, "code_predictor_config", True, "CodePredictorConfig: this section of the config must be a JSON object"),
    (TALKER, "spk_is_dialect", True, "talker_config.spk_is_dialect must be a JSON object"),
    (PREDICTOR, "num_code_groups", 10**9, "code_predictor_config.num_code_groups must be an integer in [2, 4096]"),
    (PREDICTOR, "rms_norm_eps", float("nan"), "code_predictor_config.rms_norm_eps must be a finite number > 0"),
    (PREDICTOR, "rope_theta", -10000, "code_predictor_config.rope_theta must be a finite number > 0"),
    ([], "tts_pad_token_id", 10**9, "config.tts_pad_token_id is 1000000000, outside the vocabulary"),
    ([], "im_start_token_id", -5, "config.im_start_token_id is -5"),
]
SPEECH_TOKENIZER_CASES = [
    ([], "output_sample_rate", 0, "output_sample_rate must be an integer >= 1, got 0"),
    ([], "input_sample_rate", -24000, "input_sample_rate must be an integer >= 1, got -24000"),
    ([], "encoder_valid_num_quantizers", 17, "encoder_valid_num_quantizers must be an integer in [1, 16]"),
    (["decoder_config"], "rms_norm_eps", -1.0, "decoder_config.rms_norm_eps must be a finite number > 0"),
    (["decoder_config"], "rope_theta", 0.0, "decoder_config.rope_theta must be a finite number > 0"),
    (["decoder_config"], "upsample_rates", [8, 0, 4, 3], "decoder_config.upsample_rates must hold integers >= 1"),
    (["decoder_config"], "num_attention_heads", 0, "decoder_config.num_attention_heads must be an integer >= 1"),
    (["decoder_config"], "codebook_size", 0, "decoder_config.codebook_size must be an integer >= 1"),
    (
        ["decoder_config"],
        "num_hidden_layers",
        2**40,
        "decoder_config.num_hidden_layers must be an integer in [0, 4096]",
    ),
    (["decoder_config"], "num_quantizers", 2**40, "decoder_config.num_quantizers must be an integer in [1, 4096]"),
    (["decoder_config"], "layer_scale_initial_scale", float("inf"), "layer_scale_initial_scale must be a finite"),
]
LOADERS = {"tiny-base": Qwen3TTS.from_pretrained, "tiny-speech-tokenizer": SpeechTokenizer.from_pretrained}


@pytest.mark.parametrize(
    "model, section, key, value, fragment",
    [("tiny-base", *case) for case in MODEL_CASES]
    + [("tiny-speech-tokenizer", *case) for case in SPEECH_TOKENIZER_CASES],
)
def test_impossible_config_values(tmp_path, model, section, key, value, fragment):
    d = copy_model(tmp_path, model)
    edit_config(d / "config.json", set_key(section, key, value))
    with pytest.raises(CheckpointError) as info:
        LOADERS[model](d)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("norm_eps", -1e-5, "encoder_config.norm_eps must be a finite number > 0"),
        ("rope_theta", 0, "encoder_config.rope_theta must be a finite number > 0"),
        ("frame_rate", 0, "encoder_config.frame_rate must be a finite number > 0"),
        ("frame_rate", 1e-300, "encoder_config.frame_rate 1e-300 is too small"),
        ("sampling_rate", 0, "encoder_config.sampling_rate must be an integer >= 1"),
        ("upsampling_ratios", [], "encoder_config.upsampling_ratios must be a non-empty list"),
        ("num_semantic_quantizers", 99, "num_semantic_quantizers must be an integer in [0, num_quantizers"),
        ("num_residual_layers", 10**12, "encoder_config.num_residual_layers must be an integer in [0, 4096]"),
    ],
)
def test_impossible_encoder_config_values(tmp_path, key, value, fragment):
    """The encoder is read on first use: the error comes from encode, before any audio is processed."""
    d = copy_model(tmp_path, "tiny-speech-tokenizer")
    edit_config(d / "config.json", set_key(["encoder_config"], key, value))
    tok = SpeechTokenizer.from_pretrained(d)
    with pytest.raises(CheckpointError) as info:
        tok.encode(np.zeros(1920), sr=24000)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("enc_dim", 0, "speaker_encoder_config.enc_dim must be an integer >= 1, got 0"),
        ("enc_kernel_sizes", [5, 3, 0, 3, 1], "speaker_encoder_config.enc_kernel_sizes must hold integers >= 1"),
        ("enc_dilations", [1, 2, -3, 4, 1], "speaker_encoder_config.enc_dilations must hold integers >= 1"),
        ("sample_rate", 0, "speaker_encoder_config.sample_rate must be an integer >= 1"),
    ],
)
def test_impossible_speaker_encoder_config_values(tmp_path, key, value, fragment):
    d = copy_model(tmp_path, "tiny-base")
    edit_config(d / "config.json", set_key(["speaker_encoder_config"], key, value))
    with pytest.raises(CheckpointError) as info:
        SpeakerEncoder.from_pretrained(d)
    assert fragment in str(info.value)


# ----------------------------------------------------------------------------- non-finite values


def poison_tensor(path, name, value=np.nan):
    tensors = {k: np.array(v) for k, v in read_safetensors_file(path).items()}
    tensors[name].reshape(-1)[0] = value
    write_safetensors_file(path, tensors)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weights_are_refused_at_load(tmp_path, value):
    d = copy_model(tmp_path, "tiny-speech-tokenizer")
    poison_tensor(d / "model.safetensors", "decoder.pre_conv.conv.bias", value)
    with pytest.raises(CheckpointError, match=r"holding NaN or infinity \(1\): pre_conv.conv.bias"):
        SpeechTokenizer.from_pretrained(d)


def test_non_finite_talker_weights_are_refused_at_load(tmp_path):
    d = copy_model(tmp_path, "tiny-customvoice")
    poison_tensor(d / "model.safetensors", "talker.model.norm.weight", np.inf)
    with pytest.raises(CheckpointError, match=r"(?s)talker.*holding NaN or infinity \(1\): model.norm.weight"):
        Qwen3TTS.from_pretrained(d)


def with_poisoned_weight(weights: dict, name: str) -> dict:
    out = dict(weights)
    out[name] = weights[name].copy()  # (a copy where it lives: host or device)
    out[name].reshape(-1)[0] = np.nan
    return out


def test_decoder_stage_that_went_non_finite_is_named(speech_tokenizers):
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    tok.decoder_weights = with_poisoned_weight(tok.decoder_weights, "pre_conv.conv.bias")  # past the load check
    with pytest.raises(NonFiniteError, match="codec decoder: stage 'pre_conv' produced non-finite values"):
        tok.decode(np.zeros((3, 16), np.int64))
    with pytest.raises(NonFiniteError, match="streaming codec decoder produced non-finite values"):
        tok.stream().push(np.zeros((3, 16), np.int64))


def test_encoder_stage_that_went_non_finite_is_named():
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    cfg, weights, tables = tok._load_encoder()
    tok._encoder = (cfg, with_poisoned_weight(weights, "encoder.layers.0.conv.bias"), tables)
    with pytest.raises(NonFiniteError, match="codec encoder: stage 'encoder.layers.0' produced non-finite"):
        tok.encode(np.zeros(1920), sr=24000)


def test_speaker_encoder_stage_that_went_non_finite_is_named():
    enc = SpeakerEncoder.from_pretrained(CHECKPOINTS / "tiny-base")
    enc.weights = with_poisoned_weight(enc.weights, "blocks.0.conv.bias")
    with pytest.raises(NonFiniteError, match="speaker encoder: stage 'blocks.0.conv' produced non-finite"):
        enc.embed(np.zeros(4000), sr=24000)


def test_nan_speaker_embedding_stops_generation_at_the_prefill():
    """NaN logits used to become code 0 (argmax) with EOS never coming; now the first step says so."""
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-base")
    prompt = tts.create_voice_clone_prompt((np.zeros(4000, np.float32), 24000), x_vector_only_mode=True)
    prompt[0].ref_spk_embedding = np.full_like(prompt[0].ref_spk_embedding, np.nan)
    with pytest.raises(NonFiniteError, match=r"talker \(prompt prefill logits\) produced non-finite values"):
        tts.generate_voice_clone("Hello.", voice_clone_prompt=prompt, max_new_tokens=3)


# ----------------------------------------------------------------------------- fuzzing config values

JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.lists(st.integers(-3, 9), max_size=5),
)


@pytest.fixture(scope="module")
def decoder_parts():
    from refimpl.io.checkpoint import read_checkpoint_weights, read_config

    d = CHECKPOINTS / "tiny-speech-tokenizer"
    return read_config(d), read_checkpoint_weights(d, prefix="decoder.")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            "codebook_size",
            "hidden_size",
            "latent_dim",
            "max_position_embeddings",
            "rope_theta",
            "num_attention_heads",
            "num_key_value_heads",
            "sliding_window",
            "intermediate_size",
            "layer_scale_initial_scale",
            "rms_norm_eps",
            "num_hidden_layers",
            "num_quantizers",
            "upsample_rates",
            "upsampling_ratios",
            "decoder_dim",
            "codebook_dim",
            "head_dim",
        ]
    ),
    JSON_VALUES,
)
def test_any_decoder_config_value_loads_or_is_one_value_error(decoder_parts, key, value):
    """Whatever a config.json says, building the speech tokenizer either works or raises ValueError
    (CheckpointError for values and weights that do not fit): never TypeError, IndexError, ZeroDivisionError."""
    config, weights = decoder_parts
    config = json.loads(json.dumps(config))
    config["decoder_config"][key] = value
    with contextlib.suppress(ValueError):
        SpeechTokenizer(config, weights)


@pytest.fixture(scope="module")
def talker_config():
    from refimpl.io.checkpoint import read_config

    return read_config(CHECKPOINTS / "tiny-customvoice")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "num_code_groups",
            "text_hidden_size",
            "codec_eos_token_id",
            "codec_pad_id",
            "head_dim",
            "text_vocab_size",
            "spk_id",
            "codec_language_id",
            "rope_scaling",
        ]
    ),
    JSON_VALUES,
)
def test_any_talker_config_value_is_accepted_or_one_value_error(talker_config, key, value):
    from refimpl.tts.prompt import TTSConfig

    config = json.loads(json.dumps(talker_config))
    config["talker_config"][key] = value
    with contextlib.suppress(ValueError):
        TTSConfig.from_dict(config)


def encoder_and_speaker_configs():
    from refimpl.codec import encoder as codec_encoder
    from refimpl.io.checkpoint import read_config
    from refimpl.tts import speaker_encoder as speaker

    st_config = read_config(CHECKPOINTS / "tiny-speech-tokenizer")["encoder_config"]
    spk_config = read_config(CHECKPOINTS / "tiny-base")["speaker_encoder_config"]
    return [
        (codec_encoder.EncoderConfig.from_dict, codec_encoder.encoder_weight_spec, st_config),
        (speaker.SpeakerEncoderConfig.from_dict, speaker.speaker_encoder_weight_spec, spk_config),
    ]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1), st.data(), JSON_VALUES)
def test_any_encoder_or_speaker_config_value_builds_or_is_one_value_error(which, data, value):
    """The config is read and its weight list built (what loading does before reading any tensor)."""
    from_dict, weight_spec, base = encoder_and_speaker_configs()[which]
    config = dict(base, **{data.draw(st.sampled_from(sorted(base))): value})
    with contextlib.suppress(ValueError):
        weight_spec(from_dict(config))


# ----------------------------------------------------------------------------- JSON files: depth and kind


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deeply_nested_config_is_a_named_error(tmp_path, depth):
    """Nesting past 64 levels (and past Python's recursion limit, where json raises RecursionError) is
    one CheckpointError naming config.json."""
    model = copy_model(tmp_path, "tiny-customvoice")
    (model / "config.json").write_text('{"extra": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(CheckpointError, match="config.json: JSON nested more than 64 levels deep"):
        Qwen3TTS.from_pretrained(model)


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "merges.txt", "generation_config.json"])
def test_model_file_that_is_a_named_pipe_is_refused_without_waiting(tmp_path, name):
    """A FIFO in place of a model's file (nobody writing it) is refused (or, for the optional generation
    config, ignored) from stat, never opened: opening it would wait for a writer forever (the alarm turns
    a regression into a failure)."""
    import os
    import signal

    model = copy_model(tmp_path, "tiny-customvoice")
    (model / name).unlink()
    os.mkfifo(model / name)

    def hung(signum, frame):
        raise AssertionError(f"waited on the named pipe {name}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        if name == "generation_config.json":  # optional: a file that is not regular is no file
            assert Qwen3TTS.from_pretrained(model).generate_defaults is not None
        else:
            with pytest.raises(CheckpointError, match=f"{name}"):
                Qwen3TTS.from_pretrained(model)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_unknown_compute_dtype_is_a_value_error():
    """The docstring promises ValueError for any dtype but float32 / float64, even one numpy cannot parse."""
    for dtype in ("garbage", np.int32, "float16"):
        with pytest.raises(ValueError, match="dtype must be"):
            Qwen3TTS.from_pretrained("default", dtype=dtype)
