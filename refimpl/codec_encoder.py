"""The 12 Hz speech-tokenizer encoder (Mimi-style): 24 kHz audio -> 16 codes per 12.5 Hz frame.

Weights are a flat dict keyed by the checkpoint names with the ``encoder.`` prefix removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import WeightSpec
from .config import config_from_dict

__all__ = ["EncoderConfig", "encoder_weight_spec"]


@dataclass
class EncoderConfig:
    """``encoder_config`` of the speech tokenizer's config.json (a Mimi config; official defaults)."""

    sampling_rate: int = 24000
    frame_rate: float | None = None
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    trim_right_ratio: float = 1.0
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8000
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> "EncoderConfig":
        cfg = config_from_dict(cls, data)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        return cfg


def encoder_weight_spec(cfg: EncoderConfig) -> list:
    """Every tensor of the encoder, named as in the checkpoint (without the ``encoder.`` prefix)."""
    spec = []
    conv = lambda p, o, i, k, bias=True: [WeightSpec(f"{p}.conv.weight", (o, i, k))] + (  # noqa: E731
        [WeightSpec(f"{p}.conv.bias", (o,), "bias")] if bias else [])
    # SEANet: conv, then per ratio (in reverse config order): residual block, ELU, strided conv; ELU, last conv
    channels, idx = cfg.num_filters, 0
    spec += conv(f"encoder.layers.{idx}", channels, cfg.audio_channels, cfg.kernel_size)
    idx += 1
    for ratio in reversed(cfg.upsampling_ratios):
        for _ in range(cfg.num_residual_layers):
            hidden = channels // cfg.compress
            spec += conv(f"encoder.layers.{idx}.block.1", hidden, channels, cfg.residual_kernel_size)
            spec += conv(f"encoder.layers.{idx}.block.3", channels, hidden, 1)
            idx += 1
        idx += 1  # ELU
        spec += conv(f"encoder.layers.{idx}", channels * 2, channels, ratio * 2)
        channels *= 2
        idx += 1
    idx += 1  # ELU
    spec += conv(f"encoder.layers.{idx}", cfg.hidden_size, channels, cfg.last_kernel_size)

    C, H, G, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        p = f"encoder_transformer.layers.{i}"
        spec += [WeightSpec(f"{p}.self_attn.q_proj.weight", (H * D, C)),
                 WeightSpec(f"{p}.self_attn.k_proj.weight", (G * D, C)),
                 WeightSpec(f"{p}.self_attn.v_proj.weight", (G * D, C)),
                 WeightSpec(f"{p}.self_attn.o_proj.weight", (C, H * D)),
                 WeightSpec(f"{p}.mlp.fc1.weight", (cfg.intermediate_size, C)),
                 WeightSpec(f"{p}.mlp.fc2.weight", (C, cfg.intermediate_size)),
                 WeightSpec(f"{p}.input_layernorm.weight", (C,), "norm"),
                 WeightSpec(f"{p}.input_layernorm.bias", (C,), "norm_bias"),
                 WeightSpec(f"{p}.post_attention_layernorm.weight", (C,), "norm"),
                 WeightSpec(f"{p}.post_attention_layernorm.bias", (C,), "norm_bias"),
                 WeightSpec(f"{p}.self_attn_layer_scale.scale", (C,), "scale"),
                 WeightSpec(f"{p}.mlp_layer_scale.scale", (C,), "scale")]
    spec += [WeightSpec("downsample.conv.weight", (C, C, 2 * cfg.compress))]

    n_sem = cfg.num_semantic_quantizers
    for part, n in (("semantic_residual_vector_quantizer", n_sem),
                    ("acoustic_residual_vector_quantizer", cfg.num_quantizers - n_sem)):
        q = f"quantizer.{part}"
        spec += [WeightSpec(f"{q}.input_proj.weight", (cfg.codebook_dim, C, 1)),
                 WeightSpec(f"{q}.output_proj.weight", (C, cfg.codebook_dim, 1))]
        for j in range(n):
            cb = f"{q}.layers.{j}.codebook"
            spec += [WeightSpec(f"{cb}.initialized", (1,), "ones"),
                     WeightSpec(f"{cb}.cluster_usage", (cfg.codebook_size,), "usage"),
                     WeightSpec(f"{cb}.embed_sum", (cfg.codebook_size, cfg.codebook_dim), "embedding")]
    return spec
