"""The code predictor's packed words (``bf16.PackedWords``): lossless, and the products read from them within
the float32 bound of the same products read from the words.

Tolerance (as tests/backends/numba_cpu/cases.py): a product of n terms summed in float32 in any order is within
gamma_n * sum|terms| of the exact value (gamma_n ~ n * eps / 2); the packed kernel's sums are measured against
the float64 product of the same bf16 weights with (n + 1) * eps * sum|terms|, the bound the words' own
kernel meets (``test_matvec_kernel_of_the_fused_step_is_the_linear_kernel``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl import backends as kernels
from refimpl import nn, transformer
from refimpl.backends import bf16, numba_cpu
from refimpl.backends.bf16 import BF16Matrix, PackedWords, bf16_bits_to_float32, float32_to_bf16_bits, unpack_words

from .cases import layer_step, random_qwen3_layer

pytestmark = pytest.mark.skipif(
    not numba_cpu.packed_words.PACKED_COMPILED, reason="the packed kernel needs 512-bit byte shuffles (avx512bw)"
)

EPS = float(np.finfo(np.float32).eps)
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-39, 3e38, -2.5e-30, 1.0, -65280.0], np.float32)


def random_words(rng, O, I, scale=0.02, special=0.0, values=SPECIAL):
    """bf16 words of a normal matrix, a fraction ``special`` of them replaced by ``values``."""
    w = (rng.standard_normal((O, I)) * scale).astype(np.float32)
    mask = rng.random((O, I)) < special
    w[mask] = rng.choice(values, size=int(mask.sum()))
    return float32_to_bf16_bits(w)


def packed_words_formula(bits):
    """``PackedWords`` of the words [O, I] as ``bf16.PackedWords`` states it, in NumPy: the window is the first
    of the 8 consecutive high-byte values (sign aside) holding the most words other than +-0; a word in it
    has code k | (sign << 3) (its high byte base + k) and its low byte, in ``stored_order``; the others are
    listed, row by row in column order, with code 0 and low byte 0 in their place."""
    O, I = bits.shape
    high, nonzero = (bits >> 8) & 0x7F, (bits & 0x7FFF) != 0
    counts = np.bincount(high[nonzero], minlength=128)
    base = int(np.argmax([counts[b : b + bf16.PACK_WINDOW].sum() for b in range(128 - bf16.PACK_WINDOW + 1)]))
    k = high.astype(np.int64) - base
    held = nonzero & (k >= 0) & (k < bf16.PACK_WINDOW)
    codes = np.where(held, k | (bits >> 15) << 3, 0).astype(np.uint8).reshape(O, I // 64, 64)[:, :, bf16.stored_order()]
    low = np.where(held, bits & 0xFF, 0).astype(np.uint8).reshape(O, I // 64, 64)[:, :, bf16.stored_order()]
    high_16 = [(c // 8) << 7 | (base + c % 8) for c in range(16)]
    rows, cols = np.nonzero(~held)
    return PackedWords(
        low.reshape(O, I),
        (codes[:, :, :32] | codes[:, :, 32:] << 4).reshape(O, I // 2),
        np.array(high_16 * 4, np.uint8),
        rows.astype(np.int32),
        cols.astype(np.int32),
        (bits[rows, cols].astype(np.uint32) << 16).view(np.float32),
    )


def assert_same_packing(got, expected):
    """Every array of two ``PackedWords`` the same: dtype, shape and bits (NaN payloads too)."""
    for name, a, b in zip(PackedWords._fields, got, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=name)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40),
    st.sampled_from([64, 128, 192, 1024]),
    st.sampled_from([1e-6, 0.02, 1.0, 3e4]),
    st.sampled_from([0.0, 0.01, 0.5, 1.0]),
    st.integers(0, 2**31),
)
def test_packing_is_lossless(O, I, scale, special, seed):
    """Every word comes back bit for bit (+0 and -0, subnormals, infinities, NaN payloads, words far outside
    the window), whatever the matrix's scale and however many words the codes cannot hold."""
    bits = random_words(np.random.default_rng(seed), O, I, scale, special)
    packed = numba_cpu.packed_words.pack_words(bits)
    assert isinstance(packed, PackedWords)
    assert packed.low_oi.shape == (O, I) and packed.codes_oh.shape == (O, I // 2) and packed.high_64.shape == (64,)
    np.testing.assert_array_equal(unpack_words(packed), bits)
    assert_same_packing(packed, packed_words_formula(bits))
    rows, cols = packed.rows_e.astype(np.int64), packed.cols_e.astype(np.int64)
    assert np.all(np.diff(rows * I + cols) > 0)  # listed row by row, in column order, each once


def every_word(rng):
    """The 65536 words, shuffled, as 1024 x 64: every high byte, every low byte, +-0, infinities, NaNs."""
    return rng.permutation(np.arange(1 << 16, dtype=np.uint64)).astype(np.uint16).reshape(1024, 64)


def window_words(rng, O, I, base, sign=True):
    """Words whose high byte, sign aside, lies in base .. base + 7, none of them +-0."""
    high = rng.integers(base, base + 8, (O, I)) | (rng.integers(0, 2, (O, I)) << 7 if sign else 0)
    return (high << 8 | rng.integers(1 if base == 0 else 0, 256, (O, I))).astype(np.uint16)


ADVERSARIAL = {
    "every word": every_word,
    "every word, 64 rows": lambda rng: every_word(rng)[:64],
    "all in the window": lambda rng: window_words(rng, 5, 192, 60),
    "all in the lowest window (subnormals)": lambda rng: window_words(rng, 3, 64, 0),
    "all in the highest window (infinities, NaNs)": lambda rng: window_words(rng, 4, 128, 120),
    "none in it: +0": lambda rng: np.zeros((3, 64), np.uint16),
    "none in it: -0": lambda rng: np.full((2, 128), 0x8000, np.uint16),
    "none in it: +-0": lambda rng: rng.choice(np.array([0, 0x8000], np.uint16), (7, 64)),
    "+-0 beside the lowest window": lambda rng: np.where(
        rng.random((6, 64)) < 0.5, window_words(rng, 6, 64, 0), rng.choice(np.array([0, 0x8000], np.uint16), (6, 64))
    ),
    "NaN and infinity words": lambda rng: rng.choice(
        np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FFF, 0x3F80], np.uint16), (9, 64)
    ),
    "two windows of as many words": lambda rng: np.concatenate(
        [window_words(rng, 2, 64, 100, sign=False), window_words(rng, 2, 64, 20, sign=False)]
    ),
    "one word a row outside": lambda rng: np.where(
        np.arange(256) == np.arange(11)[:, None] * 23, 0x7F80, window_words(rng, 11, 256, 58)
    ).astype(np.uint16),
    "normal, some special": lambda rng: random_words(rng, 33, 320, special=0.1),
}


@pytest.mark.parametrize("case", ADVERSARIAL)
def test_packing_equals_the_formula_on_adversarial_words(case):
    """The packing is ``packed_words_formula``'s, array for array, and unpacks to the words, bit for bit: every
    word in the window or none (+-0 only), NaN and infinity words (the load's check rejects them, the
    packing stays lossless), every high byte, one row of 64 words or several."""
    bits = ADVERSARIAL[case](np.random.default_rng(sorted(ADVERSARIAL).index(case)))
    packed = numba_cpu.packed_words.pack_words(bits)
    assert_same_packing(packed, packed_words_formula(bits))
    np.testing.assert_array_equal(unpack_words(packed), bits)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1000])
def test_high_byte_counts_count_each_word_once(n):
    """The 8 histograms side by side count each word once, the words past the last 8 too; +-0 not at all
    (the words in one row, as ``_window`` passes them)."""
    rng = np.random.default_rng(n)
    words = rng.choice(np.array([0, 0x8000, 0x0001, 0x8080, 0x3F80, 0xFF80], np.uint16), n)
    words[: n // 2] = rng.integers(0, 1 << 16, n // 2)
    nonzero = (words & 0x7FFF) != 0
    expected = np.bincount((words[nonzero] >> 8) & 0x7F, minlength=128)
    np.testing.assert_array_equal(numba_cpu.packed_words._high_byte_counts(words), expected)


def clustered_words(rng, n, clusters, first):
    """n words whose high bytes (sign aside) lie around the centers of ``clusters`` ((center, spread, weight)),
    the first ``first`` of them around the first cluster's center alone, a few of them +-0."""
    centers, spreads, weights = (np.array(c, np.float64) for c in zip(*clusters, strict=True))
    which = np.where(np.arange(n) < first, 0, rng.choice(len(clusters), n, p=weights / weights.sum()))
    high = np.clip(np.round(centers[which] + spreads[which] * rng.standard_normal(n)), 0, 127).astype(np.uint16)
    words = (high | rng.integers(0, 2, n, dtype=np.uint16) << 7) << 8 | rng.integers(0, 256, n, dtype=np.uint16)
    words[rng.random(n) < 0.01] = 0x8000
    return words


WINDOW_CASES = {
    "one cluster": ([(60, 1.5, 1)], 0),
    "one cluster, narrow": ([(61, 0.3, 1)], 0),
    "subnormals": ([(1, 1.0, 1)], 0),
    "infinities and NaNs": ([(126, 1.0, 1)], 0),
    "a sample that misleads": ([(30, 0.5, 1), (90, 2.0, 20)], 9000),
    "a sample that misleads a little": ([(57, 0.5, 1), (64, 2.0, 20)], 9000),
    "two clusters of as many words": ([(40, 1.0, 1), (50, 1.0, 1)], 0),
    "two clusters a window apart": ([(60, 0.5, 1), (68, 0.5, 1)], 0),
    "one value": ([(64, 0.0, 1)], 0),
    "seven values": ([(64, 2.0, 1)], 0),
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(WINDOW_CASES)), st.integers(0, 40000), st.integers(0, 2**31))
def test_the_window_is_the_one_every_count_gives(case, n, seed):
    """``_window``, from a sample and the counts of a few windows (with every value counted where those
    cannot decide), gives the window every value's count gives: the first of the 8 consecutive high-byte
    values (sign aside) holding the most words (+-0 not counted), and the words it holds; whatever the
    number of words (the last ones past a block of 64 too) and wherever the first words are not like the
    others."""
    clusters, first = WINDOW_CASES[case]
    words = clustered_words(np.random.default_rng(seed), n, clusters, min(first, n))
    counts = np.bincount((words[(words & 0x7FFF) != 0] >> 8) & 0x7F, minlength=128)
    held = [int(counts[b : b + bf16.PACK_WINDOW].sum()) for b in range(128 - bf16.PACK_WINDOW + 1)]
    base, got = numba_cpu.packed_words._window(words.reshape(1, n))
    assert (base, got) == (int(np.argmax(held)), max(held))


def test_a_block_is_stored_in_the_order_the_unpacks_give_back():
    """Place 16 j + 4 k + t holds word 16 k + 4 j + t: a permutation, its own inverse, the packer's too (a
    block of words whose low bytes are their columns); and the words of a block come back in that order from
    the kernel's lane-wise unpacks (a NumPy replay: bytes into words, lanes' low halves then high halves;
    words into floats likewise)."""
    order = bf16.stored_order()
    np.testing.assert_array_equal(np.sort(order), np.arange(64))
    np.testing.assert_array_equal(order[order], np.arange(64))
    columns = np.arange(128, dtype=np.uint16) % 64
    packed = numba_cpu.packed_words.pack_words((0x3F00 | columns | (columns % 2) << 15).reshape(1, 128))
    np.testing.assert_array_equal(packed.low_oi[0], np.tile(order, 2))
    np.testing.assert_array_equal(packed.codes_oh[0] & 15, np.tile(7 | 8 * (order[:32] % 2), 2))
    np.testing.assert_array_equal(packed.codes_oh[0] >> 4, np.tile(7 | 8 * (order[32:] % 2), 2))
    places = np.arange(64).reshape(4, 16)  # [128-bit lane j, byte]: the place each byte holds
    words = [places[:, :8], places[:, 8:]]  # vpunpcklbw, vpunpckhbw: [lane, word]
    floats = [w[:, first : first + 4].reshape(-1) for w in words for first in (0, 4)]  # vpunpck{l,h}wd
    np.testing.assert_array_equal(order[np.concatenate(floats)], np.arange(64))


def test_the_window_holds_the_most_words_and_the_others_are_listed():
    """The 8 high-byte values of the window are the 8 consecutive ones holding the most words (sign aside);
    +0 and -0, an infinity, a subnormal are listed with their exact values, and their place in the dense
    part holds code 0 and low byte 0."""
    rng = np.random.default_rng(3)
    bits = random_words(rng, 8, 128, scale=0.02)
    bits[0, :4] = [0x0000, 0x8000, 0x0000, 0x8000]
    bits[1, 5] = 0x7F80  # +inf
    bits[2, 6] = 0x0001  # the smallest subnormal
    packed = numba_cpu.packed_words.pack_words(bits)
    high = (bits >> 8) & 0x7F
    counts = np.bincount(high[(bits & 0x7FFF) != 0], minlength=128)
    base = packed.high_64[0]
    assert counts[base : base + bf16.PACK_WINDOW].sum() == max(counts[b : b + 8].sum() for b in range(121))
    assert list(packed.high_64[:16]) == [base + k for k in range(8)] + [128 + base + k for k in range(8)]
    np.testing.assert_array_equal(packed.high_64, np.tile(packed.high_64[:16], 4))
    listed = list(zip(packed.rows_e.tolist(), packed.cols_e.tolist(), strict=True))
    assert {(0, 0), (0, 1), (0, 2), (0, 3), (1, 5), (2, 6)} <= set(listed)
    values = dict(zip(listed, packed.values_e.tolist(), strict=True))
    assert values[1, 5] == np.inf and values[2, 6] == 2.0**-133 and values[0, 0] == 0.0
    assert np.signbit(values[0, 1]) and not np.signbit(values[0, 0])
    place = {int(w): p for p, w in enumerate(bf16.stored_order())}[5]  # where word 5 of a block is stored
    assert packed.low_oi[1, place] == 0 and (packed.codes_oh[1, place % 32] >> (4 * (place // 32))) & 15 == 0


@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("O, I", [(1, 64), (37, 128), (256, 1024), (96, 3072)])
@pytest.mark.parametrize("special", [0.0, 0.02])
def test_packed_products_within_the_bound(N, O, I, special):
    """x @ words^T from the packed words, for 1 to 9 rows of x (the 1-row kernel and the 4-row blocks), is
    within (I + 1) eps sum|terms| of the float64 product of the same weights, and non-finite exactly where
    that product is: a NaN stays a NaN, an infinity the same infinity, except that an infinity of x that
    meets a listed word gives NaN (the dense part holds 0 in its place: 0 x inf)."""
    rng = np.random.default_rng(N * 1000 + O + I)
    bits = random_words(rng, O, I, special=special, values=SPECIAL[np.abs(SPECIAL) < 1e30])  # (no float32 overflow)
    x = rng.standard_normal((N, I)).astype(np.float32)
    if special:
        x[0, 3] = np.inf
    out = np.full((N, O), np.nan, np.float32)
    numba_cpu.packed_words._packed_products_into(x, numba_cpu.packed_words.pack_words(bits), out)
    w64, x64 = bf16_bits_to_float32(bits).astype(np.float64), x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        exact, scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(np.isfinite(out), finite)
    assert np.all(np.isnan(out[np.isnan(exact)]))
    np.testing.assert_array_equal(out[np.isinf(out)], exact[np.isinf(out)])
    out, exact = np.where(finite, out, 0), np.where(finite, exact, 0)  # (the non-finite ones compared above)
    assert np.all(np.abs(out - exact)[finite] <= (I + 1) * EPS * scale[finite])


def dense_sums_formula(x, words):
    """The packed kernels' sums, in NumPy: for row n of x and packed row o, lane l (of 32) adds x[n, 64 b + l]
    * word, then x[n, 64 b + 32 + l] * word, block after block, each step one fused multiply-add (the
    product exact in float64, the sum rounded once to float32), then the 32 lanes are summed by halves in
    float32 (0..15 + 16..31, then 0..7 + 8..15...)."""
    N, I = x.shape
    lanes = np.zeros((N, words.shape[0], 32), np.float32)
    for first in range(0, I, 32):
        products = x[:, None, first : first + 32].astype(np.float64) * words[:, first : first + 32]
        lanes = (lanes.astype(np.float64) + products).astype(np.float32)
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes[..., 0]


def line_aligned(rng, N, I):
    """Rows of x starting on 64-byte lines, as the fused step passes them."""
    raw = np.empty(N * I + 16, np.float32)
    first = (-(raw.ctypes.data // 4)) % 16
    x = raw[first : first + N * I].reshape(N, I)
    x[:] = rng.standard_normal((N, I))
    return x


@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("O, I", [(1, 3072), (2, 64), (5, 1024), (37, 3072), (6, 4096)])
def test_batch_products_are_the_formula_and_each_row_alone(N, O, I):
    """For 1 to 9 rows of x, both kernels of ``_packed_products_into`` (two packed rows at a time by spans of
    columns, which for N = 3, 5 or 9 do not divide the row evenly, four rows of x at a time; an odd last
    packed row alone) give
    ``dense_sums_formula``'s bits for words all in the window, and with listed words (+-0, a subnormal, the
    largest values) each row of x the bits it gets alone."""
    pw = numba_cpu.packed_words
    rng = np.random.default_rng(N * 100 + O + I)
    x = line_aligned(rng, N, I)
    for words in (window_words(rng, O, I, 60), random_words(rng, O, I, special=0.05, values=SPECIAL[[0, 1, 5, 6, 7]])):
        packed = pw.pack_words(words)
        out = np.full((N, O), np.nan, np.float32)
        pw._packed_products_into(x, packed, out)
        for n in range(N):
            alone = np.full((1, O), np.nan, np.float32)
            pw._packed_products_into(x[n : n + 1], packed, alone)
            np.testing.assert_array_equal(out[n].view(np.uint32), alone[0].view(np.uint32))
        if packed.rows_e.size == 0:
            expected = dense_sums_formula(x, bf16_bits_to_float32(words).astype(np.float64))
            np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
        else:
            assert packed.rows_e.size > 0  # (the listed words added apart)


WITHOUT_PERMUTES = r"""
import sys
import numpy as np
from refimpl.backends.numba_cpu import packed_words as pw
x, words = np.load(sys.argv[1]), np.load(sys.argv[2])
out = np.full((x.shape[0], words.shape[0]), np.nan, np.float32)
pw._packed_products_into(x, pw.pack_words(words), out)
np.save(sys.argv[3], out)
print(pw.PACKED_COMPILED, pw.PERMUTES_COMPILED)
"""


@pytest.mark.skipif(
    not numba_cpu.packed_words.PERMUTES_COMPILED,
    reason="compiled without AVX512_VBMI: every other test here runs the lookup within 128-bit lanes",
)
def test_the_lookup_within_lanes_gives_the_products_of_the_permutes(tmp_path):
    """Compiled for this processor less AVX512_VBMI (a fresh process, its own cache), the packed kernel looks
    the high bytes up within 128-bit lanes (``_high_bytes``' other branch): for 1, 4 and 5 rows of x, words
    in the window and listed ones, the bits of this process's whole-vector permutes."""
    import llvmlite.binding as llvm

    features = [f for f in llvm.get_host_cpu_features().flatten().split(",") if f != "+avx512vbmi"]
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        NUMBA_CACHE_DIR=str(tmp_path / "cache"),
        NUMBA_CPU_NAME=llvm.get_host_cpu_name(),
        NUMBA_CPU_FEATURES=",".join([*features, "-avx512vbmi", "-prefer-256-bit"]),
    )
    rng = np.random.default_rng(5)
    pw = numba_cpu.packed_words
    for N, O, I, words in (
        (1, 37, 1024, window_words(rng, 37, 1024, 60)),
        (4, 6, 3072, window_words(rng, 6, 3072, 118)),
        (5, 33, 256, random_words(rng, 33, 256, special=0.05, values=SPECIAL[[0, 1, 5, 6, 7]])),
    ):
        x = line_aligned(rng, N, I)
        paths = [tmp_path / name for name in ("x.npy", "words.npy", "out.npy")]
        np.save(paths[0], x)
        np.save(paths[1], words)
        command = [sys.executable, "-c", WITHOUT_PERMUTES, *map(str, paths)]
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0 and run.stdout.split() == ["True", "False"], run.stdout + run.stderr[-3000:]
        here = np.full((N, O), np.nan, np.float32)
        pw._packed_products_into(x, pw.pack_words(words), here)
        np.testing.assert_array_equal(np.load(paths[2]).view(np.uint32), here.view(np.uint32))


def test_linear_reads_a_streamed_matrix_packed_and_keeps_the_packing():
    """``linear`` of a few rows and a read-packed matrix runs the packed kernel on the packing made at its first
    use and kept while the words live (read-only); a matrix not read-packed, columns not a multiple of 64,
    or ``USE_PACKED`` off read the words as they are."""
    rng = np.random.default_rng(5)
    bits = random_words(rng, 64, 128)
    bits.flags.writeable = False
    m = BF16Matrix(bits, read_packed=True)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    first = numba_cpu.packed_words.packed_words(m)
    assert first is not None and numba_cpu.packed_words.packed_words(m) is first
    expect = np.empty((2, 64), np.float32)
    numba_cpu.packed_words._packed_products_into(x, first, expect)
    np.testing.assert_array_equal(numba_cpu.linear.linear(x, m), expect)
    assert numba_cpu.packed_words.packed_words(BF16Matrix(bits)) is None
    assert numba_cpu.packed_words.packed_words(BF16Matrix(np.ascontiguousarray(bits[:, :96]), read_packed=True)) is None


def test_packing_ahead_makes_the_packing_of_the_first_use_once():
    """pack_ahead (a model's load, through backends.prepare_weights): the streamed matrices packed in a
    thread, each exactly as at its first use, and kept: packed_words waits for the thread and hands out
    those; the matrices it cannot pack are left alone."""
    rng = np.random.default_rng(11)
    matrices = []
    for O, I in ((64, 128), (40, 1024), (8, 64)):
        bits = random_words(rng, O, I, special=0.01)
        bits.flags.writeable = False
        matrices.append(BF16Matrix(bits, read_packed=True))
    not_streamed = BF16Matrix(random_words(rng, 8, 64))
    pw = numba_cpu.packed_words
    pw.pack_ahead([*matrices, not_streamed, np.zeros((2, 2), np.float32)])
    assert pw._AHEAD
    packed = [pw.packed_words(m) for m in matrices]
    assert not pw._AHEAD
    for m, p in zip(matrices, packed, strict=True):
        assert pw.packed_words(m) is p
        for got, expected in zip(p, pw.pack_words(m.bits), strict=True):
            np.testing.assert_array_equal(got, expected)
    assert pw.packed_words(not_streamed) is None


def test_matrices_of_one_mapped_buffer_are_packed_in_one_call(monkeypatch):
    """Matrices that are views of one read-only byte buffer (a checkpoint's map) are packed by one call of
    ``_packings`` (one wait for the interpreter's lock): each packing is the one of its first use.  A view
    at an odd byte, and a matrix of another buffer, are packed one by one."""
    rng = np.random.default_rng(12)
    shapes = ((64, 128), (40, 1024), (8, 64))
    parts = [random_words(rng, O, I, special=0.01) for O, I in shapes]
    buffer = np.zeros(3 + sum(p.nbytes for p in parts), np.uint8)  # (3: a view at an odd byte below)
    starts = 2 + np.cumsum([0] + [p.nbytes for p in parts])
    for p, at in zip(parts, starts, strict=False):
        buffer[at : at + p.nbytes] = p.reshape(-1).view(np.uint8)
    buffer.flags.writeable = False
    views = [buffer[at : at + p.nbytes].view(np.uint16).reshape(p.shape) for p, at in zip(parts, starts, strict=False)]
    odd = buffer[1 : 1 + 128].view(np.uint16).reshape(1, 64)  # (a copy's words: packed alone)
    other = random_words(rng, 16, 128)
    other.flags.writeable = False
    matrices = [BF16Matrix(b, read_packed=True) for b in (*views, odd, other)]
    pw = numba_cpu.packed_words
    calls = []
    packings = pw._packings
    monkeypatch.setattr(pw, "_packings", lambda *a: calls.append(a[1].size) or packings(*a))
    monkeypatch.setattr(pw, "_PACKED", {})
    made = []
    weights_array = pw.weights_array
    monkeypatch.setattr(pw, "weights_array", lambda n: made.append(weights_array(n)) or made[-1])
    pw._pack_all(matrices)
    assert calls == [3]
    for m in matrices:
        assert id(m.bits) in pw._PACKED
        assert_same_packing(pw.packed_words(m), packed_words_formula(np.ascontiguousarray(m.bits)))
    dense = made[0]  # (the buffer's low bytes and codes in one array)
    assert all(np.shares_memory(a, dense) for m in matrices[:3] for a in pw.packed_words(m)[:2])


def test_a_packing_lies_in_memory_for_weights(monkeypatch):
    """The low bytes and codes a step reads whole lie in ``host_memory.weights_array`` (huge pages where they are
    enabled), each on a cache line."""
    pw = numba_cpu.packed_words
    made = []
    weights_array = pw.weights_array
    monkeypatch.setattr(pw, "weights_array", lambda n: made.append(weights_array(n)) or made[-1])
    bits = random_words(np.random.default_rng(13), 24, 192, special=0.01)
    packed = pw.pack_words(bits)
    assert len(made) == 1 and made[0].size >= bits.size * 3 // 2
    for part in packed[:2]:
        assert np.shares_memory(part, made[0]) and part.ctypes.data % 64 == 0
    assert_same_packing(packed, packed_words_formula(bits))


def test_a_model_load_packs_the_code_predictor_ahead_on_the_numba_backend(monkeypatch):
    """backends.prepare_weights hands the weights to the backend of the dtype's calls: numba packs them, the
    numpy reference (float64, or asked for) does nothing."""
    handed = []
    monkeypatch.setattr(numba_cpu, "prepare_weights", handed.append)
    kernels.prepare_weights(["w"], np.float32)
    kernels.prepare_weights(["x"], np.float64)
    with kernels.use_backend("numpy"):
        kernels.prepare_weights(["y"], np.float32)
    assert handed == [["w"]]


def test_packing_turned_off_reads_the_words(monkeypatch):
    monkeypatch.setattr(numba_cpu.packed_words, "USE_PACKED", False)
    assert (
        numba_cpu.packed_words.packed_words(
            BF16Matrix(random_words(np.random.default_rng(1), 64, 64), read_packed=True)
        )
        is None
    )


def streamed_layer(layer_view):
    """The layer's matrices marked read_packed (the same words)."""
    from refimpl.io.checkpoint import WeightView

    names = [name for name in layer_view.weights if isinstance(layer_view.weights[name], BF16Matrix)]
    return WeightView(bf16.mark_read_packed(layer_view.weights, names), layer_view.prefix)


@pytest.mark.parametrize("n_cached", [0, 3])
@pytest.mark.parametrize("T", [1, 2])
def test_fused_layer_on_packed_words_equals_the_layer(n_cached, T):
    """The fused layer step of a read-packed layer (every product from packed words) against the composition
    transformer_layer in float32, both measured against the float64 layer of the same bf16 weights: within
    twice the composition's error plus the float32 rounding of the longest reduction (as the words' own
    fused layer, tests/backends/numba_cpu/test_transformer.py); the keys and values cached likewise."""
    C, H, G, D, F = 64, 4, 2, 16, 128
    eps = 1e-6
    results = {}
    for kind in ("packed", "words", "float32", "float64"):
        dtype = np.float64 if kind == "float64" else np.float32
        lw, cfg = random_qwen3_layer(np.random.default_rng(11), C, H, G, D, F, dtype)
        if kind == "packed":
            lw = streamed_layer(lw)
        x = np.random.default_rng(12).standard_normal((1, T, C)).astype(dtype)
        cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, dtype)
        cache = transformer.KVCache(1, G, D, dtype, capacity=4)
        cache.append(*np.random.default_rng(13).standard_normal((2, 1, G, n_cached, D)).astype(dtype))
        cache.reserve(T)
        with kernels.use_backend("numpy"):
            y = layer_step(x, lw, cfg, cos[None], sin[None], cache, eps, fused=kind in ("packed", "words"))
        keys, values = cache.k[:, :, : n_cached + T], cache.v[:, :, : n_cached + T]
        results[kind] = [a.astype(np.float64) for a in (y, keys, values)]
    if T == 1:  # (another kernel's sums: not the words' path)
        assert not np.array_equal(results["packed"][0], results["words"][0])
    for i, what in enumerate(("output", "keys", "values")):
        exact = results["float64"][i]
        floor = 2 * F * EPS * np.max(np.abs(exact))
        bound = 2 * np.max(np.abs(results["float32"][i] - exact)) + floor
        assert np.max(np.abs(results["packed"][i] - exact)) <= bound, what


def test_the_code_predictor_streams_its_layers_and_heads_only():
    """Its layers' products and its heads are marked read_packed; its embeddings, norms and the projection
    from the talker's width are not (they are read by rows, or are vectors, or are one product a frame)."""
    from refimpl.tts.code_predictor import CodePredictorConfig, code_predictor_weight_spec, read_packed_weight_names

    cfg = CodePredictorConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
    names = set(read_packed_weight_names(cfg, talker_hidden=96))
    spec = {s.name for s in code_predictor_weight_spec(cfg, 96)}
    assert names <= spec
    assert {n for n in spec if n.startswith("lm_head.")} <= names
    assert "model.layers.1.mlp.down_proj.weight" in names and "model.layers.0.self_attn.q_proj.weight" in names
    assert not {n for n in names if "embedding" in n or "norm" in n or "small_to_mtp" in n}
