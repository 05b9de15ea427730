"""The GPU twins of the primitives of ``refimpl/nn.py`` on CuPy: same names, same signatures, device arrays.

The backend layer (``refimpl/backends/__init__.py``) finds here what a device backend provides: ``xp`` (the
``cupy`` module), ``special`` (``cupyx.scipy.special``), ``to_device``, ``to_host``, ``available()`` and
``TWINS``.  Every twin takes CuPy arrays and returns CuPy arrays (a host array handed to a twin is uploaded;
the stages keep everything on the device, so that happens only when a twin is called directly).  Only what
has no fused CuPy equivalent is a hand-written CUDA kernel, kept here as source text
(``tests/backends/test_cupy_kernels.py`` compiles every one with ``nvcc`` where it is installed, replays the kernels'
index arithmetic in NumPy, and runs these twins through the whole pipeline on the strict stand-in device):

    twin          how                                   formula (the primitive's docstring)
    snake_beta    ElementwiseKernel SNAKE_BETA          x + 1 / (beta + 1e-9) * sin(alpha * x)^2
    elu           ElementwiseKernel ELU                 x if x > 0 else alpha * (exp(x) - 1)
    silu          ElementwiseKernel SILU                x * sigmoid(x)
    gelu_erf      ElementwiseKernel GELU_ERF            0.5 x (1 + erf(x / sqrt 2))
    attention     RawModule ATTENTION_SOURCE for up to  softmax(q k^T * scale, masked) v, grouped-query
                  DECODE_MAX_QUERIES queries (decoding  heads, sliding window, key_valid padding
                  against a KV cache), else cuBLAS
    linear        RawModule BF16_SOURCE for a few rows  x @ W^T + b, W a BF16Matrix whose words are on
                  of x, else widen + cuBLAS             the device (float32 weights: the reference)
    conv1d        a multiply-add per tap when depthwise,  the reference's formula
                  else the reference (cuBLAS per tap)
    rms_norm      RawModule ROWS_SOURCE, a block per row   w * x / sqrt(mean(x^2) + eps)
    apply_rope    RawModule ROWS_SOURCE, one launch        x * cos + rotate_half(x) * sin

A twin exists only where it is faster than the reference or must differ from it (a generation step is
mostly kernel launches: the norm and the rotation are six CuPy operations each as formulas, one launch
each here).  Every other primitive (``softmax``, ``layer_norm``, ``conv_transpose1d``, ...) is the reference itself,
whose NumPy calls CuPy runs on device arrays through NumPy's dispatch (``__array_ufunc__``,
``__array_function__``): the formula is written once, in ``refimpl/nn.py``.

CuPy is imported only when a twin first runs or ``available()`` / ``array_module()`` is called: importing
``refimpl`` never needs it.  ``available()`` says in one error what is missing: CuPy itself (which extra
to install) or a CUDA device and driver (what CuPy said).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import nn
from . import BackendUnavailable
from .bf16 import BF16Matrix

__all__ = ["BackendUnavailable", "available", "array_module", "to_device", "to_host", "TWINS"]  # and xp, special

INSTALL_HINT = (
    "pip install 'qwen3-tts-refimpl[cuda12]' for a CUDA 12 driver, or "
    "'qwen3-tts-refimpl[cuda13]' for a CUDA 13 driver (nvidia-smi shows the driver's CUDA version)"
)

# ----------------------------------------------------------------------------- CuPy, imported on demand


def _import_cupy():
    """The ``cupy`` module, or BackendUnavailable saying what is missing."""
    try:
        import cupy
    except ModuleNotFoundError as e:
        if e.name != "cupy":
            raise BackendUnavailable(f"backend 'cupy': CuPy is installed but a module it needs is missing ({e})") from e
        raise BackendUnavailable(f"backend 'cupy': CuPy is not installed; {INSTALL_HINT}") from e
    except ImportError as e:  # a CuPy built for another CUDA, or a missing CUDA library
        raise BackendUnavailable(
            f"backend 'cupy': CuPy is installed but cannot be imported: {e}; "
            f"the CuPy package must match the CUDA driver ({INSTALL_HINT})"
        ) from e
    return cupy


@functools.lru_cache(maxsize=1)
def available() -> str:
    """A one-line description of the device the twins run on ("CuPy 14.0.0, device 0: NVIDIA H200, ...");
    BackendUnavailable (one message) when CuPy is not installed, or installed without a usable CUDA device
    or driver.  The answer is cached; a failure is not (installing a driver needs a restart anyway)."""
    cupy = _import_cupy()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("the CUDA runtime reports 0 devices")
        device = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        runtime = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
    except Exception as e:  # CUDARuntimeError (no driver, no device), or the zero count above
        raise BackendUnavailable(
            f"backend 'cupy': CuPy {cupy.__version__} is installed but found no usable CUDA "
            f"device: {type(e).__name__}: {e}"
        ) from e
    version = lambda v: f"{v // 1000}.{v % 1000 // 10}"  # noqa: E731 - CUDA writes 12.4 as 12040
    return (
        f"CuPy {cupy.__version__}, device {device.id}: {name}, CUDA runtime {version(runtime)}, "
        f"driver {version(driver)}"
    )


def array_module():
    """The ``cupy`` module, once ``available()`` has said it can run (BackendUnavailable otherwise)."""
    available()
    return _import_cupy()


def __getattr__(name):
    """``cupy_cuda.xp`` is the ``cupy`` module and ``cupy_cuda.special`` its ``cupyx.scipy.special``, both
    imported on first use (a module-level attribute hook)."""
    if name == "xp":
        return array_module()
    if name == "special":
        array_module()
        import cupyx.scipy.special

        return cupyx.scipy.special
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_device(host_array):
    """A CuPy copy of a host array (a CuPy array is returned as it is)."""
    return array_module().asarray(host_array)


def to_host(device_array):
    """The NumPy copy of a CuPy array (a NumPy array, or anything else array-like, goes through np.asarray)."""
    if isinstance(device_array, np.ndarray):
        return device_array
    get = getattr(device_array, "get", None)
    return get() if callable(get) else np.asarray(device_array)


def _contiguous(array):
    """``array`` itself when it is C-contiguous (what a kernel indexes as flat memory), else a C-ordered copy."""
    return array if array.flags.c_contiguous else array.copy()


def _rows_contiguous(x_bgsd):
    """``x_bgsd`` itself when each [S, D] block of rows is C-contiguous (a view of a KV-cache buffer with room
    for more positions is), else a C-ordered copy; the kernel steps over batches and heads by strides."""
    S, D = x_bgsd.shape[-2:]
    item = x_bgsd.itemsize
    if (D <= 1 or x_bgsd.strides[-1] == item) and (S <= 1 or x_bgsd.strides[-2] == D * item):
        return x_bgsd
    return x_bgsd.copy()


def _is_host(array) -> bool:
    """True for a NumPy array (host memory)."""
    return isinstance(array, np.ndarray)


def _on_device(*arrays):
    """Each argument as a CuPy array (None stays None): host arrays are uploaded, device arrays kept."""
    xp = array_module()
    return tuple(None if a is None else xp.asarray(a) for a in arrays)


# ----------------------------------------------------------------------------- elementwise kernels


@dataclass(frozen=True)
class ElementwiseSpec:
    """The four strings of a ``cupy.ElementwiseKernel``.  ``T`` is the float type of the call (float32 or
    float64, taken from the arguments); every argument broadcasts like a NumPy ufunc's."""

    name: str
    in_params: str
    out_params: str
    operation: str


SNAKE_BETA = ElementwiseSpec(
    "refimpl_snake_beta", "T x, T alpha, T inv_beta", "T y", "const T s = sin(alpha * x);  y = x + inv_beta * (s * s);"
)

ELU = ElementwiseSpec("refimpl_elu", "T x, T alpha", "T y", "y = x > (T)0 ? x : alpha * expm1(x);")

SILU = ElementwiseSpec("refimpl_silu", "T x", "T y", "y = x * ((T)1 / ((T)1 + exp(-x)));")

GELU_ERF = ElementwiseSpec(
    "refimpl_gelu_erf", "T x", "T y", "y = (T)0.5 * x * ((T)1 + erf(x * (T)0.70710678118654752440));"
)

ELEMENTWISE_SPECS = (SNAKE_BETA, ELU, SILU, GELU_ERF)


@functools.lru_cache(maxsize=None)
def _elementwise(spec: ElementwiseSpec):
    """The compiled-on-first-call ``cupy.ElementwiseKernel`` of ``spec``."""
    return array_module().ElementwiseKernel(spec.in_params, spec.out_params, spec.operation, spec.name)


def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """``nn.snake_beta``: x + 1 / (beta + 1e-9) * sin(alpha * x)^2 with alpha = exp(log_alpha),
    beta = exp(log_beta) per channel.  alpha and 1 / (beta + 1e-9) are computed per channel in the dtype of
    x (as the reference does), then one kernel pass over x (ElementwiseKernel SNAKE_BETA)."""
    xp = array_module()
    x_bct, log_alpha_c, log_beta_c = _on_device(x_bct, log_alpha_c, log_beta_c)
    dtype = x_bct.dtype
    alpha_1c1 = xp.exp(log_alpha_c.astype(dtype, copy=False))[None, :, None]
    inv_beta_1c1 = (1.0 / (xp.exp(log_beta_c.astype(dtype, copy=False)) + dtype.type(1e-9)))[None, :, None]
    return _elementwise(SNAKE_BETA)(x_bct, alpha_1c1, inv_beta_1c1)


def elu(x, alpha: float = 1.0):
    """``nn.elu``: x for x > 0, alpha * (exp(x) - 1) otherwise (ElementwiseKernel ELU, expm1 as the reference)."""
    (x,) = _on_device(x)
    return _elementwise(ELU)(x, x.dtype.type(alpha))


def silu(x):
    """``nn.silu``: x * sigmoid(x) = x * (1 / (1 + exp(-x))) (ElementwiseKernel SILU)."""
    (x,) = _on_device(x)
    return _elementwise(SILU)(x)


def gelu_erf(x):
    """``nn.gelu_erf``: the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))) (ElementwiseKernel GELU_ERF)."""
    (x,) = _on_device(x)
    return _elementwise(GELU_ERF)(x)


# ----------------------------------------------------------------------------- matrix products


def linear(x, w_oi, b_o=None):
    """``nn.linear``: y = x @ W^T + b over the last axis.  W on the device in the compute dtype: one cuBLAS
    product.  A ``BF16Matrix`` whose words are on the device (uint16 [O, I]): for up to MATVEC_MAX_ROWS rows
    of float32 x (a generation step) the kernel BF16_SOURCE reads the words as they are (half the bytes);
    otherwise the words are widened (exactly: a bfloat16 is the upper half of a float32) and cuBLAS runs."""
    if isinstance(w_oi, BF16Matrix):
        if _is_host(w_oi.bits):
            raise TypeError(
                "cupy backend: linear got a bfloat16 matrix still on the host; its words go to the "
                "device once, when the model is loaded (BF16Matrix(to_device(bits)))"
            )
        x, b_o = _on_device(x, b_o)
        O, I = w_oi.shape
        x_ni = x.reshape(-1, I)
        if x.dtype == np.float32 and x_ni.shape[0] <= MATVEC_MAX_ROWS:
            y = bf16_rows_times(x_ni, w_oi.bits).reshape(x.shape[:-1] + (O,))
        else:
            y = x @ widen_bf16(w_oi.bits).astype(x.dtype, copy=False).T
    elif not hasattr(w_oi, "ndim"):
        raise TypeError(f"cupy backend: linear needs the weight as an array on the device, got {type(w_oi).__name__}")
    else:
        return nn.linear.reference(*_on_device(x, w_oi, b_o))  # float32 or float64 weights: the formula
    if b_o is not None:
        y = y + b_o
    return y


# One warp per output channel o (BF16_WARPS warps per block); for each row n of x the 32 lanes split the
# input channels, widen each bfloat16 word to float32 (the word in the upper half of a 32-bit pattern,
# exact), multiply-add, and a shuffle sums the lanes: out[n, o] = sum_i x[n, i] * widen(bits[o, i]).
BF16_SOURCE = r"""
extern "C" __global__ void bf16_rows_times(const float* x,               // [N, I]
                                           const unsigned short* bits,   // [O, I] bfloat16 words
                                           float* out,                   // [N, O]
                                           int N, int O, int I) {
    const int lane = threadIdx.x % 32;
    const long long o = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (o >= O) return;                                     // the whole warp leaves together
    const unsigned short* row = bits + o * I;
    for (int n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int i = lane; i < I; i += 32) acc += x[(long long)n * I + i] * __uint_as_float((unsigned int)row[i] << 16);
        for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        if (lane == 0) out[(long long)n * O + o] = acc;
    }
}
"""
BF16_WARPS = 8  # output channels per block of 256 threads
MATVEC_MAX_ROWS = 16  # up to this many rows of x: the bf16 kernel; more: widen, then cuBLAS


@functools.lru_cache(maxsize=1)
def _bf16_function():
    """The compiled ``bf16_rows_times`` (compiled once, on first use)."""
    return array_module().RawModule(code=BF16_SOURCE).get_function("bf16_rows_times")


def widen_bf16(bits):
    """The float32 values of bfloat16 words (uint16, any shape): each word shifted into the upper half (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_rows_times(x_ni, bits_oi):
    """out[n, o] = sum_i x[n, i] * widen(bits[o, i]) for float32 x [N, I] and device words [O, I] (the kernel
    BF16_SOURCE: the weights are read once per row of x, as 16-bit words)."""
    xp = array_module()
    x_ni = _contiguous(x_ni)
    O, I = bits_oi.shape
    N = x_ni.shape[0]
    out_no = xp.empty((N, O), dtype=np.float32)
    if out_no.size == 0:
        return out_no
    if I == 0:
        out_no[...] = 0
        return out_no
    kernel = _bf16_function()
    kernel(
        ((O + BF16_WARPS - 1) // BF16_WARPS,),
        (32 * BF16_WARPS,),
        (x_ni, _contiguous(bits_oi), out_no, np.int32(N), np.int32(O), np.int32(I)),
    )
    return out_no


def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """``nn.conv1d``: out[b, o, t] = b[o] + sum_{i,k} W[o, i, k] x[b, g(o) I + i, stride t + dilation k].
    A depthwise conv (groups = channels, one input channel each) is a multiply-add per tap k (the reference
    would run a batch of 1 x 1 matrix products per tap); every other conv is the reference's formula, one
    batched cuBLAS product per tap."""
    xp = array_module()
    x_bct, w_oik, b_o = _on_device(x_bct, w_oik, b_o)
    nn.check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    if not (groups == C and I == 1 and O == C):
        return nn.conv1d.reference(x_bct, w_oik, b_o, stride, dilation, groups)
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    last = stride * (T_out - 1) + 1  # tap k reads x[..., k * dilation : k * dilation + last : stride]
    out = xp.zeros((B, O, T_out), dtype=x_bct.dtype)
    for k in range(K):
        out += w_oik[None, :, 0, k, None] * x_bct[:, :, k * dilation : k * dilation + last : stride]
    return out + b_o[None, :, None] if b_o is not None else out


# ----------------------------------------------------------------------------- attention

# One thread block per query row r = (b * H + h) * Tq + t, ATTENTION_THREADS threads (whole warps).
#   1. scores: warp w takes keys s = w, w + n_warps, ...; its 32 lanes split the head dimension and a
#      shuffle sums the partial dot products; lane 0 writes scale * q.k (or -inf where the mask forbids)
#      to the scratch row scores[r, :].
#   2. the row's max m (0 when no key is visible: m - m is not 0 for -inf), e_s = exp(score_s - m) in
#      place, their sum (1 when 0), then p_s = e_s / sum: the reference's softmax, step by step.
#   3. out[r, d] = sum_s p_s v[s, d]: thread j takes the channels d = j, j + blockDim, ... (coalesced).
# Query head h reads key/value head g = h / (H / G) (grouped-query attention).  K and V may be views of a
# larger KV-cache buffer: only the [S, D] rows of one (b, g) need be contiguous; b and g step by strides.
# A key s is visible to query t when key_pos[s] <= query_pos[t], with a window (window >= 0; -1 is none)
# also key_pos[s] > query_pos[t] - window, and with padding (has_key_valid) key_valid[b, s] != 0.
ATTENTION_SOURCE = r"""
template <typename T> __device__ __forceinline__ T negative_infinity();
template <> __device__ __forceinline__ float negative_infinity<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double negative_infinity<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}

template <typename T> __device__ __forceinline__ T warp_sum(T value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

template <typename T> __device__ __forceinline__ T warp_max(T value) {
    for (int offset = 16; offset > 0; offset /= 2) {
        const T other = __shfl_xor_sync(0xffffffffu, value, offset);
        value = other > value ? other : value;
    }
    return value;
}

// The sum (is_max false) or max (is_max true) of one value per thread, returned to every thread.
template <typename T> __device__ T block_reduce(T value, bool is_max) {
    __shared__ T partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    value = is_max ? warp_max(value) : warp_sum(value);
    __syncthreads();                       // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    value = lane < n_warps ? partial[lane] : (is_max ? negative_infinity<T>() : (T)0);
    return is_max ? warp_max(value) : warp_sum(value);
}

// score_row[s] = q . k[s] * scale for the keys s0 <= s < s1 that position p sees (causal, in the window, valid),
// -infinity for the others: one warp per key, its lanes splitting the dot product.
template <typename T>
__device__ void masked_scores(const T* q_row, const T* k_bg, const long long* key_pos, const unsigned char* key_valid,
                              T* score_row, int b, int S, int D, long long p, long long window, int has_key_valid,
                              T scale, int s0, int s1) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int s = s0 + warp; s < s1; s += n_warps) {
        T dot = 0;
        for (int d = lane; d < D; d += 32) dot += q_row[d] * k_bg[(long long)s * D + d];
        dot = warp_sum(dot);
        const long long ks = key_pos[s];
        const bool visible = ks <= p && (window < 0 || ks > p - window)
                             && (!has_key_valid || key_valid[(long long)b * S + s] != 0);
        if (lane == 0) score_row[s] = visible ? dot * scale : negative_infinity<T>();
    }
}

template <typename T>
__global__ void attention_rows(const T* q,                    // [B, H, Tq, D]
                               const T* k,                    // [B, G, S, D], rows of a (b, g) contiguous
                               const T* v,                    // [B, G, S, Dv], the same
                               const long long* query_pos,    // [Tq]
                               const long long* key_pos,      // [S]
                               const unsigned char* key_valid, // [B, S], read only when has_key_valid
                               T* scores,                     // [B, H, Tq, S] scratch
                               T* out,                        // [B, H, Tq, Dv]
                               int H, int G, int Tq, int S, int D, int Dv,
                               long long k_stride_b, long long k_stride_g,   // elements between batches,
                               long long v_stride_b, long long v_stride_g,   // between heads (a KV cache view)
                               long long window, int has_key_valid, T scale) {   // window -1: none
    const long long row = blockIdx.x;                         // (b * H + h) * Tq + t
    const int t = (int)(row % Tq);
    const int h = (int)((row / Tq) % H);
    const int b = (int)(row / ((long long)Tq * H));
    const int g = h / (H / G);
    const T* q_row = q + row * D;
    const T* k_bg = k + b * k_stride_b + g * k_stride_g;
    const T* v_bg = v + b * v_stride_b + g * v_stride_g;
    T* score_row = scores + row * S;
    const long long p = query_pos[t];
    masked_scores(q_row, k_bg, key_pos, key_valid, score_row, b, S, D, p, window, has_key_valid, scale, 0, S);
    __syncthreads();

    T m = negative_infinity<T>();
    for (int s = threadIdx.x; s < S; s += blockDim.x) m = score_row[s] > m ? score_row[s] : m;
    m = block_reduce(m, true);
    if (!(m - m == (T)0)) m = 0;                              // not finite (no visible key): 0
    T sum = 0;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const T e = exp(score_row[s] - m);
        score_row[s] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    if (sum == (T)0) sum = 1;
    for (int s = threadIdx.x; s < S; s += blockDim.x) score_row[s] = score_row[s] / sum;
    __syncthreads();

    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int s = 0; s < S; ++s) acc += score_row[s] * v_bg[(long long)s * Dv + d];
        out[row * Dv + d] = acc;
    }
}

// The keys of a row split over gridDim.y blocks: block (row, j) takes keys s0 = j * chunk <= s < s1 and
// writes its part of the softmax: m_j (the max of its visible scores, 0 when none), l_j = sum exp(score - m_j)
// and acc_j[d] = sum exp(score - m_j) v[s, d] (unnormalised).  attention_split_combine then forms the row.
template <typename T>
__global__ void attention_split_partials(const T* q, const T* k, const T* v, const long long* query_pos,
                                         const long long* key_pos, const unsigned char* key_valid,
                                         T* scores,                    // [B, H, Tq, S] scratch
                                         T* part_max, T* part_sum,     // [B, H, Tq, n_splits]
                                         T* part_out,                  // [B, H, Tq, n_splits, Dv]
                                         int H, int G, int Tq, int S, int D, int Dv,
                                         long long k_stride_b, long long k_stride_g,
                                         long long v_stride_b, long long v_stride_g,
                                         long long window, int has_key_valid, T scale, int chunk) {
    const long long row = blockIdx.x;                         // (b * H + h) * Tq + t
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int s0 = split * chunk, s1 = min(S, s0 + chunk);
    const int t = (int)(row % Tq);
    const int h = (int)((row / Tq) % H);
    const int b = (int)(row / ((long long)Tq * H));
    const int g = h / (H / G);
    const T* q_row = q + row * D;
    const T* k_bg = k + b * k_stride_b + g * k_stride_g;
    const T* v_bg = v + b * v_stride_b + g * v_stride_g;
    T* score_row = scores + row * S;
    const long long p = query_pos[t];
    masked_scores(q_row, k_bg, key_pos, key_valid, score_row, b, S, D, p, window, has_key_valid, scale, s0, s1);
    __syncthreads();

    T m = negative_infinity<T>();
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) m = score_row[s] > m ? score_row[s] : m;
    m = block_reduce(m, true);
    if (!(m - m == (T)0)) m = 0;                              // no visible key in this part: l_j = 0
    T sum = 0;
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
        const T e = exp(score_row[s] - m);
        score_row[s] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    __syncthreads();

    const long long part = row * n_splits + split;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int s = s0; s < s1; ++s) acc += score_row[s] * v_bg[(long long)s * Dv + d];
        part_out[part * Dv + d] = acc;
    }
    if (threadIdx.x == 0) {
        part_max[part] = m;
        part_sum[part] = sum;
    }
}

// One block per row: M = the largest m_j of the parts with a visible key (0 when none), w_j = exp(m_j - M),
// out[d] = sum_j w_j acc_j[d] / sum_j w_j l_j (a sum of 0 taken as 1: a row that sees no key gives zeros).
template <typename T>
__global__ void attention_split_combine(const T* part_max, const T* part_sum, const T* part_out, T* out,
                                        int n_splits, int Dv) {
    const long long row = blockIdx.x;
    const T* m_row = part_max + row * n_splits;
    const T* l_row = part_sum + row * n_splits;
    T M = negative_infinity<T>();
    for (int j = 0; j < n_splits; ++j) M = (l_row[j] > (T)0 && m_row[j] > M) ? m_row[j] : M;
    if (!(M - M == (T)0)) M = 0;
    T total = 0;
    for (int j = 0; j < n_splits; ++j) total += l_row[j] > (T)0 ? exp(m_row[j] - M) * l_row[j] : (T)0;
    if (total == (T)0) total = 1;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int j = 0; j < n_splits; ++j) {
            if (l_row[j] > (T)0) acc += exp(m_row[j] - M) * part_out[(row * n_splits + j) * Dv + d];
        }
        out[row * Dv + d] = acc / total;
    }
}
"""
ATTENTION_KERNELS = {np.dtype(np.float32): "attention_rows<float>", np.dtype(np.float64): "attention_rows<double>"}
ATTENTION_SPLIT_KERNELS = {  # (the parts, their combination)
    np.dtype(np.float32): ("attention_split_partials<float>", "attention_split_combine<float>"),
    np.dtype(np.float64): ("attention_split_partials<double>", "attention_split_combine<double>"),
}
ATTENTION_THREADS = 128  # 4 warps per query row
DECODE_MAX_QUERIES = 16  # up to this many queries: the row kernel; more: the cuBLAS formula
# A decoding step has few rows (B * H * Tq: 16 for the released Talker), far fewer than the GPU's
# multiprocessors (132 on an H100/H200): a long row's keys are split over several blocks, at least
# ATTENTION_SPLIT_KEYS keys each, until about ATTENTION_TARGET_BLOCKS blocks run.
ATTENTION_SPLIT_KEYS = 64
ATTENTION_TARGET_BLOCKS = 264


def attention_splits(rows: int, S: int) -> tuple:
    """(blocks per row, keys per block) for ``rows`` query rows of ``S`` keys: (1, S) for short rows; else
    enough blocks per row for about ATTENTION_TARGET_BLOCKS in all, each with at least ATTENTION_SPLIT_KEYS
    keys and none empty."""
    n = min(-(-S // ATTENTION_SPLIT_KEYS), max(1, -(-ATTENTION_TARGET_BLOCKS // max(rows, 1))))
    if n <= 1:
        return 1, S
    chunk = -(-S // n)
    return -(-S // chunk), chunk


@functools.lru_cache(maxsize=1)
def _attention_module():
    names = tuple(ATTENTION_KERNELS.values()) + tuple(n for pair in ATTENTION_SPLIT_KERNELS.values() for n in pair)
    return array_module().RawModule(code=ATTENTION_SOURCE, name_expressions=names)


@functools.lru_cache(maxsize=None)
def _attention_named(name: str):
    """The compiled kernel ``name`` of ATTENTION_SOURCE (the module compiled once, on first use)."""
    return _attention_module().get_function(name)


def _mask_arrays(allowed: nn.AttentionMask):
    """The mask's positions as int64 device arrays, its window as an int (-1: none), its key_valid as uint8
    (positions already on the device stay there; host ones, a few hundred integers, are uploaded)."""
    xp = array_module()
    query_pos = xp.asarray(allowed.query_positions_t).astype(np.int64, copy=False)
    key_pos = xp.asarray(allowed.key_positions_s).astype(np.int64, copy=False)
    valid = None if allowed.key_valid_bs is None else xp.asarray(allowed.key_valid_bs).astype(np.uint8)
    return query_pos, key_pos, -1 if allowed.window is None else int(allowed.window), valid


def attention_rows_kernel(q_bhtd, k_bgsd, v_bgsd, allowed: nn.AttentionMask, scale: float):
    """``nn.attention`` for an ``AttentionMask``, one thread block per query row (RawModule ATTENTION_SOURCE;
    the comment above it gives the steps), or for long rows (``attention_splits``) several blocks per row,
    each over a part of the keys, and a second kernel that combines their softmax parts.  What ``attention``
    runs for a few queries against a KV cache."""
    xp = array_module()
    q_bhtd, k_bgsd, v_bgsd = _on_device(q_bhtd, k_bgsd, v_bgsd)
    dtype = q_bhtd.dtype
    q_bhtd = _contiguous(q_bhtd)
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
    n_splits, chunk = attention_splits(rows, S)
    if n_splits == 1:
        _attention_named(ATTENTION_KERNELS[dtype])(
            (rows,), (ATTENTION_THREADS,), (*inputs, scores, out_bhtd, *sizes, *strides, *mask)
        )
        return out_bhtd
    partials, combine = (_attention_named(name) for name in ATTENTION_SPLIT_KERNELS[dtype])
    part_max, part_sum = xp.empty((rows, n_splits), dtype=dtype), xp.empty((rows, n_splits), dtype=dtype)
    part_out = xp.empty((rows, n_splits, Dv), dtype=dtype)
    partials(
        (rows, n_splits),
        (ATTENTION_THREADS,),
        (*inputs, scores, part_max, part_sum, part_out, *sizes, *strides, *mask, np.int32(chunk)),
    )
    combine((rows,), (ATTENTION_THREADS,), (part_max, part_sum, part_out, out_bhtd, np.int32(n_splits), np.int32(Dv)))
    return out_bhtd


def attention_formula(q_bhtd, k_bgsd, v_bgsd, allowed, scale: float):
    """``nn.attention`` as the reference computes it (ATTENTION_QUERY_BLOCK queries at a time, cuBLAS
    products); an ``AttentionMask``'s rows are built on the device from its positions."""
    xp = array_module()
    q_bhtd, k_bgsd, v_bgsd = _on_device(q_bhtd, k_bgsd, v_bgsd)
    H, G = q_bhtd.shape[1], k_bgsd.shape[1]
    if H != G:
        k_bgsd = xp.repeat(k_bgsd, H // G, axis=1)
        v_bgsd = xp.repeat(v_bgsd, H // G, axis=1)
    if isinstance(allowed, nn.AttentionMask):
        query_pos, key_pos, window, valid = _mask_arrays(allowed)
    else:
        (allowed,) = _on_device(allowed)
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


# ----------------------------------------------------------------------------- the norm and the rotation, fused

# A generation step on the device is mostly launches: the reference's RMSNorm is six CuPy operations (x * x,
# the mean, + eps, the root, the division, * w) and its RoPE five more (the negated half, the
# concatenation, two products and a sum), four norms and two rotations in each layer of the 103 of a
# frame.  Each is one kernel here.
ROWS_SOURCE = r"""
template <typename T>
__device__ T rows_warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// One block per row r of x [R, C] (C-contiguous): thread k sums x[r, c]^2 over c = k, k + blockDim.x, ...
// in that order, a warp's lanes are summed by the butterfly, thread 0 adds the warps' sums in order; then
// out[r, c] = w[c] * (x[r, c] / sqrt(sum / C + eps)), the reference's formula.
template <typename T>
__global__ void rms_norm_rows(const T* x, const T* w, T* out, int C, T eps) {
    __shared__ T warp_sums[32];
    __shared__ T root;
    const T* row = x + (long long)blockIdx.x * C;
    T acc = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) acc += row[c] * row[c];
    acc = rows_warp_sum(acc);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        T total = 0;
        for (int k = 0; k < blockDim.x / 32; ++k) total += warp_sums[k];
        root = sqrt(total / (T)C + eps);
    }
    __syncthreads();
    T* out_row = out + (long long)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out_row[c] = w[c] * (row[c] / root);
}

// out = x * cos + rotate_half(x) * sin for x [B, H, T, D] (C-contiguous; i = ((b H + h) T + t) D + j) and
// cos, sin [Bc, T, D] with Bc = 1 or B: rotate_half(x)[j] = -x[j + D/2] for j < D/2, x[j - D/2] after.
template <typename T>
__global__ void rope_rows(const T* x, const T* cos, const T* sin, T* out, long long n, int H, int Tn, int D,
                          int cos_batches) {
    const int half = D / 2;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        const int j = (int)(i % D);
        const long long row = i / D;
        const int t = (int)(row % Tn);
        const long long b = cos_batches == 1 ? 0 : row / ((long long)Tn * H);
        const long long k = (b * Tn + t) * D + j;
        const T rotated = j < half ? -x[i + half] : x[i - half];
        out[i] = x[i] * cos[k] + rotated * sin[k];
    }
}
"""
ROWS_KERNELS = {
    np.dtype(np.float32): ("rms_norm_rows<float>", "rope_rows<float>"),
    np.dtype(np.float64): ("rms_norm_rows<double>", "rope_rows<double>"),
}
ROPE_THREADS, ROPE_MAX_BLOCKS = 256, 4096  # a grid-stride loop over the values


@functools.lru_cache(maxsize=1)
def _rows_module():
    names = tuple(name for pair in ROWS_KERNELS.values() for name in pair)
    return array_module().RawModule(code=ROWS_SOURCE, name_expressions=names)


@functools.lru_cache(maxsize=None)
def _rows_named(name: str):
    """The compiled kernel ``name`` of ROWS_SOURCE (the module compiled once, on first use)."""
    return _rows_module().get_function(name)


def rms_norm_threads(C: int) -> int:
    """Threads of a row's block: a whole number of warps, one value each up to 256 of them."""
    return min(256, -(-C // 32) * 32)


def rms_norm(x, w, eps: float):
    """``nn.rms_norm``: w * x / sqrt(mean(x^2) + eps) over the last axis, one block of ROWS_SOURCE's
    ``rms_norm_rows`` per row (the reference's six CuPy operations in one launch); a weight of another dtype or
    shape runs the reference."""
    x, w = _on_device(x, w)
    dtype, C = x.dtype, x.shape[-1]
    if dtype not in ROWS_KERNELS or w.dtype != dtype or w.shape != (C,) or x.size == 0:
        return nn.rms_norm.reference(x, w, eps)
    x_rc = _contiguous(x).reshape(-1, C)
    out_rc = array_module().empty_like(x_rc)
    kernel = _rows_named(ROWS_KERNELS[dtype][0])
    kernel((x_rc.shape[0],), (rms_norm_threads(C),), (x_rc, _contiguous(w), out_rc, np.int32(C), dtype.type(eps)))
    return out_rc.reshape(x.shape)


def apply_rope(x_bhtd, cos_td, sin_td):
    """``nn.apply_rope``: x * cos + rotate_half(x) * sin, for x [B, H, T, D] and cos, sin [T, D] or [B or 1, 1,
    T, D] (a layer's q and k): ROWS_SOURCE's ``rope_rows`` in one launch; other shapes run the reference."""
    x_bhtd, cos_td, sin_td = _on_device(x_bhtd, cos_td, sin_td)
    dtype = x_bhtd.dtype
    if dtype not in ROWS_KERNELS or x_bhtd.ndim != 4 or x_bhtd.size == 0 or x_bhtd.shape[-1] % 2:
        return nn.apply_rope.reference(x_bhtd, cos_td, sin_td)
    B, H, T, D = x_bhtd.shape
    cos_batches = _rope_batches(cos_td, B, T, D)
    if cos_batches is None or sin_td.shape != cos_td.shape or cos_td.dtype != dtype or sin_td.dtype != dtype:
        return nn.apply_rope.reference(x_bhtd, cos_td, sin_td)
    x_bhtd = _contiguous(x_bhtd)
    out_bhtd = array_module().empty_like(x_bhtd)
    n = x_bhtd.size
    blocks = min(ROPE_MAX_BLOCKS, -(-n // ROPE_THREADS))
    sizes = (np.int64(n), np.int32(H), np.int32(T), np.int32(D), np.int32(cos_batches))
    kernel = _rows_named(ROWS_KERNELS[dtype][1])
    kernel((blocks,), (ROPE_THREADS,), (x_bhtd, _contiguous(cos_td), _contiguous(sin_td), out_bhtd, *sizes))
    return out_bhtd


def _rope_batches(cos, B: int, T: int, D: int):
    """How many batches of angles ``rope_rows`` reads for x [B, H, T, D] (1 or B), or None where cos does not
    broadcast against x as [T, D] or [B or 1, 1, T, D]."""
    if cos.shape == (T, D):
        return 1
    if cos.ndim == 4 and cos.shape[1:] == (1, T, D) and cos.shape[0] in (1, B):
        return cos.shape[0]
    return None


TWINS = {
    "snake_beta": snake_beta,
    "elu": elu,
    "silu": silu,
    "gelu_erf": gelu_erf,
    "linear": linear,
    "conv1d": conv1d,
    "attention": attention,
    "rms_norm": rms_norm,
    "apply_rope": apply_rope,
}
