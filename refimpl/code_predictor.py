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

from typing import Callable

import numpy as np

from . import nn
from .checkpoint import WeightSpec, check_weights
from .talker import CodePredictorConfig, KVCache, decoder_layer_weight_spec, decoder_stack, rope_cos_sin_bt

__all__ = ["code_predictor_weight_spec", "CodePredictor"]


def code_predictor_weight_spec(cfg: CodePredictorConfig, talker_hidden: int) -> list:
    """Every tensor of the code predictor (names without ``talker.code_predictor.``)."""
    C = cfg.hidden_size
    n_groups = cfg.num_code_groups - 1
    spec = []
    for i in range(cfg.num_hidden_layers):
        spec += decoder_layer_weight_spec(f"model.layers.{i}.", C, cfg.intermediate_size, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias)
    spec.append(WeightSpec("model.norm.weight", (C,), "norm"))
    spec += [WeightSpec(f"model.codec_embedding.{g}.weight", (cfg.vocab_size, talker_hidden), "embedding")
             for g in range(n_groups)]
    spec += [WeightSpec(f"lm_head.{g}.weight", (cfg.vocab_size, C)) for g in range(n_groups)]
    if C != talker_hidden:
        spec += [WeightSpec("small_to_mtp_projection.weight", (C, talker_hidden)),
                 WeightSpec("small_to_mtp_projection.bias", (C,), "bias")]
    return spec


class CodePredictor:
    """The code predictor network.  ``choose(g, logits_bv) -> ids_b`` picks code g + 1 from the logits of
    head g (greedy or sampling: see ``refimpl.sampling``)."""

    def __init__(self, cfg: CodePredictorConfig, weights: dict, talker_hidden: int, dtype=np.float32):
        check_weights(weights, code_predictor_weight_spec(cfg, talker_hidden), "talker.code_predictor")
        self.cfg = cfg
        self.talker_hidden = talker_hidden
        self.dtype = np.dtype(dtype).type
        self.w = {k: v.astype(self.dtype, copy=False) for k, v in weights.items()}
        self.n_groups = cfg.num_code_groups - 1  # codes 1..15 of a frame

    def embed(self, group: int, ids):
        """Embedding of code group ``group`` (1..15) at talker width: codec_embedding[group - 1]."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"code of group {group} out of range [0, {self.cfg.vocab_size}): "
                             f"{ids.min()}..{ids.max()}")
        return self.w[f"model.codec_embedding.{group - 1}.weight"][ids]

    def project(self, x_btc):
        """small_to_mtp_projection (talker width -> predictor width), the identity when they agree."""
        if "small_to_mtp_projection.weight" not in self.w:
            return x_btc
        return nn.linear(x_btc, self.w["small_to_mtp_projection.weight"], self.w["small_to_mtp_projection.bias"])

    def step(self, x_btc, cache: KVCache):
        """Decoder pass over new positions (cache.length, ...): [B, T, talker width] -> hidden [B, T, C]."""
        c = self.cfg
        B, T, _ = x_btc.shape
        start = cache.length
        positions = np.broadcast_to(np.arange(start, start + T), (B, T))
        cos, sin = rope_cos_sin_bt(positions, c.head_dim, c.rope_theta, self.dtype)
        allowed = nn.causal_window_mask(np.arange(start, start + T), np.arange(start + T))[None, None]
        return decoder_stack(self.w, "model.", c, self.project(x_btc), cos, sin, allowed, cache)

    def head(self, g: int, hidden_bc):
        """lm_head[g]: logits of code group g + 1."""
        return nn.linear(hidden_bc, self.w[f"lm_head.{g}.weight"])

    def predict_frame(self, talker_hidden_bc, code0_emb_bc, choose: Callable, n_groups: int | None = None,
                      record_logits: bool = False):
        """Codes 1..n_groups of one frame for every row.

        talker_hidden_bc  [B, H]  the talker's hidden state of the step that produced code 0
        code0_emb_bc      [B, H]  the talker's codec embedding of code 0
        returns codes [B, n_groups] (int64) and, when ``record_logits``, the logits [B, n_groups, V]."""
        c = self.cfg
        n_groups = self.n_groups if n_groups is None else n_groups
        B = talker_hidden_bc.shape[0]
        cache = KVCache(c.num_hidden_layers, B, c.num_key_value_heads, c.head_dim, self.dtype, capacity=n_groups + 1)
        x = np.stack([talker_hidden_bc, code0_emb_bc], axis=1).astype(self.dtype)  # [B, 2, H]
        codes = np.zeros((B, n_groups), dtype=np.int64)
        logits_all = []
        for g in range(n_groups):
            h = self.step(x, cache)[:, -1]
            logits = self.head(g, h)
            if record_logits:
                logits_all.append(logits)
            codes[:, g] = choose(g, logits)
            if g + 1 < n_groups:
                x = self.embed(g + 1, codes[:, g])[:, None]
        return (codes, np.stack(logits_all, axis=1)) if record_logits else codes
