"""Traced cases and the golden corpus: one case run, CASES.jsonl read and checked, many cases run at once.

A case is one traced run: a stage (``STAGE_MODELS``), its input (codes, a WAV, a text) and the Python
API's options for it (``trace_case``).  ``refimpl trace`` runs one; ``refimpl golden`` reads a cases file
(``read_cases``: every case checked before any runs) and traces them in parallel processes or on a Dask
cluster (``run_cases``), each into its own file (``run_case``).  The commands are in
``refimpl/porting/commands.py``; docs/port_authors.md describes the cases file.

``make_corpus`` is what ``refimpl golden`` runs: the cases into OUTDIR plus OUTDIR/index.json, resumable (a
case whose trace the index records with the same case and SHA-256 is kept, the others run) and written as
it goes (the index every few seconds, each trace atomically), so that a run stopped at any point leaves
only complete traces and an index that names them."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from ..io.files import (
    MAX_INPUT_BYTES,
    MAX_JSON_BYTES,
    InputError,
    Signalled,
    load_npy_codes,
    parse_json,
    plain_file_name,
    read_limited,
    signals_raise,
    write_atomically,
)
from ..io.mapped_files import handle_bus_errors
from . import trace_files

__all__ = ["STAGE_MODELS", "trace_case", "read_cases", "run_case", "run_cases", "make_corpus"]

# stage -> the embedded checkpoint it uses without --model (the same as the refimpl command of that stage)
EMBEDDED = Path(__file__).resolve().parents[1] / "data"
STAGE_MODELS = {
    "codec-decode": "default-customvoice",
    "codec-encode": "default-customvoice",
    "speaker": "default-base",
    "say": "default-customvoice",
    "design": "default-voicedesign",
    "clone": "default-base",
}


# ----------------------------------------------------------------------------- running one case


def read_codes(path) -> np.ndarray:
    """The codes array of a .npy file, checked like ``refimpl codec decode`` input (``files.load_npy_codes``),
    read up to ``files.MAX_INPUT_BYTES`` (a larger file, or an endless stream, is refused)."""
    return load_npy_codes(read_limited(path, MAX_INPUT_BYTES, f"codes file {path}"), str(path))


def read_mono(path) -> tuple:
    from ..io.audio import read_wav

    audio, sr = read_wav(path)
    return (audio.mean(axis=1) if audio.ndim == 2 else audio), sr


def trace_case(model, stage: str, inp, options: dict, dtype) -> trace_files.Trace:
    """One traced run.  ``inp``: codes path / array (codec-decode), WAV path or (audio, sr) (codec-encode,
    speaker), text (say, design, clone); ``options``: the generation keywords of the Python API (for
    clone ``ref_audio`` may be a WAV path); ``random_draws`` replays recorded uniforms."""
    model = Path(model) if model else EMBEDDED / STAGE_MODELS[stage]
    if stage in ("codec-decode", "codec-encode"):
        from ..codec.speech_tokenizer import SpeechTokenizer

        tok = SpeechTokenizer.from_pretrained(model, dtype=dtype)
        if stage == "codec-decode":
            return trace_files.trace_codec_decode(
                tok,
                read_codes(inp) if isinstance(inp, (str, Path)) else np.asarray(inp),
                bool(options.get("attention")),
            )
        audio, sr = read_mono(inp) if isinstance(inp, (str, Path)) else inp
        return trace_files.trace_codec_encode(tok, audio, sr, bool(options.get("attention")))
    from ..tts.model import Qwen3TTS

    tts = Qwen3TTS.from_pretrained(model, dtype=dtype)
    if stage == "speaker":
        audio, sr = read_mono(inp) if isinstance(inp, (str, Path)) else inp
        return trace_files.trace_speaker(tts, audio, sr)
    options = dict(options)
    if stage == "say" and options.get("speaker") is None and tts.get_supported_speakers():
        options["speaker"] = tts.get_supported_speakers()[0]  # as ``refimpl say``: the first preset speaker
    if stage == "clone" and isinstance(options.get("ref_audio"), (str, Path)):
        options["ref_audio"] = read_mono(options["ref_audio"])
    return trace_files.trace_generation(tts, stage, text=inp, **options)


# ----------------------------------------------------------------------------- the cases file


# the keywords a case's options may hold, per stage (the Python keywords of the stage, as ``refimpl trace``)
CALL_OPTIONS = ("non_streaming_mode", "eos_token_id") + trace_files.GENERATION_KEYWORDS
CASE_OPTIONS = {
    "codec-decode": (),
    "codec-encode": (),
    "speaker": (),
    "say": ("speaker", "language", "instruct") + CALL_OPTIONS,
    "design": ("language", "instruct") + CALL_OPTIONS,
    "clone": ("language", "ref_audio", "ref_text", "x_vector_only_mode") + CALL_OPTIONS,
}
CASE_KEYS = ("name", "stage", "input", "options")
# the options' types (null, as in the API: the default, except for the booleans); ranges: SamplingSettings
TEXT_OPTIONS = ("speaker", "language", "instruct", "ref_text")
BOOLEAN_OPTIONS = ("x_vector_only_mode", "non_streaming_mode", "do_sample", "subtalker_dosample")
INTEGER_OPTIONS = {"seed": 0, "max_new_tokens": 1, "eos_token_id": 0, "top_k": 0, "subtalker_top_k": 0}
NUMBER_OPTIONS = ("repetition_penalty", "temperature", "top_p", "subtalker_temperature", "subtalker_top_p")
MAX_CODE = 2**63 - 1  # inline codes become int64; the codebook range is checked when the case runs


def read_cases(path) -> list:
    """CASES.jsonl: one JSON object per line: name, stage, input, options (optional).  Relative file
    paths (codes, WAV, ref_audio) are relative to the cases file.  Every case is checked here, before any
    runs (``check_case``); an error names the line and the case.  The file is read up to
    ``files.MAX_INPUT_BYTES``."""
    path = Path(path)
    data = read_limited(path, MAX_INPUT_BYTES, f"cases file {path}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cases file {path} is not valid UTF-8 text (byte {e.start})") from None
    cases, lines = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        case = parse_json(line, f"{path}:{n}: the line", unique_keys=True)
        case = check_case(case, f"{path}:{n}", path.parent)
        if case["name"] in lines:
            raise InputError(
                f"{path}:{n}: case {case['name']!r} has the name of the case on line {lines[case['name']]}"
            )
        lines[case["name"]] = n
        cases.append(case)
    if not cases:
        raise InputError(f"cases file {path} holds no case")
    return cases


def check_case(case, where: str, base: Path) -> dict:
    """One case, checked and normalised: an object with a plain-file-name ``name`` (it becomes
    OUTDIR/<name>.<format>), a known ``stage``, an ``input`` of the stage's kind (a path, inline codes,
    a text) and ``options`` among the stage's keywords with values of their types; the returned copy has
    paths made relative to ``base`` and ``options`` always present."""
    if not isinstance(case, dict):
        raise InputError(f"{where}: a case must be a JSON object, found a JSON {type(case).__name__}")
    name = case.get("name")
    if not plain_file_name(name):
        raise InputError(
            f"{where}: case name {name!r} must be a plain file name (1 to 200 characters, no '/', '\\', "
            "'..', absolute path or control character): it names the output file"
        )
    where = f"{where}: case {name!r}"
    unknown = [k for k in case if k not in CASE_KEYS]
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; a case has {list(CASE_KEYS)}")
    stage = case.get("stage")
    if stage not in STAGE_MODELS:
        raise InputError(f"{where}: stage must be one of {list(STAGE_MODELS)}, got {stage!r}")
    if "input" not in case:
        raise InputError(f"{where}: no input")
    options = case.get("options", {})
    if not isinstance(options, dict):
        raise InputError(f"{where}: options must be a JSON object, found a JSON {type(options).__name__}")
    bad = [k for k in options if k not in CASE_OPTIONS[stage]]
    if bad:
        allowed = list(CASE_OPTIONS[stage]) or "none"
        raise InputError(f"{where}: option(s) {bad} are not options of stage {stage} (allowed: {allowed})")
    checked = {"name": name, "stage": stage, "input": check_case_input(stage, case["input"], where, base)}
    checked["options"] = check_case_options(stage, dict(options), where, base)
    return checked


def check_case_input(stage: str, inp, where: str, base: Path):
    if stage == "codec-decode" and isinstance(inp, list):
        return inline_codes(inp, where)
    if not isinstance(inp, str) or not inp:
        kind = "a codes .npy path or inline codes [[...], ...]" if stage == "codec-decode" else None
        kind = kind or ("a WAV path" if stage in ("codec-encode", "speaker") else "the text (a non-empty string)")
        raise InputError(f"{where}: input must be {kind}, got {inp!r}")
    if stage == "codec-decode":
        path = base / inp
        try:
            read_codes(path)  # the same checks as 'refimpl trace codec-decode', before any runs
        except ValueError as e:
            raise InputError(f"{where}: {e}") from None
        return str(path)
    if stage in ("codec-encode", "speaker"):
        return existing_file(base / inp, where, "input")
    return inp


def inline_codes(rows, where: str) -> np.ndarray:
    """Codes written in the cases file: a non-empty list of equally long lists of JSON integers in
    [0, 2^63) (no floats, no booleans), as int64 [T, groups]."""
    if not rows or not all(isinstance(r, list) and r and len(r) == len(rows[0]) for r in rows):
        raise InputError(f"{where}: inline codes must be a non-empty list of equally long lists of integers")
    for t, row in enumerate(rows):
        for q, code in enumerate(row):
            if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= MAX_CODE:
                raise InputError(
                    f"{where}: inline code {code!r} at frame {t}, group {q} is not an integer in [0, 2^63)"
                )
    return np.asarray(rows, dtype=np.int64)


def existing_file(path: Path, where: str, what: str) -> str:
    if not path.is_file():
        raise InputError(f"{where}: {what} {path} is not a file" + ("" if path.exists() else " (it does not exist)"))
    return str(path)


def check_case_options(stage: str, options: dict, where: str, base: Path) -> dict:
    """The option values' types and ranges, and what the stage needs (say: a speaker; design: an
    instruct; clone: a ref_audio and a ref_text or x_vector_only_mode), as ``refimpl trace`` checks them."""
    from ..sampling import SamplingSettings

    for key in TEXT_OPTIONS:
        if key in options and not (options[key] is None or isinstance(options[key], str)):
            raise InputError(f"{where}: options.{key} must be a string, got {options[key]!r}")
    for key, minimum in INTEGER_OPTIONS.items():
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise InputError(f"{where}: options.{key} must be an integer >= {minimum}, got {value!r}")
    for key in NUMBER_OPTIONS:
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{where}: options.{key} must be a number, got {value!r}")
    for key in BOOLEAN_OPTIONS:
        if key in options and not isinstance(options[key], bool):
            raise InputError(f"{where}: options.{key} must be true or false, got {options[key]!r}")
    sampling = {k: v for k, v in options.items() if k in trace_files.GENERATION_KEYWORDS and k != "seed"}
    try:
        SamplingSettings(**sampling).validate()
    except ValueError as e:
        raise InputError(f"{where}: options: {e}") from None
    needs = {"say": "speaker", "design": "instruct"}.get(stage)
    if needs and not options.get(needs):
        raise InputError(f"{where}: a {stage} case needs options.{needs} (as 'refimpl trace {stage} --{needs}')")
    if stage == "clone":
        if not isinstance(options.get("ref_audio"), str):
            raise InputError(f"{where}: a clone case needs options.ref_audio, a WAV path")
        options["ref_audio"] = existing_file(base / options["ref_audio"], where, "options.ref_audio")
        if options.get("ref_text") is None and not options.get("x_vector_only_mode"):
            raise InputError(f"{where}: a clone case needs options.ref_text or options.x_vector_only_mode")
    return options


# ----------------------------------------------------------------------------- running many cases


def run_case(model, case: dict, out_dir: str, fmt: str, dtype: str) -> dict:
    """Trace one case into ``out_dir/<name>.<fmt>``; returns its index entry (runs in a worker process).
    The name must be a plain file name, so the file lands in ``out_dir`` and nowhere else."""
    if not plain_file_name(case.get("name")):
        raise InputError(f"case name {case.get('name')!r} is not a plain file name")
    t0 = time.perf_counter()
    inp = case["input"]
    if case["stage"] == "codec-decode" and isinstance(inp, list):
        inp = inline_codes(inp, f"case {case['name']!r}")
    trace = trace_case(model, case["stage"], inp, case["options"], np.dtype(dtype).type)
    path = trace.save(Path(out_dir) / f"{case['name']}.{fmt}", fmt)
    return {
        "name": case["name"],
        "stage": case["stage"],
        "file": path.name,
        "tensors": len(trace.keys),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def run_case_or_fail(model, case: dict, out_dir: str, fmt: str, dtype: str) -> dict:
    """``run_case``, with a failure returned as an entry ``{name, stage, error, internal}`` (so that one
    bad case does not lose the others); ``internal`` marks an exception that is a bug, not bad input."""
    try:
        return run_case(model, case, out_dir, fmt, dtype)
    except Exception as e:  # reported by name, with the case; a bug stays marked as one
        internal = not isinstance(e, (ValueError, OSError, MemoryError))
        message = " ".join(str(e).split()) or type(e).__name__
        return {
            "name": case.get("name"),
            "stage": case.get("stage"),
            "error": f"{type(e).__name__}: {message}" if internal else message,
            "internal": internal,
        }


WORKER_DIED = (
    "its worker process died before the case finished (killed from outside, or by the system when memory ran "
    "out), and again when the case ran alone"
)


def run_cases(
    model,
    cases: list,
    out_dir,
    fmt: str = "safetensors",
    dtype: str = "float32",
    jobs: int = 1,
    dask_address: str | None = None,
    *,
    progress=None,
    note=None,
    run=None,
    on_entry=None,
) -> list:
    """Every case in parallel: ``jobs`` local processes (concurrent.futures), or the workers of the Dask
    scheduler at ``dask_address`` (dask.distributed).  Returns the index entries in case order; a case
    that failed has ``error`` (and no file) instead of ``file``.
    ``progress``: None or ``progress(iterable, desc) -> iterable``, wrapped around the finished cases;
    ``note``: None or ``note(text)``, told when cases run again.  ``run`` (tests): what runs one case in a
    worker, ``run_case_or_fail`` by default.  ``on_entry``: None or ``on_entry(i, entry)``, called in this
    process as each case ends (in the order they end).

    A worker process that dies (killed from outside, or by the system when memory runs out) loses the
    cases in flight: those and the cases not started yet run again, each alone in a fresh process, and a
    case whose process dies again is listed as failed (``WORKER_DIED``).  SIGTERM or SIGHUP (or Ctrl-C)
    to this process stops every worker first (a trace being written removes its temporary file), so that
    none goes on writing after the command has ended; on a Dask cluster the cases not finished are
    cancelled."""
    # Each case runs alone, never in a batch with others (docs/performance.md, "Batches"): a case is a traced
    # run, which takes the reference path (a fused twin records nothing), and there a batch's row does not
    # trace as the case alone does (a product over B rows is not one row's bits; a padded prompt changes
    # every prompt tensor), so its file would not be the single run's.
    args = [(str(model) if model else None, case, str(out_dir), fmt, dtype) for case in cases]
    progress = progress or (lambda iterable, desc: iterable)
    run = run or run_case_or_fail
    report = on_entry or (lambda i, entry: None)
    if dask_address:
        return on_dask(dask_address, run, args, cases, progress, report)
    if jobs <= 1:

        def one_by_one():
            for i, a in enumerate(args):
                entry = run(*a)
                report(i, entry)
                yield entry

        return list(progress(one_by_one(), "tracing cases"))
    entries = in_processes(run, args, jobs, progress, report)
    lost = [i for i, e in enumerate(entries) if e is None]
    if lost and note:
        note(f"note: a worker process died; {len(lost)} case(s) it lost or had not started run again, each alone")
    for i in lost:  # alone, each in a fresh process: a case that kills its worker again is named
        entries[i] = in_processes(run, [args[i]], 1, lambda iterable, desc: iterable)[0] or failed_entry(
            cases[i], WORKER_DIED
        )
        report(i, entries[i])
    return entries


def on_dask(address: str, run, args: list, cases: list, progress, report) -> list:
    """The cases on the Dask scheduler at ``address``.  A worker the scheduler gives up on (``KilledWorker``)
    or a lost connection fails its case, not the corpus (``dask_result``); SIGTERM, SIGHUP or Ctrl-C cancels
    the cases not finished before this process ends (a case already running on a worker may still finish
    and write its trace: the index does not list it, so a rerun traces it again)."""
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--dask needs dask.distributed: pip install 'qwen3-tts-refimpl[dask]'") from None
    import signal

    entries, futures, stopped = [], [], None
    with Client(address) as client:
        try:
            with signals_raise():
                futures = [client.submit(run, *a, pure=False) for a in args]
                for i, (future, case) in enumerate(zip(progress(futures, "tracing cases"), cases, strict=True)):
                    entries.append(dask_result(future, case))
                    report(i, entries[-1])
        except (Signalled, KeyboardInterrupt) as e:
            with contextlib.suppress(Exception):  # the scheduler may be gone already
                client.cancel(futures, force=True)
            stopped = e
    if isinstance(stopped, Signalled):  # the handlers are restored: the default action ends the process here
        signal.raise_signal(stopped.signum)
        raise InterruptedError(4, f"interrupted by signal {stopped.signum}") from None
    if stopped is not None:
        raise stopped
    return entries


def failed_entry(case: dict, error: str, internal: bool = False) -> dict:
    return {"name": case.get("name"), "stage": case.get("stage"), "error": error, "internal": internal}


def dask_result(future, case: dict) -> dict:
    """A Dask future's index entry; a worker that died (``KilledWorker``) or a lost connection fails the
    case, not the corpus."""
    try:
        return future.result()
    except Exception as e:  # raised by Dask about the worker, not by the case (run_case_or_fail catches those)
        return failed_entry(case, f"the Dask worker failed: {type(e).__name__}: {' '.join(str(e).split())}")


def in_processes(run, args: list, jobs: int, progress, report=None) -> list:
    """``run(*a)`` for every ``a`` of ``args`` in ``jobs`` spawned processes; the entries in order, None for
    a case whose worker process died first.  ``report(i, entry)`` is called as each case ends."""
    import gc
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    stopped, futures = None, []
    # spawned, not forked: a fork of a process whose Numba kernels already started OpenMP threads is unsafe
    # a worker whose mapped checkpoint is truncated says so (one line) before it dies (io/mapped_files.py)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, initializer=handle_bus_errors) as pool:
        try:
            with signals_raise():
                futures = [pool.submit(run, *a) for a in args]
                position = {future: i for i, future in enumerate(futures)}
                for future in progress(as_completed(futures), "tracing cases"):
                    if report is not None and future.exception() is None:
                        report(position[future], future.result())
        except (Signalled, KeyboardInterrupt) as e:
            stop_workers(pool)
            stopped = e
    if stopped is not None:
        del pool, futures  # the pool's queues released now (their semaphores), not left to the tracker
        gc.collect()
        if isinstance(stopped, Signalled):  # the handlers are restored: the default action ends the process here
            signal.raise_signal(stopped.signum)
            raise InterruptedError(4, f"interrupted by signal {stopped.signum}") from None
        raise stopped
    return [None if isinstance(f.exception(), BrokenProcessPool) else f.result() for f in futures]


def stop_workers(pool) -> None:
    """End the worker processes of a ``ProcessPoolExecutor`` now (SIGTERM, then SIGKILL after 10 s) and wait
    for them (``shutdown`` alone would wait for the cases they are running), then for the pool's own thread,
    which releases its queues' semaphores (left to the resource tracker otherwise, with a warning)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # CPython's pool keeps them there
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    pool.shutdown(wait=True, cancel_futures=True)  # quick: no worker is left to wait for


# ----------------------------------------------------------------------------- the corpus, resumable

INDEX = "index.json"
INDEX_INTERVAL = 2.0  # seconds between two writes of the partial index while cases run


def make_corpus(
    model,
    cases: list,
    out_dir,
    fmt: str = "safetensors",
    dtype: str = "float32",
    jobs: int = 1,
    dask_address: str | None = None,
    *,
    progress=None,
    note=None,
    run=None,
) -> dict:
    """Trace ``cases`` (``read_cases``) into ``out_dir`` and write ``out_dir/index.json``; returns the index.

    Resumable: a case that the existing index lists as done, with the same model, dtype and format, the
    same case (``case_digest``: stage, options, the input's content) and a file whose SHA-256 is the one
    recorded, is kept; every other case runs (those missing, changed, failed or whose file differs).  The
    index is rewritten while the cases run (every ``INDEX_INTERVAL`` seconds, atomically, ``complete``
    false) and once at the end (``complete`` true), and every trace is written atomically, so a run stopped
    at any point (a signal, a crash, a power cut) leaves only complete traces, and the index lists only
    those; the temporary files of an interrupted write are removed when the corpus is made again.
    ``progress``: None or ``progress(iterable, desc, total=)``; ``note``: None or ``note(text)``."""
    out = Path(out_dir)
    note = note or (lambda text: None)
    header = {"model": str(model) if model else "(embedded default)", "dtype": dtype, "format": fmt}
    digests = [case_digest(case) for case in cases]
    kept = verified_entries(out, header, cases, digests, fmt, note)
    remove_partial_files(out, [f"{case['name']}.{fmt}" for case in cases] + [INDEX])
    todo = [i for i, case in enumerate(cases) if case["name"] not in kept]
    if kept:
        note(f"note: {len(kept)} of {len(cases)} case(s) already in {out / INDEX}, their files verified: kept")
    entries = [kept.get(case["name"]) for case in cases]
    written = [time.monotonic()]

    def write_index(complete: bool) -> dict:
        index = {
            **header,
            "complete": complete,
            "cases": [e for e in entries if e is not None and "error" not in e],
            "failed": [e for e in entries if e is not None and "error" in e],
        }
        write_atomically(out / INDEX, (json.dumps(index, indent=1) + "\n").encode("utf-8"))
        return index

    def done(j: int, entry: dict) -> None:
        entries[todo[j]] = with_digest(entry, digests[todo[j]])
        if time.monotonic() - written[0] >= INDEX_INTERVAL:
            write_index(False)
            written[0] = time.monotonic()

    if not todo:
        return write_index(True)
    bar = functools.partial(progress, total=len(todo)) if progress else None
    results = run_cases(
        model,
        [cases[i] for i in todo],
        out,
        fmt,
        dtype,
        jobs,
        dask_address,
        progress=bar,
        note=note,
        run=run,
        on_entry=done,
    )
    for i, entry in zip(todo, results, strict=True):
        entries[i] = with_digest(entry, digests[i])
    return write_index(True)


def with_digest(entry: dict, digest: str) -> dict:
    return entry if "error" in entry else {**entry, "case_sha256": digest}


def sha256_of(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def case_digest(case: dict) -> str:
    """SHA-256 of what makes a case's trace: its name, stage, options and input, a file (codes, WAV,
    ``ref_audio``) by its content, not its path; inline codes by their values."""

    def content(path) -> dict:
        try:
            return {"sha256": sha256_of(path)}
        except OSError as e:
            raise InputError(f"case {case['name']!r}: cannot read {path}: {e.strerror or e}") from None

    inp = case["input"]
    if isinstance(inp, (np.ndarray, list)):
        inp = {"codes": trace_files.array_hash(np.asarray(inp, dtype=np.int64))}
    elif case["stage"] in ("codec-decode", "codec-encode", "speaker"):
        inp = content(inp)
    options = dict(case.get("options") or {})
    if isinstance(options.get("ref_audio"), (str, Path)):
        options["ref_audio"] = content(options["ref_audio"])
    what = {"name": case["name"], "stage": case["stage"], "input": inp, "options": options}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()


def verified_entries(out: Path, header: dict, cases: list, digests: list, fmt: str, note) -> dict:
    """{name: entry} of the cases that ``out/index.json`` lists as done and that need not run again: made
    with ``header``'s model, dtype and format, the same case (``case_digest``), and a regular file
    ``out/<name>.<fmt>`` whose SHA-256 is the one recorded.  No index, or one that cannot be read: none."""
    path = out / INDEX
    if not path.exists():
        return {}
    try:
        index = parse_json(read_limited(path, MAX_JSON_BYTES, f"{path}", regular_only=True), f"{path}")
    except InputError as e:
        note(f"note: {e}; every case runs again")
        return {}
    if not isinstance(index, dict) or any(index.get(k) != v for k, v in header.items()):
        note(f"note: {path} is of another model, dtype or format (or refimpl): every case runs again")
        return {}
    wanted = {case["name"]: digest for case, digest in zip(cases, digests, strict=True)}
    kept = {}
    for entry in index.get("cases") if isinstance(index.get("cases"), list) else []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or wanted.get(name) is None or entry.get("case_sha256") != wanted[name]:
            continue
        file = out / f"{name}.{fmt}"
        if entry.get("file") != file.name or file.is_symlink() or not file.is_file():
            continue
        with contextlib.suppress(OSError):
            if sha256_of(file) == entry.get("sha256"):
                kept[name] = entry
    return kept


def remove_partial_files(out: Path, names: list) -> None:
    """The temporary files an interrupted ``atomic_output`` left in ``out`` for these file names (a process
    killed by SIGKILL, or a power cut, cannot remove its own): ``.<name>.<random>.tmp``."""
    if not out.is_dir():
        return
    prefixes = tuple("." + name[:200] + "." for name in names)
    for path in out.iterdir():
        if path.name.startswith(prefixes) and path.name.endswith(".tmp") and path.is_file():
            with contextlib.suppress(OSError):
                os.unlink(path)
