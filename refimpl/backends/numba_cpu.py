"""The CPU twins of the primitives of ``refimpl/nn.py``: same names, same signatures, faster.

Every twin computes what its reference computes (the same formula); only the order of float sums
may differ, and ``tests/backends/test_kernels.py`` bounds that difference from the reduction length.

Two kinds of twin live here:
- for generation, Numba kernels on bfloat16 weights kept as stored (the Talker's and the code predictor's
  matrix-vector products read half the bytes): ``linear``, ``decoder_layer_step`` and a step's whole stack in
  one call (``decoder_stack_step``), on Numba's parallel loops, and a prompt's products on the AMX tile
  registers where the processor has them (and the codec decoder's residual units and the encoder's residual
  blocks: float32 products on exact bf16 parts; and the speaker encoder's TDNNs, Res2Nets and pooling conv
  where its weights are bf16 values, as released; a model's read-only weights are laid out for the tiles
  once and kept, ``_kept_while_read_only``); the code predictor's matrices, read whole 15 times a frame,
  from a lossless copy of their words in 12 bits each (``bf16.PackedWords``, ``packed_words``);
- for the codecs, pieces of time that run side by side on Python threads, BLAS held to one thread per call
  meanwhile (``run_pieces``): ``conv1d`` and ``conv_transpose1d`` as one matrix product per piece, the
  decoder's residual unit and the encoder's residual block each in one call, SnakeBeta (NumPy's float32
  sine is scalar code; ours reduces the angle and evaluates a polynomial, in SIMD), ELU and the erf GELU.
A twin returns ``NotImplemented`` for a call it has no kernel for (float64, another pad mode): the reference
runs then.

Compiled kernels are cached on disk (``cache=True``): next to this file when that is writable, else
in the user's cache directory (``$XDG_CACHE_HOME/refimpl/numba`` or ``~/.cache/refimpl/numba``), else a
temporary directory; ``NUMBA_CACHE_DIR`` set by the user wins.  Loops use 512-bit vectors where the
processor has them (LLVM prefers 256-bit ones by default, which halves the speed of these loops).
Parallel loops run on Numba's default (OpenMP) threads; ``NUMBA_NUM_THREADS`` sets their number (default:
the cores).  The "workqueue" pool, whose threads sleep between loops, made a generation frame 1.5x slower
here (its wake-up costs more than the 850 small parallel loops of a frame can hide; docs/performance.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import operator
import os
import platform
import sys
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import scipy.special
import threadpoolctl

from ..environment import switch
from ..io.files import user_cache_dir
from . import BackendUnavailable
from .host_memory import new_output


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
    """Let LLVM use the full 512-bit vectors of AVX-512 processors (unless the user set the CPU features).
    Numba reads the setting when it is imported; a program that imported it before this module has its
    configuration read again (its first compilation has not happened yet in a program that compiles nothing
    of its own first: a script importing numba first ran a 20-frame generation in 3.8 s against 3.25 s)."""
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        return
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_NAME"] = llvm.get_host_cpu_name()
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
        if "numba" in sys.modules:  # imported before us: read the environment again
            sys.modules["numba"].core.config.reload_config()


# The Numba settings checked before Numba reads them (docs/limits.md#the-environment).  Numba itself warns
# with a traceback and goes on without a value it cannot parse; 100,000 threads crash its thread pool
# (segmentation fault); a feature without its + or - fails an LLVM assertion, which aborts the process; an
# unknown processor or feature makes LLVM print a warning at every compilation (and an unknown processor
# without +64bit in the features is a fatal LLVM error).
CHECKED_SETTINGS = (
    "NUMBA_DISABLE_JIT",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "NUMBA_CPU_NAME",
    "NUMBA_CPU_FEATURES",
)
THREADING_LAYERS = ("default", "safe", "forksafe", "threadsafe", "tbb", "omp", "workqueue")  # Numba's names
MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))


def _check_numba_settings() -> None:
    """One ValueError naming the variable for a Numba setting this backend cannot run with; an empty one is
    removed (unset, as for the REFIMPL_ switches: Numba would warn that it cannot parse it)."""
    import re

    for name in CHECKED_SETTINGS:
        if name in os.environ and not os.environ[name].strip():
            del os.environ[name]
    env = os.environ
    for name in ("NUMBA_DISABLE_JIT", "NUMBA_NUM_THREADS"):
        if name in env:
            try:
                int(env[name])  # as Numba reads them
            except ValueError:
                raise ValueError(f"environment variable {name}={env[name][:40]!r} is not a whole number") from None
    if "NUMBA_NUM_THREADS" in env and not 1 <= int(env["NUMBA_NUM_THREADS"]) <= MAX_THREADS:
        raise ValueError(
            f"environment variable NUMBA_NUM_THREADS={env['NUMBA_NUM_THREADS']!r}: the numba backend runs 1 to "
            f"{MAX_THREADS} threads"
        )
    if "NUMBA_THREADING_LAYER" in env and env["NUMBA_THREADING_LAYER"] not in THREADING_LAYERS:
        raise ValueError(
            f"environment variable NUMBA_THREADING_LAYER={env['NUMBA_THREADING_LAYER'][:40]!r} is not one of "
            f"Numba's threading layers ({', '.join(THREADING_LAYERS)})"
        )
    features = env.get("NUMBA_CPU_FEATURES")
    if features is not None and not all(re.fullmatch(r"[+-][A-Za-z0-9_.-]+", f) for f in features.split(",")):
        raise ValueError(
            f"environment variable NUMBA_CPU_FEATURES={features[:60]!r}: a comma-separated list of +feature and "
            "-feature (e.g. +avx2,-prefer-256-bit)"
        )
    if "NUMBA_CPU_NAME" in env or features is not None:
        complaint = _llvm_complaint(env.get("NUMBA_CPU_NAME"), features)
        if complaint:
            name = "NUMBA_CPU_NAME" if "processor" in complaint else "NUMBA_CPU_FEATURES"
            raise ValueError(f"environment variable {name}={env[name][:60]!r}: LLVM says {complaint!r}")


def _llvm_complaint(cpu: str | None, features: str | None) -> str | None:
    """LLVM's warning about processor ``cpu`` with ``features`` (None: the host's), or None if it knows
    both.  LLVM writes the warning on file descriptor 2 when the target machine is made; it is caught there."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    cpu = cpu if cpu is not None else llvm.get_host_cpu_name()
    features = features if features is not None else llvm.get_host_cpu_features().flatten()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error: nothing to catch the warning with
        return None
    with tempfile.TemporaryFile() as caught:
        try:
            sys.stderr.flush()
            os.dup2(caught.fileno(), 2)
            llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        lines = caught.read(1 << 16).decode("utf-8", "replace").splitlines()
    return next((line for line in lines if "not a recognized" in line), None)


_check_numba_settings()
_choose_cache_dir()
_prefer_512_bit_vectors()

import numba  # noqa: E402  (after the settings above, which Numba reads when imported)
from llvmlite import ir  # noqa: E402
from numba import prange  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic, overload  # noqa: E402

from .. import nn  # noqa: E402
from .bf16 import PACK_WINDOW, BF16Matrix, PackedWords  # noqa: E402


def available() -> None:
    """BackendUnavailable when Numba does not compile: ``NUMBA_DISABLE_JIT`` (its debugging switch, or
    ``disable_jit`` in a ``.numba_config.yaml``) makes every kernel run as Python, and the twins' intrinsics
    (bit casts, vector shuffles, tile instructions) cannot run as Python."""
    if numba.config.DISABLE_JIT:
        raise BackendUnavailable(
            "backend 'numba': Numba's JIT is turned off (NUMBA_DISABLE_JIT), and the numba kernels cannot run "
            "as Python (unset NUMBA_DISABLE_JIT to use them)"
        )


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


def _survive_unwritable_cache() -> None:
    """Numba (outside Windows) lets an OSError from writing a cache entry escape from the call that compiled
    the kernel: a full disk, a file-size limit or a cache directory made read-only would fail a decode whose
    kernel was compiled and ready.  For this package's kernels, a save that fails is skipped with a one-line
    warning (the kernel runs; the next process compiles it again); Numba's own write leaves no partial file
    (a temporary file renamed into place, removed on failure)."""
    import warnings

    from numba.core.caching import Cache

    save = Cache.save_overload
    if getattr(save, "refimpl_guard", False):
        return

    def save_overload(self, sig, data):
        if not getattr(self._py_func, "__module__", "").startswith("refimpl."):
            return save(self, sig, data)
        try:
            return save(self, sig, data)
        except OSError as e:
            warnings.warn(
                f"could not write the compiled {self._py_func.__name__} into Numba's cache ({e}); it runs, and is "
                "compiled again by the next process",
                RuntimeWarning,
                stacklevel=2,
            )

    save_overload.refimpl_guard = True
    Cache.save_overload = save_overload


_survive_unwritable_cache()

# float sums may be reassociated (that is what lets a dot product use SIMD lanes) and a multiply-add
# fused; nothing else (no "fast" NaN/inf assumptions)
FASTMATH = {"reassoc", "contract"}


ELEMENTWISE_PIECE = 1 << 18  # samples per piece of an elementwise twin (a megabyte of float32)


def _elementwise_in_pieces(x, into):
    """A new array y with ``into(x_piece, y_piece)`` for pieces of ``ELEMENTWISE_PIECE`` samples of x
    (flattened), side by side (``run_pieces``: NumPy's and SciPy's ufuncs release the GIL), each piece's
    passes in the cache."""
    x = np.ascontiguousarray(x)
    flat, out = x.reshape(-1), new_output(x.shape, x.dtype)
    out_flat, n = out.reshape(-1), ELEMENTWISE_PIECE

    def piece(i0):
        into(flat[i0 : i0 + n], out_flat[i0 : i0 + n])

    run_pieces(piece, [(i0,) for i0 in range(0, flat.size, n)])
    return out


def elu(x, alpha: float = 1.0):
    """``nn.elu`` as max(x, 0) + alpha * expm1(min(x, 0)) (one term is always 0: the same bits), in pieces."""
    a = x.dtype.type(alpha)
    return _elementwise_in_pieces(x, lambda xs, ys: _elu_into(xs, a, ys))


def _elu_into(x, alpha, out) -> None:
    """out = max(x, 0) + alpha * expm1(min(x, 0)) (``out`` may be ``x``)."""
    negative = np.minimum(x, 0)
    np.expm1(negative, out=negative)
    if alpha != 1.0:
        negative *= alpha
    np.maximum(x, 0, out=out)
    out += negative


def softmax(x, axis: int = -1):
    """``nn.softmax`` over the last axis of a host float array: the reference itself on pieces of rows side by
    side (``run_pieces``), each piece's three arrays in the cache, into one output (the same bits; 1.7
    against 3.4 ms for 1536 x 937)."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim == 0 or x.size == 0:
        return NotImplemented
    if axis not in (-1, x.ndim - 1):
        return NotImplemented
    x = np.ascontiguousarray(x)
    rows_rt, out = x.reshape(-1, x.shape[-1]), new_output(x.shape, x.dtype)
    out_rt, n = out.reshape(rows_rt.shape), max(1, ELEMENTWISE_PIECE // x.shape[-1])

    def piece(r0):
        out_rt[r0 : r0 + n] = nn.softmax.reference(rows_rt[r0 : r0 + n], axis=-1)

    run_pieces(piece, [(r0,) for r0 in range(0, rows_rt.shape[0], n)])
    return out


PAIRWISE_BLOCK = 128  # NumPy's pairwise summation: blocks of up to 128 values, each with 8 accumulators


@numba.njit(inline="always")
def _pairwise_block(a, lo, n):
    """sum(a[lo : lo + n]) for n <= PAIRWISE_BLOCK as NumPy adds it: under 8 values one after another; else
    8 interleaved sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the values past
    the last multiple of 8."""
    if n < 8:
        total = np.float32(-0.0)
        for i in range(n):
            total += a[lo + i]
        return total
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0, r1, r2, r3 = r0 + a[lo + i], r1 + a[lo + i + 1], r2 + a[lo + i + 2], r3 + a[lo + i + 3]
        r4, r5, r6, r7 = r4 + a[lo + i + 4], r5 + a[lo + i + 5], r6 + a[lo + i + 6], r7 + a[lo + i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += a[lo + i]
        i += 1
    return total


@numba.njit(cache=True, nogil=True)
def _pairwise_sum(a, lo, n):
    """sum(a[lo : lo + n]) as NumPy's float32 ``np.add.reduce`` of a contiguous row adds it, so with its bits:
    a row longer than PAIRWISE_BLOCK is split in two at a multiple of 8 near its middle, each half summed
    so, then the halves added; up to PAIRWISE_BLOCK values ``_pairwise_block``.  NumPy's recursion written
    as a loop over a stack of pieces (a recursive Numba function breaks in the on-disk cache): a piece
    (kind 0) is summed or split into its halves and a combination (kind 1), which adds the last two sums."""
    lo_s, n_s, kind_s = np.empty(128, np.int64), np.empty(128, np.int64), np.empty(128, np.int64)
    sums = np.empty(64, dtype=np.float32)
    lo_s[0], n_s[0], kind_s[0], top, done = lo, n, 0, 1, 0
    while top > 0:
        top -= 1
        p_lo, p_n, kind = lo_s[top], n_s[top], kind_s[top]
        if kind == 1:  # both halves summed: their sum replaces them
            sums[done - 2] = sums[done - 2] + sums[done - 1]
            done -= 1
        elif p_n <= PAIRWISE_BLOCK:
            sums[done] = _pairwise_block(a, p_lo, p_n)
            done += 1
        else:  # the left half first: pushed last
            half = p_n // 2
            half -= half % 8
            lo_s[top], n_s[top], kind_s[top] = 0, 0, 1
            lo_s[top + 1], n_s[top + 1], kind_s[top + 1] = p_lo + half, p_n - half, 0
            lo_s[top + 2], n_s[top + 2], kind_s[top + 2] = p_lo, half, 0
            top += 3
    return sums[0]


@numba.njit(cache=True, nogil=True)
def _rms_norm_rows(x_rc, w_c, eps, out_rc):
    """out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for each row, float32 step by step without fused
    multiply-adds, the mean NumPy's (``_pairwise_sum`` of the squares, divided by the row length): the
    reference's operations in its order, its bits."""
    R, C = x_rc.shape
    squares_c = np.empty(C, dtype=np.float32)
    for r in range(R):
        x_c, out_c = x_rc[r], out_rc[r]
        for c in range(C):
            squares_c[c] = x_c[c] * x_c[c]
        root = np.sqrt(_pairwise_sum(squares_c, 0, C) / np.float32(C) + eps)
        for c in range(C):
            out_c[c] = w_c[c] * (x_c[c] / root)


def rms_norm(x, w, eps: float):
    """``nn.rms_norm`` for float32 host arrays, C-contiguous, and a weight of the last axis's length: one
    compiled pass per row with the reference's bits (``_rms_norm_rows``), rows in pieces side by side
    when there are many.  A generation step's norm after its stack was six small NumPy calls, 121 us a
    code predictor step (its caches cold after the layers' weights streamed through)."""
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in (x, w)) or x.ndim == 0:
        return NotImplemented
    if not x.flags.c_contiguous or w.shape != x.shape[-1:] or x.size == 0:
        return NotImplemented  # (another layout sums in another order in NumPy; a broadcast weight: the reference)
    rows_rc, out = x.reshape(-1, x.shape[-1]), np.empty(x.shape, np.float32)
    out_rc, w_c, eps32 = out.reshape(rows_rc.shape), np.ascontiguousarray(w), np.float32(eps)
    n = max(1, ELEMENTWISE_PIECE // x.shape[-1])
    if rows_rc.shape[0] <= n:
        _rms_norm_rows(rows_rc, w_c, eps32, out_rc)
        return out

    def piece(r0):
        _rms_norm_rows(rows_rc[r0 : r0 + n], w_c, eps32, out_rc[r0 : r0 + n])

    run_pieces(piece, [(r0,) for r0 in range(0, rows_rc.shape[0], n)])
    return out


def gelu_erf(x):
    """``nn.gelu_erf``, 0.5 * x * (1 + erf(x / sqrt(2))), in pieces, each the reference's float32
    operations in its order.  Float32: erf by ``_erf_f64`` in a Numba loop (``_gelu_erf_into``; SciPy's
    erf, one value at a time, took 11 ns a value, most of the time of the codecs' GELU MLPs); float64 (the
    explicit backend): SciPy's erf, the reference's bits."""
    scale = x.dtype.type(1.0 / math.sqrt(2.0))
    if x.dtype == np.float32:
        return _elementwise_in_pieces(x, lambda xs, ys: _gelu_erf_into(xs, scale, ys))

    def into(xs, ys):
        scipy.special.erf(xs * scale, out=ys)
        ys += 1.0
        ys *= 0.5 * xs

    return _elementwise_in_pieces(x, into)


# erf(y) / y as a polynomial in u = y^2 / 8 - 1 (y in [-4, 4] -> u in [-1, 1]): degree 22, fitted to SciPy's
# float64 erf at 6000 Chebyshev nodes and written in powers of u; on [0, 4] it is within 4e-13 of SciPy's erf
# (float32's spacing near 1 is 6e-8).  Beyond |y| = 4 the float32 erf is +-1, which erf(4) = 1 - 1.5e-8 rounds to.
_ERF_OVER_Y = (
    0.35353099564338725,
    -0.17657623330398098,
    0.1316751168997239,
    -0.10771044230009358,
    0.09020899387405061,
    -0.07472787165302433,
    0.05988690940399517,
    -0.045765039993557174,
    0.03306059027452971,
    -0.022474034087925025,
    0.014349838413858671,
    -0.008604344628029009,
    0.004852696242802761,
    -0.0025830604519514306,
    0.0012946133243498192,
    -0.0006048223275941489,
    0.00027243411757647975,
    -0.0001265267302709192,
    5.100337955390545e-05,
    -1.262079199503938e-05,
    4.864389730743955e-06,
    -4.589206373019714e-06,
    1.5256570218429972e-06,
)


_ERF_PARTS = (_ERF_OVER_Y[0:8], _ERF_OVER_Y[8:16], _ERF_OVER_Y[16:] + (0.0,))  # 8 powers of u each


@numba.njit(fastmath={"contract"}, inline="always")
def _horner_8(c, u):
    """c[0] + c[1] u + ... + c[7] u^7."""
    p = c[7]
    for j in range(6, -1, -1):
        p = p * u + c[j]
    return p


@numba.njit(fastmath={"contract"}, inline="always")
def _erf_f64(y):
    """erf(y) in float64 to about 4e-13, for y clamped to [-4, 4]: the polynomial in three parts of 8
    powers, P0 + u^8 (P1 + u^8 P2) (a Horner loop over all 23 is not unrolled, and the loop over the values
    then does not vectorise: 5.9 against 0.88 ns a value)."""
    y = min(max(y, -4.0), 4.0)
    u = y * y * 0.125 - 1.0
    u8 = ((u * u) * (u * u)) * ((u * u) * (u * u))
    low, mid, high = _ERF_PARTS
    return y * (_horner_8(low, u) + u8 * (_horner_8(mid, u) + u8 * _horner_8(high, u)))


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _gelu_erf_into(x, scale, out):
    """out = (1 + erf(x * scale)) * (0.5 * x) in float32, the reference's operations (x * scale, the
    float32 erf, + 1, times 0.5 * x), erf rounded from ``_erf_f64`` (NaN stays NaN): the reference's bits
    but where SciPy's float32 erf is not the float64 value correctly rounded (tested)."""
    for i in range(x.shape[0]):
        xi = x[i]
        y = xi * scale
        e = np.float32(_erf_f64(np.float64(y)))
        if y != y:
            e = y
        out[i] = (e + np.float32(1.0)) * (np.float32(0.5) * xi)


# The Taylor coefficients of sin(r) = r - r^3/3! + r^5/5! - ... up to r^13: on |r| <= pi/2 the first
# omitted term is below (pi/2)^15 / 15! = 6.7e-10, far under float32's rounding (6e-8).
_SIN_TAYLOR = (1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800)


@numba.njit(fastmath=FASTMATH, inline="always")
def _sin_up_to_sign(z):
    """sin(z) up to its sign (enough for sin^2), in float64 for a float32 z: with k the integer nearest
    z / pi, sin(z) = (-1)^k sin(z - k pi) and |z - k pi| <= pi / 2, where a 7-term polynomial is exact
    to float32 precision."""
    zd = np.float64(z)
    r = zd - np.rint(zd * (1.0 / np.pi)) * np.pi  # (np.rint: the same integers, 38 against 43 us a 96 x 1024 row block)
    r2 = r * r
    p = _SIN_TAYLOR[6]
    for j in range(5, -1, -1):
        p = p * r2 + _SIN_TAYLOR[j]
    return np.float32(r * p)


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta``: x + 1 / (beta + 1e-9) * sin(alpha * x)^2.  Float32: a Numba pass over each row
    (``_snake_rows_into``: the sine by range reduction and a polynomial, vectorised), in pieces of about
    ``ELEMENTWISE_PIECE`` samples side by side (``run_pieces``); float64 (explicit backend): the reference."""
    if x_bct.dtype != np.float32:
        return nn.snake_beta.reference(x_bct, log_alpha_c, log_beta_c)
    x_bct = np.ascontiguousarray(x_bct)
    B, C, T = x_bct.shape
    alpha_c, inv_beta_c = _snake_params(log_alpha_c, log_beta_c)
    no_bias = np.zeros(C, np.float32)
    out_bct = new_output(x_bct.shape)
    rows = max(1, ELEMENTWISE_PIECE // max(T, 1))  # channels per piece

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        _snake_rows_into(x_bct[b, c0:c1], no_bias[c0:c1], alpha_c[c0:c1], inv_beta_c[c0:c1], out_bct[b, c0:c1])

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return out_bct


CONV_PIECE_BYTES = 4 << 20  # the stacked taps of one piece of ``conv1d`` ([I * K, columns] float32; 2 MB: encode +4%)
CONV_PIECE_MIN_COLUMNS = 256  # with many stacked taps, pieces this wide still (each piece reads the weight once)
PER_TAP_MAX_OUT = 8  # up to this many output channels (the decoder's last conv, 96 -> 1): a product per tap
MIN_PIECES = 8  # fewer pieces than this share out unevenly over the threads: then one piece on BLAS's threads


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_taps_into(x_ct, t0, stride, dilation, cols_ikn):
    """cols[i, k, j] = x[i, (t0 + j) * stride + k * dilation]: the K taps of output columns t0 .. t0 + N - 1
    side by side ("im2col"), so that the conv of the piece is one matrix product."""
    I, K, N = cols_ikn.shape
    for i in range(I):
        for k in range(K):
            first = t0 * stride + k * dilation
            if stride == 1:
                cols_ikn[i, k, :] = x_ct[i, first : first + N]
            else:
                for j in range(N):
                    cols_ikn[i, k, j] = x_ct[i, first + j * stride]


ONE_CHANNEL_CHUNK = 2048  # output columns a one-channel conv sums at a time (a float32 buffer of 8 KB)


@numba.njit(cache=True, nogil=True)
def _one_channel_conv_into(x_t, w_ok, b_o, dilation, t0, t1, out_ot):
    """out[o, t] = (((w[o, 0] x[t] + w[o, 1] x[t + d]) + w[o, 2] x[t + 2 d]) + ...) + b[o] for t0 <= t < t1:
    a stride-1 conv of ONE input channel, its taps summed in order and the bias last, each product rounded
    before its sum (no fused multiply-adds): the reference's operations in its order, its bits.  A chunk of
    columns at a time for every output channel, two taps a pass (the encoder's first conv, 1 -> 64 channels
    x 7 taps: stacking the taps for a product writes and reads 7 copies of the input)."""
    O, K = w_ok.shape
    acc_n = np.empty(ONE_CHANNEL_CHUNK, dtype=np.float32)
    for c0 in range(t0, t1, ONE_CHANNEL_CHUNK):
        n = min(ONE_CHANNEL_CHUNK, t1 - c0)
        for o in range(O):
            w0, x0 = w_ok[o, 0], x_t[c0 : c0 + n]
            for j in range(n):
                acc_n[j] = w0 * x0[j]
            for k in range(1, K - 1, 2):
                wa, wb, first = w_ok[o, k], w_ok[o, k + 1], c0 + k * dilation
                xa, xb = x_t[first : first + n], x_t[first + dilation : first + dilation + n]
                for j in range(n):
                    acc_n[j] = (acc_n[j] + wa * xa[j]) + wb * xb[j]
            out_t, bias = out_ot[o, c0 : c0 + n], b_o[o]
            if K % 2 == 0:
                w_last, x_last = w_ok[o, K - 1], x_t[c0 + (K - 1) * dilation : c0 + (K - 1) * dilation + n]
                for j in range(n):
                    out_t[j] = (acc_n[j] + w_last * x_last[j]) + bias
            else:
                for j in range(n):
                    out_t[j] = acc_n[j] + bias


SMALL_WEIGHT_SHARE = 8  # a weight of at most 1/8 of the stacked taps' bytes is cheap to read once per thread


def _few_conv_pieces(weight_values: int, taps_per_column: int, T_out: int) -> int:
    """The columns of each piece of a conv with too few pieces to share out evenly: one equal share per
    thread where the weight is small against the stacked taps, so that the stacking runs on every thread
    too (the encoder's first conv, 1 -> 64 channels over 240,000 samples: each thread stacks its own taps
    and reads the 1.8 KB weight again; 9.4-9.8 against 10.9-11.9 ms as one piece), else all of them in one
    piece, on BLAS's threads."""
    threads = _piece_threads()
    share = -(-T_out // max(threads, 1))
    small_weight = SMALL_WEIGHT_SHARE * weight_values <= taps_per_column * T_out
    if threads > 1 and share >= CONV_PIECE_MIN_COLUMNS and small_weight:
        return share
    return T_out


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d`` by one of four arrangements chosen by shape:

    - dense with at most ``PER_TAP_MAX_OUT`` output channels: one product per tap, accumulated through one
      reused buffer (stacking K copies of the input would cost more than a product with so few rows);
    - 1x1, stride 1: one matrix product;
    - dense otherwise: pieces of output columns whose taps, stacked ("im2col", [I * K, columns], about
      ``CONV_PIECE_BYTES``, at least ``CONV_PIECE_MIN_COLUMNS`` columns), are ONE matrix product each with
      the weight as stored ([O, I * K], no copy), written into the output in place; the pieces run side by
      side (``run_pieces``), or, fewer than ``MIN_PIECES``, as one piece on BLAS's threads;
    - depthwise (groups = channels): a multiply-add per tap, no matrix product at all.
    Other group counts go to the reference."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    end = lambda k: k * dilation + stride * (T_out - 1) + 1  # noqa: E731 - last input index used by tap k, +1
    if groups == 1 and I == 1 and stride == 1 and _one_channel_takes(x_bct, w_oik, b_o):
        return _one_channel_conv(x_bct, w_oik, b_o, dilation, T_out)
    if groups == 1 and O <= PER_TAP_MAX_OUT:
        out = np.matmul(w_oik[:, :, 0], x_bct[:, :, 0 : end(0) : stride])
        product = np.empty_like(out)  # reused for every further tap
        for k in range(1, K):
            out += np.matmul(w_oik[:, :, k], x_bct[:, :, k * dilation : end(k) : stride], out=product)
    elif groups == 1 and K == 1 and stride == 1 and (tiles_usrc := _one_by_one_tiles(x_bct, w_oik, b_o)) is not None:
        out = new_output((B, O, T), x_bct.dtype)  # bf16 weights (the speaker encoder's pooling): on the tiles
        for b in range(B):
            _taps_on_tiles(x_bct[b], tiles_usrc, b_o, False, 1, 1, 0, out[b])
        return out
    elif groups == 1 and K == 1 and stride == 1:  # a plain product (the speaker encoder's 1x1 convs)
        out = np.matmul(np.ascontiguousarray(w_oik[:, :, 0]), x_bct, out=new_output((B, O, T), x_bct.dtype))
    elif groups == 1 and B == 1 and _few_columns(x_bct, w_oik, b_o, T_out):
        return _few_columns_conv(x_bct, w_oik, b_o, stride, dilation, T_out)
    elif groups == 1:
        x_bct = np.ascontiguousarray(x_bct)
        w_m = np.ascontiguousarray(w_oik).reshape(O, I * K)  # column i * K + k: the order of the stacked taps
        n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * I * K))
        if B * -(-T_out // n_piece) < MIN_PIECES:  # too few to share out evenly
            n_piece = _few_conv_pieces(O * I * K, I * K, T_out)
        out = new_output((B, O, T_out), x_bct.dtype)

        def piece(b, t0):
            cols_ikn = np.empty((I, K, min(n_piece, T_out - t0)), x_bct.dtype)
            _stack_taps_into(x_bct[b], t0, stride, dilation, cols_ikn)
            out_on = out[b, :, t0 : t0 + cols_ikn.shape[-1]]
            np.matmul(w_m, cols_ikn.reshape(I * K, -1), out=out_on)
            if b_o is not None:
                out_on += b_o[:, None]

        run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)])
        return out
    elif groups == C and I == 1 and O == C:
        out = np.zeros((B, O, T_out), dtype=x_bct.dtype)
        for k in range(K):
            out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation : end(k) : stride]
    else:
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    if b_o is not None:
        out += b_o[None, :, None]
    return out


def _one_channel_takes(x_bct, w_oik, b_o) -> bool:
    """Whether ``_one_channel_conv`` computes this conv: float32 host arrays (float64, the explicit backend,
    keeps the reference)."""
    arrays = (x_bct, w_oik) if b_o is None else (x_bct, w_oik, b_o)
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


def _one_channel_conv(x_bct, w_oik, b_o, dilation, T_out):
    """A stride-1 conv of one input channel by ``_one_channel_conv_into``, in ``MIN_PIECES`` pieces of
    columns side by side (``run_pieces``)."""
    B, O = x_bct.shape[0], w_oik.shape[0]
    x_bt, w_ok = np.ascontiguousarray(x_bct[:, 0]), np.ascontiguousarray(w_oik[:, 0])
    b_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o)
    out = new_output((B, O, T_out), np.float32)
    share = max(ONE_CHANNEL_CHUNK, -(-T_out // MIN_PIECES))

    def piece(b, t0):
        _one_channel_conv_into(x_bt[b], w_ok, b_o, dilation, t0, min(T_out, t0 + share), out[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, share)])
    return out


def _few_columns(x_bct, w_oik, b_o, T_out: int) -> bool:
    """Whether a dense conv's product is a few rows (its output columns) times a float32 weight worth
    streaming: what ``_few_rows_f32`` takes (other dtypes keep the stacked-taps product)."""
    if x_bct.dtype != np.float32 or w_oik.dtype != np.float32 or getattr(b_o, "dtype", np.float32) != np.float32:
        return False
    return F32_FEW_ROWS[0] <= T_out <= F32_FEW_ROWS[1] and w_oik.nbytes >= F32_FEW_ROWS_MIN_BYTES


def _few_columns_conv(x_bct, w_oik, b_o, stride, dilation, T_out):
    """A dense conv with 2 to 8 output columns and a weight of at least a megabyte (the decoder's first
    conv, 1024 -> 1536 x 7 taps, over the 4 steps of a 1-frame decode): the stacked taps, transposed, are a
    few rows times the weight ([O, I * K] as stored) by ``_few_rows_f32``, the weight read once from
    memory (44 MB: 3.6-4.1 -> 3.1 ms), where BLAS packs it first; ``conv1d`` has checked the shapes."""
    O, I, K = w_oik.shape
    cols_ikn = np.empty((I, K, T_out), x_bct.dtype)
    _stack_taps_into(np.ascontiguousarray(x_bct[0]), 0, stride, dilation, cols_ikn)
    x_ni = np.ascontiguousarray(cols_ikn.reshape(I * K, T_out).T)
    out_no = _few_rows_f32(x_ni, np.ascontiguousarray(w_oik).reshape(O, I * K), b_o)  # (``_few_columns``: it applies)
    return np.ascontiguousarray(out_no.T)[None]


# ----------------------------------------------------------------------------- the codec decoder's residual unit

UNIT_TILE = 1024  # time steps per piece of the fused residual unit: its stacked taps ([C * 7, 1024]) stay in cache


@numba.njit(fastmath=FASTMATH, inline="always")
def _snake_row_into(x_t, T, start, bias, alpha, inv_beta, out_n):
    """out[j] = SnakeBeta(x[start + j] + bias) where 0 <= start + j < T, else 0 (the causal conv's zero
    padding, which the reference applies to SnakeBeta's output).  The loop runs over two 1-D views from
    index 0: written with an offset (``x[start + j]``), LLVM's run-time overlap test of the two rows
    failed whenever the output began within a row after the input's end (two arrays allocated one after
    the other: h and SnakeBeta(h) in the residual unit) and the scalar loop ran, 2.7 ns a value against
    0.43 (0.8 with the offset and no overlap; 96 rows of 1024, one thread)."""
    N = out_n.shape[0]
    j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)  # x exists for j0 <= j < j1
    out_n[:j0] = 0.0
    if j1 > j0:
        x_m, out_m = x_t[start + j0 : start + j1], out_n[j0:j1]
        for j in range(x_m.shape[0]):  # (no branch inside: the loop vectorises)
            y = x_m[j] + bias
            s = _sin_up_to_sign(alpha * y)
            out_m[j] = y + inv_beta * (s * s)
    out_n[max(j1, j0) :] = 0.0


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_rows_into(x_ct, bias_c, alpha_c, inv_beta_c, out_ct):
    """out[c] = SnakeBeta(x[c] + bias[c]) (``_snake_row_into`` of every row)."""
    for c in range(x_ct.shape[0]):
        _snake_row_into(x_ct[c], x_ct.shape[1], 0, bias_c[c], alpha_c[c], inv_beta_c[c], out_ct[c])


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_taps_into(x_ct, T, start, alpha_c, inv_beta_c, dilation, row_s, cols_ckn):
    """cols[c, k, j] = SnakeBeta(x[c, start + k * dilation + j]) (0 outside x[:, :T]): one row of SnakeBeta at a
    time into ``row_s`` (N + (K - 1) * dilation samples, in the first-level cache), then its K taps copied
    from it ("im2col" with the activation on the way)."""
    C, K, N = cols_ckn.shape
    for c in range(C):
        _snake_row_into(x_ct[c], T, start, np.float32(0.0), alpha_c[c], inv_beta_c[c], row_s)
        for k in range(K):
            cols_ckn[c, k, :] = row_s[k * dilation : k * dilation + N]


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_residual(h_cn, bias_c, x_ct, start, out_ct):
    """out[c, start + j] = (h[c, j] + bias[c]) + x[c, start + j] (the reference's order: bias, then residual):
    ``_add_bias_and_residual_rows`` over all of h's columns."""
    _add_bias_and_residual_rows(h_cn, h_cn.shape[1], bias_c, x_ct, start, out_ct)


@numba.njit(inline="always")
def _add_bias_and_residual_rows(sums_cw, n, bias_c, x_ct, t0, out_ct):
    """out[c, t0 + j] = (sums[c, j] + bias[c]) + x[c, t0 + j] for j < n (sums may be wider: the tiles' sums),
    row by row over 1-D views from index 0 (written x[c, t0 + j], the loop ran scalar: see
    ``_snake_row_into``)."""
    for c in range(sums_cw.shape[0]):
        bias, sums_n, x_n, out_n = bias_c[c], sums_cw[c, :n], x_ct[c, t0 : t0 + n], out_ct[c, t0 : t0 + n]
        for j in range(n):
            out_n[j] = (sums_n[j] + bias) + x_n[j]


def _whole_rows(x_bct):
    """(rows, T): a C-contiguous array whose rows begin with x's rows [B, C, >= T], and x's length T: x
    itself; for the first samples of longer rows (the trimmed output of a transposed conv) those whole
    rows, without a copy, where they lie inside the memory x's base owns; otherwise a contiguous copy."""
    T, base = x_bct.shape[-1], x_bct.base
    if x_bct.flags.c_contiguous:
        return x_bct, T
    B, C, _ = x_bct.shape
    s0, s1, s2 = x_bct.strides
    item = x_bct.itemsize
    if isinstance(base, np.ndarray) and base.flags.c_contiguous and s2 == item and s1 % item == 0 and s1 >= T * item:
        first, last = x_bct.ctypes.data, x_bct.ctypes.data + B * s0  # the whole rows' bytes
        if s0 == C * s1 and base.ctypes.data <= first and last <= base.ctypes.data + base.nbytes:
            return np.lib.stride_tricks.as_strided(x_bct, (B, C, s1 // item), x_bct.strides, writeable=False), T
    return np.ascontiguousarray(x_bct), T


def _snake_params(log_alpha_c, log_beta_c):
    """(alpha, 1 / (beta + 1e-9)) in float32, as ``snake_beta`` computes them."""
    alpha_c = np.exp(log_alpha_c).astype(np.float32)
    return alpha_c, (1.0 / (np.exp(log_beta_c) + np.float32(1e-9))).astype(np.float32)


def residual_unit_push(
    x_bct, log_alpha1_c, log_beta1_c, w1_oik, b1_o, log_alpha2_c, log_beta2_c, w2_oi1, b2_o, dilation, context_bcs=None
):
    """``codec.decoder.residual_unit_push`` (float32, C -> C channels) over pieces of ``UNIT_TILE`` time
    steps, each carried through the whole unit by one thread while it is in that core's cache: SnakeBeta of
    the piece and its 6 * dilation samples of left context (before the push: ``context_bcs``, or zeros)
    straight into the 7 stacked taps, one matrix product for the k7 conv, bias + SnakeBeta, one for the k1
    conv, bias + residual into the output.  Nothing of the signal's length is allocated but the output (the
    reference makes five such arrays); the next push's context is SnakeBeta of the last samples, computed by
    the same row kernel (the bits the reference path keeps)."""
    if x_bct.dtype != np.float32 or w1_oik.shape[0] != w1_oik.shape[1] or w2_oi1.shape[-1] != 1:
        return NotImplemented  # (float64: the reference runs)
    rows_bcs, T = _whole_rows(x_bct)  # no copy of a trimmed transposed-conv output
    B, C = x_bct.shape[:2]
    K = w1_oik.shape[-1]
    left = (K - 1) * dilation
    alpha1, inv_beta1 = _snake_params(log_alpha1_c, log_beta1_c)
    alpha2, inv_beta2 = _snake_params(log_alpha2_c, log_beta2_c)
    w1_m = np.ascontiguousarray(w1_oik.reshape(C, C * K))  # column i * K + k: the order of the stacked taps
    w2_m = np.ascontiguousarray(w2_oi1[:, :, 0])
    out_bct = new_output((B, C, T))
    if _convs_take_tiles(C, C, T, w1_oik, w2_oi1):
        params_6c = np.stack([alpha1, inv_beta1, alpha2, inv_beta2, b1_o, b2_o]).astype(np.float32)
        _residual_unit_on_tiles(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct)
        return out_bct, _next_context(x_bct, log_alpha1_c, log_beta1_c, left, context_bcs)

    def piece(b, t0):
        n = min(UNIT_TILE, T - t0)
        cols_ckn = _snake_taps(rows_bcs[b], T, t0, n, alpha1, inv_beta1, K, dilation, context_bcs, b)
        h_cn = w1_m @ cols_ckn.reshape(C * K, n)
        g_cn = np.empty_like(h_cn)
        _snake_rows_into(h_cn, b1_o, alpha2, inv_beta2, g_cn)
        _add_bias_and_residual(w2_m @ g_cn, b2_o, rows_bcs[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T, UNIT_TILE)])
    return out_bct, _next_context(x_bct, log_alpha1_c, log_beta1_c, left, context_bcs)


def _snake_taps(x_ct, T, t0, n, alpha_c, inv_beta_c, K, dilation, context_bcs, b):
    """[C, K, n]: SnakeBeta of the K taps of a causal conv's output columns t0 .. t0 + n - 1 side by side
    ("im2col", ``_snake_taps_into``), the taps before the push's start taken from ``context_bcs[b]``
    (the last (K - 1) * dilation SnakeBeta outputs of the pushes before) or zeros where it is None."""
    left = (K - 1) * dilation
    cols_ckn = np.empty((x_ct.shape[0], K, n), np.float32)
    row_s = np.empty(left + n, np.float32)
    _snake_taps_into(x_ct, T, t0 - left, alpha_c, inv_beta_c, dilation, row_s, cols_ckn)
    for k in range(K if context_bcs is not None else 0):  # taps before the push: the context
        first = t0 - left + k * dilation
        if first < 0:
            m = min(-first, n)
            cols_ckn[:, k, :m] = context_bcs[b, :, left + first : left + first + m]
    return cols_ckn


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _snake_conv_few_into(x_ct, T, t0, alpha_c, inv_beta_c, w_oik, context_cs, row_s, out_on):
    """out[o, j] = sum_c sum_k w[o, c, k] * SnakeBeta(x[c, t0 - (K - 1) + k + j]) for a few outputs o:
    SnakeBeta of one row of x at a time into ``row_s`` (N + K - 1 samples, in the first-level cache; before
    the push's start the context's samples, ``context_cs`` [C, K - 1], or zeros where it is empty), then
    its K taps multiplied into every output row (a stacked copy of the taps for a product with one row
    would read 7 times the samples from memory)."""
    O, C, K = w_oik.shape
    N = out_on.shape[1]
    left = K - 1
    out_on[:, :] = 0.0
    for c in range(C):
        _snake_row_into(x_ct[c], T, t0 - left, np.float32(0.0), alpha_c[c], inv_beta_c[c], row_s)
        if context_cs.shape[0] > 0:
            for i in range(min(max(left - t0, 0), N + left)):  # positions before the push: the context
                row_s[i] = context_cs[c, t0 + i]
        for o in range(O):
            out_n = out_on[o]
            for k in range(K):
                weight, taps_n = w_oik[o, c, k], row_s[k : k + N]
                for j in range(N):
                    out_n[j] += weight * taps_n[j]


def snake_causal_conv_push(x_bct, log_alpha_c, log_beta_c, w_oik, b_o, context_bcs=None):
    """``codec.decoder.snake_causal_conv_push`` (float32) over pieces of ``UNIT_TILE`` time steps side by
    side: SnakeBeta of the piece and its K - 1 samples of left context, multiplied tap by tap into the few
    outputs (``_snake_conv_few_into``: up to ``PER_TAP_MAX_OUT``, the decoder's 96 -> 1), or stacked into
    the K taps for one matrix product (``_snake_taps``), + bias.  Neither SnakeBeta's full-length output
    nor a padded copy of it is made (the reference's two 92 MB arrays for 10 s, the padded copy alone 220
    ms of fresh pages in a decode; tap by tap 56 -> 25 ms against the stacked taps); the next push's
    context is ``residual_unit_push``'s."""
    if x_bct.dtype != np.float32:
        return NotImplemented  # (float64: the reference runs)
    rows_bcs, T = _whole_rows(x_bct)
    B, C = x_bct.shape[:2]
    O, _, K = w_oik.shape
    alpha, inv_beta = _snake_params(log_alpha_c, log_beta_c)
    w_oik = np.ascontiguousarray(w_oik, dtype=np.float32)
    w_m = w_oik.reshape(O, C * K)  # column i * K + k: the order of the stacked taps
    no_context = np.zeros((0, 0), np.float32)
    out_bot = new_output((B, O, T))

    def piece(b, t0):
        n = min(UNIT_TILE, T - t0)
        out_on = out_bot[b, :, t0 : t0 + n]
        if O <= PER_TAP_MAX_OUT:
            context_cs = no_context if context_bcs is None else np.ascontiguousarray(context_bcs[b], np.float32)
            row_s = np.empty(n + K - 1, np.float32)
            _snake_conv_few_into(rows_bcs[b], T, t0, alpha, inv_beta, w_oik, context_cs, row_s, out_on)
        else:
            cols_ckn = _snake_taps(rows_bcs[b], T, t0, n, alpha, inv_beta, K, 1, context_bcs, b)
            np.matmul(w_m, cols_ckn.reshape(C * K, n), out=out_on)
        if b_o is not None:
            out_on += b_o[:, None]

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T, UNIT_TILE)])
    return out_bot, _next_context(x_bct, log_alpha_c, log_beta_c, K - 1, context_bcs)


def _next_context(x_bct, log_alpha_c, log_beta_c, left, context_bcs):
    """The last ``left`` samples of SnakeBeta(x) after the context before: [B, C, left] (``snake_beta``'s
    twin: the bits the step path keeps)."""
    B, C, T = x_bct.shape
    snaked_bct = snake_beta(x_bct[:, :, max(T - left, 0) :], log_alpha_c, log_beta_c)
    if T >= left:
        return snaked_bct
    before = context_bcs if context_bcs is not None else np.zeros((B, C, left), np.float32)
    return np.concatenate([before[:, :, T:], snaked_bct], axis=-1)


# ----------------------------------------------------------------------------- the codec encoder's residual block


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_elu_taps_into(x_ct, negative_cs, a, first, stride, dilation, cols_ckn):
    """cols[c, k, j] = ELU(x[c, p]), p = first + j * stride + k * dilation, as ``elu`` computes it, and 0
    where p is outside x (a causal conv's zero padding; ELU(0) = 0): ``elu`` is max(x, 0) + expm1(min(x, 0)),
    one of whose terms is 0, so it is x where x > 0 and else negative[c, p - a] = expm1(min(x, 0)) (NumPy's
    expm1, taken by the caller over x[:, a : a + S]; NaN stays NaN).  The taps stacked with the ELU on the
    way: the ELU's own max, sum and zero-padded copy are never made."""
    C, K, N = cols_ckn.shape
    z = a + negative_cs.shape[1]  # x is read at a <= p < z
    for c in range(C):
        for k in range(K):
            start = first + k * dilation
            j0 = min(max(-(-(a - start) // stride), 0), N)  # the first j with p >= a
            j1 = max(min(-(-(z - start) // stride), N), j0)  # the first j with p >= z
            cols_ckn[c, k, :j0] = 0.0
            if j1 > j0:  # (loops over views from index 0: see ``_snake_row_into``)
                p0, p1 = start + j0 * stride, start + (j1 - 1) * stride + 1
                x_m, out_m = x_ct[c, p0:p1:stride], cols_ckn[c, k, j0:j1]
                negative_m = negative_cs[c, p0 - a : p1 - a : stride]
                for j in range(out_m.shape[0]):
                    v = x_m[j]
                    out_m[j] = v if v > 0 else negative_m[j]
            cols_ckn[c, k, j1:] = 0.0


def _elu_taps(x_ct, first: int, stride: int, dilation: int, K: int, n: int):
    """The K taps (``stride``, ``dilation``) of n output columns of a conv over ELU(x), its input read from
    x's sample ``first`` on, zeros outside x: [C, K, n] (``_stack_elu_taps_into``; the same bits as the
    ELU's output padded and stacked)."""
    C, T = x_ct.shape
    stop = first + (n - 1) * stride + (K - 1) * dilation + 1
    a = max(first, 0)
    z = max(min(stop, T), a)
    negative_cs = np.minimum(x_ct[:, a:z], 0)
    np.expm1(negative_cs, out=negative_cs)
    cols_ckn = np.empty((C, K, n), x_ct.dtype)
    _stack_elu_taps_into(x_ct, negative_cs, a, first, stride, dilation, cols_ckn)
    return cols_ckn


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_split_into(h_on, bias_o, negative_on):
    """h = h + bias and negative = min(h + bias, 0), in one pass (the first half of an ELU after a bias; a NaN
    stays NaN in both, as with ``np.minimum``)."""
    for o in range(h_on.shape[0]):
        bias, h_n, negative_n = bias_o[o], h_on[o], negative_on[o]
        for j in range(h_n.shape[0]):
            y = h_n[j] + bias
            h_n[j] = y
            negative_n[j] = np.float32(0.0) if y >= 0 else y


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _keep_positive_else_into(h_on, negative_on):
    """h = h where h > 0, else negative (the ELU's max(h, 0) + expm1(min(h, 0)), one term of which is 0)."""
    for o in range(h_on.shape[0]):
        h_n, negative_n = h_on[o], negative_on[o]
        for j in range(h_n.shape[0]):
            v = h_n[j]
            h_n[j] = v if v > 0 else negative_n[j]


def resnet_block_offline(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, pad_mode):
    """``codec.encoder.resnet_block_offline`` (float32, zero padding) over pieces of time, each carried
    through the whole block by one thread while it is in that core's cache: ELU of the piece and its
    (K - 1) * dilation samples of left context (zeros before the start), its K taps stacked, one matrix
    product for the k3 conv (C -> H), bias + ELU, one for the k1 conv (H -> C), bias + residual into the
    output.  The ELUs are ``elu``'s own operations (NumPy's expm1; the same bits as the reference's), the
    first taken as its taps are stacked (``_elu_taps``), the second with the bias (``_add_bias_and_split_into``),
    and the k1 conv's bias and the residual added in one pass."""
    B, C, T = x_bct.shape
    H, _, K = w1_oik.shape
    if x_bct.dtype != np.float32 or pad_mode != "constant" or w2_oi1.shape != (C, H, 1) or b1_o is None or b2_o is None:
        return NotImplemented
    left = (K - 1) * dilation
    w1_m = np.ascontiguousarray(w1_oik.reshape(H, C * K))  # column c * K + k: the order of the stacked taps
    w2_m = np.ascontiguousarray(w2_oi1[:, :, 0])
    n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * C * K))  # ``conv1d``'s pieces
    out_bct = new_output((B, C, T))
    if _convs_take_tiles(C, H, T, w1_oik, w2_oi1):
        _resnet_block_on_tiles(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct)
        return out_bct

    def piece(b, t0):
        n = min(n_piece, T - t0)
        cols_ckn = _elu_taps(x_bct[b], t0 - left, 1, dilation, K, n)
        h_hn = w1_m @ cols_ckn.reshape(C * K, n)
        negative_hn = np.empty_like(h_hn)
        _add_bias_and_split_into(h_hn, b1_o, negative_hn)  # h + b1, and min(h + b1, 0)
        np.expm1(negative_hn, out=negative_hn)
        _keep_positive_else_into(h_hn, negative_hn)  # ELU(h + b1)
        _add_bias_and_residual(w2_m @ h_hn, b2_o, x_bct[b], t0, out_bct[b])

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)])
    return out_bct


def elu_causal_conv_offline(x_bct, w_oik, b_o, stride, pad_mode):
    """``codec.encoder.elu_causal_conv_offline`` (float32, zero padding) over pieces of output columns, each
    one thread's: the ELU of the input span the piece reads (zeros in the causal padding, where the
    reference pads the ELU's output with zeros), its K taps stacked with the stride as the ELU is taken
    (``_elu_taps``), one matrix product, + bias.  The ELU is ``elu``'s own operations (the same bits as the
    reference's)."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    if x_bct.dtype != np.float32 or pad_mode != "constant" or I != C:
        return NotImplemented
    left = nn.causal_padding(K, stride)
    padded = left + T + nn.extra_right_padding(T, K, stride)
    T_out = (padded - K) // stride + 1
    w_m = np.ascontiguousarray(w_oik.reshape(O, C * K))  # column c * K + k: the order of the stacked taps
    n_piece = max(CONV_PIECE_MIN_COLUMNS, CONV_PIECE_BYTES // (4 * C * K))  # ``conv1d``'s pieces
    out_bot = new_output((B, O, T_out))
    if _convs_take_tiles(C, O, T_out, w_oik):
        _elu_conv_on_tiles(x_bct, w_oik, b_o, stride, left, out_bot)
        return out_bot

    def piece(b, t0):
        n = min(n_piece, T_out - t0)
        cols_ckn = _elu_taps(x_bct[b], t0 * stride - left, stride, 1, K, n)  # the span read, from x's sample
        out_on = out_bot[b, :, t0 : t0 + n]
        np.matmul(w_m, cols_ckn.reshape(C * K, n), out=out_on)
        if b_o is not None:
            out_on += b_o[:, None]

    run_pieces(piece, [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)])
    return out_bot


# ----------------------------------------------------------------------------- the codec encoder's quantizer


def nearest_rows(x_nd, e_kd, e_sq_k=None):
    """``codec.quantization.nearest_rows`` (float32) with the two smallest scores of a row found without a
    partition: the smallest is the score at the argmin; set to infinity there, the row's minimum is the
    second smallest (the smallest again where it occurs twice).  The reference's scores, argmin and margin
    arithmetic: the same indices and margins, bit for bit (0.56 ms of partition per layer of 250 x 2048
    becomes two passes of 0.05 ms).  A row with a NaN score goes to the reference."""
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


# ----------------------------------------------------------------------------- the speaker encoder's TDNN


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _stack_reflected_taps_into(x_ct, first, dilation, cols_ikn):
    """cols[i, k, j] = x[i, r(first + k * dilation + j)], r mirroring positions outside 0 .. T - 1 about the
    edge samples (r(-1) = 1, r(T) = T - 2: the reflect padding, without the padded copy)."""
    I, K, N = cols_ikn.shape
    T = x_ct.shape[1]
    for i in range(I):
        for k in range(K):
            start = first + k * dilation
            j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)  # x itself for j0 <= j < j1
            for j in range(j0):
                cols_ikn[i, k, j] = x_ct[i, -(start + j)]
            if j1 > j0:
                cols_ikn[i, k, j0:j1] = x_ct[i, start + j0 : start + j1]
            for j in range(max(j1, j0), N):
                cols_ikn[i, k, j] = x_ct[i, 2 * (T - 1) - (start + j)]


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _add_bias_and_relu(h_on, bias_o):
    """h = ReLU(h + bias), in place (a NaN stays NaN, as with ``np.maximum``)."""
    for o in range(h_on.shape[0]):
        bias, row = bias_o[o], h_on[o]
        for j in range(row.shape[0]):
            y = row[j] + bias
            row[j] = np.float32(0.0) if y <= 0 else y


TDNN_RELU_PIECE = 1 << 21  # values per piece of the bias + ReLU pass (8 MB): smaller outputs in one pass here, as a
# piece thread's hand-off costs more than it saves (512 x 937 frames: 42 us on this thread, 117 in two pieces)


def _tdnn_into(x_ct, w_oik, b_o, dilation, out_ot, cols_ikn=None):
    """out = ReLU(reflect-"same" conv(x) + b) for one item [C, T] -> [O, T]: the taps read straight from x
    with the mirrored edges (``_stack_reflected_taps_into``, into ``cols_ikn`` [I, K, T] where given: a
    buffer reused from one call to the next; a 1-tap conv multiplies x itself), one matrix product on
    BLAS's threads into out, then bias and ReLU in one pass over rows of channels side by side."""
    O, I, K = w_oik.shape
    T = x_ct.shape[1]
    on_tiles = USE_TILES and T >= TILE_TDNN_MIN_STEPS and O >= TILE_TDNN_MIN_OUT
    tiles_usrc = _tdnn_weight_tiles(w_oik) if on_tiles else None
    if tiles_usrc is not None:  # bf16 weights (as released): the product on the tiles, bias and ReLU in it
        first = -(dilation * (K - 1) // 2)
        _taps_on_tiles(x_ct, tiles_usrc, b_o, True, K, dilation, first, out_ot)
        return
    w_m = np.ascontiguousarray(w_oik.reshape(O, I * K))  # column i * K + k: the order of the stacked taps
    if K == 1:
        np.matmul(w_m, x_ct, out=out_ot)
    else:
        cols_ikn = np.empty((I, K, T), np.float32) if cols_ikn is None else cols_ikn
        _stack_reflected_taps_into(np.ascontiguousarray(x_ct), -(dilation * (K - 1) // 2), dilation, cols_ikn)
        np.matmul(w_m, cols_ikn.reshape(I * K, T), out=out_ot)
    rows = max(1, TDNN_RELU_PIECE // T)
    run_pieces(
        lambda o0: _add_bias_and_relu(out_ot[o0 : o0 + rows], b_o[o0 : o0 + rows]), [(o0,) for o0 in range(0, O, rows)]
    )


_TDNN_TILES: dict = {}  # id of a read-only weight -> (a weak reference to it, its tiles or None)


def _tdnn_weight_tiles(w_oik):
    """The A tiles of a TDNN's float32 weight [O, I, K] seen as [O, I K] (``_bf16_words_into_tiles``), or
    None where O is not a multiple of 32, I K not of 32, or some weight is not a bf16 value (the check stops
    at the first).  Kept as long as the weight lives where it is read-only (a model's weights:
    ``SpeakerEncoder`` makes them so), made again for each call otherwise."""
    O, I, K = w_oik.shape
    if O % 32 or (I * K) % 32 or w_oik.dtype != np.float32:
        return None
    return _kept_while_read_only(_TDNN_TILES, w_oik, _tdnn_tiles_of)


def _tdnn_tiles_of(w_oik):
    """``_tdnn_weight_tiles`` made (None where some weight is not a bf16 value)."""
    O, I, K = w_oik.shape
    tiles_usrc = np.empty((O // 16, I * K // 32, 16, 32), np.uint16)
    ok = _bf16_words_into_tiles(np.ascontiguousarray(w_oik).reshape(O, I * K), tiles_usrc)
    return tiles_usrc if ok else None


def _kept_while_read_only(kept: dict, w, make):
    """``make(w)``, made once and kept in ``kept`` (id -> (a weak reference to w, the value)) as long as w
    lives, where w is read-only (``_read_only``: a model's weights, the loaders make them so), so that a
    layout derived from a weight is made at its first use only; made again for each call where w could
    change."""
    key = id(w)
    entry = kept.get(key)
    if entry is not None and entry[0]() is w:
        return entry[1]
    value = make(w)
    if _read_only(w):
        kept[key] = (weakref.ref(w, lambda _, key=key: kept.pop(key, None)), value)
    return value


def _read_only(w) -> bool:
    """Whether nothing can change w's values through NumPy: w and every array it is a view of are read-only
    (a read-only view of a writable array is not)."""
    while isinstance(w, np.ndarray):
        if w.flags.writeable:
            return False
        w = w.base
    return True


def _taps_on_tiles(x_ct, tiles_usrc, b_o, relu, K, dilation, first, out_ot):
    """out = (ReLU of) the stacked taps' product by the weight's tiles plus the bias (where given): the
    blocks of ``_taps_blocks_on_tiles`` shared out over the piece threads (``run_pieces``)."""
    x_ct, n, T = np.ascontiguousarray(x_ct), _piece_threads(), x_ct.shape[1]
    add_bias = b_o is not None
    b_o = np.zeros(1, np.float32) if b_o is None else b_o
    run_pieces(
        lambda th: _taps_blocks_on_tiles(
            x_ct, tiles_usrc, b_o, add_bias, relu, K, dilation, first, out_ot, 0, T, th, n
        ),
        [(th,) for th in range(n)],
    )


def _one_by_one_tiles(x_bct, w_oik, b_o):
    """The tiles of a 1x1 conv's weight where its product runs on them (``_tdnn_weight_tiles``: bf16
    weights, whole tiles; a float32 signal and bias, ``TILE_TDNN_MIN_OUT`` outputs, ``TILE_TDNN_MIN_STEPS``
    steps), else None."""
    O, T = w_oik.shape[0], x_bct.shape[2]
    if not USE_TILES or T < TILE_TDNN_MIN_STEPS or O < TILE_TDNN_MIN_OUT or x_bct.dtype != np.float32:
        return None
    if b_o is not None and b_o.dtype != np.float32:
        return None
    return _tdnn_weight_tiles(w_oik)


def tdnn_offline(x_bct, w_oik, b_o, dilation):
    """``tts.speaker_encoder.tdnn_offline`` (float32): ``_tdnn_into`` for each item, where the reference pads
    a copy of x and adds the bias and takes the ReLU as two more passes, each a fresh array."""
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    left = dilation * (K - 1) // 2
    too_short = T <= max(left, dilation * (K - 1) - left)  # (the reference's error)
    if x_bct.dtype != np.float32 or w_oik.dtype != np.float32 or I != C or b_o is None or too_short:
        return NotImplemented
    out_bot = new_output((B, O, T))
    for b in range(B):
        _tdnn_into(x_bct[b], w_oik, b_o, dilation, out_bot[b])
    return out_bot


def _res2net_tiles(w_joik, T):
    """The groups' weight tiles (``_tdnn_weight_tiles``) where the Res2Net runs on the tiles (granted, k3,
    ``TILE_RES2NET_MIN_STEPS`` steps, every group's weight bf16 values of whole tiles), else None."""
    if not USE_TILES or T < TILE_RES2NET_MIN_STEPS or w_joik[0].shape[-1] != 3:
        return None
    tiles_j = tuple(_tdnn_weight_tiles(w) for w in w_joik)
    return None if any(t is None for t in tiles_j) else tiles_j


def res2net_offline(x_bct, w_joik, b_jo, dilation):
    """``tts.speaker_encoder.res2net_offline`` (float32): each group's TDNN written in place in the
    concatenated output (its rows of channels are a contiguous block of it), the sum with the previous
    group's output taken into one small buffer; group 0 copied.  Where the reference splits, adds into a
    fresh array, makes a TDNN's output and concatenates them all again (seven TDNNs of 64 channels in
    each of the released encoder's three blocks, 937 frames for 10 s: 0.23 ms each, a third of it the
    work around the product)."""
    B, C, T = x_bct.shape
    G = C // (len(w_joik) + 1)  # channels per group
    if x_bct.dtype != np.float32 or C % (len(w_joik) + 1) or any(w.shape[:2] != (G, G) for w in w_joik):
        return NotImplemented
    K = w_joik[0].shape[-1]
    left = dilation * (K - 1) // 2
    too_short = T <= max(left, dilation * (K - 1) - left)  # (the reference's error)
    if too_short or any(w.dtype != np.float32 or w.shape[-1] != K for w in w_joik) or any(b is None for b in b_jo):
        return NotImplemented
    out_bct = new_output((B, C, T))
    tiles_j = _res2net_tiles(w_joik, T)
    if tiles_j is not None:  # bf16 weights (as released): each thread a range of steps, all groups on the tiles
        b_jo = tuple(np.ascontiguousarray(b, np.float32) for b in b_jo)
        n = _piece_threads()
        for b in range(B):
            x_ct, out_ct = np.ascontiguousarray(x_bct[b]), out_bct[b]
            cuts = [T * i // n for i in range(n + 1)]
            run_pieces(
                lambda t0, t1: _res2net_range_on_tiles(x_ct, tiles_j, b_jo, dilation, t0, t1, out_ct),
                [(cuts[i], cuts[i + 1]) for i in range(n)],
            )
        return out_bct
    out_bct[:, :G] = x_bct[:, :G]
    sum_ct = np.empty((G, T), np.float32)
    cols_gkt = np.empty((G, K, T), np.float32)  # every group's stacked taps, in one buffer
    for b in range(B):
        for j, (w_oik, b_o) in enumerate(zip(w_joik, b_jo), start=1):
            group_ct = x_bct[b, j * G : (j + 1) * G]
            if j > 1:  # plus the previous group's output: rows of out just written
                group_ct = np.add(group_ct, out_bct[b, (j - 1) * G : j * G], out=sum_ct)
            _tdnn_into(group_ct, w_oik, b_o, dilation, out_bct[b, j * G : (j + 1) * G], cols_gkt)
    return out_bct


@numba.njit(cache=True, nogil=True)
def _gated_residual_rows(h_ct, gates_c, x_ct, out_ct):
    """out[c] = h[c] * gates[c] + x[c], the product rounded before the sum (no fused multiply-add: NumPy's
    two steps, the same bits)."""
    for c in range(h_ct.shape[0]):
        gate, h_t, x_t, out_t = gates_c[c], h_ct[c], x_ct[c], out_ct[c]
        for t in range(h_t.shape[0]):
            out_t[t] = h_t[t] * gate + x_t[t]


def gated_residual(h_bct, gates_bc1, x_bct):
    """``tts.speaker_encoder.gated_residual`` (float32): one pass into one output where the reference makes
    two arrays (512 x 937 frames: 0.34 -> 0.20 ms)."""
    arrays = (h_bct, gates_bc1, x_bct)
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 3 for a in arrays):
        return NotImplemented
    B, C, T = h_bct.shape
    if x_bct.shape != h_bct.shape or gates_bc1.shape != (B, C, 1):
        return NotImplemented
    out_bct = new_output((B, C, T))
    for b in range(B):
        _gated_residual_rows(
            np.ascontiguousarray(h_bct[b]), gates_bc1[b, :, 0].copy(), np.ascontiguousarray(x_bct[b]), out_bct[b]
        )
    return out_bct


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _weighted_mean_and_std_rows(x_ct, w_rt, eps, mean_c, std_c):
    """mean[c] = sum_t w[c, t] x[c, t], std[c] = sqrt(max(sum_t w[c, t] (x[c, t] - mean[c])^2, eps)), w's one
    row for every c when it has one row; each row's two passes while it is in the first-level cache."""
    C, T = x_ct.shape
    for c in range(C):
        x_t, w_t = x_ct[c], w_rt[c if w_rt.shape[0] > 1 else 0]
        mean = np.float32(0.0)
        for t in range(T):
            mean += w_t[t] * x_t[t]
        variance = np.float32(0.0)
        for t in range(T):
            d = x_t[t] - mean
            variance += w_t[t] * (d * d)
        mean_c[c] = mean
        std_c[c] = np.sqrt(eps) if variance < eps else np.sqrt(variance)  # (NaN stays NaN)


def mean_and_std(x_bct, weights_bct, eps: float = 1e-12):
    """``tts.speaker_encoder.mean_and_std`` (float32): both statistics of a row in one kernel call, rows of
    channels side by side (``run_pieces``), no [B, C, T] temporaries (the reference makes four).  Its sums
    run in another order than NumPy's pairwise ``np.sum``: float32 rounding apart, the same numbers."""
    B, C, T = x_bct.shape
    if (
        x_bct.dtype != np.float32
        or not isinstance(weights_bct, np.ndarray)
        or weights_bct.dtype != np.float32
        or weights_bct.ndim != 3
        or weights_bct.shape[0] != B
        or weights_bct.shape[1] not in (1, C)
        or weights_bct.shape[2] != T
    ):
        return NotImplemented
    mean_bc, std_bc = np.empty((B, C), np.float32), np.empty((B, C), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // max(T, 1))
    per_row = weights_bct.shape[1] > 1

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        w_rt = weights_bct[b, c0:c1] if per_row else weights_bct[b]
        _weighted_mean_and_std_rows(x_bct[b, c0:c1], w_rt, np.float32(eps), mean_bc[b, c0:c1], std_bc[b, c0:c1])

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return mean_bc, std_bc


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _exp_minus_into(l_t, m, e_t):
    """e = exp(l - m) by ``_exp_f32`` (compiled without reassociation, which its reduction needs)."""
    for t in range(l_t.shape[0]):
        e_t[t] = _exp_f32(l_t[t] - m)


@numba.njit(fastmath=FASTMATH, error_model="numpy", cache=True, nogil=True)
def _softmax_mean_and_std_rows(x_ct, l_ct, m_c, eps, mean_c, std_c):
    """For each row c, with e = exp(l[c] - m[c]) (m the row's maximum) and s = sum_t e: mean = sum_t e x / s,
    std = sqrt(max(sum_t e (x - mean)^2 / s, eps)); the weights e / s of the softmax folded into the sums,
    each row's passes in the first-level cache."""
    C, T = x_ct.shape
    e_t = np.empty(T, dtype=np.float32)
    for c in range(C):
        _exp_minus_into(l_ct[c], m_c[c], e_t)
        x_t = x_ct[c]
        total = np.float32(0.0)
        weighted = np.float32(0.0)
        for t in range(T):
            total += e_t[t]
            weighted += e_t[t] * x_t[t]
        mean = weighted / total
        variance = np.float32(0.0)
        for t in range(T):
            d = x_t[t] - mean
            variance += e_t[t] * (d * d)
        variance = variance / total
        mean_c[c] = mean
        std_c[c] = np.sqrt(eps) if variance < eps else np.sqrt(variance)  # (NaN stays NaN)


def softmax_mean_and_std(x_bct, logits_bct, eps: float = 1e-12):
    """``tts.speaker_encoder.softmax_mean_and_std`` (float32): the softmax's weights never made (the
    reference's [B, C, T] weights, and mean_and_std's four temporaries): each row's maximum by NumPy, then
    per row exp(l - max) into a row buffer, its sum and the two weighted sums, rows of channels side by
    side (``run_pieces``).  exp is ``_exp_f32`` (within 1 ulp) and the sums run in another order than the
    reference's: float32 rounding apart, the same numbers.  1536 x 937: 2.33 -> 0.96 ms."""
    if not isinstance(logits_bct, np.ndarray) or x_bct.dtype != np.float32 or logits_bct.dtype != np.float32:
        return NotImplemented
    if logits_bct.shape != x_bct.shape or x_bct.shape[-1] == 0:
        return NotImplemented
    B, C, T = x_bct.shape
    x_bct, logits_bct = np.ascontiguousarray(x_bct), np.ascontiguousarray(logits_bct)
    max_bc = np.max(logits_bct, axis=2)
    mean_bc, std_bc = np.empty((B, C), np.float32), np.empty((B, C), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // T)

    def piece(b, c0):
        c1 = min(C, c0 + rows)
        _softmax_mean_and_std_rows(
            x_bct[b, c0:c1],
            logits_bct[b, c0:c1],
            max_bc[b, c0:c1],
            np.float32(eps),
            mean_bc[b, c0:c1],
            std_bc[b, c0:c1],
        )

    run_pieces(piece, [(b, c0) for b in range(B) for c0 in range(0, C, rows)])
    return mean_bc, std_bc


@numba.njit(cache=True, nogil=True)
def _magnitude_rows(spectrum_tf, out_tf):
    """out = sqrt(re^2 + im^2 + 1e-9), each step rounded in float32 in that order (no fast-math: the
    reference's bits)."""
    for t in range(spectrum_tf.shape[0]):
        s_f, out_f = spectrum_tf[t], out_tf[t]
        for f in range(s_f.shape[0]):
            re, im = s_f[f].real, s_f[f].imag
            out_f[f] = np.sqrt((re * re + im * im) + np.float32(1e-9))


def spectral_magnitude(spectrum_btf):
    """``tts.speaker_encoder.spectral_magnitude`` (complex64): one pass over the spectrum, rows of frames
    side by side, where the reference's strided squares and sums make three passes and a temporary (937
    frames of 513 bins: 1.3 ms -> 0.2); the same bits."""
    if not isinstance(spectrum_btf, np.ndarray) or spectrum_btf.dtype != np.complex64 or spectrum_btf.ndim != 3:
        return NotImplemented
    B, T, F = spectrum_btf.shape
    spectrum_btf = np.ascontiguousarray(spectrum_btf)
    out_btf = np.empty((B, T, F), np.float32)
    rows = max(1, ELEMENTWISE_PIECE // max(F, 1))
    run_pieces(
        lambda b, t0: _magnitude_rows(spectrum_btf[b, t0 : t0 + rows], out_btf[b, t0 : t0 + rows]),
        [(b, t0) for b in range(B) for t0 in range(0, T, rows)],
    )
    return out_btf


# ----------------------------------------------------------------------------- transposed convolution

TRANSPOSED_PIECE_BYTES = 4 << 20  # the products of one piece of ``conv_transpose1d`` ([O * K, frames] float32)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _overlap_add_into(z_okf, first, t0, n, stride, bias_o, out_ot):
    """out[o, stride * t + p] = bias[o] + sum_j z[o, p + j * stride, t - j - first] for output frames
    t0 <= t < t0 + n, phases p < stride and j < K / stride, over the input frames z holds (frames
    first .. first + F - 1; the others are zeros): the taps' products added where they land, tap block j
    by tap block j over the frames where it has input (no test inside the loop), then the bias: the sum of
    a sample in the order j = 0, 1, ..., bias, as one sample at a time summed it (the same bits; 0.74
    against 1.2 ms for 96 channels x 1820 frames x 3 phases)."""
    O, K, F = z_okf.shape
    J = K // stride
    for o in range(O):
        row_s = out_ot[o, stride * t0 : stride * (t0 + n)]
        row_s[:] = 0.0
        for j in range(J):
            lo, hi = max(t0, first + j), min(t0 + n, first + j + F)  # the frames t with 0 <= t - j - first < F
            for p in range(stride):
                z_f = z_okf[o, p + j * stride]
                for t in range(lo, hi):
                    row_s[stride * (t - t0) + p] += z_f[t - j - first]
        row_s += bias_o[o]


FEW_FRAMES = 8  # up to this many input frames (a streaming chunk, a first frame): ``_few_frames_times``
FEW_FRAMES_COLUMNS = 256  # weight columns a thread sums at a time (their sums for 8 frames: 8 KB, in L1)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _few_frames_times(x_if, w_ij, j0, j1, columns, z_jf):
    """z[j, f] = sum_i x[i, f] w[i, j] for a few frames f and the columns j0 <= j < j1: strip by strip of
    ``columns`` columns, the strip's rows read in order, i = 0 .. I - 1, each row times x[i, f] added into
    the strip's sums for every frame (in the first-level cache), row i + 8 asked for meanwhile.  The
    weight is read once, from memory, where BLAS packs its every block (a copy) before multiplying a few
    columns (1536 -> 768 channels x 16 taps, 4 frames, 75 MB cold: 3.8 against 8.8 ms on 2 threads)."""
    I, J = w_ij.shape
    F = x_if.shape[1]
    words = w_ij.reshape(-1)
    sums_fn = np.empty((F, columns), dtype=np.float32)
    for s0 in range(j0, j1, columns):
        n = min(j1, s0 + columns) - s0
        sums_fn[:, :] = 0.0
        for i in range(I):
            if i + 8 < I:
                for j in range(0, n, 16):  # one request per 64-byte line
                    _prefetch(words, (i + 8) * J + s0 + j)
            w_n = w_ij[i, s0 : s0 + n]
            for f in range(F):
                x, sums_n = x_if[i, f], sums_fn[f, :n]
                for j in range(n):
                    sums_n[j] += x * w_n[j]
        for j in range(n):
            for f in range(F):
                z_jf[s0 + j, f] = sums_fn[f, j]


def conv_transpose1d(x_bct, w_iok, b_o=None, stride: int = 1):
    """``nn.conv_transpose1d`` for K = J * stride taps (the codec's K = 2 * stride): a piece of output
    frames t0 .. t0 + n - 1 (stride samples each) and output channels o0 .. o1 - 1 takes the products of
    their taps with input frames t0 - J + 1 .. t0 + n - 1 in ONE matrix product, the weight as stored read
    transposed, W^T [O * K, I], times x [I, frames], and adds each where it lands (``_overlap_add_into``).
    The pieces' outputs are disjoint (the J - 1 frames before a piece are multiplied again), so they run
    side by side (``run_pieces``).  Pieces span every channel and ``TRANSPOSED_PIECE_BYTES`` of products
    (few channels, long signals), or, where that would read the weight more often than it saves
    (``_transposed_pieces``), a thread's share of the channels and ``TRANSPOSED_CHANNEL_PIECE_BYTES``.
    Up to ``FEW_FRAMES`` input frames, the products of every tap come from ``_few_frames_times``."""
    B, C, T = x_bct.shape
    I, O, K = w_iok.shape
    if x_bct.dtype != np.float32 or K % stride or C != I:
        return NotImplemented
    J = K // stride
    x_bct = np.ascontiguousarray(x_bct)
    w_t = np.ascontiguousarray(w_iok).reshape(I, O * K).T  # a view: BLAS reads it transposed
    bias_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o, dtype=np.float32)
    frames = T + J - 1  # output frames: (T - 1) * stride + K samples
    out_bot = new_output((B, O, frames * stride))
    if T <= FEW_FRAMES:  # the weight streamed once, all its columns side by side
        n_threads, z_jf = _piece_threads(), np.empty((O * K, T), np.float32)
        ranges = [(O * K * t // n_threads, O * K * (t + 1) // n_threads) for t in range(n_threads)]
        for b in range(B):
            run_pieces(lambda j0, j1: _few_frames_times(x_bct[b], w_t.T, j0, j1, FEW_FRAMES_COLUMNS, z_jf), ranges)
            _overlap_add_into(z_jf.reshape(O, K, T), 0, 0, frames, stride, bias_o, out_bot[b])
        return out_bot
    step, n_piece = _transposed_pieces(O, K, frames, w_t.nbytes)

    def piece(b, o0, t0):
        o1, n = min(O, o0 + step), min(n_piece, frames - t0)
        first, last = max(t0 - J + 1, 0), min(t0 + n, T)  # the input frames this piece reads
        z_okf = (w_t[o0 * K : o1 * K] @ x_bct[b, :, first:last]).reshape(o1 - o0, K, last - first)
        _overlap_add_into(z_okf, first, t0, n, stride, bias_o[o0:o1], out_bot[b, o0:o1])

    run_pieces(piece, [(b, o0, t0) for b in range(B) for o0 in range(0, O, step) for t0 in range(0, frames, n_piece)])
    return out_bot


TRANSPOSED_CHANNEL_PIECE_BYTES = 32 << 20  # the products of a piece of some of the channels (bounds its memory)


def _transposed_pieces(O: int, K: int, frames: int, weight_bytes: int) -> tuple:
    """(channels, frames) of a piece of ``conv_transpose1d``: every channel and ``TRANSPOSED_PIECE_BYTES``
    of products (each piece reads the whole weight), unless a thread's share of the channels, with pieces
    of ``TRANSPOSED_CHANNEL_PIECE_BYTES`` (each piece reads its share of the weight), moves fewer bytes,
    counting the weight's reads and the products written and read again out of the cache: 1536 -> 768
    channels over 500 frames 103 -> 65 ms, 768 -> 384 over 4000 frames 85 -> 73 ms (cold weights, 2
    threads); 384 -> 192 over 20000 frames keeps all channels (its products would be 123 MB).  Too few
    frames for a piece per thread: shares too (1536 -> 768 over 4 frames, one frame piece on BLAS's
    two threads, 9.3 -> 7.8 ms)."""
    row_bytes = 4 * O * K  # the products of one frame
    n_all = max(16, TRANSPOSED_PIECE_BYTES // row_bytes)
    n_share = max(16, TRANSPOSED_CHANNEL_PIECE_BYTES // row_bytes)
    threads = _piece_threads()
    all_channels = -(-frames // n_all) * weight_bytes
    shares = -(-frames // n_share) * weight_bytes + 2 * frames * row_bytes
    if shares < all_channels or -(-frames // n_all) < threads:  # (fewer pieces than threads: shares, too)
        return -(-O // max(2, threads)), n_share
    return O, n_all


# ----------------------------------------------------------------------------- pieces on the BLAS threads


@functools.cache
def _blas_controller():
    """threadpoolctl's handle on the BLAS libraries loaded in this process (NumPy's and SciPy's)."""
    return threadpoolctl.ThreadpoolController().select(user_api="blas")


@functools.cache
def _piece_workers(n: int, pid: int) -> ThreadPoolExecutor:
    """The pool of ``n`` piece threads of process ``pid``: a process forked from this one has none of its
    threads, so it makes its own pool (the parent's would take work and never run it)."""
    return ThreadPoolExecutor(n, thread_name_prefix="refimpl-piece")


def _piece_threads() -> int:
    """How many threads ``run_pieces`` runs pieces on: as many as BLAS has."""
    return min([lib.num_threads for lib in _blas_controller().lib_controllers] or [1])


def run_pieces(piece, pieces: list) -> None:
    """``piece(*p)`` for every ``p`` in ``pieces`` (independent pieces of work writing disjoint outputs), on
    as many Python threads as BLAS has, BLAS running one thread per call meanwhile: its threads are lent to
    the pieces, so that each piece is one core's from its input to its output (the Numba kernels release the
    GIL), the elementwise work between the matrix products runs on every core too, and no thread spins
    waiting for another (Numba's parallel loops between BLAS calls did: the whole decode 15% slower).  Each
    piece computes the same bits whichever thread runs it."""
    controllers, n_threads = _blas_controller(), _piece_threads()
    if n_threads <= 1 or len(pieces) < 2 or threading.current_thread().name.startswith("refimpl-piece"):
        for p in pieces:
            piece(*p)
        return
    with _blas_lent(controllers):
        for f in [_piece_workers(n_threads, os.getpid()).submit(piece, *p) for p in pieces]:
            f.result()


_LENDING = threading.Lock()
_lending = {"runs": 0, "limiter": None}  # how many run_pieces hold BLAS at one thread now, and the limit's handle


@contextlib.contextmanager
def _blas_lent(controllers):
    """BLAS at one thread per call while any caller's pieces run: the first caller in sets the limit, the
    last one out restores the thread count from before (two threads decoding at once must not leave BLAS
    on one thread, as nested set-and-restore in the wrong order would)."""
    with _LENDING:
        if _lending["runs"] == 0:
            _lending["limiter"] = controllers.limit(limits=1)
        _lending["runs"] += 1
    try:
        yield
    finally:
        with _LENDING:
            _lending["runs"] -= 1
            if _lending["runs"] == 0:
                _lending["limiter"].restore_original_limits()


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
def _f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (``2 ** n`` from ``(n + 127) * 2 ** 23``)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_PARTS = (np.float32(0.693359375), np.float32(-2.12194440e-4))  # ln 2 = sum: the first exact in 9 bits
_EXP_R = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2))
_EXP_R += (np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))  # (Cephes' expf, by S. L. Moshier)


@numba.njit(fastmath={"contract"}, inline="always")
def _exp_f32(x):
    """exp(x) for float32 in plain arithmetic, so that the loops calling it vectorise (Numba's np.exp is
    a scalar libm call: 2.6 ns a value where this is 0.45): x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in
    two parts, the product with the first exact), exp(r) = 1 + r + r^2 P(r) with the degree-5 P of
    Cephes' expf, times 2^n built from exponent bits in two factors (2^n alone would overflow at n = 128
    or be subnormal below -126).  Within 1.0 ulp of exp over 4 million points of -87.3 .. 88.72 (NumPy's
    float32 exp: 2.4); inf above 88.72, 0 below -103.97, subnormals between, NaN stays NaN.  Inlined,
    it takes its caller's flags: call it from code compiled without reassociation (``_silu_times_into``),
    as the reduction's order is what makes r exact."""
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


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _silu_times_into(gate_tf, act_tf):
    """act = SiLU(gate) * act = gate * (1 / (1 + exp(-gate))) * act (``nn.silu`` times the up projection),
    in place; exp by ``_exp_f32`` (NumPy's error model: a division by zero is IEEE's, not a raised error,
    so the loop vectorises).  A 28-row prompt's 28 x 3072 values: 39 us against 226 with np.exp."""
    T, F = gate_tf.shape
    for t in range(T):
        gate_f, act_f = gate_tf[t], act_tf[t]
        for f in range(F):
            gate = gate_f[f]
            act_f[f] = gate * (np.float32(1.0) / (np.float32(1.0) + _exp_f32(-gate))) * act_f[f]


PREFETCH_LOCALITY = 2  # LLVM's locality 2: prefetcht1, into level 2 (3 would be prefetcht0, into level 1)


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the processor to start loading array[index] into its level-2 cache (``prefetcht1``; no effect
    on the result).  Into level 1 instead (``prefetcht0``), a generation frame measured 5-6% slower
    (149-153 ms against 139-144 ms, alternating)."""
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


@numba.njit(inline="always")
def _prefetch_row(words, I, o):
    """Ask for the 64-byte lines of weight row o of the flat words of a matrix with I columns."""
    for j in range(o * I, (o + 1) * I, 32):
        _prefetch(words, j)


# ----------------------------------------------------------------------------- one decoder layer, a few new positions


@numba.njit(fastmath=FASTMATH, inline="always")
def _rms_norm_into(x_c, w_c, eps, out_c):
    """out = w * (x / sqrt(mean(x^2) + eps)) (``nn.rms_norm`` of one vector)."""
    C = x_c.shape[0]
    acc = np.float32(0.0)
    for i in range(C):
        acc += x_c[i] * x_c[i]
    root = np.sqrt(acc / np.float32(C) + eps)
    for i in range(C):
        out_c[i] = w_c[i] * (x_c[i] / root)


@numba.njit(fastmath=FASTMATH, inline="always")
def _dot_bf16(x_i, bits_oi, o):
    acc = np.float32(0.0)
    for i in range(bits_oi.shape[1]):
        acc += x_i[i] * _bf16_to_f32(bits_oi[o, i])
    return acc


@numba.njit(fastmath=FASTMATH, inline="always")
def _norm_rope_head(v_d, w_d, eps, cos_d, sin_d, tmp_d):
    """In place: v = rope(rms_norm(v, w)) for one head (``nn.rms_norm`` then ``nn.apply_rope``)."""
    _rms_norm_into(v_d, w_d, eps, tmp_d)
    half = v_d.shape[0] // 2
    for j in range(half):
        v_d[j] = tmp_d[j] * cos_d[j] + (-tmp_d[j + half]) * sin_d[j]
        v_d[j + half] = tmp_d[j + half] * cos_d[j + half] + tmp_d[j] * sin_d[j + half]


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _matvec_bf16_into(x_i, bits_oi, out_o):
    """out[o] = sum_i x[i] * widen(bits[o, i]) for ONE row of x, parallel over the weight rows, row o + 8
    asked for while row o is multiplied.  One matrix per parallel loop: a loop whose body chooses between
    two or three matrices (the q/k/v rows stacked) streamed them at 20 GB/s where one loop per matrix
    reads 28 (the same weights, 2 threads: docs/performance.md)."""
    O, I = bits_oi.shape
    words = bits_oi.reshape(-1)
    for o in prange(O):
        if o + PREFETCH_ROWS_AHEAD < O:
            _prefetch_row(words, I, o + PREFETCH_ROWS_AHEAD)
        out_o[o] = _dot_bf16(x_i, bits_oi, o)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _attend_new_positions(q_thd, k_gsd, v_gsd, n, out_thd):
    """out[t, h] = softmax(q[t, h] . k[g, :n + t + 1] / sqrt(D)) @ v[g, :n + t + 1] for each new position t
    (the cache's n + t) and each head h of group g (GQA): the attention of the T new positions over the
    cached keys and the new ones up to their own (``nn.attention``), one parallel loop over the heads for
    all of them (a loop per position: a 28-position prompt launched 28 per layer).  A head's weighted sum
    of the values runs in its own D floats, stored into ``out`` once: summed in ``out`` itself, which the
    compiler cannot prove apart from ``v``, the loop over d ran one lane at a time (a step's attention
    over 41 positions 47 us, 12 us so; the same sums in the same order, the same bits)."""
    G, D = k_gsd.shape[0], k_gsd.shape[2]
    T, H = q_thd.shape[0], q_thd.shape[1] // D
    scale = np.float32(D**-0.5)
    for hd in prange(H):
        g = hd // (H // G)
        scores = np.empty(n + T, dtype=np.float32)
        sum_d = np.empty(D, dtype=np.float32)
        for t in range(T):
            S = n + t + 1
            q_d = q_thd[t, hd * D : (hd + 1) * D]
            m = np.float32(-np.inf)
            for s_ in range(S):
                k_d = k_gsd[g, s_]
                acc = np.float32(0.0)
                for d in range(D):
                    acc += q_d[d] * k_d[d]
                scores[s_] = acc * scale
                if scores[s_] > m:
                    m = scores[s_]
            total = np.float32(0.0)
            for s_ in range(S):
                scores[s_] = np.exp(scores[s_] - m)
                total += scores[s_]
            for d in range(D):
                sum_d[d] = 0.0
            for s_ in range(S):
                p = scores[s_] / total
                v_d = v_gsd[g, s_]
                for d in range(D):
                    sum_d[d] += p * v_d[d]
            for d in range(D):
                out_thd[t, hd * D + d] = sum_d[d]


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


@numba.njit(fastmath=FASTMATH, cache=True)
def _products_into(x_ni, bits_oi, out_no, n_threads, rows, tiles):
    """out = x @ widen(bits)^T for the rows of x of a generation step or a short prompt, by the kernel
    ``linear`` chooses for ``rows`` rows: one by ``_matvec_bf16_into``, up to ``MATVEC_MAX_ROWS`` by
    ``_bf16_rows_times`` (each weight row read once for all of them), more by the AMX tile kernel
    (``_tile_bf16_times``) where ``tiles`` and the shapes let it, else by the block kernel
    (``_bf16_block_times``).  ``rows`` is the layer's count of new positions, also where x holds fewer
    (the last position alone): each kernel sums a row the same way whatever the others, so the last
    position's output has the same bits either way."""
    O, I = bits_oi.shape
    if rows == 1:
        _matvec_bf16_into(x_ni[0], bits_oi, out_no[0])
    elif rows <= MATVEC_MAX_ROWS:
        _bf16_rows_times(x_ni, bits_oi, out_no)
    elif _tiles_take(tiles, O, I):
        _tile_bf16_times(x_ni, bits_oi, out_no, n_threads)
    else:
        _bf16_block_times(x_ni, bits_oi, out_no, n_threads)


@numba.njit(fastmath=FASTMATH, cache=True)
def _decoder_step_bf16(
    x_tc, ln1_c, q_oi, k_oi, v_oi, qn_d, kn_d, o_oi, ln2_c, gate_fi, up_fi, down_cf, cos_td, sin_td,
    k_gsd, v_gsd, n, eps, n_threads, first_out, tiles
):  # fmt: skip
    """One Qwen3 decoder layer for T new positions of ONE row (a step's one, the code predictor's first
    pass's two, a prompt's up to ``transformer.STEP_MAX_POSITIONS``), on bf16 words, with its KV cache
    (written at indices n..n+T-1; position t attends over 0..n+t): returns the layer's output at positions
    first_out..T-1 [T - first_out, C] (the keys and values of all T are cached; q, the attention, o and the
    MLP run for those positions only: a prompt's last layer needs its last position alone).  One
    parallel loop per matrix (q, k, v, o, gate, up, down: ``_products_into``) and one over the heads for
    the new positions' attention; the norms, RoPE, the residual sums and SiLU between them on one thread;
    the formulas of ``transformer.transformer_layer`` in the same order.  ``tiles``: a prompt's products
    may run on the AMX tile registers (``USE_TILES``)."""
    T, C = x_tc.shape
    G, D = k_gsd.shape[0], k_gsd.shape[2]
    Oq, Ok, F = _matrix_rows(q_oi), _matrix_rows(k_oi), _matrix_rows(gate_fi)
    H = Oq // D
    R = T - first_out  # the positions whose output is returned
    h_tc = _line_aligned_empty(T, C)
    for t in range(T):
        _rms_norm_into(x_tc[t], ln1_c, eps, h_tc[t])
    q_rq = _line_aligned_empty(R, Oq)
    k_tk = np.empty((T, Ok), dtype=np.float32)
    v_tk = np.empty((T, Ok), dtype=np.float32)
    _weight_products_into(np.ascontiguousarray(h_tc[first_out:]), q_oi, q_rq, n_threads, T, tiles)
    _weight_products_into(h_tc, k_oi, k_tk, n_threads, T, tiles)
    _weight_products_into(h_tc, v_oi, v_tk, n_threads, T, tiles)
    tmp_d = np.empty(D, dtype=np.float32)
    for t in range(T):
        for g in range(G):
            _norm_rope_head(k_tk[t, g * D : (g + 1) * D], kn_d, eps, cos_td[t], sin_td[t], tmp_d)
            for d in range(D):
                k_gsd[g, n + t, d] = k_tk[t, g * D + d]
                v_gsd[g, n + t, d] = v_tk[t, g * D + d]
    for r in range(R):
        t = first_out + r
        for hd in range(H):
            _norm_rope_head(q_rq[r, hd * D : (hd + 1) * D], qn_d, eps, cos_td[t], sin_td[t], tmp_d)
    attn_rq = _line_aligned_empty(R, H * D)
    _attend_new_positions(q_rq, k_gsd, v_gsd, n + first_out, attn_rq)  # (every new key cached: r sees 0..n+t)
    x1_rc = np.empty((R, C), dtype=np.float32)
    _weight_products_into(attn_rq, o_oi, x1_rc, n_threads, T, tiles)
    h_rc = _line_aligned_empty(R, C)
    for r in range(R):
        for c in range(C):
            x1_rc[r, c] = x_tc[first_out + r, c] + x1_rc[r, c]
        _rms_norm_into(x1_rc[r], ln2_c, eps, h_rc[r])
    gate_rf = np.empty((R, F), dtype=np.float32)
    act_rf = _line_aligned_empty(R, F)
    _weight_products_into(h_rc, gate_fi, gate_rf, n_threads, T, tiles)
    _weight_products_into(h_rc, up_fi, act_rf, n_threads, T, tiles)
    _silu_times_into(gate_rf, act_rf)
    out_rc = np.empty((R, C), dtype=np.float32)
    _weight_products_into(act_rf, down_cf, out_rc, n_threads, T, tiles)
    for r in range(R):
        for c in range(C):
            out_rc[r, c] = x1_rc[r, c] + out_rc[r, c]
    return out_rc


STEP_TENSORS = (  # a layer's tensors in the order of _decoder_step_bf16's arguments
    *("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    *("self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.weight"),
    *("post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"),
)
STEP_MATRICES = tuple(j for j, name in enumerate(STEP_TENSORS) if name.endswith("_proj.weight"))  # their bf16 words


@numba.njit(fastmath=FASTMATH, cache=True)
def _decoder_steps_bf16(
    x_tc, ln1_l, q_l, k_l, v_l, qn_l, kn_l, o_l, ln2_l, gate_l, up_l, down_l, cos_td, sin_td, k_l_gsd, v_l_gsd,
    n, eps, n_threads, last_first_out, tiles
):  # fmt: skip
    """``_decoder_step_bf16`` through the L layers of a stack in turn, each argument that differs by layer a
    tuple of L (layer i: ``q_l[i]``...; its KV cache ``k_l_gsd[i]``, ``v_l_gsd[i]``), the last layer's output
    from position ``last_first_out`` on: one call for a generation step's whole stack."""
    L = len(q_l)
    for i in range(L):
        x_tc = _decoder_step_bf16(
            x_tc, ln1_l[i], q_l[i], k_l[i], v_l[i], qn_l[i], kn_l[i], o_l[i], ln2_l[i], gate_l[i], up_l[i],
            down_l[i], cos_td, sin_td, k_l_gsd[i], v_l_gsd[i], n, eps, n_threads,
            last_first_out if i == L - 1 else 0, tiles,
        )  # fmt: skip
    return x_tc


@functools.lru_cache(maxsize=16)
def _stack_tensor_names(prefixes: tuple):
    """One C call that takes every tensor of the layers ``prefixes`` from a weights dict, layer by layer in
    the order of ``STEP_TENSORS`` (only names: valid for any model whose layers have these prefixes)."""
    return operator.itemgetter(*(p + name for p in prefixes for name in STEP_TENSORS))


def _one_array_type(arrays: tuple) -> bool:
    """Whether Numba sees every array of ``arrays`` as one type (dtype, dimensions, C order, writability),
    so that the tuple is one a kernel may index at run time."""
    a0 = arrays[0]
    return all(
        a.dtype == a0.dtype and a.ndim == a0.ndim and a.flags.c_contiguous and a.flags.writeable == a0.flags.writeable
        for a in arrays
    )


def decoder_stack_step(x_btc, layers: list, cfg, cos_btd, sin_btd, caches: list, eps: float, last_only: bool = False):
    """``transformer.decoder_stack_step`` (a generation step through every layer of a stack, each a Qwen3
    layer on bf16 words with its ``KVCache``) in one Numba call: the layers' tensors taken from the weights
    dict in one C call (``_stack_tensor_names``) and passed as tuples, one per argument of the layer kernel;
    the numbers are those of ``decoder_layer_step`` layer by layer, the same kernel in the same order."""
    weights, n, T = layers[0].weights, caches[0].length, x_btc.shape[1]
    if any(lw.weights is not weights for lw in layers) or any(c.length != n for c in caches):
        return NotImplemented
    tensors = _stack_tensor_names(tuple(lw.prefix for lw in layers))(weights)
    K = len(STEP_TENSORS)
    by_argument = [tensors[j::K] for j in range(K)]
    packed = {j: tuple(map(packed_words, by_argument[j])) for j in STEP_MATRICES} if T <= MATVEC_MAX_ROWS else {}
    use_packed = bool(packed) and all(p is not None for words in packed.values() for p in words)
    for j in STEP_MATRICES:  # a streamed stack's packed words (all of its matrices), else its words as they are
        by_argument[j] = packed[j] if use_packed else tuple(m.bits for m in by_argument[j])
    for cache in caches:
        cache.reserve(T)
    k_caches, v_caches = tuple(c.k[0] for c in caches), tuple(c.v[0] for c in caches)
    arrays = [a for j, a in enumerate(by_argument) if not (use_packed and j in STEP_MATRICES)]
    if not all(map(_one_array_type, (*arrays, k_caches, v_caches))):
        return NotImplemented  # (the reference then runs the layers one call each)
    C = x_btc.shape[2]
    x_tc = np.array(x_btc, dtype=np.float32, order="C").reshape(T, C)  # (a writable copy: the layers' type)
    out_tc = _decoder_steps_bf16(
        x_tc,
        *by_argument,
        np.ascontiguousarray(cos_btd, dtype=np.float32).reshape(T, -1),
        np.ascontiguousarray(sin_btd, dtype=np.float32).reshape(T, -1),
        k_caches,
        v_caches,
        n,
        np.float32(eps),
        numba.get_num_threads(),
        T - 1 if last_only else 0,
        USE_TILES,
    )
    for cache in caches:
        cache.length = n + T
    return out_tc.reshape((1, out_tc.shape[0], C))


def decoder_layer_step(x_btc, lw, cfg, cos_btd, sin_btd, cache, eps: float, last_only: bool = False):
    """``transformer.decoder_layer_step`` (one Qwen3 layer, a few new positions of one row, bf16 weights, a
    ``KVCache`` with room for them) in one Numba call: the stack of this one layer (``decoder_stack_step``);
    ``last_only``: the output at the last position alone, computed for it alone."""
    return decoder_stack_step(x_btc, [lw], cfg, cos_btd, sin_btd, [cache], eps, last_only)


@numba.njit(cache=True)
def _widen_bf16_into(bits_oi, out_oi):
    """out = the float32 values of the bfloat16 words (exact).  One thread: it alternates with BLAS calls,
    and Numba's parallel threads would still be spinning while BLAS's run (measured: 3x slower prompts)."""
    O, I = bits_oi.shape
    for o in range(O):
        for i in range(I):
            out_oi[o, i] = _bf16_to_f32(bits_oi[o, i])


TILE_N = 4  # the block kernel's register tile: 4 rows of x ...
TILE_O = 6  # ... times 6 weight rows: 24 accumulators (4 x 4 measured 181 against 186-198 GFLOP/s, 4 x 8 125)
BLOCK_I_CHUNK = 1024  # columns summed at a time (512 measured the same)


@numba.njit(inline="always")
def _store_6(out_no, n, o0, cols, add, v0, v1, v2, v3, v4, v5):
    """out[n, o0 : o0 + cols] = (v0, ..., v5)[:cols], or += where ``add`` (a later chunk of the sums)."""
    if add:
        v0 += out_no[n, o0]
        v1 += out_no[n, o0 + 1] if cols > 1 else np.float32(0.0)
        v2 += out_no[n, o0 + 2] if cols > 2 else np.float32(0.0)
        v3 += out_no[n, o0 + 3] if cols > 3 else np.float32(0.0)
        v4 += out_no[n, o0 + 4] if cols > 4 else np.float32(0.0)
        v5 += out_no[n, o0 + 5] if cols > 5 else np.float32(0.0)
    out_no[n, o0] = v0
    if cols > 1:
        out_no[n, o0 + 1] = v1
    if cols > 2:
        out_no[n, o0 + 2] = v2
    if cols > 3:
        out_no[n, o0 + 3] = v3
    if cols > 4:
        out_no[n, o0 + 4] = v4
    if cols > 5:
        out_no[n, o0 + 5] = v5


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _bf16_block_times(x_ni, bits_oi, out_no, n_threads):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) for a few dozen rows of x (a prompt): each thread takes
    a contiguous range of weight rows, widens 6 of them at a time into its own small float32 buffer
    (L1/L2-resident) and multiplies them with every row of x, 4 rows of x at a time, so each loaded
    value feeds 4 or 6 multiply-adds (24 accumulators; the remainders repeat the last row and drop it).
    The next block's weight rows (contiguous words) are asked for a slice at a time, one slice per 4 rows
    of x, so the requests spread over the block's work instead of coming in one burst the memory system
    drops: 181 -> 192 GFLOP/s over a Talker's 28 layers of cold weights, 28 rows of x, 2 threads.  The sums
    run over ``BLOCK_I_CHUNK`` columns at a time, for every row of x, so that the 6 weight rows' and 4 x
    rows' chunks (40 KB) stay in the first-level cache: the o and down products (2048 and 3072 columns)
    186-203 -> 204-232 GFLOP/s, a Talker's 28 layers 2-7% faster; up to 1024 columns the same bits.  The
    loops run over 1-D views from index 0 (indexed from ``c0``, LLVM gathered the values one by one).  The
    rows of x and of the widened buffer start on 64-byte boundaries (x copied where its rows do not): from
    Numba's or NumPy's 32- or 16-byte starts every load spanned two cache lines, and a Talker's 28 layers
    over 28 rows took 141-148 ms against 118-123 aligned (the same bits)."""
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    x_ni = _line_aligned_rows(x_ni)
    words = bits_oi.reshape(-1)
    blocks = (O + TILE_O - 1) // TILE_O
    n_blocks = (N + TILE_N - 1) // TILE_N
    row = x_ni.shape[1]  # I, or I rounded up to a whole cache line
    for t in prange(n_threads):
        w = _line_aligned_empty(TILE_O, row)  # one buffer per thread
        for ob in range(t * blocks // n_threads, (t + 1) * blocks // n_threads):
            o0 = ob * TILE_O
            for r in range(TILE_O):
                o = min(o0 + r, O - 1)
                for i in range(I):
                    w[r, i] = _bf16_to_f32(bits_oi[o, i])
            ahead0 = min((o0 + TILE_O) * I, O * I)  # the next block's words: [ahead0, ahead1)
            ahead1 = min((o0 + 2 * TILE_O) * I, O * I)
            chunks = (I + BLOCK_I_CHUNK - 1) // BLOCK_I_CHUNK
            pieces = n_blocks * chunks  # the next block's words asked for a slice per tile of every chunk
            slice_ = ((ahead1 - ahead0 + pieces - 1) // pieces + 31) // 32 * 32  # whole 64-byte lines
            for c0 in range(0, I, BLOCK_I_CHUNK):
                c1 = min(I, c0 + BLOCK_I_CHUNK)
                for n0 in range(0, N, TILE_N):
                    k = (c0 // BLOCK_I_CHUNK) * n_blocks + n0 // TILE_N
                    for j in range(ahead0 + k * slice_, min(ahead0 + (k + 1) * slice_, ahead1), 32):
                        _prefetch(words, j)
                    n1, n2, n3 = min(n0 + 1, N - 1), min(n0 + 2, N - 1), min(n0 + 3, N - 1)
                    a00 = a01 = a02 = a03 = a04 = a05 = np.float32(0.0)
                    a10 = a11 = a12 = a13 = a14 = a15 = np.float32(0.0)
                    a20 = a21 = a22 = a23 = a24 = a25 = np.float32(0.0)
                    a30 = a31 = a32 = a33 = a34 = a35 = np.float32(0.0)
                    x0_i, x1_i, x2_i, x3_i = x_ni[n0, c0:c1], x_ni[n1, c0:c1], x_ni[n2, c0:c1], x_ni[n3, c0:c1]
                    w0_i, w1_i, w2_i = w[0, c0:c1], w[1, c0:c1], w[2, c0:c1]
                    w3_i, w4_i, w5_i = w[3, c0:c1], w[4, c0:c1], w[5, c0:c1]
                    for i in range(c1 - c0):
                        x0, x1, x2, x3 = x0_i[i], x1_i[i], x2_i[i], x3_i[i]
                        w0, w1, w2, w3, w4, w5 = w0_i[i], w1_i[i], w2_i[i], w3_i[i], w4_i[i], w5_i[i]
                        a00 += x0 * w0
                        a01 += x0 * w1
                        a02 += x0 * w2
                        a03 += x0 * w3
                        a04 += x0 * w4
                        a05 += x0 * w5
                        a10 += x1 * w0
                        a11 += x1 * w1
                        a12 += x1 * w2
                        a13 += x1 * w3
                        a14 += x1 * w4
                        a15 += x1 * w5
                        a20 += x2 * w0
                        a21 += x2 * w1
                        a22 += x2 * w2
                        a23 += x2 * w3
                        a24 += x2 * w4
                        a25 += x2 * w5
                        a30 += x3 * w0
                        a31 += x3 * w1
                        a32 += x3 * w2
                        a33 += x3 * w3
                        a34 += x3 * w4
                        a35 += x3 * w5
                    cols = min(TILE_O, O - o0)
                    _store_6(out_no, n0, o0, cols, c0 > 0, a00, a01, a02, a03, a04, a05)
                    if n0 + 1 < N:
                        _store_6(out_no, n1, o0, cols, c0 > 0, a10, a11, a12, a13, a14, a15)
                    if n0 + 2 < N:
                        _store_6(out_no, n2, o0, cols, c0 > 0, a20, a21, a22, a23, a24, a25)
                    if n0 + 3 < N:
                        _store_6(out_no, n3, o0, cols, c0 > 0, a30, a31, a32, a33, a34, a35)


# ----------------------------------------------------------------------------- attention over a mask's positions


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _exp_shifted_into(scores_s, m):
    """scores = exp(scores - m), by ``_exp_f32`` (its own function: compiled without reassociation, which
    would break the exp's range reduction, while its caller sums with it); a masked key's -inf is 0 without
    its exp (exp(-inf - m) rounds through subnormal products, each a microcode assist: 2000 rows of 250
    scores, half of them masked, 2.29 against 0.40 ms)."""
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
    """The largest of x (no NaN in it), over 16 lanes of maxima (one chain of maxima does not vectorise:
    0.37 against 0.20 ms for 2000 rows of 250)."""
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
    where the reference's scale, mask and softmax make a new array of scores each (the codec encoder's 8
    heads x 250 x 250 scores a layer: 2.0-2.3 against 3.1-4.6 ms).  An explicit boolean mask, float64,
    another array type, positions that are not integers, no query or no key go to the reference."""
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

        def piece(r0, rows_rs=rows_rs, positions=positions):
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


# ----------------------------------------------------------------------------- AMX tiles: a prompt's bf16 products
#
# Processors with AMX (Intel's tile registers: 8 tiles of 16 rows x 64 bytes, and ``TDPBF16PS``, which adds the
# products of bfloat16 pairs into float32 tiles) multiply bf16 matrices many times faster than 512-bit
# vectors.  The weights are bf16 words already; x is float32, and is split EXACTLY into three bf16 parts
# (x = hi + mid + lo: each the top 8 significant bits of what is left), so that every product of a word and
# a part is exact and W x = W hi + W mid + W lo, summed in float32.  Linux hands a process the tile registers
# when it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, Linux 5.16+); Numba's LLVM emits the
# tile instructions from its ``llvm.x86.*`` intrinsics when the compile target has the features.

_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # (x86-64 Linux)


def _compile_features() -> set:
    """The CPU features Numba compiles for: its ``CPU_FEATURES`` (``NUMBA_CPU_FEATURES``, which
    ``_prefer_512_bit_vectors`` sets from the host's; none for ``NUMBA_CPU_NAME=generic``), else the host's."""
    import llvmlite.binding as llvm

    configured = numba.core.config.CPU_FEATURES
    return set((configured if configured is not None else llvm.get_host_cpu_features().flatten()).split(","))


TILES_COMPILED = {"+amx-tile", "+amx-bf16"} <= _compile_features()  # else the tile intrinsics emit nothing


def _tiles_granted() -> bool:
    """Whether this process may use the tile registers: compiled for them, on x86-64 Linux, granted by the
    kernel, and not turned off (``REFIMPL_AMX=0``)."""
    if not TILES_COMPILED or not switch("REFIMPL_AMX"):
        return False
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


USE_TILES = _tiles_granted()


def _tile_call(name: str, immediates: tuple, with_pointer: bool):
    """An intrinsic for one tile instruction on fixed tile registers ``immediates``; with a pointer, its
    arguments are (array, index of the first element, row stride in bytes).  Where the compile target has
    no tiles it emits nothing (it is never called then: ``USE_TILES`` is False)."""

    def typer(typingctx, *args):
        sig = types.void(*args)

        def codegen(context, builder, signature, llargs):
            if not TILES_COMPILED:
                return context.get_dummy_value()
            i8, i64 = ir.IntType(8), ir.IntType(64)
            p8 = i8.as_pointer()
            values = [ir.Constant(i8, t) for t in immediates]
            arg_types = [i8] * len(immediates)
            if with_pointer:
                aryty = signature.args[0]
                ary = context.make_array(aryty)(context, builder, llargs[0])
                ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [llargs[1]], wraparound=False)
                stride = context.cast(builder, llargs[2], signature.args[2], types.int64)
                values += [builder.bitcast(ptr, p8), stride]
                arg_types += [p8, i64]
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), arg_types), f"llvm.x86.{name}"
            )
            builder.call(fn, values)
            return context.get_dummy_value()

        return sig, codegen

    if with_pointer:
        return intrinsic(lambda typingctx, array, index, stride: typer(typingctx, array, index, stride))
    return intrinsic(lambda typingctx: typer(typingctx))


@intrinsic
def _tile_config(typingctx, config):
    """``ldtilecfg``: this thread's tile shapes from the 64-byte ``config``."""
    sig = types.void(config)

    def codegen(context, builder, signature, args):
        if TILES_COMPILED:
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            p8 = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [p8])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.ldtilecfg")
            builder.call(fn, [builder.bitcast(data, p8)])
        return context.get_dummy_value()

    return sig, codegen


_tile_release = _tile_call("tilerelease", (), False)
_zero_c0, _zero_c1, _zero_c2, _zero_c3 = (_tile_call("tilezero", (t,), False) for t in range(4))
_store_c0, _store_c1, _store_c2, _store_c3 = (_tile_call("tilestored64", (t,), True) for t in range(4))
_load_c0, _load_c1, _load_c2, _load_c3, _load_a4, _load_a5, _load_b6, _load_b7 = (
    _tile_call("tileloadd64", (t,), True) for t in range(8)
)
# C[o-tile i, n-tile j] (tile 2 i + j) += A[o-tile i] (tile 4 + i) . B[n-tile j] (tile 6 + j)
_dot_c0, _dot_c1 = _tile_call("tdpbf16ps", (0, 4, 6), False), _tile_call("tdpbf16ps", (1, 4, 7), False)
_dot_c2, _dot_c3 = _tile_call("tdpbf16ps", (2, 5, 6), False), _tile_call("tdpbf16ps", (3, 5, 7), False)


@numba.njit(inline="always")
def _tile_shapes():
    """The 64-byte tile configuration: palette 1, all 8 tiles 16 rows of 64 bytes (C: 16 x 16 float32;
    A: 16 weight rows x 32 words; B: 16 pairs of columns x 16 rows of x x 2 words)."""
    config = np.zeros(64, dtype=np.uint8)
    config[0] = 1
    for t in range(8):
        config[16 + 2 * t] = 64  # bytes per row (little-endian 16 bits)
        config[48 + t] = 16  # rows
    return config


@intrinsic
def _bits_of(typingctx, value):
    """The 32-bit pattern of a float32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@numba.njit(inline="always")
def _bf16_parts(v):
    """The three bf16 words (hi, mid, lo) of a float32 v, hi + mid + lo = v exactly: hi = v with its low 16
    bits cleared, mid = the same of v - hi, lo = v - hi - mid (8 significant bits at most: a bf16 word
    exactly).  An infinity or a NaN is its hi part alone (a NaN kept a NaN: its payload may lie in the
    cleared bits).  Without branches (selects), so that loops over it vectorise."""
    low = np.uint32(0xFFFF0000)
    hi = _bits_of(v) & low
    rest = v - _f32_from_bits(np.int32(hi))  # (exact; NaN for an infinity or a NaN)
    mid = _bits_of(rest) & low
    lo = _bits_of(rest - _f32_from_bits(np.int32(mid)))
    finite = abs(v) < np.inf
    zero = np.uint32(0)
    hi = hi if finite or v == v else hi | np.uint32(0x00400000)
    mid, lo = (mid, lo) if finite else (zero, zero)
    return np.uint16(hi >> np.uint32(16)), np.uint16(mid >> np.uint32(16)), np.uint16(lo >> np.uint32(16))


@numba.njit(parallel=True, cache=True)
def _split_into_pairs(x_ni, parts_pkn2):
    """parts[p, k, n, j] = the bf16 word of part p of x[n, 2 k + j] (``_bf16_parts``; 0 for the padding
    rows n >= N), so hi + mid + lo = x.  The tiles' layout for B: each 64-byte row holds the pairs of two
    columns of x for 16 of its rows.  In blocks of 32 columns, whose three part blocks (16 pairs x rows)
    stay in the first-level cache while they are written.  An infinity or a NaN is its hi part alone, so
    that the products give what the float32 product gives."""
    N, I = x_ni.shape
    npad = parts_pkn2.shape[2]
    for kb in prange(I // 32):
        for n in range(npad):
            for j in range(32):
                i = 32 * kb + j
                hi, mid, lo = _bf16_parts(x_ni[n, i] if n < N else np.float32(0.0))
                parts_pkn2[0, i // 2, n, i % 2] = hi
                parts_pkn2[1, i // 2, n, i % 2] = mid
                parts_pkn2[2, i // 2, n, i % 2] = lo


TILE_K_CHUNK = 1024  # columns summed in the tiles at a time; the chunks' sums added in float32 after


@numba.njit(parallel=True, cache=True)
def _tile_bf16_times(x_ni, bits_oi, out_no, n_threads):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) on the tile registers (O a multiple of 32, I of 32):
    x split into its three exact bf16 parts (``_split_into_pairs``); each thread takes a range of pairs
    of 16-row weight tiles, read from the words as stored (the next pair's words asked for meanwhile, 11
    lines before each part's multiplies rather than 32 at once: 0.85-0.87 -> 0.81 of the block kernel's
    time), and for every 32 rows of x four float32 tiles of sums, 2 weight tiles x 2 tiles of x, the two tiles of x
    loaded alternately so that a load never waits for the multiply still reading the other.  The sums
    run over ``TILE_K_CHUNK`` columns at a time, the chunks' sums added in float32 (one sum over all
    3 I terms in a tile was 4.5 times further from the exact product than the block kernel at I = 3072).
    Each output's sum involves its own row of x alone, so a row gets the same bits whatever the others."""
    N, I = x_ni.shape
    O = bits_oi.shape[0]
    npad = (N + 31) // 32 * 32
    parts = np.empty((3, I // 2, npad, 2), dtype=np.uint16)
    _split_into_pairs(x_ni, parts)
    pairs = parts.reshape(-1)
    words = bits_oi.reshape(-1)
    part_words = (I // 2) * npad * 2
    o_pairs = O // 32
    steps = TILE_K_CHUNK // 32
    for t in prange(n_threads):
        sums = np.empty((32, npad), dtype=np.float32)  # one o-pair's sums, this thread's
        chunk = np.empty(32 * npad, dtype=np.float32)
        _tile_config(_tile_shapes())
        for op in range(t * o_pairs // n_threads, (t + 1) * o_pairs // n_threads):
            o0 = op * 32
            for s0 in range(0, I // 32, steps):
                for n0 in range(0, npad, 32):
                    ahead = n0 == 0 and op + 1 < o_pairs  # the next pair of tiles' words asked for, in order
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                    for s in range(s0, min(s0 + steps, I // 32)):
                        _load_a4(words, o0 * I + s * 32, 2 * I)
                        _load_a5(words, (o0 + 16) * I + s * 32, 2 * I)
                        for p in range(3):
                            if ahead:
                                for r in range(p * 11, min(p * 11 + 11, 32)):
                                    _prefetch(words, (o0 + 32) * I + (s * 32 + r) * 32)
                            first = p * part_words + s * 32 * npad + n0 * 2
                            _load_b6(pairs, first, 4 * npad)
                            _load_b7(pairs, first + 32, 4 * npad)
                            _dot_c0()
                            _dot_c2()
                            _dot_c1()
                            _dot_c3()
                    _store_c0(chunk, n0, 4 * npad)
                    _store_c1(chunk, n0 + 16, 4 * npad)
                    _store_c2(chunk, 16 * npad + n0, 4 * npad)
                    _store_c3(chunk, 16 * npad + n0 + 16, 4 * npad)
                chunk_on = chunk.reshape(32, npad)
                if s0 == 0:
                    sums[:, :] = chunk_on
                else:
                    for r in range(32):
                        for n in range(npad):
                            sums[r, n] += chunk_on[r, n]
            for r in range(32):
                for n in range(N):
                    out_no[n, o0 + r] = sums[r, n]
        _tile_release()


@numba.njit(cache=True)
def _tiles_take(tiles, O, I):
    """Whether the tile kernel takes the product of more than ``MATVEC_MAX_ROWS`` rows of x by an O x I bf16
    matrix: tiles granted (``USE_TILES``, passed in: compiled code must not freeze it) and whole tiles."""
    return tiles and O % 32 == 0 and I % 32 == 0 and I > 0


# ----------------------------------------------------------------------------- the speaker encoder's TDNNs on the tiles
# A TDNN's weights are bf16 values in the released checkpoints (widened to float32 at load): each is one
# exact bf16 word, so the weights are the A tiles as they are, and the signal is split into its three exact
# parts (``_bf16_parts``) as in ``_tile_bf16_times``: every product exact, the same sums in the same order.
# The prompt's kernel streams all of the split signal once per 32 outputs (9 MB at 1536 channels x 937
# steps) and reads each tile's rows a whole reduction apart: 104 GFLOP/s a thread.  Here each thread
# splits ``TILE_TDNN_STEPS`` steps at a time into a buffer that stays in its level-2 cache, the taps read
# in place (no stacked copy), and every pair of weight tiles (one contiguous kilobyte each, made once per
# read-only weight) passes over them; bias and ReLU are applied as the sums are stored.  A tile register
# is not renamed, so a load waits for the multiplies still reading its register: the second tile of steps
# is loaded between the first one's two multiplies.

TILE_TDNN_STEPS = 128  # time steps of a block: their split taps (3 x 2 bytes x 128 x the stacked width, 1.2 MB
# at 1536 channels) stay in the thread's level-2 cache while every weight tile passes over them
TILE_SPLIT_AHEAD = 8  # columns ahead whose rows of x the split asks for while it splits the current ones
TILE_TDNN_MIN_STEPS = 32  # shorter signals keep the BLAS path (one pair of tiles of time steps)
TILE_TDNN_MIN_OUT = 256  # fewer outputs keep the BLAS path: the split costs about 1 ns an input value and thread
# whatever O, the tiles save about 4 ps a product against OpenBLAS (600 against 280 GFLOP/s), even near O = 130;
# a Res2Net's 64-channel groups one by one lose (0.31 against 0.27 ms a group), all of them in one call win:
TILE_RES2NET_MIN_STEPS = 128  # (937 steps 1.2-1.5 against 1.9-2.1 ms, 150 steps 0.35-0.40 against 0.58-0.60,
# 45 steps 0.27 against 0.17: each thread's share of steps widened by the dilation once per later group)


@numba.njit(inline="always")
def _mirrored(t, T):
    """The reflect padding's index: -t before the start, 2 (T - 1) - t past the end (the edge sample not
    repeated)."""
    return -t if t < 0 else (2 * (T - 1) - t if t >= T else t)


@numba.njit(inline="always")
def _tap_row_into(x_ct, i, start, n, row_n):
    """row[j] = x[i, r(start + j)] for j < n (r: the reflect padding, read in place, ``_mirrored``), 0 for
    n <= j < len(row)."""
    T = x_ct.shape[1]
    if start >= 0 and start + n <= T:
        row_n[:n] = x_ct[i, start : start + n]
    else:
        for j in range(n):
            row_n[j] = x_ct[i, _mirrored(start + j, T)]
    row_n[n:] = 0.0


@numba.njit(cache=True, nogil=True)
def _split_taps_into_tiles(x_ct, K, dilation, first, t0, n, J, pairs_spqn):
    """pairs[s, p, q, j] = part p (``_bf16_parts``) of the stacked taps' row t = t0 + j at columns c = 32 s +
    2 q (low half) and c + 1 (high half), where column c = i K + k holds x[i, r(t + first + k dilation)] (r:
    the reflect padding, read in place); 0 for n <= j < J.  The B tile of steps t0 + 16 u ... + 15 is
    pairs[s, p, :, 16 u : 16 u + 16]: 16 rows (pairs of columns) of 64 bytes (16 steps x the pair's two
    words) a row of ``pairs`` apart."""
    S = pairs_spqn.shape[0]
    T = x_ct.shape[1]
    x_flat = x_ct.reshape(-1)
    a_j = np.empty(J, dtype=np.float32)
    b_j = np.empty(J, dtype=np.float32)
    shift = np.uint32(16)
    for h in range(16 * S):  # pairs of columns
        c = 2 * h
        for ahead in range(c + TILE_SPLIT_AHEAD, min(c + TILE_SPLIT_AHEAD + 2, 32 * S)):
            first_ahead = (ahead // K) * T + min(max(t0 + first + (ahead % K) * dilation, 0), T - 1)
            for j in range(0, n, 16):  # its lines asked for meanwhile (each row's are apart by the row)
                _prefetch(x_flat, min(first_ahead + j, x_flat.shape[0] - 1))
        _tap_row_into(x_ct, c // K, t0 + first + (c % K) * dilation, n, a_j)
        _tap_row_into(x_ct, (c + 1) // K, t0 + first + ((c + 1) % K) * dilation, n, b_j)
        hi_j, mid_j, lo_j = (
            pairs_spqn[h // 16, 0, h % 16],
            pairs_spqn[h // 16, 1, h % 16],
            pairs_spqn[h // 16, 2, h % 16],
        )
        for j in range(J):
            a_hi, a_mid, a_lo = _bf16_parts(a_j[j])
            b_hi, b_mid, b_lo = _bf16_parts(b_j[j])
            hi_j[j] = np.uint32(a_hi) | (np.uint32(b_hi) << shift)
            mid_j[j] = np.uint32(a_mid) | (np.uint32(b_mid) << shift)
            lo_j[j] = np.uint32(a_lo) | (np.uint32(b_lo) << shift)


@numba.njit(cache=True, nogil=True)
def _bf16_words_into_tiles(w_om, tiles_usrc):
    """tiles[u, s, r, c] = the bf16 word of w[16 u + r, 32 s + c], True; False (tiles unfinished) as soon as a
    weight is not a bf16 value (its low 16 bits not zero): the A tiles of ``_taps_blocks_on_tiles``, each [r, c]
    one kilobyte (16 output rows x 32 words)."""
    O, M = w_om.shape
    for o in range(O):
        for c in range(M):
            bits = _bits_of(w_om[o, c])
            if bits & np.uint32(0xFFFF):
                return False
            tiles_usrc[o // 16, c // 32, o % 16, c % 32] = np.uint16(bits >> np.uint32(16))
    return True


@numba.njit(cache=True, nogil=True)
def _taps_blocks_on_tiles(
    x_ct, a_tiles_usrc, b_o, add_bias, relu, K, dilation, first, out_ot, t_begin, t_end, th, n_threads
):
    """out[o, t] = ReLU(b[o] + sum_c w[o, c] x_stacked[t, c]) (the bias where ``add_bias``, the ReLU where
    ``relu``) on the tile registers, for t_begin <= t < t_end, in blocks of ``TILE_TDNN_STEPS`` steps from
    t_begin, of which this call takes th, th + n_threads, ... (one piece of ``run_pieces``): the stacked
    taps' rows (``_split_taps_into_tiles``: column i K + k = x[i, r(t + first + k dilation)]) times the
    weights' bf16 words (``_bf16_words_into_tiles``; O a multiple of 32, K I of 32).  For every pair of
    weight tiles, four float32 tiles of sums (2 x 16 outputs x 2 x 16 steps) over ``TILE_K_CHUNK`` columns at
    a time, the chunks' sums added in float32 after: the order of ``_tile_bf16_times``, the same bits as it
    gives for the stacked rows.  A step's sums see its row alone."""
    U, S = a_tiles_usrc.shape[0], a_tiles_usrc.shape[1]
    NB = TILE_TDNN_STEPS
    blocks = (t_end - t_begin + NB - 1) // NB
    steps = TILE_K_CHUNK // 32
    a_words = a_tiles_usrc.reshape(-1)
    J = NB + 16  # a row of the split taps: the block's steps and 64 bytes more (a B tile's rows 576 bytes apart;
    pairs_spqn = np.empty((S, 3, 16, J), dtype=np.uint32)  # at 512, 1536 x 1536: 6.6-7.3 against 6.4 ms)
    b_words = pairs_spqn.reshape(-1).view(np.uint16)
    chunk_rn = np.empty((32, NB), dtype=np.float32)
    sums_rn = np.empty((32, NB), dtype=np.float32)
    chunk = chunk_rn.reshape(-1)
    _tile_config(_tile_shapes())
    for blk in range(th, blocks, n_threads):
        t0 = t_begin + blk * NB
        n = min(NB, t_end - t0)
        pairs = (n + 31) // 32  # pairs of 16-step tiles
        _split_taps_into_tiles(x_ct, K, dilation, first, t0, n, 32 * pairs, pairs_spqn)
        for up in range(U // 2):
            for s0 in range(0, S, steps):
                for v in range(pairs):
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                    for s in range(s0, min(s0 + steps, S)):
                        _load_a4(a_words, ((2 * up) * S + s) * 512, 64)
                        _load_a5(a_words, ((2 * up + 1) * S + s) * 512, 64)
                        for p in range(3):
                            b0 = ((s * 3 + p) * 16 * J + 32 * v) * 2
                            _load_b6(b_words, b0, 4 * J)
                            _dot_c0()
                            _dot_c2()
                            _load_b7(b_words, b0 + 32, 4 * J)
                            _dot_c1()
                            _dot_c3()
                    _store_c0(chunk, 32 * v, 4 * NB)
                    _store_c1(chunk, 32 * v + 16, 4 * NB)
                    _store_c2(chunk, 16 * NB + 32 * v, 4 * NB)
                    _store_c3(chunk, 16 * NB + 32 * v + 16, 4 * NB)
                if s0 == 0 and S > steps:
                    sums_rn[:, :n] = chunk_rn[:, :n]
                elif s0 > 0:
                    for r in range(32):
                        for t in range(n):
                            sums_rn[r, t] += chunk_rn[r, t]
            final_rn = chunk_rn if S <= steps else sums_rn  # (one chunk: its sums are the sums)
            for r in range(32):
                o = 32 * up + r
                bias, sums_t, out_t = b_o[o], final_rn[r], out_ot[o, t0 : t0 + n]
                for t in range(n):
                    y = sums_t[t] + bias if add_bias else sums_t[t]
                    out_t[t] = np.float32(0.0) if relu and y <= 0 else y
    _tile_release()


@numba.njit(cache=True, nogil=True)
def _res2net_range_on_tiles(x_ct, tiles_j, b_jo, dilation, a, b, out_ct):
    """``res2net_offline``'s output steps a <= t < b of one item [C, T], all its groups on this thread: group 0
    copied; group j's TDNN (``_taps_blocks_on_tiles``, k3, reflect padding) on x_j + y_(j-1) over the steps
    its successors need (the range widened by the dilation once per later group, within 0 .. T - 1), so
    that the cascade needs nothing of another thread's range.  Each step's sums see its own row alone: the
    same bits as the groups' TDNNs on the tiles over the whole signal."""
    C, T = x_ct.shape
    J = len(tiles_j)  # groups after the first
    G = C // (J + 1)
    K = 3
    z_ct = np.empty((G, T), dtype=np.float32)  # a group's input where it is read
    y_ct = np.empty((G, T), dtype=np.float32)  # the previous group's output where it is computed
    out_ct[:G, a:b] = x_ct[:G, a:b]
    for j in range(1, J + 1):
        widen = (J - j) * dilation
        r0, r1 = max(a - widen, 0), min(b + widen, T)  # group j's outputs the cascade needs
        z0, z1 = max(r0 - dilation, 0), min(r1 + dilation, T)  # its inputs they read (mirrored ones inside)
        for c in range(G):
            for t in range(z0, z1):
                z_ct[c, t] = x_ct[j * G + c, t] if j == 1 else x_ct[j * G + c, t] + y_ct[c, t]
        _taps_blocks_on_tiles(z_ct, tiles_j[j - 1], b_jo[j - 1], True, True, K, dilation, -dilation, y_ct, r0, r1, 0, 1)
        out_ct[j * G : (j + 1) * G, a:b] = y_ct[:, a:b]


# ----------------------------------------------------------------------------- the residual unit on the tiles
# The decoder's residual units are float32 convolutions (a k7 dilated conv and a 1x1 conv, C -> C channels),
# most of a decode's time.  On the tiles both operands are split into their exact bf16 parts (weights w =
# wh + wm + wl, signal z = zh + zm + zl) and six of the nine products of parts are summed: every term
# down to 2^-16 of the product (hh; hm, mh; hl, mm, lh), the three dropped ones (ml, lm, ll) below
# 2^-23 of it together, about one float32 rounding of each product.  The reduction runs over blocks of 32
# channels and, within a block, over the taps, so that a tap's tile of z is the split SnakeBeta rows
# themselves, shifted by k * dilation: no stacked taps are written at all.

TILE_CONV_STEPS = 42  # steps (32 channels of one tap) summed in the tiles before they are stored and reloaded
UNIT_TILE_VALUES = 96 * 1024  # channels x time steps of a piece on the tiles (C = 96: 1024 steps; 768: 128)
UNIT_TILES_MIN_STEPS = 1024  # shorter signals keep the BLAS path where the weights are split for each call
KEPT_TILES_MIN_STEPS = 64  # where their tiles are kept (a model's read-only weights): from 64 steps, on the tiles


@numba.njit(cache=True, nogil=True)
def _split_weight_into_tiles(w_oik, o0, o1, tiles_usprj):
    """tiles[o // 16, b K + k, p, o % 16, j] = part p (``_bf16_parts``) of w[o, 32 b + j, k] for o0 <= o < o1
    (multiples of 16): the conv weight in three bf16 words, each A tile of ``_tile_conv_into`` (16 outputs
    x 32 channels of one tap and one part) a contiguous kilobyte, in the order the kernel reads them (rows
    of 64 bytes apart by the whole reduction, 10 KB at 768 channels, fell in 8 sets of the first-level
    cache)."""
    C, K = w_oik.shape[1], w_oik.shape[2]
    for o in range(o0, o1):
        for b in range(C // 32):
            for k in range(K):
                w_j, tile_prj = w_oik[o, 32 * b : 32 * b + 32, k], tiles_usprj[o // 16, b * K + k]
                hi_j, mid_j, lo_j = tile_prj[0, o % 16], tile_prj[1, o % 16], tile_prj[2, o % 16]
                for j in range(32):  # (over 1-D views from 0: the loop vectorises)
                    hi_j[j], mid_j[j], lo_j[j] = _bf16_parts(w_j[j])


_WEIGHT_TILES: dict = {}  # id of a read-only conv weight -> (a weak reference to it, its tiles)


def _weight_tiles(w_oik):
    """[O / 16, K C / 32, 3, 16, 32]: ``_split_weight_into_tiles`` of the whole weight (O a multiple of 32),
    its rows shared out over the piece threads in whole tiles; kept while the weight lives where it is
    read-only (``_kept_while_read_only``: a model's weights are split at their first call only, 8-10 ms a
    call at 768 channels), else split again for each call, into the model's workspace."""
    if _read_only(w_oik):
        return _kept_while_read_only(_WEIGHT_TILES, w_oik, lambda w: _split_weight_tiles(w, np.empty))
    return _split_weight_tiles(w_oik, new_output)


def _split_weight_tiles(w_oik, allocate):
    """``_weight_tiles`` made, into ``allocate(shape, dtype)``."""
    O, C, K = w_oik.shape
    tiles_usprj = allocate((O // 16, K * C // 32, 3, 16, 32), np.uint16)  # (25 MB at 768 channels)
    n = min(_piece_threads(), O // 16)
    shares = [(16 * (O // 16 * t // n), 16 * (O // 16 * (t + 1) // n)) for t in range(n)]
    run_pieces(lambda o0, o1: _split_weight_into_tiles(w_oik, o0, o1, tiles_usprj), shares)
    return tiles_usprj


@numba.njit(fastmath={"contract"}, inline="always")
def _split_pair_into(a_t, b_t, q, parts_pqt):
    """parts[p, q, t] = the pair of part p (``_bf16_parts``) of a[t] (low half) and of b[t] (high
    half), for the rows of channels 2 q and 2 q + 1: the B tiles' layout (each element two channels'
    words, time along the tile's 16 columns)."""
    for t in range(a_t.shape[0]):
        a_hi, a_mid, a_lo = _bf16_parts(a_t[t])
        b_hi, b_mid, b_lo = _bf16_parts(b_t[t])
        parts_pqt[0, q, t] = (np.uint32(b_hi) << np.uint32(16)) | np.uint32(a_hi)
        parts_pqt[1, q, t] = (np.uint32(b_mid) << np.uint32(16)) | np.uint32(a_mid)
        parts_pqt[2, q, t] = (np.uint32(b_lo) << np.uint32(16)) | np.uint32(a_lo)


@numba.njit(inline="always")
def _pair_row_length(steps):
    """Time steps of a row of channel pairs (4 bytes each): at least ``steps``, a whole number of 64-byte
    lines and an odd one, so that the 16 rows of a B tile fall in 16 different sets of the cache."""
    lines = (steps + 15) // 16
    return 16 * (lines + 1 - lines % 2)


@numba.njit(cache=True, nogil=True)
def _tile_conv_into(a_tiles, z_pqt, K, dilation, stride, steps, out_on):
    """out[o, t] = sum_k sum_c w[o, c, k] z[c, t + k dilation] for t < steps (a multiple of 32; out [O, >=
    steps], O and C multiples of 32), w and z given by their parts (``a_tiles``: ``_weight_tiles``,
    ``z_pqt``: ``_split_pair_into``), on this thread's tiles.  With a stride s, z holds s phases one after
    the other (rows p C / 2 .. of pairs: the samples t s + p of the input) and tap k reads phase k % s at
    the offset k // s.  For each 32 outputs and 32 steps, four
    float32 tiles of sums run through ``TILE_CONV_STEPS`` steps of the reduction (32 channels of one tap
    each) before they are stored, and are loaded again for the next steps (a store and reload of the sums
    every 7 steps cost a quarter of the multiplies' time: the store waits for the last multiply); each step
    sums the six products of parts in an order that reloads one operand at a time (lh, mh, mm, hm, hl,
    hh: a tile load waits for the multiplies still reading that tile, and reloading both each time
    stalled the tiles 2.5 times longer).  The sums of an output are a float32 chain over its terms, in
    the order of the reduction.  A NaN in z gives NaN as the float32 product does; an infinity would give
    NaN too where a weight's mid or lo part is 0 (0 x inf), but none reaches it: SnakeBeta of an infinity
    is NaN."""
    S = a_tiles.shape[1]
    O = a_tiles.shape[0] * 16
    L = z_pqt.shape[2]
    A, Z = a_tiles.reshape(-1), z_pqt.reshape(-1)
    out = out_on.reshape(-1)
    row = out_on.shape[1]
    pz = z_pqt.shape[1] * L  # pairs of words per part of z
    phase = pz // stride  # pairs of words per phase
    _tile_config(_tile_shapes())
    blocks = S // K  # of 32 channels
    chunk = max(1, TILE_CONV_STEPS // K)  # blocks summed in the tiles before they are stored
    for b0 in range(0, blocks, chunk):
        for o0 in range(0, O, 32):
            for t0 in range(0, steps, 32):
                c_first, c_second = o0 * row + t0, (o0 + 16) * row + t0
                if b0 == 0:
                    _zero_c0()
                    _zero_c1()
                    _zero_c2()
                    _zero_c3()
                else:
                    _load_c0(out, c_first, 4 * row)
                    _load_c1(out, c_first + 16, 4 * row)
                    _load_c2(out, c_second, 4 * row)
                    _load_c3(out, c_second + 16, 4 * row)
                for s in range(b0 * K, min(b0 + chunk, blocks) * K):
                    cb, k = s // K, s % K
                    a = ((o0 // 16) * S + s) * 1536  # tile (o0 / 16, step s, part p): a + 512 p
                    a2 = a + S * 1536  # outputs o0 + 16 ..
                    z = cb * 16 * L + t0 + (k % stride) * phase + (k // stride) * dilation  # (pairs 16 cb ..)
                    _load_a4(A, a + 1024, 64)  # wl
                    _load_a5(A, a2 + 1024, 64)
                    _load_b6(Z, z, 4 * L)  # zh
                    _load_b7(Z, z + 16, 4 * L)
                    _dots_after_a()
                    _load_a4(A, a + 512, 64)  # wm
                    _load_a5(A, a2 + 512, 64)
                    _dots_after_a()
                    _load_b6(Z, pz + z, 4 * L)  # zm
                    _load_b7(Z, pz + z + 16, 4 * L)
                    _dots_after_b()
                    _load_a4(A, a, 64)  # wh
                    _load_a5(A, a2, 64)
                    _dots_after_a()
                    _load_b6(Z, 2 * pz + z, 4 * L)  # zl
                    _load_b7(Z, 2 * pz + z + 16, 4 * L)
                    _dots_after_b()
                    _load_b6(Z, z, 4 * L)  # zh
                    _load_b7(Z, z + 16, 4 * L)
                    _dots_after_b()
                _store_c0(out, c_first, 4 * row)
                _store_c1(out, c_first + 16, 4 * row)
                _store_c2(out, c_second, 4 * row)
                _store_c3(out, c_second + 16, 4 * row)
    _tile_release()


@numba.njit(inline="always")
def _dots_after_a():
    """The four multiplies, those reading A tile 4 first (it is the next one reloaded)."""
    _dot_c0()
    _dot_c1()
    _dot_c2()
    _dot_c3()


@numba.njit(inline="always")
def _dots_after_b():
    """The four multiplies, those reading B tile 6 first."""
    _dot_c0()
    _dot_c2()
    _dot_c1()
    _dot_c3()


@numba.njit(inline="always")
def _unit_scratch_words(C, H, steps, left):
    """The 32-bit words a piece of ``steps`` (a multiple of 32) of a C -> H -> C unit needs (``_unit_scratch``)."""
    L1, width = _pair_row_length(steps + left), _pair_row_length(steps)
    return 3 * (C // 2) * L1 + H * width + 3 * (H // 2) * width + C * width + 2 * (left + steps)


@numba.njit(inline="always")
def _unit_scratch(scratch, C, H, steps, left, n):
    """Views of ``scratch`` for a piece of a C -> H -> C unit (each row of pairs and of sums an odd number of
    lines: ``_pair_row_length``): z1 [3, C / 2, L1] (the first conv's split input), h [H, width] float32
    (its sums), z2 [3, H / 2, width] (the second conv's split input), g [C, width] float32 (its sums) and
    two rows [2, left + n] float32."""
    L1, width = _pair_row_length(steps + left), _pair_row_length(steps)
    s1, s2, s3, s4 = 3 * (C // 2) * L1, H * width, 3 * (H // 2) * width, C * width
    z1 = scratch[:s1].reshape((3, C // 2, L1))
    h = scratch[s1 : s1 + s2].view(np.float32).reshape((H, width))
    z2 = scratch[s1 + s2 : s1 + s2 + s3].reshape((3, H // 2, width))
    g = scratch[s1 + s2 + s3 : s1 + s2 + s3 + s4].view(np.float32).reshape((C, width))
    end = s1 + s2 + s3 + s4
    rows = scratch[end : end + 2 * (left + n)].view(np.float32).reshape((2, left + n))
    return z1, h, z2, g, rows


_THREAD_WORDS = threading.local()


def _thread_words(n: int):
    """At least n 32-bit words of this thread's, kept from call to call (grown when too few)."""
    words = getattr(_THREAD_WORDS, "words", None)
    if words is None or words.shape[0] < n:
        words = _THREAD_WORDS.words = np.empty(n, np.uint32)
    return words


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _unit_piece_on_tiles(x_ct, T, t0, n, params_6c, a1_tiles, a2_tiles, dilation, context_cs, out_ct, scratch):
    """The residual unit's output steps t0 .. t0 + n - 1 on the tiles: SnakeBeta_1 of the piece and its
    (K - 1) dilation steps before (from ``context_cs`` before the push's start) split into the pair
    layout, the k7 conv (``_tile_conv_into``), bias + SnakeBeta_2 split likewise, the 1x1 conv, then
    bias + residual into ``out`` (the reference's order).  ``params_6c``: alpha, 1 / beta of both
    SnakeBetas, the two biases; ``scratch``: this thread's words (``_unit_scratch_words``), which hold the
    split signals, the sums and two rows (fresh arrays of a megabyte, first touched in every piece, were
    a third of a piece's time)."""
    C = x_ct.shape[0]
    K = a1_tiles.shape[1] * 32 // C
    left = (K - 1) * dilation
    alpha1, inv_beta1, alpha2, inv_beta2 = params_6c[0], params_6c[1], params_6c[2], params_6c[3]
    b1, b2 = params_6c[4], params_6c[5]
    steps = (n + 31) // 32 * 32
    z1, h, z2, g, rows = _unit_scratch(scratch, C, C, steps, left, n)
    z1[:, :, left + n :] = 0
    row_a, row_b = rows[0], rows[1]
    for c in range(0, C, 2):
        _snake_row_into(x_ct[c], T, t0 - left, np.float32(0.0), alpha1[c], inv_beta1[c], row_a)
        _snake_row_into(x_ct[c + 1], T, t0 - left, np.float32(0.0), alpha1[c + 1], inv_beta1[c + 1], row_b)
        for j in range(max(left - t0, 0)):  # before the push: the context (SnakeBeta's outputs already)
            row_a[j], row_b[j] = context_cs[c, t0 + j], context_cs[c + 1, t0 + j]
        _split_pair_into(row_a, row_b, c // 2, z1)
    _tile_conv_into(a1_tiles, z1, K, dilation, 1, steps, h)
    z2[:, :, n:] = 0
    for c in range(0, C, 2):
        _snake_row_into(h[c], n, 0, b1[c], alpha2[c], inv_beta2[c], row_a[:n])
        _snake_row_into(h[c + 1], n, 0, b1[c + 1], alpha2[c + 1], inv_beta2[c + 1], row_b[:n])
        _split_pair_into(row_a[:n], row_b[:n], c // 2, z2)
    _tile_conv_into(a2_tiles, z2, 1, 0, 1, steps, g)
    _add_bias_and_residual_rows(g, n, b2, x_ct, t0, out_ct)


def _residual_unit_on_tiles(rows_bcs, T, params_6c, w1_oik, w2_oi1, dilation, context_bcs, out_bct):
    """``residual_unit_push``'s pieces on the tiles (``_unit_piece_on_tiles``), side by side, the weights'
    tiles those of ``_weight_tiles``."""
    B, C = out_bct.shape[:2]
    K = w1_oik.shape[-1]
    a1, a2 = _weight_tiles(w1_oik), _weight_tiles(w2_oi1)
    if context_bcs is None:
        context_bcs = np.zeros((B, C, (K - 1) * dilation), np.float32)
    context_bcs = np.ascontiguousarray(context_bcs, dtype=np.float32)
    n_piece = max(32, UNIT_TILE_VALUES // C // 32 * 32)
    words = _unit_scratch_words(C, C, (n_piece + 31) // 32 * 32, (K - 1) * dilation)
    run_pieces(
        lambda b, t0: _unit_piece_on_tiles(
            *(rows_bcs[b], T, t0, min(n_piece, T - t0), params_6c, a1, a2, dilation, context_bcs[b], out_bct[b]),
            _thread_words(words),
        ),
        [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)],
    )


# ------------------------------------------------------------------------- the encoder's residual block on the tiles


BLOCK_TILE_VALUES = 1 << 18  # channels x steps of a piece (C = 64: 4096 steps)
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


@numba.njit(fastmath={"contract"}, inline="always")
def _elu_row_into(x_t, T, start, bias, out_n):
    """out[j] = ELU(x[start + j] + bias) where 0 <= start + j < T, else 0 (the causal zero padding; ELU(0) = 0):
    y where y > 0, else ``_expm1_f32(y)`` (NaN stays NaN).  Over 1-D views from index 0 (see
    ``_snake_row_into``)."""
    N = out_n.shape[0]
    j0, j1 = min(max(-start, 0), N), max(min(T - start, N), 0)
    out_n[:j0] = 0.0
    if j1 > j0:
        x_m, out_m = x_t[start + j0 : start + j1], out_n[j0:j1]
        for j in range(x_m.shape[0]):
            y = x_m[j] + bias
            e = _expm1_f32(min(y, np.float32(0.0)))
            out_m[j] = y if y > np.float32(0.0) else e
    out_n[max(j1, j0) :] = 0.0


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _resnet_piece_on_tiles(x_ct, t0, n, a1_tiles, b1_o, a2_tiles, b2_o, dilation, out_ct, scratch):
    """``resnet_block_offline``'s output steps t0 .. t0 + n - 1 on the tiles, in one call: ELU of the piece and
    its (K - 1) dilation samples before (``_elu_row_into``) split into the pair layout, the k3 conv C -> H
    (``_tile_conv_into``), bias + ELU split likewise, the 1x1 conv H -> C, then bias + residual into ``out``.
    The ELU's expm1 is ``_expm1_f32`` (within 2 ulp of NumPy's, tested), so that the piece is one call of
    compiled code and the two threads' pieces run side by side (with NumPy's expm1 between Numba calls, a
    piece's dozen steps from Python took two threads to 1.36x one, where OpenBLAS's pieces reach 1.77x)."""
    C, T = x_ct.shape
    H = a1_tiles.shape[0] * 16
    K = a1_tiles.shape[1] * 32 // C
    left = (K - 1) * dilation
    steps = (n + 31) // 32 * 32
    z1, h, z2, g, rows = _unit_scratch(scratch, C, H, steps, left, n)
    z1[:, :, left + n :] = 0
    row_a, row_b = rows[0], rows[1]
    zero = np.float32(0.0)
    for c in range(0, C, 2):
        _elu_row_into(x_ct[c], T, t0 - left, zero, row_a)
        _elu_row_into(x_ct[c + 1], T, t0 - left, zero, row_b)
        _split_pair_into(row_a, row_b, c // 2, z1)
    _tile_conv_into(a1_tiles, z1, K, dilation, 1, steps, h)
    z2[:, :, n:] = 0
    for c in range(0, H, 2):
        _elu_row_into(h[c], n, 0, b1_o[c], row_a[:n])
        _elu_row_into(h[c + 1], n, 0, b1_o[c + 1], row_b[:n])
        _split_pair_into(row_a[:n], row_b[:n], c // 2, z2)
    _tile_conv_into(a2_tiles, z2, 1, 0, 1, steps, g)
    _add_bias_and_residual_rows(g, n, b2_o, x_ct, t0, out_ct)


def _resnet_block_on_tiles(x_bct, w1_oik, b1_o, w2_oi1, b2_o, dilation, out_bct):
    """``resnet_block_offline``'s pieces on the tiles (``_resnet_piece_on_tiles``), side by side, the weights'
    tiles those of ``_weight_tiles``."""
    B, C, T = x_bct.shape
    H, _, K = w1_oik.shape
    a1, a2 = _weight_tiles(w1_oik), _weight_tiles(w2_oi1)
    n_piece = max(32, BLOCK_TILE_VALUES // C // 32 * 32)
    words = _unit_scratch_words(C, H, (n_piece + 31) // 32 * 32, (K - 1) * dilation)
    x_bct = np.ascontiguousarray(x_bct)
    b1_o, b2_o = np.ascontiguousarray(b1_o, dtype=np.float32), np.ascontiguousarray(b2_o, dtype=np.float32)
    run_pieces(
        lambda b, t0: _resnet_piece_on_tiles(
            x_bct[b], t0, min(n_piece, T - t0), a1, b1_o, a2, b2_o, dilation, out_bct[b], _thread_words(words)
        ),
        [(b, t0) for b in range(B) for t0 in range(0, T, n_piece)],
    )


@numba.njit(inline="always")
def _elu_conv_scratch_words(C, O, K, stride, n):
    """The 32-bit words a piece of n outputs of ``_elu_conv_piece_on_tiles`` needs (its views, in order: the
    split phases, the sums, two rows of the ELU's span, two rows of one phase)."""
    steps, m = (n + 31) // 32 * 32, n + (K - 1) // stride
    L = _pair_row_length(steps + (K - 1) // stride)
    return 3 * stride * (C // 2) * L + O * _pair_row_length(steps) + 2 * m * stride + 2 * m


@numba.njit(fastmath={"contract"}, cache=True, nogil=True)
def _elu_conv_piece_on_tiles(x_ct, t0, n, a_tiles, b_o, stride, left, out_ot, scratch):
    """``elu_causal_conv_offline``'s outputs t0 .. t0 + n - 1 on the tiles, in one call: ELU of the input span
    they read (``_elu_row_into``: zeros in the causal padding and beyond x), split into the pair layout phase
    by phase (phase p: the samples t stride + p, so that each tap of the strided conv is a shift of one
    phase: ``_tile_conv_into``), one product, + bias."""
    C, T = x_ct.shape
    O = a_tiles.shape[0] * 16
    K = a_tiles.shape[1] * 32 // C
    m = n + (K - 1) // stride  # samples per phase
    steps = (n + 31) // 32 * 32
    L, width = _pair_row_length(steps + (K - 1) // stride), _pair_row_length(steps)
    s1, s2 = 3 * stride * (C // 2) * L, O * width
    z_pqt = scratch[:s1].reshape((3, stride * (C // 2), L))
    sums_ot = scratch[s1 : s1 + s2].view(np.float32).reshape((O, width))
    span_2s = scratch[s1 + s2 : s1 + s2 + 2 * m * stride].view(np.float32).reshape((2, m * stride))
    rows_2m = scratch[s1 + s2 + 2 * m * stride : s1 + s2 + 2 * m * stride + 2 * m].view(np.float32).reshape((2, m))
    z_pqt[:, :, m:] = 0
    zero = np.float32(0.0)
    for c in range(0, C, 2):
        _elu_row_into(x_ct[c], T, t0 * stride - left, zero, span_2s[0])
        _elu_row_into(x_ct[c + 1], T, t0 * stride - left, zero, span_2s[1])
        for p in range(stride):
            for j in range(m):
                rows_2m[0, j] = span_2s[0, p + j * stride]
                rows_2m[1, j] = span_2s[1, p + j * stride]
            _split_pair_into(rows_2m[0], rows_2m[1], p * (C // 2) + c // 2, z_pqt)
    _tile_conv_into(a_tiles, z_pqt, K, 1, stride, steps, sums_ot)
    for o in range(O):
        bias, sums_n, out_n = b_o[o], sums_ot[o, :n], out_ot[o, t0 : t0 + n]
        for j in range(n):
            out_n[j] = sums_n[j] + bias


def _elu_conv_on_tiles(x_bct, w_oik, b_o, stride, left, out_bot):
    """``elu_causal_conv_offline``'s pieces on the tiles (``_elu_conv_piece_on_tiles``), side by side, the
    weight's tiles those of ``_weight_tiles``."""
    B, C, _ = x_bct.shape
    O, _, K = w_oik.shape
    T_out = out_bot.shape[-1]
    a_tiles = _weight_tiles(w_oik)
    bias_o = np.zeros(O, np.float32) if b_o is None else np.ascontiguousarray(b_o, dtype=np.float32)
    n_piece = max(32, BLOCK_TILE_VALUES // (C * stride) // 32 * 32)
    words = _elu_conv_scratch_words(C, O, K, stride, n_piece)
    x_bct = np.ascontiguousarray(x_bct)
    run_pieces(
        lambda b, t0: _elu_conv_piece_on_tiles(
            x_bct[b], t0, min(n_piece, T_out - t0), a_tiles, bias_o, stride, left, out_bot[b], _thread_words(words)
        ),
        [(b, t0) for b in range(B) for t0 in range(0, T_out, n_piece)],
    )


def _convs_take_tiles(C: int, H: int, T: int, *weights) -> bool:
    """Whether convs between C and H channels over T output steps (a residual unit C -> C -> C, a block
    C -> H -> C, a strided conv C -> H) with these weights run on the tiles: granted (``USE_TILES``),
    whole tiles of channels both ways, and a signal long enough that the weights' split is a small part of
    it: ``KEPT_TILES_MIN_STEPS`` where every weight is read-only (``_read_only``: a model's, split once and
    kept), else ``UNIT_TILES_MIN_STEPS`` (split for this call).  Kept tiles never wait longer than split ones:
    ``UNIT_TILES_MIN_STEPS`` set lower (the tiles' tests take every length so) lowers both."""
    kept = all(_read_only(w) for w in weights)
    min_steps = min(KEPT_TILES_MIN_STEPS, UNIT_TILES_MIN_STEPS) if kept else UNIT_TILES_MIN_STEPS
    return USE_TILES and C % 32 == 0 and H % 32 == 0 and T >= min_steps


# ----------------------------------------------------------------------------- packed words (the code predictor)
# ``bf16.PackedWords``: a streamed matrix's words in 12 bits, lossless.  A generation step's products are
# bound by the bytes they read, so a quarter fewer bytes is a quarter less time where the words are rebuilt
# faster than memory delivers them: 64 a block by a dozen 512-bit instructions (``_packed_row_dots``: one
# byte shuffle looks up 64 high bytes, unpacks make words and floats of them), where the same rebuild
# written as a loop over single words compiled to as many instructions as it saved in bytes.

PACKED_COMPILED = "+avx512bw" in _compile_features()  # the 64-byte shuffles of _packed_row_dots
USE_PACKED = PACKED_COMPILED and switch("REFIMPL_PACKED")
PACKED_BLOCK = 64  # words a block: the columns of a packed matrix are a multiple of it


@numba.njit(cache=True)
def _high_byte_counts(bits_oi):
    """counts[v] = the words whose high byte, sign aside, is v (+0 and -0 not counted: always listed)."""
    counts = np.zeros(128, np.int64)
    for w in bits_oi.reshape(-1):
        if w & 0x7FFF:
            counts[(w >> 8) & 0x7F] += 1
    return counts


@numba.njit(inline="always")
def _word_code(w, base):
    """(code, low byte, listed) of one word for the window base .. base + 7 (``bf16.PackedWords``)."""
    k, sign = np.int64((w >> 8) & 0x7F) - base, np.uint8(w >> 15)
    if 0 <= k < 8 and w & 0x7FFF:  # (+-0 in the window's place: only if base is 0, listed like the others)
        return np.uint8(k) | (sign << 3), np.uint8(w & 0xFF), False
    return np.uint8(0), np.uint8(0), True


@numba.njit(cache=True)
def _pack_rows(bits_oi, base, low_oi, codes_oh):
    """The dense part of ``PackedWords``: low bytes and codes, each block's words in the stored order."""
    O, I = bits_oi.shape
    for o in range(O):
        for b in range(I // 64):
            for j in range(32):
                c0, l0, _ = _word_code(bits_oi[o, 64 * b + _stored_word(j)], base)
                c1, l1, _ = _word_code(bits_oi[o, 64 * b + _stored_word(32 + j)], base)
                codes_oh[o, 32 * b + j] = c0 | (c1 << 4)
                low_oi[o, 64 * b + j], low_oi[o, 64 * b + 32 + j] = l0, l1


@numba.njit(inline="always")
def _stored_word(p):
    """The word of a block at stored place p (``bf16.stored_order``)."""
    return 16 * ((p // 4) % 4) + 4 * (p // 16) + p % 4


@numba.njit(cache=True)
def _list_words(bits_oi, base, rows_e, cols_e, values_e):
    """The listed words, row by row in column order: their row, column and float32 value."""
    O, I = bits_oi.shape
    e = 0
    for o in range(O):
        for i in range(I):
            w = bits_oi[o, i]
            if _word_code(w, base)[2]:
                rows_e[e], cols_e[e], values_e[e] = o, i, _bf16_to_f32(w)
                e += 1


def pack_words(bits_oi) -> PackedWords:
    """``bf16.PackedWords`` of the words [O, I] (I a multiple of ``PACKED_BLOCK``): the window of 8 high-byte
    values (sign aside) that holds the most words, the others listed."""
    O, I = bits_oi.shape
    counts = _high_byte_counts(bits_oi)
    held = np.convolve(counts, np.ones(PACK_WINDOW, np.int64), mode="valid")  # held[b]: words in b .. b + 7
    base = int(np.argmax(held))
    low_oi, codes_oh = np.empty((O, I), np.uint8), np.empty((O, I // 2), np.uint8)
    _pack_rows(bits_oi, base, low_oi, codes_oh)
    E = bits_oi.size - int(held[base])  # the words outside the window, and +-0
    rows_e, cols_e, values_e = np.empty(E, np.int32), np.empty(E, np.int32), np.empty(E, np.float32)
    _list_words(bits_oi, base, rows_e, cols_e, values_e)
    high_16 = [(c // 8) << 7 | (base + c % 8) for c in range(16)]
    return PackedWords(low_oi, codes_oh, np.array(high_16 * 4, np.uint8), rows_e, cols_e, values_e)


_PACKED: dict = {}  # id of a read-only streamed matrix's words -> (a weak reference to them, PackedWords)


def packed_words(m: BF16Matrix):
    """The ``PackedWords`` of a streamed matrix, made at its first use and kept while its words live
    (``_kept_while_read_only``), or None where the backend reads its words as they are (packing turned off
    with ``REFIMPL_PACKED=0`` or not compiled for, a matrix not streamed or of columns not a multiple of
    ``PACKED_BLOCK``)."""
    if not (USE_PACKED and m.streamed and isinstance(m.bits, np.ndarray) and m.shape[1] % PACKED_BLOCK == 0):
        return None
    return _kept_while_read_only(_PACKED, m.bits, pack_words)


_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _vector(element, n):
    return ir.VectorType(element, n)


def _row_dots_intrinsic(R: int):
    """An intrinsic ``(x_ni, n0, low_i, codes_h, high_64, out_no, o)``: out[n0 + r, o] = sum_i x[n0 + r, i] *
    word_i for r < R, the words of one packed row (its dense part: the listed words are added apart) rebuilt
    64 at a time in 512-bit vectors: the 32 code bytes split into 64 codes (low nibbles, high nibbles), the
    64 high bytes looked up by one byte shuffle (``vpshufb``, the 16-entry table in each 128-bit lane), low
    and high bytes unpacked into words and the words, above zero words, into float32 (the bf16 widening),
    both within 128-bit lanes (``vpunpck*``: 6 instructions, where interleaving the bytes across the whole
    vector and widening the words took 10; the block's words are stored in the order this gives back,
    ``bf16.stored_order``), and each row's 64 products summed in 64 lanes; the lanes summed by halves at the
    end."""

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
            shuffle_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_vector(_I8, 64), [_vector(_I8, 64)] * 2), "llvm.x86.avx512.pshuf.b.512"
            )
            fma_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_vector(_F32, 64), [_vector(_F32, 64)] * 3), "llvm.fma.v64f32"
            )
            rows = [builder.mul(builder.add(args[1], ir.Constant(_I64, r)), x_row_bytes) for r in range(R)]
            zero = ir.Constant(_vector(_F32, 64), [0.0] * 64)
            entry = builder.block
            loop, done = builder.append_basic_block("blocks"), builder.append_basic_block("sums")
            builder.cbranch(builder.icmp_unsigned(">", blocks, ir.Constant(_I64, 0)), loop, done)
            builder.position_at_end(loop)
            b = builder.phi(_I64)
            sums = [builder.phi(_vector(_F32, 64)) for _ in range(R)]
            b.add_incoming(ir.Constant(_I64, 0), entry)
            for s in sums:
                s.add_incoming(zero, entry)
            packed = load(cp, builder.mul(b, ir.Constant(_I64, 32)), _vector(_I8, 32))
            low_nibbles = builder.and_(packed, ir.Constant(_vector(_I8, 32), [15] * 32))
            high_nibbles = builder.lshr(packed, ir.Constant(_vector(_I8, 32), [4] * 32))
            codes64 = builder.shuffle_vector(low_nibbles, high_nibbles, ir.Constant(_vector(_I32, 64), list(range(64))))
            high_bytes = builder.call(shuffle_fn, [table, codes64])
            low_bytes = load(lp, builder.mul(b, ir.Constant(_I64, 64)), _vector(_I8, 64))
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
            halves_f = [builder.shuffle_vector(a, b, ir.Constant(_vector(_I32, 32), list(range(32)))) for a, b in
                        (quarters[:2], quarters[2:])]  # fmt: skip
            w = builder.shuffle_vector(*halves_f, ir.Constant(_vector(_I32, 64), list(range(64))))
            column_bytes = builder.mul(b, ir.Constant(_I64, 256))
            new_sums = []
            for r in range(R):
                xv = load(xp, builder.add(rows[r], column_bytes), _vector(_F32, 64))
                new_sums.append(builder.call(fma_fn, [xv, w, sums[r]]))
            b_next = builder.add(b, ir.Constant(_I64, 1))
            b.add_incoming(b_next, loop)
            for s, t in zip(sums, new_sums):
                s.add_incoming(t, loop)
            builder.cbranch(builder.icmp_unsigned("<", b_next, blocks), loop, done)
            builder.position_at_end(done)
            totals = [builder.phi(_vector(_F32, 64)) for _ in range(R)]  # (the phis first in the block)
            for total, t in zip(totals, new_sums):
                total.add_incoming(zero, entry)
                total.add_incoming(t, loop)
            out_row_bytes = builder.extract_value(out.strides, 0)
            out_at = builder.mul(args[6], ir.Constant(_I64, 4))
            op = builder.bitcast(out.data, byte_ptr)
            for r, total in enumerate(totals):
                s, width = total, 64
                while width > 1:  # halves added: lanes 0..31 + 32..63, then 0..15 + 16..31, ...
                    width //= 2
                    lo = builder.shuffle_vector(s, s, ir.Constant(_vector(_I32, width), list(range(width))))
                    hi = builder.shuffle_vector(s, s, ir.Constant(_vector(_I32, width), list(range(width, 2 * width))))
                    s = builder.fadd(lo, hi)
                value = builder.extract_element(s, ir.Constant(_I32, 0))
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


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _packed_products_into(x_ni, packed, out_no):
    """out = x @ words^T for a packed matrix (``bf16.PackedWords``) and a few rows of x (C-contiguous
    float32): parallel over the weight rows, each read once for all rows of x (row o + 8's low bytes and
    codes asked for meanwhile) by ``_packed_row_dots``; then for each listed word its product added and the
    placeholder's taken back out, in their order (in the parallel loop, row by row, they took a tenth of
    its time)."""
    low_oi, codes_oh, high_64, rows_e, cols_e, values_e = packed
    O, I = low_oi.shape
    low_words, code_words = low_oi.reshape(-1), codes_oh.reshape(-1)
    for o in prange(O):
        if o + PREFETCH_ROWS_AHEAD < O:
            for j in range((o + PREFETCH_ROWS_AHEAD) * I, (o + PREFETCH_ROWS_AHEAD + 1) * I, 64):
                _prefetch(low_words, j)
            for j in range((o + PREFETCH_ROWS_AHEAD) * (I // 2), (o + PREFETCH_ROWS_AHEAD + 1) * (I // 2), 64):
                _prefetch(code_words, j)
        if x_ni.shape[0] == 1:  # (a generation step's one row: its own call, 3% faster than the loop's)
            _row_dots_1(x_ni, 0, low_oi[o], codes_oh[o], high_64, out_no, o)
        else:
            _packed_row_dots(x_ni, low_oi[o], codes_oh[o], high_64, out_no, o)
    placeholder = _bf16_to_f32(np.uint16(high_64[0]) << np.uint16(8))  # (a listed word's place, code 0)
    for e in range(rows_e.shape[0]):
        o, c, v = rows_e[e], cols_e[e], values_e[e]
        for n in range(x_ni.shape[0]):
            out_no[n, o] += x_ni[n, c] * v - x_ni[n, c] * placeholder


def _matrix_rows(w):
    """O of a layer step's matrix [O, I], given as bf16 words or packed (``_weight_products_into``)."""


@overload(_matrix_rows)
def _matrix_rows_for(w):
    if isinstance(w, types.Array):
        return lambda w: w.shape[0]
    return lambda w: w[0].shape[0]


def _weight_products_into(x_ni, w, out_no, n_threads, rows, tiles):
    """out = x @ W^T for a layer step's matrix W, given as bf16 words (``_products_into``) or packed
    (``_packed_products_into``): the layer kernels are compiled for either (``numba.extending.overload``)."""


@overload(_weight_products_into, jit_options={"fastmath": FASTMATH})
def _weight_products_for(x_ni, w, out_no, n_threads, rows, tiles):
    if isinstance(w, types.Array):
        return lambda x_ni, w, out_no, n_threads, rows, tiles: _products_into(x_ni, w, out_no, n_threads, rows, tiles)
    return lambda x_ni, w, out_no, n_threads, rows, tiles: _packed_products_into(x_ni, w, out_no)


MATVEC_MAX_ROWS = 16  # up to this many rows of x: the bf16 kernel (each weight row read once for all)
BLOCK_MAX_ROWS = 64  # up to this many (a prompt): the block kernel; more: widen blocks, then BLAS
WIDEN_BLOCK_ROWS = 1024  # weight rows widened at a time for BLAS (4 MB of float32 per 1024 x 1024)


F32_FEW_ROWS = (2, 8)  # float32 weights: from 2 to 8 rows of x, ``_rows_times_f32`` on the piece threads ...
F32_FEW_ROWS_MIN_BYTES = 1 << 20  # ... for a weight of at least 1 MB (below, the pieces' hand-off outweighs the gain)


@numba.njit(fastmath=FASTMATH, cache=True, nogil=True)
def _rows_times_f32(x_ni, w_oi, o0, o1, out_no):
    """out[n, o] = sum_i x[n, i] w[o, i] for the weight rows o0 <= o < o1: each row read once, from memory,
    for all the few rows of x (in the first-level cache meanwhile), 4 rows of x at a time (each loaded
    weight value feeds 4 multiply-adds: 1536 x 7168 over 4 rows 3.8 -> 2.8 ms against one row of x at a
    time, the same bits), row o + 8 asked for.  BLAS packs the weight before multiplying a few rows (in a 1-
    or 2-frame decode, 2 threads: the upsampler's ConvNeXt products of 2 rows, 4096 x 1024, 1.86 against
    0.96 ms; the transformer's of 2 rows, 1024 x 512, 312 against 220 us; one row stays BLAS's: 119 us
    against 200 with the pieces' hand-off)."""
    I = w_oi.shape[1]
    N = x_ni.shape[0]
    words = w_oi.reshape(-1)
    for o in range(o0, o1):
        if o + 8 < o1:
            for j in range((o + 8) * I, (o + 9) * I, 16):  # one request per 64-byte line
                _prefetch(words, j)
        w_i = w_oi[o]
        for n0 in range(0, N, 4):  # (the remainder repeats the last row and drops it)
            n1, n2, n3 = min(n0 + 1, N - 1), min(n0 + 2, N - 1), min(n0 + 3, N - 1)
            x0_i, x1_i, x2_i, x3_i = x_ni[n0, :I], x_ni[n1, :I], x_ni[n2, :I], x_ni[n3, :I]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(I):
                w = w_i[i]
                a0 += x0_i[i] * w
                a1 += x1_i[i] * w
                a2 += x2_i[i] * w
                a3 += x3_i[i] * w
            out_no[n0, o] = a0
            if n0 + 1 < N:
                out_no[n1, o] = a1
            if n0 + 2 < N:
                out_no[n2, o] = a2
            if n0 + 3 < N:
                out_no[n3, o] = a3


def _few_rows_f32(x, w_oi, b_o):
    """``nn.linear`` of float32 x and weight by ``_rows_times_f32``, the weight's rows shared out over the
    piece threads; None where it does not apply (another dtype or layout, too many or too few rows, a
    small weight)."""
    O, I = w_oi.shape
    rows = math.prod(x.shape[:-1])
    if not F32_FEW_ROWS[0] <= rows <= F32_FEW_ROWS[1] or w_oi.nbytes < F32_FEW_ROWS_MIN_BYTES:
        return None
    if x.dtype != np.float32 or w_oi.dtype != np.float32 or not w_oi.flags.c_contiguous or x.shape[-1] != I:
        return None
    if b_o is not None and getattr(b_o, "dtype", None) != np.float32:
        return None  # (the reference's promotion)
    x_ni = _rows_on_cache_lines(np.ascontiguousarray(x).reshape(rows, I))  # (rows on cache lines: 5-20% faster)
    out_no = np.empty((rows, O), np.float32)
    n = _piece_threads()
    run_pieces(
        lambda o0, o1: _rows_times_f32(x_ni, w_oi, o0, o1, out_no), [(O * t // n, O * (t + 1) // n) for t in range(n)]
    )
    if b_o is not None:
        out_no += b_o
    return out_no.reshape(x.shape[:-1] + (O,))


def linear(x, w_oi, b_o=None):
    """``nn.linear``.  A ``BF16Matrix`` weight is read as stored: for a few rows of x (a generation step)
    by the matrix-vector kernel, for a few dozen (a short prompt) by the block kernel, for more by BLAS
    on blocks of rows widened one block at a time, so no float32 copy of the whole matrix ever exists.
    Float32 weights go to BLAS as in the reference, but for a few rows of x and a big weight
    (``_few_rows_f32``)."""
    if not isinstance(w_oi, BF16Matrix):
        few = _few_rows_f32(x, w_oi, b_o) if isinstance(w_oi, np.ndarray) and isinstance(x, np.ndarray) else None
        return nn.linear.reference(x, w_oi, b_o) if few is None else few
    O, I = w_oi.shape
    x_ni = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, I)
    packed = packed_words(w_oi) if x_ni.shape[0] <= MATVEC_MAX_ROWS else None
    if packed is not None:  # (a code predictor's head)
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _packed_products_into(x_ni, packed, out_no)
    elif x_ni.shape[0] == 1:  # (a generation step's head: the layers' kernel, 190 against 225 us a 4 MB head)
        out_no = np.empty((1, O), dtype=np.float32)
        _matvec_bf16_into(x_ni[0], w_oi.bits, out_no[0])
    elif x_ni.shape[0] <= MATVEC_MAX_ROWS:
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _bf16_rows_times(x_ni, w_oi.bits, out_no)
    elif _tiles_take(USE_TILES, O, I):
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _tile_bf16_times(x_ni, w_oi.bits, out_no, numba.get_num_threads())
    elif x_ni.shape[0] <= BLOCK_MAX_ROWS:
        out_no = np.empty((x_ni.shape[0], O), dtype=np.float32)
        _bf16_block_times(x_ni, w_oi.bits, out_no, numba.get_num_threads())
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


TWINS = {
    "elu": elu,
    "gelu_erf": gelu_erf,
    "snake_beta": snake_beta,
    "conv1d": conv1d,
    "linear": linear,
    "decoder_layer_step": decoder_layer_step,
    "decoder_stack_step": decoder_stack_step,
    "residual_unit_push": residual_unit_push,
    "snake_causal_conv_push": snake_causal_conv_push,
    "resnet_block_offline": resnet_block_offline,
    "elu_causal_conv_offline": elu_causal_conv_offline,
    "tdnn_offline": tdnn_offline,
    "res2net_offline": res2net_offline,
    "nearest_rows": nearest_rows,
    "mean_and_std": mean_and_std,
    "softmax_mean_and_std": softmax_mean_and_std,
    "gated_residual": gated_residual,
    "spectral_magnitude": spectral_magnitude,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "attention": attention,
    "conv_transpose1d": conv_transpose1d,
}
