"""The twins of ``nn.attention``: over a mask's positions, and the fused layer's attention of the new
positions over the KV cache."""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import CASES, attention_case

from refimpl import nn
from refimpl.backends import numba_cpu


@pytest.mark.parametrize("n", [0, 1, 40, 200])
@pytest.mark.parametrize("T", [1, 2, 28])
def test_attention_of_the_new_positions_is_the_softmax_formula(n, T):
    """The fused step's attention (``_attend_new_positions``: 16 heads of 128 over 8 key groups, the sizes of
    the 0.6B Talker) for T new positions after n cached ones: softmax(q k^T / sqrt(D)) v over the keys up
    to each position's own, ``nn.attention`` (the reference) in float32 and in float64; the kernel within
    twice the float32 composition's distance from the float64 one, plus the float32 rounding of the longer
    reduction at the output's scale.  The cache's rows past n + T hold NaN: a read past a position's keys
    would show."""
    H, G, D = 16, 8, 128
    rng = np.random.default_rng(n + 100 * T)
    q = rng.standard_normal((T, H * D)).astype(np.float32)
    k = np.full((G, n + T + 9, D), np.nan, np.float32)
    v = np.full((G, n + T + 9, D), np.nan, np.float32)
    k[:, : n + T] = rng.standard_normal((G, n + T, D))
    v[:, : n + T] = rng.standard_normal((G, n + T, D))
    out = np.full((T, H * D), np.nan, np.float32)
    numba_cpu.attention._attend_new_positions(q, k[None], v[None], n, np.zeros(1, np.int64), out)
    allowed = nn.AttentionMask(nn.arange(n, n + T), nn.arange(n + T))

    def formula(dtype):  # nn.attention itself: [1, H, T, D] queries over [1, G, n + T, D] keys and values
        q_bhtd = q.reshape(T, H, D).transpose(1, 0, 2)[None].astype(dtype)
        k_bgsd, v_bgsd = (a[None, :, : n + T].astype(dtype) for a in (k, v))
        y_bhtd = nn.attention.reference(q_bhtd, k_bgsd, v_bgsd, allowed, D**-0.5)
        return y_bhtd[0].transpose(1, 0, 2).reshape(T, H * D).astype(np.float64)

    exact, composition = formula(np.float64), formula(np.float32)
    floor = 2 * max(D, n + T) * np.finfo(np.float32).eps * np.max(np.abs(exact))
    assert np.max(np.abs(out - exact)) <= 2 * np.max(np.abs(composition - exact)) + floor


@pytest.mark.parametrize("T", [1, 3])
def test_attention_of_a_left_padded_batch_is_each_row_alone(T):
    """The fused step's attention over B rows, each from its own first valid key (a left-padded batch: keys
    before it unseen): each row has the bits of the same row alone with its padding cut off, and the batch
    is ``nn.attention``'s with the padding as key validity (float32, within 1e-5); a position before its
    row's first valid key sees nothing and gives zeros, as the reference's."""
    B, H, G, D, n = 3, 4, 2, 16, 6
    first_key = np.array([0, 2, n + 1], np.int64)  # row 2: its first new position sees no key
    rng = np.random.default_rng(T)
    q = rng.standard_normal((B * T, H * D)).astype(np.float32)
    k, v = rng.standard_normal((2, B, G, n + T + 4, D)).astype(np.float32)
    out = np.full((B * T, H * D), np.nan, np.float32)
    numba_cpu.attention._attend_new_positions(q, k, v, n, first_key, out)
    for b, s0 in enumerate(first_key):
        alone = np.full((T, H * D), np.nan, np.float32)
        row = slice(b * T, (b + 1) * T)
        if s0 <= n:
            kb, vb = (np.ascontiguousarray(a[b : b + 1, :, s0:]) for a in (k, v))
            numba_cpu.attention._attend_new_positions(q[row], kb, vb, n - s0, np.zeros(1, np.int64), alone)
            np.testing.assert_array_equal(out[row], alone, err_msg=f"row {b}")
    valid = np.arange(n + T)[None] >= first_key[:, None]
    allowed = nn.AttentionMask(nn.arange(n, n + T), nn.arange(n + T), key_valid_bs=valid)
    q_bhtd = q.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    ref = nn.attention.reference(q_bhtd, k[:, :, : n + T], v[:, :, : n + T], allowed, D**-0.5)
    np.testing.assert_allclose(out, ref.transpose(0, 2, 1, 3).reshape(B * T, H * D), rtol=1e-5, atol=1e-5)
    assert np.all(out[2 * T] == 0)


@pytest.mark.parametrize("case", CASES)
def test_attention_twin_equals_the_reference(case):
    """softmax(q k^T * scale, masked) v with the mask read from its positions and one pass over each row of
    scores: the reference's float32 operations but for the order of the sums (within 1e-5, relative and
    absolute, of the reference: its inputs are standard normal), every grouping of heads, window, padding
    (the batch row that sees no key: zeros), a query before every key, D != Dv, a view of a KV cache."""
    q, k, v, mask = attention_case(len(case), np.float32, **CASES[case])
    ref = nn.attention.reference(q, k, v, mask, scale=0.125)
    got = numba_cpu.attention.attention(q, k, v, mask, 0.125)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    if case == "padded":
        assert np.all(got[-1] == 0) and np.any(got[0] != 0)


def test_attention_twin_over_blocks_and_pieces_and_its_non_finite_rows(monkeypatch):
    """Queries in several blocks (ATTENTION_QUERY_BLOCK) and rows in several pieces, side by side; a visible
    NaN or +inf score spoils its own row (NaN, as the reference's), a NaN key behind the mask nothing; a
    masked key's exp is 0 without its subnormal arithmetic (the outputs of rows whose keys are mostly
    masked are the reference's too); float64, an explicit boolean mask and key validity of another batch
    go to the reference."""
    monkeypatch.setattr(nn, "ATTENTION_QUERY_BLOCK", 7)
    monkeypatch.setattr(numba_cpu.attention, "ELEMENTWISE_PIECE", 64)
    q, k, v, mask = attention_case(5, np.float32, B=2, H=4, G=2, Tq=30, S=40, D=16, window=12, padded=True, start=10)
    q[0, 1, 20, 3] = np.nan  # query 20 of head 1: its whole row NaN
    k[1, 0, 5, 0] = np.inf  # key 5 of group 0, batch row 1: +-inf scores where it is seen
    k[0, 1, 39, 2] = np.nan  # the last key: behind the causal mask of every query but the last
    ref = nn.attention.reference(q, k, v, mask, scale=0.3)
    got = numba_cpu.attention.attention(q, k, v, mask, 0.3)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[0, 1, 20]).all() and not np.isnan(got[0, 1, :20]).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert numba_cpu.attention.attention(q.astype(np.float64), k, v, mask, 0.3) is NotImplemented
    assert numba_cpu.attention.attention(q, k, v, mask.rows(0, 30), 0.3) is NotImplemented
    other_rows = nn.AttentionMask(mask.query_positions_t, mask.key_positions_s, 12, np.ones((3, 40), bool))
    assert numba_cpu.attention.attention(q, k, v, other_rows, 0.3) is NotImplemented  # (the reference's own error then)
