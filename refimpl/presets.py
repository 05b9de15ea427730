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

RELEASED_SPEECH_TOKENIZER = {
    **_SPEECH_TOKENIZER_TOP,
    "decoder_config": {
        "codebook_size": 2048, "codebook_dim": 512, "num_quantizers": 16,
        "hidden_size": 512, "latent_dim": 1024, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
        "sliding_window": 72, "intermediate_size": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000,
        "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "hidden_act": "silu",
        "attention_bias": False, "upsampling_ratios": [2, 2], "upsample_rates": [8, 5, 4, 3],
        "decoder_dim": 1536,
    },
    "encoder_config": {
        "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1,
        "num_filters": 64, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
        "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
        "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32, "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1, "upsample_groups": 512,
        "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 2048,
        "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "gelu",
        "max_position_embeddings": 8000, "norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 250,
        "layer_scale_initial_scale": 0.01, "attention_bias": False, "use_cache": False,
    },
}

TINY_SPEECH_TOKENIZER = {
    **_SPEECH_TOKENIZER_TOP,
    "decoder_config": {
        "codebook_size": 64, "codebook_dim": 32, "num_quantizers": 16,
        "hidden_size": 32, "latent_dim": 48, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "sliding_window": 8, "intermediate_size": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000,
        "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "hidden_act": "silu",
        "attention_bias": False, "upsampling_ratios": [2, 2], "upsample_rates": [8, 5, 4, 3],
        "decoder_dim": 64,
    },
    "encoder_config": {
        "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1,
        "num_filters": 4, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
        "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
        "codebook_size": 64, "codebook_dim": 16, "num_quantizers": 20, "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 16, "num_semantic_quantizers": 1, "upsample_groups": 32,
        "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "hidden_act": "gelu",
        "max_position_embeddings": 8000, "norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 16,
        "layer_scale_initial_scale": 0.01, "attention_bias": False, "use_cache": False,
    },
}

# speaker_encoder_config of the Base models (ECAPA-TDNN).  The released config.json sets enc_dim and
# sample_rate and leaves the rest at the official defaults, spelled out here.
RELEASED_SPEAKER_ENCODER = {
    "mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 128,
    "enc_res2net_scale": 8, "enc_se_channels": 128, "sample_rate": 24000,
}  # Qwen3-TTS-12Hz-0.6B-Base
RELEASED_SPEAKER_ENCODER_1_7B = {**RELEASED_SPEAKER_ENCODER, "enc_dim": 2048}  # Qwen3-TTS-12Hz-1.7B-Base

# Every feature kept: 128 mels (fixed by the official mel settings), the k5 TDNN, three SE-Res2Net
# blocks with dilations 2, 3, 4 and Res2Net scale 8, aggregation of the three, attentive pooling.
TINY_SPEAKER_ENCODER = {
    "mel_dim": 128, "enc_dim": 24, "enc_channels": [16, 16, 16, 16, 48],
    "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 8,
    "enc_res2net_scale": 8, "enc_se_channels": 8, "sample_rate": 24000,
}


def preset(config: dict) -> dict:
    """A deep copy, so callers may edit it."""
    return copy.deepcopy(config)
