"""The twin of ``refimpl/transformer.py``'s ``transformer_stack`` for a generation step: Qwen3 decoder layers
for a few new positions of one row or of a batch's rows, on bfloat16 words, up to ``CALL_MAX_LAYERS`` layers a
Numba call, and the check of which stacks it takes (``_fits``)."""

from __future__ import annotations

import functools
import itertools
import operator
import weakref

import numba
import numpy as np

from ... import nn
from ..bf16 import BF16Matrix
from . import amx
from . import packed_words as packing
from .attention import _attend_new_positions
from .intrinsics import FASTMATH, _exp_f32, _line_aligned_empty
from .kept import _read_only
from .linear import MATVEC_MAX_ROWS, _matrix_rows, _weight_products_into
from .packed_words import packed_words


@numba.njit(fastmath={"contract"}, error_model="numpy", cache=True, nogil=True)
def _silu_times_into(gate_tf, act_tf):
    """act = SiLU(gate) * act = gate * (1 / (1 + exp(-gate))) * act (``nn.silu`` times the up projection),
    in place; exp by ``_exp_f32``, which vectorises where Numba's np.exp is a scalar call (NumPy's error
    model: a division by zero is IEEE's, not a raised error, so the loop vectorises)."""
    T, F = gate_tf.shape
    for t in range(T):
        gate_f, act_f = gate_tf[t], act_tf[t]
        for f in range(F):
            gate = gate_f[f]
            act_f[f] = gate * (np.float32(1.0) / (np.float32(1.0) + _exp_f32(-gate))) * act_f[f]


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
def _norm_rope_head(v_d, w_d, eps, cos_d, sin_d, tmp_d):
    """In place: v = rope(rms_norm(v, w)) for one head (``nn.rms_norm`` then ``nn.apply_rope``)."""
    _rms_norm_into(v_d, w_d, eps, tmp_d)
    half = v_d.shape[0] // 2
    for j in range(half):
        v_d[j] = tmp_d[j] * cos_d[j] + (-tmp_d[j + half]) * sin_d[j]
        v_d[j + half] = tmp_d[j + half] * cos_d[j + half] + tmp_d[j] * sin_d[j + half]


@numba.njit(fastmath=FASTMATH, cache=True)
def _decoder_step_bf16(
    x_btc, ln1_c, q_oi, k_oi, v_oi, qn_d, kn_d, o_oi, ln2_c, gate_fi, up_fi, down_cf, cos_btd, sin_btd,
    k_bgsd, v_bgsd, first_key_b, n, eps, n_threads, first_out, tiles
):  # fmt: skip
    """One Qwen3 decoder layer for T new positions (up to ``STEP_MAX_POSITIONS``) of each of B batch rows,
    on bf16 words, with its KV cache (written at n..n+T-1; position t of row b attends over the row's valid
    keys first_key_b[b]..n+t): the layer's output at positions first_out..T-1 of each row, [B * R, C] (every
    key and value is cached; q, the attention, o and the MLP run for those positions only: a prompt's last
    layer needs its last position alone).  Each matrix is read once for the B * T rows of x: a parallel
    loop per matrix (``_weight_products_into``, the kernel chosen by T, each row summed as it would be
    alone) and one over the rows' heads for the attention; the norms, RoPE, residual sums and SiLU on one
    thread: ``transformer.transformer_layer``'s formulas in its order.  ``tiles``: the products may run on
    the AMX tiles."""
    B, T, C = x_btc.shape
    G, D = k_bgsd.shape[1], k_bgsd.shape[3]
    Oq, Ok, F = _matrix_rows(q_oi), _matrix_rows(k_oi), _matrix_rows(gate_fi)
    H = Oq // D
    R = T - first_out  # the positions of each row whose output is returned
    h_nc = _line_aligned_empty(B * T, C)  # row b * T + t
    for b in range(B):
        for t in range(T):
            _rms_norm_into(x_btc[b, t], ln1_c, eps, h_nc[b * T + t])
    if first_out == 0:
        hq_rc = h_nc
    else:  # (the rows of the positions returned)
        hq_rc = _line_aligned_empty(B * R, C)
        for b in range(B):
            for r in range(R):
                for c in range(C):  # (a loop: a row assigned whole compiles Numba's shape-mismatch message)
                    hq_rc[b * R + r, c] = h_nc[b * T + first_out + r, c]
    q_rq = _line_aligned_empty(B * R, Oq)
    k_nk = np.empty((B * T, Ok), dtype=np.float32)
    v_nk = np.empty((B * T, Ok), dtype=np.float32)
    _weight_products_into(hq_rc, q_oi, q_rq, n_threads, T, tiles)
    _weight_products_into(h_nc, k_oi, k_nk, n_threads, T, tiles)
    _weight_products_into(h_nc, v_oi, v_nk, n_threads, T, tiles)
    tmp_d = np.empty(D, dtype=np.float32)
    for b in range(B):
        for t in range(T):
            row = b * T + t
            for g in range(G):
                _norm_rope_head(k_nk[row, g * D : (g + 1) * D], kn_d, eps, cos_btd[b, t], sin_btd[b, t], tmp_d)
                for d in range(D):
                    k_bgsd[b, g, n + t, d] = k_nk[row, g * D + d]
                    v_bgsd[b, g, n + t, d] = v_nk[row, g * D + d]
        for r in range(R):
            t = first_out + r
            for hd in range(H):
                q_d = q_rq[b * R + r, hd * D : (hd + 1) * D]
                _norm_rope_head(q_d, qn_d, eps, cos_btd[b, t], sin_btd[b, t], tmp_d)
    attn_rq = _line_aligned_empty(B * R, H * D)
    _attend_new_positions(q_rq, k_bgsd, v_bgsd, n + first_out, first_key_b, attn_rq)  # (every new key cached)
    x1_rc = np.empty((B * R, C), dtype=np.float32)
    _weight_products_into(attn_rq, o_oi, x1_rc, n_threads, T, tiles)
    h_rc = _line_aligned_empty(B * R, C)
    for b in range(B):
        for r in range(R):
            row = b * R + r
            for c in range(C):
                x1_rc[row, c] = x_btc[b, first_out + r, c] + x1_rc[row, c]
            _rms_norm_into(x1_rc[row], ln2_c, eps, h_rc[row])
    gate_rf = np.empty((B * R, F), dtype=np.float32)
    act_rf = _line_aligned_empty(B * R, F)
    _weight_products_into(h_rc, gate_fi, gate_rf, n_threads, T, tiles)
    _weight_products_into(h_rc, up_fi, act_rf, n_threads, T, tiles)
    _silu_times_into(gate_rf, act_rf)
    out_rc = np.empty((B * R, C), dtype=np.float32)
    _weight_products_into(act_rf, down_cf, out_rc, n_threads, T, tiles)
    for row in range(B * R):
        for c in range(C):
            out_rc[row, c] = x1_rc[row, c] + out_rc[row, c]
    return out_rc


STEP_TENSORS = (  # a layer's tensors in the order of _decoder_step_bf16's arguments
    *("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    *("self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.weight"),
    *("post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"),
)
STEP_MATRICES = tuple(j for j, name in enumerate(STEP_TENSORS) if name.endswith("_proj.weight"))  # their bf16 words


@numba.njit(fastmath=FASTMATH, cache=True)
def _decoder_steps_bf16(
    x_btc, ln1_l, q_l, k_l, v_l, qn_l, kn_l, o_l, ln2_l, gate_l, up_l, down_l, cos_btd, sin_btd, k_l_bgsd,
    v_l_bgsd, first_key_b, n, eps, n_threads, last_first_out, tiles
):  # fmt: skip
    """``_decoder_step_bf16`` through the L layers of a stack in turn, each argument that differs by layer a
    tuple of L (layer i: ``q_l[i]``...; its KV cache ``k_l_bgsd[i]``, ``v_l_bgsd[i]``), the last layer's
    output from position ``last_first_out`` on, [B, R, C]: one call for a generation step's stack (up to
    ``CALL_MAX_LAYERS`` layers of it)."""
    L = len(q_l)
    B, T, C = x_btc.shape
    for i in range(L):
        first_out = last_first_out if i == L - 1 else 0
        x_btc = _decoder_step_bf16(
            x_btc, ln1_l[i], q_l[i], k_l[i], v_l[i], qn_l[i], kn_l[i], o_l[i], ln2_l[i], gate_l[i], up_l[i],
            down_l[i], cos_btd, sin_btd, k_l_bgsd[i], v_l_bgsd[i], first_key_b, n, eps, n_threads, first_out, tiles,
        ).reshape(B, T - first_out, C)  # fmt: skip
    return x_btc


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


STEP_MAX_POSITIONS = 64  # new positions a fused step takes at most (a short prompt too; more: layer by layer)


def transformer_stack(
    layers: list,
    kind,
    cfg,
    x_btc,
    cos_btd,
    sin_btd,
    allowed,
    caches=None,
    eps: float = 1e-6,
    record=None,
    last_only: bool = False,
):
    """``transformer.transformer_stack`` for a stack it can take (``_fits``: a generation step, a short
    prompt, of one row or a batch) in one Numba call per ``CALL_MAX_LAYERS`` layers: the layers' tensors
    taken from the weights dict in one C call (``_stack_tensor_names``) and passed as tuples, one per
    argument of the layer kernel; layers that cannot pass as one tuple run one call each, the same kernel in
    the same order.  ``last_only``: the last layer computed for the last position alone.  What the lookups
    found for a stack and its caches is kept for their next step (``_StackMemo``).  Anything else:
    ``NotImplemented`` (the reference runs)."""
    memo = _memo_of(layers, caches) if _is_qwen3(kind) else None
    first_key_b = _fits(layers, kind, x_btc, allowed, caches, memo)
    if first_key_b is None:
        return NotImplemented
    T = x_btc.shape[1]
    for cache in caches:
        cache.reserve(T)
    stack = _stack_arguments(layers, caches, T, memo)
    if stack is not None:
        return _run_stack(x_btc, stack, cos_btd, sin_btd, first_key_b, caches, eps, last_only)
    one_by_one = [_stack_arguments([lw], [c], T) for lw, c in zip(layers, caches, strict=True)]
    if any(one is None for one in one_by_one):
        return NotImplemented  # (before any layer ran: the reference runs them all)
    for i, one in enumerate(one_by_one):
        last = last_only and i == len(layers) - 1
        x_btc = _run_stack(x_btc, one, cos_btd, sin_btd, first_key_b, caches[i : i + 1], eps, last)
    return x_btc


def _is_qwen3(kind) -> bool:
    """Qwen3 layers: RMSNorm, q/k norm, SwiGLU, no LayerScale."""
    return kind.norm == "rms" and kind.qk_norm and kind.mlp == "swiglu" and not kind.layer_scale


def _fits(layers: list, kind, x_btc, allowed, caches, memo=None):
    """Each batch row's first valid key (int64 [B]) where the fused step takes the stack, else None: at
    most ``STEP_MAX_POSITIONS`` new positions of each of the B rows that are the caches' next ones and see
    the keys causally (one position sees them all), Qwen3 layers (``_is_qwen3``) with bf16 matrices and no
    biases (``_bf16_without_biases``; ``memo``: as found for the same tensors), plain ``KVCache``s (no window)
    of B rows, and keys valid from a row's first valid one on (a left-padded batch; no padding: every first
    key 0).  Read on the host: this backend's arrays live there."""
    B, T = x_btc.shape[:2]
    if not _is_qwen3(kind) or caches is None or B < 1 or not 1 <= T <= STEP_MAX_POSITIONS or not layers:
        return None
    if not isinstance(allowed, nn.AttentionMask) or allowed.window is not None:
        return None
    if not all(hasattr(c, "reserve") and c.k.shape[0] == B for c in caches):  # a KVCache (a SlidingKVCache
        return None  # forgets keys) of the batch's rows
    fits = memo.bf16_without_biases if memo is not None else _bf16_without_biases(layers)
    n = caches[0].length
    if fits and T > 1:  # several new positions: the causal order must be the cache's
        fits = all(c.length == n for c in caches) and _is_range(allowed.query_positions_t, n, n + T)
        fits = fits and _is_range(allowed.key_positions_s, 0, n + T)
    return _first_valid_keys(allowed.key_valid_bs, B, n + T) if fits else None


def _bf16_without_biases(layers: list) -> bool:
    """Whether every matrix of the layers is a ``BF16Matrix`` and none of them has a bias."""
    return all(
        isinstance(lw[n], BF16Matrix) and b not in lw for lw in layers for n, b in zip(_MATRICES, _BIASES, strict=True)
    )


def _first_valid_keys(key_valid_bs, B: int, S: int):
    """Each row's first valid key (int64 [B]) where every key from it on is valid (left padding; all of them
    without ``key_valid_bs``), else None."""
    if key_valid_bs is None:
        return np.zeros(B, np.int64)
    try:
        valid_bs = np.broadcast_to(np.asarray(key_valid_bs, dtype=bool), (B, S))
    except ValueError:
        return None
    first_b = np.where(valid_bs.any(axis=1), np.argmax(valid_bs, axis=1), S).astype(np.int64)
    return first_b if bool(np.all(valid_bs == (np.arange(S) >= first_b[:, None]))) else None


def _is_range(positions, start: int, stop: int) -> bool:
    """Whether ``positions`` is exactly start, start + 1, ..., stop - 1."""
    positions = np.asarray(positions)
    if positions.shape != (stop - start,):
        return False
    return positions.size == 0 or (int(positions[0]) == start and bool(np.all(np.diff(positions) == 1)))


_MATRICES = tuple(STEP_TENSORS[j] for j in STEP_MATRICES)
_BIASES = tuple(f"{n[: -len('weight')]}bias" for n in _MATRICES)  # the fused step has none of them


def _stack_arguments(layers: list, caches: list, T: int, memo=None):
    """The layer kernel's arguments that differ by layer, each a tuple over ``layers`` (the matrices as
    packed words where every one has them and few rows are multiplied, else their words), then the caches'
    keys and values: None where the layers' or caches' arrays are not one Numba type each.  ``memo``: the
    stack's ``_StackMemo`` (its tensors checked to be the layers'), which keeps them from step to step."""
    weights, n = layers[0].weights, caches[0].length
    if memo is None and any(lw.weights is not weights for lw in layers):
        return None
    if not all(map(operator.eq, map(_LENGTH, caches), itertools.repeat(n))):  # (one C loop: a step's hot path)
        return None
    if memo is None:
        tensors = _stack_tensor_names(tuple(lw.prefix for lw in layers))(weights)
        by_argument, _ = _weight_arguments(tensors, T <= MATVEC_MAX_ROWS)
        keys_values = _cache_arguments(caches)
    else:
        by_argument, keys_values = memo.weight_arguments(T <= MATVEC_MAX_ROWS), memo.cache_arguments(caches)
    if by_argument is None or keys_values is None:
        return None
    return (*by_argument, *keys_values)


def _weight_arguments(tensors: tuple, few_rows: bool):
    """The kernel's arguments made of the layers' ``tensors`` (in the order of ``_stack_tensor_names``): one
    tuple over the layers per tensor of ``STEP_TENSORS``, the matrices as packed words where every one has
    them and ``few_rows`` are multiplied, else their words; None where an argument's arrays are not one Numba
    type.  And whether these arguments may be kept while the tensors and their words are the same objects:
    not where words that may change in place were packed (``packed_words`` packs them anew at each call),
    nor where a read-packed matrix had no packed words."""
    K = len(STEP_TENSORS)
    by_argument = [tensors[j::K] for j in range(K)]
    packed = {j: tuple(map(packed_words, by_argument[j])) for j in STEP_MATRICES} if few_rows else {}
    use_packed = bool(packed) and all(p is not None for words in packed.values() for p in words)
    matrices = [m for j in STEP_MATRICES for m in by_argument[j]]
    if use_packed:
        keep = all(_read_only(m.bits) for m in matrices)
    else:
        keep = not (few_rows and packing.USE_PACKED and any(m.read_packed for m in matrices))
    for j in STEP_MATRICES:  # a read-packed stack's packed words (all of its matrices), else its words as they are
        by_argument[j] = packed[j] if use_packed else tuple(m.bits for m in by_argument[j])
    arrays = [a for j, a in enumerate(by_argument) if not (use_packed and j in STEP_MATRICES)]
    return (tuple(by_argument) if all(map(_one_array_type, arrays)) else None), keep


def _cache_arguments(caches: list):
    """The caches' keys and values, a tuple over the layers each, or None where they are not one Numba type."""
    k_caches, v_caches = tuple(map(_KEYS, caches)), tuple(map(_VALUES, caches))
    return (k_caches, v_caches) if _one_array_type(k_caches) and _one_array_type(v_caches) else None


_LENGTH, _KEYS, _VALUES = operator.attrgetter("length"), operator.attrgetter("k"), operator.attrgetter("v")
_WEIGHTS, _PREFIX, _BITS = operator.attrgetter("weights"), operator.attrgetter("prefix"), operator.attrgetter("bits")


def _same_objects(now, kept) -> bool:
    """Whether the sequences hold the same objects, one by one (by identity: one C loop, no ``==`` of arrays)."""
    return len(now) == len(kept) and all(map(operator.is_, now, kept))


class _StackMemo:
    """What ``_fits`` and ``_stack_arguments`` found for a stack's layers, kept with the objects it was made
    of, for one set of caches (a generation's, or a frame's in the code predictor: ``_memo_of``), so that a
    step looks each of its tensors up again but checks the rest by identity only.

    It is used only while each object is the same one: the weights dict, its size (a tensor added: a bias)
    and every tensor the layers' names give in it (a tensor replaced); each matrix's words (``m.bits``: the
    huge-page copy, ``host_memory.copy_into_huge_pages``, swaps them in place, from another thread) and the
    packing setting; the caches' key and value arrays (``reserve`` makes new ones when a cache grows).  Any
    difference makes that part anew, as a step without the memo would.  It holds the objects it checks, so
    none of them can be freed and another made at its address while it is kept."""

    def __init__(self, layers: list):
        self.weights = layers[0].weights
        self.prefixes = tuple(map(_PREFIX, layers))
        self.size = len(self.weights)
        self.tensors = _stack_tensor_names(self.prefixes)(self.weights)
        self.matrices = tuple(m for j in STEP_MATRICES for m in self.tensors[j :: len(STEP_TENSORS)])
        self.bf16_without_biases = _bf16_without_biases(layers)
        self.arguments: dict = {}  # few rows (bool) -> (the words read, the packing setting, the weights' arguments)
        self.keys_values = ((), ())  # the caches' arrays last checked
        self.one_cache_type = False

    def same_weights(self, layers: list) -> bool:
        """Whether ``layers`` are views of this memo's dict under its prefixes, which holds the same tensors."""
        return (
            len(layers) == len(self.prefixes)
            and all(map(operator.is_, map(_WEIGHTS, layers), itertools.repeat(self.weights)))
            and tuple(map(_PREFIX, layers)) == self.prefixes
            and len(self.weights) == self.size
            and _same_objects(_stack_tensor_names(self.prefixes)(self.weights), self.tensors)
        )

    def weight_arguments(self, few_rows: bool):
        """``_weight_arguments`` of the memo's tensors, kept while the matrices' words and the packing setting
        are the ones they were made from."""
        words = tuple(map(_BITS, self.matrices))
        kept = self.arguments.get(few_rows)
        if kept is not None and kept[1] == packing.USE_PACKED and _same_objects(words, kept[0]):
            return kept[2]
        arguments, keep = _weight_arguments(self.tensors, few_rows)
        if keep:
            self.arguments[few_rows] = (words, packing.USE_PACKED, arguments)
        else:
            self.arguments.pop(few_rows, None)
        return arguments

    def cache_arguments(self, caches: list):
        """``_cache_arguments``, their type checked again only when an array is not the last one checked."""
        k_caches, v_caches = tuple(map(_KEYS, caches)), tuple(map(_VALUES, caches))
        if not (_same_objects(k_caches, self.keys_values[0]) and _same_objects(v_caches, self.keys_values[1])):
            self.keys_values = (k_caches, v_caches)
            self.one_cache_type = _one_array_type(k_caches) and _one_array_type(v_caches)
        return self.keys_values if self.one_cache_type else None


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a stack's first cache -> its _StackMemo


def _memo_of(layers: list, caches) -> _StackMemo | None:
    """The ``_StackMemo`` of ``layers`` with ``caches`` (kept as long as its first cache lives), made anew
    where it was made of other tensors; None where the layers are not of one weights dict or there are no
    caches (or ones no weak reference can point at)."""
    if not layers or not caches:
        return None
    try:
        memo = _MEMOS.get(caches[0])
    except TypeError:
        return None
    if memo is not None and memo.same_weights(layers):
        return memo
    weights = layers[0].weights
    if any(lw.weights is not weights for lw in layers):
        return None
    memo = _MEMOS[caches[0]] = _StackMemo(layers)
    return memo


# Layers a call of ``_decoder_steps_bf16`` takes at most: its compile time grows with the arrays its tuples
# hold (each tuple is L arrays, and Numba's code for a tuple grows with its length), so the released Talker's
# 28 layers go through four calls of 7, and the code predictor's 5 in one (a compile of the same kind each,
# an overload per count of layers), for a few microseconds more a step (docs/performance.md#compilation).
CALL_MAX_LAYERS = 7


def _run_stack(x_btc, stack: tuple, cos_btd, sin_btd, first_key_b, caches: list, eps: float, last_only: bool):
    """``_decoder_steps_bf16`` on one stack's arguments (``_stack_arguments``), ``CALL_MAX_LAYERS`` layers a
    call; the caches' lengths advanced."""
    n, (B, T, _) = caches[0].length, x_btc.shape
    x_btc = np.array(x_btc, dtype=np.float32, order="C")  # (a writable copy: the layers' type)
    # (copies, always writable: one Numba type whether the tables were broadcast or not, so one kernel to load;
    # broadcast only where not [B, T, D] already, the same copy without broadcast_to's few microseconds)
    tables = [
        a if a.shape == (B, T, a.shape[-1]) else np.broadcast_to(a, (B, T, a.shape[-1])) for a in (cos_btd, sin_btd)
    ]
    rope = [np.array(a, dtype=np.float32, order="C") for a in tables]
    L = len(stack[0])
    for start in range(0, L, CALL_MAX_LAYERS):
        layers = slice(start, start + CALL_MAX_LAYERS)
        last = start + CALL_MAX_LAYERS >= L
        x_btc = _decoder_steps_bf16(
            x_btc,
            *(argument[layers] for argument in stack[:-2]),
            *rope,
            *(argument[layers] for argument in stack[-2:]),
            first_key_b,
            n,
            np.float32(eps),
            numba.get_num_threads(),
            T - 1 if last and last_only else 0,
            amx.USE_TILES,
        )
    for cache in caches:
        cache.length = n + T
    return x_btc
