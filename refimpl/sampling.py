"""Choosing the next code from logits, as the official generation does.

Talker (code group 0), at every step, in this order:

    1. repetition penalty  - every id already generated in this row (code 0 of earlier frames):
                             score / penalty if score > 0, score * penalty otherwise
    2. min_new_tokens = 2  - EOS gets -inf while fewer than 2 codes have been generated
    3. suppression         - the top 1024 ids of the talker vocabulary (the control ids: pad, bos,
                             think, language and speaker ids...) get -inf, except EOS
    and only when sampling (``do_sample=True``):
    4. temperature         - score / temperature                          (skipped when it is 1)
    5. top-k               - scores below the k-th largest get -inf       (skipped when k is 0/None)
    6. top-p               - sort ascending, softmax, cumulative sum; ids whose cumulative
                             probability is <= 1 - top_p get -inf (the largest is always kept)
    then sample from softmax(scores), or take the argmax when ``do_sample=False``.

Code predictor (groups 1..15): only steps 4-6 with the ``subtalker_*`` settings (no penalty, no
suppression), then sample or argmax (``subtalker_dosample``).

Every function takes and returns a score array [B, V]; -inf marks removed ids.  Sampling draws from a
NumPy ``Generator``, so a ``seed`` makes runs reproducible (the draws cannot equal torch's).

Sampling works on host arrays on every backend: on a device backend the generation loop copies each
logits row down first (``refimpl.tts.generate``), so the same draws give the same ids everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import nn
from .recorder import NULL_RECORDER, Recorder

__all__ = [
    "apply_repetition_penalty",
    "apply_min_new_tokens",
    "apply_suppression",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "SamplingSettings",
    "talker_scores",
    "subtalker_scores",
    "sampling_warpers",
    "choose",
    "suppressed_ids",
    "UniformDraws",
]


def apply_repetition_penalty(scores_bv, previous_bn, penalty: float):
    """Divide positive / multiply negative scores of every id that occurs in ``previous_bn`` [B, n]."""
    scores = np.array(scores_bv, copy=True)
    previous_bn = np.asarray(previous_bn, dtype=np.int64).reshape(scores.shape[0], -1)
    if previous_bn.shape[1] == 0:
        return scores
    rows = np.arange(scores.shape[0])[:, None]
    s = scores[rows, previous_bn]
    with np.errstate(over="ignore", under="ignore"):  # an overflow is reported below, naming the penalty
        scores[rows, previous_bn] = np.where(s < 0, s * scores.dtype.type(penalty), s / scores.dtype.type(penalty))
    check_scaled(scores, scores_bv, "repetition_penalty", penalty)
    return scores


def apply_min_new_tokens(scores_bv, n_generated: int, min_new_tokens: int, eos_id: int):
    """EOS -> -inf while fewer than ``min_new_tokens`` codes have been generated."""
    scores = np.array(scores_bv, copy=True)
    if n_generated < min_new_tokens:
        scores[:, eos_id] = -np.inf
    return scores


def suppressed_ids(vocab_size: int, eos_id: int, n_reserved: int = 1024) -> np.ndarray:
    """The top ``n_reserved`` ids of the talker vocabulary, EOS excluded."""
    ids = np.arange(max(vocab_size - n_reserved, 0), vocab_size)
    return ids[ids != eos_id]


def apply_suppression(scores_bv, ids):
    """The given ids -> -inf."""
    scores = np.array(scores_bv, copy=True)
    scores[:, np.asarray(ids, dtype=np.int64)] = -np.inf
    return scores


def apply_temperature(scores_bv, temperature: float):
    with np.errstate(over="ignore", under="ignore"):  # an overflow is reported below, naming the temperature
        scaled_bv = scores_bv / scores_bv.dtype.type(temperature)
    check_scaled(scaled_bv, scores_bv, "temperature", temperature)
    return scaled_bv


def check_scaled(after_bv, before_bv, name: str, value) -> None:
    """A score that was finite must stay finite when divided by a temperature or a penalty: a tiny
    divisor overflows the compute dtype (scores of infinity, softmax NaN, code 0); ValueError naming it."""
    bad = ~np.isfinite(after_bv) & np.isfinite(before_bv)
    if bad.any():
        largest = float(np.max(np.abs(before_bv[bad])))
        raise ValueError(
            f"{name} {value!r} makes the scores overflow {after_bv.dtype} (a score of {largest:.4g} "
            f"scaled by it passes {np.finfo(after_bv.dtype).max:.4g}); use a larger {name}"
        )


def check_divisor(name: str, value, dtype) -> None:
    """A temperature or penalty must be a normal number of the compute dtype: 1e-40 is below float32's
    smallest (1.2e-38; the scores would overflow), 1e300 above its largest (it would become infinity, and
    -inf / inf is NaN)."""
    tiny, largest = float(np.finfo(dtype).tiny), float(np.finfo(dtype).max)
    if not tiny <= float(value) <= largest:
        raise ValueError(
            f"{name} must lie in [{tiny:.4g}, {largest:.4g}] (the normal numbers of {np.dtype(dtype).name}, "
            f"the compute dtype), got {value!r}"
        )


def apply_top_k(scores_bv, k: int):
    """Keep the ids whose score is >= the k-th largest score of the row (ties are all kept)."""
    k = min(int(k), scores_bv.shape[-1])
    kth_b1 = -np.sort(-scores_bv, axis=-1)[:, k - 1 : k]
    return np.where(scores_bv < kth_b1, -np.inf, scores_bv).astype(scores_bv.dtype)


def apply_top_p(scores_bv, top_p: float, min_tokens_to_keep: int = 1):
    """Nucleus filter: in ascending order of score, drop ids while the cumulative probability of the
    dropped ones stays <= 1 - top_p; the ``min_tokens_to_keep`` best ids are always kept."""
    order_bv = np.argsort(scores_bv, axis=-1, kind="stable")
    sorted_bv = np.take_along_axis(scores_bv, order_bv, axis=-1)
    cumulative_bv = np.cumsum(nn.softmax(sorted_bv, axis=-1), axis=-1)
    remove_sorted = cumulative_bv <= scores_bv.dtype.type(1 - top_p)
    remove_sorted[:, -min_tokens_to_keep:] = False
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order_bv, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, scores_bv).astype(scores_bv.dtype)


# ----------------------------------------------------------------------------- settings and pipelines


@dataclass
class SamplingSettings:
    """The official sampling keywords (defaults: the released generation_config.json)."""

    do_sample: bool = True
    top_k: int | None = 50
    top_p: float | None = 1.0
    temperature: float | None = 0.9
    repetition_penalty: float | None = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int | None = 50
    subtalker_top_p: float | None = 1.0
    subtalker_temperature: float | None = 0.9
    max_new_tokens: int = 2048
    min_new_tokens: int = 2

    def validate(self, dtype=None) -> None:
        """Types and ranges of every setting; with the compute ``dtype``, also that the temperatures and
        the repetition penalty are normal numbers of it (``check_divisor``)."""

        def positive(name, value, allow_none=True):
            if value is None and allow_none:
                return
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float, np.integer, np.floating))
                or not np.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name} must be a positive number, got {value!r}")

        positive("repetition_penalty", self.repetition_penalty)
        for prefix, sample in (("", self.do_sample), ("subtalker_", self.subtalker_dosample)):
            if not isinstance(sample, (bool, np.bool_)):
                raise ValueError(
                    f"{prefix or 'do_'}{'dosample' if prefix else 'sample'} must be True or False, got {sample!r}"
                )
            t, k, p = (getattr(self, prefix + n) for n in ("temperature", "top_k", "top_p"))
            if sample:
                positive(prefix + "temperature", t)
            if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
                raise ValueError(f"{prefix}top_k must be a non-negative integer, got {k!r}")
            if p is not None and (not isinstance(p, (int, float, np.integer, np.floating)) or not 0 <= p <= 1):
                raise ValueError(f"{prefix}top_p must be a number in [0, 1], got {p!r}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, (int, np.integer))
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if dtype is not None:
            divisors = [("repetition_penalty", self.repetition_penalty)]
            divisors += [("temperature", self.temperature)] if self.do_sample else []
            divisors += [("subtalker_temperature", self.subtalker_temperature)] if self.subtalker_dosample else []
            for name, value in divisors:
                if value is not None:
                    check_divisor(name, value, dtype)


def talker_scores(logits_bv, previous_bn, settings: SamplingSettings, eos_id: int, record: Recorder = NULL_RECORDER):
    """The scores code 0 is chosen from: the six steps of the module docstring, in the official order.
    ``previous_bn`` holds the codes 0 generated so far; each applied step is recorded under its name."""
    s, scores = settings, np.asarray(logits_bv)
    previous_bn = np.asarray(previous_bn, dtype=np.int64).reshape(scores.shape[0], -1)
    if s.repetition_penalty is not None and s.repetition_penalty != 1.0:
        scores = apply_repetition_penalty(scores, previous_bn, s.repetition_penalty)  # 1
        record("repetition_penalty", scores)
    if s.min_new_tokens:
        scores = apply_min_new_tokens(scores, previous_bn.shape[1], s.min_new_tokens, eos_id)  # 2
        record("min_new_tokens", scores)
    scores = apply_suppression(scores, suppressed_ids(scores.shape[-1], eos_id))  # 3
    record("suppress", scores)
    if s.do_sample:
        scores = sampling_warpers(scores, s.temperature, s.top_k, s.top_p, record)  # 4, 5, 6
    return scores


def subtalker_scores(logits_bv, settings: SamplingSettings, record: Recorder = NULL_RECORDER):
    """The scores codes 1..15 are chosen from: only the warpers (steps 4-6), with the subtalker settings."""
    s, scores = settings, np.asarray(logits_bv)
    if s.subtalker_dosample:
        scores = sampling_warpers(scores, s.subtalker_temperature, s.subtalker_top_k, s.subtalker_top_p, record)
    return scores


def sampling_warpers(scores_bv, temperature, top_k, top_p, record: Recorder = NULL_RECORDER):
    """Steps 4-6 (only when sampling): temperature, top-k, top-p, each skipped at its neutral value."""
    if temperature is not None and temperature != 1.0:
        scores_bv = apply_temperature(scores_bv, temperature)  # 4
        record("temperature", scores_bv)
    if top_k is not None and top_k != 0:
        scores_bv = apply_top_k(scores_bv, top_k)  # 5
        record("top_k", scores_bv)
    if top_p is not None and top_p < 1.0:
        scores_bv = apply_top_p(scores_bv, top_p)  # 6
        record("top_p", scores_bv)
    return scores_bv


class UniformDraws:
    """The uniforms that sampling consumes, from a NumPy ``Generator`` or replayed from a recording.

    Every call of ``random((B, 1))`` hands out B uniforms in [0, 1), one per batch row, and keeps them
    in ``drawn``; ``recorded()`` is the whole sequence as one flat float64 vector in the order consumed
    (call by call, row by row).  Given ``replay`` (such a vector, e.g. ``refimpl.random_draws`` of a
    trace), the uniforms come from it instead, in the same order, so that the sampled codes repeat
    exactly; running out of them is an error."""

    def __init__(self, rng: np.random.Generator | None = None, replay=None):
        self.rng = rng if rng is not None else np.random.default_rng()
        self.replay = None if replay is None else checked_uniforms(replay)
        self.used = 0
        self.drawn = []

    def random(self, size):
        n = int(np.prod(size))
        if self.replay is None:
            u = self.rng.random(size)
        else:
            if self.used + n > self.replay.size:
                raise ValueError(f"random_draws ran out: {self.replay.size} recorded uniforms, this run needs more")
            u = self.replay[self.used : self.used + n].reshape(size)
        self.used += n
        self.drawn.append(np.asarray(u, dtype=np.float64).reshape(-1))
        return u

    def recorded(self) -> np.ndarray:
        return np.concatenate(self.drawn) if self.drawn else np.zeros(0, dtype=np.float64)


def checked_uniforms(replay) -> np.ndarray:
    """Recorded uniforms as a flat float64 vector: real numbers, each finite and in [0, 1) (a NaN would
    silently pick code 0 at every step); ValueError naming the first bad one."""
    arr = np.asarray(replay)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"random_draws must be real numbers (uniforms in [0, 1)), got dtype {arr.dtype}")
    arr = arr.astype(np.float64).reshape(-1)
    bad = ~(np.isfinite(arr) & (arr >= 0) & (arr < 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"random_draws[{i}] is {float(arr[i])!r}, not a uniform in [0, 1) "
            f"({int(bad.sum())} of {arr.size} such values)"
        )
    return arr


def choose(scores_bv, sample: bool, rng: np.random.Generator | UniformDraws | None):
    """argmax, or one draw per row from softmax(scores) by inverting the cumulative distribution.

    The sampling procedure, exactly (what a port replaying recorded uniforms must do): with one uniform
    u in [0, 1) per row, in float64: p = softmax(scores) (ids at -inf get 0), c = cumsum(p),
    id = the number of entries of c that are <= u * c[-1] (clamped to V - 1); if p[id] == 0 (only
    possible by rounding at an edge), id = argmax(p)."""
    if not sample:
        return np.argmax(scores_bv, axis=-1).astype(np.int64)
    probs_bv = nn.softmax(np.asarray(scores_bv, dtype=np.float64), axis=-1)
    cdf_bv = np.cumsum(probs_bv, axis=-1)
    u_b1 = rng.random((scores_bv.shape[0], 1)) * cdf_bv[:, -1:]
    ids = np.sum(cdf_bv <= u_b1, axis=-1)
    # never land on an id of probability zero (possible only through rounding at the edges)
    ids = np.minimum(ids, scores_bv.shape[-1] - 1)
    bad = probs_bv[np.arange(len(ids)), ids] == 0
    if bad.any():
        ids[bad] = np.argmax(probs_bv[bad], axis=-1)
    return ids.astype(np.int64)
