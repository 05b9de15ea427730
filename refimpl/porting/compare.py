"""Comparing two traces, and the project's tolerance rule (docs/golden.md, docs/port_authors.md).

The rule, for an array whose reference (the official result, or a float64 run) is ``ref``, with
scale = max(1, max |ref|) and eps the machine epsilon of the precision the candidate computes in:

    float64:                tol = 1e-10 * scale
    float32/bfloat16/float16: tol = 4 * noise + 4 * eps * scale

``noise`` is how far the official model itself lands from its float64 run in that precision.  The
parity tests measure it per array from the golden files (``check_against_oracle``); ``compare``, which
has only two dumps, uses the measured bound noise <= ratio * eps * scale, with ``ratio`` the largest
|official_p - official_f64| / (eps * scale) over every module output of each network on the tiny
checkpoints (``golden/oracle/record_trace_keys.py`` -> ``golden/trace/precision_noise.json``,
copied into ``NOISE_RATIO``).  Integer arrays (codes, ids) must be equal.

Frames.  A trace's frame count T (per item) is the rows of its codes ``refimpl.codes.{i}`` (else
``refimpl.forced_codes.{i}``, else the metadata's ``input.frames``, else the waveform ``decoder``'s
samples / 1920).  Tensors indexed by generated frame have a time axis (``time_axes``): the codes and
forced codes their rows, ``refimpl.random_draws`` its only axis, the API's audio ``refimpl.waveform.{i}``
its samples, the codec decoder's tensors (``decoder``,
``decoder.*``, ``refimpl.decoder.*``) the time axis of their official layout (channels-first: the last;
channels-last, the pre-transformer, the codebook rows ``project_out`` and the ConvNeXt's ``norm`` /
``pwconv1`` / ``act`` / ``pwconv2``: axis 1; attention details [B, H, T, S]: axis 2 and the mask [T, T]
both).  A time axis of length L maps k steps to a frame, k the largest divisor of 1920 (every rate in the
decoder divides the 24 kHz hop of 1920 samples) with T * k <= L; steps past T * k (the r < k tail steps
of an untrimmed transposed conv, T * k + r long) belong to the last frame; a tail of k or more steps means
the axis does not fit T (no frame errors).  Codes: k = 1 (L = T); the draws: L // T.
Per frame, a row records the max abs error and the first frame (and step along the time axis: for the
waveform the 24 kHz sample) out of the row's tolerance.

Two runs of another length.  When the frame counts differ and the shorter run reached its length cap
(T >= max_new_tokens - 1, from the metadata's ``generation`` or ``input``: the official API's
max_new_tokens - 1 frames, or a port's max_new_tokens), a frame-indexed tensor whose shapes differ only
along its time axes by exactly (T_long - T_short) * k is compared over the T_short frames both have
(``Row.compared_frames``).  Any other shape difference is a failing row (``Row.shape_mismatch``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:  # for the annotations only
    from .diagnose import Divergence
    from .trace_files import Trace

__all__ = [
    "EPS",
    "NOISE_RATIO",
    "NOISE_RATIO_RELEASED",
    "NOISE_SIZES",
    "tolerance",
    "check_against_oracle",
    "OracleCheck",
    "Row",
    "FrameDivergence",
    "Report",
    "compare_traces",
    "metadata_mismatches",
    "prefix_hint",
    "PRECISIONS",
]

F64_REL = 1e-10
EPS = {"float32": float(np.finfo(np.float32).eps), "bfloat16": 2.0**-7, "float16": float(np.finfo(np.float16).eps)}
PRECISIONS = ("float64", "float32", "bfloat16", "float16")

# max |official_p - official_f64| / (eps_p * max(1, max|official_f64|)) per network, measured with the
# official qwen-tts 0.1.1 model cast to each dtype (golden/trace/precision_noise.json), rounded up.
NOISE_RATIO = {
    "float32": {"decoder": 9.3, "encoder": 7.0, "speaker_encoder": 12.6, "talker": 4.9},
    "bfloat16": {"decoder": 5.1, "encoder": 228.4, "speaker_encoder": 2.8, "talker": 2.3},
    "float16": {"decoder": 6.7, "encoder": 2.5, "speaker_encoder": 3.4, "talker": 2.0},
}
# The same at the released size (golden/oracle/measure_released_noise.py -> golden/trace/precision_noise_released.json:
# the full-size synthetic 0.6B CustomVoice and the released speech tokenizer, 4 decoded frames and 3 generated
# ones), float32 only, rounded up; the networks not measured there keep their tiny-checkpoint ratio.  The
# official decoder's own float32 noise is 5.3 times the tiny ratio there: the tiny table would fail the
# official model itself.  ``NOISE_SIZES`` names the tables (``refimpl compare --noise``, a suite's manifest).
NOISE_RATIO_RELEASED = {
    "float32": dict(NOISE_RATIO["float32"], decoder=48.9, talker=14.5),
    "bfloat16": NOISE_RATIO["bfloat16"],
    "float16": NOISE_RATIO["float16"],
}
NOISE_SIZES = {"tiny": NOISE_RATIO, "released": NOISE_RATIO_RELEASED}
NOISE_FACTOR = 4.0


def scale_of(ref: ArrayLike) -> float:
    ref = np.asarray(ref)
    return max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0


def network_of(key: str) -> str:
    """decoder / encoder / speaker_encoder / talker from a trace key (``refimpl.`` extras: the part after it)."""
    parts = key.split(":")[0].split(".")
    if parts[0] == "refimpl" and len(parts) > 1:
        parts = parts[1:]
    return parts[0]


def tolerance(
    ref: ArrayLike,
    precision: str,
    noise: float | None = None,
    network: str | None = None,
    noise_factor: float = NOISE_FACTOR,
    f64_rel: float = F64_REL,
    size: str = "tiny",
) -> float:
    """The allowed max |candidate - ref| for one array (the module docstring).  ``noise``: the measured
    official noise of this very array if known; else the measured bound for ``network`` on checkpoints of
    ``size`` ("tiny" or "released": ``NOISE_SIZES``)."""
    scale = scale_of(ref)
    if precision == "float64":
        return f64_rel * scale
    eps = EPS[precision]
    if noise is None:
        ratios = NOISE_SIZES[size][precision]
        noise = ratios.get(network, max(ratios.values())) * eps * scale  # type: ignore[arg-type]  # None: the largest
    return noise_factor * noise + noise_factor * eps * scale


@dataclasses.dataclass
class OracleCheck:
    err32: float  # max |ours - official_f32| (float32 checks), or max |ours - official_f64| (float64)
    err64: float  # max |ours - official_f64|
    tol: float
    noise: float  # max |official_f32 - official_f64|

    @property
    def ok(self) -> bool:
        return self.err32 <= self.tol and self.err64 <= self.tol


def max_abs_diff(a: ArrayLike, b: ArrayLike) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def check_against_oracle(
    ours: ArrayLike,
    off32: ArrayLike,
    off64: ArrayLike,
    precision: str,
    noise_factor: float = NOISE_FACTOR,
    f64_rel: float = F64_REL,
) -> OracleCheck:
    """The parity tests' rule: ``precision`` "f64"/"float64" checks ours against official_f64 only;
    "f32"/"float32" against both, with the noise measured from this golden pair."""
    off64 = np.asarray(off64, dtype=np.float64)
    if precision in ("f64", "float64"):
        err = max_abs_diff(ours, off64)
        return OracleCheck(err, err, tolerance(off64, "float64", f64_rel=f64_rel), 0.0)
    noise = max_abs_diff(off32, off64)
    tol = tolerance(off64, "float32", noise=noise, noise_factor=noise_factor)
    return OracleCheck(max_abs_diff(ours, off32), max_abs_diff(ours, off64), tol, noise)


# ----------------------------------------------------------------------------- comparing two traces


@dataclasses.dataclass
class Row:
    key: str
    shape: list
    max_abs: float
    relative: float  # max_abs / max(1, max|reference|)
    cosine: float | None  # None for integer tensors (codes, ids): they are equal or not
    tol: float
    ok: bool
    exact: bool = False  # an integer tensor: must be equal
    differing: int = 0  # elements that differ (integer tensors) / are out of tolerance (float)
    frame_errors: list | None = None  # max abs error per frame (tensors with a time axis), else None
    first_frame: int | None = None  # the first frame whose error exceeds ``tol``
    first_sample: int | None = None  # its first step out of tolerance along the time axis (float tensors;
    # for the waveform a 24 kHz sample), None for integer tensors
    shape_mismatch: list | None = None  # [reference shape, candidate shape]: not compared, fails (no errors: nan)
    compared_frames: int | None = None  # set when only the first frames were compared (runs of another length)
    frame_steps: int | None = None  # steps of the time axis per frame (1920 for the waveform, 1 for codes)


@dataclasses.dataclass
class FrameDivergence:
    """The first divergent frame of a tensor with a time axis (the waveform, a decoder tensor), when no
    code differs: ``Report.first_divergence`` then."""

    key: str
    frame: int
    sample: int | None  # the first step out of tolerance along the time axis (the waveform: a sample)
    error: float  # that frame's max abs error
    tolerance: float

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["error"] = d["error"] if math.isfinite(d["error"]) else None
        return d


@dataclasses.dataclass
class Report:
    precision: str
    rows: list  # one Row per common key, reference (execution) order; a shape mismatch is a failing row
    missing_in_candidate: list
    missing_in_reference: list
    shape_mismatches: list  # [key, reference shape, candidate shape] (also rows, with ``shape_mismatch``)
    reference_total: int = 0  # tensors of the reference
    notes: list = dataclasses.field(default_factory=list)  # how keys were matched (maps, squeezed axes, lengths)
    metadata_mismatches: list = dataclasses.field(default_factory=list)  # [field, reference, candidate]
    divergences: list = dataclasses.field(default_factory=list)  # diagnose.Divergence, first first

    @property
    def first_failure(self) -> Row | None:
        """The first row, in execution order, whose shape or values fail."""
        return next((r for r in self.rows if not r.ok), None)

    @property
    def first_divergence(self) -> Divergence | FrameDivergence | None:
        """The first differing code (a ``diagnose.Divergence``: frame, codebook, verdict); when no code
        differs, the first failure's first divergent frame if it has a time axis (a ``FrameDivergence``)."""
        if self.divergences:
            return self.divergences[0]
        row = self.first_failure
        if row is None or row.first_frame is None:
            return None
        errors = row.frame_errors[row.first_frame]  # type: ignore[index]  # a first frame comes with the errors
        return FrameDivergence(row.key, row.first_frame, row.first_sample, errors, row.tol)

    @property
    def passed(self) -> bool:
        return self.first_failure is None and not self.shape_mismatches

    @property
    def covered(self) -> int:
        """Reference tensors the candidate has (compared or with another shape)."""
        return len(self.rows)

    @property
    def compared(self) -> int:
        return sum(r.shape_mismatch is None for r in self.rows)

    def exit_status(self) -> int:
        return 0 if self.passed else 1

    def coverage_line(self) -> str:
        line = (
            f"the candidate covers {self.covered} of {self.reference_total or self.covered} reference tensors, "
            f"{self.compared} compared"
        )
        if self.shape_mismatches:
            line += f", {len(self.shape_mismatches)} with another shape"
        if self.missing_in_reference:
            line += f"; {len(self.missing_in_reference)} candidate tensors are not in the reference"
        return line

    def to_json(self) -> dict:
        first = self.first_failure
        div = self.first_divergence
        return {
            "precision": self.precision,
            "passed": self.passed,
            "coverage": {
                "reference": self.reference_total,
                "covered": self.covered,
                "compared": self.compared,
            },
            "metadata_mismatches": self.metadata_mismatches,
            "notes": self.notes,
            "first_failure": first.key if first else None,
            "first_divergence": div.to_json() if div else None,
            "divergences": [d.to_json() for d in self.divergences],
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "missing_in_candidate": self.missing_in_candidate,
            "missing_in_reference": self.missing_in_reference,
            "shape_mismatches": self.shape_mismatches,
        }

    def format(self, failures: bool = False, context: int | None = None, list_missing: bool = False) -> str:
        """The table: every row; ``failures``: only the failing ones; ``context``: the first failure with
        ``context`` rows either side (and only those)."""
        first = self.first_failure
        shown = self.rows
        if context is not None and first is not None:
            i = self.rows.index(first)
            shown = self.rows[max(0, i - context) : i + context + 1]
        if failures:
            shown = [r for r in shown if not r.ok]
        lines = [f"{m}" for m in self.header_lines()]
        width = max([len(r.key) for r in shown] + [3])
        lines.append(f"{'key':<{width}}  {'shape':<18} {'max abs':>10} {'rel':>10} {'cosine':>10} {'tol':>10}  result")
        if shown and shown[0] is not self.rows[0]:
            lines.append(f"... ({self.rows.index(shown[0])} rows before)")
        for r in shown:
            lines.append(row_line(r, width, r is first))
        hidden = len(self.rows) - len(shown)
        if hidden:
            lines.append(f"... ({hidden} of {len(self.rows)} rows not shown)")
        lines.append("")
        compared = [r for r in self.rows if r.shape_mismatch is None]
        line = f"{sum(r.ok for r in compared)} of {len(compared)} compared tensors pass ({self.precision} rule)"
        if self.shape_mismatches:
            line += f"; {len(self.shape_mismatches)} with another shape fail"
        lines.append(line)
        if first is not None:
            where = where_it_fails(first)
            lines.append(f"first divergence (execution order): {first.key}" + (f": {where}" if where else ""))
        for d in self.divergences[:1] if not failures else self.divergences:
            lines.append(f"first divergent code: {d.describe()}" if d is self.divergences[0] else f"  {d.describe()}")
        if len(self.divergences) > 1 and not failures:
            judged = [d.verdict for d in self.divergences if d.verdict]
            counts = ", ".join(f"{v} {judged.count(v)}" for v in sorted(set(judged)))
            lines.append(f"{len(self.divergences)} differing codes in all ({counts}; --failures lists them)")
        for what, keys in (
            ("missing in candidate", self.missing_in_candidate),
            ("missing in reference", self.missing_in_reference),
        ):
            if keys and list_missing:
                lines.append(f"{what} ({len(keys)}): " + ", ".join(keys))
            elif keys:
                lines.append(f"{what}: {len(keys)} tensors ({summarise(keys)}; --list-missing lists them)")
        return "\n".join(lines)

    def header_lines(self) -> list[str]:
        lines = [self.coverage_line()]
        for field, a, b in self.metadata_mismatches:
            lines.append(f"metadata differs: {field}: reference {short(a)}, candidate {short(b)}")
        lines += [f"note: {n}" for n in self.notes]
        return lines


def where_it_fails(r: Row) -> str:
    """``shape: reference ..., candidate ...`` for a shape mismatch, ``first divergent frame F (sample S)``
    for a failing row with a time axis, else ""."""
    if r.shape_mismatch is not None:
        a, b = r.shape_mismatch
        return f"shape: reference {tuple(a)}, candidate {tuple(b)}"
    if r.first_frame is None:
        return ""
    where = f"first divergent frame {r.first_frame}"
    if r.first_sample is None or r.frame_steps == 1:
        return where
    return where + f" ({'sample' if r.frame_steps == SAMPLES_PER_FRAME else 'step'} {r.first_sample})"


def row_line(r: Row, width: int, first: bool) -> str:
    mark = "FAIL  <- first divergence" if first else ("ok" if r.ok else "FAIL")
    where = where_it_fails(r) if not r.ok else ""
    if r.shape_mismatch is not None:
        numbers = f"{'-':>10} {'-':>10} {'-':>10} {'-':>10}"
        return f"{r.key:<{width}}  {str(tuple(r.shape)):<18} {numbers}  {mark}: {where}"
    if r.exact:
        cos = "integer"
        if not r.ok:
            mark += f" ({r.differing} of {int(np.prod(r.shape))} differ)"
    else:
        cos = f"{r.cosine:10.6f}"
    return (
        f"{r.key:<{width}}  {str(tuple(r.shape)):<18} {r.max_abs:10.3e} {r.relative:10.3e} "
        f"{cos:>10} {r.tol:10.3e}  {mark}" + (f"; {where}" if where else "")
    )


def short(value: object, n: int = 60) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= n else text[: n - 3] + "..."


def summarise(keys: list[str], groups: int = 4) -> str:
    """The most common module prefixes of ``keys`` (call suffixes dropped), with counts."""
    from collections import Counter

    prefixes = Counter(".".join(k.split(":", 1)[0].split(".", 3)[:3]) for k in keys)
    parts = [f"{p}* {n}" for p, n in prefixes.most_common(groups)]
    if len(prefixes) > groups:
        parts.append(f"{len(prefixes) - groups} other groups")
    return ", ".join(parts)


def cosine_similarity(a: ArrayLike, b: ArrayLike) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b) / (na * nb)


def compare_row(
    key: str,
    ref: ArrayLike,
    cand: ArrayLike,
    precision: str,
    time: tuple[int, int, int] | None = None,
    size: str = "tiny",
) -> Row:
    """One row; ``time`` = (axis, steps per frame, frames): also the per-frame errors along that axis."""
    ref, cand = np.asarray(ref), np.asarray(cand)
    exact = ref.dtype.kind in "iub" or cand.dtype.kind in "iub"
    if exact:
        max_abs = max_abs_diff(ref, cand)
        differing = int(np.count_nonzero(ref != cand))
        row = Row(key, list(ref.shape), max_abs, max_abs / scale_of(ref), None, 0.0, differing == 0, True, differing)
        if time is not None:
            err = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
            row.frame_errors, row.first_frame, _ = frame_errors(err, *time, 0.0)
            row.frame_steps = time[1] if row.frame_errors is not None else None
        return row
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64)
    same_nonfinite = np.array_equal(np.isfinite(cand64), finite) and np.array_equal(ref64[~finite], cand64[~finite])
    max_abs = max_abs_diff(ref64[finite], cand64[finite]) if finite.any() else 0.0
    tol = tolerance(ref64[finite], precision, network=network_of(key), size=size)
    cos = cosine_similarity(ref64[finite], cand64[finite]) if finite.any() else 1.0
    ok = same_nonfinite and max_abs <= tol
    differing = int(np.count_nonzero(np.abs(ref64[finite] - cand64[finite]) > tol)) + int(not same_nonfinite)
    row = Row(key, list(ref.shape), max_abs, max_abs / scale_of(ref64[finite]), cos, tol, bool(ok), False, differing)
    if time is not None:
        with np.errstate(invalid="ignore"):
            err = np.abs(ref64 - cand64)
        same = (ref64 == cand64) | (np.isnan(ref64) & np.isnan(cand64))
        err = np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))  # a non-finite mismatch: inf
        row.frame_errors, row.first_frame, row.first_sample = frame_errors(err, *time, tol)
        row.frame_steps = time[1] if row.frame_errors is not None else None
    return row


def frame_errors(
    err: np.ndarray, axis: int, k: int, frames: int, tol: float
) -> tuple[list[float] | None, int | None, int | None]:
    """(max abs error per frame, first frame over ``tol``, first step over it along ``axis``) of an error
    array whose ``axis`` maps ``k`` steps to a frame (steps past ``frames * k``: the last frame)."""
    steps = np.moveaxis(err, axis, 0).reshape(err.shape[axis], -1)
    if steps.shape[1] == 0 or steps.shape[0] < frames * k or frames < 1:
        return None, None, None
    steps = steps.max(axis=1)
    per_frame = np.maximum.reduceat(steps, np.arange(frames) * k)
    over = np.flatnonzero(steps > tol)
    if not over.size:
        return per_frame.tolist(), None, None
    first = int(over[0])
    return per_frame.tolist(), min(first // k, frames - 1), first


# ----------------------------------------------------------------------------- frames and lengths

SAMPLES_PER_FRAME = 1920  # the codec's hop at 24 kHz (12.5 frames a second)
FRAME_DIVISORS = [d for d in range(1, SAMPLES_PER_FRAME + 1) if SAMPLES_PER_FRAME % d == 0]  # the decoder's rates
CODES_KEYS = ("codes.", "forced_codes.")
# the ConvNeXt modules of the codec decoder's upsampling that work channels-last ([B, T, C])
CONVNEXT_CHANNELS_LAST = (".1.norm", ".1.pwconv1", ".1.act", ".1.pwconv2")


def base_name(key: str) -> str:
    """The key without the ``refimpl.`` prefix and the ``:N`` call suffix."""
    name = key.split(":")[0]
    return name[len("refimpl.") :] if name.startswith("refimpl.") else name


def time_axes(key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of ``shape`` indexed by generated frame (the module docstring), the frame axis first; ()
    for a tensor with none (or a map's selection ``key[...]``)."""
    name, n = base_name(key), len(shape)
    if "[" in key or n == 0:
        return ()
    if name.startswith(CODES_KEYS):
        return (n - 2,) if n >= 2 else ()
    if name == "random_draws":
        return (0,) if n == 1 else ()
    if name.startswith("waveform."):  # the audio the API returns, [N] at 24 kHz
        return (n - 1,)
    if not (name == "decoder" or name.startswith("decoder.")):
        return ()
    if name.endswith(".attention_mask"):
        return (n - 2, n - 1) if n >= 2 else ()
    if name.endswith(".attn_probs"):
        return (2, 3) if n == 4 else ()
    if name.endswith((".q_rope", ".k_rope")):
        return (2,) if n == 4 else ()
    channels_last = (
        name.startswith("decoder.pre_transformer")
        or (name.startswith("decoder.quantizer.") and name.endswith(".project_out"))
        or (name.startswith("decoder.upsample.") and name.endswith(CONVNEXT_CHANNELS_LAST))
    )
    return (1,) if channels_last and n >= 2 else (n - 1,)


def steps_per_frame(key: str, length: int, frames: int) -> int | None:
    """k of the module docstring: how many steps of a time axis ``length`` long make a frame; None when
    the axis does not fit ``frames`` (its tail past frames * k would be a frame or more)."""
    if frames < 1 or length < frames:
        return None
    name = base_name(key)
    if name.startswith(CODES_KEYS):
        return 1 if length == frames else None
    k = length // frames if name == "random_draws" else max(d for d in FRAME_DIVISORS if d * frames <= length)
    return k if length - frames * k < k else None


def item_of(key: str) -> int | None:
    """The batch item a frame-indexed key belongs to (codes ``.{i}``, a decoder call ``:i``); None: all."""
    name, _, call = key.partition(":")
    base = base_name(name)
    for prefix in CODES_KEYS + ("waveform.",):
        if base.startswith(prefix):
            rest = base[len(prefix) :]
            return int(rest) if rest.isdigit() else 0
    if base == "decoder" or base.startswith("decoder."):
        return int(call) if call.isdigit() else 0
    return None


def frame_counts(trace: Trace) -> dict[int, int]:
    """{item: frames} of a trace (the module docstring); {} when it says nothing about its frames."""
    counts: dict[int, int] = {}
    for prefix in ("refimpl.codes.", "refimpl.forced_codes."):
        for key, array in trace.items:
            rest = key[len(prefix) :] if key.startswith(prefix) else ""
            if rest.isdigit() and np.ndim(array) >= 2:
                counts.setdefault(int(rest), int(np.shape(array)[-2]))
    if counts:
        return counts
    inputs = trace.metadata.get("input")
    frames = inputs.get("frames") if isinstance(inputs, dict) else None
    if isinstance(frames, int) and not isinstance(frames, bool) and frames >= 0:
        return {0: frames}
    for key, array in trace.items:
        shape = np.shape(array)
        waveform = key.split(":")[0] == "decoder" and shape and all(d == 1 for d in shape[:-1])
        if waveform and shape[-1] % SAMPLES_PER_FRAME == 0:
            counts[item_of(key)] = shape[-1] // SAMPLES_PER_FRAME  # type: ignore[index]  # a decoder key's item
    return counts


def length_cap(metadata: dict) -> int | None:
    """max_new_tokens of a generation trace (``generation``, else ``input``), None if it records none."""
    for field in ("generation", "input"):
        value = metadata.get(field)
        cap = value.get("max_new_tokens") if isinstance(value, dict) else None
        if isinstance(cap, int) and not isinstance(cap, bool):
            return cap
    return None


class Lengths:
    """The frame counts of two traces and whether their lengths differ legitimately (the shorter run
    reached its max_new_tokens: the module docstring)."""

    def __init__(self, reference: Trace, candidate: Trace) -> None:
        self.ref, self.cand = frame_counts(reference), frame_counts(candidate)
        self.caps = (length_cap(reference.metadata), length_cap(candidate.metadata))

    def frames(self, key: str) -> tuple[int | None, int | None]:
        """(reference frames, candidate frames) of the key's item (None where unknown)."""
        item = item_of(key)
        if item is None:
            return (max(self.ref.values(), default=None), max(self.cand.values(), default=None))
        return self.ref.get(item), self.cand.get(item)

    def capped(self, frames: tuple[int | None, int | None]) -> TypeGuard[tuple[int, int]]:
        """The frame counts differ and the shorter run stopped at its length cap."""
        a, b = frames
        if a is None or b is None or a == b:
            return False
        short, cap = (a, self.caps[0]) if a < b else (b, self.caps[1])
        return cap is not None and short >= cap - 1

    def time(self, key: str, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        """(axis, steps per frame, frames) of a tensor of equal shapes on both sides, or None."""
        axes = time_axes(key, shape)
        frames = next((f for f in self.frames(key) if f is not None), None) if axes else None
        if frames is None:
            return None
        k = steps_per_frame(key, shape[axes[0]], frames)
        return None if k is None else (axes[0], k, frames)

    def prefix(
        self, key: str, ref_shape: tuple[int, ...], cand_shape: tuple[int, ...]
    ) -> tuple[tuple[slice, ...], tuple[int, int, int]] | None:
        """(slices, (axis, k, common frames)) when the two shapes differ only along the key's time axes,
        by what the two runs' frame counts explain; None otherwise (a shape mismatch)."""
        frames = self.frames(key)
        if not self.capped(frames) or len(ref_shape) != len(cand_shape):
            return None
        axes = time_axes(key, ref_shape)
        (long_shape, long_frames), (short_shape, common) = sorted(
            [(ref_shape, frames[0]), (cand_shape, frames[1])], key=lambda side: -side[1]
        )
        others = [i for i in range(len(ref_shape)) if i not in axes]
        if not axes or common < 1 or any(ref_shape[i] != cand_shape[i] for i in others):
            return None
        slices, steps = [slice(None)] * len(ref_shape), []
        for axis in axes:
            k = steps_per_frame(key, long_shape[axis], long_frames)
            if k is None or long_shape[axis] - short_shape[axis] != (long_frames - common) * k:
                return None
            slices[axis] = slice(0, common * k)
            steps.append(k)
        return tuple(slices), (axes[0], steps[0], common)


def compare_traces(
    reference: Trace, candidate: Trace, precision: str = "float32", diagnose: bool = True, size: str = "tiny"
) -> Report:
    """Compare two ``trace_files.Trace`` objects key by key, in the reference's execution order: one row per
    common key, a shape mismatch a failing row in its place.  Shapes that differ only by singleton axes
    ([T, H] against [1, T, H]) are compared squeezed, with a note; runs of another length (a length cap)
    over the frames both have (the module docstring), with a note.  Tensors with a time axis get their
    per-frame errors and first divergent frame.  With ``diagnose``, differing codes (``refimpl.codes.{i}``)
    get their (frame, codebook) and verdict (``refimpl.porting.diagnose``).  ``size``: the checkpoints'
    size, whose measured noise the tolerance allows ("tiny" or "released", ``NOISE_SIZES``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if size not in NOISE_SIZES:
        raise ValueError(f"size must be one of {list(NOISE_SIZES)}, not {size!r}")
    cand = dict(candidate.items)
    ref_keys = set(reference.keys)
    lengths = Lengths(reference, candidate)
    rows, mismatches, squeezed, prefixed = [], [], [], []
    for key, ref in reference.items:
        if key not in cand:
            continue
        c = cand[key]
        ref_shape, cand_shape = tuple(np.shape(ref)), tuple(np.shape(c))
        if ref_shape != cand_shape and np.squeeze(ref).shape == np.squeeze(c).shape:
            squeezed.append(key)
            c = np.reshape(c, ref_shape)
        elif ref_shape != cand_shape:
            common = lengths.prefix(key, ref_shape, cand_shape)
            if common is None:
                mismatches.append([key, list(ref_shape), list(cand_shape)])
                exact = np.asarray(ref).dtype.kind in "iub" or np.asarray(c).dtype.kind in "iub"
                nan = math.nan
                shapes = [list(ref_shape), list(cand_shape)]
                rows.append(Row(key, shapes[0], nan, nan, None, nan, False, exact, shape_mismatch=shapes))
                continue
            slices, time = common
            row = compare_row(key, np.asarray(ref)[slices], np.asarray(c)[slices], precision, time, size)
            row.shape, row.compared_frames = list(ref_shape), time[2]
            rows.append(row)
            prefixed.append(key)
            continue
        rows.append(compare_row(key, ref, c, precision, lengths.time(key, ref_shape), size))
    notes = length_notes(reference.metadata, candidate.metadata, lengths, prefixed)
    if squeezed:
        notes.append(
            f"{len(squeezed)} tensors differ only by singleton axes and were compared squeezed (e.g. {squeezed[0]})"
        )
    report = Report(
        precision,
        rows,
        [k for k in reference.keys if k not in cand],
        [k for k in candidate.keys if k not in ref_keys],
        mismatches,
        reference_total=len(reference.keys),
        notes=notes,
    )
    if diagnose:
        from .diagnose import diagnose as diagnose_codes

        report.divergences = diagnose_codes(
            reference, candidate, report, lambda logits: tolerance(logits, precision, network="talker", size=size)
        )
    return report


def length_notes(reference: dict, candidate: dict, lengths: Lengths, prefixed: list[str]) -> list[str]:
    """What the two runs' length caps and frame counts mean for the comparison."""
    notes = []
    caps = (length_cap(reference), length_cap(candidate))
    if None not in caps and caps[0] != caps[1]:
        notes.append(
            f"max_new_tokens differs: reference {caps[0]}, candidate {caps[1]} (a length cap, not another input: "
            "the frames both runs have are compared)"
        )
    items = sorted(set(lengths.ref) & set(lengths.cand))
    for item in items:
        a, b = lengths.ref[item], lengths.cand[item]
        if a == b:
            continue
        which = "" if items == [0] else f" (item {item})"
        line = f"the reference has {a} frames and the candidate {b}{which}: "
        if lengths.capped((a, b)):
            line += f"{len(prefixed)} tensors indexed by frame were compared over the first {min(a, b)}"
            line += f" (e.g. {prefixed[0]})" if prefixed else ""
        else:
            line += "the shorter run stopped before its max_new_tokens (or names none): a length difference fails"
        notes.append(line)
    return notes


# ----------------------------------------------------------------------------- metadata and names

# the metadata fields that say two traces are runs of the same thing
SAME_RUN_FIELDS = ("weights_sha256", "config", "input")
# fields of ``input`` that only cap a run's length: a note (``length_notes``), not another run
LENGTH_FIELDS = ("max_new_tokens",)


def metadata_mismatches(reference: dict, candidate: dict, precision: str) -> list[list[Any]]:
    """[[field, reference value, candidate value]] for every field of ``SAME_RUN_FIELDS`` both traces
    record and that differs (``input``: its fields both record, one by one, but the length cap
    ``max_new_tokens``: ``compare_traces`` notes it and compares the frames both runs have), and the
    candidate's ``dtype`` when it is coarser than the precision compared (its rounding would fail the rule)."""
    out = []
    for field in SAME_RUN_FIELDS:
        a, b = reference.get(field), candidate.get(field)
        if a is None or b is None:
            continue
        if field == "input" and isinstance(a, dict) and isinstance(b, dict):
            out += [[f"input.{k}", a[k], b[k]] for k in a if k in b and a[k] != b[k] and k not in LENGTH_FIELDS]
        elif a != b:
            out.append([field, a, b])
    dtype = candidate.get("dtype")
    if isinstance(dtype, str) and dtype in PRECISIONS and precision_eps(dtype) > precision_eps(precision):
        out.append(["dtype", precision + " (the rule compared)", dtype])  # a coarser candidate fails spuriously
    return out


def precision_eps(precision: str) -> float:
    return EPS.get(precision, float(np.finfo(np.float64).eps))


HINT_PREFIX_PARTS = 3  # prefixes of at most this many dotted parts are looked for (decoder., talker.model.)


def dotted_prefixes(key: str, parts: int = HINT_PREFIX_PARTS) -> Iterator[tuple[str, str]]:
    """(prefix, rest) for the first ``parts`` dots of ``key``: ``"a.b.c"`` -> ("a.", "b.c"), ("a.b.", "c").
    Bounded work per key, whatever its dots (a key of 200,000 dots would otherwise give 200,000 suffixes)."""
    i = -1
    for _ in range(parts):
        i = key.find(".", i + 1)
        if i < 0:
            return
        yield key[: i + 1], key[i + 1 :]


def prefix_hint(reference_keys: list[str], candidate_keys: list[str]) -> str | None:
    """When the candidate's names are the reference's with a prefix added or removed (``decoder.``), say so."""
    from collections import Counter

    ref = set(reference_keys)
    prefix_of: dict[
        str, str
    ] = {}  # a reference key's dotted suffixes (after at most HINT_PREFIX_PARTS parts) -> the prefix
    for r in reference_keys:
        for prefix, rest in dotted_prefixes(r):
            prefix_of.setdefault(rest, prefix)
    found: Counter[str] = Counter()
    for k in candidate_keys:
        if k in prefix_of:
            found["add " + prefix_of[k]] += 1
        for prefix, rest in dotted_prefixes(k):
            if rest in ref:
                found["strip " + prefix] += 1
                break
    if not found:
        return None
    ((how, n),) = found.most_common(1)
    verb, prefix = how.split(" ", 1)
    where = "add_prefix" if verb == "add" else "strip_prefix"
    return (
        f"{n} candidate keys match reference keys with the prefix {prefix!r} "
        f'{"added" if verb == "add" else "removed"}: a --map file with {{"{where}": "{prefix}"}} does that'
    )


def clean_json(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def report_json(report: Report) -> str:
    def clean(x: Any) -> Any:
        if isinstance(x, list):
            return [clean(v) for v in x]
        return None if isinstance(x, float) and not math.isfinite(x) else x

    data = report.to_json()
    data["metadata_mismatches"] = [[f, clean_json(a), clean_json(b)] for f, a, b in data["metadata_mismatches"]]
    for row in data["rows"]:
        for k, v in row.items():
            row[k] = clean(v)
    return json.dumps(data, indent=1)
