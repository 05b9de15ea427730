"""The attention of ``refimpl/nn.py`` on the GPU: a generation step (a few queries against the KV cache) runs
the kernels of ``kernels/attention.cu``, one thread block per query row, or for long rows several blocks per
row and a second kernel that combines their softmax parts; longer prompts and explicit boolean masks run
the reference's formula with cuBLAS products."""

from __future__ import annotations

import numpy as np

from ... import nn
from . import device

CU_FILE = "attention.cu"
ATTENTION_KERNELS = {np.dtype(np.float32): "attention_rows<float>", np.dtype(np.float64): "attention_rows<double>"}
ATTENTION_SPLIT_KERNELS = {  # (the parts, their combination)
    np.dtype(np.float32): ("attention_split_partials<float>", "attention_split_combine<float>"),
    np.dtype(np.float64): ("attention_split_partials<double>", "attention_split_combine<double>"),
}
INSTANCES = tuple(ATTENTION_KERNELS.values()) + tuple(n for pair in ATTENTION_SPLIT_KERNELS.values() for n in pair)
ATTENTION_THREADS = 128  # 4 warps per query row
DECODE_MAX_QUERIES = 16  # up to this many queries: the row kernel; more: the cuBLAS formula
# A decoding step has few rows (B * H * Tq: 16 for the released Talker), far fewer than the GPU's
# multiprocessors (132 on an H100/H200): a long row's keys are split over several blocks, at least
# ATTENTION_SPLIT_KEYS keys each, until about ATTENTION_TARGET_BLOCKS blocks run.
ATTENTION_SPLIT_KEYS = 64
ATTENTION_TARGET_BLOCKS = 264


def attention(q_bhtd, k_bgsd, v_bgsd, allowed, scale: float):
    """``nn.attention``: softmax(q k^T * scale, masked) v with grouped-query heads (query head h reads
    key/value head h // (H / G)).  An ``AttentionMask`` with at most DECODE_MAX_QUERIES queries (a
    generation step against the KV cache) runs the row kernel; longer prompts and explicit boolean masks
    run the reference's formula with cuBLAS products."""
    H, G = q_bhtd.shape[1], k_bgsd.shape[1]
    if H % G:
        raise ValueError(f"attention: {H} query heads cannot share {G} key/value heads (not a multiple)")
    if isinstance(allowed, nn.AttentionMask) and q_bhtd.shape[2] <= DECODE_MAX_QUERIES:
        return attention_rows_kernel(q_bhtd, k_bgsd, v_bgsd, allowed, scale)
    return attention_formula(q_bhtd, k_bgsd, v_bgsd, allowed, scale)


def attention_splits(rows: int, S: int) -> tuple:
    """(blocks per row, keys per block) for ``rows`` query rows of ``S`` keys: (1, S) for short rows; else
    enough blocks per row for about ATTENTION_TARGET_BLOCKS in all, each with at least ATTENTION_SPLIT_KEYS
    keys and none empty."""
    n = min(-(-S // ATTENTION_SPLIT_KEYS), max(1, -(-ATTENTION_TARGET_BLOCKS // max(rows, 1))))
    if n <= 1:
        return 1, S
    span = -(-S // n)
    return -(-S // span), span


def _kernel(name: str):
    """The compiled kernel ``name`` of kernels/attention.cu (the file compiled once, on first use)."""
    return device.kernel(CU_FILE, name, INSTANCES)


def _rows_contiguous(x_bgsd):
    """``x_bgsd`` itself when each [S, D] block of rows is C-contiguous (a view of a KV-cache buffer with room
    for more positions is), else a C-ordered copy; the kernel steps over batches and heads by strides."""
    S, D = x_bgsd.shape[-2:]
    item = x_bgsd.itemsize
    if (D <= 1 or x_bgsd.strides[-1] == item) and (S <= 1 or x_bgsd.strides[-2] == D * item):
        return x_bgsd
    return x_bgsd.copy()


def _mask_arrays(allowed: nn.AttentionMask):
    """The mask's positions as int64 device arrays, its window as an int (-1: none), its key_valid as uint8
    (positions already on the device stay there; host ones, a few hundred integers, are uploaded)."""
    xp = device.array_module()
    query_pos = xp.asarray(allowed.query_positions_t).astype(np.int64, copy=False)
    key_pos = xp.asarray(allowed.key_positions_s).astype(np.int64, copy=False)
    valid = None if allowed.key_valid_bs is None else xp.asarray(allowed.key_valid_bs).astype(np.uint8)
    return query_pos, key_pos, -1 if allowed.window is None else int(allowed.window), valid


def attention_rows_kernel(q_bhtd, k_bgsd, v_bgsd, allowed: nn.AttentionMask, scale: float):
    """``nn.attention`` for an ``AttentionMask``, one thread block per query row (``attention_rows`` of
    kernels/attention.cu, whose header gives the steps), or for long rows (``attention_splits``) several
    blocks per row, each over a part of the keys, and a second kernel that combines their softmax parts.
    What ``attention`` runs for a few queries against a KV cache."""
    xp = device.array_module()
    q_bhtd, k_bgsd, v_bgsd = device.on_device(q_bhtd, k_bgsd, v_bgsd)
    dtype = q_bhtd.dtype
    q_bhtd = device.contiguous(q_bhtd)
    k_bgsd, v_bgsd = (_rows_contiguous(a.astype(dtype, copy=False)) for a in (k_bgsd, v_bgsd))
    B, H, Tq, D = q_bhtd.shape
    G, S, Dv = k_bgsd.shape[1], k_bgsd.shape[2], v_bgsd.shape[3]
    query_pos, key_pos, window, valid = _mask_arrays(allowed)
    out_bhtd = xp.empty((B, H, Tq, Dv), dtype=dtype)
    if out_bhtd.size == 0:
        return out_bhtd
    scores = xp.empty((B, H, Tq, S), dtype=dtype)
    inputs = (q_bhtd, k_bgsd, v_bgsd, query_pos, key_pos, valid if valid is not None else xp.zeros(1, xp.uint8))
    sizes = tuple(np.int32(n) for n in (H, G, Tq, S, D, Dv))
    strides = tuple(np.int64(a.strides[axis] // a.itemsize) for a in (k_bgsd, v_bgsd) for axis in (0, 1))
    mask = (np.int64(window), np.int32(valid is not None), dtype.type(scale))
    rows = B * H * Tq
    n_splits, span = attention_splits(rows, S)
    if n_splits == 1:
        _kernel(ATTENTION_KERNELS[dtype])(
            (rows,), (ATTENTION_THREADS,), (*inputs, scores, out_bhtd, *sizes, *strides, *mask)
        )
        return out_bhtd
    partials, combine = (_kernel(name) for name in ATTENTION_SPLIT_KERNELS[dtype])
    part_max, part_sum = xp.empty((rows, n_splits), dtype=dtype), xp.empty((rows, n_splits), dtype=dtype)
    part_out = xp.empty((rows, n_splits, Dv), dtype=dtype)
    partials(
        (rows, n_splits),
        (ATTENTION_THREADS,),
        (*inputs, scores, part_max, part_sum, part_out, *sizes, *strides, *mask, np.int32(span)),
    )
    combine((rows,), (ATTENTION_THREADS,), (part_max, part_sum, part_out, out_bhtd, np.int32(n_splits), np.int32(Dv)))
    return out_bhtd


def attention_formula(q_bhtd, k_bgsd, v_bgsd, allowed, scale: float):
    """``nn.attention`` as the reference computes it (ATTENTION_QUERY_BLOCK queries at a time, cuBLAS
    products); an ``AttentionMask``'s rows are built on the device from its positions."""
    xp = device.array_module()
    q_bhtd, k_bgsd, v_bgsd = device.on_device(q_bhtd, k_bgsd, v_bgsd)
    H, G = q_bhtd.shape[1], k_bgsd.shape[1]
    if H != G:
        k_bgsd = xp.repeat(k_bgsd, H // G, axis=1)
        v_bgsd = xp.repeat(v_bgsd, H // G, axis=1)
    if isinstance(allowed, nn.AttentionMask):
        query_pos, key_pos, window, valid = _mask_arrays(allowed)
    else:
        (allowed,) = device.on_device(allowed)
    T = q_bhtd.shape[2]
    out_bhtd = xp.empty(q_bhtd.shape[:-1] + v_bgsd.shape[-1:], dtype=xp.result_type(q_bhtd, v_bgsd))
    for start in range(0, T, nn.ATTENTION_QUERY_BLOCK):
        stop = min(T, start + nn.ATTENTION_QUERY_BLOCK)
        if isinstance(allowed, nn.AttentionMask):
            q_t1, k_1s = query_pos[start:stop, None], key_pos[None, :]
            allowed_ts = k_1s <= q_t1
            if window >= 0:
                allowed_ts &= k_1s > q_t1 - window
            if valid is not None:
                allowed_ts = allowed_ts[None, None] & (valid != 0)[:, None, None, :]
        else:
            allowed_ts = allowed if allowed.shape[-2] == 1 else allowed[..., start:stop, :]
        scores_bhts = xp.matmul(q_bhtd[:, :, start:stop], xp.swapaxes(k_bgsd, -1, -2)) * q_bhtd.dtype.type(scale)
        scores_bhts = xp.where(allowed_ts, scores_bhts, -xp.inf)
        out_bhtd[:, :, start:stop] = xp.matmul(nn.softmax.reference(scores_bhts, axis=-1), v_bgsd)
    return out_bhtd
