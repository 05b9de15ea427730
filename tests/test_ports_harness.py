"""benchmarks/ports/harness.py's parts that every port's script shares and that need no port: which cases a port
can run (the reasons it cannot, in their order), the summary printed after the report card, and the line that
says why a tool or a worker failed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "ports"))  # a port's script imports harness, as when run


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"ports_{name}", REPO / "benchmarks" / "ports" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load("harness")
vox = _load("vox")


def say_case(**options) -> dict:
    return {"name": "say", "stage": "say", "options": {"text": "Hi.", **options}, "checkpoint": "custom_voice"}


def test_a_generation_runs_greedy_and_single_else_says_every_reason_in_order():
    greedy = {"do_sample": False, "subtalker_dosample": False}
    assert harness.generation_plan(say_case(**greedy), "say", [], "B", "S") == ("say", "custom_voice")
    assert harness.generation_plan(say_case(**greedy), "say", ["own"], "B", "S") == (None, "own")
    batch = say_case(text=["a", "b"], **greedy)
    assert harness.generation_plan(batch, "say", ["own"], "B", "S") == (None, "own; B")
    # sampling is the official default: a case that leaves either switch out samples
    assert harness.generation_plan(say_case(do_sample=False), "say", [], "B", "S") == (None, "S")
    assert harness.generation_plan(say_case(subtalker_dosample=False), "say", [], "B", "S") == (None, "S")
    sampled_batch = say_case(text=["a", "b"], do_sample=True, subtalker_dosample=False)
    assert harness.generation_plan(sampled_batch, "say", ["own"], "B", "S") == (None, "own; B; S")
    reasons = ["own"]
    harness.generation_plan(sampled_batch, "say", reasons, "B", "S")
    assert reasons == ["own"]  # the port's list is not extended


def test_the_encoders_through_a_base_checkpoint_need_one_with_the_cases_tokenizer():
    assert harness.on_base_plan("speaker", {}, True, "no base") == (None, "no base")
    assert harness.on_base_plan("speaker", {"base": "dir"}, False, "no base") == ("speaker", "base")
    assert harness.on_base_plan("codec-encode", {"base": "dir"}, True, "no base") == ("encode", "base")
    action, why = harness.on_base_plan("codec-encode", {"base": "dir"}, False, "no base")
    assert action is None and "speech tokenizer is not the one the case ran on" in why


def test_a_ports_plan_is_its_own_reasons_then_the_shared_ones():
    dirs = {"custom_voice": "dir"}
    sampled_batch = say_case(text=["a", "b"], non_streaming_mode=True)
    action, why = vox.plan_case(sampled_batch, dirs, include_non_streaming=False, same_tokenizer=True)
    assert action is None and why == "; ".join([vox.NON_STREAMING, vox.BATCH, vox.SAMPLED])
    greedy = say_case(non_streaming_mode=False, do_sample=False, subtalker_dosample=False)
    assert vox.plan_case(greedy, dirs, include_non_streaming=False, same_tokenizer=True) == ("say", "custom_voice")
    assert vox.plan_case({**greedy, "stage": "speaker"}, dirs, False, True) == (None, vox.NEEDS_BASE)


def test_the_summary_gives_the_load_the_steps_before_and_a_line_a_case():
    record = {
        "port": "port 1.0",
        "machine": {"load_average_1min": 0.5, "load_average_1min_after": 0.75},
        "cases": {
            "a": {"status": "not run", "reason": "why not"},
            "b": {"status": "failed", "message": "exit status 1: boom", "seconds": 3.2},
            "c": {"status": "failed", "message": "timed out: x"},
            "d": {"status": "ran", "seconds": 9.5},
            "e": {"status": "partial", "seconds": 1.5},
        },
    }
    lines = harness.summary(record, lambda c: f"{c['status']} in {c['seconds']} s", ["  convert it: cached"])
    assert lines == [
        "",
        "port 1.0: what the script did (load average 0.5 before, 0.75 after; timings, not a benchmark)",
        "  convert it: cached",
        "  a: not run: why not",
        "  b: FAILED TO RUN (3.2 s): exit status 1: boom",
        "  c: FAILED TO RUN: timed out: x",
        "  d: ran in 9.5 s",
        "  e: partial in 1.5 s",
    ]


def run_of(output: str, rc: int = 1, timed_out: bool = False) -> dict:
    return {"output": output, "rc": rc, "timed_out": timed_out}


def test_a_failed_tool_is_said_by_its_last_line_else_its_exit_status():
    traceback = "Traceback (most recent call last):\n  File 'x.py'\nValueError: bad shape\n\n"
    assert harness.last_line(run_of(traceback)) == "ValueError: bad shape"
    assert harness.last_line(run_of("  \n", rc=-9)) == "exit status -9"
    assert harness.last_line(run_of("loading\n", rc=-9, timed_out=True)) == "timed out; loading"


def test_a_ggml_port_is_said_by_its_assertion_else_the_last_line_not_a_backtrace():
    assertion = "[info] loading\n/src/ggml/src/ggml.c:1234: GGML_ASSERT(a->ne[0] == b->ne[0]) failed\n#0 0x1 in ??\n"
    assert harness.ggml_error_line(run_of(assertion)) == "src/ggml.c:1234: GGML_ASSERT(a->ne[0] == b->ne[0]) failed"
    crash = "RuntimeError: qt_synthesize failed\n#0 0x1 in ??\n[perf] 3 ms\nwarning: leaked 1 object\n"
    assert harness.ggml_error_line(run_of(crash)) == "RuntimeError: qt_synthesize failed"
    assert harness.ggml_error_line(run_of("#0 0x1 in ??\n")) == "#0 0x1 in ??"  # nothing else: the last line
    assert harness.ggml_error_line(run_of("")) == ""


def test_a_failed_case_keeps_its_reason_and_loses_its_half_written_files(tmp_path):
    out = tmp_path / "case"
    out.mkdir()
    (out / "half.wav").write_bytes(b"RIFF")
    entry = {"status": "ran", "seconds": 2.0}
    harness.failed(entry, run_of("Traceback ...\n  ValueError: bad  \n \n", rc=3), out)
    assert entry["status"] == "failed" and entry["message"] == "exit status 3: ValueError: bad"
    assert not out.exists()
    harness.failed(entry, run_of("", rc=-9, timed_out=True), out)
    assert entry["message"] == "timed out: "
