"""The twin of ``refimpl/codec/quantization.py``: a codebook's nearest rows and their margins."""

from __future__ import annotations

import numpy as np


def nearest_rows(x_nd, e_kd, e_sq_k=None):
    """``codec.quantization.nearest_rows`` (float32) with the two smallest scores of a row found without a
    partition: the smallest is the score at the argmin; set to infinity there, the row's minimum is the
    second smallest (the smallest again where it occurs twice).  The reference's scores, argmin and margin
    arithmetic: the same indices and margins, bit for bit (a partition of every row becomes two passes).  A
    row with a NaN score goes to the reference."""
    if x_nd.dtype != np.float32 or e_kd.dtype != np.float32 or e_kd.shape[0] < 2 or x_nd.ndim != 2:
        return NotImplemented
    if e_sq_k is None:
        e_sq_k = np.sum(e_kd * e_kd, axis=1)
    score_nk = e_sq_k[None, :] - 2 * (x_nd @ e_kd.T)
    best_n = np.argmin(score_nk, axis=1)
    rows_n = np.arange(x_nd.shape[0])
    first_n = score_nk[rows_n, best_n]
    if not np.all(np.isfinite(first_n)):
        return NotImplemented  # (a NaN is its row's argmin; the reference's partition puts it last)
    score_nk[rows_n, best_n] = np.inf
    two_n2 = np.stack([first_n, np.min(score_nk, axis=1)], axis=1)
    x_sq_n = np.sum(x_nd * x_nd, axis=1)
    d_n2 = np.sqrt(np.maximum(two_n2 + x_sq_n[:, None], 0))
    return best_n.astype(np.int64), d_n2[:, 1] - d_n2[:, 0]
