"""The one file of a GPU check that must come back: benchmarks/gpu_check.sh writes it last, as summary.txt.

    python benchmarks/gpu_summary.py --results DIR --work DIR

Everything the run found, in one text file (a tool that returns only a few files of the results folder must
not lose any of it): each step's exit status, seconds and time limit; the machine; the tail of every step's
output; each failed, erroring or skipped test of the JUnit report with its message; every measurement of
bench_gpu.json, with the decode target (at least 50x real time in float32) said MET or NOT met.  Bounded:
at most TAIL_LINES lines of each step's output and MESSAGE_CHARS characters of each test's message.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

TAIL_LINES = 40
MESSAGE_CHARS = 1500
STATUS_WORDS = {"0": "ok", "124": "TIMED OUT", "137": "KILLED", "not-asked": "not asked", "no-time": "NO TIME LEFT"}


def steps(work: Path) -> list:
    """[(name, status, seconds, limit)] from WORK/steps.txt, in the order the steps ran."""
    path = work / "steps.txt"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if fields:
            rows.append(tuple(fields + ["?"] * (4 - len(fields)))[:4])
    return rows


def tail(path: Path, lines: int = TAIL_LINES) -> list:
    if not path.is_file():
        return []
    text = path.read_text(errors="replace").splitlines()
    return (["..."] if len(text) > lines else []) + text[-lines:]


def test_report(path: Path) -> list:
    """Lines: the counts of the JUnit report, then each test that did not pass, with its message."""
    if not path.is_file():
        return ["no JUnit report (the cuda_tests step did not run, or was stopped before pytest wrote it)"]
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as e:
        return [f"the JUnit report cannot be read: {e}"]
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    seconds = sum(float(s.get("time", 0)) for s in suites)
    out = [", ".join(f"{v} {k}" for k, v in counts.items()) + f", {seconds:.0f} s"]
    skipped = {}  # reason -> the tests skipped for it
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for found in case.findall("skipped"):
            skipped.setdefault((found.get("message") or "").strip(), []).append(case.get("name", ""))
        for kind in ("failure", "error"):
            for found in case.findall(kind):
                message, text = (found.get("message") or "").strip(), (found.text or "").strip()
                message = text if message in text else f"{message}\n{text}".strip()
                if len(message) > MESSAGE_CHARS:
                    message = message[: MESSAGE_CHARS // 3] + "\n[...]\n" + message[-2 * MESSAGE_CHARS // 3 :]
                out.append(f"{kind.upper()} {name}")
                out.extend(f"    {line}" for line in message.splitlines())
        for system_out in case.findall("system-out"):  # what a test printed
            printed = [line for line in (system_out.text or "").splitlines() if line.strip() and not captured(line)]
            out.extend(f"    printed by {case.get('name', '')}: {line}" for line in printed[-10:])
    for reason, names in skipped.items():
        out.append(f"SKIPPED {len(names)}: {reason[:MESSAGE_CHARS]}")
        out.append(f"    {', '.join(names)}")
    return out


def captured(line: str) -> bool:
    """pytest's own separator in a JUnit system-out ("---- Captured Out ----"), not what a test printed (under
    -s the prints go to the step's log, and the report holds the separator alone)."""
    words = line.strip().strip("-").split()
    return line.lstrip().startswith("---") and words[:1] == ["Captured"]


def measurements(path: Path) -> list:
    if not path.is_file():
        return ["no bench_gpu.json: the benchmark did not run"]
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        return [f"bench_gpu.json cannot be read: {e}"]
    out = [f"device: {data.get('device', {})}"]
    for part in ("decode", "encode", "end_to_end", "official"):
        for key, value in data.get(part, {}).items():
            if isinstance(value, dict):
                value = {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in value.items()}
            out.append(f"  {part} {key}: {value}")
    decode32 = data.get("decode", {}).get("float32", {}).get("x_realtime")
    if decode32:
        verdict = "MET" if decode32 >= 50 else "NOT met"
        out.append(f"decode of 10 s in float32: {decode32:.1f}x real time (target: at least 50x) -> {verdict}")
    for part, error in data.get("errors", {}).items():
        out.append(f"ERROR in {part}: {error}")
    out.append("runs: " + json.dumps(data.get("runs", [])))
    return out


def summary(results: Path, work: Path) -> str:
    rows = steps(work)
    out = ["GPU check summary", "", "steps (name, status, seconds, limit):"]
    out += [f"  {n:<12} {STATUS_WORDS.get(rc, f'exit {rc}'):<14} {s:>4} s  (limit {lim} s)" for n, rc, s, lim in rows]
    out += ["", "tests (tests/backends/test_cuda.py):"] + [
        f"  {line}" for line in test_report(results / "cuda_tests.xml")
    ]
    out += ["", "measurements (bench_gpu.json):"] + [f"  {line}" for line in measurements(results / "bench_gpu.json")]
    for name, rc, _, _ in rows:
        if rc == "not-asked":
            continue
        out += ["", f"--- the output of {name} (last {TAIL_LINES} lines):"] + tail(work / "logs" / f"{name}.log")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    sys.stdout.write(summary(args.results, args.work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
