"""The package's shape: module imports form no circle (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "refimpl"


def module_name(path: Path) -> str:
    """refimpl/talker.py -> "talker", refimpl/kernels/__init__.py -> "kernels", refimpl/__init__.py -> "refimpl"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts) or "refimpl"


def package_imports() -> dict:
    """Module name -> the package modules it imports anywhere in its text (relative imports, also those
    inside functions)."""
    paths = list(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    graph = {}
    for path in paths:
        package = list(path.relative_to(PACKAGE).parent.parts)
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = package[:len(package) - (node.level - 1)]
            if node.module:
                edges.add(".".join(base + node.module.split(".")))
            else:
                for alias in node.names:
                    target = ".".join(base + [alias.name])
                    edges.add(target if target in known else (".".join(base) or "refimpl"))
        graph[module_name(path)] = edges - {module_name(path)}
    return graph


def test_no_import_circles():
    graph = package_imports()
    assert {"talker", "code_predictor", "transformer", "speaker", "synthetic", "prompt"} <= set(graph)
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_stage_modules_do_not_import_the_api_layers():
    """The network stages sit below the public objects and the tools: none imports tts, cli or synthetic."""
    graph = package_imports()
    for stage in ("nn", "transformer", "talker", "code_predictor", "codec_decoder", "codec_encoder", "speaker",
                  "prompt", "sampling", "generate", "text", "audio", "checkpoint"):
        assert not graph[stage] & {"tts", "cli", "synthetic", "speech_tokenizer", "__main__"}, stage
