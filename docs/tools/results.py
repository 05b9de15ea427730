"""Keep the speed tables of the docs equal to the results file, benchmarks/results.json.

Every speed figure of README.md and docs/ is a table generated from that file, between two markers:

    <!-- results: summary intel-amx amd-no-amx -->     the ratios, one column per machine named
    <!-- /results -->

    <!-- results: machine intel-amx -->                 one machine's whole table: ours, against, ratio, target
    <!-- /results -->

    <!-- results: ports vox qwentts_cpp -->             docs/ports.md: each port's speed beside refimpl's, from
    <!-- /results -->                                   the entries "<machine kind>-ports-speed-<name>" (a port,
                                                        or a port and its GGUF type: "qwentts_cpp-bf16")

Run

    python docs/tools/results.py            # rewrite every marked table from the file
    python docs/tools/results.py --check    # report marked tables that differ, and speed figures outside them

``benchmarks/bench_table.py --write-results`` updates the file (docs/benchmarks.md). tests/test_docs.py fails
when a marked table differs from what this tool renders, or when a page of ``GUARDED`` quotes a time, a rate
or a ratio outside its marked tables (``stray_speed_figures``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results.json"
# the pages that quote speed only through marked tables
GUARDED = ("README.md", "docs/performance.md", "docs/benchmarks.md")

MARKED = re.compile(r"(?P<open><!-- results: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(?P<close><!-- /results -->)", re.S)
_NUMBER = r"\d+(?:[.,]\d+)?(?:\s*[–-]\s*\d+(?:\.\d+)?)?"
# a time, a rate or a ratio quoted in prose: "2.3 s", "56–77 ms", "27 GB/s", "2× faster", "0.41 of the official";
# not a length of input: "10 s of audio", "an 80 ms frame"
SPEED = re.compile(
    rf"(?<![\w.]){_NUMBER}\s*(?:ms|µs|us|ns|s|seconds?|minutes?|GB/s|MB/s|[GT]FLOP/s)(?![\w/])"
    rf"(?!\s+(?:of\s+(?:audio|speech|text|codes)|frames?|chunks?)\b)"
    rf"|(?<![\w.]){_NUMBER}\s*[×x]\s+(?:faster|slower|as fast|real time|the floor|the official)"
    rf"|(?<![\w.]){_NUMBER}\s+(?:of|against)\s+the official|ratio\s+{_NUMBER}"
)


def pages() -> list:
    return sorted(REPO.glob("docs/**/*.md")) + [REPO / "README.md"]


def load(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["machines"]


def number(x, unit: str = "") -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" + (f" {unit}" if unit else "")


def ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def caption(m: dict) -> str:
    flags = [name for name, present in m.get("flags", {}).items() if present]
    threads = m.get("threads") or {}
    parts = [m["cpu"]]
    if flags:
        parts.append(", ".join(f"`{f}`" for f in flags))
    if threads:
        parts.append("threads " + ", ".join(f"{k} {v}" for k, v in threads.items()))
    if m.get("load") is not None:
        parts.append(f"start load {m['load']:.2f}")
    parts.append(m["date"] + (f" at {m['commit']}" if m.get("commit") else ""))
    parts.append(f"source: {m['source']}")
    return "; ".join(parts)


def render_summary(machines: dict, keys: list) -> str:
    whats = []
    for key in keys:
        whats += [row["what"] for row in machines[key]["rows"] if row["what"] not in whats]
    lines = [
        "| ours / against | " + " | ".join(machines[k]["title"] for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for what in whats:
        cells = []
        for key in keys:
            row = next((r for r in machines[key]["rows"] if r["what"] == what), None)
            cells.append("" if row is None else ratio(row["ratio"]))
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {machines[k]['title']}: {caption(machines[k])}." for k in keys]
    return "\n".join(lines) + "\n"


def render_machine(machines: dict, key: str) -> str:
    m = machines[key]
    lines = [
        f"**{m['title']}**: {caption(m)}.",
        "",
        "| what | ours | against | ratio | target | note |",
        "|---|---|---|---|---|---|",
    ]
    for row in m["rows"]:
        target = "" if row.get("target") is None else f"≤ {row['target']}"
        lines.append(
            f"| {row['what']} | {number(row['ours'], row['unit'])} | {number(row['against'], row['unit'])} | "
            f"{ratio(row['ratio'])} | {target} | {(row.get('note') or '').replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the ports' speed (docs/ports.md)

PORTS_SPEED = "-ports-speed-"  # an entry "<machine kind>-ports-speed-<name>" of benchmarks/ports/speed.py
PORT_MEASURES = ("per frame", "per frame, generation only", "first audio in a fresh process", "codec decode")
NOT_MEASURED = "not measured"


def port_entries(machines: dict, name: str) -> list:
    """(key, entry) of every machine's speed entry ``name`` (a port, or a port and its GGUF type), by key."""
    return sorted((k, m) for k, m in machines.items() if k.endswith(PORTS_SPEED + name) and k.index(PORTS_SPEED) > 0)


def port_command(name: str) -> str:
    """The command that measures and records the entry ``name``: "qwentts_cpp-bf16" is speed.py's
    ``--port qwentts_cpp --quant BF16`` (speed.py's ``entry_name``; port names have no hyphen)."""
    port, _, quant = name.partition("-")
    return (
        f"benchmarks/ports/speed.py --port {port}"
        + (f" --quant {quant.upper()}" if quant else "")
        + (" --write-results")
    )


def port_cell(row: dict | None) -> str:
    """A measure's cell: port / refimpl and the two times; "not measured" where neither was."""
    if row is None or (row["ours"] is None and row["against"] is None):
        return NOT_MEASURED
    if row["ours"] is None:
        return f"not in its API (refimpl {number(row['against'], row['unit'])})"
    if row["against"] is None:
        return f"{number(row['ours'], row['unit'])} (refimpl not measured)"
    return f"{ratio(row['ratio'])} ({number(row['ours'], row['unit'])} / {number(row['against'], row['unit'])})"


def render_ports(machines: dict, ports: list) -> str:
    """The table "Speed, side by side" of docs/ports.md: a row per port (or port and GGUF type) and machine
    measured (``speed.py --write-results``), "not measured" for one with no entry; each cell port / refimpl
    (the port's time / refimpl's), then under the table each entry's machine, load and the notes of its
    measures."""
    lines = [
        "| port | machine | " + " | ".join(f"{m}: port / refimpl" for m in PORT_MEASURES) + " | one command |",
        "|---|---|" + "---|" * len(PORT_MEASURES) + "---|",
    ]
    below = []
    for port in ports:
        command = f"`{port_command(port)}`"
        entries = port_entries(machines, port)
        if not entries:
            cells = " | ".join([NOT_MEASURED] * len(PORT_MEASURES))
            lines.append(f"| {port} | – | {cells} | {command} |")
        for _, m in entries:
            rows = {r["what"]: r for r in m["rows"]}
            cells = " | ".join(port_cell(rows.get(what)) for what in PORT_MEASURES)
            lines.append(f"| {m.get('port_label', port)} | {m['title'].split(':')[0]} | {cells} | {command} |")
            end = f"; end load {m['load_end']:.2f}" if m.get("load_end") is not None else ""
            below.append(f"- {m['title']}: {caption(m)}{end}.")
            below += [f"  - {r['what']}: {r['note']}" for r in m["rows"] if r.get("note")]
    return "\n".join(lines + ([""] + below if below else [])) + "\n"


def render(spec: str, machines: dict) -> str:
    """The body of the marked table ``<!-- results: SPEC -->``."""
    view, *keys = spec.split()
    if view == "ports" and keys:
        return render_ports(machines, keys)
    unknown = [k for k in keys if k not in machines]
    if unknown or not keys:
        raise ValueError(f"results: {spec!r}: no machine {unknown or 'named'} (the file has {sorted(machines)})")
    if view == "summary":
        return render_summary(machines, keys)
    if view == "machine" and len(keys) == 1:
        return render_machine(machines, keys[0])
    raise ValueError(f"results: {spec!r}: not 'summary KEY...' or 'machine KEY'")


def rewrite(text: str, machines: dict) -> str:
    return MARKED.sub(lambda m: m["open"] + render(m["spec"], machines) + m["close"], text)


def outside_tables(text: str) -> str:
    """The text of a page without its marked tables and its code blocks (their lines left empty, so that line
    numbers stay)."""
    text = MARKED.sub(lambda m: "\n" * m[0].count("\n"), text)
    return re.sub(r"^```.*?^```", lambda m: "\n" * m[0].count("\n"), text, flags=re.S | re.M)


def stray_speed_figures(text: str) -> list:
    """(line, figure) for each time, rate or ratio outside the marked tables and code blocks."""
    text = outside_tables(text)
    flat = text.replace("\n", " ")  # a figure and its "of audio" may lie on two lines
    return [(text.count("\n", 0, m.start()) + 1, m[0]) for m in SPEED.finditer(flat)]


def check(machines: dict) -> list:
    """Every problem: a marked table that differs from the file, a speed figure outside them."""
    problems = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(REPO).as_posix()
        try:
            if rewrite(text, machines) != text:
                problems.append(f"{name}: a marked table differs from {RESULTS.relative_to(REPO)}")
        except ValueError as e:
            problems.append(f"{name}: {e}")
        if name in GUARDED:
            problems += [f"{name}:{i}: {fig!r} outside a marked table" for i, fig in stray_speed_figures(text)]
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only report; exit 1 on a difference")
    args = ap.parse_args()
    machines = load()
    if args.check:
        problems = check(machines)
        print("\n".join(problems) or "the docs' speed tables are the results file's")
        return 1 if problems else 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = rewrite(text, machines)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(REPO)}")
    problems = check(machines)
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
