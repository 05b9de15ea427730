"""benchmarks/ports/speed.py's pure parts and the table it feeds, checked without a port and without timing.

speed.py measures a port beside refimpl in fresh processes (never in a test); what it computes from the
workers' results is checked here on made-up results: the worker's JSON line found in its output, the per-frame
arithmetic (the minimum of each length over the runs, then the difference over the frames between), the
rows of the results file, and docs/tools/results.py's table "Speed, side by side" of docs/ports.md, "not
measured" until an entry exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "ports"))  # speed.py imports harness, as when run


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


speed = _load(REPO / "benchmarks" / "ports" / "speed.py", "ports_speed")
results = _load(REPO / "docs" / "tools" / "results.py", "docs_results_ports")

FRAME = 1920


def frames_run(short_s: float, long_s: float, short_frames: int = 10, long_frames: int = 35) -> dict:
    short = {"seconds": short_s, "samples": short_frames * FRAME}
    return {"runs": [short, {"seconds": long_s, "samples": long_frames * FRAME}]}


def test_the_worker_result_is_its_last_json_line():
    output = 'loading...\n{"not": "this one"}\nwarning: {x}\n{"first_audio_s": 1.25, "samples": 1920}\n\n'
    assert speed.last_json(output) == {"first_audio_s": 1.25, "samples": 1920}
    with pytest.raises(ValueError, match="no JSON result.*Segmentation fault"):
        speed.last_json("loading...\nSegmentation fault")


def test_per_frame_is_the_minima_difference_over_the_frames_between():
    runs = [frames_run(2.0, 6.0), frames_run(1.5, 6.5), frames_run(1.8, 5.5)]
    got = speed.per_frame(runs)
    assert got["frames"] == (10, 35) and got["times"] == (1.5, 5.5)
    assert got["seconds"] == pytest.approx((5.5 - 1.5) / 25)


def test_per_frame_refuses_lengths_that_change_or_leave_no_frames_between():
    with pytest.raises(ValueError, match="long generation's length differs"):
        speed.per_frame([frames_run(1.0, 3.0), frames_run(1.0, 3.0, long_frames=34)])
    with pytest.raises(ValueError, match="no frames between"):
        speed.per_frame([frames_run(1.0, 3.0, short_frames=12, long_frames=12)])


def test_rows_hold_the_ports_seconds_against_refimpls():
    figures = {"per frame": (0.168, 0.0870), "first audio in a fresh process": (1.3, 1.07), "codec decode": (None, 4.0)}
    rows = speed.result_rows(figures, {"codec decode": "125 frames; the port: not in its API"})
    assert [r[0] for r in rows] == list(speed.MEASURES) == list(results.PORT_MEASURES)
    assert rows[0] == ("per frame", 0.168, 0.0870, pytest.approx(0.168 / 0.0870), "s", "", None)
    assert rows[2][1:4] == (None, 4.0, None)
    assert speed.ratio(1.0, None) is None and speed.ratio(1.0, 0.0) is None


def test_every_port_of_the_command_has_its_worker_and_its_row_in_docs():
    """Each --port choice is timed by a class of speed_worker.py (beside refimpl's) and has its row in the
    table of docs/ports.md."""
    worker = _load(REPO / "benchmarks" / "ports" / "speed_worker.py", "ports_speed_worker")
    names = set(speed.ports())
    assert names | {"refimpl"} == set(worker.PORTS)
    marker = next(m for m in results.MARKED.finditer((REPO / "docs" / "ports.md").read_text()))
    assert marker["spec"].split() == ["ports", *speed.ports()]


def test_the_table_says_not_measured_until_an_entry_exists(tmp_path):
    table = results.render("ports vox candle_tts", {"amd-no-amx": {"rows": []}})
    assert table.count("not measured") == 6 and "| vox | – |" in table
    assert "`benchmarks/ports/speed.py --port candle_tts --write-results`" in table


def test_an_entry_written_by_speed_is_rendered_side_by_side(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"machines": {"amd-no-amx": {"kept": true}}}')
    port = speed.Port("vox", "vox-tts 0.19.5", "custom_voice", "streaming", True, "no decode", "Engine(threads)")
    figures = {"per frame": (0.168, 0.0870), "first audio in a fresh process": (1.3, 1.07), "codec decode": (None, 4.0)}
    rows = speed.result_rows(figures, {"per frame": "greedy", "codec decode": "the port: no decode"})
    args = argparse.Namespace(threads=2, runs=3)
    key = speed.write_results(port, rows, 0.4, 0.6, args, Path("released-0.6b-customvoice"), path)
    assert key.endswith("-ports-speed-vox")
    machines = results.load(path)
    assert machines["amd-no-amx"] == {"kept": True}
    entry = machines[key]
    assert entry["port_label"] == "vox-tts 0.19.5" and entry["load"] == 0.4 and entry["load_end"] == 0.6
    for row in entry["rows"]:  # the results file's rule: a row's ratio is its two times'
        if row["ours"] is not None and row["against"] is not None:
            assert row["ratio"] == pytest.approx(row["ours"] / row["against"], abs=0.005)
    table = results.render("ports vox qwentts_cpp", machines)
    assert "| 1.93 (0.168 s / 0.087 s) | 1.22 (1.3 s / 1.07 s) | not in its API (refimpl 4 s) |" in table
    assert "| qwentts_cpp | – | not measured |" in table
    assert "end load 0.60" in table and "  - codec decode: the port: no decode" in table
