"""The package's shape: the tree is the architecture.

Every module of refimpl/ belongs to one layer, found from its place in the tree (no hand-kept list of
modules); a module imports only from its own layer or the layers below, and the imports form no circle
(imports inside functions count too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "refimpl"

# From the top.  A layer is a list of patterns: "porting.*" is every module of the subpackage.
LAYERS = [
    ("front doors", ["refimpl", "__main__", "_old_paths", "cli", "cli.*", "official_api"]),
    ("the port author's tools", ["porting", "porting.*"]),
    ("text to codes", ["tts", "tts.*"]),
    ("the codec", ["codec", "codec.*"]),
    ("shared network code", ["transformer", "sampling", "recorder"]),
    ("files and inputs", ["io", "io.*"]),
    # the twins are loaded by the registry by name, at first use; they fall back to the formulas of nn
    ("fast twins", ["backends.numba_cpu", "backends.numba_cpu.*", "backends.cupy_cuda", "backends.cupy_cuda.*"]),
    ("the primitives", ["nn"]),
    ("the backend registry", ["backends", "backends.bf16", "backends.strict_device", "backends.host_memory"]),
]
# standard-library helpers any layer may use: they import nothing of the package
LEAVES = {"io.files", "_version", "environment"}


def module_name(path: Path) -> str:
    """refimpl/tts/talker.py -> "tts.talker", refimpl/backends/__init__.py -> "backends",
    refimpl/__init__.py -> "refimpl"."""
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
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                edges.add(".".join(base + node.module.split(".")))
            else:
                for alias in node.names:
                    target = ".".join(base + [alias.name])
                    edges.add(target if target in known else (".".join(base) or "refimpl"))
        graph[module_name(path)] = edges - {module_name(path)}
    return graph


def layer_of(module: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            if module == p or (p.endswith(".*") and module.startswith(p[:-1])):
                return i
    raise AssertionError(f"refimpl.{module} is in no layer of tests/test_house.py: place it in the tree")


def test_every_module_has_a_layer_and_imports_only_downwards():
    graph = package_imports()
    assert {"tts.talker", "codec.decoder", "codec.quantization", "porting.compare", "io.checkpoint"} <= set(graph)
    upward = []
    for module, imports in sorted(graph.items()):
        if module in LEAVES:
            assert not imports, f"refimpl.{module} is a leaf: it must import nothing of the package"
            continue
        for target in sorted(imports - LEAVES):
            if layer_of(target) < layer_of(module):
                upward.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                )
    assert not upward, "imports running back up a layer:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("codec.decoder") > layer_of("tts.talker") > layer_of("porting.commands")
    assert layer_of("backends.numba_cpu") < layer_of("nn") < layer_of("backends")


def test_no_import_circles():
    graph = package_imports()
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_tests_mirror_the_tree():
    """tests/<subpackage>/ holds the tests of refimpl/<subpackage>/: a test file of a subpackage's stage
    sits beside the others of that subpackage."""
    tests = Path(__file__).resolve().parent
    for sub in ("codec", "tts", "backends", "porting", "io", "cli"):
        assert list((tests / sub).glob("test_*.py")), f"tests/{sub}/ holds no tests"
    for sub in ("codec", "tts", "backends", "porting", "io", "cli"):
        assert (PACKAGE / sub / "__init__.py").is_file(), sub


# ----------------------------------------------------------------------------- one vocabulary (CONTRIBUTING.md)


def identifiers(tree: ast.AST):
    """Every name a module defines or uses: functions, classes, parameters, variables, attributes, keywords."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg


AUDIO_WORDS = {"stream", "streams", "streamed", "streaming", "chunk", "chunks", "chunked"}
TILE_WORDS = {"tile", "tiles", "tiled"}


def words(name: str) -> set:
    """The words of a name: ``_tile_conv_into`` -> {tile, conv, into}, ``StreamedWav`` -> {streamed, wav}."""
    return {w.lower() for w in re.split(r"_|(?<=[a-z0-9])(?=[A-Z])", name) if w}


def vocabulary_slips(source: str, path: Path) -> list:
    """The words of CONTRIBUTING.md's vocabulary used with another meaning in the names of one module: a
    signature taking both a ``trace`` and a ``record`` (they are one recording: name the other thing after
    what it is), an audio word (stream, chunk) in a backend's names (weights are read packed, columns summed
    a span at a time), ``tile`` outside the numba backend (the AMX tile registers; ``np.tile`` aside)."""
    tree = ast.parse(source)
    module = module_name(path)
    slips = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
            if {"trace", "record"} <= params:
                slips.append(f"{module}.{node.name} takes both a trace and a record")
    names = set(identifiers(tree))
    if module.startswith("backends"):
        slips += [
            f"{module}: {n} (an audio word)" for n in sorted(names) if "stream" in n.lower() or "chunk" in n.lower()
        ]
    if not module.startswith("backends.numba_cpu"):
        slips += [f"{module}: {n} (tile: AMX only)" for n in sorted(names) if words(n) & TILE_WORDS and n != "tile"]
    return slips


def test_one_vocabulary():
    paths = sorted(PACKAGE.rglob("*.py"))
    slips = [s for path in paths for s in vocabulary_slips(path.read_text(encoding="utf-8"), path)]
    assert not slips, "names with another meaning than CONTRIBUTING.md's vocabulary:\n" + "\n".join(slips)


def test_the_vocabulary_check_sees_a_slip():
    source = "def f(x, trace=None, record=None, streamed=False):\n    return x.tiles\n"
    in_backend = vocabulary_slips(source, PACKAGE / "backends" / "bf16.py")  # the path names the module only
    assert [s.split(" ", 1)[1] for s in in_backend] == [
        "takes both a trace and a record",
        "streamed (an audio word)",
        "tiles (tile: AMX only)",
    ]
    assert vocabulary_slips(source, PACKAGE / "backends" / "numba_cpu" / "amx.py")[1:] == [
        "backends.numba_cpu.amx: streamed (an audio word)"
    ]
    assert vocabulary_slips("y = np.tile(x, 2)\n", PACKAGE / "tts" / "talker.py") == []
