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
    cosine: float | None  # None for integer tensors (codes, ids): they are equal or not
    tol: float
    ok: bool
    exact: bool = False  # an integer tensor: must be equal
    differing: int = 0  # elements that differ (integer tensors) / are out of tolerance (float)


@dataclasses.dataclass
class Report:
    precision: str
    rows: list  # one Row per common key with equal shapes, reference order
    missing_in_candidate: list
    missing_in_reference: list
    shape_mismatches: list  # [key, reference shape, candidate shape]
    reference_total: int = 0  # tensors of the reference
    notes: list = dataclasses.field(default_factory=list)  # how keys were matched (maps, squeezed axes)
    metadata_mismatches: list = dataclasses.field(default_factory=list)  # [field, reference, candidate]
    divergences: list = dataclasses.field(default_factory=list)  # diagnose.Divergence, first first

    @property
    def first_failure(self) -> Row | None:
        return next((r for r in self.rows if not r.ok), None)

    @property
    def first_divergence(self):
        return self.divergences[0] if self.divergences else None

    @property
    def passed(self) -> bool:
        return self.first_failure is None and not self.shape_mismatches

    @property
    def covered(self) -> int:
        """Reference tensors the candidate has (compared or with another shape)."""
        return len(self.rows) + len(self.shape_mismatches)

    def exit_status(self) -> int:
        return 0 if self.passed else 1

    def coverage_line(self) -> str:
        line = (
            f"the candidate covers {self.covered} of {self.reference_total or self.covered} reference tensors, "
            f"{len(self.rows)} compared"
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
                "compared": len(self.rows),
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
            mark = "FAIL  <- first divergence" if r is first else ("ok" if r.ok else "FAIL")
            if r.exact:
                cos = "integer"
                if not r.ok:
                    mark += f" ({r.differing} of {int(np.prod(r.shape))} differ)"
            else:
                cos = f"{r.cosine:10.6f}"
            lines.append(
                f"{r.key:<{width}}  {str(tuple(r.shape)):<18} {r.max_abs:10.3e} {r.relative:10.3e} "
                f"{cos:>10} {r.tol:10.3e}  {mark}"
            )
        hidden = len(self.rows) - len(shown)
        if hidden:
            lines.append(f"... ({hidden} of {len(self.rows)} rows not shown)")
        lines.append("")
        lines.append(
            f"{sum(r.ok for r in self.rows)} of {len(self.rows)} compared tensors pass ({self.precision} rule)"
        )
        if first is not None:
            lines.append(f"first divergence (execution order): {first.key}")
        for d in self.divergences[:1] if not failures else self.divergences:
            lines.append(f"first divergent code: {d.describe()}" if d is self.divergences[0] else f"  {d.describe()}")
        if len(self.divergences) > 1 and not failures:
            judged = [d.verdict for d in self.divergences if d.verdict]
            counts = ", ".join(f"{v} {judged.count(v)}" for v in sorted(set(judged)))
            lines.append(f"{len(self.divergences)} differing codes in all ({counts}; --failures lists them)")
        for key, a, b in self.shape_mismatches[: None if list_missing else 8]:
            lines.append(f"shape mismatch: {key}: reference {tuple(a)}, candidate {tuple(b)}")
        if len(self.shape_mismatches) > 8 and not list_missing:
            lines.append(f"... {len(self.shape_mismatches)} shape mismatches in all (--list-missing lists them)")
        for what, keys in (
            ("missing in candidate", self.missing_in_candidate),
            ("missing in reference", self.missing_in_reference),
        ):
            if keys and list_missing:
                lines.append(f"{what} ({len(keys)}): " + ", ".join(keys))
            elif keys:
                lines.append(f"{what}: {len(keys)} tensors ({summarise(keys)}; --list-missing lists them)")
        return "\n".join(lines)

    def header_lines(self) -> list:
        lines = [self.coverage_line()]
        for field, a, b in self.metadata_mismatches:
            lines.append(f"metadata differs: {field}: reference {short(a)}, candidate {short(b)}")
        lines += [f"note: {n}" for n in self.notes]
        return lines


def short(value, n: int = 60) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= n else text[: n - 3] + "..."


def summarise(keys: list, groups: int = 4) -> str:
    """The most common module prefixes of ``keys`` (call suffixes dropped), with counts."""
    from collections import Counter

    prefixes = Counter(".".join(k.split(":")[0].split(".")[:3]) for k in keys)
    parts = [f"{p}* {n}" for p, n in prefixes.most_common(groups)]
    if len(prefixes) > groups:
        parts.append(f"{len(prefixes) - groups} other groups")
    return ", ".join(parts)


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
        differing = int(np.count_nonzero(ref != cand))
        return Row(key, list(ref.shape), max_abs, max_abs / scale_of(ref), None, 0.0, differing == 0, True, differing)
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64)
    same_nonfinite = np.array_equal(np.isfinite(cand64), finite) and np.array_equal(ref64[~finite], cand64[~finite])
    max_abs = max_abs_diff(ref64[finite], cand64[finite]) if finite.any() else 0.0
    tol = tolerance(ref64[finite], precision, network=network_of(key))
    cos = cosine_similarity(ref64[finite], cand64[finite]) if finite.any() else 1.0
    ok = same_nonfinite and max_abs <= tol
    differing = int(np.count_nonzero(np.abs(ref64[finite] - cand64[finite]) > tol)) + int(not same_nonfinite)
    return Row(key, list(ref.shape), max_abs, max_abs / scale_of(ref64[finite]), cos, tol, bool(ok), False, differing)


def compare_traces(reference, candidate, precision: str = "float32", diagnose: bool = True) -> Report:
    """Compare two ``trace_files.Trace`` objects key by key, in the reference's execution order.  Shapes that
    differ only by singleton axes ([T, H] against [1, T, H]) are compared squeezed, with a note.  With
    ``diagnose``, differing codes (``refimpl.codes.{i}``) get their (frame, codebook) and verdict
    (``refimpl.porting.diagnose``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    cand = dict(candidate.items)
    ref_keys = set(reference.keys)
    rows, mismatches, squeezed = [], [], []
    for key, ref in reference.items:
        if key not in cand:
            continue
        c = cand[key]
        if tuple(np.shape(ref)) != tuple(np.shape(c)):
            if np.squeeze(ref).shape != np.squeeze(c).shape:
                mismatches.append([key, list(np.shape(ref)), list(np.shape(c))])
                continue
            squeezed.append(key)
            c = np.reshape(c, np.shape(ref))
        rows.append(compare_row(key, ref, c, precision))
    notes = []
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
            reference, candidate, report, lambda logits: tolerance(logits, precision, network="talker")
        )
    return report


# ----------------------------------------------------------------------------- metadata and names

# the metadata fields that say two traces are runs of the same thing
SAME_RUN_FIELDS = ("weights_sha256", "config", "input")


def metadata_mismatches(reference: dict, candidate: dict, precision: str) -> list:
    """[[field, reference value, candidate value]] for every field of ``SAME_RUN_FIELDS`` both traces
    record and that differs (``input``: its fields both record, one by one), and the candidate's ``dtype``
    when it is coarser than the precision compared (its rounding would fail the rule)."""
    out = []
    for field in SAME_RUN_FIELDS:
        a, b = reference.get(field), candidate.get(field)
        if a is None or b is None:
            continue
        if field == "input" and isinstance(a, dict) and isinstance(b, dict):
            out += [[f"input.{k}", a[k], b[k]] for k in a if k in b and a[k] != b[k]]
        elif a != b:
            out.append([field, a, b])
    dtype = candidate.get("dtype")
    if isinstance(dtype, str) and dtype in PRECISIONS and precision_eps(dtype) > precision_eps(precision):
        out.append(["dtype", precision + " (the rule compared)", dtype])  # a coarser candidate fails spuriously
    return out


def precision_eps(precision: str) -> float:
    return EPS.get(precision, float(np.finfo(np.float64).eps))


def prefix_hint(reference_keys: list, candidate_keys: list) -> str | None:
    """When the candidate's names are the reference's with a prefix added or removed (``decoder.``), say so."""
    from collections import Counter

    ref = set(reference_keys)
    prefix_of = {}  # a reference key's every dotted suffix -> the prefix before it
    for r in reference_keys:
        for i, ch in enumerate(r):
            if ch == ".":
                prefix_of.setdefault(r[i + 1 :], r[: i + 1])
    found = Counter()
    for k in candidate_keys:
        if k in prefix_of:
            found["add " + prefix_of[k]] += 1
        head, _, rest = k.partition(".")
        if rest in ref:
            found["strip " + head + "."] += 1
    if not found:
        return None
    ((how, n),) = found.most_common(1)
    verb, prefix = how.split(" ", 1)
    where = "add_prefix" if verb == "add" else "strip_prefix"
    return (
        f"{n} candidate keys match reference keys with the prefix {prefix!r} "
        f'{"added" if verb == "add" else "removed"}: a --map file with {{"{where}": "{prefix}"}} does that'
    )


def clean_json(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def report_json(report: Report) -> str:
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x

    data = report.to_json()
    data["metadata_mismatches"] = [[f, clean_json(a), clean_json(b)] for f, a, b in data["metadata_mismatches"]]
    for row in data["rows"]:
        for k, v in row.items():
            row[k] = clean(v)
    return json.dumps(data, indent=1)
