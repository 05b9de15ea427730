"""Corpora that survive their workers and their own interruption: ``refimpl golden`` is resumable (a rerun
on the same folder keeps the cases already written and verified by their SHA-256, runs the missing, changed,
failed and damaged ones), an interrupted run leaves only complete traces and an index naming them, and a
Dask worker the scheduler gives up on fails its case, not the corpus (docs/limits.md, the port author's
tools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from conftest import REPO

from refimpl.cli import main
from refimpl.porting import golden_cases
from refimpl.porting.golden_cases import make_corpus, read_cases
from refimpl.porting.trace_files import load_trace

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def write_lines(path, *lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def decode_case(name: str, frames: int = 2, first: int = 0) -> dict:
    return {
        "name": name,
        "stage": "codec-decode",
        "input": [[(first + t + q) % 64 for q in range(16)] for t in range(frames)],
    }


def index_of(out) -> dict:
    return json.loads((out / "index.json").read_text())


def golden(cases: str, out, *more) -> int:
    return main(["golden", "--cases", cases, "-o", str(out), "-q", *more])


def test_a_rerun_keeps_what_is_done_and_verified(tmp_path, capsys):
    """The same command again keeps every case (nothing runs); a case whose file was damaged or removed, a
    case that changed, a case that failed and a new case run again; the others' files are not touched."""
    out = tmp_path / "out"
    cases = write_lines(
        tmp_path / "cases.jsonl", decode_case("a"), decode_case("b"), decode_case("c"), decode_case("d")
    )
    assert golden(cases, out) == 0
    first = index_of(out)
    assert first["complete"] and [c["name"] for c in first["cases"]] == ["a", "b", "c", "d"]
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")}

    capsys.readouterr()
    assert main(["golden", "--cases", cases, "-o", str(out)]) == 0
    assert "4 of 4 case(s) already in" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")} == stamps
    assert index_of(out) == first

    with open(out / "a.safetensors", "r+b") as f:  # damaged: same size, one byte changed
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    (out / "b.safetensors").unlink()
    (out / ".c.safetensors.x1y2z3.tmp").write_bytes(b"half a trace")  # a write cut short by SIGKILL
    cases = write_lines(
        tmp_path / "cases.jsonl",
        decode_case("a"),
        decode_case("b"),
        decode_case("c", first=5),  # changed
        decode_case("d"),
        {"name": "bad", "stage": "codec-decode", "input": [list(range(15)) + [64]]},  # fails when it runs
    )
    ran = []

    def counting(*args):
        ran.append(args[1]["name"])
        return golden_cases.run_case_or_fail(*args)

    index = make_corpus(None, read_cases(cases), out, run=counting)
    assert ran == ["a", "b", "c", "bad"]
    assert [c["name"] for c in index["cases"]] == ["a", "b", "c", "d"] and index["complete"]
    assert [c["name"] for c in index["failed"]] == ["bad"]
    assert (out / "d.safetensors").stat().st_mtime_ns == stamps["d.safetensors"]
    assert not list(out.glob("*.tmp"))
    by_name = {c["name"]: c for c in index["cases"]}
    assert by_name["a"]["sha256"] == first["cases"][0]["sha256"]  # traced again: the same bytes
    assert by_name["c"]["case_sha256"] != first["cases"][2]["case_sha256"]
    for entry in index["cases"]:
        assert golden_cases.sha256_of(out / entry["file"]) == entry["sha256"]

    ran.clear()
    make_corpus(None, read_cases(cases), out, run=counting)
    assert ran == ["bad"]  # a failed case is tried again, the done ones are kept


def test_a_corpus_of_another_model_dtype_or_format_is_made_again(tmp_path, capsys):
    out = tmp_path / "out"
    cases = write_lines(tmp_path / "cases.jsonl", decode_case("a"))
    assert golden(cases, out) == 0
    capsys.readouterr()
    assert main(["golden", "--cases", cases, "-o", str(out), "--dtype", "float64"]) == 0
    assert "of another model, dtype or format" in capsys.readouterr().err
    assert index_of(out)["dtype"] == "float64"
    (out / "index.json").write_text("{not json")
    assert main(["golden", "--cases", cases, "-o", str(out), "--dtype", "float64"]) == 0
    assert "every case runs again" in capsys.readouterr().err
    assert index_of(out)["complete"]


def test_a_killed_golden_resumes_where_it_stopped(tmp_path):
    """``refimpl golden`` killed (SIGKILL: nothing of it runs after) while it traces: the index written as
    it went lists only complete traces; the same command again keeps those and traces the rest."""
    cases = [
        {"name": f"c{i}", "stage": "say", "input": f"A sentence long enough to take a while, number {i}.",
         "options": {"speaker": "vivian", "max_new_tokens": 40, "seed": i}}
        for i in range(4)
    ]  # fmt: skip
    cases_file = write_lines(tmp_path / "cases.jsonl", *cases)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "refimpl", "golden", "--cases", cases_file, "-o", str(out), "-q"]
    child = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    partial = None
    while time.monotonic() < deadline and child.poll() is None:
        try:
            partial = index_of(out)
        except (OSError, ValueError):
            partial = None
        if partial and partial["cases"] and not partial["complete"]:
            break
        time.sleep(0.05)
    child.kill()
    child.wait(timeout=60)
    child.stderr.close()
    assert partial and not partial["complete"], "the partial index was never seen"
    partial = index_of(out)  # as the kill left it
    kept = {c["name"]: (out / c["file"]).stat().st_ino for c in partial["cases"]}
    for entry in partial["cases"]:  # only complete traces are listed
        assert golden_cases.sha256_of(out / entry["file"]) == entry["sha256"]
        load_trace(out / entry["file"])

    r = subprocess.run(command[:-1], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{len(kept)} of 4 case(s) already in" in r.stderr
    index = index_of(out)
    assert index["complete"] and [c["name"] for c in index["cases"]] == ["c0", "c1", "c2", "c3"]
    assert {n: (out / f"{n}.safetensors").stat().st_ino for n in kept} == kept
    assert not list(out.glob("*.tmp"))


# ----------------------------------------------------------------------------- Dask, with a stand-in client


class KilledWorker(Exception):
    """Named as ``distributed.scheduler.KilledWorker``: what ``future.result()`` raises when the scheduler
    gave up on the workers that ran the task (each died, as the out-of-memory killer makes them)."""


class FakeFuture:
    def __init__(self, fn, args, fail):
        self.fn, self.args, self.fail = fn, args, fail

    def result(self):
        if self.fail:
            raise self.fail
        return self.fn(*self.args)


def fake_distributed(monkeypatch, failures: dict):
    """A ``distributed`` module whose Client runs each task when its result is asked for, and raises the
    exception ``failures`` names for a case."""
    log = {"cancelled": None, "closed": False}

    class Client:
        def __init__(self, address):
            self.address = address

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            log["closed"] = True

        def submit(self, fn, *args, pure=True):
            return FakeFuture(fn, args, failures.get(args[1]["name"]))

        def cancel(self, futures, force=False):
            log["cancelled"] = len(futures)

    monkeypatch.setitem(sys.modules, "distributed", types.SimpleNamespace(Client=Client))
    return log


def test_a_killed_dask_worker_fails_its_case_not_the_corpus(tmp_path, monkeypatch, capsys):
    log = fake_distributed(monkeypatch, {"b": KilledWorker("Attempted to run task 'run-b' on 3 different workers")})
    cases = write_lines(tmp_path / "cases.jsonl", decode_case("a"), decode_case("b"), decode_case("c"))
    out = tmp_path / "out"
    assert golden(cases, out, "--dask", "tcp://nowhere:8786") == 1
    err = capsys.readouterr().err
    assert "case 'b' (codec-decode) failed: the Dask worker failed: KilledWorker: Attempted to run" in err
    index = index_of(out)
    assert [c["name"] for c in index["cases"]] == ["a", "c"] and [c["name"] for c in index["failed"]] == ["b"]
    assert log["closed"]
    monkeypatch.setitem(sys.modules, "distributed", None)  # the rerun runs only b, locally
    assert golden(cases, out) == 0
    assert [c["name"] for c in index_of(out)["cases"]] == ["a", "b", "c"]


def test_an_interrupted_dask_corpus_cancels_its_cases(tmp_path, monkeypatch):
    log = fake_distributed(monkeypatch, {"b": KeyboardInterrupt()})
    cases = write_lines(tmp_path / "cases.jsonl", decode_case("a"), decode_case("b"), decode_case("c"))
    assert golden(cases, tmp_path / "out", "--dask", "tcp://nowhere:8786") == 130
    assert log["cancelled"] == 3 and log["closed"]
    assert not (tmp_path / "out" / "c.safetensors").exists()


@pytest.mark.parametrize("inline", [True, False])
def test_a_case_is_known_by_its_content_not_its_path(tmp_path, inline):
    codes = np.array(decode_case("x")["input"], dtype=np.int64)
    if inline:
        one = {"name": "x", "stage": "codec-decode", "input": codes.tolist()}
    else:
        np.save(tmp_path / "x.npy", codes)
        one = {"name": "x", "stage": "codec-decode", "input": "x.npy"}
    (case,) = read_cases(write_lines(tmp_path / "cases.jsonl", one))
    digest = golden_cases.case_digest(case)
    if inline:
        (changed,) = read_cases(write_lines(tmp_path / "cases.jsonl", {**one, "input": (codes ^ 1).tolist()}))
        assert golden_cases.case_digest(changed) != digest
        return
    (tmp_path / "sub").mkdir()
    os.replace(tmp_path / "x.npy", tmp_path / "sub" / "x.npy")
    (moved,) = read_cases(write_lines(tmp_path / "cases.jsonl", {**one, "input": "sub/x.npy"}))
    assert golden_cases.case_digest(moved) == digest
    np.save(tmp_path / "sub" / "x.npy", codes + 1)
    assert golden_cases.case_digest(moved) != digest
