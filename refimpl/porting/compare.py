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
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

__all__ = [
    "EPS",
    "NOISE_RATIO",
    "tolerance",
    "check_against_oracle",
    "OracleCheck",
    "Row",
    "Report",
    "compare_traces",
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
NOISE_FACTOR = 4.0


def scale_of(ref) -> float:
    ref = np.asarray(ref)
    return max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0


def network_of(key: str) -> str:
    """decoder / encoder / speaker_encoder / talker from a trace key (``refimpl.`` extras: the part after it)."""
    parts = key.split(":")[0].split(".")
    if parts[0] == "refimpl" and len(parts) > 1:
        parts = parts[1:]
    return parts[0]


def tolerance(
    ref,
    precision: str,
    noise: float | None = None,
    network: str | None = None,
    noise_factor: float = NOISE_FACTOR,
    f64_rel: float = F64_REL,
) -> float:
    """The allowed max |candidate - ref| for one array (the module docstring).  ``noise``: the measured
    official noise of this very array if known; else the measured bound for ``network``."""
    scale = scale_of(ref)
    if precision == "float64":
        return f64_rel * scale
    eps = EPS[precision]
    if noise is None:
        ratios = NOISE_RATIO[precision]
        noise = ratios.get(network, max(ratios.values())) * eps * scale
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


def max_abs_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def check_against_oracle(
    ours, off32, off64, precision: str, noise_factor: float = NOISE_FACTOR, f64_rel: float = F64_REL
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
    cosine: float
    tol: float
    ok: bool


@dataclasses.dataclass
class Report:
    precision: str
    rows: list  # one Row per common key with equal shapes, reference order
    missing_in_candidate: list
    missing_in_reference: list
    shape_mismatches: list  # [key, reference shape, candidate shape]

    @property
    def first_failure(self) -> Row | None:
        return next((r for r in self.rows if not r.ok), None)

    @property
    def passed(self) -> bool:
        return self.first_failure is None and not self.shape_mismatches

    def exit_status(self) -> int:
        return 0 if self.passed else 1

    def to_json(self) -> dict:
        first = self.first_failure
        return {
            "precision": self.precision,
            "passed": self.passed,
            "first_failure": first.key if first else None,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "missing_in_candidate": self.missing_in_candidate,
            "missing_in_reference": self.missing_in_reference,
            "shape_mismatches": self.shape_mismatches,
        }

    def format(self) -> str:
        width = max([len(r.key) for r in self.rows] + [3])
        lines = [f"{'key':<{width}}  {'shape':<18} {'max abs':>10} {'rel':>10} {'cosine':>10} {'tol':>10}  result"]
        first = self.first_failure
        for r in self.rows:
            mark = "FAIL  <- first divergence" if r is first else ("ok" if r.ok else "FAIL")
            lines.append(
                f"{r.key:<{width}}  {str(tuple(r.shape)):<18} {r.max_abs:10.3e} {r.relative:10.3e} "
                f"{r.cosine:10.6f} {r.tol:10.3e}  {mark}"
            )
        lines.append("")
        lines.append(f"{sum(r.ok for r in self.rows)} of {len(self.rows)} common tensors pass ({self.precision} rule)")
        if first is not None:
            lines.append(f"first divergence (execution order): {first.key}")
        for key, a, b in self.shape_mismatches:
            lines.append(f"shape mismatch: {key}: reference {tuple(a)}, candidate {tuple(b)}")
        for what, keys in (
            ("missing in candidate", self.missing_in_candidate),
            ("missing in reference", self.missing_in_reference),
        ):
            if keys:
                shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
                lines.append(f"{what}: {shown}")
        return "\n".join(lines)


def cosine_similarity(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b) / (na * nb)


def compare_row(key: str, ref, cand, precision: str) -> Row:
    ref, cand = np.asarray(ref), np.asarray(cand)
    exact = ref.dtype.kind in "iub" or cand.dtype.kind in "iub"
    if exact:
        max_abs = max_abs_diff(ref, cand)
        return Row(
            key,
            list(ref.shape),
            max_abs,
            max_abs / scale_of(ref),
            cosine_similarity(ref, cand),
            0.0,
            bool(np.array_equal(ref, cand)),
        )
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64)
    same_nonfinite = np.array_equal(np.isfinite(cand64), finite) and np.array_equal(ref64[~finite], cand64[~finite])
    max_abs = max_abs_diff(ref64[finite], cand64[finite]) if finite.any() else 0.0
    tol = tolerance(ref64[finite], precision, network=network_of(key))
    cos = cosine_similarity(ref64[finite], cand64[finite]) if finite.any() else 1.0
    ok = same_nonfinite and max_abs <= tol
    return Row(key, list(ref.shape), max_abs, max_abs / scale_of(ref64[finite]), cos, tol, bool(ok))


def compare_traces(reference, candidate, precision: str = "float32") -> Report:
    """Compare two ``tracing.Trace`` objects key by key, in the reference's execution order."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    cand = dict(candidate.items)
    ref_keys = set(reference.keys)
    rows, mismatches = [], []
    for key, ref in reference.items:
        if key not in cand:
            continue
        if tuple(np.shape(ref)) != tuple(np.shape(cand[key])):
            mismatches.append([key, list(np.shape(ref)), list(np.shape(cand[key]))])
            continue
        rows.append(compare_row(key, ref, cand[key], precision))
    return Report(
        precision,
        rows,
        [k for k in reference.keys if k not in cand],
        [k for k in candidate.keys if k not in ref_keys],
        mismatches,
    )


def report_json(report: Report) -> str:
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x

    data = report.to_json()
    for row in data["rows"]:
        for k, v in row.items():
            row[k] = clean(v)
    return json.dumps(data, indent=1)
