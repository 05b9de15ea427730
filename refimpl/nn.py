"""The numerical primitives every network stage is built from, as plain NumPy functions.

Conventions: ``x_bct`` is [batch, channels, time] (the layout of the convolutional stages),
``x_btc`` is [batch, time, channels] (the transformer layout), attention tensors are
[batch, heads, time, head_dim].  Every function computes in the dtype of its input
(float32 by default, float64 in the oracle mode); weights are converted to that dtype when loaded.

Each function here has one job, a name that says what it is, and a body that is the formula of its
docstring.  Speed lives elsewhere: a function marked ``@primitive`` hands its call to the active
backend's twin of the same name and signature when there is one (``refimpl/backends``); its own body
is the reference the twins are tested against.

The formulas are written once for every backend: on a device backend (CuPy, or the strict stand-in
of the tests) the same NumPy calls run on device arrays, through NumPy's dispatch protocols
(``__array_ufunc__``, ``__array_function__``).  What NumPy cannot dispatch goes through the helpers
below: arrays created from nothing (``zeros``, ``arange``...: the active backend decides where they
live; inside a primitive, where its input lives), uploads and downloads (``to_device``, ``to_host``),
and ``scipy.special`` (``sigmoid``, ``erf``: computed by the device's own special functions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import backends
from .backends import primitive

# ----------------------------------------------------------------------------- arrays of the active backend

to_device = backends.to_device  # host array -> array of the active backend (np.asarray on the host ones)
to_host = backends.to_host  # any array -> numpy.ndarray (a device array is copied down)
array_module = backends.array_module  # numpy, or the device backend's namespace (cupy)


def zeros(shape, dtype=np.float32):
    """Zeros of the active backend (on the device for a device backend)."""
    return backends.array_module().zeros(shape, dtype=dtype)


def empty(shape, dtype=np.float32):
    return backends.array_module().empty(shape, dtype=dtype)


def ones(shape, dtype=np.float32):
    return backends.array_module().ones(shape, dtype=dtype)


def full(shape, value, dtype=np.float32):
    return backends.array_module().full(shape, value, dtype=dtype)


def arange(*args, dtype=np.int64):
    """``arange`` of the active backend (positions, mask indices); int64 unless told."""
    return backends.array_module().arange(*args, dtype=dtype)


def module_of(x):
    """The namespace that created ``x``: numpy for a host array, else the active device backend's."""
    return np if isinstance(x, np.ndarray) else backends.array_module()


def as_array(x):
    """``x`` as it is when it already is an array (host or device), else ``np.asarray(x)`` (lists, ranges)."""
    return x if hasattr(x, "__array_function__") else np.asarray(x)


def sigmoid(x):
    """1 / (1 + exp(-x)) (``scipy.special.expit``, or the device's twin of it)."""
    return backends.special_module(x).expit(x)


def erf(x):
    """The error function (``scipy.special.erf``, or the device's twin of it)."""
    return backends.special_module(x).erf(x)


# ----------------------------------------------------------------------------- elementwise


@primitive
def silu(x):
    """x * sigmoid(x)."""
    return x * sigmoid(x)


@primitive
def gelu_erf(x):
    """The exact GELU: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    return 0.5 * x * (1.0 + erf(x * x.dtype.type(1.0 / math.sqrt(2.0))))


@primitive
def elu(x, alpha: float = 1.0):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(np.minimum(x, 0)))


@primitive
def snake_beta(x_bct, log_alpha_c, log_beta_c):
    """SnakeBeta: x + 1 / (beta + 1e-9) * sin(alpha * x)^2, with alpha = exp(log_alpha), beta = exp(log_beta)
    per channel (the checkpoint stores the logarithms)."""
    alpha = np.exp(log_alpha_c)[None, :, None]
    inv_beta = 1.0 / (np.exp(log_beta_c)[None, :, None] + x_bct.dtype.type(1e-9))
    return x_bct + inv_beta * np.sin(alpha * x_bct) ** 2


@primitive
def softmax(x, axis: int = -1):
    """exp(x - max) / sum(exp(x - max)); rows that are entirely -inf give zeros, not NaN."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s)


# ----------------------------------------------------------------------------- linear and norms


@primitive
def linear(x, w_oi, b_o=None):
    """y = x @ W^T + b, over the last axis (the torch ``nn.Linear`` layout: W is [out, in])."""
    y = x @ w_oi.T
    if b_o is not None:
        y = y + b_o
    return y


@primitive
def linears(x, weights, biases=None):
    """Several linear maps of the same input: (linear(x, W_1, b_1), linear(x, W_2, b_2), ...); ``biases``
    None or one bias (or None) per weight.  (A twin may compute them in one pass over the weights.)"""
    biases = (None,) * len(weights) if biases is None else biases
    return tuple(linear(x, w, b) for w, b in zip(weights, biases, strict=True))


@primitive
def rms_norm(x, w, eps: float):
    """w * x / sqrt(mean(x^2) + eps), over the last axis."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(variance + x.dtype.type(eps)))


@primitive
def layer_norm(x, w, b, eps: float):
    """w * (x - mean) / sqrt(var + eps) + b, over the last axis (biased variance)."""
    mean = np.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    y = centred / np.sqrt(variance + x.dtype.type(eps))
    return y * w + b if b is not None else y * w


# ----------------------------------------------------------------------------- convolutions


def check_conv1d_shapes(x_bct, w_oik, stride: int, dilation: int, groups: int) -> None:
    """ValueError unless x [B, C, T] and W [O, C / groups, K] fit a valid conv with at least one output."""
    C, T = x_bct.shape[1], x_bct.shape[-1]
    O, I, K = w_oik.shape
    if groups < 1 or C % groups or O % groups or I * groups != C:
        raise ValueError(
            f"conv1d: {C} input channels, weight {w_oik.shape} and groups={groups} do not fit "
            f"(the weight must be [O, C / groups, K] with C and O multiples of groups)"
        )
    if stride < 1 or dilation < 1:
        raise ValueError(f"conv1d: stride {stride} and dilation {dilation} must be positive")
    span = dilation * (K - 1) + 1
    if span > T:
        raise ValueError(f"conv1d: input length {T} is shorter than the kernel span {span}")


@primitive
def conv1d(x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1):
    """Valid (unpadded) 1-D cross-correlation, the torch ``nn.Conv1d`` layout: W is [out, in/groups, k].

    out[b, o, t] = b[o] + sum_{i, k} W[o, i, k] * x[b, g(o) * I + i, stride * t + dilation * k]

    where g(o) = o // (O / groups) is the group of output channel o.  Written as one (batched) matrix
    product per kernel tap k: the tap is the input read at stride * t + dilation * k.
    """
    check_conv1d_shapes(x_bct, w_oik, stride, dilation, groups)
    B, C, T = x_bct.shape
    O, I, K = w_oik.shape
    T_out = (T - dilation * (K - 1) - 1) // stride + 1
    x_bgit = x_bct.reshape(B, groups, I, T)
    w_goik = w_oik.reshape(groups, O // groups, I, K)
    out_bgot = 0
    for k in range(K):
        tap_bgit = x_bgit[..., k * dilation : k * dilation + stride * (T_out - 1) + 1 : stride]
        out_bgot = out_bgot + np.matmul(w_goik[:, :, :, k], tap_bgit)
    out = out_bgot.reshape(B, O, T_out)
    return out + b_o[None, :, None] if b_o is not None else out


@primitive
def conv_transpose1d(x_bct, w_iok, b_o=None, stride: int = 1):
    """1-D transposed convolution, the torch ``nn.ConvTranspose1d`` layout: W is [in, out, k].

    Each input frame t scatters W[:, :, k]^T x[:, t] to output position stride * t + k; the output
    has (T - 1) * stride + K samples.
    """
    B, C, T = x_bct.shape
    I, O, K = w_iok.shape
    out = module_of(x_bct).zeros((B, O, (T - 1) * stride + K), dtype=x_bct.dtype)
    for k in range(K):
        out[:, :, k : k + stride * (T - 1) + 1 : stride] += np.matmul(w_iok[:, :, k].T, x_bct)
    if b_o is not None:
        out += b_o[None, :, None]
    return out


def causal_padding(kernel_size: int, stride: int = 1, dilation: int = 1) -> int:
    """Left padding of a causal conv: the effective kernel span minus the stride."""
    return (kernel_size - 1) * dilation + 1 - stride


def extra_right_padding(length: int, kernel_size: int, stride: int = 1, dilation: int = 1) -> int:
    """Zeros appended on the right so that a strided causal conv covers the tail of the input:
    the output has ceil(length / stride) frames.  Zero for stride 1."""
    span = (kernel_size - 1) * dilation + 1
    pad = span - stride
    n_frames = math.ceil((length - span + pad) / stride + 1)
    ideal_length = (n_frames - 1) * stride + (span - pad)
    return ideal_length - length


@dataclass
class CausalConvState:
    """What a causal conv carries between streaming pushes: the last (K - 1) * dilation input samples,
    [B, C, span - 1] (None before the first push, which then sees zeros: the offline zero padding)."""

    context_bct: np.ndarray | None = None


@dataclass
class TransposedConvState:
    """What a transposed conv carries between streaming pushes: the K - stride output samples that the
    last frames only partly computed (no bias yet), [B, O, K - stride]; the next push adds to them."""

    tail_bot: np.ndarray | None = None


def causal_conv1d(
    x_bct, w_oik, b_o=None, stride: int = 1, dilation: int = 1, groups: int = 1, state: CausalConvState | None = None
):
    """Causal conv: the output at t sees inputs <= t only.

    Offline (``state=None``): pad the left with span - stride zeros (and the right by the extra padding
    a strided conv needs), then a valid conv.  Streaming (a ``CausalConvState``, stride 1): the left
    padding is the previous push's last span - 1 inputs instead, and the state keeps this push's."""
    K = w_oik.shape[-1]
    left = causal_padding(K, stride, dilation)
    if state is None:
        right = extra_right_padding(x_bct.shape[-1], K, stride, dilation)
        return conv1d(np.pad(x_bct, ((0, 0), (0, 0), (left, right))), w_oik, b_o, stride, dilation, groups)
    if stride != 1:
        raise ValueError("a streaming causal conv must have stride 1")
    B, C, T = x_bct.shape
    xp = module_of(x_bct)
    past_bct = state.context_bct if state.context_bct is not None else xp.zeros((B, C, left), dtype=x_bct.dtype)
    x_bct = np.concatenate([past_bct, x_bct], axis=-1)
    state.context_bct = x_bct[:, :, x_bct.shape[-1] - left :]
    if T == 0:
        return xp.zeros((B, w_oik.shape[0], 0), dtype=x_bct.dtype)
    return conv1d(x_bct, w_oik, b_o, 1, dilation, groups)


def causal_conv_transpose1d(x_bct, w_iok, b_o=None, stride: int = 1, state: TransposedConvState | None = None):
    """Transposed conv with T frames in and T * stride samples out; output sample p depends only on
    input frames <= p // stride.

    Offline (``state=None``): the full output minus its last K - stride samples.  Streaming: those last
    samples are only partial sums (later frames add to them), so they are kept in the state and added
    to the first samples of the next push."""
    K = w_iok.shape[-1]
    if state is None:
        out = conv_transpose1d(x_bct, w_iok, b_o, stride)
        trim = K - stride
        return out[:, :, : out.shape[-1] - trim] if trim > 0 else out
    B, _, T = x_bct.shape
    O = w_iok.shape[1]
    xp = module_of(x_bct)
    if state.tail_bot is None:
        state.tail_bot = xp.zeros((B, O, K - stride), dtype=x_bct.dtype)
    if T == 0:
        return xp.zeros((B, O, 0), dtype=x_bct.dtype)
    full_bot = conv_transpose1d(x_bct, w_iok, None, stride)  # [B, O, (T - 1) * stride + K]
    full_bot[:, :, : K - stride] += state.tail_bot
    state.tail_bot = full_bot[:, :, T * stride :]
    out = full_bot[:, :, : T * stride]
    return out + b_o[None, :, None] if b_o is not None else out


# ----------------------------------------------------------------------------- rotary embedding and attention


def rope_inverse_frequencies(head_dim: int, theta: float, dtype=np.float32):
    """inv_freq[j] = 1 / theta^(2j / head_dim), j < head_dim / 2.

    In float32 mode this is computed in float32, like the official code, so that the angle
    roundings match; in float64 mode everything is float64.  A small host table (a constant of the config)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(dtype) / dtype(head_dim)
    return (dtype(1.0) / (dtype(theta) ** exponent)).astype(dtype)


_INVERSE_FREQUENCIES: dict = {}  # (head_dim, theta, dtype, device backend or None: the host) -> inv_freq there


def _inverse_frequencies_on(head_dim: int, theta: float, dtype: np.dtype, backend: str | None):
    """``rope_inverse_frequencies`` made once per config and place (a constant of the config): uploaded to
    device backend ``backend``, or for None a read-only host table (a generation step asks for it every
    step: its six small NumPy calls were a tenth of a code predictor step's work around its layers)."""
    key = (head_dim, float(theta), dtype, backend)
    if key not in _INVERSE_FREQUENCIES:
        inv_freq = rope_inverse_frequencies(head_dim, theta, dtype.type)
        if backend is None:
            inv_freq.flags.writeable = False
        _INVERSE_FREQUENCIES[key] = inv_freq if backend is None else to_device(inv_freq)
    return _INVERSE_FREQUENCIES[key]


def rope_cos_sin(positions_t, head_dim: int, theta: float, dtype=np.float32):
    """cos and sin tables [..., T, head_dim] for integer positions [..., T] (any leading axes):
    angle[..., t, j] = position[..., t] * inv_freq[j], the two halves repeated.  In float32 mode the
    angle is a float32 product, like the official code.  Positions on a device give tables on the device."""
    positions_t = as_array(positions_t)
    place = None if isinstance(positions_t, np.ndarray) else backends.device_backend()
    inv_freq = _inverse_frequencies_on(head_dim, theta, np.dtype(dtype), place)
    angles_tj = positions_t.astype(dtype)[..., None] * inv_freq
    angles_td = np.concatenate([angles_tj, angles_tj], axis=-1)
    return np.cos(angles_td), np.sin(angles_td)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last axis (split in halves)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@primitive
def apply_rope(x_bhtd, cos_td, sin_td):
    """Rotate each (j, j + D/2) pair of channels by its position's angle."""
    return x_bhtd * cos_td + rotate_half(x_bhtd) * sin_td


def causal_window_mask(query_positions_t, key_positions_s, window: int | None = None):
    """Boolean [Tq, Tk]: True where query at position p may attend to key at position s:
    s <= p and, with a sliding window, s > p - window (the query sees ``window`` keys, itself included)."""
    q = as_array(query_positions_t)[:, None]
    k = as_array(key_positions_s)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see, without building the [T, S] matrix for the whole sequence:
    key s is visible to query t when key_position[s] <= query_position[t] (causal), with a window also
    key_position[s] > query_position[t] - window, and (batches with left padding) key_valid[b, s]."""

    query_positions_t: np.ndarray
    key_positions_s: np.ndarray
    window: int | None = None
    key_valid_bs: np.ndarray | None = None  # [B, S], False on padding

    def rows(self, start: int, stop: int):
        """The mask of queries start..stop-1: bool [stop - start, S], or [B, 1, stop - start, S]."""
        allowed_ts = causal_window_mask(self.query_positions_t[start:stop], self.key_positions_s, self.window)
        if self.key_valid_bs is None:
            return allowed_ts
        return allowed_ts[None, None] & as_array(self.key_valid_bs).astype(bool, copy=False)[:, None, None, :]


ATTENTION_QUERY_BLOCK = 256  # queries per block: the scores held at once are [B, H, 256, S]


@primitive
def attention(q_bhtd, k_bgsd, v_bgsd, allowed, scale: float):
    """Scaled dot-product attention with grouped-query heads: softmax(q k^T * scale, masked) v.

    q has H heads, k and v have G <= H heads; query head h uses key/value head h // (H / G).
    ``allowed`` is an ``AttentionMask`` or a boolean array broadcastable to [B, H, T, S].  The queries
    are taken ``ATTENTION_QUERY_BLOCK`` at a time, so memory grows linearly with the sequence (the
    [T, S] scores never exist at once); each query's row is computed exactly as with all of them.
    """
    H, G = q_bhtd.shape[1], k_bgsd.shape[1]
    if H % G:
        raise ValueError(f"attention: {H} query heads cannot share {G} key/value heads (not a multiple)")
    if H != G:
        k_bgsd = np.repeat(k_bgsd, H // G, axis=1)
        v_bgsd = np.repeat(v_bgsd, H // G, axis=1)
    T = q_bhtd.shape[2]
    out_bhtd = module_of(q_bhtd).empty(q_bhtd.shape[:-1] + v_bgsd.shape[-1:], dtype=np.result_type(q_bhtd, v_bgsd))
    for start in range(0, T, ATTENTION_QUERY_BLOCK):
        stop = min(T, start + ATTENTION_QUERY_BLOCK)
        if isinstance(allowed, AttentionMask):
            allowed_ts = allowed.rows(start, stop)
        else:
            allowed = as_array(allowed)
            allowed_ts = allowed if allowed.shape[-2] == 1 else allowed[..., start:stop, :]
        scores_bhts = np.matmul(q_bhtd[:, :, start:stop], np.swapaxes(k_bgsd, -1, -2)) * q_bhtd.dtype.type(scale)
        scores_bhts = np.where(allowed_ts, scores_bhts, -np.inf)
        out_bhtd[:, :, start:stop] = np.matmul(softmax(scores_bhts, axis=-1), v_bgsd)
    return out_bhtd
