"""Recording intermediate arrays: one small object that stage code calls without branching.

    record = as_recorder(trace)          # trace: a dict to fill, a Recorder, or None
    record("pre_conv", x_bct)            # stores trace["pre_conv"] = x_bct (does nothing for None)
    layer_record = record.scope("layers.3.")
    layer_record("mlp", m_btc)           # stores trace["layers.3.mlp"]

A stage records under its own names; the caller decides the prefix with ``scope``.

A ``CallLog`` (a dict) also keeps every call in order, so that a module run more than once (a
generation step, a code-predictor group) can be named by the official rule: ``name:N`` on every
call, N counting from 0 (``CallLog.named()``; see ``refimpl.porting.trace_files`` and docs/port_authors.md).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .backends import to_host

__all__ = [
    "Recorder",
    "NULL_RECORDER",
    "as_recorder",
    "CallLog",
    "call_names",
    "EXTRA_PREFIX",
    "record_rope_and_mask",
    "record_attention_details",
]

# Names of tensors that are not the output of an official module start with this (no official module
# path does): ``refimpl.talker.prompt.embeds``, ``refimpl.encoder.quantizer...margin``.
EXTRA_PREFIX = "refimpl."


class Recorder:
    """Stores ``name -> array`` into ``store`` (a dict) under ``prefix``; with no store it does nothing.
    A recording is a host array: a device array (CuPy backend) is copied down when it is recorded."""

    __slots__ = ("store", "prefix", "attention")

    def __init__(self, store: dict | None = None, prefix: str = "", attention: bool = False):
        self.store = store
        self.prefix = prefix
        self.attention = attention  # also record post-RoPE q/k and attention probabilities (large)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def __call__(self, name: str, value) -> None:
        if self.store is not None:
            self.store[self.prefix + name] = _on_host(value)

    def lazy(self, name: str, make, *args):
        """Record ``make(*args)`` under ``name``, calling it only when recording: a tensor only a trace needs
        (the math makes something cheaper in its place).  Returns what it recorded (None when not recording),
        for a second name of the same tensor."""
        if self.store is None:
            return None
        value = make(*args)
        self.store[self.prefix + name] = _on_host(value)
        return value

    def extra(self, name: str, value) -> None:
        """Record a tensor that no official module outputs (a residual, a margin, a mask...) under the
        separate namespace ``refimpl.`` + the full name."""
        if self.store is not None:
            self.store[EXTRA_PREFIX + self.prefix + name] = _on_host(value)

    def output(self, value) -> None:
        """Record the output of the module this recorder is scoped to (``talker.model.`` -> ``talker.model``)."""
        if self.store is not None:
            self.store[self.prefix.rstrip(".")] = _on_host(value)

    def extra_scope(self, prefix: str) -> Recorder:
        """A recorder whose names all go to the ``refimpl.`` namespace: ``refimpl.`` + this prefix + prefix."""
        if self.store is None:
            return self
        return Recorder(self.store, EXTRA_PREFIX + self.prefix + prefix, self.attention)

    def scope(self, prefix: str) -> Recorder:
        """A recorder into the same store whose names start with ``prefix`` (after this one's)."""
        if self.store is None:
            return self
        return Recorder(self.store, self.prefix + prefix, self.attention)


NULL_RECORDER = Recorder(None)


def _on_host(value):
    """A device array copied to the host; host arrays and other values as they are."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__array_function__"):
        return value
    return to_host(value)


def as_recorder(trace) -> Recorder:
    """``None`` -> the recorder that does nothing; a dict -> a recorder filling it; a Recorder as is."""
    if trace is None:
        return NULL_RECORDER
    if isinstance(trace, Recorder):
        return trace
    if isinstance(trace, dict):
        return Recorder(trace)
    raise TypeError(f"trace must be a dict, a Recorder or None, not {type(trace).__name__}")


class CallLog(dict):
    """A trace dict that also remembers every ``name -> value`` in the order recorded (``calls``); the
    dict itself holds the last value of each name."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __setitem__(self, name, value) -> None:
        self.calls.append((name, value))
        super().__setitem__(name, value)

    def named(self) -> list:
        """[(key, value)] in call order, with ``:N`` appended to every call of a name called more than once."""
        return list(zip(call_names([n for n, _ in self.calls]), (v for _, v in self.calls), strict=True))


def call_names(names: list) -> list:
    """The naming rule: a name occurring once stays as it is; one occurring k > 1 times becomes
    ``name:0`` ... ``name:{k-1}`` in order."""
    total = Counter(names)
    seen = Counter()
    out = []
    for name in names:
        out.append(f"{name}:{seen[name]}" if total[name] > 1 else name)
        seen[name] += 1
    return out


def record_rope_and_mask(record, cos_btd, sin_btd, mask, mrope: bool = False, per_row: bool = False) -> None:
    """Trace the stack-level rotary module (``rotary_emb``: cos, [3, B, T, D] for the Talker's mRoPE
    whose three streams are equal here, else [B, T, D]) and, as extras, sin and the dense attention mask:
    [T, S], or [B, 1, T, S] where it has padding or ``per_row`` (the Talker's, even when no row is padded)."""
    if not record.enabled:
        return
    record("rotary_emb", np.broadcast_to(cos_btd, (3,) + cos_btd.shape) if mrope else cos_btd)
    record.extra("rotary_emb.sin", sin_btd)
    dense = mask.rows(0, len(mask.query_positions_t))
    if per_row and dense.ndim == 2:
        dense = np.repeat(to_host(dense)[None, None], cos_btd.shape[0], axis=0)
    record.extra("attention_mask", dense)


def record_attention_details(record, q_bhtd, k_bgsd, allowed, scale: float, k_new_bgtd) -> None:
    """Only for a recorder made with ``attention=True`` (they are large): as extras of the attention
    module, the queries and the new keys after RoPE (``q_rope`` [B, H, T, D], ``k_rope`` [B, G, T, D]) and
    the attention probabilities over every key seen (``attn_probs`` [B, H, T, S], masked keys 0), as the
    official eager attention computes them: softmax(q k^T * scale + mask)."""
    if not (record.enabled and record.attention):
        return
    record.extra("q_rope", q_bhtd)
    record.extra("k_rope", k_new_bgtd)
    q, k = to_host(q_bhtd).astype(np.float64), to_host(k_bgsd).astype(np.float64)
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scores = np.einsum("bhtd,bhsd->bhts", q, k) * scale
    mask = allowed.rows(0, q.shape[2]) if hasattr(allowed, "rows") else np.asarray(to_host(allowed))
    scores = np.where(np.broadcast_to(to_host(mask), scores.shape), scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0))
    probs = e / np.maximum(e.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    record.extra("attn_probs", probs.astype(np.asarray(to_host(q_bhtd)).dtype))
