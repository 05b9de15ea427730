"""The transformer that every stack of Qwen3-TTS is built from: one layer, one attention, two KV caches.

Four stacks use it, differing only in the choices a ``LayerKind`` names:

    stack                                 norm         q/k norm   MLP      LayerScale  window
    Talker (28 layers), code predictor (5) RMSNorm     per head   SwiGLU   -           -
    codec decoder pre-transformer (8)     RMSNorm      -          SwiGLU   yes         72 frames
    codec encoder transformer (8)         LayerNorm    -          GELU     yes         (see codec_encoder)

One pre-norm residual layer, for x [B, T, C]:

    h = norm_1(x)
    q, k, v = q_proj(h), k_proj(h), v_proj(h)           split into heads: q [B, H, T, D], k and v [B, G, S, D]
    q, k = rms_norm(q), rms_norm(k)                      (Qwen3 only, over each head's D values)
    q, k = rope(q), rope(k)                              rotary embedding at each token's position
    k, v = cache.append(k, v)                            (generation / streaming: keys of earlier positions too)
    a = o_proj(softmax(q k^T / sqrt(D) + mask) v)       grouped-query: query head h reads kv head h // (H / G)
    x = x + scale_a * a                                  (scale_a = 1 without LayerScale)
    x = x + scale_m * mlp(norm_2(x))                    SwiGLU: down(silu(gate(h)) * up(h)); GELU: fc2(gelu(fc1(h)))

Weights are reached through a ``WeightView`` of one layer (``model.layers.3.`` for the Talker), so
every line names its tensor as the checkpoint does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import nn
from .backends import primitive
from .io.checkpoint import WeightSpec, WeightView
from .recorder import NULL_RECORDER, Recorder, record_attention_details

__all__ = [
    "LayerKind",
    "attention_weight_spec",
    "qwen3_layer_weight_spec",
    "check_attention_config",
    "KVCache",
    "SlidingKVCache",
    "attention_block",
    "swiglu_mlp",
    "gelu_mlp",
    "transformer_layer",
    "transformer_stack",
    "layer_views",
    "QWEN3",
    "CODEC_DECODER",
    "CODEC_ENCODER",
]


@dataclass(frozen=True)
class LayerKind:
    """What distinguishes the layers of one stack (the table of the module docstring)."""

    norm: str  # "rms" (weight only) or "layer" (weight and bias, mean removed)
    qk_norm: bool  # RMSNorm of each query / key head before RoPE (Qwen3)
    mlp: str  # "swiglu" (gate_proj, up_proj, down_proj) or "gelu" (fc1, fc2)
    layer_scale: bool  # per-channel scales self_attn_layer_scale / mlp_layer_scale on both branches


QWEN3 = LayerKind(norm="rms", qk_norm=True, mlp="swiglu", layer_scale=False)
CODEC_DECODER = LayerKind(norm="rms", qk_norm=False, mlp="swiglu", layer_scale=True)
CODEC_ENCODER = LayerKind(norm="layer", qk_norm=False, mlp="gelu", layer_scale=True)


# ----------------------------------------------------------------------------- weights and configs


def attention_weight_spec(
    prefix: str, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool = False, out_init: str = "linear"
) -> list:
    """The q/k/v/o projections of one attention block (``{prefix}q_proj.weight`` ...): q and o have
    ``heads * head_dim`` rows / columns, k and v ``kv_heads * head_dim``."""
    spec = [
        WeightSpec(f"{prefix}q_proj.weight", (heads * head_dim, hidden)),
        WeightSpec(f"{prefix}k_proj.weight", (kv_heads * head_dim, hidden)),
        WeightSpec(f"{prefix}v_proj.weight", (kv_heads * head_dim, hidden)),
        WeightSpec(f"{prefix}o_proj.weight", (hidden, heads * head_dim), out_init),
    ]
    if bias:
        spec += [
            WeightSpec(f"{prefix}{n}_proj.bias", (size,), "bias")
            for n, size in (
                ("q", heads * head_dim),
                ("k", kv_heads * head_dim),
                ("v", kv_heads * head_dim),
                ("o", hidden),
            )
        ]
    return spec


def qwen3_layer_weight_spec(
    prefix: str, hidden: int, intermediate: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool
) -> list:
    """One Qwen3 decoder layer (Talker, code predictor): attention with per-head q/k RMSNorm, SwiGLU MLP,
    two RMSNorms."""
    p = prefix
    return [
        WeightSpec(f"{p}input_layernorm.weight", (hidden,), "norm"),
        *attention_weight_spec(f"{p}self_attn.", hidden, n_heads, n_kv_heads, head_dim, bias, out_init="linear*0.5"),
        WeightSpec(f"{p}self_attn.q_norm.weight", (head_dim,), "norm"),
        WeightSpec(f"{p}self_attn.k_norm.weight", (head_dim,), "norm"),
        WeightSpec(f"{p}post_attention_layernorm.weight", (hidden,), "norm"),
        WeightSpec(f"{p}mlp.gate_proj.weight", (intermediate, hidden)),
        WeightSpec(f"{p}mlp.up_proj.weight", (intermediate, hidden)),
        WeightSpec(f"{p}mlp.down_proj.weight", (hidden, intermediate), "linear*0.5"),
    ]


def check_attention_config(where: str, cfg, activation: str = "silu") -> None:
    """What every stack needs of its config: the activation its MLP implements (SiLU for SwiGLU, GELU),
    kv heads dividing the query heads, and an even head_dim (RoPE rotates pairs of channels)."""
    if cfg.hidden_act != activation:
        raise ValueError(f"{where}.hidden_act {cfg.hidden_act!r} is not supported (only {activation!r})")
    if cfg.num_key_value_heads < 1 or cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"{where}: num_attention_heads {cfg.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {cfg.num_key_value_heads}"
        )
    if cfg.head_dim % 2:
        raise ValueError(f"{where}: head_dim {cfg.head_dim} must be even for the rotary embedding")


def layer_views(weights, prefix: str, n_layers: int) -> list:
    """One ``WeightView`` per layer, ``{prefix}{i}.`` for i < n_layers, of the weights dict or of a view's dict."""
    return [WeightView(weights, f"{prefix}{i}.") for i in range(n_layers)]


# ----------------------------------------------------------------------------- KV caches


class KVCache:
    """Keys and values of ONE attention layer for every position so far: [B, G, S, D] each.

    ``append`` stores the new positions and returns the keys and values of all positions (what the
    new queries attend to); ``view`` returns them without appending.  The buffers grow by doubling,
    so appending one position costs O(1) amortised."""

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, dtype, capacity: int = 64):
        self.k = nn.zeros((batch, n_kv_heads, capacity, head_dim), dtype=dtype)
        self.v = nn.zeros((batch, n_kv_heads, capacity, head_dim), dtype=dtype)
        self.length = 0  # positions stored (= the cache index of the next position)

    @property
    def kept(self) -> int:
        """Positions held (all of them: this cache forgets nothing)."""
        return self.length

    def reserve(self, T: int) -> None:
        """Room for T more positions (the buffers doubled when full)."""
        n = self.length
        if n + T > self.k.shape[2]:
            capacity = max(2 * self.k.shape[2], n + T)
            self.k = _grown(self.k, n, capacity)
            self.v = _grown(self.v, n, capacity)

    def append(self, k_bgtd, v_bgtd):
        n, T = self.length, k_bgtd.shape[2]
        self.reserve(T)
        self.k[:, :, n : n + T] = k_bgtd
        self.v[:, :, n : n + T] = v_bgtd
        self.length = n + T
        return self.view()

    def view(self):
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


def _grown(buf_bgsd, used: int, capacity: int):
    grown = nn.module_of(buf_bgsd).zeros(buf_bgsd.shape[:2] + (capacity,) + buf_bgsd.shape[3:], dtype=buf_bgsd.dtype)
    grown[:, :, :used] = buf_bgsd[:, :, :used]
    return grown


class SlidingKVCache:
    """Keys and values of ONE attention layer for the last ``window - 1`` positions: with a sliding
    window of ``window`` (a query sees itself and the window - 1 positions before it), older keys
    can never be read again, so the state stays bounded however long the stream.

    ``append`` returns the kept keys followed by the new ones (what the new queries attend to), then
    forgets all but the last ``window - 1``; ``view`` returns the kept ones."""

    def __init__(self, window: int, batch: int, n_kv_heads: int, head_dim: int, dtype):
        self.window = window
        self.k = nn.zeros((batch, n_kv_heads, 0, head_dim), dtype=dtype)
        self.v = nn.zeros((batch, n_kv_heads, 0, head_dim), dtype=dtype)
        self.length = 0  # positions seen in total (the position of the next one)

    @property
    def kept(self) -> int:
        return self.k.shape[2]

    def append(self, k_bgtd, v_bgtd):
        k_bgsd = np.concatenate([self.k, k_bgtd], axis=2)
        v_bgsd = np.concatenate([self.v, v_bgtd], axis=2)
        keep = max(self.window - 1, 0)
        S = k_bgsd.shape[2]
        self.k, self.v = k_bgsd[:, :, S - min(keep, S) :], v_bgsd[:, :, S - min(keep, S) :]
        self.length += k_bgtd.shape[2]
        return k_bgsd, v_bgsd

    def view(self):
        return self.k, self.v


# ----------------------------------------------------------------------------- the layer


def norm(w: WeightView, kind: LayerKind, x_btc, eps: float):
    """RMSNorm (weight) or LayerNorm (weight, bias), over the channels."""
    if kind.norm == "rms":
        return nn.rms_norm(x_btc, w["weight"], eps)
    return nn.layer_norm(x_btc, w["weight"], w["bias"], eps)


def attention_block(
    a: WeightView,
    kind: LayerKind,
    cfg,
    x_btc,
    cos_btd,
    sin_btd,
    allowed,
    cache=None,
    eps: float = 0.0,
    record: Recorder = NULL_RECORDER,
):
    """Self-attention of one layer: [B, T, C] -> [B, T, C].

    ``cfg`` gives num_attention_heads (H), num_key_value_heads (G) and head_dim (D); ``cos_btd`` and
    ``sin_btd`` are the rotary tables of the new positions ([B or 1, T, D]); ``allowed`` says which keys
    each query sees (an ``nn.AttentionMask``; S = the cached positions followed by the new ones);
    ``eps`` is the q/k RMSNorm epsilon (Qwen3).  ``record`` receives each projection and norm it computes
    under its official module name (``q_proj`` [B, T, H*D], ``q_norm`` [B, T, H, D], ...); modules that
    compute nothing here (an Identity q_norm, a per-layer rotary module) are named by the porting layer
    (``refimpl.porting.names``)."""
    B, T, _ = x_btc.shape
    H, G, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_btc, k_btc, v_btc = nn.linears(
        x_btc,
        (a["q_proj.weight"], a["k_proj.weight"], a["v_proj.weight"]),
        (a.get("q_proj.bias"), a.get("k_proj.bias"), a.get("v_proj.bias")),
    )
    q_bthd = q_btc.reshape(B, T, H, D)
    record("q_proj", q_bthd.reshape(B, T, H * D))
    if kind.qk_norm:
        q_bthd = nn.rms_norm(q_bthd, a["q_norm.weight"], eps)
        record("q_norm", q_bthd)
    k_btgd = k_btc.reshape(B, T, G, D)
    record("k_proj", k_btgd.reshape(B, T, G * D))
    if kind.qk_norm:
        k_btgd = nn.rms_norm(k_btgd, a["k_norm.weight"], eps)
        record("k_norm", k_btgd)
    v_btgd = v_btc.reshape(B, T, G, D)
    record("v_proj", v_btgd.reshape(B, T, G * D))
    q_bhtd = nn.apply_rope(q_bthd.transpose(0, 2, 1, 3), cos_btd[:, None], sin_btd[:, None])
    k_bgtd = nn.apply_rope(k_btgd.transpose(0, 2, 1, 3), cos_btd[:, None], sin_btd[:, None])
    v_bgtd = v_btgd.transpose(0, 2, 1, 3)
    k_new_bgtd = k_bgtd
    if cache is not None:
        k_bgtd, v_bgtd = cache.append(k_bgtd, v_bgtd)
    record_attention_details(record, q_bhtd, k_bgtd, allowed, D**-0.5, k_new_bgtd)  # opt-in (large)
    out_bhtd = nn.attention(q_bhtd, k_bgtd, v_bgtd, allowed, scale=D**-0.5)
    out_btc = out_bhtd.transpose(0, 2, 1, 3).reshape(B, T, H * D)
    out_btc = nn.linear(out_btc, a["o_proj.weight"], a.get("o_proj.bias"))
    record("o_proj", out_btc)
    return out_btc


def swiglu_mlp(m: WeightView, x_btc, record: Recorder = NULL_RECORDER):
    """down_proj(silu(gate_proj(x)) * up_proj(x))."""
    gate, up = nn.linears(x_btc, (m["gate_proj.weight"], m["up_proj.weight"]))
    record("gate_proj", gate)
    gate = nn.silu(gate)
    record("act_fn", gate)
    record("up_proj", up)
    down = nn.linear(gate * up, m["down_proj.weight"])
    record("down_proj", down)
    return down


def gelu_mlp(m: WeightView, x_btc, record: Recorder = NULL_RECORDER):
    """fc2(gelu(fc1(x))), the exact (erf) GELU."""
    h = nn.linear(x_btc, m["fc1.weight"])
    record("fc1", h)
    h = nn.gelu_erf(h)
    record("activation_fn", h)
    out = nn.linear(h, m["fc2.weight"])
    record("fc2", out)
    return out


def transformer_layer(
    lw: WeightView,
    kind: LayerKind,
    cfg,
    x_btc,
    cos_btd,
    sin_btd,
    allowed,
    cache=None,
    eps: float = 1e-6,
    record: Recorder = NULL_RECORDER,
):
    """One pre-norm residual layer (the module docstring): [B, T, C] -> [B, T, C].  ``record`` receives
    every part under its official module name (``input_layernorm``, ``self_attn.q_proj``, ``mlp``, ...)."""
    h = norm(lw.sub("input_layernorm."), kind, x_btc, eps)
    record("input_layernorm", h)
    a = attention_block(
        lw.sub("self_attn."), kind, cfg, h, cos_btd, sin_btd, allowed, cache, eps, record.scope("self_attn.")
    )
    record("self_attn", a)
    if kind.layer_scale:
        a = lw["self_attn_layer_scale.scale"] * a
        record("self_attn_layer_scale", a)
    x_btc = x_btc + a
    h = norm(lw.sub("post_attention_layernorm."), kind, x_btc, eps)
    record("post_attention_layernorm", h)
    mlp = swiglu_mlp if kind.mlp == "swiglu" else gelu_mlp
    m = mlp(lw.sub("mlp."), h, record.scope("mlp."))
    record("mlp", m)
    if kind.layer_scale:
        m = lw["mlp_layer_scale.scale"] * m
        record("mlp_layer_scale", m)
    return x_btc + m


@primitive
def transformer_stack(
    layers: list,
    kind: LayerKind,
    cfg,
    x_btc,
    cos_btd,
    sin_btd,
    allowed,
    caches=None,
    eps: float = 1e-6,
    record: Recorder = NULL_RECORDER,
    last_only: bool = False,
):
    """Every layer in turn (no final norm: each stack has its own ending).  ``caches`` is None or one
    cache per layer.  Each layer's output is recorded as ``layers.{i}``, its parts as ``layers.{i}.mlp``...
    ``last_only``: return the last position's output alone [B, 1, C], for a caller that reads no other (a
    prompt whose next code only the last position decides): a fused twin then runs the last layer past its
    keys and values for that position alone.  A primitive: a backend may run a stack it can take in one
    call while nothing is recorded (numba: a generation step's Qwen3 layers, ``numba_cpu/transformer.py``)."""
    for i, lw in enumerate(layers):
        x_btc = transformer_layer(
            lw,
            kind,
            cfg,
            x_btc,
            cos_btd,
            sin_btd,
            allowed,
            None if caches is None else caches[i],
            eps,
            record.scope(f"layers.{i}."),
        )
        record(f"layers.{i}", x_btc)
    return x_btc[:, -1:] if last_only else x_btc
