"""The split residual vector quantiser of the 12 Hz codec, both ways.

Each VQ layer's codebook is stored as an exponential-moving-average pair (the sum of the vectors
assigned to each row, and how many there were); the effective codebook is their quotient.  The 16
codes of a frame are split: code 0 is the *semantic* quantiser (one layer), codes 1..15 the first 15
layers of the *acoustic* quantiser; each part has its own 1x1 projections in and out.

- decoding (``dequantize``): per part, sum the chosen rows, project out, add the two parts;
- encoding (``split_rvq_encode``): per part, project in, then per layer take the nearest row and go on
  with the residual.

The decoder and encoder checkpoints name the same things differently (``rvq_first``/``rvq_rest``,
``vq.layers.i._codebook.embedding_sum`` against ``semantic_/acoustic_residual_vector_quantizer``,
``layers.i.codebook.embed_sum``): each side reads its own names, through a ``WeightView`` of each part
(``quantizer.rvq_first.``); a function takes its codec side's weights, the dict or a view of it.
"""

from __future__ import annotations

import numpy as np

from .. import nn
from ..backends import primitive
from ..io.checkpoint import WeightView
from ..recorder import NULL_RECORDER, Recorder

# ----------------------------------------------------------------------------- the codebooks


def codebook_table(embedding_sum_kd, cluster_usage_k, eps: float = 1e-5):
    """The effective codebook of one VQ layer (an exponential-moving-average codebook stores the sum of
    the vectors assigned to each row and how many there were): embedding_sum / max(cluster_usage, eps).
    [K, D]"""
    return embedding_sum_kd / np.maximum(cluster_usage_k, eps)[:, None]


# ----------------------------------------------------------------------------- decoding: codes -> latent


def dequantize_tables(w, cfg) -> dict:
    """Precompute the effective codebooks (one [K, D/2] table per VQ layer) of both split parts."""
    tables = {}
    for part, n in (("rvq_first", 1), ("rvq_rest", cfg.num_quantizers - 1)):
        q = WeightView(w, f"quantizer.{part}.")
        layers = [q.sub(f"vq.layers.{i}._codebook.") for i in range(n)]
        tables[part] = [codebook_table(cb["embedding_sum"], cb["cluster_usage"]) for cb in layers]
    return tables


def dequantize(w, cfg, codes_bqt, tables: dict, record: Recorder = NULL_RECORDER):
    """Split RVQ: the semantic group (codes[:, 0]) and the acoustic groups (codes[:, 1:]) each sum
    their codebook rows, go through their own 1x1 output projection, and the two are added.
    codes [B, Q, T] -> [B, codebook_dim, T]."""
    out = 0
    for part, groups in (("rvq_first", range(0, 1)), ("rvq_rest", range(1, cfg.num_quantizers))):
        summed_btd = 0
        for layer, q in enumerate(groups):
            rows_btd = tables[part][layer][codes_bqt[:, q, :]]  # [B, T, D/2]
            record(f"quantizer.{part}.vq.layers.{layer}.project_out", rows_btd)
            summed_btd = summed_btd + rows_btd
        proj_oi = WeightView(w, f"quantizer.{part}.")["output_proj.weight"][:, :, 0]
        part_bdt = np.matmul(proj_oi, np.swapaxes(summed_btd, 1, 2))  # [B, D, T]
        record(f"quantizer.{part}.output_proj", part_bdt)
        out = out + part_bdt
    return out


# ----------------------------------------------------------------------------- encoding: latent -> codes


QUANTIZER_PARTS = ("semantic_residual_vector_quantizer", "acoustic_residual_vector_quantizer")


def encoder_tables(w, cfg) -> dict:
    """Per split part, the effective codebooks [K, D] and their squared row norms [K], for every layer."""
    tables = {}
    for part, n in zip(
        QUANTIZER_PARTS, (cfg.num_semantic_quantizers, cfg.num_quantizers - cfg.num_semantic_quantizers), strict=True
    ):
        q = WeightView(w, f"quantizer.{part}.")
        books = [q.sub(f"layers.{j}.codebook.") for j in range(n)]
        rows = [codebook_table(cb["embed_sum"], cb["cluster_usage"]) for cb in books]
        tables[part] = [(e_kd, np.sum(e_kd * e_kd, axis=1)) for e_kd in rows]
    return tables


@primitive
def nearest_rows(x_nd, e_kd, e_sq_k=None):
    """For each row of x, the index of the nearest codebook row (Euclidean distance; ties -> the lowest
    index) and the margin d(second nearest) - d(nearest) >= 0.

    |x - e_k|^2 = |x|^2 - 2 x.e_k + |e_k|^2: one matrix product gives every distance; |x|^2 is the same
    for every k, so the choice only needs |e_k|^2 - 2 x.e_k.  Returns (index [N] int64, margin [N])."""
    if e_sq_k is None:
        e_sq_k = np.sum(e_kd * e_kd, axis=1)
    score_nk = e_sq_k[None, :] - 2 * (x_nd @ e_kd.T)
    best_n = np.argmin(score_nk, axis=1)
    if e_kd.shape[0] < 2:
        return best_n.astype(np.int64), nn.module_of(x_nd).full(x_nd.shape[0], np.inf, dtype=x_nd.dtype)
    two_nk = np.partition(score_nk, 1, axis=1)[:, :2]
    x_sq_n = np.sum(x_nd * x_nd, axis=1)
    d_n2 = np.sqrt(np.maximum(two_nk + x_sq_n[:, None], 0))
    return best_n.astype(np.int64), d_n2[:, 1] - d_n2[:, 0]


def rvq_encode(w, part: str, tables: dict, latent_bct, n_layers: int, record: Recorder = NULL_RECORDER):
    """One residual VQ: 1x1 input projection, then per layer pick the nearest row and subtract it.
    [B, C, T] -> codes [n, B, T], margins [n, B, T], projected input [B, D, T].  ``record.extra``
    receives each layer's input residual [B, T, D], chosen codes [B, T] and margins [B, T]."""
    proj = WeightView(w, f"quantizer.{part}.").get("input_proj.weight")
    x_bdt = np.matmul(proj[:, :, 0], latent_bct) if proj is not None else latent_bct
    B, D, T = x_bdt.shape
    residual_nd = np.swapaxes(x_bdt, 1, 2).reshape(B * T, D)
    codes, margins = [], []
    for layer in range(n_layers):
        e_kd, e_sq_k = tables[part][layer]
        idx_n, margin_n = nearest_rows(residual_nd, e_kd, e_sq_k)
        layer_name = f"quantizer.{part}.layers.{layer}."
        record.extra(layer_name + "residual", residual_nd.reshape(B, T, D))
        record.extra(layer_name + "codes", idx_n.reshape(B, T))
        record.extra(layer_name + "margin", margin_n.reshape(B, T))
        residual_nd = residual_nd - e_kd[idx_n]
        codes.append(idx_n.reshape(B, T))
        margins.append(margin_n.reshape(B, T))
    return np.stack(codes), np.stack(margins), x_bdt


def split_rvq_encode(w, cfg, latent_bct, n_codes: int, tables=None, record: Recorder = NULL_RECORDER):
    """The semantic quantiser's codes then the acoustic quantiser's first ``n_codes - n_semantic`` codes,
    each from the same latent.  -> codes [B, n_codes, T] int64, margins [B, n_codes, T]."""
    tables = tables if tables is not None else encoder_tables(w, cfg)
    n_sem = cfg.num_semantic_quantizers
    if not n_sem <= n_codes <= cfg.num_quantizers:
        raise ValueError(f"number of codes {n_codes} must be in [{n_sem}, {cfg.num_quantizers}]")
    codes, margins = [], []
    for part, n in zip(QUANTIZER_PARTS, (n_sem, n_codes - n_sem), strict=True):
        if n == 0:
            continue
        c, m, projected = rvq_encode(w, part, tables, latent_bct, n, record)
        record(f"quantizer.{part}.input_proj", projected)
        codes.append(c)
        margins.append(m)
    codes_qbt, margins_qbt = np.concatenate(codes), np.concatenate(margins)
    return np.swapaxes(codes_qbt, 0, 1), np.swapaxes(margins_qbt, 0, 1)
