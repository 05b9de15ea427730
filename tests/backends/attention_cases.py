"""Attention cases shared by the backends' attention tests (the CuPy kernel's emulation and the numba twin):
q, k, v and an ``nn.AttentionMask`` with grouped-query heads, windows, left padding (one batch row that
sees no key), a query before every key, D != Dv, and k and v as views of a larger KV cache buffer."""

from __future__ import annotations

import numpy as np

from refimpl import nn


def attention_case(seed, dtype, B=2, H=4, G=2, Tq=3, S=11, D=40, window=None, padded=False, start=8, cache_view=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Tq, D)).astype(dtype)
    k = rng.standard_normal((B, G, S, D)).astype(dtype)
    v = rng.standard_normal((B, G, S, D + 3)).astype(dtype)  # Dv != D: the kernel must keep them apart
    if cache_view:  # k and v as the KV cache hands them: the first S positions of a larger buffer (NaN beyond)
        k_buffer, v_buffer = (np.full(a.shape[:2] + (S + 7,) + a.shape[3:], np.nan, dtype) for a in (k, v))
        k_buffer[:, :, :S], v_buffer[:, :, :S] = k, v
        k, v = k_buffer[:, :, :S], v_buffer[:, :, :S]
    valid = None
    if padded:
        valid = rng.random((B, S)) < 0.7
        valid[-1] = False  # one row of the batch sees nothing: zeros, as the reference gives
    mask = nn.AttentionMask(np.arange(start, start + Tq), np.arange(start + Tq - S, start + Tq), window, valid)
    return q, k, v, mask


CASES = {
    "causal": {},
    "window": {"window": 4},
    "window_0": {"window": 0},
    "padded": {"padded": True},
    "mha": {"G": 4},
    "mqa_window_padded": {"G": 1, "window": 3, "padded": True},
    "one_query": {"Tq": 1, "S": 40, "D": 64},
    "query_before_every_key": {"start": 2, "S": 9},
    "long_head": {"D": 70, "Tq": 2},
    "kv_cache_view": {"cache_view": True, "window": 5, "padded": True},
}
