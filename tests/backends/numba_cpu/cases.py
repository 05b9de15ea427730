"""What the tests of the numba backend's modules share.

Tolerance of a twin that reorders a sum (conv1d, linear): both sides are sums of the same n products in
another order, so each is within gamma_n * sum|terms| of the exact value (gamma_n ~ n * eps / 2); we allow
2 * n * eps * sum|terms| for their difference.  Twins that keep the reference's operations and order (elu,
and snake_beta in float64) must be bit-identical; the float32 SnakeBeta evaluates its own sine (see its test).
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import transformer
from refimpl.backends import numba_cpu
from refimpl.backends.bf16 import BF16Matrix, bf16_bits_to_float32, float32_to_bf16_bits

DTYPES = (np.float32, np.float64)


def within_float32_noise(got, ref, exact) -> bool:
    """A fused float32 twin's output ``got`` is as close to the float64 result ``exact`` as the float32
    reference ``ref`` is, within 4 times its distance, plus 16 float32 ulps of the output's scale: on a tiny
    case the reference can be luckily close (2 channels, seed 2900 of the residual unit: its error 2.3e-7
    where the twin's order of sums gave 1.9e-6, through SnakeBeta's slope), while a wrong tap or offset is
    off by the signal itself."""
    scale = max(1.0, float(np.max(np.abs(exact))))
    return np.max(np.abs(got - exact)) <= 4 * np.max(np.abs(ref - exact)) + 16 * np.finfo(np.float32).eps * scale


needs_tiles = pytest.mark.skipif(not numba_cpu.amx.USE_TILES, reason="no AMX tiles on this machine (or REFIMPL_AMX=0)")


def random_qwen3_layer(rng, C, H, G, D, F, dtype):
    """One Qwen3 layer's weights (bf16-rounded matrices as BF16Matrix for float32, their exact float64
    values for float64) in a WeightView, and its config."""
    import types

    from refimpl.io.checkpoint import WeightView

    spec = transformer.qwen3_layer_weight_spec("", C, F, H, G, D, bias=False)
    weights = {}
    for ws in spec:
        w = (rng.standard_normal(ws.shape) * (1.0 if ws.init == "norm" else ws.shape[-1] ** -0.5)).astype(np.float32)
        if len(ws.shape) == 2:
            bits = float32_to_bf16_bits(w)
            weights[ws.name] = BF16Matrix(bits) if dtype == np.float32 else np.asarray(BF16Matrix(bits), np.float64)
        else:
            weights[ws.name] = (1 + 0.1 * w if ws.init == "norm" else w).astype(dtype)
    cfg = types.SimpleNamespace(num_attention_heads=H, num_key_value_heads=G, head_dim=D)
    return WeightView(weights), cfg


def layer_step(x_btc, lw, cfg, cos_btd, sin_btd, cache, eps, last_only=False, fused=True):
    """One Qwen3 layer for the new positions of one row, each seeing the cached keys and itself: numba's
    fused ``transformer_stack`` of this one layer (``fused``), else the reference stack of it."""
    from refimpl import nn
    from refimpl.recorder import NULL_RECORDER

    n, T = cache.length, x_btc.shape[1]
    mask = nn.AttentionMask(nn.arange(n, n + T), nn.arange(n + T))
    stack = numba_cpu.transformer.transformer_stack if fused else transformer.transformer_stack.reference
    return stack([lw], transformer.QWEN3, cfg, x_btc, cos_btd, sin_btd, mask, [cache], eps, NULL_RECORDER, last_only)


def bf16_values(rng, shape):
    """Random float32 numbers that are bfloat16 values (their low 16 bits zero), as widened at load."""
    return bf16_bits_to_float32(float32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32)))
