"""How far one changed code moves the audio of its frame: the bound behind "codes likely equal" for a port that
gives audio only (docs/conformance.md, "A port that gives only audio").

    python benchmarks/ports/code_change_bound.py --suite SUITE [--model DIR ...] [--case NAME ...] [--json OUT]

For every case of the suite whose reference holds codes and a waveform, every frame ``j`` and every codebook
``c``, the script changes the one code ``(j, c)`` (to the nearest other row of that codebook, the change that
moves the decoder's input least, and to one random other code), decodes the frames up to ``j`` with
refimpl's decoder (float64, the reference's precision) and records the largest change of the samples of frame
``j``, and that nothing before frame ``j`` moved (the decoder is causal). It prints the smallest change over
all, absolute and as a fraction of the waveform's scale (its largest magnitude), beside the waveform's float32
tolerance: a measurement, not a benchmark (no timing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from refimpl.porting.compare import SAMPLES_PER_FRAME, network_of, scale_of, tolerance  # noqa: E402


def tables_of(tok) -> list[np.ndarray]:
    """The effective codebook [K, D] of every code group, in code order."""
    return [np.asarray(t) for t in tok.codebooks["rvq_first"] + tok.codebooks["rvq_rest"]]


def nearest_other(table: np.ndarray, code: int) -> int:
    d = np.sum((table - table[code]) ** 2, axis=1)
    d[code] = np.inf
    return int(np.argmin(d))


def frame_moves(tok, codes: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """One row per (frame, codebook, kind of change): the largest change of that frame's samples and of the
    samples before it."""
    tables = tables_of(tok)
    rows = []
    spf = SAMPLES_PER_FRAME
    for j in range(codes.shape[0]):
        base = np.asarray(tok.decode_full(codes[: j + 1]), dtype=np.float64)
        for c in range(codes.shape[1]):
            code = int(codes[j, c])
            random_other = int(rng.integers(tables[c].shape[0] - 1))
            random_other += random_other >= code
            for kind, other in (("nearest", nearest_other(tables[c], code)), ("random", random_other)):
                changed = codes[: j + 1].copy()
                changed[j, c] = other
                wav = np.asarray(tok.decode_full(changed), dtype=np.float64)
                delta = np.abs(wav - base)
                rows.append(
                    {
                        "frame": j,
                        "codebook": c,
                        "kind": kind,
                        "in_frame": float(delta[j * spf :].max()),
                        "before": float(delta[: j * spf].max()) if j else 0.0,
                    }
                )
    return rows


def measure(suite: Path, model_dirs: list[str], names: list[str]) -> list[dict]:
    sys.path.insert(0, str(HERE))
    import harness

    from refimpl import SpeechTokenizer
    from refimpl.porting import trace_files
    from refimpl.porting.conformance.suite import read_manifest

    manifest = read_manifest(suite)
    dirs = harness.checkpoint_dirs(suite, manifest, model_dirs)
    rng = np.random.default_rng(20261205)
    out = []
    for case in manifest["cases"]:
        outputs = case["outputs"]
        if "codes" not in outputs or "waveform" not in outputs or case["checkpoint"] not in dirs:
            continue
        if names and case["name"] not in names:
            continue
        reference = dict(trace_files.load_trace(suite / "cases" / case["name"] / case["references"]["float64"]).items)
        codes = np.asarray(reference[outputs["codes"]], dtype=np.int64)
        codes = codes[0] if codes.ndim == 3 else codes
        wave = np.asarray(reference[outputs["waveform"]], dtype=np.float64).ravel()
        tok = SpeechTokenizer.from_pretrained(dirs[case["checkpoint"]], dtype=np.float64)
        rows = frame_moves(tok, codes, rng)
        smallest = min(rows, key=lambda r: r["in_frame"])
        scale = float(scale_of(wave))
        entry = {
            "case": case["name"],
            "frames": int(codes.shape[0]),
            "changes": len(rows),
            "smallest": smallest,
            "smallest_nearest": min(r["in_frame"] for r in rows if r["kind"] == "nearest"),
            "smallest_random": min(r["in_frame"] for r in rows if r["kind"] == "random"),
            "moved_before_its_frame": max(r["before"] for r in rows),
            "waveform_scale": scale,
            "smallest_over_scale": smallest["in_frame"] / scale,
            "float32_tolerance": tolerance(
                wave, "float32", network=network_of(outputs["waveform"]), size=manifest.get("noise", "tiny")
            ),
        }
        out.append(entry)
        print(
            f"{case['name']}: {entry['changes']} single-code changes over {entry['frames']} frames; smallest move of "
            f"its frame {smallest['in_frame']:.3g} (frame {smallest['frame']}, codebook {smallest['codebook']}, "
            f"{smallest['kind']}; nearest {entry['smallest_nearest']:.3g}, random {entry['smallest_random']:.3g}), "
            f"{entry['smallest_over_scale']:.3g} of the waveform's scale {scale:.3g}; float32 tolerance "
            f"{entry['float32_tolerance']:.3g}; largest move before its frame {entry['moved_before_its_frame']:.3g}",
            flush=True,
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True, type=Path)
    parser.add_argument("--model", action="append", default=[], help="the suite's checkpoints, if given to it")
    parser.add_argument("--case", action="append", default=[], help="only these cases (default: every one)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args()
    entries = measure(args.suite, args.model, args.case)
    if args.json:
        args.json.write_text(json.dumps(entries, indent=1) + "\n")
    return 0 if entries else 1


if __name__ == "__main__":
    raise SystemExit(main())
