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

from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..backends import primitive
from ..io.checkpoint import WeightSpec, WeightView
from ..io.config import config_from_dict
from ..io.validate import check_decoder_config
from ..recorder import NULL_RECORDER, Recorder, as_recorder, record_rope_and_mask
from ..transformer import (
    CODEC_DECODER,
    SlidingKVCache,
    attention_weight_spec,
    check_attention_config,
    layer_views,
    transformer_stack,
)
from .quantization import dequantize, dequantize_tables

__all__ = ["DecoderConfig", "decoder_weight_spec", "decode_codes", "DecoderState", "DecoderStream", "STAGES"]


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
    def from_dict(cls, data) -> DecoderConfig:
        cfg = config_from_dict(cls, data)
        check_decoder_config(cfg)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        check_attention_config("decoder_config", cfg)
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
        spec += [
            WeightSpec(f"{q}.input_proj.weight", (half, cfg.codebook_dim, 1)),
            WeightSpec(f"{q}.output_proj.weight", (cfg.codebook_dim, half, 1)),
        ]
        for i in range(n_layers):
            cb = f"{q}.vq.layers.{i}._codebook"
            spec += [
                WeightSpec(f"{cb}.cluster_usage", (cfg.codebook_size,), "usage"),
                WeightSpec(f"{cb}.embedding_sum", (cfg.codebook_size, half), "embedding"),
            ]
    spec += [
        WeightSpec("pre_conv.conv.weight", (cfg.latent_dim, cfg.codebook_dim, 3)),
        WeightSpec("pre_conv.conv.bias", (cfg.latent_dim,), "bias"),
    ]

    t = "pre_transformer"
    H, G, D, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    spec += [
        WeightSpec(f"{t}.input_proj.weight", (C, cfg.latent_dim)),
        WeightSpec(f"{t}.input_proj.bias", (C,), "bias"),
        WeightSpec(f"{t}.output_proj.weight", (cfg.latent_dim, C)),
        WeightSpec(f"{t}.output_proj.bias", (cfg.latent_dim,), "bias"),
        WeightSpec(f"{t}.norm.weight", (C,), "norm"),
    ]
    for i in range(cfg.num_hidden_layers):
        p = f"{t}.layers.{i}"
        spec += attention_weight_spec(f"{p}.self_attn.", C, H, G, D, cfg.attention_bias)
        spec += [
            WeightSpec(f"{p}.mlp.gate_proj.weight", (cfg.intermediate_size, C)),
            WeightSpec(f"{p}.mlp.up_proj.weight", (cfg.intermediate_size, C)),
            WeightSpec(f"{p}.mlp.down_proj.weight", (C, cfg.intermediate_size)),
            WeightSpec(f"{p}.input_layernorm.weight", (C,), "norm"),
            WeightSpec(f"{p}.post_attention_layernorm.weight", (C,), "norm"),
            WeightSpec(f"{p}.self_attn_layer_scale.scale", (C,), "scale"),
            WeightSpec(f"{p}.mlp_layer_scale.scale", (C,), "scale"),
        ]

    L = cfg.latent_dim
    for i, r in enumerate(cfg.upsampling_ratios):
        p = f"upsample.{i}"
        spec += [
            WeightSpec(f"{p}.0.conv.weight", (L, L, r), "transpose"),
            WeightSpec(f"{p}.0.conv.bias", (L,), "bias"),
            WeightSpec(f"{p}.1.dwconv.conv.weight", (L, 1, 7)),
            WeightSpec(f"{p}.1.dwconv.conv.bias", (L,), "bias"),
            WeightSpec(f"{p}.1.norm.weight", (L,), "norm"),
            WeightSpec(f"{p}.1.norm.bias", (L,), "norm_bias"),
            WeightSpec(f"{p}.1.pwconv1.weight", (4 * L, L)),
            WeightSpec(f"{p}.1.pwconv1.bias", (4 * L,), "bias"),
            WeightSpec(f"{p}.1.pwconv2.weight", (L, 4 * L)),
            WeightSpec(f"{p}.1.pwconv2.bias", (L,), "bias"),
            WeightSpec(f"{p}.1.gamma", (L,), "scale"),
        ]

    spec += [
        WeightSpec("decoder.0.conv.weight", (cfg.decoder_dim, L, 7)),
        WeightSpec("decoder.0.conv.bias", (cfg.decoder_dim,), "bias"),
    ]
    for i, rate in enumerate(cfg.upsample_rates):
        c_in, c_out = cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1)
        p = f"decoder.{i + 1}.block"
        spec += [
            WeightSpec(f"{p}.0.alpha", (c_in,), "log_scale"),
            WeightSpec(f"{p}.0.beta", (c_in,), "log_scale"),
            WeightSpec(f"{p}.1.conv.weight", (c_in, c_out, 2 * rate), "transpose"),
            WeightSpec(f"{p}.1.conv.bias", (c_out,), "bias"),
        ]
        for j in range(3):
            u = f"{p}.{j + 2}"
            spec += [
                WeightSpec(f"{u}.act1.alpha", (c_out,), "log_scale"),
                WeightSpec(f"{u}.act1.beta", (c_out,), "log_scale"),
                WeightSpec(f"{u}.conv1.conv.weight", (c_out, c_out, 7)),
                WeightSpec(f"{u}.conv1.conv.bias", (c_out,), "bias"),
                WeightSpec(f"{u}.act2.alpha", (c_out,), "log_scale"),
                WeightSpec(f"{u}.act2.beta", (c_out,), "log_scale"),
                WeightSpec(f"{u}.conv2.conv.weight", (c_out, c_out, 1), "linear*0.3"),
                WeightSpec(f"{u}.conv2.conv.bias", (c_out,), "bias"),
            ]
    n = len(cfg.upsample_rates)
    c_last = cfg.decoder_dim // 2**n
    spec += [
        WeightSpec(f"decoder.{n + 1}.alpha", (c_last,), "log_scale"),
        WeightSpec(f"decoder.{n + 1}.beta", (c_last,), "log_scale"),
        WeightSpec(f"decoder.{n + 2}.conv.weight", (1, c_last, 7), "linear*0.3"),
        WeightSpec(f"decoder.{n + 2}.conv.bias", (1,), "bias"),
    ]
    return spec


RESIDUAL_DILATIONS = (1, 3, 9)

# The stage names recorded by ``decode_codes(..., trace=...)``; the golden files use the same names.
STAGES = (
    "quantizer",
    "pre_conv",
    "pre_transformer",
    "upsample.0",
    "upsample.1",
    "decoder.0",
    "decoder.1",
    "decoder.2",
    "decoder.3",
    "decoder.4",
    "decoder.5",
    "decoder.6",
)


# ----------------------------------------------------------------------------- 1. dequantisation


# ----------------------------------------------------------------------------- 3. the pre-transformer


def pre_transformer(w, cfg: DecoderConfig, x_btl, positions_t, caches=None, record: Recorder = NULL_RECORDER):
    """input_proj -> layers (causal sliding-window attention, RoPE at absolute positions) -> RMSNorm
    -> output_proj.  [B, T, latent] -> [B, T, latent].

    Offline, ``positions_t`` is 0..T-1 and the keys are the same frames.  Streaming passes ``caches``
    (one ``SlidingKVCache`` per layer); the keys then start with the cached frames before
    ``positions_t[0]``."""
    t = WeightView(w, "pre_transformer.")
    x_btc = nn.linear(x_btl, t["input_proj.weight"], t["input_proj.bias"])
    record("input_proj", x_btc)
    cos_td, sin_td = nn.rope_cos_sin(positions_t, cfg.head_dim, cfg.rope_theta, x_btc.dtype.type)
    if caches is None:
        key_positions = positions_t  # offline: the keys are the same frames
    else:  # the cached frames, then the new ones (no device read needed:
        start = caches[0].length  # the caches know the position of this push's first frame)
        key_positions = nn.arange(start - caches[0].kept, start + len(positions_t))
    mask = nn.AttentionMask(positions_t, key_positions, cfg.sliding_window)
    record_rope_and_mask(record, cos_td[None], sin_td[None], mask)
    layers = layer_views(w, "pre_transformer.layers.", cfg.num_hidden_layers)
    x_btc = transformer_stack(
        layers, CODEC_DECODER, cfg, x_btc, cos_td[None], sin_td[None], mask, caches, cfg.rms_norm_eps, record
    )
    x_btc = nn.rms_norm(x_btc, t["norm.weight"], cfg.rms_norm_eps)
    record("norm", x_btc)
    x_btc = nn.linear(x_btc, t["output_proj.weight"], t["output_proj.bias"])
    record("output_proj", x_btc)
    return x_btc


# ----------------------------------------------------------------------------- 4./5. conv stages
#
# Every conv unit takes a view of its weights, of its streaming state and of its recorder, all three
# scoped to its checkpoint name (``w.sub("conv1.")``, ``state.sub("conv1.")``, ``record.scope("conv1.")``).
# Offline the state is ``ConvStates(None)`` and each conv pads with zeros; streaming it reaches one state
# per conv (``DecoderState.convs``), carrying the left context (causal convs) or the unfinished output
# tail (transposed convs) from one push to the next.


class ConvStates:
    """The streaming states of the decoder's convs, reached by the checkpoint names of their weights as a
    ``WeightView`` reaches the weights:

        states = ConvStates(decoder_state.convs)            # offline: ConvStates(None)
        unit = states.sub("decoder.1.block.2.")
        unit.sub("conv1.").conv(nn.CausalConvState)          # is decoder_state.convs["decoder.1.block.2.conv1"]

    Offline ``conv`` returns None (the conv pads with zeros).  Streaming, a conv whose state is missing or
    of the other kind is an error: padding with zeros instead would restart that conv at every push."""

    __slots__ = ("convs", "prefix")

    def __init__(self, convs: dict | None, prefix: str = ""):
        self.convs = convs
        self.prefix = prefix

    def sub(self, prefix: str) -> ConvStates:
        return ConvStates(self.convs, self.prefix + prefix)

    def conv(self, kind: type):
        """The state of the conv this view is scoped to (``decoder.0.`` -> ``convs["decoder.0"]``), None offline."""
        if self.convs is None:
            return None
        name = self.prefix.rstrip(".")
        state = self.convs.get(name)
        if not isinstance(state, kind):
            found = "no state" if state is None else f"a {type(state).__name__}"
            raise LookupError(
                f"streaming decoder: conv {name!r} finds {found} in DecoderState.convs, not a {kind.__name__}"
            )
        return state

    def __repr__(self) -> str:
        return f"ConvStates({self.prefix!r}, {'offline' if self.convs is None else 'streaming'})"


OFFLINE = ConvStates(None)


def causal_conv(w: WeightView, x_bct, state: ConvStates, record: Recorder, **options):
    """A causal conv unit (the official ``CausalConvNet``: weights ``conv.weight``, ``conv.bias``)."""
    y_bct = nn.causal_conv1d(x_bct, w["conv.weight"], w["conv.bias"], state=state.conv(nn.CausalConvState), **options)
    record.output(y_bct)
    return y_bct


def transposed_conv(w: WeightView, x_bct, stride: int, state: ConvStates, record: Recorder):
    """A causal transposed conv unit (``CausalTransConvNet``: weights ``conv.weight`` [in, out, K],
    ``conv.bias``): T frames in, T * stride samples out.  Offline the ConvTranspose1d's whole output,
    (T - 1) * stride + K samples, is computed and its last K - stride cut off (the result is a view of
    it; the whole one is recorded as the extra ``untrimmed``).  Streaming, those last samples are
    partial sums that the state keeps for the next push (``nn.causal_conv_transpose1d``)."""
    weight, bias = w["conv.weight"], w["conv.bias"]
    conv_state = state.conv(nn.TransposedConvState)
    if conv_state is not None:
        y_bct = nn.causal_conv_transpose1d(x_bct, weight, bias, stride, state=conv_state)
    else:
        full_bct = nn.conv_transpose1d(x_bct, weight, bias, stride)  # [B, O, (T - 1) * stride + K]
        record.extra("untrimmed", full_bct)
        y_bct = full_bct[:, :, : x_bct.shape[-1] * stride]
    record.output(y_bct)
    return y_bct


def snake(w: WeightView, name: str, x_bct, record: Recorder):
    y_bct = nn.snake_beta(x_bct, w[f"{name}.alpha"], w[f"{name}.beta"])
    record(name, y_bct)
    return y_bct


def convnext_block(w: WeightView, x_bct, state: ConvStates, record: Recorder = NULL_RECORDER):
    """Depthwise causal conv k7 -> LayerNorm(1e-6) -> Linear(4C) -> GELU(erf) -> Linear(C) -> gamma, + x.
    ``w``, ``state`` and ``record`` are scoped to the block (``upsample.{i}.1.``)."""
    C = x_bct.shape[1]
    h_bct = causal_conv(w.sub("dwconv."), x_bct, state.sub("dwconv."), record.scope("dwconv."), groups=C)
    h_btc = np.swapaxes(h_bct, 1, 2)
    h_btc = nn.layer_norm(h_btc, w["norm.weight"], w["norm.bias"], 1e-6)
    record("norm", h_btc)
    h_btc = nn.linear(h_btc, w["pwconv1.weight"], w["pwconv1.bias"])
    record("pwconv1", h_btc)
    h_btc = nn.gelu_erf(h_btc)
    record("act", h_btc)
    h_btc = nn.linear(h_btc, w["pwconv2.weight"], w["pwconv2.bias"])
    record("pwconv2", h_btc)
    return x_bct + np.swapaxes(w["gamma"] * h_btc, 1, 2)


def upsample_stage(u: WeightView, ratio: int, x_bct, state: ConvStates, record: Recorder = NULL_RECORDER):
    """upsample.{i}: ConvTranspose (k = stride = ratio) then a ConvNeXt block; all views scoped to ``upsample.{i}.``."""
    x_bct = transposed_conv(u.sub("0."), x_bct, ratio, state.sub("0."), record.scope("0."))
    x_bct = convnext_block(u.sub("1."), x_bct, state.sub("1."), record.scope("1."))
    record("1", x_bct)
    return x_bct


@primitive
def residual_unit(u: WeightView, dilation: int, x_bct, state: ConvStates, record: Recorder = NULL_RECORDER):
    """x + conv_k1(SnakeBeta(conv_k7_dilated(SnakeBeta(x)))); all views scoped to the unit.  Streaming,
    conv1's state carries the left context; conv2, a 1x1 conv, has none to carry.  A primitive: numba's twin
    (``refimpl/backends/numba_cpu/codec_decoder.py``) runs the unit in one pass over cache-sized pieces of
    time while nothing is recorded."""
    h = snake(u, "act1", x_bct, record)
    h = causal_conv(u.sub("conv1."), h, state.sub("conv1."), record.scope("conv1."), dilation=dilation)
    h = snake(u, "act2", h, record)
    h = causal_conv(u.sub("conv2."), h, state.sub("conv2."), record.scope("conv2."))
    return x_bct + h


def waveform_block(b: WeightView, rate: int, x_bct, state: ConvStates, record: Recorder = NULL_RECORDER):
    """decoder.{i+1}: SnakeBeta -> ConvTranspose (k = 2 * rate, stride = rate, channels halve)
    -> residual units (dilations 1, 3, 9); all views scoped to ``decoder.{i+1}.block.``."""
    x_bct = snake(b, "0", x_bct, record)
    x_bct = transposed_conv(b.sub("1."), x_bct, rate, state.sub("1."), record.scope("1."))
    for j, dilation in enumerate(RESIDUAL_DILATIONS):
        p = f"{j + 2}."
        x_bct = residual_unit(b.sub(p), dilation, x_bct, state.sub(p), record.scope(p))
        record(f"{j + 2}", x_bct)
    return x_bct


def conv_stages(w, cfg: DecoderConfig, x_bct, states: ConvStates, record: Recorder = NULL_RECORDER):
    """Stages 4 and 5: [B, latent, T] -> [B, 1, T * samples_per_frame] (before the clamp)."""
    w = WeightView(w)
    for i, ratio in enumerate(cfg.upsampling_ratios):
        p = f"upsample.{i}."
        x_bct = upsample_stage(w.sub(p), ratio, x_bct, states.sub(p), record.scope(p))
        record(f"upsample.{i}", x_bct)
    x_bct = causal_conv(w.sub("decoder.0."), x_bct, states.sub("decoder.0."), record.scope("decoder.0."))
    for i, rate in enumerate(cfg.upsample_rates):
        p = f"decoder.{i + 1}.block."
        x_bct = waveform_block(w.sub(p), rate, x_bct, states.sub(p), record.scope(p))
        record(f"decoder.{i + 1}", x_bct)
    n = len(cfg.upsample_rates)
    a, p = f"decoder.{n + 1}", f"decoder.{n + 2}."
    return snake_causal_conv(w, a, p, x_bct, states, record)


@primitive
def snake_causal_conv(w: WeightView, act: str, conv: str, x_bct, state: ConvStates, record: Recorder = NULL_RECORDER):
    """causal_conv(SnakeBeta(x)): the decoder's last SnakeBeta (``act``) and conv (``conv``, 96 channels -> 1).
    A primitive: numba's twin takes SnakeBeta of each piece of time as it multiplies it into the conv's taps,
    so that SnakeBeta's output of the signal's length is never made."""
    x_bct = snake(w, act, x_bct, record)
    return causal_conv(w.sub(conv), x_bct, state.sub(conv), record.scope(conv))


# ----------------------------------------------------------------------------- the whole decoder


def decode_stages(
    w,
    cfg: DecoderConfig,
    codes_bqt,
    tables: dict,
    state: DecoderState | None = None,
    record: Recorder = NULL_RECORDER,
):
    """Stages 1-5 over new frames: codes [B, Q, T] -> waveform [B, T * samples_per_frame] in [-1, 1].
    Offline (``state=None``) the frames are the whole sequence; streaming continues from ``state``.
    Host codes are uploaded to the active backend here (the waveform stays there)."""
    codes_bqt = nn.to_device(codes_bqt)
    T = codes_bqt.shape[-1]
    start = state.frames_done if state is not None else 0
    states = ConvStates(state.convs) if state is not None else OFFLINE
    x_bct = dequantize(w, cfg, codes_bqt, tables, record)
    record("quantizer", x_bct)
    x_bct = causal_conv(WeightView(w, "pre_conv."), x_bct, states.sub("pre_conv."), record.scope("pre_conv."))
    x_btc = pre_transformer(
        w,
        cfg,
        np.swapaxes(x_bct, 1, 2),
        nn.arange(start, start + T),
        state.kv if state is not None else None,
        record.scope("pre_transformer."),
    )
    record("pre_transformer", x_btc)
    x_bct = conv_stages(w, cfg, np.swapaxes(x_btc, 1, 2), states, record)
    if state is not None:
        state.frames_done += T
    return np.clip(x_bct[:, 0, :], -1.0, 1.0)


def decode_codes(w, cfg: DecoderConfig, codes_bqt, trace=None, tables=None):
    """One causal pass over whole code sequences: codes [B, Q, T] (0 <= code < codebook_size)
    -> waveform [B, T * samples_per_frame], clamped to [-1, 1].

    If ``trace`` is a dict (or a ``Recorder``), the output of every stage (see ``STAGES``) is stored
    in it, and of every pre-transformer layer (``pre_transformer.layers.{i}`` and its parts)."""
    tables = tables if tables is not None else dequantize_tables(w, cfg)
    return decode_stages(w, cfg, codes_bqt, tables, None, as_recorder(trace))


# ----------------------------------------------------------------------------- streaming


def conv_names(cfg: DecoderConfig) -> tuple:
    """The checkpoint name of every causal conv (first) and transposed conv (second) of the decoder: the
    units whose weights are ``{name}.conv.weight`` in ``decoder_weight_spec`` (ConvTranspose weights,
    [in, out, K], are the ones marked ``transpose``)."""
    causal, transposed = [], []
    for spec in decoder_weight_spec(cfg):
        if spec.name.endswith(".conv.weight"):
            name = spec.name[: -len(".conv.weight")]
            (transposed if spec.init == "transpose" else causal).append(name)
    return causal, transposed


class DecoderState:
    """Everything the streaming decoder carries from one push to the next:

    frames_done  how many frames were decoded (the RoPE position of the next one)
    kv           per pre-transformer layer, a ``SlidingKVCache`` of the last ``sliding_window - 1`` frames
    convs        per conv (by checkpoint name), a ``CausalConvState`` (its last span - 1 inputs) or a
                 ``TransposedConvState`` (its unfinished output tail)
    """

    def __init__(self, cfg: DecoderConfig, batch: int, dtype):
        self.frames_done = 0
        self.kv = [
            SlidingKVCache(cfg.sliding_window, batch, cfg.num_key_value_heads, cfg.head_dim, dtype)
            for _ in range(cfg.num_hidden_layers)
        ]
        causal, transposed = conv_names(cfg)
        self.convs = {name: nn.CausalConvState() for name in causal}
        self.convs.update({name: nn.TransposedConvState() for name in transposed})

    def context_lengths(self) -> dict:
        """Samples of left context each causal conv holds now (0 before the first push)."""
        return {
            name: (s.context_bct.shape[-1] if s.context_bct is not None else 0)
            for name, s in self.convs.items()
            if isinstance(s, nn.CausalConvState)
        }


class DecoderStream:
    """Stateful decoder: ``push(codes_bqt)`` returns exactly the samples of the pushed frames.

    Nothing is ever decoded twice, and the concatenated output equals ``decode_codes`` of the whole
    sequence (up to float summation order).  ``state`` (a ``DecoderState``) is what is carried."""

    def __init__(self, w, cfg: DecoderConfig, batch: int = 1, dtype=np.float32, tables=None):
        self.w, self.cfg, self.batch, self.dtype = w, cfg, batch, dtype
        self.tables = tables if tables is not None else dequantize_tables(w, cfg)
        self.state = DecoderState(cfg, batch, dtype)

    @property
    def frames_done(self) -> int:
        return self.state.frames_done

    def push(self, codes_bqt):
        if codes_bqt.shape[-1] == 0:
            return nn.zeros((self.batch, 0), dtype=self.dtype)
        return decode_stages(self.w, self.cfg, codes_bqt, self.tables, self.state)
