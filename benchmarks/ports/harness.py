"""What every port's script shares: its own virtual environment, a suite, its checkpoints, a child process
with a time and a memory limit, and the grade (benchmarks/ports/README.md).

A port runs only in its own environment, under ``benchmarks/ports/.envs/<name>/`` (git-ignored): the pinned
package from PyPI, nothing of it in the project's environment and none of its code in the repository. The
port's script runs with the project's Python, makes that environment, sends each case to a worker script
that runs in it, and grades what the worker wrote with ``refimpl conformance grade``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

ENVS = HERE / ".envs"
TAIL = 4000  # characters of a failed child's output kept in the record


def load_average() -> float:
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- the port's environment


def ensure_venv(name: str, requirement: str, module: str, version: str, distribution: str | None = None) -> Path:
    """The Python of ``ENVS/name``, a virtual environment holding ``requirement`` (one or more pinned
    requirements separated by spaces, installed once, from wheels only: a port that needs building from
    source is not the published package), checked by importing ``module`` and reading its ``__version__``,
    or the installed version of ``distribution`` where the module has none."""
    env = ENVS / name
    python = env / "bin" / "python"
    done = env / ".installed"
    if not installed(name, requirement):
        shutil.rmtree(env, ignore_errors=True)
        print(f"making {env} with {requirement} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
        subprocess.run(pip + ["--only-binary", ":all:", *requirement.split()], check=True)
        done.write_text(requirement)
    check = f"import {module}; print({module}.__version__)"
    if distribution:
        check = f"import {module}, importlib.metadata as m; print(m.version({distribution!r}))"
    found = subprocess.run(
        [str(python), "-I", "-c", check],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if found != version:
        raise SystemExit(f"{env}: {module} {found} is installed where {version} was pinned: delete {env}")
    return python


def installed(name: str, requirement: str) -> bool:
    """Whether ``ENVS/name`` is the environment ``ensure_venv`` makes for ``requirement``: its Python there and
    the requirement it was made with recorded (a look only: nothing is installed)."""
    env = ENVS / name
    done = env / ".installed"
    return done.is_file() and done.read_text() == requirement and (env / "bin" / "python").exists()


def limits(memory_bytes: int):
    """The preexec of a child: an address-space limit and no core file."""

    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_limited(argv: list, timeout_s: float, memory_bytes: int, env: dict | None = None) -> dict:
    """Run ``argv`` in its own process group under the limits; never raises for what the child does.
    Returns {"rc", "seconds", "timed_out", "output"} (the last TAIL characters of stdout and stderr)."""
    t0 = time.perf_counter()
    child = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
        preexec_fn=limits(memory_bytes),
    )
    timed_out = False
    try:
        output, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(child.pid, signal.SIGKILL)  # the child and anything it started
        output, _ = child.communicate()
    rc = child.returncode
    if rc is not None and rc < 0:
        output += f"\n[killed by signal {signal.Signals(-rc).name}]"
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 2), "timed_out": timed_out, "output": output[-TAIL:]}


def child_env(threads: int) -> dict:
    """A plain environment for a port's process: the thread counts fixed, nothing of the project's."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    n = str(threads)
    return dict(keep, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n)


# ----------------------------------------------------------------------------- the suite and its checkpoints


def ensure_suite(suite: Path, model_dirs: list) -> dict:
    """The manifest of ``suite``, made first (``refimpl conformance make``) when the folder has none."""
    from refimpl.porting.conformance.suite import make_suite, read_manifest

    if not (suite / "manifest.json").is_file():
        print(f"making the conformance suite {suite} ...", flush=True)
        t0 = time.perf_counter()
        make_suite(suite, model_dirs or None, log=print)
        print(f"made in {time.perf_counter() - t0:.0f} s", flush=True)
    return read_manifest(suite)


def checkpoint_dirs(suite: Path, manifest: dict, model_dirs: list) -> dict:
    """kind -> the checkpoint directory a case of that kind ran on: the suite's own copy (a suite of the
    embedded checkpoints), else the ``--model`` directory whose weights have the hash the suite recorded."""
    from refimpl.porting.trace_files import weights_hash

    found, hashes = {}, {}
    for kind, entry in manifest["checkpoints"].items():
        if entry.get("path"):
            found[kind] = suite / entry["path"]
            continue
        for d in model_dirs:
            hashes.setdefault(d, weights_hash(d))
            if hashes[d] == entry["weights_sha256"]:
                found[kind] = Path(d)
    return found


def same_codec_tokenizer(manifest: dict, dirs: dict) -> bool:
    """Whether the Base checkpoint's speech tokenizer has the same weights as the one the suite's codec cases
    ran on (then a port that loads only a Base model can run the codec cases too)."""
    from refimpl.porting.trace_files import weights_hash

    codec_kind = next((c["checkpoint"] for c in manifest["cases"] if c["stage"].startswith("codec")), None)
    if "base" not in dirs or codec_kind not in dirs:
        return False
    return weights_hash(dirs["base"] / "speech_tokenizer") == weights_hash(dirs[codec_kind] / "speech_tokenizer")


def planned_cases(manifest: dict, args, results: Path, record: dict, dirs: dict, plan):
    """The suite's cases to run, each as (case, its results folder emptied, action, checkpoint kind), where
    ``plan(case)`` gives (action, kind) or (None, why the port cannot run it).  A case not among
    ``args.cases`` is skipped; one the port cannot run, or whose checkpoint was not given, is recorded in
    ``record["cases"]`` as not run, with the reason."""
    wanted = set(args.cases or [c["name"] for c in manifest["cases"]])
    for case in manifest["cases"]:
        name = case["name"]
        if name not in wanted:
            continue
        out = results / name
        shutil.rmtree(out, ignore_errors=True)
        action, kind = plan(case)
        if action is None:
            record["cases"][name] = {"status": "not run", "reason": kind}
        elif kind not in dirs:
            record["cases"][name] = {"status": "not run", "reason": f"no {kind} checkpoint (pass --model)"}
        else:
            yield case, out, action, kind


def reference_input(suite: Path, case: dict) -> dict:
    """The ``input`` of the case's float64 reference metadata (the speaker a say case ran with, ...), read
    from the header alone."""
    from refimpl.io.checkpoint import read_safetensors_header
    from refimpl.porting.trace_files import METADATA_KEY

    path = suite / "cases" / case["name"] / case["references"]["float64"]
    _, metadata, _ = read_safetensors_header(path)
    return json.loads(metadata.get(METADATA_KEY, "{}")).get("input", {})


def text_feed(case: dict) -> str | None:
    """'streaming' or 'non-streaming': the text feed the case's reference ran with (None: not a generation)."""
    from refimpl.porting.trace_files import GENERATE_METHODS, text_feed_default

    if case["stage"] not in GENERATE_METHODS:
        return None
    options = case["options"]
    non_streaming = options.get("non_streaming_mode", text_feed_default(case["stage"]))
    return "non-streaming" if non_streaming else "streaming"


def on_base_plan(stage: str, dirs: dict, same_tokenizer: bool, needs_base: str) -> tuple:
    """A codec-encode or speaker case of a port that reaches its encoders through a Base checkpoint alone:
    (action, "base"), or (None, why not): ``needs_base`` without one, or a codec-encode case whose Base
    checkpoint's speech tokenizer is not the one the case ran on (``same_tokenizer`` false)."""
    if "base" not in dirs:
        return None, needs_base
    if stage == "codec-encode" and not same_tokenizer:
        return None, "the Base checkpoint's speech tokenizer is not the one the case ran on"
    return ("encode" if stage == "codec-encode" else "speaker"), "base"


def generation_plan(case: dict, action, reasons: list, batch: str, sampled: str) -> tuple:
    """A generation case: (action, the case's checkpoint kind), or (None, why not): the port's own
    ``reasons``, then ``batch`` where the case's text is a batch of texts, then ``sampled`` where it samples
    (each port draws from a generator of its own, which cannot replay the reference's recorded draws)."""
    options = case["options"]
    if isinstance(options.get("text"), list):
        reasons = [*reasons, batch]
    if options.get("do_sample", True) or options.get("subtalker_dosample", True):
        reasons = [*reasons, sampled]
    return (None, "; ".join(reasons)) if reasons else (action, case["checkpoint"])


# ----------------------------------------------------------------------------- the grade


def grade(suite: Path, results: Path, precision: str, behaviours: list) -> tuple:
    """(report, its text): ``refimpl conformance grade`` in this process; the JSON and the HTML report are
    written beside the cases, as ``RESULTS/report.json`` and ``RESULTS/report.html``."""
    from refimpl.porting.conformance.commands import json_safe
    from refimpl.porting.conformance.grade import format_report, grade_suite
    from refimpl.porting.conformance.report_html import write_html

    report = grade_suite(suite, results, precision, None, behaviours)
    (results / "report.json").write_text(json.dumps(json_safe(report), indent=1) + "\n")
    write_html(report, results / "report.html")
    return report, format_report(report)


def port_arguments(doc: str, port: str) -> argparse.ArgumentParser:
    """The options every port's script takes; the script adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", required=True, help="a conformance suite (made there first when absent)")
    ap.add_argument("--results", required=True, help="RESULTS: one folder per case, the reports")
    ap.add_argument("--model", action="append", default=[], help="checkpoint directory (repeat): a suite's checkpoints")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per case")
    ap.add_argument("--memory-gib", type=int, default=12, help=f"address-space limit of each {port} process")
    ap.add_argument("--cases", nargs="*", help="only these cases")
    return ap


def prepare(args) -> tuple:
    """(suite, results, manifest, checkpoint dirs) of the parsed options: the suite made where absent, RESULTS
    created."""
    args.model = [Path(m) for m in args.model]
    suite, results = Path(args.suite), Path(args.results)
    manifest = ensure_suite(suite, args.model)
    dirs = checkpoint_dirs(suite, manifest, args.model)
    results.mkdir(parents=True, exist_ok=True)
    return suite, results, manifest, dirs


def run_job(python: Path, worker: Path, jobs: Path, name: str, job: dict, args, env: dict) -> dict:
    """Write a case's job, run the port's worker on it in a child process under the time and memory limits
    (``run_limited``); returns that run (rc, timed_out, output, seconds)."""
    (jobs / f"{name}.json").write_text(json.dumps(job))
    argv = [str(python), "-I", str(worker), str(jobs / f"{name}.json")]
    return run_limited(argv, args.timeout, args.memory_gib * GIB, env)


def printed_lines(run: dict) -> list:
    """The lines a run printed, each stripped, the blank ones left out."""
    return [line.strip() for line in run["output"].splitlines() if line.strip()]


def failed(entry: dict, run: dict, out: Path, last: str | None = None) -> None:
    """Mark ``entry`` failed with the run's one-line reason (``last``: the error line; by default the last
    line of its output, after a traceback) and remove the half-written case: it is not graded."""
    what = "timed out" if run["timed_out"] else f"exit status {run['rc']}"
    if last is None:
        last = (printed_lines(run) or [""])[-1]
    entry.update(status="failed", message=f"{what}: {last.strip()}", output=run["output"])
    shutil.rmtree(out, ignore_errors=True)


def last_line(run: dict) -> str:
    """Why a tool's run failed, in one line: the last line it printed (an exception's, after its traceback),
    else its exit status; "timed out; " first where it ran out of time."""
    lines = printed_lines(run)
    return ("timed out; " if run["timed_out"] else "") + (lines[-1] if lines else f"exit status {run['rc']}")


def ggml_error_line(run: dict) -> str:
    """Why a GGML port's worker stopped: GGML's assertion (its path inside ggml/ alone), else the last line
    that is not a debugger's backtrace, a log line or a warning (a traceback's last line)."""
    lines = printed_lines(run)
    for line in lines:
        if "GGML_ASSERT" in line or "GGML_ABORT" in line:
            return line.split("/ggml/", 1)[-1]
    last = next((line for line in reversed(lines) if not line.startswith(("#", "[", "warning"))), "")
    return last or (lines[-1] if lines else "")


def finish(tag: str, record: dict, suite: Path, results: Path, precision: str, behaviours: list, lines: list) -> int:
    """Write ``RESULTS/<tag>-run.json``, grade, print the report card and ``lines`` (what the script did);
    the exit status: the grade's, or 1 when a case failed to run (or ran only in part)."""
    from refimpl.porting.conformance.grade import exit_status

    record.update(behaviours=behaviours, precision=precision)
    (results / f"{tag}-run.json").write_text(json.dumps(record, indent=1) + "\n")
    report, text = grade(suite, results, precision, behaviours)
    print(text)
    print("\n".join(lines))
    print(f"reports: {results / 'report.html'}, {results / 'report.json'}, {results / f'{tag}-run.json'}")
    crashed = any(c["status"] in ("failed", "partial") for c in record["cases"].values())
    return max(exit_status(report), 1 if crashed else 0)


def summary(record: dict, ran, before: list = ()) -> list:
    """What a port's script did, printed after the report card: the load average before and after, the lines
    ``before`` (its conversions), then a line a case: not run and why, failed to run and why, or the
    port's own line of a case it ran (``ran(entry)``)."""
    m = record["machine"]
    lines = ["", f"{record['port']}: what the script did (load average {m['load_average_1min']} before, "]
    lines[-1] += f"{m['load_average_1min_after']} after; timings, not a benchmark)"
    lines += before
    for name, c in record["cases"].items():
        if c["status"] == "not run":
            lines.append(f"  {name}: not run: {c['reason']}")
        elif c["status"] == "failed":
            took = f" ({c['seconds']} s)" if "seconds" in c else ""
            lines.append(f"  {name}: FAILED TO RUN{took}: {c['message']}")
        else:
            lines.append(f"  {name}: {ran(c)}")
    return lines


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1min": round(load_average(), 2),
    }
