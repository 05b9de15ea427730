"""The Talker: the language model that turns a prompt of (text + codec) embeddings into codec frames.

Shapes below are for the released 1.7B config (B batch, T positions, H talker width 2048):

    text ids  [B, T]  -> text_embedding [151936, 2048] -> text projection (linear, SiLU, linear) -> [B, T, H]
    codec ids [B, T]  -> codec_embedding [3072, H]                                             -> [B, T, H]
    prompt = text part + codec part (summed per position; see ``refimpl.prompt``)
    28 decoder layers (Qwen3 style), each:
        x = x + o_proj(attention(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))), v_proj(rms(x))))
        x = x + down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))            (SwiGLU)
    final RMSNorm -> hidden [B, T, H] -> codec_head -> logits over the 3072 talker ids
                                                       (2048 codes of group 0 + 1024 control ids)

Attention: 16 query heads share 8 key/value heads (grouped-query attention), head_dim 128 (not H / heads),
q and k are RMS-normalised *per head* (over head_dim) before the rotary embedding.

Rotary embedding: configured as multimodal RoPE ("mRoPE": ``rope_scaling = {mrope_section: [24, 20, 20],
interleaved: true}``).  mRoPE gives each token three position ids (temporal, height, width) and lets each
rotary frequency channel take its angle from one of the three.  In TTS all three ids are the same
number (the token's index in its sequence), so every channel gets ``position * inv_freq[j]`` whatever
stream it reads from: mRoPE is then exactly ordinary RoPE (``multimodal_rope_cos_sin`` below builds the
general tables; ``tests/test_talker.py`` checks the reduction).

The code predictor (the second, small transformer that fills in code groups 1..15 of each frame) lives
in ``refimpl.code_predictor``; its weights sit under ``code_predictor.`` in the same checkpoint.

Weights are a flat dict keyed by the checkpoint names with the ``talker.`` prefix removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import nn
from .checkpoint import CheckpointError, WeightSpec, attention_weight_spec
from .config import config_from_dict
from .validate import check_code_predictor_config, check_talker_config, check_tts_config

__all__ = [
    "TalkerConfig", "CodePredictorConfig", "TTSConfig", "talker_weight_spec", "decoder_layer_weight_spec",
    "multimodal_rope_cos_sin", "rope_cos_sin_bt", "KVCache", "decoder_stack", "Talker",
]


# ----------------------------------------------------------------------------- configs


@dataclass
class CodePredictorConfig:
    """``talker_config.code_predictor_config`` (official constructor defaults; the release differs)."""

    vocab_size: int = 2048
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int = 4096
    max_window_layers: int = 28
    layer_types: tuple | None = None
    num_code_groups: int = 32
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> "CodePredictorConfig":
        cfg = config_from_dict(cls, data)
        if cfg.num_key_value_heads is None:
            cfg.num_key_value_heads = cfg.num_attention_heads
        check_code_predictor_config(cfg)
        _check_common("code_predictor_config", cfg)
        if cfg.use_sliding_window:
            raise ValueError("code_predictor_config.use_sliding_window is not supported (no released model uses it)")
        if cfg.rope_scaling and cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type", "default")) != "default":
            raise ValueError("code_predictor_config.rope_scaling: only the default rope type is supported")
        return cfg


@dataclass
class TalkerConfig:
    """``talker_config`` of config.json (official constructor defaults; always read the checkpoint).

    ``head_dim`` and ``text_vocab_size`` are not constructor arguments of the official class, but the
    official model reads them from the config when present (``head_dim`` falls back to
    hidden / heads; ``text_vocab_size`` has no fallback)."""

    vocab_size: int = 3072
    hidden_size: int = 1024
    intermediate_size: int = 2048
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int = 4096
    num_code_groups: int = 32
    text_hidden_size: int = 2048
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: dict | None = None
    spk_is_dialect: dict | None = None
    codec_language_id: dict | None = None
    head_dim: int | None = None
    text_vocab_size: int | None = None
    code_predictor_config: CodePredictorConfig | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> "TalkerConfig":
        data = dict(data or {})
        predictor = data.pop("code_predictor_config", None)
        cfg = config_from_dict(cls, data)
        cfg.code_predictor_config = CodePredictorConfig.from_dict(predictor)
        check_talker_config(cfg)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        _check_common("talker_config", cfg)
        if cfg.text_vocab_size is None:
            raise CheckpointError("talker_config has no text_vocab_size (the official model needs it too)")
        if cfg.use_sliding_window:
            raise ValueError("talker_config.use_sliding_window is not supported (no released model uses it)")
        rs = cfg.rope_scaling
        if not isinstance(rs, dict) or "mrope_section" not in rs:
            raise CheckpointError("talker_config.rope_scaling must give mrope_section (and interleaved), "
                                  f"as the official attention reads them; got {rs!r}")
        if rs.get("rope_type", rs.get("type", "default")) != "default":
            raise ValueError("talker_config.rope_scaling: only rope_type 'default' is supported")
        if 2 * sum(rs["mrope_section"]) != cfg.head_dim:
            raise CheckpointError(f"talker_config.rope_scaling.mrope_section {rs['mrope_section']} must sum to "
                                  f"head_dim / 2 = {cfg.head_dim // 2}")
        cfg.spk_id = dict(cfg.spk_id or {})
        cfg.spk_is_dialect = dict(cfg.spk_is_dialect or {})
        cfg.codec_language_id = dict(cfg.codec_language_id or {})
        return cfg

    @property
    def mrope_section(self) -> tuple:
        return tuple(self.rope_scaling["mrope_section"])

    @property
    def mrope_interleaved(self) -> bool:
        return bool(self.rope_scaling.get("interleaved", False))


def _check_common(where: str, cfg) -> None:
    if cfg.hidden_act != "silu":
        raise ValueError(f"{where}.hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(f"{where}: num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                         f"num_key_value_heads {cfg.num_key_value_heads}")
    if cfg.head_dim % 2:
        raise ValueError(f"{where}: head_dim {cfg.head_dim} must be even for the rotary embedding")


@dataclass
class TTSConfig:
    """The top level of a Qwen3-TTS model's config.json."""

    talker_config: TalkerConfig | None = None
    speaker_encoder_config: dict | None = None
    tokenizer_type: str | None = None
    tts_model_size: str | None = None
    tts_model_type: str | None = None
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> "TTSConfig":
        data = dict(data or {})
        talker = data.pop("talker_config", None)
        cfg = config_from_dict(cls, data)
        cfg.talker_config = TalkerConfig.from_dict(talker)
        check_tts_config(cfg)
        cfg.speaker_encoder_config = dict(cfg.speaker_encoder_config or {})
        return cfg


# ----------------------------------------------------------------------------- weights


def decoder_layer_weight_spec(prefix: str, hidden: int, intermediate: int, n_heads: int, n_kv_heads: int,
                              head_dim: int, bias: bool) -> list:
    """One Qwen3 decoder layer: attention with per-head q/k RMSNorm, SwiGLU MLP, two RMSNorms."""
    p = prefix
    spec = [
        WeightSpec(f"{p}input_layernorm.weight", (hidden,), "norm"),
        *attention_weight_spec(f"{p}self_attn.", hidden, n_heads, n_kv_heads, head_dim, bias, out_init="linear*0.5"),
        WeightSpec(f"{p}self_attn.q_norm.weight", (head_dim,), "norm"),
        WeightSpec(f"{p}self_attn.k_norm.weight", (head_dim,), "norm"),
        WeightSpec(f"{p}post_attention_layernorm.weight", (hidden,), "norm"),
        WeightSpec(f"{p}mlp.gate_proj.weight", (intermediate, hidden)),
        WeightSpec(f"{p}mlp.up_proj.weight", (intermediate, hidden)),
        WeightSpec(f"{p}mlp.down_proj.weight", (hidden, intermediate), "linear*0.5"),
    ]
    return spec


def talker_weight_spec(cfg: TalkerConfig) -> list:
    """Every tensor under ``talker.`` (names without that prefix), code predictor included."""
    H, Ht = cfg.hidden_size, cfg.text_hidden_size
    spec = [
        WeightSpec("model.text_embedding.weight", (cfg.text_vocab_size, Ht), "embedding"),
        WeightSpec("model.codec_embedding.weight", (cfg.vocab_size, H), "embedding"),
        WeightSpec("text_projection.linear_fc1.weight", (Ht, Ht)),
        WeightSpec("text_projection.linear_fc1.bias", (Ht,), "bias"),
        WeightSpec("text_projection.linear_fc2.weight", (H, Ht)),
        WeightSpec("text_projection.linear_fc2.bias", (H,), "bias"),
    ]
    for i in range(cfg.num_hidden_layers):
        spec += decoder_layer_weight_spec(f"model.layers.{i}.", H, cfg.intermediate_size, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias)
    spec += [WeightSpec("model.norm.weight", (H,), "norm"),
             WeightSpec("codec_head.weight", (cfg.vocab_size, H))]
    from .code_predictor import code_predictor_weight_spec
    spec += [WeightSpec("code_predictor." + s.name, s.shape, s.init)
             for s in code_predictor_weight_spec(cfg.code_predictor_config, talker_hidden=H)]
    return spec


# ----------------------------------------------------------------------------- rotary embedding


def rope_cos_sin_bt(positions_bt, head_dim: int, theta: float, dtype=np.float32):
    """Ordinary RoPE tables for per-row positions: cos, sin [B, T, head_dim].

    angle[b, t, j] = positions[b, t] * inv_freq[j] (j < head_dim / 2), repeated for the two halves.
    In float32 mode the angle is a float32 product, like the official code."""
    inv_freq = nn.rope_inverse_frequencies(head_dim, theta, dtype)
    angles_btj = np.asarray(positions_bt).astype(dtype)[..., None] * inv_freq
    angles_btd = np.concatenate([angles_btj, angles_btj], axis=-1)
    return np.cos(angles_btd), np.sin(angles_btd)


def mrope_stream_of_channel(mrope_section, interleaved: bool, head_dim: int) -> np.ndarray:
    """Which position stream (0 temporal, 1 height, 2 width) each of the head_dim rotary channels reads.

    Interleaved (the released setting): on the first half, channel j reads stream 1 when j % 3 == 1 and
    j < 3 * section[1], stream 2 when j % 3 == 2 and j < 3 * section[2], else stream 0; the second half
    repeats the first.  Not interleaved: the channels are cut into consecutive blocks of sizes
    section + section, block i reading stream i % 3."""
    half = head_dim // 2
    if interleaved:
        j = np.arange(half)
        stream = np.zeros(half, dtype=np.int64)
        for s in (1, 2):
            stream[(j % 3 == s) & (j < 3 * mrope_section[s])] = s
        return np.concatenate([stream, stream])
    sizes = list(mrope_section) * 2
    return np.concatenate([np.full(n, i % 3, dtype=np.int64) for i, n in enumerate(sizes)])


def multimodal_rope_cos_sin(positions_3bt, head_dim: int, theta: float, mrope_section, interleaved: bool,
                            dtype=np.float32):
    """mRoPE tables cos, sin [B, T, head_dim] from three position streams [3, B, T].

    Each stream gives a full ordinary table; channel c then takes its value from stream
    ``mrope_stream_of_channel(...)[c]``.  With the three streams equal (TTS), all three tables are the
    same, so the result is the ordinary ``rope_cos_sin_bt`` of that stream."""
    positions_3bt = np.asarray(positions_3bt)
    cos_3btd, sin_3btd = rope_cos_sin_bt(positions_3bt, head_dim, theta, dtype)
    stream_d = mrope_stream_of_channel(mrope_section, interleaved, head_dim)
    channel_d = np.arange(head_dim)
    return cos_3btd[stream_d, ..., channel_d].transpose(1, 2, 0), sin_3btd[stream_d, ..., channel_d].transpose(1, 2, 0)


# ----------------------------------------------------------------------------- KV cache and decoder


class KVCache:
    """Keys and values of every layer for positions already processed: [B, G, S, head_dim] each.

    Buffers grow by doubling, so appending one position is O(1) amortised; ``length`` is the number of
    cached positions (the cache index of the next token)."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, dtype, capacity: int = 64):
        self.k = [np.zeros((batch, n_kv_heads, capacity, head_dim), dtype=dtype) for _ in range(n_layers)]
        self.v = [np.zeros((batch, n_kv_heads, capacity, head_dim), dtype=dtype) for _ in range(n_layers)]
        self.lengths = [0] * n_layers

    @property
    def length(self) -> int:
        return self.lengths[0]

    def append(self, layer: int, k_bgtd, v_bgtd):
        """Store new keys/values of ``layer``; return all cached keys and values of that layer."""
        n, T = self.lengths[layer], k_bgtd.shape[2]
        if n + T > self.k[layer].shape[2]:
            capacity = max(2 * self.k[layer].shape[2], n + T)
            for buf in (self.k, self.v):
                grown = np.zeros(buf[layer].shape[:2] + (capacity,) + buf[layer].shape[3:], dtype=buf[layer].dtype)
                grown[:, :, :n] = buf[layer][:, :, :n]
                buf[layer] = grown
        self.k[layer][:, :, n:n + T] = k_bgtd
        self.v[layer][:, :, n:n + T] = v_bgtd
        self.lengths[layer] = n + T
        return self.k[layer][:, :, :n + T], self.v[layer][:, :, :n + T]


def attention_block(w: dict, p: str, x_btc, cos_btd, sin_btd, allowed_b1ts, cache: KVCache | None, layer: int,
                    n_heads: int, n_kv_heads: int, head_dim: int, eps: float):
    """Self-attention of one layer: projections, per-head q/k RMSNorm, RoPE, GQA attention, output."""
    B, T, _ = x_btc.shape
    bias = lambda n: w.get(f"{p}self_attn.{n}_proj.bias")  # noqa: E731
    q_bthd = nn.linear(x_btc, w[f"{p}self_attn.q_proj.weight"], bias("q")).reshape(B, T, n_heads, head_dim)
    k_btgd = nn.linear(x_btc, w[f"{p}self_attn.k_proj.weight"], bias("k")).reshape(B, T, n_kv_heads, head_dim)
    v_btgd = nn.linear(x_btc, w[f"{p}self_attn.v_proj.weight"], bias("v")).reshape(B, T, n_kv_heads, head_dim)
    q_bhtd = nn.rms_norm(q_bthd, w[f"{p}self_attn.q_norm.weight"], eps).transpose(0, 2, 1, 3)
    k_bgtd = nn.rms_norm(k_btgd, w[f"{p}self_attn.k_norm.weight"], eps).transpose(0, 2, 1, 3)
    v_bgtd = v_btgd.transpose(0, 2, 1, 3)
    q_bhtd = nn.apply_rope(q_bhtd, cos_btd[:, None], sin_btd[:, None])
    k_bgtd = nn.apply_rope(k_bgtd, cos_btd[:, None], sin_btd[:, None])
    if cache is not None:
        k_bgtd, v_bgtd = cache.append(layer, k_bgtd, v_bgtd)
    out_bhtd = nn.attention(q_bhtd, k_bgtd, v_bgtd, allowed_b1ts, scale=head_dim ** -0.5)
    out_btc = out_bhtd.transpose(0, 2, 1, 3).reshape(B, T, n_heads * head_dim)
    return nn.linear(out_btc, w[f"{p}self_attn.o_proj.weight"], bias("o"))


def swiglu_mlp(w: dict, p: str, x_btc):
    """down_proj(silu(gate_proj(x)) * up_proj(x))."""
    gate = nn.silu(nn.linear(x_btc, w[f"{p}mlp.gate_proj.weight"]))
    up = nn.linear(x_btc, w[f"{p}mlp.up_proj.weight"])
    return nn.linear(gate * up, w[f"{p}mlp.down_proj.weight"])


def decoder_stack(w: dict, prefix: str, cfg, x_btc, cos_btd, sin_btd, allowed_b1ts, cache: KVCache | None,
                  trace: dict | None = None):
    """All decoder layers (pre-norm residual blocks) and the final RMSNorm: [B, T, C] -> [B, T, C].
    ``cfg`` is a TalkerConfig or CodePredictorConfig; ``prefix`` is ``"model."`` for both networks."""
    h = x_btc
    for i in range(cfg.num_hidden_layers):
        p = f"{prefix}layers.{i}."
        a = attention_block(w, p, nn.rms_norm(h, w[f"{p}input_layernorm.weight"], cfg.rms_norm_eps),
                            cos_btd, sin_btd, allowed_b1ts, cache, i, cfg.num_attention_heads,
                            cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
        h = h + a
        h = h + swiglu_mlp(w, p, nn.rms_norm(h, w[f"{p}post_attention_layernorm.weight"], cfg.rms_norm_eps))
        if trace is not None:
            trace[f"layer.{i}"] = h
    return nn.rms_norm(h, w[f"{prefix}norm.weight"], cfg.rms_norm_eps)


# ----------------------------------------------------------------------------- the talker


class Talker:
    """The talker network (weights + config).  ``dtype`` is the compute dtype (float32 or float64).

    The code predictor is ``self.code_predictor`` (a ``refimpl.code_predictor.CodePredictor``)."""

    def __init__(self, cfg: TalkerConfig, weights: dict, dtype=np.float32):
        from .checkpoint import check_weights
        from .code_predictor import CodePredictor

        check_weights(weights, talker_weight_spec(cfg), "talker")
        self.cfg = cfg
        self.dtype = np.dtype(dtype).type
        self.w = {k: v.astype(self.dtype, copy=False) for k, v in weights.items()}
        prefix = "code_predictor."
        self.code_predictor = CodePredictor(
            cfg.code_predictor_config, {k[len(prefix):]: v for k, v in self.w.items() if k.startswith(prefix)},
            talker_hidden=cfg.hidden_size, dtype=self.dtype)

    # ---- embeddings

    def embed_text(self, text_ids):
        """Text ids [...] -> talker-width vectors [..., H]: text_embedding, then linear -> SiLU -> linear."""
        w = self.w
        ids = np.asarray(text_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.text_vocab_size):
            raise ValueError(f"text id out of range [0, {self.cfg.text_vocab_size}): {ids.min()}..{ids.max()}")
        e = w["model.text_embedding.weight"][ids]
        h = nn.silu(nn.linear(e, w["text_projection.linear_fc1.weight"], w["text_projection.linear_fc1.bias"]))
        return nn.linear(h, w["text_projection.linear_fc2.weight"], w["text_projection.linear_fc2.bias"])

    def embed_codec(self, codec_ids):
        """Talker codec ids (group-0 codes and control ids) [...] -> [..., H]."""
        ids = np.asarray(codec_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"codec id out of range [0, {self.cfg.vocab_size}): {ids.min()}..{ids.max()}")
        return self.w["model.codec_embedding.weight"][ids]

    def embed_frames(self, codes_n16):
        """Whole frames [..., 16] -> the sum of their 16 embeddings [..., H]: group 0 through the talker's
        codec_embedding, groups 1..15 through the code predictor's 15 embeddings (talker width)."""
        codes = np.asarray(codes_n16, dtype=np.int64)
        total = self.embed_codec(codes[..., 0])
        for g in range(1, codes.shape[-1]):
            total = total + self.code_predictor.embed(g, codes[..., g])
        return total

    # ---- the network

    def new_cache(self, batch: int) -> KVCache:
        c = self.cfg
        return KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, self.dtype)

    def forward(self, embeds_btc, positions_bt, key_valid_bs, cache: KVCache, trace: dict | None = None):
        """Run new positions through the talker, appending to ``cache``.

        embeds_btc    [B, T, H]  input vectors of the new positions
        positions_bt  [B, T]     their rotary positions (the same number for the three mRoPE streams)
        key_valid_bs  [B, S]     False for left-padding; S = cache.length + T (all positions so far)
        returns the final-norm hidden states [B, T, H]; ``logits`` maps them to talker ids."""
        c = self.cfg
        x = np.asarray(embeds_btc, dtype=self.dtype)
        B, T, _ = x.shape
        positions_bt = np.asarray(positions_bt)
        cos, sin = multimodal_rope_cos_sin(np.broadcast_to(positions_bt, (3,) + positions_bt.shape), c.head_dim,
                                           c.rope_theta, c.mrope_section, c.mrope_interleaved, self.dtype)
        start = cache.length
        S = start + T
        key_valid_bs = np.asarray(key_valid_bs, dtype=bool)
        if key_valid_bs.shape != (B, S):
            raise ValueError(f"key_valid must be [B, cache length + T] = {(B, S)}, got {key_valid_bs.shape}")
        causal_ts = nn.causal_window_mask(np.arange(start, S), np.arange(S))
        allowed_b1ts = causal_ts[None, None] & key_valid_bs[:, None, None, :]
        return decoder_stack(self.w, "model.", c, x, cos, sin, allowed_b1ts, cache, trace)

    def logits(self, hidden_btc):
        """codec_head: [..., H] -> [..., vocab_size]."""
        return nn.linear(hidden_btc, self.w["codec_head.weight"])
