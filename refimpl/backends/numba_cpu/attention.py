"""``nn.attention`` over an ``AttentionMask``'s positions, and the fused decoder layer's attention of a few
new positions over the KV cache (``_attend_new_positions``)."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ... import nn
from .elementwise import ELEMENTWISE_PIECE
from .intrinsics import FASTMATH, _exp_f32
from .pieces import run_pieces


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _exp_shifted_into(scores_s, m):
    """scores = exp(scores - m), by ``_exp_f32`` (its own function: compiled without reassociation, which
    would break the exp's range reduction, while its caller sums with it); a masked key's -inf is 0 without
    its exp (exp(-inf - m) rounds through subnormal products, each a slow microcode assist)."""
    for s in range(scores_s.shape[0]):
        x = scores_s[s]
        e = _exp_f32(x - m if x != -np.inf else np.float32(0.0))
        scores_s[s] = e if x != -np.inf else np.float32(0.0)


@numba.njit(fastmath=FASTMATH, inline="always")
def _mask_scores(scores_s, b, qp, key_pos_s, window, valid_bs, use_valid, scale):
    """scores[s] = scores[s] * scale where query position qp sees key s (causal, the window, the key's
    validity), else -inf (the reference's np.where); returns how many visible scores are NaN or +inf."""
    bad = 0
    for s in range(scores_s.shape[0]):
        kp = key_pos_s[s]
        seen = (kp <= qp) & ((window < 0) | (kp > qp - window))
        seen &= (use_valid == 0) | (valid_bs[b * use_valid, s * use_valid] != 0)
        x = scores_s[s] * scale
        bad += seen & ~(x < np.inf)
        scores_s[s] = x if seen else -np.inf
    return bad


@numba.njit(fastmath=FASTMATH, inline="always")
def _row_max(x_s):
    """The largest of x (no NaN in it), over 16 lanes of maxima (one chain of maxima does not vectorise)."""
    lanes = np.full(16, -np.inf, dtype=np.float32)
    S = x_s.shape[0]
    for s0 in range(0, S - 15, 16):
        for j in range(16):
            lanes[j] = max(lanes[j], x_s[s0 + j])
    m = np.float32(-np.inf)
    for j in range(16):
        m = max(m, lanes[j])
    for s in range(S - S % 16, S):
        m = max(m, x_s[s])
    return m


@numba.njit(fastmath=FASTMATH, error_model="numpy", cache=True, nogil=True)
def _masked_softmax_rows(scores_rs, r0, heads, query_pos_t, key_pos_s, window, valid_bs, use_valid, scale):
    """The rows of scores [B * H * T, S] (the products q k^T of one block of queries, flattened), row r0 +
    i in place: masked and scaled (``_mask_scores``), then softmax(x) = e / sum(e), e = exp(x - m), m their
    largest (0 when no key is visible: a sum of 0 taken as 1, the row gives zeros); a row with a visible
    NaN or +inf score is all NaN, as the reference's then is.  The reference's operations in one pass over
    each row but for the order of the sum (``nn.softmax``)."""
    T = query_pos_t.shape[0]
    for i in range(scores_rs.shape[0]):
        r = r0 + i
        b, t = r // (heads * T), r % T
        scores_s = scores_rs[i]
        if _mask_scores(scores_s, b, query_pos_t[t], key_pos_s, window, valid_bs, use_valid, scale):
            scores_s[:] = np.nan
            continue
        m = _row_max(scores_s)
        _exp_shifted_into(scores_s, np.float32(0.0) if m == -np.inf else m)
        total = np.float32(0.0)
        for s in range(scores_s.shape[0]):
            total += scores_s[s]
        total = np.float32(1.0) if total == 0 else total
        for s in range(scores_s.shape[0]):
            scores_s[s] /= total


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``target``."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def attention(q_bhtd, k_bgsd, v_bgsd, allowed, scale: float):
    """``nn.attention`` for float32 and an ``AttentionMask`` (every caller's): the reference's products
    (BLAS) around one pass over each row of scores for the mask, the scale and the softmax
    (``_masked_softmax_rows``, rows in pieces side by side; the mask read from its positions, never built),
    where the reference's scale, mask and softmax make a new array of scores each.  An explicit boolean
    mask, float64, another array type, positions that are not integers, no query or no key go to the
    reference."""
    arrays = (q_bhtd, k_bgsd, v_bgsd)
    if not isinstance(allowed, nn.AttentionMask) or not all(
        isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 4 for a in arrays
    ):
        return NotImplemented
    B, H, T, _ = q_bhtd.shape
    G, S = k_bgsd.shape[1], k_bgsd.shape[2]
    positions = [np.asarray(p).reshape(-1) for p in (allowed.query_positions_t, allowed.key_positions_s)]
    valid = allowed.key_valid_bs
    integers = all(np.issubdtype(p.dtype, np.integer) for p in positions)
    if H % G or not integers or positions[0].shape[0] != T or positions[1].shape[0] != S or T == 0 or S == 0:
        return NotImplemented  # (the reference's result, or its error)
    if valid is not None and not _broadcasts_to(np.shape(valid), (B, S)):
        return NotImplemented
    query_pos_t, key_pos_s = (p.astype(np.int64) for p in positions)
    if H != G:
        k_bgsd, v_bgsd = np.repeat(k_bgsd, H // G, axis=1), np.repeat(v_bgsd, H // G, axis=1)
    valid_bs = np.zeros((1, 1), np.uint8) if valid is None else (np.broadcast_to(valid, (B, S)) != 0).view(np.uint8)
    window = -1 if allowed.window is None else int(allowed.window)
    out_bhtd = np.empty((B, H, T, v_bgsd.shape[3]), dtype=np.float32)
    for start in range(0, T, nn.ATTENTION_QUERY_BLOCK):
        stop = min(T, start + nn.ATTENTION_QUERY_BLOCK)
        scores_bhts = np.matmul(q_bhtd[:, :, start:stop], np.swapaxes(k_bgsd, -1, -2))
        rows_rs = scores_bhts.reshape(-1, S)
        n = max(1, ELEMENTWISE_PIECE // max(S, 1))
        positions = query_pos_t[start:stop]

        def piece(r0, rows_rs=rows_rs, positions=positions, n=n):
            _masked_softmax_rows(
                rows_rs[r0 : r0 + n],
                r0,
                H,
                positions,
                key_pos_s,
                window,
                valid_bs,
                int(valid is not None),
                np.float32(scale),
            )

        run_pieces(piece, [(r0,) for r0 in range(0, rows_rs.shape[0], n)])
        out_bhtd[:, :, start:stop] = np.matmul(scores_bhts, v_bgsd)
    return out_bhtd


# the fused decoder layer's attention: its few new positions of each batch row over the KV cache
@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _attend_new_positions(q_nq, k_bgsd, v_bgsd, n, first_key_b, out_nq):
    """out[b R + t, h] = softmax(q[b R + t, h] . k[b, g, s0:n + t + 1] / sqrt(D)) @ v[b, g, s0:n + t + 1] for
    each batch row b (of B), its new positions t < R (the cache's n + t) and each head h of group g (GQA),
    s0 = first_key_b[b] the row's first valid key (0 but where a batch is left-padded): the attention of the
    new positions over the row's valid cached keys and the new ones up to their own (``nn.attention``; a
    position that sees no key gives zeros, as there), one parallel loop over the rows' heads for all of them
    (not one per position).  A row's keys are summed from s0 on, so its sums are those of the same row
    alone, unpadded: the same bits.  A head's weighted sum of the values runs in its own D floats, stored
    into ``out`` once: summed in ``out`` itself, which the compiler cannot prove apart from ``v``, the loop
    over d ran one lane at a time (the same sums in the same order, the same bits)."""
    B, G, D = k_bgsd.shape[0], k_bgsd.shape[1], k_bgsd.shape[3]
    R, H = q_nq.shape[0] // B, q_nq.shape[1] // D
    scale = np.float32(D**-0.5)
    for bh in prange(B * H):
        b, hd = bh // H, bh % H
        g = hd // (H // G)
        s0 = first_key_b[b]
        k_gsd, v_gsd = k_bgsd[b], v_bgsd[b]
        scores = np.empty(n + R, dtype=np.float32)
        sum_d = np.empty(D, dtype=np.float32)
        for t in range(R):
            S = n + t + 1 - s0  # the keys this position sees: s0 .. n + t
            q_d = q_nq[b * R + t, hd * D : (hd + 1) * D]
            if S <= 0:  # (a padding position before the row's first valid key)
                for d in range(D):
                    out_nq[b * R + t, hd * D + d] = 0.0
                continue
            m = np.float32(-np.inf)
            for s_ in range(S):
                k_d = k_gsd[g, s0 + s_]
                acc = np.float32(0.0)
                for d in range(D):
                    acc += q_d[d] * k_d[d]
                scores[s_] = acc * scale
                if scores[s_] > m:
                    m = scores[s_]
            _exp_shifted_into(scores[:S], m)
            total = np.float32(0.0)
            for s_ in range(S):
                total += scores[s_]
            for s_ in range(S):  # the weights, before the values' loop: a division there was reassociated
                scores[s_] /= total  # into one division per product of a value
            for d in range(D):
                sum_d[d] = 0.0
            for s_ in range(S):
                p = scores[s_]
                v_d = v_gsd[g, s0 + s_]
                for d in range(D):
                    sum_d[d] += p * v_d[d]
            for d in range(D):
                out_nq[b * R + t, hd * D + d] = sum_d[d]
