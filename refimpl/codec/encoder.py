"""The 12 Hz speech-tokenizer encoder (Mimi-style): 24 kHz audio -> 16 codes per 12.5 Hz frame.

Stages (shapes for the released config; B batch, N samples, T25 = ceil(N / 960), T = ceil(N / 1920)):

    audio [B, 1, N]
    1. SEANet convolutional encoder                          -> [B, 512, T25]   (hidden_size, 25 Hz)
       causal conv k7 (1 -> 64)
       4 x [residual block (ELU, conv k3 C -> C/2, ELU, conv k1 C/2 -> C, + x),
            ELU, strided causal conv k = 2r, stride r (C -> 2C)]     r = 4, 5, 6, 8
       ELU, causal conv k3 (1024 -> 512)
    2. transformer, 8 pre-norm layers (LayerNorm with bias, RoPE, causal attention,
       LayerScale, GELU MLP), no final norm                  -> [B, T25, 512]
    3. downsample: strided causal conv k4, stride 2, no bias,
       edge-replicating padding                              -> [B, 512, T]     the latent
    4. split residual vector quantisation                    -> codes [B, 16, T]
       semantic: 1x1 projection 512 -> 256, 1 codebook
       acoustic: 1x1 projection 512 -> 256, the first 15 of its 31 codebooks
       (each layer: nearest codebook row by Euclidean distance, subtract it, go on with the residual)

Everything is causal: frame t depends only on samples < (t + 1) * 1920.

The attention window.  The config names a sliding window (250 frames at 25 Hz, 10 s), but the
official model (transformers 4.57.3) applies it only on its flash-attention path; on the default
eager / SDPA path, which is what runs on a CPU, each frame attends to the whole past.  Both are
here: ``attention="full"`` (the default, equal to the official CPU output) and ``"sliding"`` (the
window of the config, equal to the flash-attention path).  They differ only for inputs longer than
the window (> 250 frames at 25 Hz, i.e. more than 10 s of audio in the released config).

Weights are a flat dict keyed by the checkpoint names with the ``encoder.`` prefix removed; each function
reads its module's through a ``WeightView`` of the module's prefix (``b["block.1.conv.weight"]`` in
``encoder.layers.1.``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .. import nn
from ..backends import primitive
from ..io.checkpoint import WeightSpec, WeightView
from ..io.config import config_from_dict
from ..io.validate import check_encoder_config
from ..recorder import NULL_RECORDER, Recorder, as_recorder
from ..transformer import CODEC_ENCODER, attention_weight_spec, check_attention_config, layer_views, transformer_stack
from .quantization import split_rvq_encode

__all__ = [
    "EncoderConfig",
    "encoder_weight_spec",
    "seanet_encoder",
    "encoder_transformer",
    "downsample",
    "encode_latent",
    "encode_audio",
    "EncoderOutput",
    "ATTENTION_MODES",
]

ATTENTION_MODES = ("full", "sliding")


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
    def from_dict(cls, data) -> EncoderConfig:
        cfg = config_from_dict(cls, data)
        check_encoder_config(cfg)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        if not cfg.use_causal_conv:
            raise ValueError("encoder_config.use_causal_conv = false is not supported (the 12 Hz codec is causal)")
        check_attention_config("encoder_config", cfg, activation="gelu")
        if cfg.pad_mode not in ("constant", "replicate", "reflect"):
            raise ValueError(f"encoder_config.pad_mode {cfg.pad_mode!r} is not supported")
        if cfg.audio_channels != 1:
            raise ValueError(f"encoder_config.audio_channels {cfg.audio_channels} is not supported (only mono)")
        if cfg.vector_quantization_hidden_dimension != cfg.codebook_dim:
            raise ValueError(
                "encoder_config.vector_quantization_hidden_dimension must equal codebook_dim "
                f"({cfg.vector_quantization_hidden_dimension} != {cfg.codebook_dim})"
            )
        if cfg.downsample_stride_ratio == 1:
            raise ValueError(
                "encoder_config: frame_rate equals the SEANet frame rate, so there is no downsample "
                "conv; this layout is not supported"
            )
        return cfg

    @property
    def hop_length(self) -> int:
        """Samples per SEANet frame (the product of the ratios): 960, i.e. 25 Hz at 24 kHz."""
        return int(np.prod(self.upsampling_ratios))

    @property
    def seanet_frame_rate(self) -> int:
        """Frames per second out of the SEANet encoder (Mimi's ``encodec_frame_rate``): 25."""
        return math.ceil(self.sampling_rate / self.hop_length)

    @property
    def output_frame_rate(self) -> float:
        """Code frames per second: ``frame_rate`` if the config gives one, else the rate after all strides."""
        if self.frame_rate is not None:
            return float(self.frame_rate)
        return self.sampling_rate / (self.hop_length * 2)

    @property
    def downsample_stride_ratio(self) -> int:
        return int(self.seanet_frame_rate / self.output_frame_rate)

    @property
    def downsample_kernel_size(self) -> int:
        """The downsample conv's kernel: twice the rate ratio (4); its stride is always 2."""
        return 2 * self.downsample_stride_ratio

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per code frame: 1920 (the SEANet hop, then the downsample's stride 2)."""
        return self.hop_length * 2


DOWNSAMPLE_STRIDE = 2


# ----------------------------------------------------------------------------- weights


def seanet_layout(cfg: EncoderConfig) -> list:
    """The SEANet encoder's ``layers`` list as (kind, index, details) tuples, in order:
    ("conv", i, (c_in, c_out, k, stride)), ("resblock", i, (channels, dilation)), ("elu", i, None)."""
    layout, channels = [], cfg.num_filters
    layout.append(("conv", 0, (cfg.audio_channels, channels, cfg.kernel_size, 1)))
    for ratio in reversed(cfg.upsampling_ratios):
        for j in range(cfg.num_residual_layers):
            layout.append(("resblock", len(layout), (channels, cfg.dilation_growth_rate**j)))
        layout.append(("elu", len(layout), None))
        layout.append(("conv", len(layout), (channels, channels * 2, ratio * 2, ratio)))
        channels *= 2
    layout.append(("elu", len(layout), None))
    layout.append(("conv", len(layout), (channels, cfg.hidden_size, cfg.last_kernel_size, 1)))
    return layout


def encoder_weight_spec(cfg: EncoderConfig) -> list:
    """Every tensor of the encoder, named as in the checkpoint (without the ``encoder.`` prefix)."""
    spec = []

    def conv(p, o, i, k, bias=True):
        return [WeightSpec(f"{p}.conv.weight", (o, i, k))] + (
            [WeightSpec(f"{p}.conv.bias", (o,), "bias")] if bias else []
        )

    # SEANet: conv, then per ratio (in reverse config order): residual block, ELU, strided conv; ELU, last conv
    for kind, idx, details in seanet_layout(cfg):
        if kind == "conv":
            c_in, c_out, k, _ = details
            spec += conv(f"encoder.layers.{idx}", c_out, c_in, k)
        elif kind == "resblock":
            channels, _ = details
            hidden = channels // cfg.compress
            spec += conv(f"encoder.layers.{idx}.block.1", hidden, channels, cfg.residual_kernel_size)
            spec += conv(f"encoder.layers.{idx}.block.3", channels, hidden, 1)
            if cfg.use_conv_shortcut:
                spec += conv(f"encoder.layers.{idx}.shortcut", channels, channels, 1)

    C, H, G, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        p = f"encoder_transformer.layers.{i}"
        spec += attention_weight_spec(f"{p}.self_attn.", C, H, G, D, cfg.attention_bias)
        spec += [
            WeightSpec(f"{p}.mlp.fc1.weight", (cfg.intermediate_size, C)),
            WeightSpec(f"{p}.mlp.fc2.weight", (C, cfg.intermediate_size)),
            WeightSpec(f"{p}.input_layernorm.weight", (C,), "norm"),
            WeightSpec(f"{p}.input_layernorm.bias", (C,), "norm_bias"),
            WeightSpec(f"{p}.post_attention_layernorm.weight", (C,), "norm"),
            WeightSpec(f"{p}.post_attention_layernorm.bias", (C,), "norm_bias"),
            WeightSpec(f"{p}.self_attn_layer_scale.scale", (C,), "scale"),
            WeightSpec(f"{p}.mlp_layer_scale.scale", (C,), "scale"),
        ]
    spec += [WeightSpec("downsample.conv.weight", (C, C, cfg.downsample_kernel_size))]

    n_sem = cfg.num_semantic_quantizers
    Dq = cfg.vector_quantization_hidden_dimension
    for part, n in (
        ("semantic_residual_vector_quantizer", n_sem),
        ("acoustic_residual_vector_quantizer", cfg.num_quantizers - n_sem),
    ):
        q = f"quantizer.{part}"
        if Dq != C:  # the projections exist only when the codebook space differs from the latent
            spec += [
                WeightSpec(f"{q}.input_proj.weight", (Dq, C, 1)),
                WeightSpec(f"{q}.output_proj.weight", (C, Dq, 1)),
            ]
        for j in range(n):
            cb = f"{q}.layers.{j}.codebook"
            spec += [
                WeightSpec(f"{cb}.initialized", (1,), "ones"),
                WeightSpec(f"{cb}.cluster_usage", (cfg.codebook_size,), "usage"),
                WeightSpec(f"{cb}.embed_sum", (cfg.codebook_size, cfg.codebook_dim), "embedding"),
            ]
    return spec


# ----------------------------------------------------------------------------- 1. SEANet


def pad_for_causal_conv(x_bct, left: int, right: int, pad_mode: str):
    """Pad the time axis.  ``constant`` pads zeros, ``replicate`` repeats the edge samples, ``reflect``
    mirrors (and, like the official code, first appends zeros when the input is too short to mirror)."""
    if pad_mode == "constant":
        return np.pad(x_bct, ((0, 0), (0, 0), (left, right)))
    if pad_mode == "replicate":
        return np.pad(x_bct, ((0, 0), (0, 0), (left, right)), mode="edge")
    if pad_mode == "reflect":
        T, widest = x_bct.shape[-1], max(left, right)
        extra = widest - T + 1 if widest >= T else 0
        x_bct = np.pad(x_bct, ((0, 0), (0, 0), (0, extra)))
        out = np.pad(x_bct, ((0, 0), (0, 0), (left, right)), mode="reflect")
        return out[:, :, : out.shape[-1] - extra]
    raise ValueError(f"unknown pad mode {pad_mode!r}")


def mimi_causal_conv1d(x_bct, w_oik, b_o, stride: int = 1, dilation: int = 1, pad_mode: str = "constant"):
    """Mimi's causal conv: pad the left by span - stride, the right by the extra samples that make the
    last (strided) window complete, both in ``pad_mode``; then a valid conv.  [B, C, N] -> [B, O, ceil(N / stride)]."""
    K = w_oik.shape[-1]
    left = nn.causal_padding(K, stride, dilation)
    right = nn.extra_right_padding(x_bct.shape[-1], K, stride, dilation)
    return nn.conv1d(pad_for_causal_conv(x_bct, left, right, pad_mode), w_oik, b_o, stride, dilation)


def causal_conv(w: WeightView, x_bct, record: Recorder, **options):
    """A MimiConv1d (weights ``conv.weight``, ``conv.bias``); ``w`` and ``record`` scoped to it."""
    y_bct = mimi_causal_conv1d(x_bct, w["conv.weight"], w.get("conv.bias"), **options)
    record.output(y_bct)
    return y_bct


def elu(name: str, x_bct, record: Recorder):
    y_bct = nn.elu(x_bct)
    record(name, y_bct)
    return y_bct


@primitive
def resnet_block(b: WeightView, cfg: EncoderConfig, dilation: int, x_bct, record: Recorder = NULL_RECORDER):
    """x + conv_k1(ELU(conv_k3(ELU(x)))): C -> C / compress -> C (the shortcut is a 1x1 conv if configured);
    ``b`` and ``record`` scoped to the block (``encoder.layers.{i}.``).  A primitive: numba's twin runs a
    block with an identity shortcut in one pass over pieces of time."""
    h = elu("block.0", x_bct, record)
    h = causal_conv(b.sub("block.1."), h, record.scope("block.1."), dilation=dilation, pad_mode=cfg.pad_mode)
    h = elu("block.2", h, record)
    h = causal_conv(b.sub("block.3."), h, record.scope("block.3."), pad_mode=cfg.pad_mode)
    if cfg.use_conv_shortcut:
        x_bct = causal_conv(b.sub("shortcut."), x_bct, record.scope("shortcut."), pad_mode=cfg.pad_mode)
    return x_bct + h


@primitive
def elu_causal_conv(
    w: WeightView, cfg: EncoderConfig, act: str, conv: str, stride: int, x_bct, record: Recorder = NULL_RECORDER
):
    """The ELU ``act`` and the (strided) causal conv ``conv`` (a prefix, ``encoder.layers.{i}.``) after it.  A
    primitive: numba's twin takes the ELU of each piece of time as it stacks the conv's taps, so that the
    ELU's full-length output is never made."""
    x_bct = elu(act, x_bct, record)
    return causal_conv(w.sub(conv), x_bct, record.scope(conv), stride=stride, pad_mode=cfg.pad_mode)


def seanet_encoder(w, cfg: EncoderConfig, x_bct, record: Recorder = NULL_RECORDER):
    """[B, 1, N] audio -> [B, hidden, ceil(N / hop)] at 25 Hz.  Each layer's output is recorded as
    ``encoder.layers.{i}``; an ELU runs with the conv after it (``elu_causal_conv``)."""
    w = WeightView(w)
    elu_before = None  # the ELU layer the next conv takes in
    for kind, idx, details in seanet_layout(cfg):
        name = f"encoder.layers.{idx}"
        p = f"{name}."
        if kind == "elu":
            elu_before = name
        elif kind == "conv" and elu_before is not None:
            x_bct = elu_causal_conv(w, cfg, elu_before, p, details[3], x_bct, record)
            elu_before = None
        elif kind == "conv":
            x_bct = causal_conv(w.sub(p), x_bct, record.scope(p), stride=details[3], pad_mode=cfg.pad_mode)
        else:
            x_bct = resnet_block(w.sub(p), cfg, details[1], x_bct, record.scope(p))
            record(name, x_bct)
    assert elu_before is None, "the SEANet layout ends with a conv"
    return x_bct


# ----------------------------------------------------------------------------- 2. the transformer


def attention_mask(cfg: EncoderConfig, T: int, attention: str) -> nn.AttentionMask:
    """Causal ("full") or causal within the last ``sliding_window`` frames ("sliding"), over 0..T-1."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"encoder attention must be one of {ATTENTION_MODES}, not {attention!r}")
    window = cfg.sliding_window if attention == "sliding" else None
    positions_t = nn.arange(T)
    return nn.AttentionMask(positions_t, positions_t, window)


def encoder_transformer(w, cfg: EncoderConfig, x_btc, attention: str = "full", record: Recorder = NULL_RECORDER):
    """The layers at positions 0..T-1 (LayerNorm, RoPE, causal attention, LayerScale, GELU MLP), no final
    norm.  [B, T, C] -> [B, T, C]; each layer's output is recorded as ``layers.{i}``, the rotary tables
    (computed once for all layers) as the extras ``rope.cos`` and ``rope.sin`` ([1, T, D])."""
    T = x_btc.shape[1]
    mask = attention_mask(cfg, T, attention)
    cos_td, sin_td = nn.rope_cos_sin(nn.arange(T), cfg.head_dim, cfg.rope_theta, x_btc.dtype.type)
    record.extra("rope.cos", cos_td[None])
    record.extra("rope.sin", sin_td[None])
    layers = layer_views(w, "encoder_transformer.layers.", cfg.num_hidden_layers)
    return transformer_stack(
        layers, CODEC_ENCODER, cfg, x_btc, cos_td[None], sin_td[None], mask, None, cfg.norm_eps, record
    )


# ----------------------------------------------------------------------------- 3. downsample


def downsample(w, cfg: EncoderConfig, x_bct, record: Recorder = NULL_RECORDER):
    """25 Hz -> 12.5 Hz: causal conv, kernel 4, stride 2, no bias, padding by repeating the edge
    samples (this conv pads with ``replicate`` whatever the config's pad_mode)."""
    d = WeightView(w, "downsample.")
    return causal_conv(d, x_bct, record.scope("downsample."), stride=DOWNSAMPLE_STRIDE, pad_mode="replicate")


# ----------------------------------------------------------------------------- 4. residual vector quantisation


# ----------------------------------------------------------------------------- the whole encoder


class EncoderOutput(NamedTuple):
    codes_bqt: np.ndarray  # [B, Q, T] int64
    latent_bct: np.ndarray  # [B, hidden, T], before quantisation
    margins_bqt: np.ndarray  # [B, Q, T] second-nearest minus nearest codebook distance


def encode_latent(w, cfg: EncoderConfig, audio_bn, attention: str = "full", trace=None):
    """Audio [B, N] (in the compute dtype) -> the latent before quantisation [B, hidden, ceil(N / 1920)]."""
    record = as_recorder(trace)
    x_bct = seanet_encoder(w, cfg, audio_bn[:, None, :], record)
    record("encoder", x_bct)
    x_btc = encoder_transformer(w, cfg, np.swapaxes(x_bct, 1, 2), attention, record.scope("encoder_transformer."))
    record("encoder_transformer", x_btc)
    latent_bct = downsample(w, cfg, np.swapaxes(x_btc, 1, 2), record)  # recorded as "downsample"
    return latent_bct


def encode_audio(
    w, cfg: EncoderConfig, audio_bn, n_codes: int, attention: str = "full", tables=None, trace=None
) -> EncoderOutput:
    """Audio [B, N] -> codes [B, n_codes, ceil(N / 1920)], with the latent and the distance margins.

    If ``trace`` is a dict, the output of every stage is stored in it (``encoder.layers.{i}``,
    ``encoder``, ``encoder_transformer.layers.{i}``, ``encoder_transformer``, ``downsample``,
    ``quantizer.<part>.input_proj``)."""
    latent_bct = encode_latent(w, cfg, audio_bn, attention, trace)
    codes_bqt, margins_bqt = split_rvq_encode(w, cfg, latent_bct, n_codes, tables, as_recorder(trace))
    return EncoderOutput(codes_bqt, latent_bct, margins_bqt)
