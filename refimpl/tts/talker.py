"""The Talker: the language model that turns a prompt of (text + codec) embeddings into codec frames.

Shapes below are for the released 1.7B config (B batch, T positions, C talker width 2048):

    text ids  [B, T]  -> text_embedding [151936, 2048] -> text projection (linear, SiLU, linear) -> [B, T, C]
    codec ids [B, T]  -> codec_embedding [3072, C]                                             -> [B, T, C]
    prompt = text part + codec part (summed per position; see ``refimpl.tts.prompt``)
    28 decoder layers (Qwen3 style), each:
        x = x + o_proj(attention(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))), v_proj(rms(x))))
        x = x + down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))            (SwiGLU)
    final RMSNorm -> hidden [B, T, C] -> codec_head -> logits over the 3072 talker ids
                                                       (2048 codes of group 0 + 1024 control ids)

Attention: 16 query heads share 8 key/value heads (grouped-query attention), head_dim 128 (not C / heads),
q and k are RMS-normalised *per head* (over head_dim) before the rotary embedding.

Rotary embedding: configured as multimodal RoPE ("mRoPE": ``rope_scaling = {mrope_section: [24, 20, 20],
interleaved: true}``).  mRoPE gives each token three position ids (temporal, height, width) and lets each
rotary frequency channel take its angle from one of the three.  In TTS all three ids are the same
number (the token's index in its sequence), so every channel gets ``position * inv_freq[j]`` whatever
stream it reads from: mRoPE is then exactly ordinary RoPE (``multimodal_rope_cos_sin`` below builds the
general tables; ``tests/tts/test_talker.py`` checks the reduction).

The code predictor (the second, small transformer that fills in code groups 1..15 of each frame) lives
in ``refimpl.tts.code_predictor``; its weights sit under ``code_predictor.`` in the same checkpoint.

Weights are a flat dict keyed by the checkpoint names with the ``talker.`` prefix removed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .. import backends, nn
from ..backends import device_backend
from ..backends.bf16 import upload_weights
from ..io.checkpoint import CheckpointError, WeightSpec, WeightView, check_weights
from ..io.config import config_from_dict
from ..io.validate import check_talker_config
from ..recorder import as_recorder, record_rope_and_mask
from ..transformer import (
    QWEN3,
    KVCache,
    check_attention_config,
    layer_views,
    qwen3_layer_weight_spec,
    transformer_stack,
)
from .code_predictor import CodePredictor, CodePredictorConfig, code_predictor_weight_spec

__all__ = ["TalkerConfig", "talker_weight_spec", "mrope_stream_of_channel", "multimodal_rope_cos_sin", "Talker"]


# ----------------------------------------------------------------------------- configs


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
    def from_dict(cls, data) -> TalkerConfig:
        data = dict(data or {})
        predictor = data.pop("code_predictor_config", None)
        cfg = config_from_dict(cls, data)
        cfg.code_predictor_config = CodePredictorConfig.from_dict(predictor)
        check_talker_config(cfg)
        if cfg.head_dim is None:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        check_attention_config("talker_config", cfg)
        if cfg.text_vocab_size is None:
            raise CheckpointError("talker_config has no text_vocab_size (the official model needs it too)")
        if cfg.use_sliding_window:
            raise ValueError("talker_config.use_sliding_window is not supported (no released model uses it)")
        rs = cfg.rope_scaling
        if not isinstance(rs, dict) or "mrope_section" not in rs:
            raise CheckpointError(
                "talker_config.rope_scaling must give mrope_section (and interleaved), "
                f"as the official attention reads them; got {rs!r}"
            )
        if rs.get("rope_type", rs.get("type", "default")) != "default":
            raise ValueError("talker_config.rope_scaling: only rope_type 'default' is supported")
        if 2 * sum(rs["mrope_section"]) != cfg.head_dim:
            raise CheckpointError(
                f"talker_config.rope_scaling.mrope_section {rs['mrope_section']} must sum to "
                f"head_dim / 2 = {cfg.head_dim // 2}"
            )
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


# ----------------------------------------------------------------------------- weights


def talker_weight_spec(cfg: TalkerConfig) -> list:
    """Every tensor under ``talker.`` (names without that prefix), code predictor included."""
    C, Ct = cfg.hidden_size, cfg.text_hidden_size
    spec = [
        WeightSpec("model.text_embedding.weight", (cfg.text_vocab_size, Ct), "embedding"),
        WeightSpec("model.codec_embedding.weight", (cfg.vocab_size, C), "embedding"),
        WeightSpec("text_projection.linear_fc1.weight", (Ct, Ct)),
        WeightSpec("text_projection.linear_fc1.bias", (Ct,), "bias"),
        WeightSpec("text_projection.linear_fc2.weight", (C, Ct)),
        WeightSpec("text_projection.linear_fc2.bias", (C,), "bias"),
    ]
    for i in range(cfg.num_hidden_layers):
        spec += qwen3_layer_weight_spec(
            f"model.layers.{i}.",
            C,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.attention_bias,
        )
    spec += [WeightSpec("model.norm.weight", (C,), "norm"), WeightSpec("codec_head.weight", (cfg.vocab_size, C))]
    spec += [
        WeightSpec("code_predictor." + s.name, s.shape, s.init)
        for s in code_predictor_weight_spec(cfg.code_predictor_config, talker_hidden=C)
    ]
    return spec


# ----------------------------------------------------------------------------- rotary embedding


def mrope_stream_of_channel(mrope_section, interleaved: bool, head_dim: int) -> np.ndarray:
    """Which position stream (0 temporal, 1 height, 2 width) each of the head_dim rotary channels reads.

    Interleaved (the released setting): on the first half, channel j reads stream 1 when j % 3 == 1 and
    j < 3 * section[1], stream 2 when j % 3 == 2 and j < 3 * section[2], else stream 0; the second half
    repeats the first.  Not interleaved: the channels are cut into consecutive blocks of sizes
    section + section, block i reading stream i % 3.  (A host table: a constant of the config.)"""
    half = head_dim // 2
    if interleaved:
        j = np.arange(half)
        stream = np.zeros(half, dtype=np.int64)
        for s in (1, 2):
            stream[(j % 3 == s) & (j < 3 * mrope_section[s])] = s
        return np.concatenate([stream, stream])
    sizes = list(mrope_section) * 2
    return np.concatenate([np.full(n, i % 3, dtype=np.int64) for i, n in enumerate(sizes)])


@functools.cache
def _uploaded_streams(mrope_section: tuple, interleaved: bool, head_dim: int, backend: str):
    """``mrope_stream_of_channel`` uploaded once per device backend (a constant of the config)."""
    return nn.to_device(mrope_stream_of_channel(mrope_section, interleaved, head_dim))


def multimodal_rope_cos_sin(
    positions_3bt, head_dim: int, theta: float, mrope_section, interleaved: bool, dtype=np.float32
):
    """mRoPE tables cos, sin [B, T, head_dim] from three position streams [3, B, T].

    Each stream gives a full ordinary table; channel c then takes its value from stream
    ``mrope_stream_of_channel(...)[c]``.  With the three streams equal (TTS), all three tables are the
    same, so the result is the ordinary ``nn.rope_cos_sin`` of that stream."""
    cos_3btd, sin_3btd = nn.rope_cos_sin(nn.as_array(positions_3bt), head_dim, theta, dtype)
    stream_d = mrope_stream_of_channel(mrope_section, interleaved, head_dim)
    if not isinstance(cos_3btd, np.ndarray):  # positions on a device: index there
        stream_d = _uploaded_streams(tuple(mrope_section), interleaved, head_dim, backends.device_backend())
    channel_d = nn.module_of(cos_3btd).arange(head_dim)
    return cos_3btd[stream_d, ..., channel_d].transpose(1, 2, 0), sin_3btd[stream_d, ..., channel_d].transpose(1, 2, 0)


# ----------------------------------------------------------------------------- the talker


class Talker:
    """The talker network (weights + config).  ``dtype`` is the compute dtype (float32 or float64).

    The code predictor is ``self.code_predictor`` (a ``refimpl.tts.code_predictor.CodePredictor``).
    Built under a device backend, the weights are uploaded once (``backend`` names it); ids come in
    as host arrays and are uploaded where they index a table."""

    def __init__(self, cfg: TalkerConfig, weights: dict, dtype=np.float32):
        check_weights(weights, talker_weight_spec(cfg), "talker")
        self.cfg = cfg
        self.dtype = np.dtype(dtype).type
        self.backend = device_backend()
        self.weights = upload_weights({k: v.astype(self.dtype, copy=False) for k, v in weights.items()})
        self.w = WeightView(self.weights)
        self.layers = layer_views(self.weights, "model.layers.", cfg.num_hidden_layers)
        prefix = "code_predictor."
        self.code_predictor = CodePredictor(
            cfg.code_predictor_config,
            {k[len(prefix) :]: v for k, v in self.weights.items() if k.startswith(prefix)},
            talker_hidden=cfg.hidden_size,
            dtype=self.dtype,
        )

    # ---- embeddings

    def embed_text(self, text_ids):
        """Text ids [...] -> talker-width vectors [..., C]: text_embedding, then linear -> SiLU -> linear."""
        w = self.w
        ids = np.asarray(text_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.text_vocab_size):
            raise ValueError(f"text id out of range [0, {self.cfg.text_vocab_size}): {ids.min()}..{ids.max()}")
        e = w["model.text_embedding.weight"][nn.to_device(ids)]
        h = nn.silu(nn.linear(e, w["text_projection.linear_fc1.weight"], w["text_projection.linear_fc1.bias"]))
        return nn.linear(h, w["text_projection.linear_fc2.weight"], w["text_projection.linear_fc2.bias"])

    def embed_codec(self, codec_ids, on_backend=None):
        """Talker codec ids (group-0 codes and control ids) [...] -> [..., C].  ``on_backend``: the same ids
        already uploaded (checked here on the host all the same)."""
        ids = np.asarray(codec_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"codec id out of range [0, {self.cfg.vocab_size}): {ids.min()}..{ids.max()}")
        return self.w["model.codec_embedding.weight"][nn.to_device(ids) if on_backend is None else on_backend]

    def embed_frames(self, codes_n16):
        """Whole frames [..., 16] -> the sum of their 16 embeddings [..., C]: group 0 through the talker's
        codec_embedding, groups 1..15 through the code predictor's 15 embeddings (talker width)."""
        codes = np.asarray(codes_n16, dtype=np.int64)
        uploaded = nn.to_device(codes)  # once for the 16 lookups
        total = self.embed_codec(codes[..., 0], uploaded[..., 0])
        for g in range(1, codes.shape[-1]):
            total = total + self.code_predictor.embed(g, codes[..., g], uploaded[..., g])
        return total

    # ---- the network

    def new_caches(self, batch: int) -> list:
        """One empty KV cache per layer."""
        c = self.cfg
        return [KVCache(batch, c.num_key_value_heads, c.head_dim, self.dtype) for _ in range(c.num_hidden_layers)]

    def forward(self, embeds_btc, positions_bt, key_valid_bs, caches: list, trace=None, last_only: bool = False):
        """Run new positions through the talker, appending to the per-layer ``caches``.

        embeds_btc    [B, T, C]  input vectors of the new positions
        positions_bt  [B, T]     their rotary positions (the same number for the three mRoPE streams)
        key_valid_bs  [B, S]     False for left-padding; S = caches[0].length + T (all positions so far)
        returns the final-norm hidden states [B, T, C] ([B, 1, C] at the last position with ``last_only``,
        every position still cached); ``logits`` maps them to talker ids.
        ``trace`` (dict or Recorder) receives each layer's output as ``layers.{i}`` and its parts."""
        c = self.cfg
        x = nn.to_device(embeds_btc).astype(self.dtype, copy=False)
        B, T, _ = x.shape
        positions_bt = nn.to_device(positions_bt)
        cos_btd, sin_btd = multimodal_rope_cos_sin(
            np.broadcast_to(positions_bt, (3,) + positions_bt.shape),
            c.head_dim,
            c.rope_theta,
            c.mrope_section,
            c.mrope_interleaved,
            self.dtype,
        )
        start = caches[0].length
        S = start + T
        key_valid_bs = np.asarray(key_valid_bs, dtype=bool)
        if key_valid_bs.shape != (B, S):
            raise ValueError(f"key_valid must be [B, cache length + T] = {(B, S)}, got {key_valid_bs.shape}")
        # causal over cache indices (not rotary positions, which restart after left padding); padding unseen.
        # Without padding (every key valid: one prompt, or prompts of one length) there is no key_valid to
        # upload per step nor to test per key: the same visible keys.
        unpadded = bool(key_valid_bs.all())
        key_valid = None if unpadded else nn.to_device(key_valid_bs)
        mask = nn.AttentionMask(nn.arange(start, S), nn.arange(S), key_valid_bs=key_valid)
        record = as_recorder(trace)
        record_rope_and_mask(record, cos_btd, sin_btd, mask, mrope=True, per_row=True)
        h = transformer_stack(
            self.layers, QWEN3, c, x, cos_btd, sin_btd, mask, caches, c.rms_norm_eps, record, last_only
        )
        h = nn.rms_norm(h, self.w["model.norm.weight"], c.rms_norm_eps)
        record("norm", h)
        return h

    def logits(self, hidden_btc):
        """codec_head: [..., C] -> [..., vocab_size]."""
        return nn.linear(hidden_btc, self.w["codec_head.weight"])
