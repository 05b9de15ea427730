"""benchmarks/gpu_check.sh and its helpers, checked without a GPU.

The GPU check runs once on a machine lent for minutes, so its bookkeeping is proven here: the checkpoints
are written under a temporary name and renamed when complete (a build stopped by its time limit leaves
nothing a later run would take for a checkpoint); the summary holds every step, every failed test and every
measurement; GPU_CHECK_STEPS runs a subset; and the dry run of the whole script (GPU_CHECK_DRY_RUN=1: the
device steps on the strict stand-in with the tiny checkpoints, the builds stopped by their limits) writes
its at most 8 files, the summary first among them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import common  # noqa: E402
import gpu_summary  # noqa: E402

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash")


def test_a_stopped_build_leaves_no_checkpoint_and_the_next_one_writes_it(tmp_path):
    target = tmp_path / "released-x"

    def stopped(directory):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # as a time limit stops it

    with pytest.raises(KeyboardInterrupt):
        common.written_once(target, stopped, "a test checkpoint")
    assert not target.exists() and (tmp_path / "released-x.partial" / "model.safetensors").is_file()

    def complete(directory):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"whole")

    assert common.written_once(target, complete, "a test checkpoint") == target
    assert (target / "model.safetensors").read_bytes() == b"whole" and not (tmp_path / "released-x.partial").exists()
    assert common.written_once(target, stopped, "a test checkpoint") == target  # complete: not written again
    (target / "model.safetensors").unlink()  # a directory without its weights is written anew
    assert common.written_once(target, complete, "a test checkpoint") == target


def test_the_summary_holds_every_step_failure_and_measurement(tmp_path):
    work, results = tmp_path / "work", tmp_path / "out"
    (work / "logs").mkdir(parents=True)
    results.mkdir()
    (work / "steps.txt").write_text(
        "machine 0 3 60\ncuda_tests 124 220 220\nbench_gpu 1 50 200\nbench_cpu not-asked 0 120\n"
    )
    (work / "logs" / "cuda_tests.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (results / "cuda_tests.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="12.5">'
        '<testcase classname="tests.backends.test_cuda" name="test_a"><failure message="assert 1 == 2">'
        "E assert 1 == 2</failure></testcase>"
        '<testcase classname="tests.backends.test_cuda" name="test_b"><skipped message="no soxr"/></testcase>'
        '<testcase classname="tests.backends.test_cuda" name="test_c"><system-out>cupy backend: H200</system-out>'
        '</testcase><testcase classname="tests.backends.test_cuda" name="test_d"><system-out>'
        "-------- Captured Out --------\n\n</system-out>"
        "</testcase></testsuite></testsuites>"
    )
    bench = {"device": {"cupy": "H200"}, "decode": {"float32": {"x_realtime": 61.25, "seconds": 0.163}}}
    (results / "bench_gpu.json").write_text(json.dumps({**bench, "errors": {"encode": "RuntimeError: boom"}}))
    text = gpu_summary.summary(results, work)
    for expected in (
        "machine      ok",
        "cuda_tests   TIMED OUT",
        "bench_gpu    exit 1",
        "bench_cpu    not asked",
        "3 tests, 1 failures, 0 errors, 1 skipped, 12 s",
        "FAILURE tests.backends.test_cuda::test_a",
        "E assert 1 == 2",
        "SKIPPED 1: no soxr",
        "printed by test_c: cupy backend: H200",
        "decode float32: {'x_realtime': 61.25, 'seconds': 0.163}",
        "61.2x real time (target: at least 50x) -> MET",
        "ERROR in encode: RuntimeError: boom",
        "line 99",
    ):
        assert expected in text, expected
    assert "line 59" not in text  # each step's output is bounded (its last 40 lines)
    assert "printed by test_d" not in text  # pytest's separator alone is not something a test printed
    assert "no JUnit report" in gpu_summary.summary(tmp_path / "empty", work)


def run_check(tmp_path, timeout, **env):
    out, work = tmp_path / "out", tmp_path / "work"
    environment = dict(os.environ, OUT=str(out), GPU_CHECK_WORK=str(work), **{"PYTHON": sys.executable, **env})
    done = subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout
    )
    return done, out, work


@needs_bash
def test_an_unknown_step_is_refused(tmp_path):
    done, _, _ = run_check(tmp_path, 30, GPU_CHECK_STEPS="install,bench")
    assert done.returncode == 2 and "unknown step 'bench'" in done.stderr


@needs_bash
def test_gpu_check_steps_runs_only_the_steps_asked_for(tmp_path):
    done, out, work = run_check(tmp_path, 120, GPU_CHECK_STEPS="install")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = dict(line.split()[:2] for line in (work / "steps.txt").read_text().splitlines())
    assert steps.pop("install") == "0"
    assert set(steps.values()) == {"not-asked"} and "bench_cpu" in steps and "build_0_6b" in steps
    summary = (out / "summary.txt").read_text()
    assert "install      ok" in summary and "no bench_gpu.json" in summary


def one_module_wheel(folder, name: str):
    """A wheel of an empty pure-Python package ``name`` 0.1, written by hand (a wheel is a zip with metadata)."""
    import base64
    import hashlib
    import zipfile

    files = {
        f"{name}/__init__.py": b"X = 1\n",
        f"{name}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
        f"{name}-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{name}-0.1.dist-info/RECORD"] = (record + f"{name}-0.1.dist-info/RECORD,,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-0.1-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)


def install_the_probe_with_a_read_only_environment(tmp_path, **env):
    """The install step alone, a one-module wheel in the wheels folder, under a python whose pip cannot install
    into its environment (as in a read-only one: "Read-only file system") but can with --target."""
    one_module_wheel(tmp_path / "wheels", "refimpl_gpu_check_probe")
    python = tmp_path / "read-only-python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        "# pip install into the environment fails, as in a read-only one; --target works\n"
        'if [ "$1 $2 $3" = "-m pip install" ] && [[ " $* " != *" --target "* ]]; then\n'
        '    echo "ERROR: [Errno 30] Read-only file system" >&2; exit 1\nfi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return run_check(
        tmp_path, 120, GPU_CHECK_STEPS="install", GPU_WHEELS=str(tmp_path / "wheels"),
        GPU_CHECK_PACKAGES="refimpl_gpu_check_probe", PYTHON=str(python), **env,
    )  # fmt: skip


@needs_bash
def test_a_dry_run_installs_beside_the_environment_only(tmp_path):
    """A dry run (on a developer's machine) never installs into the running environment: the wheels go to
    GPU_CHECK_WORK/site-packages at once (the environment's pip is never asked)."""
    done, out, work = install_the_probe_with_a_read_only_environment(tmp_path, GPU_CHECK_DRY_RUN="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (work / "logs" / "install.log").read_text()
    assert "Read-only file system" not in log and "could not install refimpl_gpu_check_probe" not in log, log
    assert (work / "site-packages" / "refimpl_gpu_check_probe" / "__init__.py").is_file()


@needs_bash
def test_install_falls_back_to_a_target_folder_on_pythonpath(tmp_path):
    """Where the environment is not writable (a read-only virtual environment: pip refuses --user there),
    the install step puts the wheel into GPU_CHECK_WORK/site-packages, which the script puts on PYTHONPATH."""
    done, out, work = install_the_probe_with_a_read_only_environment(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (work / "logs" / "install.log").read_text()
    assert "Read-only file system" in log and "could not install refimpl_gpu_check_probe" not in log, log
    assert (work / "site-packages" / "refimpl_gpu_check_probe" / "__init__.py").is_file()
    probe = subprocess.run(
        [sys.executable, "-c", "import refimpl_gpu_check_probe"],
        env=dict(os.environ, PYTHONPATH=str(work / "site-packages")),
        capture_output=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr


@needs_bash
def test_the_dry_run_of_the_whole_check(tmp_path):
    """Every step of the script on the CPU (the strict stand-in, the tiny checkpoints, the builds stopped by
    their 1 s limits: writing a full-size checkpoint takes far longer): each step's bookkeeping, the summary,
    and at most 8 files in $OUT."""
    done, out, work = run_check(tmp_path, 300, GPU_CHECK_DRY_RUN="1")
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert sorted(p.name for p in out.iterdir()) == [
            "bench_gpu.json",
            "cuda_tests.xml",
            "gpu_check.log",
            "summary.txt",
        ]
        steps = {line.split()[0]: line.split()[1] for line in (work / "steps.txt").read_text().splitlines()}
        assert list(steps) == [
            "machine", "install", "build", "warmup", "cuda_tests", "build_0_6b", "bench_gpu", "bench_cpu"
        ]  # fmt: skip
        assert all(steps[s] == "0" for s in ("machine", "install", "warmup", "cuda_tests", "bench_gpu", "bench_cpu"))
        checkpoints = work / "bench-checkpoints"
        for build, name in (("build", "released-speech-tokenizer"), ("build_0_6b", "released-0.6b-customvoice")):
            # stopped by its 1 s limit (as planned): nothing under the checkpoint's name, at most a .partial
            assert steps[build] == "124", (build, steps[build])
            assert not (checkpoints / name).exists(), name
        data = json.loads((out / "bench_gpu.json").read_text())
        assert data["errors"] == {} and set(data["decode"]) == {"float32", "float32_stream_5_frames", "float64"}
        assert data["encode"]["float32_codes_equal_cpu"]["equal"] == data["encode"]["float32_codes_equal_cpu"]["codes"]
        assert data["end_to_end"]["float32_vs_cpu"]["greedy_codes_equal_cpu_float32"] is True
        summary = (out / "summary.txt").read_text()
        assert "build        TIMED OUT" in summary and "decode of 10 s in float32" in summary
        assert "13 skipped" in summary or "13 tests" in summary  # no GPU: every cuda test skipped, with its reason
    finally:
        shutil.rmtree(work / "bench-checkpoints", ignore_errors=True)  # the stopped builds' partial files
