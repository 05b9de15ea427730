"""The measured speed table, one entry per kind of machine: ``benchmarks/results.json``.

``bench_table.py --write-results`` replaces its machine's entry; ``python docs/tools/results.py`` then
rewrites the marked tables of README.md and docs/ from the file (docs/benchmarks.md). An entry:

    "intel-amx": {                        the kind of machine (``machine_kind``): vendor, AMX or not
      "title": "Intel Xeon with AMX",     the column heading in the docs
      "cpu": "...", "flags": {...},       /proc/cpuinfo's model name; the features the kernels choose by
      "cpus": 2, "threads": {...},        cores seen; Numba's, OpenBLAS's and torch's threads
      "load": 0.72,                       the 1-minute load average when the run started
      "date": "2026-12-04", "commit": "9da6dc5",
      "source": "benchmarks/bench_table.py",   or where a transcribed entry was copied from
      "rows": [{"what": "end to end / official", "ours": 2.46, "against": 7.23, "unit": "s",
                "ratio": 0.34, "target": 0.36, "note": "..."}, ...]
    }

``against`` is what the row divides by: the official's time on the same input in the same process, for the
first row the read kernel's floor, for the streaming row our 1-frame generation, for peak memory the files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results.json"
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
TITLES = {"intel": "Intel", "amd": "AMD"}


def cpu_info(text: str | None = None) -> dict:
    """Vendor, model name and flags of the first processor in /proc/cpuinfo (empty where there is none)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            if info:
                break  # the end of the first processor
            continue
        info.setdefault(key, value.strip())
    return {
        "vendor": VENDORS.get(info.get("vendor_id", ""), platform.machine().lower() or "unknown"),
        "model": info.get("model name", platform.processor() or "unknown"),
        "flags": set(info.get("flags", "").split()),
    }


def machine_kind(cpu: dict) -> str:
    """The entry's key: the vendor and whether the processor has AMX tiles ("intel-amx", "amd-no-amx")."""
    return f"{cpu['vendor']}-{'amx' if has_amx(cpu) else 'no-amx'}"


def has_amx(cpu: dict) -> bool:
    return {"amx_tile", "amx_bf16"} <= cpu["flags"]


def git_commit() -> str | None:
    """The short hash of HEAD, with "-dirty" when the work tree has changes other than to the results file
    itself (which one benchmark writes before the next one runs: ``bench_table.py`` before the ports' columns);
    None outside a git checkout."""
    results = RESULTS.relative_to(REPO).as_posix()
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){results}"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def significant(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def entry(rows: list, *, cpu: dict, threads: dict, load: float, extra: dict | None = None) -> dict:
    """A machine's entry from bench_table's rows ``(what, ours, against, ratio, unit, note, target)``."""
    vendor = cpu["vendor"]
    return {
        "title": f"{TITLES.get(vendor, vendor)} {'with' if has_amx(cpu) else 'without'} AMX",
        "cpu": cpu["model"],
        "flags": {name: name in cpu["flags"] for name in ("avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")},
        "cpus": os.cpu_count(),
        "threads": threads,
        "load": round(load, 2),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "commit": git_commit(),
        "source": "benchmarks/bench_table.py",
        **(extra or {}),
        "rows": [row_entry(row) for row in rows],
    }


def row_entry(row: tuple) -> dict:
    """One row of an entry from ``(what, ours, against, ratio, unit, note, target)``."""
    what, ours, against, ratio, unit, note, target = row
    return {
        "what": what,
        "ours": significant(ours),
        "against": significant(against),
        "unit": unit,
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "note": note,
    }


def load(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def write_entry(kind: str, new: dict, path: Path = RESULTS) -> None:
    """Replace (or add) the entry ``kind`` of the results file; the other machines' entries stay as they are.
    Written to a temporary file and renamed, so a failed write leaves the previous file."""
    results = load(path) if path.exists() else {"machines": {}}
    results["machines"][kind] = new
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_row(kind: str, row: tuple, path: Path = RESULTS) -> None:
    """Replace (or add, at the end) one row ``(what, ours, against, ratio, unit, note, target)`` of the entry
    ``kind``, measured by a benchmark of its own (``bench_batch.py``); the entry's other rows and its
    heading stay as the run that wrote it left them.  Written like ``write_entry``."""
    results = load(path)
    machine = results["machines"].get(kind)
    if machine is None:
        raise ValueError(f"{path.name} has no entry {kind!r} to add a row to: run bench_table.py --write-results")
    new = row_entry(row)
    rows = machine["rows"]
    at = next((i for i, r in enumerate(rows) if r["what"] == new["what"]), len(rows))
    rows[at : at + 1] = [new]
    write_entry(kind, machine, path)
