"""The walkthrough pages and notebooks are produced by their scripts, so that they cannot go stale.

    python docs/tools/walkthroughs.py           # rewrite the output blocks of the pages and the notebooks
    python docs/tools/walkthroughs.py --check   # exit 1 and say what is stale (tests/test_docs.py does this)

A walkthrough is a script ``docs/NAME.py`` cut into cells by ``# %%`` lines, beside a page ``docs/NAME.md``:

- cell 0 (everything before the first ``# %%``) sets up: imports, the model;
- every further cell starts ``# %% N. Title`` and the page has the section ``## N. Title`` for it (same
  number, same title, same order), holding one output block

      <!-- output N -->
      ```
      ... exactly what cell N prints ...
      ```
      <!-- /output -->

  which this tool writes: the page quotes the script's output in full, never a hand-copied excerpt;
- ``docs/NAME.ipynb`` is generated from both: the page's prose as markdown cells (the output blocks
  left out), each cell of the script as a code cell after its heading, with the printed output.

The cells run in one namespace with ``exec``, in ``docs/`` (where Jupyter runs a notebook), with
matplotlib's Agg backend: the same way ``tests/test_docs.py`` executes the notebook.  No Jupyter needed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
WALKTHROUGHS = ("walkthrough", "clone_walkthrough")  # docs/NAME.py + docs/NAME.md -> docs/NAME.ipynb

CELL_RE = re.compile(r"^# %%[ \t]*(.*)$", re.M)
TITLE_RE = re.compile(r"^(\d+)\. (.+)$")
HEADING_RE = re.compile(r"^## (\d+)\. (.+)$", re.M)
OUTPUT_RE = re.compile(r"<!-- output (\d+) -->\n```\n(.*?)```\n<!-- /output -->\n", re.S)


@dataclass
class Cell:
    number: int  # 0 = the set-up cell
    title: str
    source: str  # the code, without its "# %%" line


def script_cells(text: str) -> list:
    """A script's cells: [set-up, 1. ..., 2. ...]; raises ValueError for a badly numbered cell."""
    marks = list(CELL_RE.finditer(text))
    cells = [Cell(0, "", text[: marks[0].start() if marks else len(text)].strip("\n") + "\n")]
    for i, m in enumerate(marks):
        title = TITLE_RE.match(m[1].strip())
        if not title:
            raise ValueError(f"cell marker {m[0]!r} is not '# %% N. Title'")
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        cells.append(Cell(int(title[1]), title[2], text[m.end() : end].strip("\n") + "\n"))
    numbers = [c.number for c in cells[1:]]
    if numbers != list(range(1, len(numbers) + 1)):
        raise ValueError(f"cells are numbered {numbers}, not 1..{len(numbers)}")
    return cells


def page_sections(text: str) -> list:
    """[(number, title)] of the page's numbered ``## N. Title`` sections, in order."""
    return [(int(m[1]), m[2].strip()) for m in HEADING_RE.finditer(text)]


def check_numbering(name: str, cells: list, page: str) -> None:
    want = [(c.number, c.title) for c in cells[1:]]
    have = page_sections(page)
    if want != have:
        raise ValueError(f"docs/{name}.md has the sections {have}; docs/{name}.py has the cells {want}")
    blocks = [int(m[1]) for m in OUTPUT_RE.finditer(page)]
    if blocks != [c.number for c in cells[1:]]:
        raise ValueError(f"docs/{name}.md has output blocks {blocks}, one per cell 1..{len(cells) - 1} wanted")


def run_cells(sources: list, label: str) -> list:
    """Execute code cells top to bottom in one namespace, in docs/, as a notebook does; the stdout of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace = {"__name__": "__main__"}
    outputs = []
    cwd = os.getcwd()
    os.chdir(DOCS)
    try:
        for i, source in enumerate(sources):
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(compile(source, f"<{label} cell {i}>", "exec"), namespace)
            outputs.append(buffer.getvalue())
    finally:
        os.chdir(cwd)
        plt.close("all")
    return outputs


def render_page(page: str, outputs: list) -> str:
    """The page with output block N replaced by cell N's output (outputs[0] is the set-up cell's)."""

    def block(m):
        return f"<!-- output {m[1]} -->\n```\n{outputs[int(m[1])].strip(chr(10))}\n```\n<!-- /output -->\n"

    return OUTPUT_RE.sub(block, page)


def _lines(text: str) -> list:
    lines = text.splitlines(keepends=True)
    if lines:
        lines[-1] = lines[-1].rstrip("\n")
    return lines


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": _lines(text.strip("\n") + "\n")}


def _code(source: str, output: str) -> dict:
    outputs = [{"name": "stdout", "output_type": "stream", "text": _lines(output)}] if output else []
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": outputs,
        "source": _lines(source.strip("\n") + "\n"),
    }


def render_notebook(page: str, cells: list, outputs: list) -> str:
    """The notebook: the page's introduction, the set-up cell, then per section its heading and the prose
    before its output block, the code cell (with its output) and the prose after."""
    headings = list(HEADING_RE.finditer(page))
    nb_cells = [_markdown(page[: headings[0].start()]), _code(cells[0].source, outputs[0])]
    for i, m in enumerate(headings):
        end = headings[i + 1].start() if i + 1 < len(headings) else len(page)
        section = page[m.start() : end]
        out = OUTPUT_RE.search(section)
        before, after = section[: out.start()], section[out.end() :]
        nb_cells.append(_markdown(before))
        nb_cells.append(_code(cells[i + 1].source, outputs[i + 1]))
        if after.strip():
            nb_cells.append(_markdown(after))
    notebook = {
        "cells": nb_cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def notebook_code_cells(notebook_text: str) -> list:
    """The sources of a notebook's code cells, in order (what Jupyter would run)."""
    return ["".join(c["source"]) for c in json.loads(notebook_text)["cells"] if c["cell_type"] == "code"]


def build(name: str, outputs: list | None = None) -> dict:
    """{path: wanted text} for one walkthrough's page and notebook; runs the script's cells unless the
    outputs are given."""
    cells = script_cells((DOCS / f"{name}.py").read_text(encoding="utf-8"))
    page = (DOCS / f"{name}.md").read_text(encoding="utf-8")
    check_numbering(name, cells, page)
    if outputs is None:
        outputs = run_cells([c.source for c in cells], name)
    page = render_page(page, outputs)
    return {DOCS / f"{name}.md": page, DOCS / f"{name}.ipynb": render_notebook(page, cells, outputs)}


def stale(wanted: dict) -> list:
    return [p for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page or notebook is stale")
    parser.add_argument("names", nargs="*", default=list(WALKTHROUGHS), help=f"default: {' '.join(WALKTHROUGHS)}")
    args = parser.parse_args(argv)
    bad = []
    for name in args.names:
        wanted = build(name)
        for path in stale(wanted):
            bad.append(path)
            if not args.check:
                path.write_text(wanted[path], encoding="utf-8")
                print(f"wrote {path.relative_to(DOCS.parent)}")
    if args.check and bad:
        print("stale (run python docs/tools/walkthroughs.py):", ", ".join(str(p.relative_to(DOCS.parent)) for p in bad))
        return 1
    return 0


if __name__ == "__main__":
    if str(DOCS.parent) not in sys.path:
        sys.path.insert(0, str(DOCS.parent))
    sys.exit(main())
