"""Keep the docs' links to the code pointing at the right lines.

A code link in a page of docs/ (or the README) names the function or class it points to:

    [`rms_norm`](../refimpl/nn.py#L83)          [`Talker.forward`](../refimpl/tts/talker.py#L402)

When code moves, run

    python docs/tools/relink.py            # rewrite every code link's path and line anchor in place
    python docs/tools/relink.py --check    # only report links that are stale or cannot be resolved

For each link the tool looks for ``def NAME`` / ``class NAME`` (``Class.method`` for a method) in the
module the link names first (any .py file of the repository: refimpl/, tests/, ...), then in every module
of the package refimpl/, and rewrites the link with that
module's path (relative to the page) and the line of the definition.  A name defined in several other
modules, or in none, is reported and left alone.  tests/test_docs.py fails when an anchor's line does
not define the named symbol.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "refimpl"

# [`name`](path/to/module.py#L123)  (the anchor may be missing: the tool adds it); a link whose
# text is a file name, [`sampling.py`](../refimpl/sampling.py), is a plain file link and is left alone
LINK_RE = re.compile(r"\[`(?P<name>(?![\w.]*\.py`)[A-Za-z_][\w.]*)`\]\((?P<path>[^()\s#]*?\.py)(?:#L(?P<line>\d+))?\)")


def pages() -> list:
    """Every Markdown file that may hold code links: docs/**/*.md and the top-level README."""
    return sorted(REPO.glob("docs/**/*.md")) + [REPO / "README.md"]


def definitions(module: Path) -> dict:
    """Dotted name -> line of its ``def`` / ``class`` statement (top-level names and class members)."""
    tree = ast.parse(module.read_text(encoding="utf-8"), str(module))
    found = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(prefix + node.name, node.lineno)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".")

    visit(tree.body, "")
    return found


def defines(module: Path, line: int, name: str) -> bool:
    """Does line ``line`` of ``module`` hold the ``def`` / ``class`` statement of ``name``?"""
    return module.is_file() and definitions(module).get(name) == line


def locate(name: str, preferred: Path):
    """(module, line) of ``name``: in ``preferred`` if defined there, else in the one other package module
    that defines it; raises LookupError otherwise."""
    if preferred.is_file():
        line = definitions(preferred).get(name)
        if line is not None:
            return preferred, line
    hits = []
    for module in sorted(PACKAGE.rglob("*.py")):
        line = definitions(module).get(name)
        if line is not None:
            hits.append((module, line))
    if len(hits) == 1:
        return hits[0]
    where = ", ".join(str(m.relative_to(REPO)) for m, _ in hits) or "no module"
    raise LookupError(f"`{name}` is defined in {where}")


def relink_text(page: Path, text: str):
    """The page's text with every code link rewritten, and a list of (old, new or error) changes."""
    changes = []

    def replace(match):
        name, path = match["name"], match["path"]
        preferred = (page.parent / path).resolve()
        try:
            module, line = locate(name, preferred)
        except LookupError as e:
            changes.append((match[0], f"ERROR: {e}"))
            return match[0]
        new = f"[`{name}`]({Path(os.path.relpath(module, page.parent)).as_posix()}#L{line})"
        if new != match[0]:
            changes.append((match[0], new))
        return new

    return LINK_RE.sub(replace, text), changes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report stale links, change nothing")
    args = parser.parse_args(argv)
    stale = errors = 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new_text, changes = relink_text(page, text)
        for old, new in changes:
            rel = page.relative_to(REPO)
            if new.startswith("ERROR"):
                errors += 1
                print(f"{rel}: {old}: {new}", file=sys.stderr)
            else:
                stale += 1
                print(f"{rel}: {old} -> {new}")
        if new_text != text and not args.check:
            page.write_text(new_text, encoding="utf-8")
    verb = "stale" if args.check else "rewritten"
    print(f"{stale} link(s) {verb}, {errors} unresolved", file=sys.stderr)
    return 1 if errors or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
