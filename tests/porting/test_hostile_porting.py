"""The port author's tools under hostile input: traces, case files and codes files that lie about their
structure or never end, case names that point outside the output directory, writes cut short by a
file-size limit or a signal.  Every bad input is one named error with the documented exit status
(``refimpl compare``: 2, unusable input, never 1, "the traces diverge"; the other commands: 1), memory
stays bounded by the input, and nothing is written outside ``-o``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from refimpl.cli import main
from refimpl.porting.golden_cases import read_cases
from refimpl.porting.trace_files import Trace, TraceError, load_trace

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
MEMORY_LIMIT = 3 << 30  # address space of a child: Python, NumPy and Numba fit; the claimed 8 PiB do not
CODES_16 = [list(range(16))]  # one frame of codes for the tiny codec (codebook 64)


def run(*args, memory: int | None = MEMORY_LIMIT, file_size: int | None = None, env=None, stdin=None, timeout=300):
    """``refimpl ARGS`` in a fresh process under an address-space (and optionally a file-size) limit."""

    def limit():
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return subprocess.run(
        [sys.executable, "-m", "refimpl", *map(str, args)],
        capture_output=True,
        text=True,
        env=env or ENV,
        timeout=timeout,
        preexec_fn=limit,
        stdin=stdin,
    )


def small_trace(path, fmt=None):
    trace = Trace([("a", np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)), ("ids", np.arange(4))], {"x": 1})
    return trace.save(path, fmt)


def safetensors_bytes(header, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(head)) + head + data


def assert_unusable(capsys, reference, candidate, *fragments):
    """``refimpl compare`` on an unusable file: status 2 and one line naming the problem, never 1."""
    status = main(["compare", str(reference), str(candidate)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "refimpl compare: unusable input:" in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


# ----------------------------------------------------------------------------- traces


@pytest.mark.parametrize(
    "name, content, fragments",
    [
        ("list.safetensors", safetensors_bytes([1, 2]), ["must be a JSON object, found a JSON list"]),
        (
            "strings.safetensors",
            safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}, bytes(8)),
            ["data_offsets must be two non-negative integers"],
        ),
        (
            "negative.safetensors",
            safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, bytes(8)),
            ["data_offsets must be two non-negative integers"],
        ),
        (
            "string-dtype.safetensors",
            safetensors_bytes({"a": {"dtype": "STR", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
            ["unsupported dtype 'STR'"],
        ),
        (
            "gap.safetensors",
            safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
            ["belong to no tensor"],
        ),
        (
            "deep.safetensors",
            safetensors_bytes(b'{"__metadata__": {"refimpl.trace": "' + b"[" * 5000 + b'"}}'),
            ["nested more than 64 levels"],
        ),
        ("deep-header.safetensors", safetensors_bytes(b"[" * 100_000), ["nested more than 64 levels"]),
        ("metadata-list.safetensors", safetensors_bytes({"__metadata__": {"refimpl.trace": "[1]"}}), ["JSON object"]),
        ("empty.safetensors", b"", ["too short"]),
    ],
)
def test_malformed_safetensors_traces_are_unusable_input(tmp_path, capsys, name, content, fragments):
    reference = small_trace(tmp_path / "ref.safetensors")
    (tmp_path / name).write_bytes(content)
    assert_unusable(capsys, reference, tmp_path / name, name, *fragments)
    assert_unusable(capsys, tmp_path / name, reference, name, *fragments)


def npz_with(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_npz_traces_checked_before_use(tmp_path, capsys):
    reference = small_trace(tmp_path / "ref.npz")
    cases = {
        "strings.npz": (npz_with(a=np.array(["x", "y"])), "has dtype <U1, not a number"),
        "complex.npz": (npz_with(a=np.ones(2, np.complex64)), "not a number"),
        "metadata.npz": (npz_with(a=np.ones(2), __metadata__=np.array("[1, 2]")), "must be a JSON object"),
        "order.npz": (npz_with(a=np.ones(2), __metadata__=np.array('{"order": [[1]]}')), "list of tensor names"),
    }
    with open(tmp_path / "single.npz", "wb") as f:  # a .npy called .npz
        np.save(f, np.ones(3))
    for name, (content, fragment) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert_unusable(capsys, reference, tmp_path / name, name, fragment)
    assert_unusable(capsys, reference, tmp_path / "single.npz", "single .npy array, not a trace")
    (tmp_path / "not-zip.npz").write_bytes(b"hello")
    assert_unusable(capsys, reference, tmp_path / "not-zip.npz", "not an npz archive")


def lying_npz(path, shape) -> None:
    """An npz whose member's .npy header claims ``shape`` of float64 in front of 8 bytes of data."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": shape})
    member.write(bytes(8))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", member.getvalue())


def test_npz_header_claiming_petabytes_is_refused_in_bounded_memory(tmp_path):
    """A 300-byte file whose member claims 8 PiB: refused from the header, under a 3 GiB address space."""
    small_trace(tmp_path / "ref.npz")
    lying_npz(tmp_path / "huge.npz", (2**50,))
    assert (tmp_path / "huge.npz").stat().st_size < 400
    r = run("compare", tmp_path / "ref.npz", tmp_path / "huge.npz")
    assert r.returncode == 2, r.stderr
    assert "claims shape (1125899906842624,) of float64" in r.stderr and "MemoryError" not in r.stderr, r.stderr


def test_zip_bomb_member_is_refused_before_decompression(tmp_path, capsys):
    reference = small_trace(tmp_path / "ref.npz")
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", bytes(1000))
    raw = bytearray((tmp_path / "bomb.npz").read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local and central headers
        at = raw.index(signature)
        raw[at + offset : at + offset + 4] = struct.pack("<I", 2**32 - 1)  # "uncompressed size 4 GiB"
    (tmp_path / "bomb.npz").write_bytes(bytes(raw))
    assert_unusable(capsys, reference, tmp_path / "bomb.npz", "a zip bomb?")


@pytest.mark.parametrize("device", ["/dev/zero", "fifo", "directory"])
def test_streams_devices_and_directories_are_not_traces(tmp_path, device):
    """Refused from ``stat`` before anything is read: a pipe with no writer is never opened."""
    small_trace(tmp_path / "ref.safetensors")
    if device == "fifo":
        os.mkfifo(tmp_path / "fifo")
        device = tmp_path / "fifo"
    elif device == "directory":
        device = tmp_path
    r = run("compare", tmp_path / "ref.safetensors", device)
    assert r.returncode == 2, r.stderr
    assert "unusable input" in r.stderr and ("regular file" in r.stderr or "directory" in r.stderr), r.stderr


def test_load_trace_reads_both_metadata_encodings(tmp_path):
    """npz metadata as a 0-d unicode array (ours) or as UTF-8 bytes in a uint8 vector (easy from C++)."""
    text = json.dumps({"order": ["b", "a"], "stage": "say"})
    (tmp_path / "u.npz").write_bytes(npz_with(a=np.ones(2), b=np.zeros(1), __metadata__=np.array(text)))
    utf8 = np.frombuffer(text.encode(), np.uint8)
    (tmp_path / "b.npz").write_bytes(npz_with(a=np.ones(2), b=np.zeros(1), __metadata__=utf8))
    for name in ("u.npz", "b.npz"):
        trace = load_trace(tmp_path / name)
        assert trace.keys == ["b", "a"] and trace.metadata["stage"] == "say"
    (tmp_path / "x.npz").write_bytes(npz_with(a=np.ones(2), __metadata__=np.ones(2)))
    with pytest.raises(TraceError, match="the metadata must be a JSON string"):
        load_trace(tmp_path / "x.npz")


def test_a_failed_trace_write_keeps_the_previous_trace(tmp_path):
    """A file-size limit stops the write of a new trace: the previous one stays whole, no temporary file."""
    previous = small_trace(tmp_path / "t.safetensors")
    good = previous.read_bytes()
    script = textwrap.dedent(
        f"""
        import numpy as np
        from refimpl.porting.trace_files import Trace
        Trace([("big", np.ones(1 << 20, np.float32))], {{}}).save({str(previous)!r})
        """
    )

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    for fmt in ("safetensors", "npz"):
        target = previous if fmt == "safetensors" else small_trace(tmp_path / "t.npz")
        before = target.read_bytes()
        r = subprocess.run(
            [sys.executable, "-c", script.replace(str(previous), str(target))],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
            preexec_fn=limit,
        )
        assert r.returncode != 0 and "File too large" in r.stderr, r.stderr
        assert target.read_bytes() == before
    assert previous.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz", "t.safetensors"]


# ----------------------------------------------------------------------------- signals during a write

SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from refimpl.io.files import write_atomically

    def pieces():
        yield b"new data "
        print("writing", flush=True)
        while True:
            time.sleep(0.05)
            yield b"more "

    write_atomically(sys.argv[1], pieces())
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_during_an_atomic_write_leave_no_temporary_file(tmp_path, signum):
    """The child is killed by the signal as it asked (status -signum), the old file is untouched and the
    temporary file beside it is gone."""
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE, env=ENV, text=True
    )
    assert child.stdout.readline() == "writing\n"
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the write is under way
    child.send_signal(signum)
    assert child.wait(timeout=60) == -signum
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_an_ignored_sighup_stays_ignored_during_a_write(tmp_path):
    """Under ``nohup`` (SIGHUP ignored) a hang-up does not stop the write."""
    target = tmp_path / "out.bin"
    script = SLOW_WRITER.replace("while True:", "for _ in range(10):")
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(target)],
        stdout=subprocess.PIPE,
        env=ENV,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert child.stdout.readline() == "writing\n"
    child.send_signal(signal.SIGHUP)
    assert child.wait(timeout=60) == 0
    assert target.read_bytes() == b"new data " + b"more " * 10


# ----------------------------------------------------------------------------- refimpl golden


def write_lines(path, *lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("name", ["../escaped", "/absolute", "sub/dir", "..", ".", "", "a\\b", "nul\x00", "x" * 201, 7])
def test_golden_case_names_stay_inside_the_output_directory(tmp_path, name):
    """A name becomes OUTDIR/<name>.safetensors: a folder part, '..', an absolute path (or no name) is
    refused before anything runs; nothing is written anywhere."""
    (tmp_path / "in").mkdir()
    cases = write_lines(tmp_path / "in" / "cases.jsonl", {"name": name, "stage": "codec-decode", "input": CODES_16})
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["golden", "--cases", cases, "-o", str(tmp_path / "in" / "out"), "-q"]) == 1
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert not os.path.exists("/absolute.safetensors")


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('["name", "stage"]', "a case must be a JSON object, found a JSON list"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": ["speaker"]}', "options must be a JSON object"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": "vivian", "text": "again"}}', "text"),
        ('{"name": "a", "name": "b", "stage": "say", "input": "Hi."}', "the key 'name' appears twice"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": {}}', "a say case needs options.speaker"),
        ('{"name": "a", "stage": "say", "input": ["Hi."], "options": {"speaker": "vivian"}}', "input must be"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": ["vivian"]}}', "must be a string"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": "v", "seed": -1}}', "seed"),
        ('{"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": "v", "top_p": 2}}', "top_p"),
        ('{"name": "a", "stage": "sing", "input": "Hi."}', "stage must be one of"),
        ('{"name": "a", "stage": "codec-decode", "input": [[1180591620717411303424]]}', "not an integer in [0, 2^63)"),
        ('{"name": "a", "stage": "codec-decode", "input": [[1.5]]}', "inline code 1.5 at frame 0, group 0"),
        ('{"name": "a", "stage": "codec-decode", "input": [[true]]}', "inline code True"),
        ('{"name": "a", "stage": "codec-decode", "input": [[1, 2], [3]]}', "equally long lists"),
        ('{"name": "a", "stage": "codec-decode", "input": "missing.npy"}', "does not exist"),
        ('{"name": "a", "stage": "clone", "input": "Hi.", "options": {"ref_audio": "no.wav"}}', "no.wav"),
        ('{"name": "a", "stage": "speaker", "input": "Hi.", "comment": 1}', "unknown key(s) ['comment']"),
        ("[" * 100_000, "nested more than 64 levels"),
        ('{"name": "a"', "not valid JSON"),
    ],
)
def test_every_case_is_checked_before_any_runs(tmp_path, capsys, line, fragment):
    """A bad case on the last line: one error naming the line (and the case), and no case has run."""
    cases = write_lines(tmp_path / "cases.jsonl", {"name": "good", "stage": "codec-decode", "input": CODES_16}, line)
    assert main(["golden", "--cases", cases, "-o", str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "refimpl: error: " + cases + ":2:" in err and fragment in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_repeated_case_names_are_refused(tmp_path):
    case = {"name": "same", "stage": "codec-decode", "input": CODES_16}
    with pytest.raises(ValueError, match="case 'same' has the name of the case on line 1"):
        read_cases(write_lines(tmp_path / "cases.jsonl", case, case))


def test_golden_index_lists_the_cases_done_and_failed(tmp_path, capsys):
    """A case that fails when it runs (a speaker the model lacks, a code outside the codebook) is named
    with its error; the others are traced; index.json (written atomically) lists both; status 1."""
    cases = write_lines(
        tmp_path / "cases.jsonl",
        {"name": "ok", "stage": "codec-decode", "input": CODES_16},
        {"name": "outside", "stage": "codec-decode", "input": [list(range(15)) + [64]]},
        {"name": "nobody", "stage": "say", "input": "Hi.", "options": {"speaker": "nobody", "max_new_tokens": 3}},
    )
    assert main(["golden", "--cases", cases, "-o", str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "case 'outside' (codec-decode) failed: codes: code 64 at frame 0, group 15 is outside [0, 64)" in err
    assert "case 'nobody' (say) failed: Unsupported speakers: ['nobody']" in err
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [c["name"] for c in index["cases"]] == ["ok"]
    assert [(c["name"], c["internal"]) for c in index["failed"]] == [("outside", False), ("nobody", False)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.json", "ok.safetensors"]
    assert load_trace(tmp_path / "out" / "ok.safetensors").keys[-1] == "decoder"


@pytest.mark.parametrize("what", ["cases", "codes"])
def test_endless_cases_and_codes_files_are_refused_in_bounded_memory(tmp_path, what):
    """/dev/zero as a cases file or a codes file: read up to the 256 MiB limit, then refused (status 1),
    within a 3 GiB address space."""
    if what == "cases":
        r = run("golden", "--cases", "/dev/zero", "-o", tmp_path / "out", "-q")
    else:
        r = run("trace", "codec-decode", "/dev/zero", "-o", tmp_path / "t.safetensors", "-q")
    assert r.returncode == 1, r.stderr
    assert "over the limit of 268435456 bytes" in r.stderr and "MemoryError" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------- refimpl golden: its workers

SLOW_CASES = [
    {"name": f"c{i}", "stage": "say", "input": f"A sentence long enough to take a while, number {i}.",
     "options": {"speaker": "vivian", "max_new_tokens": 60, "seed": i}}
    for i in range(4)
]  # fmt: skip


def children(pid: int) -> list:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat_file.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_golden(tmp_path, jobs: int = 2, cases: list = SLOW_CASES):
    """``refimpl golden --jobs`` on ``cases`` in a fresh process, and its worker processes once they run."""
    cases = write_lines(tmp_path / "cases.jsonl", *cases)
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # noqa: E731
    command = [sys.executable, "-m", "refimpl", "golden", "--cases", cases, "-o", str(tmp_path / "out"), "--jobs"]
    main_process = subprocess.Popen([*command, str(jobs)], stderr=subprocess.PIPE, text=True, env=ENV, preexec_fn=limit)
    for _ in range(600):
        workers = [c for c in children(main_process.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        if len(workers) == jobs:
            return main_process, workers
        time.sleep(0.1)
    main_process.kill()
    raise AssertionError("no workers started")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_golden_stops_its_workers(tmp_path, signum):
    """SIGTERM to ``refimpl golden --jobs 2`` used to leave its two workers running: they finished their
    cases, wrote them after the command had ended, and then waited forever with a model in memory.  Now
    the workers end first, the command ends by the signal, and nothing is written afterwards (an index of
    the cases done before it, if any: the corpus resumes from it).  Forty cases, so that some are still
    running when the signal comes, however fast the machine."""
    many = [{**case, "name": f"c{i}"} for i, case in enumerate(SLOW_CASES * 10)]
    main_process, workers = start_golden(tmp_path, cases=many)
    time.sleep(2)
    main_process.send_signal(signum)
    assert main_process.wait(timeout=120) == -signum, main_process.stderr.read()
    assert "leaked" not in main_process.stderr.read()  # the pool's semaphores were released
    time.sleep(1)
    assert not any(alive(w) for w in workers)
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    time.sleep(5)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written
    assert not any(name.endswith(".tmp") for name in written)
    assert len([name for name in written if name.endswith(".safetensors")]) < len(many)


def test_a_worker_that_dies_loses_no_case(tmp_path):
    """A worker killed while it runs (SIGKILL: what the system's out-of-memory killer sends) broke the
    pool: every case not finished was lost and the command an internal error.  The lost cases run again,
    each alone; the corpus is whole."""
    main_process, workers = start_golden(tmp_path)
    time.sleep(2)
    os.kill(workers[0], signal.SIGKILL)
    assert main_process.wait(timeout=300) == 0, main_process.stderr.read()
    assert "note: a worker process died;" in main_process.stderr.read()
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [c["name"] for c in index["cases"]] == ["c0", "c1", "c2", "c3"] and index["failed"] == []
    for entry in index["cases"]:
        assert load_trace(tmp_path / "out" / entry["file"]).keys[-1].startswith("refimpl.")


KILLER = """
import os, signal

def run(model, case, out_dir, fmt, dtype):
    if case["name"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"name": case["name"], "stage": case["stage"], "file": case["name"] + ".safetensors"}
"""


def test_a_case_that_kills_its_worker_every_time_is_named(tmp_path, monkeypatch):
    """A case whose process dies again when it runs alone is listed as failed (the others are done)."""
    from refimpl.porting.golden_cases import WORKER_DIED, run_cases

    (tmp_path / "killer.py").write_text(KILLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import killer

    cases = [{"name": n, "stage": "say"} for n in ("a", "die", "b", "c")]
    notes = []
    entries = run_cases(None, cases, tmp_path, jobs=2, run=killer.run, note=notes.append)
    assert [e["name"] for e in entries] == ["a", "die", "b", "c"]
    assert entries[1] == {"name": "die", "stage": "say", "error": WORKER_DIED, "internal": False}
    assert all(e["file"] == e["name"] + ".safetensors" for i, e in enumerate(entries) if i != 1)
    assert len(notes) == 1 and "run again, each alone" in notes[0]


# ----------------------------------------------------------------------------- refimpl trace arguments


@pytest.mark.parametrize("option, value", [("--seed", "-1"), ("--max-new-tokens", "0"), ("--seed", "x")])
def test_trace_say_numbers_are_usage_errors(tmp_path, option, value):
    r = run("trace", "say", "Hi.", "--speaker", "vivian", option, value, "-o", tmp_path / "t.safetensors")
    assert r.returncode == 2 and f"argument {option}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_replayed_draws_must_be_uniforms(tmp_path):
    """--replay of a trace whose recorded uniforms are NaN: an error naming random_draws, not all-zero codes."""
    args = ["trace", "say", "Hi.", "--speaker", "vivian", "--max-new-tokens", "3", "-q"]
    assert main([*args, "-o", str(tmp_path / "good.safetensors")]) == 0
    good = load_trace(tmp_path / "good.safetensors")  # the same run, its uniforms replaced by NaN
    items = [(k, np.full_like(v, np.nan) if k == "refimpl.random_draws" else v) for k, v in good.items]
    Trace(items, good.metadata).save(tmp_path / "nan.safetensors")
    r = run(
        "trace", "say", "Hi.", "--speaker", "vivian", "--replay", tmp_path / "nan.safetensors",
        "-o", tmp_path / "t.safetensors", "--max-new-tokens", "3",
    )  # fmt: skip
    assert r.returncode == 1 and "random_draws[0] is nan, not a uniform in [0, 1)" in r.stderr, r.stderr
    assert not (tmp_path / "t.safetensors").exists()


# ----------------------------------------------------------------------------- trace keys and metadata


@pytest.mark.parametrize("fmt, dots", [("safetensors", 200_000), ("npz", 30_000)])  # a zip name: < 64 KiB
def test_a_key_of_200000_dots_is_refused_in_bounded_memory(tmp_path, fmt, dots):
    """One key of 200,000 dots (a 400 KB file): its every dotted suffix would be 40 GB of strings (compare's
    prefix hint built them); keys are at most 1024 characters, refused when the trace is loaded."""
    small_trace(tmp_path / f"ref.{fmt}")
    Trace([("a." * dots, np.ones(2, np.float32))], {}).save(tmp_path / f"dots.{fmt}")
    assert (tmp_path / f"dots.{fmt}").stat().st_size < 1_000_000
    for pair in ((f"ref.{fmt}", f"dots.{fmt}"), (f"dots.{fmt}", f"ref.{fmt}")):
        r = run("compare", *(tmp_path / name for name in pair), timeout=120)
        assert r.returncode == 2, r.stderr
        assert f"{2 * dots} characters long, over the limit of 1024" in r.stderr, r.stderr
        assert "MemoryError" not in r.stderr, r.stderr


def test_the_prefix_hint_looks_at_a_few_dotted_parts_of_a_key():
    """Work per key is bounded by its length, whatever its dots: the hint tries prefixes of at most three
    parts (``decoder.``, ``talker.model.``)."""
    from refimpl.porting.compare import dotted_prefixes, prefix_hint

    assert list(dotted_prefixes("a." * 500)) == [("a.", "a." * 499), ("a.a.", "a." * 498), ("a.a.a.", "a." * 497)]
    ref = ["decoder.pre_conv", "decoder.upsample.0.1.norm", "decoder"]
    assert "prefix 'decoder.' added" in prefix_hint(ref, ["pre_conv", "upsample.0.1.norm"])
    assert "prefix 'model.' removed" in prefix_hint(ref, ["model.decoder.pre_conv", "model.decoder"])


BAD_METADATA = [
    ({"config": "Qwen3-TTS"}, "the trace metadata's config must be a JSON object (or null), found a JSON string"),
    ({"generation": [1, 2]}, "the trace metadata's generation must be a JSON object (or null), found a JSON list"),
    ({"input": ["Hi."]}, "the trace metadata's input must be a JSON object (or null), found a JSON list"),
    ({"stage": 3}, "the trace metadata's stage must be a string"),
    ({"input": {"frames": "7"}}, "the trace metadata's input.frames must be an integer >= 0"),
    ({"input": {"eos_token_id": True}}, "the trace metadata's input.eos_token_id must be an integer >= 0"),
    ({"config": {"talker_config": [1]}}, "the trace metadata's config.talker_config must be a JSON object"),
    ({"config": {"talker_config": {"codec_eos_token_id": -1}}}, "config.talker_config.codec_eos_token_id"),
    ({"generation": {"temperature": "hot"}}, "generation: temperature must be a positive number, got 'hot'"),
    ({"generation": {"top_k": 1.5}}, "generation: top_k must be a non-negative integer, got 1.5"),
    ({"generation": {"forced": "yes"}}, "the trace metadata's generation.forced must be true or false"),
]


@pytest.mark.parametrize("metadata, fragment", BAD_METADATA)
def test_metadata_of_the_wrong_types_is_unusable_input(tmp_path, capsys, metadata, fragment):
    """Compare and diagnose read ``config``, ``input`` and ``generation``: a string or a list there (a
    port's hand-written metadata) is one error naming the file and the field, never an internal error.  The
    codes differ, so that the diagnosis of the first divergent code reads the metadata too."""
    codes = np.arange(32).reshape(2, 16)
    items = [("talker.codec_head:0", np.ones((1, 2, 8), np.float32)), ("refimpl.codes.0", codes)]
    reference = Trace(items, {"stage": "say"}).save(tmp_path / "ref.safetensors")
    bad = Trace([items[0], ("refimpl.codes.0", codes + 1)], dict(metadata)).save(tmp_path / "bad.safetensors")
    assert_unusable(capsys, reference, bad, "bad.safetensors", fragment)
    assert_unusable(capsys, bad, reference, "bad.safetensors", fragment)
    with pytest.raises(TraceError, match="bad.safetensors: the trace metadata"):
        load_trace(bad)


@pytest.fixture(scope="module")
def sampled_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampled") / "say.safetensors"
    assert main(["trace", "say", "Hi.", "--speaker", "vivian", "--max-new-tokens", "3", "-q", "-o", str(path)]) == 0
    return load_trace(path)


@pytest.mark.parametrize("metadata, fragment", BAD_METADATA[:3])
def test_replay_of_a_trace_whose_metadata_have_the_wrong_types(tmp_path, capsys, sampled_trace, metadata, fragment):
    """``trace --replay`` reads the recorded ``input`` and ``stage``: one error (status 1) naming the field."""
    Trace(sampled_trace.items, dict(sampled_trace.metadata, **metadata)).save(tmp_path / "bad.safetensors")
    args = ["trace", "say", "Hi.", "--speaker", "vivian", "--max-new-tokens", "3", "-q"]
    assert main([*args, "--replay", str(tmp_path / "bad.safetensors"), "-o", str(tmp_path / "t.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "refimpl: error:" in err and fragment in err and "internal error" not in err, err
    assert not (tmp_path / "t.safetensors").exists()


# ----------------------------------------------------------------------------- JSON integers


LONG = "9" * 5000  # digits of an integer past Python's 4300-digit limit of int(str)


def test_json_integers_of_thousands_of_digits_name_the_file(tmp_path, capsys):
    """Python's own "Exceeds the limit (4300 digits) for integer string conversion" names no file: every
    JSON read (configs, case files, trace headers and metadata, name maps) refuses such an integer as one
    error naming the file, with the status of that command."""
    reference = small_trace(tmp_path / "ref.safetensors")
    header = '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, ' + LONG + "]}}"
    (tmp_path / "header.safetensors").write_bytes(safetensors_bytes(header.encode(), bytes(8)))
    assert_unusable(capsys, reference, tmp_path / "header.safetensors", "header.safetensors", "5000 digits")
    metadata = '{"__metadata__": {"refimpl.trace": "{\\"order\\": [], \\"x\\": ' + LONG + '}"}}'
    (tmp_path / "meta.safetensors").write_bytes(safetensors_bytes(metadata.encode()))
    assert_unusable(capsys, reference, tmp_path / "meta.safetensors", "meta.safetensors", "5000 digits")
    (tmp_path / "map.json").write_text('{"tensors": {"a": {"key": "a", "reshape": [' + LONG + "]}}}")
    assert main(["compare", str(reference), str(reference), "--map", str(tmp_path / "map.json")]) == 2
    err = capsys.readouterr().err
    assert "map.json: a JSON integer of 5000 digits" in err and "Exceeds" not in err, err
    if sys.version_info >= (3, 11):
        (tmp_path / "map.toml").write_text("x = " + LONG + "\n")
        assert main(["compare", str(reference), str(reference), "--map", str(tmp_path / "map.toml")]) == 2
        err = capsys.readouterr().err
        assert "map.toml: an integer of more than 4300 digits" in err and "Exceeds" not in err, err
    case = '{"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": "vivian", "seed": ' + LONG + "}}"
    cases = write_lines(tmp_path / "cases.jsonl", case)
    assert main(["golden", "--cases", cases, "-o", str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert f"refimpl: error: {cases}:1: the line: a JSON integer of 5000 digits" in err, err


def test_a_config_integer_of_thousands_of_digits_names_the_file(tmp_path):
    import shutil

    from conftest import CHECKPOINTS

    model = tmp_path / "m"
    shutil.copytree(CHECKPOINTS / "tiny-speech-tokenizer", model)
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text.replace("{", '{"huge": ' + LONG + ", ", 1))
    np.save(tmp_path / "codes.npy", np.zeros((2, 16), np.int64))
    r = run("codec", "decode", tmp_path / "codes.npy", "-o", tmp_path / "o.wav", "--model", model)
    assert r.returncode == 1, r.stderr
    assert "config.json: a JSON integer of 5000 digits" in r.stderr and "Exceeds" not in r.stderr, r.stderr


def test_a_million_digit_integer_is_refused_without_converting_it(tmp_path):
    """PYTHONINTMAXSTRDIGITS=0 lifts Python's limit, and int() of a million digits takes minutes (quadratic):
    the integer is refused from its length, before any conversion."""
    reference = small_trace(tmp_path / "ref.safetensors")
    (tmp_path / "map.json").write_text('{"tensors": {"a": {"key": "a", "reshape": [' + "7" * 1_000_000 + "]}}}")
    r = run(
        "compare",
        reference,
        reference,
        "--map",
        tmp_path / "map.json",
        env=dict(ENV, PYTHONINTMAXSTRDIGITS="0"),
        timeout=60,
    )
    assert r.returncode == 2 and "a JSON integer of 1000000 digits" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- name maps


def map_file(tmp_path, data) -> str:
    (tmp_path / "map.json").write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(tmp_path / "map.json")


def test_adjacent_placeholders_are_refused_not_backtracked(tmp_path):
    """8 adjacent placeholders against a key of 1000 digits: a regular expression tries every way to
    split the digits (about 10^17); a placeholder must be separated from the next by text with a
    non-digit, so that a name splits one way only.  A map that obeys it matches long keys at once."""
    Trace([("1" * 1000, np.ones(2, np.float32))], {}).save(tmp_path / "port.safetensors")
    reference = small_trace(tmp_path / "ref.safetensors")
    pattern = "".join("{%s}" % chr(ord("a") + i) for i in range(8)) + "x"
    r = run(
        "compare",
        reference,
        tmp_path / "port.safetensors",
        "--map",
        map_file(tmp_path, {"tensors": {pattern: "a"}}),
        timeout=120,
    )
    assert r.returncode == 2 and "placeholders must be separated by text that is not only digits" in r.stderr, r.stderr
    assert "tensors['{a}{b}{c}" in r.stderr, r.stderr
    key = "".join(f"{d}." for d in ["1" * 100] * 8)  # 8 runs of 100 digits
    Trace([(key + "y", np.ones(2, np.float32))], {}).save(tmp_path / "port.safetensors")
    pattern = "".join("{p%d}." % i for i in range(8))
    r = run(
        "compare",
        reference,
        tmp_path / "port.safetensors",
        "--map",
        map_file(tmp_path, {"tensors": {pattern + "x": "a"}}),
        timeout=120,
    )
    assert r.returncode == 2 and "no key in common" in r.stderr, r.stderr


def test_a_key_template_of_a_million_placeholders_is_not_expanded(tmp_path):
    """A 3 MB map whose key repeats {i} a million times, against a key of 1000 digits: a gigabyte per key
    if expanded (out of memory under 2 GiB); a key is at most 1024 characters, checked before it is built
    (in the map, and for every key a map makes)."""
    reference = small_trace(tmp_path / "ref.safetensors")
    Trace([("t" + "9" * 1000, np.ones(2, np.float32))], {}).save(tmp_path / "port.safetensors")
    path = map_file(tmp_path, {"tensors": {"t{i}": "{i}" * 1_000_000}})
    assert os.path.getsize(path) > 3_000_000
    r = run("compare", reference, tmp_path / "port.safetensors", "--map", path, timeout=120, memory=2 << 30)
    assert r.returncode == 2 and "tensors['t{i}']: the key is 3000000 characters long" in r.stderr, r.stderr
    assert "MemoryError" not in r.stderr
    r = run(
        "compare",
        reference,
        tmp_path / "port.safetensors",
        "--map",
        map_file(tmp_path, {"tensors": {"t{i}": "{i}" * 300}}),
    )
    assert r.returncode == 2, r.stderr
    assert "tensors['t{i}']: the key for 't9999" in r.stderr and "would be 300000 characters long" in r.stderr


@pytest.mark.parametrize(
    "select, fragment",
    [
        ("0:2:0", "has a step of 0"),
        ("1:2:3:4", "is not an integer"),
        ("x", "'x' is not an integer"),
        ("1.5", "is not an integer"),
        ("9" * 20, "is not an integer (at most 19 digits)"),
        ("\u0663", "is not an integer"),  # an Arabic-Indic three, which int() takes
        ("1_0", "is not an integer"),
        ("0,,1", "an empty item"),
        (", ".join(["0"] * 65), "has 65 items; an array has at most 64 axes"),
        ("..., ...", "at most one '...'"),
        ("0" * 300, "over 200 characters"),
        ("", "a selector is a non-empty string"),
        (5, "a selector is a non-empty string"),
        ("0, 0, 0, 0", "does not fit 'a' of shape (2, 3)"),
        ("5", "does not fit 'a' of shape (2, 3)"),
    ],
)
def test_every_selector_error_names_the_map_entry(tmp_path, capsys, select, fragment):
    reference = small_trace(tmp_path / "ref.safetensors")
    Trace([("port_a", np.ones(3, np.float32))], {}).save(tmp_path / "port.safetensors")
    path = map_file(tmp_path, {"tensors": {"port_a": {"key": "a", "select": select}}})
    assert main(["compare", str(reference), str(tmp_path / "port.safetensors"), "--map", path]) == 2
    err = capsys.readouterr().err
    assert "refimpl compare: unusable input: map.json: tensors['port_a']: " in err and fragment in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "reshape, fragment",
    [
        ([0], "reshape is a list of at most 64 positive sizes"),
        ([-1, -1], "with at most one -1"),
        ([1.5], "not [1.5]"),
        ([2**63], "positive sizes"),
        ([1] * 65, "at most 64"),
        ("3", "not '3'"),
        ([7], "'port_a' of shape (3,) cannot be reshaped to [7]"),
    ],
)
def test_every_reshape_error_names_the_map_entry(tmp_path, capsys, reshape, fragment):
    reference = small_trace(tmp_path / "ref.safetensors")
    Trace([("port_a", np.ones(3, np.float32))], {}).save(tmp_path / "port.safetensors")
    path = map_file(tmp_path, {"tensors": {"port_a": {"key": "a", "reshape": reshape}}})
    assert main(["compare", str(reference), str(tmp_path / "port.safetensors"), "--map", path]) == 2
    err = capsys.readouterr().err
    assert "map.json: tensors['port_a']: " in err and fragment in err, err


def test_the_bounds_of_a_map():
    from refimpl.porting.name_maps import MAX_ENTRIES, NameMap

    for data, fragment in [
        ({"add_prefix": "x" * 2000}, "add_prefix is over the limit of 1024 characters"),
        ({"tensors": {"x" * 1025: "a"}}, "the pattern is 1025 characters long"),
        ({"tensors": {".".join("{p%d}" % i for i in range(9)): "a"}}, "9 placeholders, over the limit of 8"),
        ({"tensors": {f"layer{j}.{{i}}": "a{i}" for j in range(17)}}, "over 16 patterns differ from it only in"),
        ({"tensors": {f"k{j}": "a" for j in range(MAX_ENTRIES + 1)}}, f"over the limit of {MAX_ENTRIES}"),
        ({"tensors": {"a": {"key": "b", **{f"extra{j}": 1 for j in range(1000)}}}}, "and 995 more"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            NameMap(data)
    m = NameMap({"add_prefix": "p" * 1000})
    with pytest.raises(ValueError, match="add_prefix makes 'abcdefghijklmnopqrstuvwxyz' 1026 characters long"):
        m.rename("abcdefghijklmnopqrstuvwxyz")


def test_the_first_entry_of_the_map_that_matches_wins():
    """Literal names are looked up and patterns grouped by skeleton; the map's order still decides."""
    from refimpl.porting.name_maps import NameMap

    m = NameMap(
        {"tensors": {"blk.{i}.x": "a.{i}", "blk.7.x": "seven", "blk.8.x": "eight", "blk.{i}0.x{j}": "b{i}.{j}"}}
    )
    assert m.rename("blk.7.x")[0] == "a.7"
    assert m.rename("blk.120.x03")[0] == "b12.3" and m.rename("blk.00.x1")[0] == "b0.1"
    assert m.rename("blk.x")[0] == "blk.x"
    m = NameMap({"tensors": {"blk.7.x": "seven", "blk.{i}.x": "a.{i}"}})
    assert m.rename("blk.7.x")[0] == "seven" and m.rename("blk.07.x")[0] == "a.7"


# ----------------------------------------------------------------------------- scale

LAYER_MODULES = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")


def generation_like(n: int, seed: int = 0) -> Trace:
    """``n`` small tensors named as a generation trace names them (per-call ``:N`` suffixes, the sampling
    scores, the codes and draws), as 25 frames at the released size make about 40,000."""
    rng = np.random.default_rng(seed)
    items, call = [], 0
    while len(items) < n - 2:
        for layer in range(5):
            for module in LAYER_MODULES:
                items.append((f"talker.code_predictor.model.layers.{layer}.{module}:{call}", rng.random(8)))
        items.append((f"refimpl.talker.code_predictor.sampling.logits:{call}", rng.random((1, 8))))
        call += 1
    items = items[: n - 2] + [
        ("refimpl.codes.0", rng.integers(0, 8, (25, 16))),
        ("refimpl.random_draws", rng.random(400)),
    ]
    return Trace(items, {"stage": "say", "generation": {"do_sample": True, "seed": 0}})


def compare_cost(tmp_path, n: int) -> float:
    """CPU seconds of what ``refimpl compare`` does with two traces of ``n`` tensors (the candidate's codes
    differ at one frame): load both, compare (with the diagnosis of the differing code), the table, the
    JSON, a name map, the prefix hint."""
    import time

    from refimpl.porting.compare import compare_traces, prefix_hint, report_json
    from refimpl.porting.name_maps import NameMap

    reference = generation_like(n)
    candidate = Trace([(k, v.copy()) for k, v in reference.items], reference.metadata)
    candidate.items[-2][1][7, 0] += 1
    reference.save(tmp_path / f"ref{n}.safetensors")
    candidate.save(tmp_path / f"cand{n}.npz")
    name_map = NameMap({"strip_prefix": "port.", "tensors": {"blk.{i}.q:{n}": "talker.model.layers.{i}.q:{n}"}})
    t0 = time.process_time()
    reference, candidate = load_trace(tmp_path / f"ref{n}.safetensors"), load_trace(tmp_path / f"cand{n}.npz")
    report = compare_traces(reference, candidate)
    assert report.first_divergence.frame == 7 and len(report.rows) == n
    report.format(), report_json(report)
    name_map.apply(reference, candidate)
    assert "prefix 'port.' added" in prefix_hint([f"port.{k}" for k in reference.keys], candidate.keys)
    return time.process_time() - t0


def test_compare_of_40000_tensors_is_linear(tmp_path, monkeypatch):
    """A 25-frame generation at the released size records about 40,000 tensors; everything compare does
    with them must be linear in their number (a set rebuilt per key made loading quadratic).  Loosely: 4
    times the tensors may cost up to 8 times the CPU time (quadratic work would cost 16 times), and no step
    looks a key up by ``Trace.__getitem__`` (a linear search per call)."""
    lookups = []
    original = Trace.__getitem__
    monkeypatch.setattr(Trace, "__getitem__", lambda self, key: lookups.append(key) or original(self, key))
    small = min(compare_cost(tmp_path, 10_000) for _ in range(2))
    large = compare_cost(tmp_path, 40_000)
    assert large < 8 * small, (small, large)
    assert lookups == []
