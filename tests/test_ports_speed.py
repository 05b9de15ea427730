"""benchmarks/ports/speed.py's pure parts and the table it feeds, checked without a port and without timing.

speed.py measures a port beside refimpl in fresh processes (never in a test); what it computes from the
workers' results is checked here on made-up results: the worker's JSON line found in its output, the per-frame
arithmetic (the minimum of each length over the runs, then the difference over the frames between), and the
rows of the results file.
"""

from __future__ import annotations

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
    assert [r[0] for r in rows] == list(speed.MEASURES)
    assert rows[0] == ("per frame", 0.168, 0.0870, pytest.approx(0.168 / 0.0870), "s", "", None)
    assert rows[2][1:4] == (None, 4.0, None)
    assert speed.ratio(1.0, None) is None and speed.ratio(1.0, 0.0) is None
