"""Model configurations used to make synthetic checkpoints.

``RELEASED_*`` are the dimensions of the released Qwen3-TTS checkpoints (for full-size benchmarks);
``TINY_*`` keep every architectural feature at small widths (for committed test checkpoints):
the same upsampling rates (so 1920 samples per frame), grouped-query attention with fewer key/value
heads than heads, head_dim different from hidden / heads, and sliding windows shorter than the
test sequences so that the window bites.
"""

from __future__ import annotations

import copy

# Hugging Face EncodecFeatureExtractor settings, the speech tokenizer's preprocessor_config.json
SPEECH_TOKENIZER_PREPROCESSOR = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}

_SPEECH_TOKENIZER_TOP = {
    "architectures": ["Qwen3TTSTokenizerV2Model"],
    "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
}

# Keys of the released config.json files that no official code reads, nor does refimpl (they land in the
# configs' ``extra``), but that ports' converters read (qwentts.cpp's convert.py stops without them:
# docs/ports.md).  The synthetic checkpoints carry them with the released values:
# - talker_config.position_id_per_seconds, 13: in the Qwen-Omni models, the multimodal RoPE's positions per
#   second of audio; Qwen3-TTS keeps the key and never reads it.
# - decoder_config.num_semantic_quantizers, 1, and vector_quantization_hidden_dimension, the decoder's
#   codebook_dim: the split RVQ's semantic layers and the width it takes and gives back, which the official
#   decoder and ours fix at one layer and codebook_dim (codec/quantization.py), whatever a config says (a
#   config that says otherwise is read as the official reads it).
RELEASED_POSITION_ID_PER_SECONDS = 13

RELEASED_SPEECH_TOKENIZER = {
    **_SPEECH_TOKENIZER_TOP,
    "decoder_config": {
        "codebook_size": 2048,
        "codebook_dim": 512,
        "num_quantizers": 16,
        "hidden_size": 512,
        "latent_dim": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 64,
        "sliding_window": 72,
        "intermediate_size": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "hidden_act": "silu",
        "attention_bias": False,
        "upsampling_ratios": [2, 2],
        "upsample_rates": [8, 5, 4, 3],
        "decoder_dim": 1536,
        "num_semantic_quantizers": 1,
        "vector_quantization_hidden_dimension": 512,
    },
    "encoder_config": {
        "sampling_rate": 24000,
        "frame_rate": 12.5,
        "audio_channels": 1,
        "num_filters": 64,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 2048,
        "codebook_dim": 256,
        "num_quantizers": 32,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 256,
        "num_semantic_quantizers": 1,
        "upsample_groups": 512,
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "intermediate_size": 2048,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        "use_cache": False,
    },
}

TINY_SPEECH_TOKENIZER = {
    **_SPEECH_TOKENIZER_TOP,
    "decoder_config": {
        "codebook_size": 64,
        "codebook_dim": 32,
        "num_quantizers": 16,
        "hidden_size": 32,
        "latent_dim": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": 8,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "hidden_act": "silu",
        "attention_bias": False,
        "upsampling_ratios": [2, 2],
        "upsample_rates": [8, 5, 4, 3],
        "decoder_dim": 64,
        "num_semantic_quantizers": 1,
        "vector_quantization_hidden_dimension": 32,
    },
    "encoder_config": {
        "sampling_rate": 24000,
        "frame_rate": 12.5,
        "audio_channels": 1,
        "num_filters": 4,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 64,
        "codebook_dim": 16,
        "num_quantizers": 20,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 16,
        "num_semantic_quantizers": 1,
        "upsample_groups": 32,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 16,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        "use_cache": False,
    },
}

# speaker_encoder_config of the Base models (ECAPA-TDNN).  The released config.json sets enc_dim and
# sample_rate and leaves the rest at the official defaults, spelled out here.
RELEASED_SPEAKER_ENCODER = {
    "mel_dim": 128,
    "enc_dim": 1024,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
    "sample_rate": 24000,
}  # Qwen3-TTS-12Hz-0.6B-Base
RELEASED_SPEAKER_ENCODER_1_7B = {**RELEASED_SPEAKER_ENCODER, "enc_dim": 2048}  # Qwen3-TTS-12Hz-1.7B-Base

# Every feature kept: 128 mels (fixed by the official mel settings), the k5 TDNN, three SE-Res2Net
# blocks with dilations 2, 3, 4 and Res2Net scale 8, aggregation of the three, attentive pooling.
TINY_SPEAKER_ENCODER = {
    "mel_dim": 128,
    "enc_dim": 24,
    "enc_channels": [16, 16, 16, 16, 48],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 8,
    "enc_res2net_scale": 8,
    "enc_se_channels": 8,
    "sample_rate": 24000,
}


# ---- Talker + code predictor (the ``talker_config`` of a full model's config.json) ----
# Codec ids of the released talker vocabulary (3072 = 2048 codes of group 0 + 1024 control ids).
_RELEASED_CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
RELEASED_LANGUAGE_IDS = {
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
    "sichuan_dialect": 2062,
    "beijing_dialect": 2074,
}
RELEASED_SPEAKER_IDS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
RELEASED_SPEAKER_DIALECTS = {
    **dict.fromkeys(RELEASED_SPEAKER_IDS, False),
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
}
_RELEASED_CODE_PREDICTOR = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "attention_bias": False,
    "num_code_groups": 16,
}


# The released text vocabulary: the Qwen2 / Qwen3 BPE has 151643 entries, the added tokens follow from
# 151643 on (<|endoftext|>, <|im_start|> 151644, ..., <tts_pad> 151671, ...: synthetic.QWEN3_TTS_ADDED_TOKENS),
# and the Talker's text embedding has 151936 rows (padded past the last id).
RELEASED_FIRST_ADDED_TEXT_ID = 151643
RELEASED_TEXT_VOCAB_SIZE = 151936


def _released_talker(hidden: int, intermediate: int, speakers: bool) -> dict:
    return {
        "vocab_size": 3072,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": {"mrope_section": [24, 20, 20], "interleaved": True, "rope_type": "default"},
        "attention_bias": False,
        "num_code_groups": 16,
        "position_id_per_seconds": RELEASED_POSITION_ID_PER_SECONDS,
        "text_hidden_size": 2048,
        "text_vocab_size": RELEASED_TEXT_VOCAB_SIZE,
        **_RELEASED_CODEC_IDS,
        "codec_language_id": dict(RELEASED_LANGUAGE_IDS),
        "spk_id": dict(RELEASED_SPEAKER_IDS) if speakers else {},
        "spk_is_dialect": dict(RELEASED_SPEAKER_DIALECTS) if speakers else {},
        "code_predictor_config": dict(_RELEASED_CODE_PREDICTOR),
    }


RELEASED_TALKER_0_6B = _released_talker(1024, 3072, speakers=False)
RELEASED_TALKER_0_6B_CUSTOMVOICE = _released_talker(1024, 3072, speakers=True)
RELEASED_TALKER_1_7B = _released_talker(2048, 6144, speakers=False)
RELEASED_TALKER_1_7B_CUSTOMVOICE = _released_talker(2048, 6144, speakers=True)

# generation_config.json of the released models
RELEASED_GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "max_new_tokens": 8192,
}

# Tiny talkers keep the official meaning of every id range: the talker vocabulary is the codebook of
# the tiny speech tokenizer (64 codes) + 1024 control ids, so "suppress the top 1024 ids except EOS"
# leaves exactly the 64 codes and EOS; every released control / language / speaker id v becomes
# v - 2048 + 64.  The text-side ids (text_vocab_size, im_start, tts_pad/bos/eos) are filled in from the
# tiny text tokenizer when the checkpoint is written (``synthetic.write_tts_model``).
TINY_CODEBOOK = 64
_shift = lambda v: v - 2048 + TINY_CODEBOOK  # noqa: E731
_TINY_CODEC_IDS = {k: _shift(v) for k, v in _RELEASED_CODEC_IDS.items()}
TINY_LANGUAGE_IDS = {
    k: _shift(RELEASED_LANGUAGE_IDS[k])
    for k in ("english", "german", "chinese", "japanese", "sichuan_dialect", "beijing_dialect")
}
TINY_SPEAKER_IDS = {k: _shift(RELEASED_SPEAKER_IDS[k]) for k in ("serena", "vivian", "eric", "dylan")}
TINY_SPEAKER_DIALECTS = {k: RELEASED_SPEAKER_DIALECTS[k] for k in TINY_SPEAKER_IDS}


def _tiny_talker(
    hidden, heads, kv_heads, head_dim, mrope_section, predictor_hidden, predictor_theta, speakers: bool
) -> dict:
    return {
        "vocab_size": TINY_CODEBOOK + 1024,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": {"mrope_section": list(mrope_section), "interleaved": True, "rope_type": "default"},
        "attention_bias": False,
        "num_code_groups": 16,
        "position_id_per_seconds": RELEASED_POSITION_ID_PER_SECONDS,  # the same 12.5 Hz codes as the release
        "text_hidden_size": 24,
        **_TINY_CODEC_IDS,
        "codec_language_id": dict(TINY_LANGUAGE_IDS),
        "spk_id": dict(TINY_SPEAKER_IDS) if speakers else {},
        "spk_is_dialect": dict(TINY_SPEAKER_DIALECTS) if speakers else {},
        "code_predictor_config": {
            "vocab_size": TINY_CODEBOOK,
            "hidden_size": predictor_hidden,
            "intermediate_size": 2 * predictor_hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "hidden_act": "silu",
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_theta": predictor_theta,
            "attention_bias": False,
            "num_code_groups": 16,
        },
    }


# like 1.7B: talker width 32 != code predictor width 24 (small_to_mtp_projection), 4 heads / 2 kv heads,
# head_dim 16 != 32 / 4, the predictor's own RoPE theta
TINY_TALKER_CUSTOMVOICE = _tiny_talker(32, 4, 2, 16, (3, 3, 2), 24, 10000, speakers=True)
TINY_TALKER_VOICEDESIGN = _tiny_talker(32, 4, 1, 16, (3, 3, 2), 24, 10000, speakers=False)
# like 0.6B: talker and predictor both 24 wide (no projection); the x-vector (enc_dim 24) fits the talker
TINY_TALKER_BASE = _tiny_talker(24, 4, 2, 12, (2, 2, 2), 24, 1000000, speakers=False)

# top level of the tiny full models' config.json (talker_config and text ids are added when written)
TINY_TTS_MODELS = {
    "customvoice": {"tts_model_type": "custom_voice", "tts_model_size": "1b7", "talker": TINY_TALKER_CUSTOMVOICE},
    "voicedesign": {"tts_model_type": "voice_design", "tts_model_size": "1b7", "talker": TINY_TALKER_VOICEDESIGN},
    "base": {
        "tts_model_type": "base",
        "tts_model_size": "0b6",
        "talker": TINY_TALKER_BASE,
        "speaker_encoder": TINY_SPEAKER_ENCODER,
    },
}


def preset(config: dict) -> dict:
    """A deep copy, so callers may edit it."""
    return copy.deepcopy(config)
