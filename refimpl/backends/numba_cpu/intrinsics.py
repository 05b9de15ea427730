"""What the kernels share below the operations: the compile flags (``FASTMATH``), bit casts between float32
and bfloat16 words, a float32 exp and expm1 in plain arithmetic (so that the loops calling them vectorise),
requests to prefetch memory, rows that start on cache lines, and vectors of 16 float32 lanes whose sums keep
one order on every processor (the bf16 dot products of a generation step)."""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

# float sums may be reassociated (that is what lets a dot product use SIMD lanes) and a multiply-add
# fused; nothing else (no "fast" NaN/inf assumptions)
FASTMATH = {"reassoc", "contract"}


# bit casts between float32 and bfloat16 words
@intrinsic
def _bf16_to_f32(typingctx, bits):
    """One bfloat16 word -> its float32: the word in the upper half of a 32-bit pattern (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (``2 ** n`` from ``(n + 127) * 2 ** 23``)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _bits_of(typingctx, value):
    """The 32-bit pattern of a float32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


# exp and expm1 in plain arithmetic
_LOG2E = np.float32(1.4426950408889634)


_LN2_PARTS = (np.float32(0.693359375), np.float32(-2.12194440e-4))  # ln 2 = sum: the first exact in 9 bits
_EXP_R = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2))
_EXP_R += (np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))  # (Cephes' expf, by S. L. Moshier)


@numba.njit(fastmath={"contract"}, inline="always")
def _exp_f32(x):
    """exp(x) for float32 in plain arithmetic, so that the loops calling it vectorise (Numba's np.exp is
    a scalar libm call): x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, the product with the
    first exact), exp(r) = 1 + r + r^2 P(r) with the degree-5 P of Cephes' expf, times 2^n built from
    exponent bits in two factors (2^n alone would overflow at n = 128 or be subnormal below -126).  Within
    1 ulp of exp (tested); inf above 88.72, 0 below -103.97, subnormals between, NaN stays NaN.  Inlined,
    it takes its caller's flags: call it from code compiled without reassociation, as the reduction's
    order is what makes r exact."""
    xc = min(max(x, np.float32(-104.0)), np.float32(88.75))
    n = np.floor(xc * _LOG2E + np.float32(0.5))
    r = (xc - n * _LN2_PARTS[0]) - n * _LN2_PARTS[1]
    p = ((((_EXP_R[0] * r + _EXP_R[1]) * r + _EXP_R[2]) * r + _EXP_R[3]) * r + _EXP_R[4]) * r + _EXP_R[5]
    y = (p * (r * r) + r) + np.float32(1.0)
    half = np.floor(n * np.float32(0.5))
    y = y * _f32_from_bits((np.int32(half) + np.int32(127)) * np.int32(1 << 23))
    y = y * _f32_from_bits((np.int32(n - half) + np.int32(127)) * np.int32(1 << 23))
    y = np.float32(np.inf) if x > np.float32(88.72283935546875) else y
    y = np.float32(0.0) if x < np.float32(-103.972084) else y
    return x if x != x else y


_EXPM1_TAYLOR = tuple(np.float32(1.0 / math.factorial(k)) for k in range(2, 11))  # 1/2!, ..., 1/10!


@numba.njit(fastmath={"contract"}, inline="always")
def _expm1_f32(x):
    """exp(x) - 1 for float32 x <= 0 in plain arithmetic, so that the loops calling it vectorise (NumPy's
    expm1 is a call the tiles' pieces would have to make from Python): for -0.5 <= x <= 0 the Taylor series
    to x^10 / 10! (its remainder below 2^-32 of the result), x + x^2 (1/2 + x (1/6 + ...)); below, exp(x) - 1
    with ``_exp_f32`` (the result at least 0.39 in size, so exp's ulp is at most 2.6 of the result's).  NaN
    stays NaN.  Inlined, it takes its caller's flags: call it from code compiled without reassociation."""
    q = _EXPM1_TAYLOR[8]
    for i in range(7, -1, -1):
        q = q * x + _EXPM1_TAYLOR[i]
    small = x + (x * x) * q
    return small if x >= np.float32(-0.5) or x != x else _exp_f32(x) - np.float32(1.0)


# prefetch requests
PREFETCH_LOCALITY = 2  # LLVM's locality 2: prefetcht1, into level 2 (3 would be prefetcht0, into level 1)


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the processor to start loading array[index] into its level-2 cache (``prefetcht1``; no effect
    on the result).  Into level 1 instead (``prefetcht0``), a generation frame measured slower."""
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        ptr = cgutils.get_item_pointer(
            context,
            builder,
            signature.args[0],
            context.make_array(signature.args[0])(context, builder, args[0]),
            [args[1]],
            wraparound=False,
        )
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(
            fn,
            [
                builder.bitcast(ptr, ir.IntType(8).as_pointer()),
                ir.Constant(i32, 0),  # a read
                ir.Constant(i32, PREFETCH_LOCALITY),
                ir.Constant(i32, 1),  # of data
            ],
        )
        return context.get_dummy_value()

    return sig, codegen


PREFETCH_ROWS_AHEAD = 8  # the weight rows a thread asks for while it multiplies the current one


@numba.njit(inline="always")
def _prefetch_row(words, I, o):
    """Ask for the 64-byte lines of weight row o of the flat words of a matrix with I columns."""
    for j in range(o * I, (o + 1) * I, 32):
        _prefetch(words, j)


# rows on cache lines
CACHE_LINE_FLOATS = 16  # 64 bytes: one 16-lane vector


@numba.njit(inline="always")
def _line_aligned_empty(rows, cols):
    """float32 [rows, cols], C-contiguous, starting on a 64-byte boundary (Numba's own arrays start on 32:
    then every 16-lane load from a row whose length is a multiple of 16 spans two cache lines)."""
    raw = np.empty(rows * cols + CACHE_LINE_FLOATS, dtype=np.float32)
    first = (CACHE_LINE_FLOATS - raw.ctypes.data // 4 % CACHE_LINE_FLOATS) % CACHE_LINE_FLOATS
    return raw[first : first + rows * cols].reshape(rows, cols)


@numba.njit(inline="always")
def _line_aligned_rows(x_ni):
    """x itself where each of its rows starts on a 64-byte boundary, else a copy whose rows do (their
    length rounded up to 16 floats; the copy's [:, :I] holds x)."""
    N, I = x_ni.shape
    if x_ni.ctypes.data % 64 == 0 and I % CACHE_LINE_FLOATS == 0:
        return x_ni
    out = _line_aligned_empty(N, (I + CACHE_LINE_FLOATS - 1) // CACHE_LINE_FLOATS * CACHE_LINE_FLOATS)
    for n in range(N):
        for i in range(I):
            out[n, i] = x_ni[n, i]
    return out


@numba.njit(cache=True, nogil=True)
def _rows_on_cache_lines(x_ni):
    """``_line_aligned_rows`` for Python callers, compiled once into the cache (the inlined helper called
    from Python would be compiled again in every process)."""
    return _line_aligned_rows(x_ni)


# vectors of 16 float32 lanes, for kernels that keep their sums in registers
class _F32x16(types.Type):
    """The Numba type of 16 float32 lanes held as one value (an LLVM ``<16 x float>``: a 512-bit register
    where the processor has AVX-512, else two or four narrower ones)."""

    def __init__(self):
        super().__init__(name="f32x16")


F32X16 = _F32x16()
_VECTOR = ir.VectorType(ir.FloatType(), 16)


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR)


@intrinsic
def _v16_zeros(typingctx):
    """16 lanes of 0.0."""

    def codegen(context, builder, signature, args):
        return ir.Constant(_VECTOR, None)

    return F32X16(), codegen


def _lane_pointer(context, builder, aryty, array, index, vector=_VECTOR):
    """A pointer to ``vector`` (``<16 x float>``) at array[index] of a 1-D array (no bounds check)."""
    ary = context.make_array(aryty)(context, builder, array)
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [index], wraparound=False)
    return builder.bitcast(ptr, vector.as_pointer())


@intrinsic
def _v16_load(typingctx, array, index):
    """array[index : index + 16] of a 1-D float32 array as 16 lanes (no bounds check: the caller's)."""

    def codegen(context, builder, signature, args):
        return builder.load(_lane_pointer(context, builder, signature.args[0], args[0], args[1]), align=4)

    return F32X16(array, index), codegen


@intrinsic
def _v16_store(typingctx, array, index, lanes):
    """array[index : index + 16] = the 16 lanes (no bounds check: the caller's)."""

    def codegen(context, builder, signature, args):
        builder.store(args[2], _lane_pointer(context, builder, signature.args[0], args[0], args[1]), align=4)
        return context.get_dummy_value()

    return types.void(array, index, lanes), codegen


def _fma_lanes(builder, a, b, c):
    """a * b + c in each of 16 lanes, one rounding (``llvm.fma.v16f32``)."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), "llvm.fma.v16f32")
    return builder.call(fma, [a, b, c])


@intrinsic
def _v16_fma(typingctx, sums, lanes, scalar):
    """sums + lanes * scalar in each lane, one rounding (a fused multiply-add)."""

    def codegen(context, builder, signature, args):
        one = builder.insert_element(ir.Constant(_VECTOR, None), args[2], ir.Constant(ir.IntType(32), 0))
        wide = builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), 16), None))
        return _fma_lanes(builder, args[1], wide, args[0])

    return F32X16(sums, lanes, types.float32), codegen


_I32 = ir.IntType(32)
_WORDS = ir.VectorType(ir.IntType(16), 16)  # 16 bfloat16 words


@intrinsic
def _v16_widen_bf16(typingctx, words, index):
    """words[index : index + 16] of a 1-D array of bfloat16 words as 16 float32 lanes (exact; no bounds check:
    the caller's)."""

    def codegen(context, builder, signature, args):
        pointer = _lane_pointer(context, builder, signature.args[0], args[0], args[1], _WORDS)
        words16 = builder.load(pointer, align=2)
        wide = builder.zext(words16, ir.VectorType(_I32, 16))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.VectorType(_I32, 16), [16] * 16)), _VECTOR)

    return F32X16(words, index), codegen


@intrinsic
def _v16_fma_lanes(typingctx, sums, a, b):
    """sums + a * b lane by lane, one rounding (a fused multiply-add)."""

    def codegen(context, builder, signature, args):
        return _fma_lanes(builder, args[1], args[2], args[0])

    return F32X16(sums, a, b), codegen


@intrinsic
def _v16_add(typingctx, a, b):
    """a + b lane by lane."""

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return F32X16(a, b), codegen


@intrinsic
def _v16_sum(typingctx, lanes):
    """The sum of the 16 lanes in one fixed order, halves added: lane l + lane l + 8, then l + 4, l + 2, l + 1
    (the instructions carry no fast-math flag: LLVM keeps the order on every processor)."""

    def codegen(context, builder, signature, args):
        v, n = args[0], 16
        while n > 1:
            lower = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n // 2), list(range(n // 2))))
            upper = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n // 2), list(range(n // 2, n))))
            v, n = builder.fadd(lower, upper), n // 2
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return types.float32(lanes), codegen


@intrinsic
def _f32_fma(typingctx, a, b, c):
    """a * b + c, one rounding, never reordered with the sums around it (an ``llvm.fma`` call)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fma, list(args))

    return sig, codegen
