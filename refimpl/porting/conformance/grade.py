"""Grading a port's outputs against a conformance suite: one report card (docs/conformance.md).

    report = grade_suite("SUITE", "RESULTS", precision="float32")
    print(format_report(report)); report["passed"]

Every case's outputs are read from ``RESULTS/<case>/`` (``.npy`` files named after an output or an official
key, ``waveform.wav``, whole dumps as ``.safetensors`` / ``.npz``) or ``RESULTS/<case>.safetensors|.npz``,
renamed by the case's outputs and an optional name map, and compared with the case's float64 reference by
``refimpl.porting.compare`` under the tolerance of ``precision``.  Nothing outside SUITE and RESULTS is read.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...io.files import InputError, check_npy_header, read_limited
from .. import trace_files
from ..compare import (
    SAMPLES_PER_FRAME,
    compare_traces,
    frame_errors,
    metadata_mismatches,
    network_of,
    scale_of,
    summarise,
    tolerance,
)
from .suite import BEHAVIOURS, SUITE_FORMAT, SuiteError, read_manifest, sha256_of

if TYPE_CHECKING:  # for the annotations only
    from ..compare import Report
    from ..name_maps import NameMap

__all__ = ["grade_suite", "grade_case", "read_results", "format_report", "ResultsError", "REPORT_FORMAT"]

REPORT_FORMAT = "refimpl-conformance-report"
MAX_RESULT_FILES = 10_000  # files in one case's folder
MAX_RESULT_BYTES = 1 << 32  # 4 GiB: one case's outputs together (a full-size trace of a few frames)


class ResultsError(InputError):
    """A port's results that cannot be used: unreadable files, names outside the folder, bad arrays."""


# ----------------------------------------------------------------------------- reading the port's outputs


def inside(path: Path, root: Path) -> bool:
    """``path`` (through any symbolic link) lies in ``root``."""
    return Path(os.path.realpath(path)).is_relative_to(Path(os.path.realpath(root)))


def read_array(path: Path) -> np.ndarray:
    """One .npy file: a numeric array, its header checked against its size before the data is read."""
    data = read_limited(path, MAX_RESULT_BYTES, f"result {path}", ResultsError, regular_only=True)
    check_npy_header(data, str(path), "a tensor")
    import io

    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ResultsError(f"cannot read {path}: not a .npy file ({e or 'empty file'})") from None
    if array.dtype.kind not in trace_files.NUMERIC_KINDS:
        raise ResultsError(f"{path}: dtype {array.dtype} is not a number (bool, int, float)")
    return array


def read_wave(path: Path) -> np.ndarray:
    """A waveform a port wrote as WAV: mono (channels averaged, as ``refimpl trace`` reads one), at 24 kHz."""
    from ...io.audio import read_wav

    audio, sr = read_wav(path)
    if sr != 24000:
        raise ResultsError(f"{path}: a waveform must be at 24000 Hz, the codec's rate, not {sr} Hz")
    return audio.mean(axis=1) if audio.ndim == 2 else audio


def read_results(results: Path, name: str) -> trace_files.Trace | None:
    """The port's outputs for case ``name`` as one trace (None: the port did not run the case)."""
    folder = results / name
    for suffix in (".safetensors", ".npz"):
        single = results / (name + suffix)
        if single.is_file() or single.is_symlink():
            if not inside(single, results):
                raise ResultsError(f"{single} leads outside {results} (a symbolic link?)")
            return trace_files.load_trace(single)
    if not folder.is_dir():
        return None
    if not inside(folder, results):
        raise ResultsError(f"{folder} leads outside {results} (a symbolic link?)")
    entries = sorted(folder.iterdir())
    if len(entries) > MAX_RESULT_FILES:
        raise ResultsError(f"{folder} holds {len(entries)} files, more than {MAX_RESULT_FILES}")
    items: list[tuple[str, np.ndarray]] = []
    metadata: dict = {}
    total = 0
    for path in entries:
        if path.name.startswith(".") or not path.is_file():
            continue
        if not inside(path, results):
            raise ResultsError(f"{path} leads outside {results} (a symbolic link?)")
        total += path.stat().st_size
        if total > MAX_RESULT_BYTES:
            raise ResultsError(f"the results of case {name} exceed {MAX_RESULT_BYTES} bytes")
        if path.suffix == ".npy":
            items.append((path.stem, read_array(path)))
        elif path.suffix == ".wav":
            items.append((path.stem, read_wave(path)))
        elif path.suffix in (".safetensors", ".npz"):
            dump = trace_files.load_trace(path)
            items += dump.items
            metadata = metadata or dump.metadata
    twice = sorted(k for k, n in Counter(k for k, _ in items).items() if n > 1)
    if twice:
        raise ResultsError(f"{folder}: tensor(s) {twice[:5]} given twice (two files, or a file and a dump)")
    return trace_files.Trace(items, metadata)


# ----------------------------------------------------------------------------- one case


def load_reference(suite: Path, case: dict) -> trace_files.Trace:
    directory = suite / "cases" / case["name"]
    path = directory / case["references"]["float64"]
    if not path.is_file() or not inside(path, suite):
        raise SuiteError(f"the suite lacks {path} (case {case['name']})")
    expected = (case.get("sha256") or {}).get(case["references"]["float64"])
    if expected and sha256_of(path) != expected:
        raise SuiteError(f"{path} is not the file the suite was made with (its SHA-256 differs): make the suite again")
    return trace_files.load_trace(path)


def as_reference_names(case: dict, candidate: trace_files.Trace) -> trace_files.Trace:
    """The case's plain output names (``codes``, ``waveform``, ``x_vector``) as the reference's keys."""
    outputs = case["outputs"]
    return trace_files.Trace([(outputs.get(k, k), v) for k, v in candidate.items], candidate.metadata)


def apply_behaviours(
    case: dict, reference: trace_files.Trace, candidate: trace_files.Trace, behaviours: dict[str, str]
) -> list[str]:
    """Grade the behaviour the port chose (``BEHAVIOURS``): the reference's alternative outputs replace the
    official ones, and a natural length convention compares the common frames.  Returns notes."""
    notes = []
    exact = [(k, v) for k, v in reference.items if k.startswith("refimpl.waveform_exact.")]
    reference.items = [(k, v) for k, v in reference.items if not k.startswith("refimpl.waveform_exact.")]
    if exact and behaviours.get("decode") == "exact":
        swap = {k.replace("waveform_exact.", "waveform."): v for k, v in exact}
        reference.items = [(k, swap.get(k, v)) for k, v in reference.items]
        notes.append("graded against the exact one-pass decode (--behaviour decode=exact)")
    if behaviours.get("length") == "natural" and case.get("frames"):
        notes += trim_to_reference_frames(reference, candidate)
    return notes


def trim_to_reference_frames(reference: trace_files.Trace, candidate: trace_files.Trace) -> list[str]:
    """A port that counts max_new_tokens frames: its codes and waveforms cut to the reference's frames."""
    ref = dict(reference.items)
    notes, items = [], []
    for key, value in candidate.items:
        if key in ref and key.startswith(("refimpl.codes.", "refimpl.waveform.")):
            want = np.shape(ref[key])[0]
            if np.ndim(value) >= 1 and np.shape(value)[0] > want:
                notes.append(f"{key}: the first {want} of the port's {np.shape(value)[0]} compared (natural length)")
                value = value[:want]
        items.append((key, value))
    candidate.items = items
    return notes


def grade_case(
    suite: Path,
    case: dict,
    results: Path,
    precision: str,
    name_map: NameMap | None,
    behaviours: dict[str, str],
    size: str = "tiny",
) -> dict[str, Any]:
    """One case's entry of the report (the fields of ``report_html``'s contract)."""
    entry = {
        "name": case["name"],
        "stage": case["stage"],
        "title": case["title"],
        "status": "not_run",
        "message": "",
        "coverage": None,
        "checks": [],
        "tensors": [],
        "first_failure": None,
        "codes": None,
        "codes_from_audio": None,
        "waveform": None,
    }
    try:
        candidate = read_results(results, case["name"])
        if candidate is None:
            entry["message"] = f"no results: RESULTS/{case['name']}/ (or {case['name']}.safetensors) is absent"
            return entry
        reference = load_reference(suite, case)
        candidate = as_reference_names(case, candidate)
        notes = []
        if name_map is not None:
            reference, candidate, notes = name_map.apply(reference, candidate)
        notes += apply_behaviours(case, reference, candidate, behaviours)
    except (OSError, ValueError, KeyError) as e:
        return dict(entry, status="unusable", message=" ".join(str(e).split()))
    mismatches = metadata_mismatches(reference.metadata, candidate.metadata, precision)
    if mismatches:
        what = "; ".join(f"{f}: reference {a!r}, results {b!r}"[:200] for f, a, b in mismatches)
        return dict(entry, status="unusable", message=f"the results are a run of another input or checkpoint: {what}")
    report = compare_traces(reference, candidate, precision, size=size)
    report.notes[:0] = notes
    return dict(entry, **case_verdict(case, reference, candidate, report, behaviours, size))


def length_verdict(codes: dict | None, behaviours: dict[str, str]) -> str | None:
    """Under the official length convention the port's frames must be the reference's (compare itself only
    notes a differing length cap and compares the common frames)."""
    if not codes or behaviours.get("length") != "official":
        return None
    ref, port = codes["frames_reference"], codes["frames_candidate"]
    if ref == port:
        return None
    return (
        f"the port gives {port} frames where the official gives {ref} (max_new_tokens - 1 without an EOS; "
        "--behaviour length=natural grades a port that gives max_new_tokens)"
    )


def case_verdict(
    case: dict,
    reference: trace_files.Trace,
    candidate: trace_files.Trace,
    report: Report,
    behaviours: dict[str, str],
    size: str = "tiny",
) -> dict[str, Any]:
    rows = report.rows  # in execution order, a shape mismatch failing in its place
    mismatched = {r.key: r.shape_mismatch for r in rows if r.shape_mismatch is not None}
    tensors = [
        {
            "key": r.key,
            "shape": r.shape,
            "max_abs": finite(r.max_abs),
            "tol": finite(r.tol),
            "ok": bool(r.ok),
            "shape_mismatch": r.shape_mismatch,
        }
        for r in rows
    ]
    first = report.first_failure.key if report.first_failure is not None else None
    coverage = {
        "reference": len(reference.keys),
        "dumped": len(candidate.keys),
        "compared": len(rows),
        "missing_groups": summarise(report.missing_in_candidate) if report.missing_in_candidate else "",
    }
    out: dict[str, Any] = {"coverage": coverage, "tensors": tensors, "first_failure": first}
    out["checks"] = checks_of(case, tensors)
    ref = dict(reference.items)
    cand = dict(candidate.items)
    out["codes"] = codes_report(case, ref, cand, report)
    out["waveform"] = waveform_report(case, ref, cand, report.precision, size)
    out["codes_from_audio"] = codes_from_audio(case, ref, cand, out["waveform"]) if out["codes"] is None else None
    if not rows:
        hint = f" (its names: {', '.join(candidate.keys[:5])})" if candidate.keys else ""
        return dict(out, status="unusable", message="no tensor of the results has a name of the reference" + hint)
    wrong_length = length_verdict(out["codes"], behaviours)
    passed = report.passed and wrong_length is None
    message = (
        ""
        if passed
        else failure_message(first, tensors, out["codes"], out["waveform"], mismatched, out["codes_from_audio"])
    )
    if wrong_length:
        message = wrong_length if report.passed else f"{message}; {wrong_length}"
    if report.notes:
        message = "; ".join([message] + report.notes if message else report.notes)
    return dict(out, status="pass" if passed else "fail", message=message)


def finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def failure_message(
    first: str | None,
    tensors: list[dict],
    codes: dict | None,
    waveform: dict | None,
    mismatched: dict[str, list],
    from_audio: dict | None = None,
) -> str:
    if first in mismatched:
        a, b = mismatched[first]
        parts = [f"first divergence {first}: the port's shape {tuple(b)}, the reference's {tuple(a)}"]
    else:
        parts = [f"first divergence {first}"]
    div = (codes or {}).get("first_divergence")
    if div:
        parts.append(
            f"codes part at frame {div['frame']}, codebook {div['codebook']} ({div.get('verdict') or 'not judged'})"
        )
    if waveform and waveform["first_divergent_frame"] is not None:
        parts.append(f"waveform from frame {waveform['first_divergent_frame']}")
    if from_audio:
        parts.append(from_audio["verdict"])
    return "; ".join(parts)


CHECK_ORDER = (
    "encoder",
    "speaker_encoder",
    "talker",
    "code_predictor",
    "sampling",
    "decoder",
    "codes",
    "x_vector",
    "waveform",
)


def check_of(key: str, case: dict) -> str:
    outputs = set(case["outputs"].values())
    if key in outputs:
        name = next(o for o, k in case["outputs"].items() if k == key).split(".")[0]
        return name
    if key.startswith("refimpl.codes."):
        return "codes"
    if key.split(":")[0] == "refimpl.random_draws":
        return "sampling"  # the uniforms a port replayed
    if key.split(":")[0].startswith(("talker.code_predictor", "refimpl.talker.code_predictor")):
        return "code_predictor"
    return network_of(key)


def checks_of(case: dict, tensors: list[dict]) -> list[dict[str, Any]]:
    """Per part of the network and per output: pass / fail / not_dumped, the worst tensor against its tolerance."""
    groups: dict[str, list[dict]] = {}
    for t in tensors:
        if t["shape_mismatch"] is None and 0 in t["shape"]:
            continue  # nothing to compare (a greedy run's draws)
        groups.setdefault(check_of(t["key"], case), []).append(t)
    for out in case["outputs"]:
        groups.setdefault(out.split(".")[0], [])
    checks: list[dict[str, Any]] = []
    for name in sorted(groups, key=lambda n: (CHECK_ORDER.index(n) if n in CHECK_ORDER else len(CHECK_ORDER), n)):
        group = groups[name]
        if not group:
            checks.append(dict(name=name, status="not_dumped", compared=0, failed=0, worst_key=None, worst_ratio=None))
            checks[-1]["detail"] = "not in the results"
            continue
        failed = [t for t in group if not t["ok"]]
        ratios = [(ratio_of(t), t["key"]) for t in group]
        worst = max(ratios, key=lambda r: r[0])
        check: dict[str, Any] = dict(
            name=name, status="fail" if failed else "pass", compared=len(group), failed=len(failed)
        )
        check.update(worst_key=worst[1], worst_ratio=finite(worst[0]))
        check["detail"] = f"{len(group) - len(failed)} of {len(group)} within tolerance"
        checks.append(check)
    return checks


def ratio_of(t: dict) -> float:
    if t["shape_mismatch"] is not None or t["max_abs"] is None:
        return math.inf
    return t["max_abs"] / t["tol"] if t["tol"] else (0.0 if t["max_abs"] == 0 else math.inf)


# ----------------------------------------------------------------------------- codes and waveforms


def codes_report(case: dict, ref: dict, cand: dict, report: Report) -> dict[str, Any] | None:
    keys = [k for k in case["outputs"].values() if k.startswith("refimpl.codes.") and k in cand and k in ref]
    if not keys:
        return None
    key = keys[0]
    a, b = np.asarray(ref[key]), np.asarray(cand[key])
    n = min(len(a), len(b))
    equal_rows = np.all(a[:n] == b[:n], axis=tuple(range(1, a.ndim))) if a.ndim > 1 else a[:n] == b[:n]
    first = int(np.argmin(equal_rows)) if not equal_rows.all() else (n if len(a) != len(b) else None)
    divergence = next((d for d in report.divergences if d.key == key), None)
    div = divergence.to_json() if divergence is not None else None
    if div is None and first is not None and first < n:  # a shape the diagnosis could not take
        c = int(np.argmax(a[first] != b[first])) if a.ndim > 1 else 0
        div = {"frame": first, "codebook": c, "reference_id": int(np.ravel(a[first])[c]), "verdict": None}
        div["candidate_id"] = int(np.ravel(b[first])[c])
    return {
        "key": key,
        "frames_reference": int(len(a)),
        "frames_candidate": int(len(b)),
        "frames_equal": int(np.sum(np.cumprod(equal_rows))) if n else 0,
        "first_divergence": div,
    }


def waveform_report(case: dict, ref: dict, cand: dict, precision: str, size: str = "tiny") -> dict[str, Any] | None:
    """SNR, the error of every 1920-sample frame against the waveform's tolerance (``compare.tolerance``:
    the same as its row's, also when the lengths differ and the row holds none), the first divergent frame
    and sample, the spectrogram difference."""
    keys = [k for o, k in case["outputs"].items() if o.startswith("waveform") and k in ref and k in cand]
    if not keys:
        return None
    key = keys[0]
    a = np.asarray(ref[key], dtype=np.float64).ravel()
    b = np.asarray(cand[key], dtype=np.float64).ravel()
    n = min(a.size, b.size)
    err = np.abs(a[:n] - b[:n])
    tol = tolerance(a, precision, network=network_of(key), size=size)
    frames = n // SAMPLES_PER_FRAME  # a last partial frame (an ICL cut's extra sample) counts in the frame before
    per_frame, first_frame, first_sample = (
        frame_errors(err, 0, SAMPLES_PER_FRAME, frames, tol) if frames else (None, None, None)
    )
    if first_sample is None and a.size != b.size:  # right where both have samples: wrong from the first one missing
        first_frame, first_sample = n // SAMPLES_PER_FRAME, n
    noise = float(np.sum(err**2))
    return {
        "key": key,
        "samples": int(a.size),
        "samples_candidate": int(b.size),
        "sample_rate": 24000,
        "snr_db": None if noise == 0 else round(10 * math.log10(max(float(np.sum(a[:n] ** 2)), 1e-300) / noise), 2),
        "max_abs": float(err.max()) if n else 0.0,
        "tol": tol,
        "scale": scale_of(a),
        "frame_errors": per_frame or [],
        "first_divergent_frame": first_frame,
        "first_divergent_sample": first_sample,
        "spectrogram": spectrogram_difference(a[:n], b[:n]),
    }


# The smallest move of its own frame that one changed code gives the decoder's audio, as a fraction of the
# waveform's scale (``compare.scale_of``): measured by ``benchmarks/ports/code_change_bound.py`` over every
# frame and codebook of the generated cases, each code changed to the nearest other row of its codebook and to
# a random one, on the tiny suite (0.034 at the least) and the full-size 0.6B CustomVoice (0.080);
# docs/conformance.md, "A port that gives only audio".  The decoder is causal: no change moved an earlier frame.
CODE_MOVE_BOUND = 0.03


def codes_from_audio(case: dict, ref: dict, cand: dict, waveform: dict | None) -> dict[str, Any] | None:
    """What the audio of a port that gives no codes says of its codes (the reference's codes decoded by our
    decoder are the reference's audio: teacher forcing on our side).  A changed code moves the samples of its
    own frame by at least ``CODE_MOVE_BOUND`` × scale and none before it, so the frames before the first one
    whose error reaches half that bound hold the reference's codes, likely (a port's decoder error below the
    other half cannot hide a changed code); frames within the waveform's tolerance hold them a fortiori."""
    key = case["outputs"].get("codes")
    if not waveform or key is None or key not in ref or key in cand:
        return None
    frames = int(np.shape(ref[key])[-2]) if np.ndim(ref[key]) >= 2 else 0
    per_frame = waveform["frame_errors"]
    if not frames or not per_frame:
        return None
    bound = CODE_MOVE_BOUND * waveform["scale"]
    over = [j for j, e in enumerate(per_frame[:frames]) if e >= bound / 2]
    likely = over[0] if over else min(frames, len(per_frame))
    within = waveform["first_divergent_frame"]
    if over:
        verdict = (
            f"codes likely equal in frames 0-{likely - 1}, likely part at frame {likely}"
            if likely
            else "codes likely part at frame 0"
        )
        verdict += f" (its audio moves by {per_frame[likely]:.3g}, at least half a code change's {bound:.3g})"
    else:
        verdict = f"codes likely equal in all {likely} frames"
        if within is not None:
            verdict += f" (the audio leaves the tolerance at frame {within}, by less than half a code change's"
            verdict += f" {bound:.3g})"
    if likely < frames and len(per_frame) < frames:
        verdict += f"; the audio has {len(per_frame)} of the {frames} frames"
    return {
        "frames_reference": frames,
        "frames_likely_equal": likely,
        "first_frame_out_of_tolerance": within,
        "bound": bound,
        "verdict": verdict,
    }


def spectrogram_difference(
    a: np.ndarray, b: np.ndarray, bins: int = 64, hop: int = 480, max_frames: int = 400
) -> dict[str, Any] | None:
    """Log magnitudes (dB) of the reference and the port minus the reference, in ``bins`` linear bands of a
    1024-point STFT every ``hop`` samples (at most ``max_frames`` frames, evenly picked); None if too short."""
    n_fft = 1024
    if a.size < n_fft:
        return None
    starts = np.arange(0, a.size - n_fft + 1, hop)
    if starts.size > max_frames:
        starts = starts[np.linspace(0, starts.size - 1, max_frames).astype(int)]
    window = np.hanning(n_fft)

    def bands_db(x: np.ndarray) -> np.ndarray:
        frames = np.stack([x[s : s + n_fft] * window for s in starts])
        power = np.abs(np.fft.rfft(frames, axis=1)[:, :-1]) ** 2  # [F, 512]
        banded = power.reshape(len(starts), bins, -1).mean(axis=2)
        return 10 * np.log10(banded + 1e-12).T  # [bins, F]

    ref_db, cand_db = bands_db(a), bands_db(b)
    return {
        "hop": hop,
        "bins": bins,
        "frames": int(starts.size),
        "reference_db": np.round(ref_db, 1).tolist(),
        "diff_db": np.round(np.clip(cand_db - ref_db, -60, 60), 1).tolist(),
    }


# ----------------------------------------------------------------------------- the whole suite


def parse_behaviours(choices: list[str] | None) -> dict[str, str]:
    """``["decode=exact"]`` -> {"length": "official", "decode": "exact"}: the official choice where none is given."""
    chosen = {name: next(iter(options)) for name, options in BEHAVIOURS.items()}
    for text in choices or []:
        name, _, value = str(text).partition("=")
        if name not in BEHAVIOURS or value not in BEHAVIOURS[name]:
            known = ", ".join(f"{n}={'|'.join(o)}" for n, o in BEHAVIOURS.items())
            raise InputError(f"--behaviour {text!r}: not a known behaviour ({known})")
        chosen[name] = value
    return chosen


def grade_suite(
    suite_dir: str | os.PathLike[str],
    results_dir: str | os.PathLike[str],
    precision: str = "float32",
    map_path: str | os.PathLike[str] | None = None,
    behaviours: list[str] | None = None,
) -> dict[str, Any]:
    """The report card of ``results_dir`` against ``suite_dir`` (a dict; ``format_report`` prints it,
    ``report_html.render_html`` draws it).  SuiteError / ResultsError when either cannot be used at all."""
    from .. import name_maps

    suite, results = Path(suite_dir), Path(results_dir)
    manifest = read_manifest(suite)
    if not results.is_dir():
        raise ResultsError(f"{results} is not a directory (RESULTS holds one folder per case)")
    chosen = parse_behaviours(behaviours)
    name_map = name_maps.load_map(map_path) if map_path else None
    size = manifest.get("noise", "tiny")  # the measured noise its tolerances allow (suite.make_suite)
    cases = [grade_case(suite, case, results, precision, name_map, chosen, size) for case in manifest["cases"]]
    counts = {
        "cases": len(cases),
        "passed": sum(c["status"] == "pass" for c in cases),
        "failed": sum(c["status"] == "fail" for c in cases),
        "not_run": sum(c["status"] == "not_run" for c in cases),
        "unusable": sum(c["status"] == "unusable" for c in cases),
    }
    return {
        "format": REPORT_FORMAT,
        "format_version": 1,
        "suite": {
            "name": SUITE_FORMAT,
            "version": manifest["version"],
            "refimpl_version": (manifest.get("made_by") or {}).get("refimpl"),
            "official": manifest["agrees_with"],
            "checkpoints": manifest["checkpoints"],
        },
        "results": results.name,
        "precision": precision,
        "noise": size,
        "behaviours": chosen,
        "passed": counts["passed"] > 0 and counts["failed"] == 0 and counts["unusable"] == 0,
        "counts": counts,
        "cases": cases,
    }


def exit_status(report: dict[str, Any]) -> int:
    """0: every case run passes; 1: one fails; 2: nothing could be graded, or a case's results are unusable."""
    counts = report["counts"]
    if counts["unusable"] or counts["passed"] + counts["failed"] == 0:
        return 2
    return 1 if counts["failed"] else 0


def format_report(report: dict[str, Any]) -> str:
    """The report card as text: a line per case, then the verdict."""
    suite = report["suite"]
    lines = [
        f"{suite['name']} version {suite['version']} (made by refimpl {suite['refimpl_version']}, agrees with "
        + ", ".join(f"{k} {v}" for k, v in suite["official"].items())
        + ")",
        f"results {report['results']}: graded by the {report['precision']} rule; behaviours "
        + ", ".join(f"{k}={v}" for k, v in report["behaviours"].items()),
        "",
    ]
    rows = [("case", "result", "tensors", "codes", "waveform", "first failure")]
    for c in report["cases"]:
        compared = c["coverage"]["compared"] if c["coverage"] else 0
        failed = sum(not t["ok"] for t in c["tensors"])
        tensors = f"{compared - failed}/{compared}" if c["coverage"] else "-"
        status = c["status"].upper().replace("_", " ")
        rows.append(
            (
                c["name"],
                status,
                tensors,
                codes_cell(c["codes"], c.get("codes_from_audio")),
                wave_cell(c["waveform"]),
                c["first_failure"] or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r[:5], widths, strict=True)) + "  " + r[5])
    lines.append("")
    for c in report["cases"]:
        if c["status"] != "pass" and c["message"]:
            lines.append(f"{c['name']}: {c['message']}")
    counts = report["counts"]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(
        f"{verdict}: {counts['passed']} of {counts['cases']} cases pass, {counts['failed']} fail, "
        f"{counts['not_run']} not run, {counts['unusable']} unusable"
    )
    return "\n".join(lines)


def codes_cell(codes: dict | None, from_audio: dict | None = None) -> str:
    if not codes and from_audio:
        return f"{from_audio['frames_likely_equal']}/{from_audio['frames_reference']} likely equal (audio)"
    if not codes:
        return "-"
    text = f"{codes['frames_equal']}/{codes['frames_reference']} frames equal"
    div = codes["first_divergence"]
    if div and div.get("verdict"):
        text += f" ({div['verdict']})"
    return text


def wave_cell(wave: dict | None) -> str:
    if not wave:
        return "-"
    snr = "exact" if wave["snr_db"] is None else f"SNR {wave['snr_db']:.1f} dB"
    if wave["first_divergent_frame"] is not None:
        snr += f", from frame {wave['first_divergent_frame']}"
    return snr
