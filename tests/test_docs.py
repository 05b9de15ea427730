"""The documentation stays true: code links point at their definitions, links stay inside the repository,
no page carries a path of the machine it was written on, and the runnable pieces of docs/ run.

- every [`name`](../refimpl/module.py#L123) link: line 123 of that module defines ``name``
  (``python docs/tools/relink.py`` repairs them after code moves);
- docs/walkthrough.py and docs/clone_walkthrough.py compute two frames by hand and check them against the
  public API; their notebooks execute here, and their pages and notebooks are exactly what they print;
- docs/figures/make_figures.py draws every committed figure (into a temporary directory).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


relink = _load(DOCS / "tools" / "relink.py", "docs_relink")
PAGES = relink.pages()
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_docs_have_code_links():
    n = sum(len(relink.LINK_RE.findall(p.read_text(encoding="utf-8"))) for p in PAGES)
    assert n >= 40, f"only {n} code links in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_code_links_point_at_their_definitions(page):
    bad = []
    for m in relink.LINK_RE.finditer(page.read_text(encoding="utf-8")):
        module = (page.parent / m["path"]).resolve()
        if m["line"] is None or not relink.defines(module, int(m["line"]), m["name"]):
            bad.append(m[0])
    assert not bad, (
        f"{page.relative_to(REPO)}: these links do not point at the definition they name "
        f"(run python docs/tools/relink.py): {bad}"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_inside_the_repository(page):
    for target in MARKDOWN_LINK.findall(page.read_text(encoding="utf-8")):
        if page.name == "README.md" and page.parent == REPO and target.startswith("https://github.com/QwenLM/"):
            continue  # the project's home, named in the top-level README only
        assert not re.match(r"^[a-z]+:", target) and not target.startswith("/"), (
            f"{page.relative_to(REPO)}: link {target!r} leaves the repository"
        )
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(REPO), f"{page.relative_to(REPO)}: link {target!r} leaves the repository"
        assert resolved.exists(), f"{page.relative_to(REPO)}: link {target!r} points at nothing"
        if anchor and resolved.suffix == ".md":
            assert anchor in heading_anchors(resolved), (
                f"{page.relative_to(REPO)}: link {target!r}: no such heading in {resolved.relative_to(REPO)}"
            )


def heading_anchors(page: Path) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces -> hyphens."""
    anchors = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_no_page_or_script_holds_a_path_of_the_machine_it_was_written_on():
    machine_path = re.compile("(?<![\\w.])/(" + "|".join(["work", "home", "Users", "root", "mnt"]) + ")/")
    roots = [REPO / d for d in ("docs", "golden", "refimpl", "tests", "benchmarks")] + [REPO / "README.md"]
    hits = []
    for root in roots:
        files = (
            [root]
            if root.is_file()
            else [
                p
                for p in root.rglob("*")
                if p.suffix in (".md", ".py", ".sh", ".cfg", ".json", ".txt")
                # not a hidden folder: the git-ignored environments of benchmarks/ports/.envs/ hold others' files
                and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
            ]
        )
        for f in files:
            for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if machine_path.search(line):
                    hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert not hits, "absolute machine paths:\n" + "\n".join(hits)


def test_relink_rewrites_a_moved_anchor():
    page = DOCS / "example.md"
    text = "See [`causal_window_mask`](../refimpl/tts/talker.py#L1) and [`Talker.forward`](../refimpl/nn.py)."
    new, changes = relink.relink_text(page, text)
    assert len(changes) == 2
    for m in relink.LINK_RE.finditer(new):
        assert relink.defines((page.parent / m["path"]).resolve(), int(m["line"]), m["name"]), m[0]
    _, errors = relink.relink_text(page, "[`no_such_function_anywhere`](../refimpl/nn.py#L1)")
    assert errors and errors[0][1].startswith("ERROR")


walkthroughs = _load(DOCS / "tools" / "walkthroughs.py", "docs_walkthroughs")


@pytest.fixture(scope="module", params=walkthroughs.WALKTHROUGHS)
def executed_notebook(request):
    """A walkthrough notebook's code cells executed top to bottom in one namespace, in docs/, as Jupyter
    would (no Jupyter needed: the .ipynb is JSON): (name, the printed output of each cell)."""
    import matplotlib  # noqa: F401  (a test dependency, setup.cfg [test]: the cells draw figures)

    name = request.param
    sources = walkthroughs.notebook_code_cells((DOCS / f"{name}.ipynb").read_text(encoding="utf-8"))
    return name, walkthroughs.run_cells(sources, name)


def test_walkthrough_notebook_runs_and_checks_the_public_api(executed_notebook):
    name, outputs = executed_notebook
    assert "the same codes and the same samples" in outputs[-1], outputs[-1]


def test_walkthrough_page_and_notebook_are_exactly_what_the_script_prints(executed_notebook):
    """docs/NAME.md quotes each cell's output in full and is numbered like the script's cells; the notebook
    is the script's cells with the page's prose; both are regenerated from the executed cells and compared
    whole (python docs/tools/walkthroughs.py rewrites them)."""
    name, outputs = executed_notebook
    stale = walkthroughs.stale(walkthroughs.build(name, outputs))
    assert not stale, f"stale, run python docs/tools/walkthroughs.py: {[str(p.relative_to(REPO)) for p in stale]}"


def test_walkthrough_script_runs_as_a_script_and_prints_what_its_notebook_prints(executed_notebook):
    name, outputs = executed_notebook
    run = subprocess.run(
        [sys.executable, str(DOCS / f"{name}.py")], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == "".join(outputs), "the script prints something else than its notebook"


def test_walkthrough_tool_finds_stale_output_and_bad_numbering():
    page = (DOCS / "walkthrough.md").read_text(encoding="utf-8")
    cells = walkthroughs.script_cells((DOCS / "walkthrough.py").read_text(encoding="utf-8"))
    outputs = ["set-up\n"] + [f"cell {c.number} prints this\n" for c in cells[1:]]
    rendered = walkthroughs.render_page(page, outputs)
    assert "<!-- output 2 -->\n```\ncell 2 prints this\n```\n<!-- /output -->" in rendered
    assert walkthroughs.render_page(rendered.replace("cell 2 prints this", "cell 2 printed that"), outputs) == rendered
    with pytest.raises(ValueError, match="sections"):
        walkthroughs.check_numbering("walkthrough", cells, page.replace("## 2. ", "## 3. ", 1))
    with pytest.raises(ValueError, match="numbered"):
        walkthroughs.script_cells("x = 1\n# %% 1. One\ny = 2\n# %% 3. Three\n")
    with pytest.raises(ValueError, match="not '# %% N. Title'"):
        walkthroughs.script_cells("x = 1\n# %% no number\n")
    notebook = walkthroughs.render_notebook(rendered, cells, outputs)
    assert walkthroughs.notebook_code_cells(notebook) == [c.source.strip("\n") for c in cells]


def test_figure_script_draws_every_committed_figure(tmp_path):
    import matplotlib  # noqa: F401  (a test dependency, setup.cfg [test]: missing, this fails, never skips)

    run = subprocess.run(
        [sys.executable, str(DOCS / "figures" / "make_figures.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    committed = sorted(p.name for p in (DOCS / "figures").glob("*.png"))
    assert drawn == committed, f"the script draws {drawn}, docs/figures holds {committed}"
    for name in drawn:
        assert (tmp_path / name).stat().st_size > 10000, name
    # every figure is shown on some page
    text = "".join(p.read_text(encoding="utf-8") for p in PAGES)
    unused = [name for name in drawn if f"figures/{name}" not in text]
    assert not unused, f"figures no page shows: {unused}"


# --- the speed tables: every figure from benchmarks/results.json -------------------------------------------

results = _load(DOCS / "tools" / "results.py", "docs_results")
results_file = _load(REPO / "benchmarks" / "results_file.py", "bench_results_file")
MACHINE_KEYS = {"title", "cpu", "flags", "cpus", "threads", "load", "date", "commit", "source", "rows"}


def test_results_file_entries_are_whole_and_their_ratios_their_times():
    """Each machine names its processor, threads, load, date and source; each row's ratio is its two times'
    (within their rounding: three or four significant digits each, the ratio to two decimals)."""
    machines = results.load()
    assert set(machines) >= {"intel-amx", "amd-no-amx"}
    for key, m in machines.items():
        assert set(m) >= MACHINE_KEYS, f"{key}: missing {MACHINE_KEYS - set(m)}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", m["date"]), key
        assert m["rows"], key
        for row in m["rows"]:
            assert {"what", "ours", "against", "unit", "ratio"} <= set(row), (key, row)
            if row["ours"] is not None and row["against"] is not None:
                r = row["ours"] / row["against"]
                assert abs(r - row["ratio"]) <= 0.005 + 0.01 * r, (key, row["what"], r)


def test_a_results_entry_names_its_commit_dirty_for_code_not_for_the_results_file(tmp_path, monkeypatch):
    """``git_commit``: HEAD's short hash; "-dirty" where a tracked file other than the results file differs
    from HEAD (a change to the results file is the benchmarks' own, written between two of them)."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    monkeypatch.setattr(results_file, "REPO", tmp_path)
    monkeypatch.setattr(results_file, "RESULTS", tmp_path / "benchmarks" / "results.json")
    assert results_file.git_commit() == head.stdout.strip()
    (tmp_path / "benchmarks" / "results.json").write_text('{"a": 1}\n')
    (tmp_path / "untracked.txt").write_text("new\n")
    assert results_file.git_commit() == head.stdout.strip()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert results_file.git_commit() == head.stdout.strip() + "-dirty"


def test_marked_tables_are_the_results_file():
    """A table between <!-- results: ... --> and <!-- /results --> is exactly what docs/tools/results.py renders
    from benchmarks/results.json (run it after bench_table.py --write-results)."""
    machines = results.load()
    marked = {p.relative_to(REPO).as_posix() for p in results.pages() if results.MARKED.search(p.read_text("utf-8"))}
    assert {"README.md", "docs/performance.md"} <= marked, marked
    stale = [p for p in results.pages() if results.rewrite(p.read_text("utf-8"), machines) != p.read_text("utf-8")]
    assert not stale, (
        f"stale speed tables, run python docs/tools/results.py: {[str(p.relative_to(REPO)) for p in stale]}"
    )


@pytest.mark.parametrize("name", results.GUARDED)
def test_speed_is_quoted_only_in_marked_tables(name):
    """README.md and the performance pages quote no time, rate or ratio outside the generated tables, so that
    the one number a reader sees is the results file's."""
    stray = results.stray_speed_figures((REPO / name).read_text(encoding="utf-8"))
    assert not stray, f"{name}: speed figures outside a marked table (line, figure): {stray}"


def test_the_speed_guard_tells_speed_from_sizes():
    speed = [
        "decodes 10 s in 2.3 s",
        "131 ms a frame",
        "56–77 ms",
        "at 27 GB/s",
        "2× faster",
        "0.41 of the official",
        "ratio 0.41",
    ]
    for text in speed:
        assert results.stray_speed_figures(text), text
    sizes = ["10 s of audio", "an 80 ms frame", "2 MB huge pages", "a 0.6B model", "Python ≥ 3.10", "3.3 GB a frame"]
    for text in sizes:
        assert not results.stray_speed_figures(text), text
    marked = "<!-- results: summary intel-amx -->\n| 2.3 s |\n<!-- /results -->\n```\n5 ms\n```\n"
    assert not results.stray_speed_figures(marked)


def test_bench_table_entry_is_written_and_rendered(tmp_path):
    """What bench_table.py --write-results does, on made-up rows: the machine's entry replaced, the others
    kept, and the entry rendered like a transcribed one."""
    path = tmp_path / "results.json"
    path.write_text('{"machines": {"other": {"kept": true}}}')
    cpu = results_file.cpu_info(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: A CPU\nflags\t\t: avx512bw amx_tile amx_bf16\n"
    )
    assert results_file.machine_kind(cpu) == "intel-amx"
    rows = [("end to end / official", 2.4612345, 7.2298, 0.34042, "s", "(codes equal)", 0.36)]
    new = results_file.entry(rows, cpu=cpu, threads={"numba": 2}, load=0.123)
    results_file.write_entry("intel-amx", new, path)
    machines = results.load(path)
    assert machines["other"] == {"kept": True}
    entry = machines["intel-amx"]
    assert set(entry) >= MACHINE_KEYS and entry["title"] == "Intel with AMX" and entry["load"] == 0.12
    assert entry["rows"][0] == {
        "what": "end to end / official",
        "ours": 2.461,
        "against": 7.23,
        "unit": "s",
        "ratio": 0.34,
        "target": 0.36,
        "note": "(codes equal)",
    }
    table = results.render("machine intel-amx", machines)
    assert "| end to end / official | 2.46 s | 7.23 s | 0.34 | ≤ 0.36 | (codes equal) |" in table


def test_a_benchmark_of_its_own_writes_its_row_into_the_machine_entry(tmp_path):
    """What bench_batch.py --write-results does: its row replaced in place (or added at the end) in the
    machine's entry, the entry's other rows and heading kept; no entry for the machine is an error."""
    path = tmp_path / "results.json"
    path.write_text('{"machines": {"amd-no-amx": {"title": "AMD", "rows": [{"what": "a"}, {"what": "b"}]}}}')
    row = ("b", 210.0, 82.0, 210.0 / 82.0, "ms", "(note)", 1.4)
    results_file.write_row("amd-no-amx", row, path)
    results_file.write_row("amd-no-amx", ("c",) + row[1:], path)
    machine = results.load(path)["amd-no-amx"]
    assert machine["title"] == "AMD" and [r["what"] for r in machine["rows"]] == ["a", "b", "c"]
    assert machine["rows"][1] == {
        "what": "b", "ours": 210.0, "against": 82.0, "unit": "ms", "ratio": 2.561, "target": 1.4, "note": "(note)"
    }  # fmt: skip
    with pytest.raises(ValueError, match="no entry"):
        results_file.write_row("intel-amx", row, path)
