"""benchmarks/ports/speed.py's pure parts and the table it feeds, checked without a port and without timing.

speed.py measures a port beside refimpl in fresh processes (never in a test); what it computes from the
workers' results is checked here on made-up results: the worker's JSON line found in its output, the per-frame
arithmetic (the minimum of each length over the runs, then the difference over the frames between), the
generation alone (qwentts.cpp's "[Perf]" log lines, refimpl's time less its decode's) and its target, the
options (qwentts.cpp's ``--quant``), the rows and keys of the results file (an entry per GGUF type), and
docs/tools/results.py's table "Speed, side by side" of docs/ports.md, "not measured" until an entry exists.
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
worker = _load(REPO / "benchmarks" / "ports" / "speed_worker.py", "ports_speed_worker")
results = _load(REPO / "docs" / "tools" / "results.py", "docs_results_ports")

FRAME = 1920


def frames_run(
    short_s: float, long_s: float, short_frames: int = 10, long_frames: int = 35, generation: tuple | None = None
) -> dict:
    short = {"seconds": short_s, "samples": short_frames * FRAME}
    long = {"seconds": long_s, "samples": long_frames * FRAME}
    if generation is not None:
        short["generation_s"], long["generation_s"] = generation
    return {"runs": [short, long]}


def figures(per_frame=(0.168, 0.0870), generation=(None, None)) -> dict:
    return {
        "per frame": per_frame,
        "per frame, generation only": generation,
        "first audio in a fresh process": (1.3, 1.07),
        "codec decode": (None, 4.0),
    }


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


def test_per_frame_of_the_generation_alone_takes_its_own_times():
    runs = [frames_run(2.0, 6.0, generation=(0.9, 3.4)), frames_run(1.5, 6.5, generation=(1.0, 3.2))]
    got = speed.per_frame(runs, "generation_s")
    assert got["frames"] == (10, 35) and got["times"] == (0.9, 3.2)
    assert got["seconds"] == pytest.approx((3.2 - 0.9) / 25)


def test_rows_hold_the_ports_seconds_against_refimpls():
    rows = speed.result_rows(figures(), {"codec decode": "125 frames; the port: not in its API"})
    assert [r[0] for r in rows] == list(speed.MEASURES) == list(results.PORT_MEASURES)
    assert rows[0] == ("per frame", 0.168, 0.0870, pytest.approx(0.168 / 0.0870), "s", "", None)
    assert rows[1] == ("per frame, generation only", None, None, None, "s", "", None)
    assert rows[3][1:4] == (None, 4.0, None)
    assert speed.ratio(1.0, None) is None and speed.ratio(1.0, 0.0) is None


def entry_names() -> list:
    """Every entry speed.py can write: a port's, and qwentts.cpp's once per GGUF type."""
    every = speed.ports().values()
    return [speed.entry_name(p.name, q) for p in every for q in (speed.QUANTS if p.quantized else ("F32",))]


def test_every_port_of_the_command_has_its_worker_and_its_row_in_docs():
    """Each --port choice is timed by a class of speed_worker.py (beside refimpl's) and has its row in the
    table of docs/ports.md, qwentts.cpp one per GGUF type."""
    names = set(speed.ports())
    assert names | {"refimpl"} == set(worker.PORTS)
    assert entry_names() == ["vox", "qwentts_cpp", "qwentts_cpp-bf16", "candle_tts", "mlx_audio"]
    marker = next(m for m in results.MARKED.finditer((REPO / "docs" / "ports.md").read_text()))
    assert marker["spec"].split() == ["ports", *entry_names()]


def test_each_rows_command_is_one_speed_accepts():
    for name in entry_names():
        command = results.port_command(name).split()
        assert command[0] == "benchmarks/ports/speed.py" and command[-1] == "--write-results"
        args = speed.parser().parse_args(command[1:])
        assert speed.entry_name(args.port, args.quant) == name


def test_the_options_take_the_gguf_type_and_refuse_lengths_with_no_frames_between():
    args = speed.parse_args(["--port", "qwentts_cpp"])
    assert (args.quant, args.quantize_tool) == ("F32", None)
    args = speed.parse_args(["--port", "qwentts_cpp", "--quant", "BF16", "--quantize-tool", "Q"])
    assert (args.quant, args.quantize_tool, args.no_config_view, args.convert_memory_gib) == ("BF16", "Q", False, 24)
    fewest = ["--runs", "1", "--short-frames", "1", "--long-frames", "2", "--decode-frames", "1"]
    args = speed.parse_args(["--port", "qwentts_cpp", *fewest])
    assert (args.runs, args.short_frames, args.long_frames, args.decode_frames) == (1, 1, 2, 1)
    for wrong in (
        ["--port", "vox", "--quant", "BF16"],  # vox has one form of its model
        ["--port", "qwentts_cpp", "--quant", "Q8_0"],
        ["--port", "vox", "--short-frames", "5", "--long-frames", "5"],
        ["--port", "vox", "--short-frames", "0"],
        ["--port", "vox", "--decode-frames", "0"],
    ):
        with pytest.raises(SystemExit):
            speed.parse_args(wrong)


def test_the_label_and_the_entry_name_say_which_gguf_type_ran():
    assert speed.ports()["qwentts_cpp"].label.endswith("(qwentts.cpp, F32 GGUF)")
    assert speed.ports("BF16")["qwentts_cpp"].label.endswith("(qwentts.cpp, BF16 GGUF)")
    assert speed.entry_name("qwentts_cpp") == "qwentts_cpp" and speed.entry_name("vox", "F32") == "vox"
    assert speed.entry_name("qwentts_cpp", "BF16") == "qwentts_cpp-bf16"


def test_a_port_is_installed_where_its_environment_was_made_for_its_requirement(tmp_path, monkeypatch):
    """``installed`` looks at the environment ``ensure_venv`` makes (its Python and the requirement it recorded)
    and makes nothing: no environment, a half-made one, or one made for another version is not installed."""
    monkeypatch.setattr(speed.harness, "ENVS", tmp_path)
    vox = speed.ports()["vox"]
    name, requirement = speed.environment_of(vox)[:2]
    assert requirement == f"vox-tts=={name.rsplit('-', 1)[1]}"
    assert not speed.installed(vox) and list(tmp_path.iterdir()) == []  # (a look: nothing made)
    env = tmp_path / name
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    assert not speed.installed(vox)  # made, but its install never recorded (it failed or is under way)
    (env / ".installed").write_text("vox-tts==0.0.1")
    assert not speed.installed(vox)  # another version's
    (env / ".installed").write_text(requirement)
    assert speed.installed(vox)
    assert not speed.installed(speed.ports()["qwentts_cpp"])
    assert speed.environment_of(speed.ports()["mlx_audio"])[4] == "mlx-audio"  # (its version from the metadata)


def test_bench_table_runs_each_installed_port_as_its_own_command_would(monkeypatch):
    """bench_table.py's peers: qwentts.cpp on its BF16 files (issue 50's target), every port with the table's
    runs and, where the table is written, its own entry; a port not installed has no command."""
    monkeypatch.setattr(speed, "installed", lambda port: port.name in ("qwentts_cpp", "vox"))
    found = dict(speed.peer_runs(3, write=True, port_source="SRC", quantize_tool="Q"))
    assert set(found) == {name for name, _ in speed.PEERS}
    assert found["candle_tts"] is None and found["mlx_audio"] is None
    assert found["vox"] == ["--port", "vox", "--runs", "3", "--write-results"]
    q = found["qwentts_cpp"]
    bf16 = ["--port", "qwentts_cpp", "--runs", "3", "--quant", "BF16"]
    assert q == bf16 + ["--port-source", "SRC", "--quantize-tool", "Q", "--write-results"]
    for argv in (a for a in found.values() if a):
        args = speed.parse_args(argv)  # each one speed.py accepts
        assert args.runs == 3 and args.write_results
    assert speed.entry_name("qwentts_cpp", speed.parse_args(q).quant) == "qwentts_cpp-bf16"
    quiet = dict(speed.peer_runs(1, write=False))
    assert quiet["qwentts_cpp"] == ["--port", "qwentts_cpp", "--runs", "1", "--quant", "BF16"]


PERF_LOG = [  # qwentts.cpp's log of one synthesis (pipeline-tts.cpp, tts_log_perf), among other lines
    "[Pipeline] Generation done : 35 frames",
    "[Perf] PromptBuild 1.2 ms",
    "[Perf] Prefill 95.0 ms (T_ctx prefill)",
    "[Perf] TTFA 160.4 ms (first frame codes)",
    "[Perf] TalkerDecode 1360.0 ms (35 frames, 38.86 ms/frame)",
    "[Perf] CodePredictor 2450.5 ms (70.01 ms/frame)",
    "[Perf] HostCompose 39.5 ms (c0 sample + next emb)",
    "[Perf] CodecDecode 5100.0 ms",
    "[Perf] Total 9100.0 ms (35 frames, 110.00 ms/frame AR, audio 2.80 s, RTF 3.250)",
]


def test_qwentts_cpps_generation_is_its_talker_code_predictor_and_host_stages():
    got = worker.perf_stages(PERF_LOG)
    assert got["frames"] == 35 and got["stages"]["CodecDecode"] == 5100.0
    assert got["generation_s"] == pytest.approx((1360.0 + 2450.5 + 39.5) / 1000)  # its "ms/frame AR" x 35
    assert worker.perf_stages(PERF_LOG[:4]) is None  # a log without the stages: no figure
    assert worker.perf_stages([]) is None


def test_a_generation_is_timed_with_its_stages_where_the_side_tells_them():
    class Told:
        decode_s = 0.25

        def generate(self, n):
            return n * FRAME

        def generation_only(self, seconds):
            return {"generation_s": seconds - self.decode_s, "decode_s": self.decode_s}

    class Silent:
        def generate(self, n):
            return n * FRAME

    run = worker.timed_generation(Told(), 3)
    assert run["samples"] == 3 * FRAME and run["generation_s"] == pytest.approx(run["seconds"] - 0.25)
    assert set(worker.timed_generation(Silent(), 3)) == {"seconds", "samples"}


def found_frames(port_generation: bool) -> dict:
    port = [frames_run(2.0, 6.0, generation=(0.4, 2.4) if port_generation else None) for _ in range(2)]
    ours = [frames_run(1.0, 3.0, generation=(0.3, 1.8)) for _ in range(2)]
    return {"port": {"frames": port}, "ours": {"frames": ours}}


def test_the_generation_alone_is_given_where_the_port_reports_its_stages_with_its_target():
    args = argparse.Namespace(quant="BF16", decode_frames=125, first_frames=1)
    port = speed.ports("BF16")["qwentts_cpp"]
    got, notes, errors = speed.figures_of(port, found_frames(True), args)
    assert errors == []
    assert got["per frame, generation only"] == (pytest.approx(2.0 / 25), pytest.approx(1.5 / 25))
    assert got["per frame"] == (pytest.approx(4.0 / 25), pytest.approx(2.0 / 25))
    note = notes["per frame, generation only"]
    assert '"[Perf]" log' in note and "refimpl / port 0.75, target ≤ 0.7 (not met)" in note
    args.quant = "F32"  # the issue's target is the BF16 files'
    _, notes, _ = speed.figures_of(speed.ports()["qwentts_cpp"], found_frames(True), args)
    assert "target" not in notes["per frame, generation only"]
    got, notes, _ = speed.figures_of(speed.ports()["vox"], found_frames(False), args)
    assert got["per frame, generation only"] == (None, pytest.approx(1.5 / 25))
    assert "the port does not report its stages" in notes["per frame, generation only"]


def test_the_target_is_refimpl_over_the_port():
    assert speed.against_target("vox", figures()) is None
    met = speed.against_target("qwentts_cpp-bf16", figures(generation=(0.110, 0.075)))
    assert met == "refimpl / port 0.68, target ≤ 0.7 (met)"
    unknown = speed.against_target("qwentts_cpp-bf16", figures())
    assert unknown == "refimpl / port -, target ≤ 0.7"


def test_the_table_says_not_measured_until_an_entry_exists(tmp_path):
    table = results.render("ports vox candle_tts qwentts_cpp-bf16", {"amd-no-amx": {"rows": []}})
    assert table.count("not measured") == 12 and "| vox | – |" in table
    assert "`benchmarks/ports/speed.py --port candle_tts --write-results`" in table
    assert "| qwentts_cpp-bf16 | – |" in table
    assert "`benchmarks/ports/speed.py --port qwentts_cpp --quant BF16 --write-results`" in table


def test_an_entry_written_by_speed_is_rendered_side_by_side(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"machines": {"amd-no-amx": {"kept": true}}}')
    port = speed.Port("vox", "vox-tts 0.19.5", "custom_voice", "streaming", True, "no decode", "Engine(threads)")
    rows = speed.result_rows(figures(), {"per frame": "greedy", "codec decode": "the port: no decode"})
    args = argparse.Namespace(threads=2, runs=3, quant="F32")
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
    assert "| 1.93 (0.168 s / 0.087 s) | not measured | 1.22 (1.3 s / 1.07 s) | not in its API (refimpl 4 s) |" in table
    assert "| qwentts_cpp | – | not measured |" in table
    assert "end load 0.60" in table and "  - codec decode: the port: no decode" in table


def test_an_f32_and_a_bf16_entry_live_side_by_side(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"machines": {}}')
    keys = {}
    for quant, generation in (("F32", (0.150, 0.080)), ("BF16", (0.110, 0.080))):
        port = speed.ports(quant)["qwentts_cpp"]
        rows = speed.result_rows(figures(generation=generation), {"per frame, generation only": quant})
        args = argparse.Namespace(threads=2, runs=3, quant=quant)
        keys[quant] = speed.write_results(port, rows, 0.4, 0.6, args, Path("released-0.6b-customvoice"), path)
    assert keys["F32"].endswith("-ports-speed-qwentts_cpp") and keys["BF16"].endswith("-ports-speed-qwentts_cpp-bf16")
    machines = results.load(path)
    f32, bf16 = machines[keys["F32"]], machines[keys["BF16"]]
    assert (f32["gguf"], bf16["gguf"]) == ("F32", "BF16")
    assert bf16["source"] == "benchmarks/ports/speed.py --port qwentts_cpp --quant BF16, 3 runs"
    assert f32["source"] == "benchmarks/ports/speed.py --port qwentts_cpp, 3 runs"
    assert bf16["rows"][1]["what"] == "per frame, generation only" and bf16["rows"][1]["ratio"] == 1.375
    table = results.render("ports qwentts_cpp qwentts_cpp-bf16", machines)
    f32_row, bf16_row = (line for line in table.splitlines() if line.startswith("| realtimetts"))
    assert "(qwentts.cpp, F32 GGUF)" in f32_row and "| 1.88 (0.15 s / 0.08 s) |" in f32_row
    assert "(qwentts.cpp, BF16 GGUF)" in bf16_row and "| 1.38 (0.11 s / 0.08 s) |" in bf16_row
    assert "`benchmarks/ports/speed.py --port qwentts_cpp --quant BF16 --write-results`" in bf16_row
