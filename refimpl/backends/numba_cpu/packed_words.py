"""Packed words (the code predictor): ``bf16.PackedWords``, a read-packed matrix's words in 12 bits, lossless,
and the products that rebuild them.

A generation step's products are bound by the bytes they read, so a quarter fewer bytes is a quarter less
time where the words are rebuilt faster than memory delivers them: 64 a block by eight to ten 512-bit
instructions (``_rebuilt_words``: one or two byte permutes look up 64 high bytes, unpacks make words and
floats of them), where the same rebuild written as a loop over single words compiled to as many instructions as
it saved in bytes."""

from __future__ import annotations

import contextlib
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ...environment import switch
from ..bf16 import PACK_WINDOW, BF16Matrix, PackedWords, stored_order
from ..host_memory import ALIGNMENT, weights_array
from . import runtime
from .cached_kernels import load_cached
from .intrinsics import FASTMATH, PREFETCH_LOCALITY, _bf16_to_f32
from .kept import _kept_while_read_only, _read_only

PACKED_COMPILED = runtime.machine().packed_compiled  # the 64-byte shuffles of _rebuilt_words
PERMUTES_COMPILED = runtime.machine().permutes_compiled  # _high_bytes by whole-vector byte permutes
USE_PACKED = PACKED_COMPILED and switch("REFIMPL_PACKED")
PACKED_BLOCK = 64  # words a block: the columns of a packed matrix are a multiple of it


@numba.njit(cache=True, nogil=True)  # (nogil: packing ahead runs beside the caller)
def _high_byte_counts(bits_oi):
    """counts[v] = the words whose high byte, sign aside, is v (+0 and -0 not counted: always listed).  The high
    bytes are counted into 8 histograms in turn (no count waits for the one before it to be stored), the sign
    folded in after, and +-0, if any, taken back out of counts[0].  (Summed by loops: an array's ``sum`` would
    make loading this kernel from the cache import Numba's array math, and SciPy's linear algebra with it.)"""
    words = bits_oi.reshape(-1)
    n, counts_sh = words.size, np.zeros((8, 256), np.int64)  # [histogram, high byte]
    for i in range(0, n - n % 8, 8):
        for s in range(8):
            counts_sh[s, words[i + s] >> 8] += 1
    for i in range(n - n % 8, n):
        counts_sh[0, words[i] >> 8] += 1
    counts = np.zeros(128, np.int64)
    for s in range(8):
        for v in range(256):
            counts[v & 127] += counts_sh[s, v]
    if counts[0]:
        for w in words:
            counts[0] -= (w & 0x7FFF) == 0
    return counts


_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _vector(element, n):
    return ir.VectorType(element, n)


_STORED_ORDER = [int(p) for p in stored_order()]  # place p of a block holds word _STORED_ORDER[p]


CANDIDATES = 5  # windows _window weighs exactly: the one best in a sample, and 2 each side
# What _counts_in counts for the windows lo + i (i < CANDIDATES), as ranges (first, width) of a high byte
# (sign aside) less lo - 1 (0 where below): each window's words (lo + i .. lo + i + 7), then the words below
# lo + 7 (the most a window before lo holds) and those from lo + CANDIDATES on (one after them).
RANGES = (*((i + 1, PACK_WINDOW) for i in range(CANDIDATES)), (0, PACK_WINDOW), (CANDIDATES + 1, 128 - CANDIDATES))
SAMPLED = 8192  # words whose histogram places the windows _window weighs


@intrinsic
def _counts_in(typingctx, words, b0, b1, lo, counts):
    """counts[j] += the words of blocks b0 .. b1 - 1 (words 64 b .. 64 b + 63) whose high byte, sign aside,
    less lo - 1 (0 where below; lo >= 1) lies in ``RANGES[j]``.  In 512-bit vectors: a block's 64 high bytes
    tested for each range at once, the 64 bits of each test's mask counted (``popcnt``)."""
    if not (isinstance(words, types.Array) and words.layout == "C" and words.dtype == types.uint16):
        return None
    if not (isinstance(counts, types.Array) and counts.layout == "C" and counts.dtype == types.int64):
        return None
    sig = types.void(words, b0, b1, lo, counts)

    def codegen(context, builder, signature, args):
        w, c = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 4))
        wp = builder.bitcast(w.data, _I8.as_pointer())
        bytes_t, words_t = _vector(_I8, 64), _vector(_I16, 64)

        def splat(value):
            return ir.Constant(bytes_t, [value] * 64)

        below_1 = builder.trunc(builder.sub(args[3], ir.Constant(_I64, 1)), _I8)
        one = builder.insert_element(ir.Constant(_vector(_I8, 1), None), below_1, ir.Constant(_I32, 0))
        below = builder.shuffle_vector(one, one, ir.Constant(_vector(_I32, 64), [0] * 64))  # lo - 1
        saturated_sub = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(bytes_t, [bytes_t] * 2), "llvm.usub.sat.v64i8"
        )
        entry = builder.block
        loop, done = builder.append_basic_block("blocks"), builder.append_basic_block("sums")
        builder.cbranch(builder.icmp_unsigned("<", args[1], args[2]), loop, done)
        builder.position_at_end(loop)
        b = builder.phi(_I64)
        b.add_incoming(args[1], entry)
        kept = [builder.phi(_I64) for _ in RANGES]
        for k in kept:
            k.add_incoming(ir.Constant(_I64, 0), entry)
        at = builder.gep(wp, [builder.mul(b, ir.Constant(_I64, 128))])
        block = builder.load(builder.bitcast(at, words_t.as_pointer()), align=1)
        high = builder.lshr(builder.shl(block, ir.Constant(words_t, [1] * 64)), ir.Constant(words_t, [9] * 64))
        k = builder.call(saturated_sub, [builder.trunc(high, bytes_t), below])
        popcount = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
        new = []
        for s, (first, width) in zip(kept, RANGES, strict=True):
            hit = builder.icmp_unsigned("<", builder.sub(k, splat(first)), splat(width))
            new.append(builder.add(s, builder.call(popcount, [builder.bitcast(hit, _I64)])))
        b_next = builder.add(b, ir.Constant(_I64, 1))
        b.add_incoming(b_next, loop)
        for s, n in zip(kept, new, strict=True):
            s.add_incoming(n, loop)
        builder.cbranch(builder.icmp_unsigned("<", b_next, args[2]), loop, done)
        builder.position_at_end(done)
        totals = [builder.phi(_I64) for _ in new]
        cp = builder.bitcast(c.data, _I64.as_pointer())
        for j, (total, n) in enumerate(zip(totals, new, strict=True)):
            total.add_incoming(ir.Constant(_I64, 0), entry)
            total.add_incoming(n, loop)
            place = builder.gep(cp, [ir.Constant(_I64, j)])
            builder.store(builder.add(builder.load(place), total), place)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)  # (nogil: packing ahead runs beside the caller)
def _window(bits_oi):
    """(base, held): the window base .. base + 7 of high-byte values (sign aside) that holds the most words
    (+-0 not counted; the first such window), and the words it holds: ``_high_byte_counts``'s window, found
    from fewer counts.  The histogram of the first ``SAMPLED`` words names a best window; the words of the
    ``CANDIDATES`` windows around it are counted exactly (``_counts_in``), with bounds on what any window
    before or after them can hold.  Where no window outside can hold more (before them: as many), the best
    of them is the one; else every value is counted."""
    words = bits_oi.reshape(-1)
    n, W, C = words.size, PACK_WINDOW, CANDIDATES
    sampled, _ = _best_window(_high_byte_counts(words[:SAMPLED]))
    lo = min(max(sampled - C // 2, 1), 128 - W - C + 1)  # the windows lo .. lo + C - 1
    counts = np.zeros(len(RANGES), np.int64)
    blocks = n // 64
    _counts_in(words, 0, blocks, lo, counts)
    for i in range(64 * blocks, n):
        k = max((words[i] >> 8) & 0x7F, lo - 1) - (lo - 1)
        for j in range(len(RANGES)):
            counts[j] += RANGES[j][0] <= k < RANGES[j][0] + RANGES[j][1]
    best = 0
    for j in range(1, C):
        if counts[j] > counts[best]:  # (the first of the most)
            best = j
    held = counts[best]
    before, after = counts[C], counts[C + 1]
    if before < held and (lo + C > 128 - W or after <= held):
        return lo + best, held
    return _best_window(_high_byte_counts(words))  # (the words in one row, as above: one compiled kind)


@numba.njit(nogil=True)
def _best_window(counts):
    """(b, held): the first b where counts[b : b + PACK_WINDOW] holds the most, and what it holds.  (Summed by
    loops, as in ``_high_byte_counts``.)"""
    best, held = 0, -1
    for b in range(counts.size - PACK_WINDOW + 1):
        total = 0
        for v in range(b, b + PACK_WINDOW):
            total += counts[v]
        if total > held:
            best, held = b, total
    return best, held


@intrinsic
def _pack_block(typingctx, bits_i, b, base, low_i, codes_h):
    """Pack block b (words 64 b .. 64 b + 63) of one row into ``PackedWords``' dense part, and return the
    mask of its listed words (bit t: word 64 b + t).  Word w is held where its high byte, sign aside, is
    base + k with k < 8 and w & 0x7FFF is not 0: code k | (sign << 3) and low byte w & 0xFF; a listed word
    gets code 0 and low byte 0.  In 512-bit vectors: the 64 words' codes and low bytes computed side by
    side, put in ``stored_order`` by one shuffle each, the codes of places j and 32 + j joined in byte j."""
    rows = ((bits_i, types.uint16), (low_i, types.uint8), (codes_h, types.uint8))
    if not all(isinstance(a, types.Array) and a.layout == "C" and a.dtype == dtype for a, dtype in rows):
        return None  # (contiguous rows of these types only: read and written through their data pointers)
    sig = types.int64(bits_i, b, base, low_i, codes_h)

    def codegen(context, builder, signature, args):
        bits, low, codes = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 3, 4))
        byte_ptr = _I8.as_pointer()
        bp, lp, cp = (builder.bitcast(a.data, byte_ptr) for a in (bits, low, codes))

        def at(pointer, bytes_a_block, ty):
            return builder.bitcast(
                builder.gep(pointer, [builder.mul(args[1], ir.Constant(_I64, bytes_a_block))]), ty.as_pointer()
            )

        def splat(ty, value, n=64):
            return ir.Constant(_vector(ty, n), [value] * n)

        words = builder.load(at(bp, 128, _vector(_I16, 64)), align=1)
        base_1 = builder.insert_element(
            ir.Constant(_vector(_I16, 1), None), builder.trunc(args[2], _I16), ir.Constant(_I32, 0)
        )
        bases = builder.shuffle_vector(base_1, base_1, ir.Constant(_vector(_I32, 64), [0] * 64))
        k = builder.sub(builder.and_(builder.lshr(words, splat(_I16, 8)), splat(_I16, 0x7F)), bases)
        held = builder.and_(
            builder.icmp_unsigned("<", k, splat(_I16, PACK_WINDOW)),
            builder.icmp_unsigned("!=", builder.and_(words, splat(_I16, 0x7FFF)), splat(_I16, 0)),
        )
        code = builder.or_(k, builder.shl(builder.lshr(words, splat(_I16, 15)), splat(_I16, 3)))
        no_bytes = splat(_I8, 0)
        code_bytes = builder.select(held, builder.trunc(code, _vector(_I8, 64)), no_bytes)
        low_bytes = builder.select(held, builder.trunc(words, _vector(_I8, 64)), no_bytes)

        def stored(v, places):
            return builder.shuffle_vector(v, v, ir.Constant(_vector(_I32, len(places)), places))

        builder.store(stored(low_bytes, _STORED_ORDER), at(lp, 64, _vector(_I8, 64)), align=1)
        low_nibbles, high_nibbles = stored(code_bytes, _STORED_ORDER[:32]), stored(code_bytes, _STORED_ORDER[32:])
        joined = builder.or_(low_nibbles, builder.shl(high_nibbles, splat(_I8, 4, 32)))
        builder.store(joined, at(cp, 32, _vector(_I8, 32)), align=1)
        listed = builder.xor(held, ir.Constant(_vector(ir.IntType(1), 64), [1] * 64))
        return builder.bitcast(listed, _I64)

    return sig, codegen


@numba.njit(cache=True, nogil=True)  # (nogil: packing ahead runs beside the caller)
def _packing(bits_oi, low_oi, codes_oh):
    """The window's base and the low bytes, codes and listed words of ``PackedWords`` of the words [O, I]
    (C-contiguous), in one call (one kernel to load in a fresh process): the window (``_window``), then the
    arrays (``_pack_and_list_rows``), the low bytes and codes written into ``low_oi`` [O, I] and ``codes_oh``
    [O, I / 2] (the caller's memory: ``_dense_part``)."""
    O, I = bits_oi.shape
    base, held = _window(bits_oi)
    E = O * I - held  # the words outside the window, and +-0
    rows_e, cols_e, values_e = np.empty(E, np.int32), np.empty(E, np.int32), np.empty(E, np.float32)
    _pack_and_list_rows(bits_oi, base, low_oi, codes_oh, rows_e, cols_e, values_e)
    return base, low_oi, codes_oh, rows_e, cols_e, values_e


@numba.njit(nogil=True)
def _pack_and_list_rows(bits_oi, base, low_oi, codes_oh, rows_e, cols_e, values_e):
    """``PackedWords`` of the words [O, I] (C-contiguous) for the window base .. base + 7, in one pass: each
    block's dense part by ``_pack_block``, then the words it lists (row by row in column order): their row,
    column and float32 value."""
    O, I = bits_oi.shape
    e = 0
    for o in range(O):
        bits_i, low_i, codes_h = bits_oi[o], low_oi[o], codes_oh[o]
        for b in range(I // 64):
            listed = _pack_block(bits_i, b, base, low_i, codes_h)
            if listed:
                for t in range(64):
                    if (listed >> t) & 1:
                        rows_e[e], cols_e[e], values_e[e] = o, 64 * b + t, _bf16_to_f32(bits_i[64 * b + t])
                        e += 1


@numba.njit(cache=True, nogil=True)  # (nogil: packing ahead runs beside the caller)
def _packings(words_n, first_m, shape_m2, dense_b, dense_first_m):
    """``_packing`` of each matrix m of one buffer's words: the [O, I] = ``shape_m2[m]`` words from
    ``words_n[first_m[m]]`` on, its low bytes and codes in ``dense_b`` from byte ``dense_first_m[m]`` on
    (``_dense_places``), in one call (a thread that packs ahead then needs the interpreter's lock at its
    start and its end only, while the load beside it holds that lock for long stretches)."""
    packings = []
    for m in range(first_m.size):
        O, I = shape_m2[m, 0], shape_m2[m, 1]
        at = dense_first_m[m]
        low_oi = dense_b[at : at + O * I].reshape((O, I))
        codes_oh = dense_b[at + O * I : at + O * I + O * I // 2].reshape((O, I // 2))
        packings.append(_packing(words_n[first_m[m] : first_m[m] + O * I].reshape((O, I)), low_oi, codes_oh))
    return packings


def _dense_places(shapes) -> tuple:
    """(the first byte of each matrix's dense part, the bytes of all) for matrices of ``shapes`` [O, I] packed
    into one array: each matrix's low bytes [O, I] and then its codes [O, I / 2], from a cache line."""
    firsts, total = [], 0
    for O, I in shapes:
        firsts.append(total)
        total += -(-(O * I + O * I // 2) // ALIGNMENT) * ALIGNMENT
    return np.array(firsts, np.int64), total


def _dense_part(shapes) -> tuple:
    """(the array, the first byte of each matrix's part) that holds the low bytes and codes of matrices of
    ``shapes``: the words every code-predictor step reads whole, in memory collapsed into huge pages once
    generations have made their first frames (``host_memory.weights_array``)."""
    firsts, total = _dense_places(shapes)
    return weights_array(max(total, 1)), firsts


def pack_words(bits_oi) -> PackedWords:
    """``bf16.PackedWords`` of the words [O, I] (I a multiple of ``PACKED_BLOCK``): the window of 8 high-byte
    values (sign aside) that holds the most words, the others listed."""
    bits_oi = np.ascontiguousarray(bits_oi)
    O, I = bits_oi.shape
    dense_b, _ = _dense_part([(O, I)])
    low_oi, codes_oh = dense_b[: O * I].reshape(O, I), dense_b[O * I : O * I + O * I // 2].reshape(O, I // 2)
    return _packed_words(*_packing(bits_oi, low_oi, codes_oh))


def _packed_words(base, low_oi, codes_oh, rows_e, cols_e, values_e) -> PackedWords:
    """The ``PackedWords`` of what ``_packing`` returns (the codes' 16 high bytes: sign and window value)."""
    high_16 = [(c // 8) << 7 | (base + c % 8) for c in range(16)]
    return PackedWords(low_oi, codes_oh, np.array(high_16 * 4, np.uint8), rows_e, cols_e, values_e)


def _words_of_one_buffer(matrices: list) -> tuple:
    """(the buffer's words, the matrices in it, the first word of each, the other matrices) for the
    matrices whose words are C-contiguous views of the read-only byte buffer that holds the first one's (a
    checkpoint's memory map); (None, [], [], matrices) where the first one's words are not such a view.  A
    view's first word is its distance in bytes from the buffer's start, halved (both addresses even)."""
    root = _outermost(matrices[0].bits)
    if not (root.dtype == np.uint8 and root.ndim == 1 and root.flags.c_contiguous and _read_only(root)):
        return None, [], [], matrices
    start = root.__array_interface__["data"][0]
    inside, firsts, others = [], [], []
    for m in matrices:
        offset = m.bits.__array_interface__["data"][0] - start
        if _outermost(m.bits) is root and m.bits.flags.c_contiguous and start % 2 == 0 and offset % 2 == 0:
            inside.append(m)
            firsts.append(offset // 2)
        else:
            others.append(m)
    if not inside:
        return None, [], [], matrices
    return root[: root.size // 2 * 2].view(np.uint16), inside, firsts, others


def _outermost(array: np.ndarray) -> np.ndarray:
    """The array that ``array`` is a view of, through every view between (``array`` itself if none)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


_PACKED: dict = {}  # id of a read-only read-packed matrix's words -> (a weak reference to them, PackedWords)


def packed_words(m: BF16Matrix):
    """The ``PackedWords`` of a read-packed matrix, made at its first use (or ahead of it: ``pack_ahead``) and
    kept while its words live (``_kept_while_read_only``), or None where the backend reads its words as they
    are (packing turned off with ``REFIMPL_PACKED=0`` or not compiled for, a matrix not read-packed or of
    columns not a multiple of ``PACKED_BLOCK``)."""
    if not _packable(m):
        return None
    if _AHEAD:
        _wait_for_packing_ahead()
    return _kept_while_read_only(_PACKED, m.bits, pack_words)


def _packable(m) -> bool:
    return (
        USE_PACKED
        and isinstance(m, BF16Matrix)
        and m.read_packed
        and isinstance(m.bits, np.ndarray)
        and m.shape[1] % PACKED_BLOCK == 0
    )


_AHEAD: list = []  # the threads of pack_ahead still packing


def pack_ahead(matrices) -> None:
    """Pack the read-packed matrices of ``matrices`` now, in a thread, while the caller goes on (a model's load
    calls it: the packing of the code predictor then runs beside the rest of the load instead of before the
    first frame; its kernel is loaded first, here).  ``packed_words`` waits for it, so
    every matrix is packed once, the same packing as at its first use; a packing that fails there is left
    to the first use (which raises)."""
    todo = [m for m in matrices if _packable(m)]
    if todo:
        # its kernel loaded here: in the thread, its load waited for the lock that the model's load holds
        # (a Numba without the internals load_cached uses: the thread's call loads it, as before)
        with contextlib.suppress(Exception):
            load_cached(_packings)
        thread = threading.Thread(target=_pack_all, args=(todo,), name="refimpl-packing", daemon=True)
        _AHEAD.append(thread)
        thread.start()


def _pack_all(matrices: list) -> None:
    """Pack ``matrices`` (read-packed) and keep each packing: those of one buffer in one call (``_packings``),
    the others one by one."""
    try:
        while matrices:
            words_n, inside, firsts, matrices = _words_of_one_buffer(matrices)
            if words_n is None:
                _kept_while_read_only(_PACKED, matrices[0].bits, pack_words)
                matrices = matrices[1:]
                continue
            shapes = np.array([m.shape for m in inside], np.int64).reshape(-1, 2)
            dense_b, dense_firsts = _dense_part(shapes.tolist())
            packings = _packings(words_n, np.array(firsts, np.int64), shapes, dense_b, dense_firsts)
            for m, packing in zip(inside, packings, strict=True):
                _kept_while_read_only(_PACKED, m.bits, lambda _, packing=packing: _packed_words(*packing))
    except Exception:  # (MemoryError...): the first use packs what is left, and raises
        return


def _wait_for_packing_ahead() -> None:
    for thread in list(_AHEAD):
        if thread is not threading.current_thread():
            thread.join()
            if thread in _AHEAD:
                _AHEAD.remove(thread)


def _high_bytes(builder, table, packed):
    """The 64 high bytes of a block: ``table`` (its 16 high bytes in each 128-bit lane) looked up by the 64
    codes of the block's 32 code bytes (their low nibbles, places 0..31, then their high nibbles, 32..63).
    With AVX512_VBMI (``PERMUTES_COMPILED``) in two instructions: ``vpmultishiftqb`` takes each code from
    the 32 bytes read into both halves of a vector (byte b from bit 8 (b % 8) + 4 (b >= 32) of its 64-bit
    lane: its code in the low four bits, the next code's bits above them), ``vpermb`` looks the 64 up by
    their low six bits (the table is the same in each 16 of them, so the two bits above the code choose
    among equal entries).  Else the nibbles are split by a mask and a shift, joined, and looked up within
    each 128-bit lane (``vpshufb``)."""
    bytes_t = _vector(_I8, 64)
    if PERMUTES_COMPILED:
        both_halves = builder.shuffle_vector(packed, packed, ir.Constant(_vector(_I32, 64), list(range(32)) * 2))
        multishift, permute = (
            cgutils.get_or_insert_function(builder.module, ir.FunctionType(bytes_t, [bytes_t] * 2), name)
            for name in ("llvm.x86.avx512.pmultishift.qb.512", "llvm.x86.avx512.permvar.qi.512")
        )
        from_bits = ir.Constant(bytes_t, [8 * (b % 8) + 4 * (b >= 32) for b in range(64)])
        return builder.call(permute, [table, builder.call(multishift, [from_bits, both_halves])])
    shuffle_fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(bytes_t, [bytes_t] * 2), "llvm.x86.avx512.pshuf.b.512"
    )
    low_nibbles = builder.and_(packed, ir.Constant(_vector(_I8, 32), [15] * 32))
    high_nibbles = builder.lshr(packed, ir.Constant(_vector(_I8, 32), [4] * 32))
    codes64 = builder.shuffle_vector(low_nibbles, high_nibbles, ir.Constant(_vector(_I32, 64), list(range(64))))
    return builder.call(shuffle_fn, [table, codes64])


def _rebuilt_words(builder, table, packed, low_bytes):
    """The 64 float32 words of a block from its 32 code bytes and 64 low bytes, as the two halves a row's sum
    takes in turn (words 0..31, 32..63: ``SUM_LANES`` each; ``_row_dots_intrinsic``, ``_pair_dots_intrinsic``):
    the high bytes looked up (``_high_bytes``), then low and high bytes unpacked into words and the words,
    above zero words, into float32, within 128-bit lanes (in ``bf16.stored_order``)."""
    high_bytes = _high_bytes(builder, table, packed)
    halves = []  # words of bytes 0..7, then 8..15 of each 128-bit lane (vpunpcklbw, vpunpckhbw)
    for first in (0, 8):
        mask = [k for j in range(4) for i in range(first, first + 8) for k in (16 * j + i, 64 + 16 * j + i)]
        pairs = builder.shuffle_vector(low_bytes, high_bytes, ir.Constant(_vector(_I32, 64), mask))
        halves.append(builder.bitcast(pairs, _vector(_I16, 32)))
    no_words = ir.Constant(_vector(_I16, 32), [0] * 32)
    quarters = []  # each word above a zero word: its float32 (vpunpcklwd, vpunpckhwd)
    for words in halves:
        for first in (0, 4):
            mask = [k for j in range(4) for i in range(first, first + 4) for k in (i, 32 + 8 * j + i)]
            widened = builder.shuffle_vector(no_words, words, ir.Constant(_vector(_I32, 32), mask))
            quarters.append(builder.bitcast(widened, _vector(_F32, 16)))
    return [builder.shuffle_vector(a, b, ir.Constant(_vector(_I32, 32), list(range(32)))) for a, b in
            (quarters[:2], quarters[2:])]  # fmt: skip


def _fma(builder, lanes: int):
    """LLVM's fused multiply-add of ``lanes`` float32 lanes."""
    return cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_vector(_F32, lanes), [_vector(_F32, lanes)] * 3), f"llvm.fma.v{lanes}f32"
    )


SUM_LANES = 32  # lanes of a row's sum: a block's 64 products added in two halves, words 0..31 then 32..63


def _block_halves(builder, v):
    """x's 64 columns of a block (64 float32 lanes) as two halves of ``SUM_LANES``, as the words come."""
    return [
        builder.shuffle_vector(v, v, ir.Constant(_vector(_I32, SUM_LANES), list(range(first, first + SUM_LANES))))
        for first in (0, SUM_LANES)
    ]


def _block_added(builder, x_halves, w_halves, total):
    """total + a block's 64 products in ``SUM_LANES`` lanes: lane l adds x[l] w[l], then x[32 + l] w[32 + l],
    each one fused multiply-add (32 lanes, not 64: four rows' sums for two packed rows fit the registers)."""
    for xh, wh in zip(x_halves, w_halves, strict=True):
        total = builder.call(_fma(builder, SUM_LANES), [xh, wh, total])
    return total


def _lanes_summed(builder, total):
    """The sum of a vector's lanes by halves: lanes 0..15 + 16..31, then 0..7 + 8..15, ..."""
    s, width = total, total.type.count
    while width > 1:
        width //= 2
        lo = builder.shuffle_vector(s, s, ir.Constant(_vector(_I32, width), list(range(width))))
        hi = builder.shuffle_vector(s, s, ir.Constant(_vector(_I32, width), list(range(width, 2 * width))))
        s = builder.fadd(lo, hi)
    return builder.extract_element(s, ir.Constant(_I32, 0))


def _row_dots_intrinsic(R: int):
    """An intrinsic ``(x_ni, n0, low_i, codes_h, high_64, out_no, o)``: out[n0 + r, o] = sum_i x[n0 + r, i] *
    word_i for r < R, the words of one packed row (its dense part: the listed words are added apart) rebuilt
    64 at a time in 512-bit vectors: the 32 code bytes taken as 64 codes (low nibbles, high nibbles) and the
    64 high bytes looked up (``_high_bytes``: the 16-entry table in each 128-bit lane), low and high bytes
    unpacked into words and the words, above zero words, into float32 (the bf16 widening), both within
    128-bit lanes (``vpunpck*``: fewer instructions than across the whole vector; the block's
    words are stored in the order this gives back, ``bf16.stored_order``), and each row's 64 products
    added into ``SUM_LANES`` lanes (``_block_added``), the lanes summed by halves at the end."""

    @intrinsic
    def row_dots(typingctx, x_ni, n0, low_i, codes_h, high_64, out_no, o):
        sig = types.void(x_ni, n0, low_i, codes_h, high_64, out_no, o)

        def codegen(context, builder, signature, args):
            x, low, codes, high, out = (
                context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2, 3, 4, 5)
            )
            byte_ptr = _I8.as_pointer()
            xp, lp, cp, hp = (builder.bitcast(a.data, byte_ptr) for a in (x, low, codes, high))
            x_row_bytes = builder.extract_value(x.strides, 0)
            blocks = builder.udiv(builder.extract_value(low.shape, 0), ir.Constant(_I64, 64))

            def load(pointer, offset, ty):
                return builder.load(builder.bitcast(builder.gep(pointer, [offset]), ty.as_pointer()), align=1)

            table = load(hp, ir.Constant(_I64, 0), _vector(_I8, 64))
            rows = [builder.mul(builder.add(args[1], ir.Constant(_I64, r)), x_row_bytes) for r in range(R)]
            zero = ir.Constant(_vector(_F32, SUM_LANES), [0.0] * SUM_LANES)
            entry = builder.block
            loop, done = builder.append_basic_block("blocks"), builder.append_basic_block("sums")
            builder.cbranch(builder.icmp_unsigned(">", blocks, ir.Constant(_I64, 0)), loop, done)
            builder.position_at_end(loop)
            b = builder.phi(_I64)
            sums = [builder.phi(_vector(_F32, SUM_LANES)) for _ in range(R)]
            b.add_incoming(ir.Constant(_I64, 0), entry)
            for s in sums:
                s.add_incoming(zero, entry)
            packed = load(cp, builder.mul(b, ir.Constant(_I64, 32)), _vector(_I8, 32))
            low_bytes = load(lp, builder.mul(b, ir.Constant(_I64, 64)), _vector(_I8, 64))
            w_halves = _rebuilt_words(builder, table, packed, low_bytes)
            column_bytes = builder.mul(b, ir.Constant(_I64, 256))
            new_sums = []
            for r in range(R):
                xv = load(xp, builder.add(rows[r], column_bytes), _vector(_F32, 64))
                new_sums.append(_block_added(builder, _block_halves(builder, xv), w_halves, sums[r]))
            b_next = builder.add(b, ir.Constant(_I64, 1))
            b.add_incoming(b_next, loop)
            for s, t in zip(sums, new_sums, strict=True):
                s.add_incoming(t, loop)
            builder.cbranch(builder.icmp_unsigned("<", b_next, blocks), loop, done)
            builder.position_at_end(done)
            totals = [builder.phi(_vector(_F32, SUM_LANES)) for _ in range(R)]  # (the phis first in the block)
            for total, t in zip(totals, new_sums, strict=True):
                total.add_incoming(zero, entry)
                total.add_incoming(t, loop)
            out_row_bytes = builder.extract_value(out.strides, 0)
            out_at = builder.mul(args[6], ir.Constant(_I64, 4))
            op = builder.bitcast(out.data, byte_ptr)
            for r, total in enumerate(totals):
                value = _lanes_summed(builder, total)
                at = builder.add(builder.mul(builder.add(args[1], ir.Constant(_I64, r)), out_row_bytes), out_at)
                builder.store(value, builder.bitcast(builder.gep(op, [at]), _F32.as_pointer()))
            return context.get_dummy_value()

        return sig, codegen

    return row_dots


_row_dots_1, _row_dots_2, _row_dots_3, _row_dots_4 = (_row_dots_intrinsic(R) for R in (1, 2, 3, 4))


@numba.njit(inline="always")
def _packed_row_dots(x_ni, low_i, codes_h, high_64, out_no, o):
    """out[n, o] = x[n] . (row o's dense words) for every row n of x, four rows of x at a time."""
    N = x_ni.shape[0]
    for n0 in range(0, N, 4):
        R = min(4, N - n0)
        if R == 4:
            _row_dots_4(x_ni, n0, low_i, codes_h, high_64, out_no, o)
        elif R == 3:
            _row_dots_3(x_ni, n0, low_i, codes_h, high_64, out_no, o)
        elif R == 2:
            _row_dots_2(x_ni, n0, low_i, codes_h, high_64, out_no, o)
        else:
            _row_dots_1(x_ni, n0, low_i, codes_h, high_64, out_no, o)


PAIR = 2  # packed rows a batch's kernel multiplies at a time: each load of x serves both


def _pair_dots_intrinsic(R: int):
    """An intrinsic ``(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, o_ahead, b0, b1, sums_k)``: for rows
    n0 + r (r < R) of x and the packed rows o0 and o0 + 1, ``_row_dots_intrinsic``'s sums over the blocks
    b0 <= b < b1 (each lane's products in the same order, the lanes summed by halves the same way: the same
    bits), so that each load of x serves two rows of words.  A later span of a row's blocks (b0 > 0) goes on
    from the ``SUM_LANES`` lanes of each sum left in ``sums_k`` ([p, r, lane], float32), a span before the
    last leaves them there, the last one sums them into out[n0 + r, o0 + p].  Rows o_ahead and o_ahead + 1's
    blocks b0 .. b1 - 1 are asked for meanwhile, one request a block (not a burst a row: beside a batch's
    arithmetic, measured faster)."""
    lanes_t = _vector(_F32, SUM_LANES)

    @intrinsic
    def pair_dots(typingctx, x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, o_ahead, b0, b1, sums_k):
        sig = types.void(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, o_ahead, b0, b1, sums_k)

        def codegen(context, builder, signature, args):
            arrays = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2, 3, 4, 5, 10))
            x, low, codes, high, out, kept = arrays
            byte_ptr = _I8.as_pointer()
            xp, lp, cp, hp, op, kp = (builder.bitcast(a.data, byte_ptr) for a in (x, low, codes, high, out, kept))
            blocks = builder.udiv(builder.extract_value(low.shape, 1), ir.Constant(_I64, 64))
            first_block, end_block = args[8], args[9]

            def at(pointer, offset, ty):
                return builder.bitcast(builder.gep(pointer, [offset]), ty.as_pointer())

            def load(pointer, offset, ty):
                return builder.load(at(pointer, offset, ty), align=1)

            def times(value, k):
                return builder.mul(value, ir.Constant(_I64, k))

            def row_at(array, first, k):  # the byte offset of row first + k
                return builder.mul(builder.add(first, ir.Constant(_I64, k)), builder.extract_value(array.strides, 0))

            def kept_at(p, r):
                return ir.Constant(_I64, 4 * (p * R + r) * SUM_LANES)

            table = load(hp, ir.Constant(_I64, 0), _vector(_I8, 64))
            prefetch_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, _I32, _I32, _I32]), "llvm.prefetch.p0i8"
            )
            prefetch_args = [ir.Constant(_I32, k) for k in (0, PREFETCH_LOCALITY, 1)]  # a read, of data
            x_rows = [row_at(x, args[1], r) for r in range(R)]
            low_rows, code_rows = ([row_at(a, args[6], p) for p in range(PAIR)] for a in (low, codes))
            ahead = [(pt, row_at(a, args[7], p), size) for pt, a, size in ((lp, low, 64), (cp, codes, 32))
                     for p in range(PAIR)]  # fmt: skip
            zero = ir.Constant(lanes_t, [0.0] * SUM_LANES)
            entry = builder.block  # where b0 > 0, the sums go on from those kept (a branch: else never read)
            carry, start = builder.append_basic_block("carry"), builder.append_basic_block("start")
            builder.cbranch(builder.icmp_unsigned(">", first_block, ir.Constant(_I64, 0)), carry, start)
            builder.position_at_end(carry)
            loaded = [[load(kp, kept_at(p, r), lanes_t) for r in range(R)] for p in range(PAIR)]
            builder.branch(start)
            builder.position_at_end(start)
            starts = [[builder.phi(lanes_t) for _ in range(R)] for _ in range(PAIR)]
            for p in range(PAIR):
                for r in range(R):
                    starts[p][r].add_incoming(zero, entry)
                    starts[p][r].add_incoming(loaded[p][r], carry)
            loop, done = builder.append_basic_block("blocks"), builder.append_basic_block("sums")
            builder.cbranch(builder.icmp_unsigned("<", first_block, end_block), loop, done)
            builder.position_at_end(loop)
            b = builder.phi(_I64)
            b.add_incoming(first_block, start)
            sums = [[builder.phi(lanes_t) for _ in range(R)] for _ in range(PAIR)]
            for p in range(PAIR):
                for r in range(R):
                    sums[p][r].add_incoming(starts[p][r], start)
            for pointer, row, size in ahead:
                builder.call(prefetch_fn, [builder.gep(pointer, [builder.add(row, times(b, size))]), *prefetch_args])
            ws = []
            for p in range(PAIR):
                packed = load(cp, builder.add(code_rows[p], times(b, 32)), _vector(_I8, 32))
                low_bytes = load(lp, builder.add(low_rows[p], times(b, 64)), _vector(_I8, 64))
                ws.append(_rebuilt_words(builder, table, packed, low_bytes))
            column_bytes = times(b, 256)
            new_sums = [[None] * R for _ in range(PAIR)]
            for r in range(R):
                xv = _block_halves(builder, load(xp, builder.add(x_rows[r], column_bytes), _vector(_F32, 64)))
                for p in range(PAIR):
                    new_sums[p][r] = _block_added(builder, xv, ws[p], sums[p][r])
            b_next = builder.add(b, ir.Constant(_I64, 1))
            b.add_incoming(b_next, loop)
            for p in range(PAIR):
                for r in range(R):
                    sums[p][r].add_incoming(new_sums[p][r], loop)
            builder.cbranch(builder.icmp_unsigned("<", b_next, end_block), loop, done)
            builder.position_at_end(done)
            totals = [[builder.phi(lanes_t) for _ in range(R)] for _ in range(PAIR)]
            for p in range(PAIR):
                for r in range(R):
                    totals[p][r].add_incoming(starts[p][r], start)
                    totals[p][r].add_incoming(new_sums[p][r], loop)
            with builder.if_else(builder.icmp_unsigned("<", end_block, blocks)) as (more, last):
                with more:  # the sums kept for the next span
                    for p in range(PAIR):
                        for r in range(R):
                            builder.store(totals[p][r], at(kp, kept_at(p, r), lanes_t), align=1)
                with last:
                    for p in range(PAIR):
                        for r in range(R):
                            place = builder.add(
                                row_at(out, args[1], r), times(builder.add(args[6], ir.Constant(_I64, p)), 4)
                            )
                            builder.store(_lanes_summed(builder, totals[p][r]), at(op, place, _F32))
            return context.get_dummy_value()

        return sig, codegen

    return pair_dots


_pair_dots_1, _pair_dots_2, _pair_dots_3, _pair_dots_4 = (_pair_dots_intrinsic(R) for R in (1, 2, 3, 4))


@numba.njit(inline="always")
def _packed_pair_dots(x_ni, low_oi, codes_oh, high_64, out_no, o0, o_ahead, b0, b1, sums_gk):
    """``_pair_dots_intrinsic`` for every row of x, four at a time (group g's sums kept in ``sums_gk[g]``);
    rows o_ahead and o_ahead + 1 asked for by the first group."""
    N = x_ni.shape[0]
    for n0 in range(0, N, 4):
        R, ahead, sums_k = min(4, N - n0), o_ahead if n0 == 0 else o0, sums_gk[n0 // 4]
        if R == 4:
            _pair_dots_4(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, ahead, b0, b1, sums_k)
        elif R == 3:
            _pair_dots_3(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, ahead, b0, b1, sums_k)
        elif R == 2:
            _pair_dots_2(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, ahead, b0, b1, sums_k)
        else:
            _pair_dots_1(x_ni, n0, low_oi, codes_oh, high_64, out_no, o0, ahead, b0, b1, sums_k)


SPAN_X_BYTES = 16 << 10  # columns a span: at most this many bytes of x (first-level cache)
BAND_PAIRS = 4  # pairs of packed rows that take a span in turn (their sums kept between spans)
PIECES = 32  # the pairs' bands are shared out in this many pieces (each allocates its buffers once)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _packed_products_into(x_ni, packed, out_no):
    """out = x @ words^T for a packed matrix (``bf16.PackedWords``) and a few rows of x (C-contiguous
    float32: a step's, one text's or a batch's), parallel over the weight rows, each read once for all rows
    of x; then for each listed word its product added and the placeholder's taken back out, in their order
    (row by row in the parallel loop, they were slower).  The columns by spans of ``SPAN_X_BYTES`` of x,
    which stay in the first-level cache while ``BAND_PAIRS`` pairs of packed rows take the span
    (``_pair_dots_intrinsic``, four rows of x at a time: each load of x serves two packed rows, and each sum
    is the one the row of x gets alone, the same bits); an odd last packed row by ``_packed_row_dots``."""
    low_oi, codes_oh, high_64, rows_e, cols_e, values_e = packed
    O, I = low_oi.shape
    N = x_ni.shape[0]
    blocks, pairs, groups = I // PACKED_BLOCK, O // PAIR, (N + 3) // 4
    span = max(1, SPAN_X_BYTES // (N * 4 * PACKED_BLOCK))  # blocks a span (fewer than the row's)
    bands = (pairs + BAND_PAIRS - 1) // BAND_PAIRS
    for piece in prange(PIECES):
        sums_qgk = np.empty((BAND_PAIRS, groups, PAIR * 4 * SUM_LANES), np.float32)  # [pair, group, (p, r, lane)]
        for band in range(piece * bands // PIECES, (piece + 1) * bands // PIECES):
            q0, q1 = band * BAND_PAIRS, min(pairs, (band + 1) * BAND_PAIRS)
            for b0 in range(0, blocks, span):
                b1 = min(blocks, b0 + span)
                for q in range(q0, q1):
                    o0 = PAIR * q
                    o_ahead = min(o0 + PAIR * BAND_PAIRS, O - PAIR)  # (the same span of the next band)
                    _packed_pair_dots(x_ni, low_oi, codes_oh, high_64, out_no, o0, o_ahead, b0, b1, sums_qgk[q - q0])
    if O % PAIR:  # (the last row, unpaired)
        _packed_row_dots(x_ni, low_oi[O - 1], codes_oh[O - 1], high_64, out_no, O - 1)
    placeholder = _bf16_to_f32(np.uint16(high_64[0]) << np.uint16(8))  # (a listed word's place, code 0)
    for e in range(rows_e.shape[0]):
        o, c, v = rows_e[e], cols_e[e], values_e[e]
        for n in range(x_ni.shape[0]):
            out_no[n, o] += x_ni[n, c] * v - x_ni[n, c] * placeholder
