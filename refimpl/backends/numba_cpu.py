"""The CPU twins of the primitives of ``refimpl/nn.py``: same names, same signatures, faster.

Every twin computes what its reference computes (the same formula); only the order of float sums
may differ, and ``tests/backends/test_kernels.py`` bounds that difference from the reduction length.

Two kinds of twin live here:
- Numba kernels, where a loop the compiler vectorises beats NumPy: ``linear`` on bfloat16 weights kept
  as stored (the Talker's matrix-vector products read half the bytes), ``snake_beta`` (NumPy's float32
  sine is scalar code; ours reduces the angle and evaluates a polynomial, in SIMD);
- NumPy rearrangements that save allocations and small matrix products (``conv1d``, ``elu``).

Compiled kernels are cached on disk (``cache=True``): next to this file when that is writable, else
in the user's cache directory (``$XDG_CACHE_HOME/refimpl/numba`` or ``~/.cache/refimpl/numba``), else a
temporary directory; ``NUMBA_CACHE_DIR`` set by the user wins.  Loops use 512-bit vectors where the
processor has them (LLVM prefers 256-bit ones by default, which halves the speed of these loops).
Parallel loops run on Numba's default (OpenMP) threads; ``NUMBA_NUM_THREADS`` sets their number (default:
the cores).  The "workqueue" pool, whose threads sleep between loops, made a generation frame 1.5x slower
here (its wake-up costs more than the 736 small products of a frame can hide; docs/performance.md).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..io.files import user_cache_dir


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _choose_cache_dir() -> None:
    """Set NUMBA_CACHE_DIR where Numba's own choice (this package's __pycache__) is not writable."""
    if os.environ.get("NUMBA_CACHE_DIR") or _writable(Path(__file__).resolve().parent / "__pycache__"):
        return
    user_cache = user_cache_dir()
    base = None if user_cache is None else user_cache / "numba"
    os.environ["NUMBA_CACHE_DIR"] = str(
        base if base is not None and _writable(base) else tempfile.mkdtemp(prefix="refimpl-numba-")
    )


def _prefer_512_bit_vectors() -> None:
    """Let LLVM use the full 512-bit vectors of AVX-512 processors (unless the user set the CPU features)."""
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        return
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_NAME"] = llvm.get_host_cpu_name()
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"


_choose_cache_dir()
_prefer_512_bit_vectors()

import numba  # noqa: E402  (after the settings above, which Numba reads when imported)
from llvmlite import ir  # noqa: E402
from numba import prange  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from .. import nn  # noqa: E402
from .bf16 import BF16Matrix  # noqa: E402


def _discard_damaged_cache() -> None:
    """Numba trusts its cache files: an emptied index or a truncated data file (a full disk, a killed
    writer) would make every later run fail with EOFError or UnpicklingError.  Check this module's entries
    (unpickled as Numba would, a few milliseconds), delete damaged ones with a one-line warning, and let
    Numba compile those kernels again."""
    import pickle
    import warnings

    from numba.core.caching import UserProvidedCacheLocator

    here = Path(__file__).resolve()
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    cache = Path(user_dir) / UserProvidedCacheLocator.get_suitable_cache_subpath(str(here)) if user_dir else None
    cache = cache or here.parent / "__pycache__"
    damaged = []
    for index in sorted(cache.glob(here.stem + ".*.nbi")):
        try:
            with open(index, "rb") as f:
                if pickle.load(f) != numba.__version__:
                    continue  # Numba ignores (and later rewrites) another version's index
                _, overloads = pickle.loads(f.read())
            for name in overloads.values():
                with contextlib.suppress(FileNotFoundError):  # a missing data file is recompiled by Numba
                    pickle.loads((cache / name).read_bytes())
        except FileNotFoundError:
            continue
        except Exception as e:  # any unreadable entry (EOFError, UnpicklingError, ValueError...)
            damaged.append(f"{index.name} ({type(e).__name__})")
            for path in [index, *cache.glob(index.name[: -len(".nbi")] + ".*.nbc")]:
                with contextlib.suppress(OSError):
                    path.unlink()
    if damaged:
        warnings.warn(
            f"discarded damaged Numba cache entries in {cache}: {', '.join(damaged)}; recompiling those kernels",
            RuntimeWarning,
            stacklevel=2,
        )


_discard_damaged_cache()

# float sums may be reassociated (that is what lets a dot product use SIMD lanes) and a multiply-add
# fused; nothing else (no "fast" NaN/inf assumptions)
FASTMATH = {"reassoc", "contract"}

IM2COL_MAX_ROWS = 64  # conv1d stacks its taps when in_channels * kernel_size is at most this


def elu(x, alpha: float = 1.0):
    """``nn.elu`` with one temporary: max(x, 0) + alpha * expm1(min(x, 0)) (one term is always 0)."""
    negative = np.minimum(x, 0)
    np.expm1(negative, out=negative)
    if alpha != 1.0:
        negative *= x.dtype.type(alpha)
    positive = np.maximum(x, 0)
    positive += negative
    return positive


# The Taylor coefficients of sin(r) = r - r^3/3! + r^5/5! - ... up to r^13: on |r| <= pi/2 the first
# omitted term is below (pi/2)^15 / 15! = 6.7e-10, far under float32's rounding (6e-8).
_SIN_TAYLOR = (1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800)


@numba.njit(fastmath=FASTMATH, inline="always")
def _sin_up_to_sign(z):
    """sin(z) up to its sign (enough for sin^2), in float64 for a float32 z: with k the integer nearest
    z / pi, sin(z) = (-1)^k sin(z - k pi) and |z - k pi| <= pi / 2, where a 7-term polynomial is exact
    to float32 precision."""
    zd = np.float64(z)
    r = zd - np.round(zd * (1.0 / np.pi)) * np.pi
    r2 = r * r
    p = _SIN_TAYLOR[6]
    for j in range(5, -1, -1):
        p = p * r2 + _SIN_TAYLOR[j]
    return np.float32(r * p)


@numba.njit(fastmath=FASTMATH, cache=True)
def _snake_beta_f32(x_bct, alpha_c, inv_beta_c, out_bct):
    """One thread: SnakeBeta sits between the codec decoder's BLAS convolutions, and Numba's parallel
    threads would still be spinning while BLAS's run (measured: the whole decode 15% slower)."""
    B, C, T = x_bct.shape
    for bc in range(B * C):
        b, c = bc // C, bc % C
        alpha, inv_beta = alpha_c[c], inv_beta_c[c]
        for t in range(T):
            x = x_bct[b, c, t]
            s = _sin_up_to_sign(alpha * x)
            out_bct[b, c, t] = x + inv_beta * (s * s)


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta``: x + 1 / (beta + 1e-9) * sin(alpha * x)^2.  Float32: one Numba pass (the sine by
    range reduction and a polynomial, vectorised); float64 (explicit backend): the reference."""
    if x_bct.dtype != np.float32:
        return nn.snake_beta.reference(x_bct, log_alpha_c, log_beta_c)
    alpha_c = np.exp(log_alpha_c).astype(np.float32)
    inv_beta_c = (1.0 / (np.exp(log_beta_c) + np.float32(1e-9))).astype(np.float32)
    out_bct = np.empty(x_bct.shape, dtype=np.float32)
    _snake_beta_f32(x_bct, alpha_c, inv_beta_c, out_bct)
    return out_bct


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d`` by one of three arrangements chosen by shape:

    - in_channels x k small (the codec encoder's first convs, at the audio rate): the taps are stacked
      ("im2col", [I * K, T_out]) and multiplied at once, since a product with an inner dimension of a few
      channels is mostly memory traffic;
    - dense: one matrix product per tap, accumulated through one reused buffer;
    - depthwise (groups = channels): a multiply-add per tap, no matrix product at all.
    Other group counts go to the reference."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    end = lambda k: k * dilation + stride * (T_out - 1) + 1  # noqa: E731 - last input index used by tap k, +1
    if groups == 1 and I * K <= IM2COL_MAX_ROWS:
        taps_bikt = np.stack([x_bct[:, :, k * dilation : end(k) : stride] for k in range(K)], axis=2)
        out = np.matmul(w_oik.reshape(O, I * K), taps_bikt.reshape(B, I * K, T_out))
    elif groups == 1:
        out = np.matmul(w_oik[:, :, 0], x_bct[:, :, 0 : end(0) : stride])
        product = np.empty_like(out)  # reused for every further tap
        for k in range(1, K):
            out += np.matmul(w_oik[:, :, k], x_bct[:, :, k * dilation : end(k) : stride], out=product)
    elif groups == C and I == 1 and O == C:
        out = np.zeros((B, O, T_out), dtype=x_bct.dtype)
        for k in range(K):
            out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation : end(k) : stride]
    else:
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    if b_o is not None:
        out += b_o[None, :, None]
    return out


# ----------------------------------------------------------------------------- bfloat16 weights


@intrinsic
def _bf16_to_f32(typingctx, bits):
    """One bfloat16 word -> its float32: the word in the upper half of a 32-bit pattern (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return sig, codegen


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the processor to start loading array[index] into the cache (no effect on the result)."""
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
                ir.Constant(i32, 0),
                ir.Constant(i32, 3),
                ir.Constant(i32, 1),
            ],
        )
        return context.get_dummy_value()

    return sig, codegen


PREFETCH_ROWS_AHEAD = 8  # the weight rows a thread asks for while it multiplies the current one


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _bf16_rows_times(x_ni, bits_oi, out_no):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]): each weight row is read once for all n rows of x.
    Memory-bound: while row o is multiplied, row o + 8 is prefetched, one request per 64-byte line (the
    weights are memory-mapped 4 KB pages, where the hardware prefetcher stops at every page end)."""
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    words = bits_oi.reshape(-1)
    for o in prange(O):
        if o + PREFETCH_ROWS_AHEAD < O:
            for j in range((o + PREFETCH_ROWS_AHEAD) * I, (o + PREFETCH_ROWS_AHEAD + 1) * I, 32):
                _prefetch(words, j)
        for n in range(N):
            acc = np.float32(0.0)
            for i in range(I):
                acc += x_ni[n, i] * _bf16_to_f32(bits_oi[o, i])
            out_no[n, o] = acc


@numba.njit(cache=True)
def _widen_bf16_into(bits_oi, out_oi):
    """out = the float32 values of the bfloat16 words (exact).  One thread: it alternates with BLAS calls,
    and Numba's parallel threads would still be spinning while BLAS's run (measured: 3x slower prompts)."""
    O, I = bits_oi.shape
    for o in range(O):
        for i in range(I):
            out_oi[o, i] = _bf16_to_f32(bits_oi[o, i])


MATVEC_MAX_ROWS = 16  # up to this many rows of x: the bf16 kernel; more: widen blocks, then BLAS
WIDEN_BLOCK_ROWS = 1024  # weight rows widened at a time for BLAS (4 MB of float32 per 1024 x 1024)


def linear(x, w_oi, b_o=None):
    """``nn.linear``.  A ``BF16Matrix`` weight is read as stored: for a few rows of x (a generation step)
    by the Numba kernel, for many (a prompt) by BLAS on blocks of rows widened one block at a time, so
    no float32 copy of the whole matrix ever exists.  Float32 weights go to BLAS as in the reference."""
    if not isinstance(w_oi, BF16Matrix):
        return nn.linear.reference(x, w_oi, b_o)
    O, I = w_oi.shape
    x_ni = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, I)
    if x_ni.shape[0] <= MATVEC_MAX_ROWS:
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _bf16_rows_times(x_ni, w_oi.bits, out_no)
    else:  # each block of output channels is a contiguous block of rows of out_on: BLAS writes it in place
        out_on = np.empty((O, x_ni.shape[0]), dtype=np.float32)
        block_oi = np.empty((min(O, WIDEN_BLOCK_ROWS), I), dtype=np.float32)  # reused for every block
        for start in range(0, O, WIDEN_BLOCK_ROWS):
            stop = min(O, start + WIDEN_BLOCK_ROWS)
            _widen_bf16_into(w_oi.bits[start:stop], block_oi[: stop - start])
            np.matmul(block_oi[: stop - start], x_ni.T, out=out_on[start:stop])
        out_no = np.ascontiguousarray(out_on.T)
    if b_o is not None:
        out_no += b_o
    return out_no.reshape(x.shape[:-1] + (O,))


TWINS = {"elu": elu, "snake_beta": snake_beta, "conv1d": conv1d, "linear": linear}
