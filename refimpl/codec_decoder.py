"""The 12 Hz speech-tokenizer decoder: 16 codes per 12.5 Hz frame -> 1920 samples at 24 kHz.

Stages (shapes for the released config; B batch, T frames):

    codes [B, 16, T]
    1. split RVQ dequantisation         -> [B, 512, T]     (codebook_dim)
    2. causal pre-conv, k=3             -> [B, 1024, T]    (latent_dim)
    3. pre-transformer (sliding window) -> [B, 1024, T]
    4. upsampling x2, x2 (ConvTranspose + ConvNeXt)  -> [B, 1024, 4T]
    5. waveform stack: causal conv k7   -> [B, 1536, 4T]   (decoder_dim)
       4 blocks (SnakeBeta, ConvTranspose x8/x5/x4/x3, 3 residual units)
                                        -> [B, 96, 1920T]
       SnakeBeta, causal conv k7 -> [B, 1, 1920T], clamp to [-1, 1]

Everything is causal: output sample n depends only on frames <= n // 1920, which is what makes
exact streaming possible (``DecoderStream`` below).

Weights are a flat dict keyed by the checkpoint names with the ``decoder.`` prefix removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import nn
from .checkpoint import WeightSpec, attention_weight_spec
from .config import config_from_dict
from .validate import check_decoder_config

__all__ = ["DecoderConfig", "decoder_weight_spec", "decode_codes", "DecoderStream", "STAGES"]


@dataclass
class DecoderConfig:
    """``decoder_config`` of the speech tokenizer's config.json (official defaults)."""

    codebook_size: int = 2048
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple = (8, 5, 4, 3)
    upsampling_ratios: tuple = (2, 2)
    decoder_dim: int = 1536
    codebook_dim: int = 512
    head_dim: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> "DecoderConfig":
        cfg = config_from_dict(cls, data)
        check_decoder_config(cfg)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        if cfg.hidden_act != "silu":
            raise ValueError(f"decoder_config.hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
        return cfg

    @property
    def samples_per_frame(self) -> int:
        return int(np.prod(tuple(self.upsampling_ratios) + tuple(self.upsample_rates)))


# ----------------------------------------------------------------------------- weights


def decoder_weight_spec(cfg: DecoderConfig) -> list:
    """Every tensor of the decoder, named as in the checkpoint (without the ``decoder.`` prefix)."""
    spec = []
    half = cfg.codebook_dim // 2
    for part, n_layers in (("rvq_first", 1), ("rvq_rest", cfg.num_quantizers - 1)):
        q = f"quantizer.{part}"
        spec += [WeightSpec(f"{q}.input_proj.weight", (half, cfg.codebook_dim, 1)),
                 WeightSpec(f"{q}.output_proj.weight", (cfg.codebook_dim, half, 1))]
        for i in range(n_layers):
            cb = f"{q}.vq.layers.{i}._codebook"
            spec += [WeightSpec(f"{cb}.cluster_usage", (cfg.codebook_size,), "usage"),
                     WeightSpec(f"{cb}.embedding_sum", (cfg.codebook_size, half), "embedding")]
    spec += [WeightSpec("pre_conv.conv.weight", (cfg.latent_dim, cfg.codebook_dim, 3)),
             WeightSpec("pre_conv.conv.bias", (cfg.latent_dim,), "bias")]

    t = "pre_transformer"
    H, G, D, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    spec += [WeightSpec(f"{t}.input_proj.weight", (C, cfg.latent_dim)),
             WeightSpec(f"{t}.input_proj.bias", (C,), "bias"),
             WeightSpec(f"{t}.output_proj.weight", (cfg.latent_dim, C)),
             WeightSpec(f"{t}.output_proj.bias", (cfg.latent_dim,), "bias"),
             WeightSpec(f"{t}.norm.weight", (C,), "norm")]
    for i in range(cfg.num_hidden_layers):
        p = f"{t}.layers.{i}"
        spec += attention_weight_spec(f"{p}.self_attn.", C, H, G, D, cfg.attention_bias)
        spec += [WeightSpec(f"{p}.mlp.gate_proj.weight", (cfg.intermediate_size, C)),
                 WeightSpec(f"{p}.mlp.up_proj.weight", (cfg.intermediate_size, C)),
                 WeightSpec(f"{p}.mlp.down_proj.weight", (C, cfg.intermediate_size)),
                 WeightSpec(f"{p}.input_layernorm.weight", (C,), "norm"),
                 WeightSpec(f"{p}.post_attention_layernorm.weight", (C,), "norm"),
                 WeightSpec(f"{p}.self_attn_layer_scale.scale", (C,), "scale"),
                 WeightSpec(f"{p}.mlp_layer_scale.scale", (C,), "scale")]

    L = cfg.latent_dim
    for i, r in enumerate(cfg.upsampling_ratios):
        p = f"upsample.{i}"
        spec += [WeightSpec(f"{p}.0.conv.weight", (L, L, r), "transpose"),
                 WeightSpec(f"{p}.0.conv.bias", (L,), "bias"),
                 WeightSpec(f"{p}.1.dwconv.conv.weight", (L, 1, 7)),
                 WeightSpec(f"{p}.1.dwconv.conv.bias", (L,), "bias"),
                 WeightSpec(f"{p}.1.norm.weight", (L,), "norm"),
                 WeightSpec(f"{p}.1.norm.bias", (L,), "norm_bias"),
                 WeightSpec(f"{p}.1.pwconv1.weight", (4 * L, L)),
                 WeightSpec(f"{p}.1.pwconv1.bias", (4 * L,), "bias"),
                 WeightSpec(f"{p}.1.pwconv2.weight", (L, 4 * L)),
                 WeightSpec(f"{p}.1.pwconv2.bias", (L,), "bias"),
                 WeightSpec(f"{p}.1.gamma", (L,), "scale")]

    spec += [WeightSpec("decoder.0.conv.weight", (cfg.decoder_dim, L, 7)),
             WeightSpec("decoder.0.conv.bias", (cfg.decoder_dim,), "bias")]
    for i, rate in enumerate(cfg.upsample_rates):
        c_in, c_out = cfg.decoder_dim // 2 ** i, cfg.decoder_dim // 2 ** (i + 1)
        p = f"decoder.{i + 1}.block"
        spec += [WeightSpec(f"{p}.0.alpha", (c_in,), "log_scale"),
                 WeightSpec(f"{p}.0.beta", (c_in,), "log_scale"),
                 WeightSpec(f"{p}.1.conv.weight", (c_in, c_out, 2 * rate), "transpose"),
                 WeightSpec(f"{p}.1.conv.bias", (c_out,), "bias")]
        for j in range(3):
            u = f"{p}.{j + 2}"
            spec += [WeightSpec(f"{u}.act1.alpha", (c_out,), "log_scale"),
                     WeightSpec(f"{u}.act1.beta", (c_out,), "log_scale"),
                     WeightSpec(f"{u}.conv1.conv.weight", (c_out, c_out, 7)),
                     WeightSpec(f"{u}.conv1.conv.bias", (c_out,), "bias"),
                     WeightSpec(f"{u}.act2.alpha", (c_out,), "log_scale"),
                     WeightSpec(f"{u}.act2.beta", (c_out,), "log_scale"),
                     WeightSpec(f"{u}.conv2.conv.weight", (c_out, c_out, 1), "linear*0.3"),
                     WeightSpec(f"{u}.conv2.conv.bias", (c_out,), "bias")]
    n = len(cfg.upsample_rates)
    c_last = cfg.decoder_dim // 2 ** n
    spec += [WeightSpec(f"decoder.{n + 1}.alpha", (c_last,), "log_scale"),
             WeightSpec(f"decoder.{n + 1}.beta", (c_last,), "log_scale"),
             WeightSpec(f"decoder.{n + 2}.conv.weight", (1, c_last, 7), "linear*0.3"),
             WeightSpec(f"decoder.{n + 2}.conv.bias", (1,), "bias")]
    return spec


RESIDUAL_DILATIONS = (1, 3, 9)

# The stage names recorded by ``decode_codes(..., trace=...)``; the golden files use the same names.
STAGES = ("quantizer", "pre_conv", "pre_transformer", "upsample.0", "upsample.1",
          "decoder.0", "decoder.1", "decoder.2", "decoder.3", "decoder.4", "decoder.5", "decoder.6")


# ----------------------------------------------------------------------------- 1. dequantisation


def codebook_table(w, prefix: str, eps: float = 1e-5):
    """The effective codebook of one VQ layer: embedding_sum / max(cluster_usage, eps).  [K, D]"""
    usage = np.maximum(w[f"{prefix}._codebook.cluster_usage"], eps)
    return w[f"{prefix}._codebook.embedding_sum"] / usage[:, None]


def dequantize(w, cfg: DecoderConfig, codes_bqt, tables=None):
    """Split RVQ: the semantic group (codes[:, 0]) and the acoustic groups (codes[:, 1:]) each sum
    their codebook rows, go through their own 1x1 output projection, and the two are added.
    codes [B, Q, T] -> [B, codebook_dim, T]."""
    tables = tables if tables is not None else dequantize_tables(w, cfg)
    out = 0
    for part, groups in (("rvq_first", range(0, 1)), ("rvq_rest", range(1, cfg.num_quantizers))):
        summed_btd = 0
        for layer, q in enumerate(groups):
            summed_btd = summed_btd + tables[part][layer][codes_bqt[:, q, :]]  # [B, T, D/2]
        proj_oi = w[f"quantizer.{part}.output_proj.weight"][:, :, 0]
        out = out + np.matmul(proj_oi, np.swapaxes(summed_btd, 1, 2))      # [B, D, T]
    return out


def dequantize_tables(w, cfg: DecoderConfig) -> dict:
    """Precompute the effective codebooks (one [K, D/2] table per VQ layer)."""
    return {part: [codebook_table(w, f"quantizer.{part}.vq.layers.{i}") for i in range(n)]
            for part, n in (("rvq_first", 1), ("rvq_rest", cfg.num_quantizers - 1))}


# ----------------------------------------------------------------------------- 3. the pre-transformer


def transformer_layer(w, cfg: DecoderConfig, i: int, x_btc, cos_td, sin_td, allowed_ts, cache=None):
    """One pre-norm layer: x += scale_a * Attn(RMSNorm(x)); x += scale_m * SwiGLU(RMSNorm(x)).

    ``cache`` (streaming only) is a dict holding this layer's past keys/values [B, G, S, D] (after RoPE);
    it is read, extended by the new frames, and trimmed to the last ``window - 1`` entries."""
    p = f"pre_transformer.layers.{i}"
    B, T, C = x_btc.shape
    H, G, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bias = (lambda n: w.get(f"{p}.self_attn.{n}_proj.bias")) if cfg.attention_bias else (lambda n: None)

    h = nn.rms_norm(x_btc, w[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
    q_bhtd = nn.linear(h, w[f"{p}.self_attn.q_proj.weight"], bias("q")).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    k_bgtd = nn.linear(h, w[f"{p}.self_attn.k_proj.weight"], bias("k")).reshape(B, T, G, D).transpose(0, 2, 1, 3)
    v_bgtd = nn.linear(h, w[f"{p}.self_attn.v_proj.weight"], bias("v")).reshape(B, T, G, D).transpose(0, 2, 1, 3)
    q_bhtd = nn.apply_rope(q_bhtd, cos_td, sin_td)
    k_bgtd = nn.apply_rope(k_bgtd, cos_td, sin_td)
    if cache is not None:
        if "k" in cache:
            k_bgtd = np.concatenate([cache["k"], k_bgtd], axis=2)
            v_bgtd = np.concatenate([cache["v"], v_bgtd], axis=2)
        keep = cfg.sliding_window - 1
        cache["k"], cache["v"] = k_bgtd[:, :, -keep:] if keep > 0 else k_bgtd[:, :, :0], \
            v_bgtd[:, :, -keep:] if keep > 0 else v_bgtd[:, :, :0]
    a_bhtd = nn.attention(q_bhtd, k_bgtd, v_bgtd, allowed_ts, scale=cfg.head_dim ** -0.5)
    a_btc = nn.linear(a_bhtd.transpose(0, 2, 1, 3).reshape(B, T, H * D), w[f"{p}.self_attn.o_proj.weight"], bias("o"))
    x_btc = x_btc + w[f"{p}.self_attn_layer_scale.scale"] * a_btc

    h = nn.rms_norm(x_btc, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
    m = nn.silu(nn.linear(h, w[f"{p}.mlp.gate_proj.weight"])) * nn.linear(h, w[f"{p}.mlp.up_proj.weight"])
    m = nn.linear(m, w[f"{p}.mlp.down_proj.weight"])
    return x_btc + w[f"{p}.mlp_layer_scale.scale"] * m


def pre_transformer(w, cfg: DecoderConfig, x_btl, positions_t, caches=None):
    """input_proj -> layers (causal sliding-window attention, RoPE at absolute positions) -> RMSNorm
    -> output_proj.  [B, T, latent] -> [B, T, latent].

    Offline, ``positions_t`` is 0..T-1 and keys are the same frames.  Streaming passes ``caches`` (one
    dict per layer); the keys then also include the cached frames before ``positions_t[0]``."""
    x_btc = nn.linear(x_btl, w["pre_transformer.input_proj.weight"], w["pre_transformer.input_proj.bias"])
    cos_td, sin_td = nn.rope_cos_sin(positions_t, cfg.head_dim, cfg.rope_theta, x_btc.dtype.type)
    start = int(positions_t[0]) if len(positions_t) else 0
    n_cached = min(start, cfg.sliding_window - 1) if caches is not None else 0
    key_positions = np.arange(start - n_cached, start + len(positions_t))
    allowed_ts = nn.causal_window_mask(positions_t, key_positions, cfg.sliding_window)
    for i in range(cfg.num_hidden_layers):
        x_btc = transformer_layer(w, cfg, i, x_btc, cos_td, sin_td, allowed_ts,
                                  None if caches is None else caches[i])
    x_btc = nn.rms_norm(x_btc, w["pre_transformer.norm.weight"], cfg.rms_norm_eps)
    return nn.linear(x_btc, w["pre_transformer.output_proj.weight"], w["pre_transformer.output_proj.bias"])


# ----------------------------------------------------------------------------- 4./5. conv stages
#
# Each conv-stage function takes a ``conv`` callable that performs a causal convolution.  Offline it
# is ``offline_conv`` (pad with zeros on the left); in streaming it is a ``StreamingConvs`` object
# that prepends the left context remembered from the previous push.  The maths of each block is
# written once.


def offline_conv(name, x_bct, w_oik, b_o, dilation=1, groups=1):
    return nn.causal_conv1d(x_bct, w_oik, b_o, 1, dilation, groups)


def offline_transposed_conv(name, x_bct, w_iok, b_o, stride):
    return nn.causal_conv_transpose1d(x_bct, w_iok, b_o, stride)


def convnext_block(w, p, x_bct, conv):
    """Depthwise causal conv k7 -> LayerNorm(1e-6) -> Linear(4C) -> GELU(erf) -> Linear(C) -> gamma, + x."""
    C = x_bct.shape[1]
    h_bct = conv(f"{p}.dwconv", x_bct, w[f"{p}.dwconv.conv.weight"], w[f"{p}.dwconv.conv.bias"], groups=C)
    h_btc = np.swapaxes(h_bct, 1, 2)
    h_btc = nn.layer_norm(h_btc, w[f"{p}.norm.weight"], w[f"{p}.norm.bias"], 1e-6)
    h_btc = nn.gelu_erf(nn.linear(h_btc, w[f"{p}.pwconv1.weight"], w[f"{p}.pwconv1.bias"]))
    h_btc = nn.linear(h_btc, w[f"{p}.pwconv2.weight"], w[f"{p}.pwconv2.bias"])
    return x_bct + np.swapaxes(w[f"{p}.gamma"] * h_btc, 1, 2)


def upsample_stage(w, i: int, ratio: int, x_bct, conv, transposed_conv):
    """ConvTranspose (k = stride = ratio) then a ConvNeXt block."""
    p = f"upsample.{i}"
    x_bct = transposed_conv(f"{p}.0", x_bct, w[f"{p}.0.conv.weight"], w[f"{p}.0.conv.bias"], ratio)
    return convnext_block(w, f"{p}.1", x_bct, conv)


def residual_unit(w, u, dilation: int, x_bct, conv):
    """x + conv_k1(SnakeBeta(conv_k7_dilated(SnakeBeta(x))))."""
    h = nn.snake_beta(x_bct, w[f"{u}.act1.alpha"], w[f"{u}.act1.beta"])
    h = conv(f"{u}.conv1", h, w[f"{u}.conv1.conv.weight"], w[f"{u}.conv1.conv.bias"], dilation=dilation)
    h = nn.snake_beta(h, w[f"{u}.act2.alpha"], w[f"{u}.act2.beta"])
    h = conv(f"{u}.conv2", h, w[f"{u}.conv2.conv.weight"], w[f"{u}.conv2.conv.bias"])
    return x_bct + h


def waveform_block(w, i: int, rate: int, x_bct, conv, transposed_conv):
    """SnakeBeta -> ConvTranspose (k = 2 * rate, stride = rate, channels halve) -> residual units (dilations 1, 3, 9)."""
    p = f"decoder.{i + 1}.block"
    x_bct = nn.snake_beta(x_bct, w[f"{p}.0.alpha"], w[f"{p}.0.beta"])
    x_bct = transposed_conv(f"{p}.1", x_bct, w[f"{p}.1.conv.weight"], w[f"{p}.1.conv.bias"], rate)
    for j, dilation in enumerate(RESIDUAL_DILATIONS):
        x_bct = residual_unit(w, f"{p}.{j + 2}", dilation, x_bct, conv)
    return x_bct


def conv_stages(w, cfg: DecoderConfig, x_bct, conv, transposed_conv, trace=None):
    """Stages 4 and 5: [B, latent, T] -> [B, 1, T * samples_per_frame] (before the clamp)."""
    record = trace.__setitem__ if trace is not None else (lambda k, v: None)
    for i, ratio in enumerate(cfg.upsampling_ratios):
        x_bct = upsample_stage(w, i, ratio, x_bct, conv, transposed_conv)
        record(f"upsample.{i}", x_bct)
    x_bct = conv("decoder.0", x_bct, w["decoder.0.conv.weight"], w["decoder.0.conv.bias"])
    record("decoder.0", x_bct)
    for i, rate in enumerate(cfg.upsample_rates):
        x_bct = waveform_block(w, i, rate, x_bct, conv, transposed_conv)
        record(f"decoder.{i + 1}", x_bct)
    n = len(cfg.upsample_rates)
    x_bct = nn.snake_beta(x_bct, w[f"decoder.{n + 1}.alpha"], w[f"decoder.{n + 1}.beta"])
    record(f"decoder.{n + 1}", x_bct)
    x_bct = conv(f"decoder.{n + 2}", x_bct, w[f"decoder.{n + 2}.conv.weight"], w[f"decoder.{n + 2}.conv.bias"])
    record(f"decoder.{n + 2}", x_bct)
    return x_bct


# ----------------------------------------------------------------------------- the whole decoder, offline


def decode_codes(w, cfg: DecoderConfig, codes_bqt, trace=None, tables=None):
    """One causal pass over whole code sequences: codes [B, Q, T] (0 <= code < codebook_size)
    -> waveform [B, T * samples_per_frame], clamped to [-1, 1].

    If ``trace`` is a dict, the output of every stage (see ``STAGES``) is stored in it."""
    record = trace.__setitem__ if trace is not None else (lambda k, v: None)
    x_bct = dequantize(w, cfg, codes_bqt, tables)
    record("quantizer", x_bct)
    x_bct = nn.causal_conv1d(x_bct, w["pre_conv.conv.weight"], w["pre_conv.conv.bias"])
    record("pre_conv", x_bct)
    T = x_bct.shape[-1]
    x_btc = pre_transformer(w, cfg, np.swapaxes(x_bct, 1, 2), np.arange(T))
    record("pre_transformer", x_btc)
    x_bct = conv_stages(w, cfg, np.swapaxes(x_btc, 1, 2), offline_conv, offline_transposed_conv, trace)
    return np.clip(x_bct[:, 0, :], -1.0, 1.0)


# ----------------------------------------------------------------------------- streaming


class StreamingConvs:
    """The carried state of every convolution in streaming decode.

    A causal conv with span s = (k - 1) * dilation + 1 needs the last s - 1 input samples of the
    previous push as left context (zeros before the first push, exactly the offline zero padding).
    A transposed conv with k > stride leaves a tail of k - stride partial output samples that the
    next push's first frames complete (the offline right trim drops exactly these samples)."""

    def __init__(self):
        self.context = {}  # conv name -> [B, C, s - 1] last inputs
        self.tails = {}    # transposed conv name -> [B, C_out, k - stride] partial sums (no bias)

    def __call__(self, name, x_bct, w_oik, b_o, dilation=1, groups=1):
        K = w_oik.shape[-1]
        keep = (K - 1) * dilation
        ctx = self.context.get(name)
        if ctx is None:
            ctx = np.zeros(x_bct.shape[:2] + (keep,), dtype=x_bct.dtype)
        x_bct = np.concatenate([ctx, x_bct], axis=-1)
        self.context[name] = x_bct[:, :, x_bct.shape[-1] - keep:]
        if x_bct.shape[-1] == keep:  # nothing new
            return np.zeros(x_bct.shape[:1] + (w_oik.shape[0], 0), dtype=x_bct.dtype)
        return nn.conv1d(x_bct, w_oik, b_o, 1, dilation, groups)

    def transposed(self, name, x_bct, w_iok, b_o, stride):
        B, _, T = x_bct.shape
        K, C_out = w_iok.shape[-1], w_iok.shape[1]
        tail = self.tails.get(name)
        if tail is None:
            tail = np.zeros((B, C_out, K - stride), dtype=x_bct.dtype)
        if T == 0:
            return np.zeros((B, C_out, 0), dtype=x_bct.dtype)
        full = nn.conv_transpose1d(x_bct, w_iok, None, stride)  # [B, C_out, (T - 1) * stride + K]
        full[:, :, :K - stride] += tail
        self.tails[name] = full[:, :, T * stride:]
        return full[:, :, :T * stride] + b_o[None, :, None]


class DecoderStream:
    """Stateful decoder: ``push(codes_bqt)`` returns exactly the samples of the pushed frames.

    Carried state: the left context of every causal conv, the overlap tail of every transposed conv,
    and per transformer layer the keys/values of the last ``sliding_window - 1`` frames with their
    absolute RoPE positions.  Nothing is ever decoded twice, and the concatenated output equals
    ``decode_codes`` of the whole sequence (up to float summation order)."""

    def __init__(self, w, cfg: DecoderConfig, batch: int = 1, dtype=np.float32, tables=None):
        self.w, self.cfg, self.batch, self.dtype = w, cfg, batch, dtype
        self.tables = tables if tables is not None else dequantize_tables(w, cfg)
        self.frames_done = 0
        self.convs = StreamingConvs()
        self.caches = [dict() for _ in range(cfg.num_hidden_layers)]

    def push(self, codes_bqt):
        cfg = self.cfg
        T = codes_bqt.shape[-1]
        if T == 0:
            return np.zeros((self.batch, 0), dtype=self.dtype)
        x_bct = dequantize(self.w, cfg, codes_bqt, self.tables)
        x_bct = self.convs("pre_conv", x_bct, self.w["pre_conv.conv.weight"], self.w["pre_conv.conv.bias"])
        positions = np.arange(self.frames_done, self.frames_done + T)
        x_btc = pre_transformer(self.w, cfg, np.swapaxes(x_bct, 1, 2), positions, self.caches)
        x_bct = conv_stages(self.w, cfg, np.swapaxes(x_btc, 1, 2), self.convs, self.convs.transposed)
        self.frames_done += T
        return np.clip(x_bct[:, 0, :], -1.0, 1.0)
