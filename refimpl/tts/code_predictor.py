"""The code predictor ("sub-talker"): fills in code groups 1..15 of a frame once the talker chose group 0.

Per frame, for every batch row (released sizes: talker width 2048 on 1.7B, predictor width 1024):

    position 0: the talker's final hidden state of the step that produced code 0     [B, 2048]
    position 1: the talker's codec_embedding of code 0                                [B, 2048]
    -> small_to_mtp_projection (linear 2048 -> 1024, with bias; absent when the widths agree)
    -> 5 Qwen3 decoder layers (own RoPE theta, plain 1-D RoPE at positions 0, 1, ...) -> final RMSNorm
    -> lm_head[0] on the last position -> logits of code 1 -> choose code 1
    then for g = 1..14: embed code g with codec_embedding[g-1] (talker width), project, one more
    decoder step (position g + 1, KV cache), lm_head[g] -> choose code g + 1.

The KV cache starts empty for every frame: the predictor only ever sees one frame.

Weights are a flat dict keyed by the checkpoint names with the ``talker.code_predictor.`` prefix removed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import backends, nn
from ..backends.bf16 import mark_read_packed, upload_weights
from ..io.checkpoint import WeightSpec, WeightView, check_weights
from ..io.config import config_from_dict
from ..io.validate import check_code_predictor_config
from ..recorder import NULL_RECORDER, Recorder, record_rope_and_mask
from ..transformer import (
    QWEN3,
    KVCache,
    check_attention_config,
    layer_views,
    qwen3_layer_weight_spec,
    transformer_stack,
)

__all__ = ["CodePredictorConfig", "code_predictor_weight_spec", "CodePredictor"]


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
    def from_dict(cls, data) -> CodePredictorConfig:
        cfg = config_from_dict(cls, data)
        if cfg.num_key_value_heads is None:
            cfg.num_key_value_heads = cfg.num_attention_heads
        check_code_predictor_config(cfg)
        check_attention_config("code_predictor_config", cfg)
        if cfg.use_sliding_window:
            raise ValueError("code_predictor_config.use_sliding_window is not supported (no released model uses it)")
        if cfg.rope_scaling and cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type", "default")) != "default":
            raise ValueError("code_predictor_config.rope_scaling: only the default rope type is supported")
        return cfg


def code_predictor_weight_spec(cfg: CodePredictorConfig, talker_hidden: int) -> list:
    """Every tensor of the code predictor (names without ``talker.code_predictor.``)."""
    C = cfg.hidden_size
    n_groups = cfg.num_code_groups - 1
    spec = []
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
    spec.append(WeightSpec("model.norm.weight", (C,), "norm"))
    spec += [
        WeightSpec(f"model.codec_embedding.{g}.weight", (cfg.vocab_size, talker_hidden), "embedding")
        for g in range(n_groups)
    ]
    spec += [WeightSpec(f"lm_head.{g}.weight", (cfg.vocab_size, C)) for g in range(n_groups)]
    if talker_hidden != C:
        spec += [
            WeightSpec("small_to_mtp_projection.weight", (C, talker_hidden)),
            WeightSpec("small_to_mtp_projection.bias", (C,), "bias"),
        ]
    return spec


def read_packed_weight_names(cfg: CodePredictorConfig, talker_hidden: int) -> list:
    """The matrices read whole at every step of a frame and in no prompt: the layers' products and the heads
    (``bf16.BF16Matrix.read_packed``: the numba backend reads them packed, 12 bits a word)."""
    names = [s.name for s in code_predictor_weight_spec(cfg, talker_hidden)]
    layers = [n for n in names if n.startswith("model.layers.") and n.endswith("_proj.weight")]
    return layers + [n for n in names if n.startswith("lm_head.")]


class CodePredictor:
    """The code predictor network (weights + config); ``dtype`` is the compute dtype."""

    def __init__(self, cfg: CodePredictorConfig, weights: dict, talker_hidden: int, dtype=np.float32):
        check_weights(weights, code_predictor_weight_spec(cfg, talker_hidden), "talker.code_predictor")
        self.cfg = cfg
        self.talker_hidden = talker_hidden
        self.dtype = np.dtype(dtype).type
        weights = upload_weights({k: v.astype(self.dtype, copy=False) for k, v in weights.items()})
        self.weights = mark_read_packed(weights, read_packed_weight_names(cfg, talker_hidden))
        self.w = WeightView(self.weights)
        self.layers = layer_views(self.weights, "model.layers.", cfg.num_hidden_layers)
        self.n_groups = cfg.num_code_groups - 1  # codes 1..15 of a frame
        self._positions: dict = {}  # (start, T, device backend) -> cos, sin, mask (``positions``)

    def embed(self, group: int, ids, on_backend=None):
        """Embedding of code group ``group`` (1..15) at talker width: codec_embedding[group - 1].
        ``on_backend``: the same ids already uploaded (checked here on the host all the same)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"code of group {group} out of range [0, {self.cfg.vocab_size}): {ids.min()}..{ids.max()}")
        table = self.w[f"model.codec_embedding.{group - 1}.weight"]
        return table[nn.to_device(ids) if on_backend is None else on_backend]

    def project(self, x_btc, record: Recorder = NULL_RECORDER):
        """small_to_mtp_projection (talker width -> predictor width), the identity when they agree."""
        if "small_to_mtp_projection.weight" in self.w:
            x_btc = nn.linear(x_btc, self.w["small_to_mtp_projection.weight"], self.w["small_to_mtp_projection.bias"])
        record("small_to_mtp_projection", x_btc)
        return x_btc

    def new_caches(self, batch: int) -> list:
        """One empty KV cache per layer, sized for one frame (the predictor never sees more)."""
        c = self.cfg
        return [
            KVCache(batch, c.num_key_value_heads, c.head_dim, self.dtype, capacity=self.n_groups + 1)
            for _ in range(c.num_hidden_layers)
        ]

    def positions(self, start: int, T: int) -> tuple:
        """The rotary tables (cos, sin [T, head_dim]) and the causal mask of positions start .. start + T - 1,
        made once per model and backend: a frame's steps see the same 17 positions every frame (made anew,
        a step's five small NumPy calls and two positions arrays, 70 us with the caches cold after the
        layers' weights, a tenth of its work around them)."""
        key = (start, T, backends.device_backend())
        if key not in self._positions:
            c = self.cfg
            positions_t = nn.arange(start, start + T)
            cos_td, sin_td = nn.rope_cos_sin(positions_t, c.head_dim, c.rope_theta, self.dtype)
            mask = nn.AttentionMask(positions_t, nn.arange(start + T))
            for table in (cos_td, sin_td, mask.query_positions_t, mask.key_positions_s):  # shared by every frame:
                if isinstance(table, np.ndarray):  # host arrays read-only
                    table.flags.writeable = False
            self._positions[key] = (cos_td, sin_td, mask)
        return self._positions[key]

    def step(self, x_btc, caches: list, record: Recorder = NULL_RECORDER, last_only: bool = False):
        """Decoder pass over new positions (caches[0].length, ...): [B, T, talker width] -> hidden [B, T, C]
        ([B, 1, C], the last position's, with ``last_only``: every position's keys and values are cached all
        the same).  ``record`` (scoped to the code predictor) receives its modules' outputs under the
        official names."""
        c = self.cfg
        B, T, _ = x_btc.shape
        cos_td, sin_td, mask = self.positions(caches[0].length, T)
        x_btc = self.project(x_btc, record)
        model_record = record.scope("model.")
        cos_btd, sin_btd, eps = cos_td[None], sin_td[None], c.rms_norm_eps
        record_rope_and_mask(model_record, cos_btd, sin_btd, mask)
        h = transformer_stack(
            self.layers, QWEN3, c, x_btc, cos_btd, sin_btd, mask, caches, eps, model_record, last_only
        )
        h = nn.rms_norm(h, self.w["model.norm.weight"], eps)
        model_record("norm", h)
        model_record.output(h)
        return h

    def head(self, g: int, hidden_bc):
        """lm_head[g]: logits of code group g + 1."""
        return nn.linear(hidden_bc, self.w[f"lm_head.{g}.weight"])

    def predict_frame(
        self,
        talker_hidden_bc,
        code0_emb_bc,
        choose: Callable,
        n_groups: int | None = None,
        record: Recorder = NULL_RECORDER,
    ):
        """Codes 1..n_groups of one frame for every row.

        talker_hidden_bc  [B, H]  the talker's hidden state of the step that produced code 0
        code0_emb_bc      [B, H]  the talker's codec embedding of code 0
        choose(g, logits_bv) -> ids_b  picks code g + 1 from the logits of head g (see ``refimpl.sampling``);
                                       the ids are host int64 (the codes are chosen on the host)
        returns codes [B, n_groups] (int64) and the logits they were chosen from [B, n_groups, V].
        ``record`` (scoped to the code predictor, ``talker.code_predictor.``) receives every module output;
        the heads are traced over all new positions, as the official model computes them.  Unrecorded, a
        step's last layer runs past its keys and values for the last position alone (the first step has two:
        the next code reads the code-0 embedding's)."""
        n_groups = self.n_groups if n_groups is None else n_groups
        B = talker_hidden_bc.shape[0]
        caches = self.new_caches(B)
        x = np.stack([talker_hidden_bc, code0_emb_bc], axis=1).astype(self.dtype)  # [B, 2, H]
        codes = np.zeros((B, n_groups), dtype=np.int64)
        logits_qbv = []
        for g in range(n_groups):
            h_btc = self.step(x, caches, record, last_only=not record.enabled)
            logits_qbv.append(self.head(g, h_btc[:, -1]))  # the next code reads the last position's alone
            record.output(record.lazy(f"lm_head.{g}", self.head, g, h_btc))  # the official: every position's
            codes[:, g] = choose(g, logits_qbv[-1])
            if g + 1 < n_groups:
                x = self.embed(g + 1, codes[:, g])[:, None]
        return codes, np.stack(logits_qbv, axis=1)
