"""Why two runs chose different codes: the first divergent (frame, codebook) and its verdict.

Two generations part where one of them picks another code; every later frame then sees another history,
so only the first difference explains anything (unless the reference was run teacher-forced on the
candidate's codes, ``refimpl trace say --force-codes``: then every frame is comparable).  At that step
the reference trace holds the raw logits (``refimpl.talker.sampling.logits:N``, the code predictor's
under ``refimpl.talker.code_predictor.sampling.``) and the scores after each processor
(``.repetition_penalty``, ``.min_new_tokens``, ``.suppress``, ``.temperature``, ``.top_k``, ``.top_p``,
see ``refimpl.sampling``).  From them, for reference id r and candidate id c:

    margin    greedy:  final[r] - final[c]            (final = the scores after the last processor)
              sampled: how far the recorded uniform u * cdf[-1] lies from the edge of the cumulative
                       distribution that separates r from c (a probability)
    tol_s     the tolerance of the logits row (``compare.tolerance``, the precision compared) carried
              through the processors: * repetition_penalty (scores are multiplied by at most it),
              / temperature
    verdict   numeric   a compared tensor upstream of the step is out of tolerance (named: ``upstream``);
                        the logits are wrong, so the margin says nothing
              near_tie  margin <= 2 tol_s (greedy: each of the two scores may move by tol_s), or
                        margin <= (exp(2 tol_s) - 1) * cdf[edge] (sampled: every weight may change by
                        a factor exp(+-tol_s)); either choice is right at this precision
              rule      c is what the reference's logits give with one processor left out (``processor``:
                        the one left out), or with none applied (``processor``: the first one that moved
                        the choice away from c)
              numeric   none of these: no compared tensor upstream diverges (dump the port's logits)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import nn, sampling

__all__ = ["Divergence", "code_divergences", "diagnose", "PROCESSORS"]

PROCESSORS = ("repetition_penalty", "min_new_tokens", "suppress", "temperature", "top_k", "top_p")
WARPERS = ("temperature", "top_k", "top_p")
CODES_PREFIX = "refimpl.codes."
TALKER_SAMPLING = "refimpl.talker.sampling."
PREDICTOR_SAMPLING = "refimpl.talker.code_predictor.sampling."
MAX_DIAGNOSED = 64  # teacher-forced runs: verdicts for at most this many divergent codes


@dataclasses.dataclass
class Divergence:
    key: str  # the codes tensor, refimpl.codes.{item}
    frame: int
    codebook: int
    reference_id: int | None  # None: that side has no frame here (and no EOS id is known)
    candidate_id: int | None
    margin: float | None = None
    tolerance: float | None = None  # tol_s of the module docstring
    verdict: str | None = None  # near_tie / rule / numeric; None when the reference has no recorded logits
    processor: str | None = None  # set when the verdict is rule
    upstream: str | None = None  # the first compared tensor before this step that is out of tolerance
    note: str = ""

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("margin", "tolerance"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = None if math.isnan(d[k]) else ("inf" if d[k] > 0 else "-inf")
        return d

    def describe(self) -> str:
        where = f"{self.key} frame {self.frame} codebook {self.codebook}: "
        where += f"reference {self.reference_id}, candidate {self.candidate_id}"
        if self.verdict is None:
            return f"{where} ({self.note})" if self.note else where
        parts = [f"verdict {self.verdict}"]
        if self.processor:
            parts.append(f"processor {self.processor}")
        if self.margin is not None:
            parts.append(f"margin {self.margin:.4g} (tol {self.tolerance:.3g})")
        if self.upstream:
            parts.append(f"first divergent upstream tensor {self.upstream}")
        text = f"{where}: " + ", ".join(parts)
        return f"{text}; {self.note}" if self.note else text


# ----------------------------------------------------------------------------- where the codes part


def as_frames(codes) -> np.ndarray | None:
    """Codes as [T, G]: singleton leading axes dropped ([1, T, G] -> [T, G]); None if not 2-D then."""
    a = np.asarray(codes)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    return a if a.ndim == 2 else None


def code_divergences(ref_codes, cand_codes, eos_id: int | None = None) -> list:
    """[(frame, codebook, reference id, candidate id)] in (frame, codebook) order over the frames both
    have; when one run is longer, the first frame only it has is a difference at codebook 0 whose other
    side is EOS (the shorter run stopped there)."""
    ref, cand = as_frames(ref_codes), as_frames(cand_codes)
    if ref is None or cand is None or ref.shape[1] != cand.shape[1]:
        return []
    T = min(ref.shape[0], cand.shape[0])
    frames, codebooks = np.nonzero(ref[:T] != cand[:T])
    out = [(int(t), int(g), int(ref[t, g]), int(cand[t, g])) for t, g in zip(frames, codebooks, strict=True)]
    if ref.shape[0] != cand.shape[0]:
        r = int(ref[T, 0]) if ref.shape[0] > T else eos_id
        c = int(cand[T, 0]) if cand.shape[0] > T else eos_id
        out.append((T, 0, r, c))
    return out


# ----------------------------------------------------------------------------- the step's recorded scores


def step_key(keys: set, base: str, n: int) -> str | None:
    """``base:n``, or ``base`` itself for the only call (a name called once has no suffix)."""
    if f"{base}:{n}" in keys:
        return f"{base}:{n}"
    return base if n == 0 and base in keys else None


def generation_settings(metadata: dict) -> sampling.SamplingSettings:
    g = dict(metadata.get("generation") or {})
    fields = {f.name for f in dataclasses.fields(sampling.SamplingSettings)}
    return sampling.SamplingSettings(**{k: v for k, v in g.items() if k in fields and v is not None})


def eos_of(metadata: dict) -> int | None:
    inp = metadata.get("input") or {}
    if isinstance(inp.get("eos_token_id"), int):
        return inp["eos_token_id"]
    cfg = (metadata.get("config") or {}).get("talker_config") or {}
    return cfg.get("codec_eos_token_id")


class Step:
    """The recorded scores of the step that chose (item, frame, codebook) in a reference trace."""

    def __init__(self, reference, keys: set, item: int, frame: int, codebook: int, groups: int):
        self.talker = codebook == 0
        self.base = TALKER_SAMPLING if self.talker else PREDICTOR_SAMPLING
        self.n = frame if self.talker else frame * (groups - 1) + codebook - 1
        self.item, self.frame = item, frame
        raw = step_key(keys, self.base + "logits", self.n)
        self.raw = None if raw is None else np.asarray(reference[raw], dtype=np.float64)[item][None]
        self.stages = {}
        for p in PROCESSORS:
            k = step_key(keys, self.base + p, self.n)
            if k is not None:
                self.stages[p] = np.asarray(reference[k], dtype=np.float64)[item][None]
        self.chosen_key = step_key(keys, self.base + "chosen", self.n)
        self.position_key = self.chosen_key or raw

    def final(self):
        return list(self.stages.values())[-1] if self.stages else self.raw


def replay_chain(step: Step, settings, eos_id, omit: str | None = None, upto: str | None = None):
    """The reference's scores recomputed from its raw logits with ``omit`` left out (or only up to and
    including ``upto``); the penalty is taken as recorded (it needs the history)."""
    s = step.raw
    for p in step.stages:
        if p != omit:
            if p == "repetition_penalty":
                s = step.stages[p]
            elif p == "min_new_tokens":
                s = sampling.apply_min_new_tokens(s, step.frame, settings.min_new_tokens, eos_id)
            elif p == "suppress":
                s = sampling.apply_suppression(s, sampling.suppressed_ids(s.shape[-1], eos_id))
            else:
                prefix = "" if step.talker else "subtalker_"
                value = getattr(settings, prefix + p)
                s = {"temperature": sampling.apply_temperature, "top_k": sampling.apply_top_k}.get(
                    p, sampling.apply_top_p
                )(s, value)
        if p == upto:
            break
    return s


def pick(scores_1v, u: float | None) -> int:
    """``sampling.choose`` for one row: argmax, or the draw of uniform ``u``."""
    if u is None:
        return int(np.argmax(scores_1v[0]))
    probs = nn.softmax(np.asarray(scores_1v, dtype=np.float64), axis=-1)[0]
    cdf = np.cumsum(probs)
    i = min(int(np.sum(cdf <= u * cdf[-1])), probs.size - 1)
    return int(np.argmax(probs)) if probs[i] == 0 else i


def uniform_of(reference, keys: set, settings, item: int, frame: int, codebook: int, groups: int, batch: int):
    """The recorded uniform the step consumed (None for a greedy step, or if none is recorded)."""
    talker_draws = 1 if settings.do_sample else 0
    predictor_draws = 1 if settings.subtalker_dosample else 0
    if not (talker_draws if codebook == 0 else predictor_draws) or "refimpl.random_draws" not in keys:
        return None
    per_step = batch * (talker_draws + (groups - 1) * predictor_draws)
    offset = 0 if codebook == 0 else batch * (talker_draws + (codebook - 1) * predictor_draws)
    draws = np.asarray(reference["refimpl.random_draws"]).reshape(-1)
    i = frame * per_step + offset + item
    return float(draws[i]) if i < draws.size else None


def margin_of(final_1v, r: int, c: int, u: float | None, tol_s: float) -> tuple:
    """(margin, near tie?) as the module docstring defines them."""
    s = final_1v[0]
    if u is None:
        margin = float(s[r] - s[c]) if np.isfinite(s[c]) else math.inf
        return margin, margin <= 2 * tol_s
    probs = nn.softmax(np.asarray(final_1v, dtype=np.float64), axis=-1)[0]
    if probs[c] == 0:
        return math.inf, False
    cdf = np.cumsum(probs)
    target = u * cdf[-1]
    edge = cdf[c - 1] if c > r else cdf[c]  # the target must reach cdf[c-1] (c > r) or fall below cdf[c]
    margin = float(abs(edge - target))
    return margin, margin <= (math.exp(2 * tol_s) - 1) * float(edge)


# ----------------------------------------------------------------------------- the verdict


def diagnose(reference, candidate, report, tolerance_of) -> list:
    """One ``Divergence`` per differing code of every ``refimpl.codes.{i}`` both traces hold: only the first
    (later frames have other histories) unless the reference was teacher-forced, then every one (the first
    ``MAX_DIAGNOSED`` with a verdict).  Runs of another length cap (the codes row's ``compared_frames``)
    are compared over the frames both have.  ``report``: the ``compare.Report`` of the same two traces;
    ``tolerance_of(logits)``: the allowed error of a logits array at the precision compared."""
    ref_keys = reference.keys  # (a Trace builds the list on each call)
    keys = set(ref_keys)
    cand = dict(candidate.items)
    arrays = dict(reference.items)  # key -> array (a Trace looks keys up one by one)
    order = {k: i for i, k in enumerate(ref_keys)}
    batch = sum(k.startswith(CODES_PREFIX) for k in ref_keys)
    failing = [r.key for r in report.rows if not r.ok and not r.exact and not is_sampling_key(r.key)]
    forced = bool((reference.metadata.get("generation") or {}).get("forced"))
    settings = generation_settings(reference.metadata)
    eos_id = eos_of(reference.metadata)
    compared = {r.key: r.compared_frames for r in report.rows}
    out = []
    for key in ref_keys:
        if not key.startswith(CODES_PREFIX) or key not in cand:
            continue
        ref_codes, cand_codes = as_frames(arrays[key]), as_frames(cand[key])
        if ref_codes is None or cand_codes is None:
            continue
        if compared.get(key) is not None:  # runs of another length cap: the frames both have
            ref_codes, cand_codes = ref_codes[: compared[key]], cand_codes[: compared[key]]
        item = int(key[len(CODES_PREFIX) :]) if key[len(CODES_PREFIX) :].isdigit() else 0
        found = code_divergences(ref_codes, cand_codes, eos_id)
        for n, (frame, codebook, r, c) in enumerate(found if forced else found[:1]):
            d = Divergence(key, frame, codebook, r, c)
            if n < MAX_DIAGNOSED:
                judge(d, arrays, keys, order, failing, settings, eos_id, tolerance_of, item, ref_codes.shape[1], batch)
            if not forced and len(found) > 1:
                d.note = (d.note + "; " if d.note else "") + (
                    f"{len(found) - 1} later differences not judged (other histories: trace the reference "
                    "with --force-codes to compare every frame)"
                )
            out.append(d)
    return out


def is_sampling_key(key: str) -> bool:
    """The processors' scores and the draws: what a rule difference changes, not an upstream tensor."""
    return ".sampling." in key or key == "refimpl.random_draws"


def judge(d: Divergence, reference, keys, order, failing, settings, eos_id, tolerance_of, item, groups, batch):
    if d.reference_id is None or d.candidate_id is None:
        d.note = "one run has no frame here and the reference names no EOS id"
        return
    step = Step(reference, keys, item, d.frame, d.codebook, groups)
    if step.raw is None:
        d.note = "the reference has no recorded logits for this step (use a refimpl trace as the reference)"
        return
    before = order.get(step.position_key, len(order))
    d.upstream = next((k for k in failing if order.get(k, len(order)) < before), None)
    if d.upstream is not None:
        d.verdict = "numeric"
        return
    V = step.raw.shape[-1]
    if not (0 <= d.reference_id < V and 0 <= d.candidate_id < V):
        d.verdict, d.note = "numeric", f"an id outside the vocabulary [0, {V})"
        return
    u = uniform_of(reference, keys, settings, item, d.frame, d.codebook, groups, batch)
    tol = float(tolerance_of(step.raw))
    if "repetition_penalty" in step.stages:
        tol *= max(1.0, float(settings.repetition_penalty))
    if "temperature" in step.stages:
        tol /= float(settings.temperature if step.talker else settings.subtalker_temperature)
    d.tolerance = tol
    d.margin, near = margin_of(step.final(), d.reference_id, d.candidate_id, u, tol)
    if near:
        d.verdict = "near_tie"
        return
    if eos_id is not None and replay_matches(step, settings, eos_id, u, d.reference_id):
        for p in step.stages:
            if pick(replay_chain(step, settings, eos_id, omit=p), u) == d.candidate_id:
                d.verdict, d.processor = "rule", p
                return
        if pick(step.raw, u) == d.candidate_id:
            moved = next(
                (p for p in step.stages if pick(replay_chain(step, settings, eos_id, upto=p), u) != d.candidate_id),
                None,
            )
            d.verdict, d.processor = "rule", moved
            d.note = "the candidate's pick is the choice of the raw logits"
            return
    d.verdict = "numeric"
    d.note = "no compared tensor upstream of this step is out of tolerance: dump the port's logits to see where"


def replay_matches(step: Step, settings, eos_id: int, u, reference_id: int) -> bool:
    """The recomputed chain gives the recorded scores and the recorded pick (else the settings read from
    the metadata are not the ones of the run, and no rule can be judged)."""
    try:
        again = replay_chain(step, settings, eos_id)
    except (TypeError, ValueError, IndexError):
        return False
    final = step.final()
    same = np.array_equal(np.isfinite(again), np.isfinite(final)) and np.allclose(
        again[np.isfinite(again)], final[np.isfinite(final)], rtol=1e-6, atol=1e-6
    )
    return bool(same) and pick(final, u) == reference_id
