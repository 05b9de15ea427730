"""The environment under hostile settings: every REFIMPL_* variable the package reads and the NUMBA_* ones a
user may set give their documented behaviour (the table of docs/limits.md#the-environment) or one clear
error naming the variable, never an internal error, a crash or a traceback.  Each case runs refimpl in a
fresh process (Numba reads its settings once, when it is imported) under a 3 GiB address space."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO

from refimpl import environment

# the caller's own Numba and refimpl settings are not part of a case (but the suite's cache directory and its
# compile helper turned off, set by conftest.py, are kept: no test writes into the user's cache, none starts one)
KEPT = ("REFIMPL_CACHE_DIR", "REFIMPL_COMPILE_HELPER")
BASE = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "REFIMPL_")) or k in KEPT}
BASE["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
MEMORY_LIMIT = 3 << 30
JIT_OFF = "backend 'numba': Numba's JIT is turned off (NUMBA_DISABLE_JIT)"


def run(*args, env: dict, python: str | None = None, cwd=None):
    """``refimpl ARGS`` (or ``python -c PYTHON``) in a fresh process with ``env`` added to the environment."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    command = [sys.executable, "-c", python] if python else [sys.executable, "-m", "refimpl", *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, env=dict(BASE, **env), timeout=300, preexec_fn=limit, cwd=cwd
    )


def assert_one_line_error(r, *fragments):
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("refimpl: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture(scope="module")
def codes(tmp_path_factory):
    path = tmp_path_factory.mktemp("codes") / "codes.npy"
    np.save(path, np.random.default_rng(0).integers(0, 64, (3, 16)))
    return path


# ----------------------------------------------------------------------------- NUMBA_DISABLE_JIT

SAY = ["say", "Hello there.", "--max-new-tokens", "4", "--seed", "1"]


@pytest.mark.parametrize("command", ["say", "codec decode"])
def test_jit_turned_off_runs_the_numpy_reference_with_one_warning(tmp_path, codes, command):
    """NUMBA_DISABLE_JIT=1 (Numba's debugging switch) made every numba kernel run as Python, where its
    intrinsics cannot: an internal error.  Under the default backend the numpy reference runs instead (the
    same output as --backend numpy), said once on stderr; status 0."""
    args = SAY if command == "say" else ["codec", "decode", codes]
    r = run(*args, "-o", tmp_path / "off.wav", env={"NUMBA_DISABLE_JIT": "1"})
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and JIT_OFF in warnings[0] and "the numpy reference runs instead" in warnings[0]
    assert run(*args, "-o", tmp_path / "numpy.wav", "--backend", "numpy", "-q", env={}).returncode == 0
    assert (tmp_path / "off.wav").read_bytes() == (tmp_path / "numpy.wav").read_bytes()


def test_jit_turned_off_and_the_numba_backend_asked_for_is_an_error(tmp_path, codes):
    """Asked for by name (--backend numba, REFIMPL_BACKEND=numba, use_backend): one error, status 1."""
    off = {"NUMBA_DISABLE_JIT": "1"}
    assert_one_line_error(run(*SAY, "-o", tmp_path / "o.wav", "--backend", "numba", env=off), JIT_OFF)
    both = dict(off, REFIMPL_BACKEND="numba")
    assert_one_line_error(run("codec", "decode", codes, "-o", tmp_path / "o.wav", env=both), JIT_OFF)
    script = "import refimpl\ntry:\n    refimpl.use_backend('numba').__enter__()\nexcept ValueError as e:\n    print(e)"
    r = run(env=off, python=script)
    assert r.returncode == 0 and JIT_OFF in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "o.wav").exists()


def test_jit_turned_off_in_a_numba_config_file(tmp_path, codes):
    """Numba also reads ``disable_jit`` from a .numba_config.yaml in the working directory: the same."""
    pytest.importorskip("yaml")
    (tmp_path / ".numba_config.yaml").write_text("disable_jit: 1\n")
    r = run("codec", "decode", codes, "-o", tmp_path / "o.wav", env={}, cwd=tmp_path)
    assert r.returncode == 0 and JIT_OFF in r.stderr, r.stderr


def test_the_trace_metadata_say_which_backend_ran(tmp_path):
    from refimpl.porting.trace_files import load_trace

    args = ["trace", "say", "Hi.", "--max-new-tokens", "3", "-q", "-o", tmp_path / "t.safetensors"]
    assert run(*args, env={"NUMBA_DISABLE_JIT": "1"}).returncode == 0
    backend, why = load_trace(tmp_path / "t.safetensors").metadata["backend"]
    assert backend == "auto" and why.startswith("the numpy reference for every dtype: ") and JIT_OFF in why


# ----------------------------------------------------------------------------- other Numba settings


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("NUMBA_DISABLE_JIT", "yes", "NUMBA_DISABLE_JIT='yes' is not a whole number"),
        ("NUMBA_NUM_THREADS", "0", "NUMBA_NUM_THREADS='0': the numba backend runs 1 to"),
        ("NUMBA_NUM_THREADS", "-2", "NUMBA_NUM_THREADS='-2'"),
        ("NUMBA_NUM_THREADS", "four", "NUMBA_NUM_THREADS='four' is not a whole number"),
        ("NUMBA_NUM_THREADS", "100000", "NUMBA_NUM_THREADS='100000'"),  # Numba's pool: a segmentation fault
        ("NUMBA_THREADING_LAYER", "fast", "NUMBA_THREADING_LAYER='fast' is not one of Numba's threading layers"),
        ("NUMBA_CPU_FEATURES", "avx2", "NUMBA_CPU_FEATURES='avx2': a comma-separated list of +feature"),  # abort
        ("NUMBA_CPU_FEATURES", "+avx2,,+fma", "a comma-separated list of +feature"),
        ("NUMBA_CPU_FEATURES", "+nonsense", "'+nonsense' is not a recognized feature"),
        ("NUMBA_CPU_NAME", "pentium9", "'pentium9' is not a recognized processor"),
        ("NUMBA_CPU_NAME", "host", "'host' is not a recognized processor"),
    ],
)
def test_numba_settings_it_cannot_run_with_are_one_error(tmp_path, codes, variable, value, fragment):
    """Numba itself warns with a traceback and drops a value it cannot parse, crashes on 100,000 threads,
    aborts in an LLVM assertion on a feature without its sign, and has LLVM print a warning at every
    compilation for a processor it does not know: each is one error naming the variable, before any work."""
    r = run("codec", "decode", codes, "-o", tmp_path / "o.wav", env={variable: value})
    assert_one_line_error(r, f"environment variable {variable}", fragment)
    assert not (tmp_path / "o.wav").exists()


def test_numba_settings_that_work(tmp_path, codes):
    """One thread, a threading layer by name, an empty value (unset, not Numba's warning), a cache
    directory that cannot be one (Numba caches in its next place): the same audio as without them."""
    assert run("codec", "decode", codes, "-o", tmp_path / "plain.wav", "-q", env={}).returncode == 0
    (tmp_path / "file").write_text("not a directory")
    for env in (
        {"NUMBA_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue"},
        {"NUMBA_NUM_THREADS": "", "NUMBA_DISABLE_JIT": "0"},
        {"NUMBA_CACHE_DIR": str(tmp_path / "file")},
    ):
        r = run("codec", "decode", codes, "-o", tmp_path / "o.wav", env=env)
        assert r.returncode == 0 and "warning" not in r.stderr, (env, r.stderr)
        assert (tmp_path / "o.wav").read_bytes() == (tmp_path / "plain.wav").read_bytes(), env


def test_a_generic_processor_compiles_no_special_instructions():
    """NUMBA_CPU_NAME=generic: Numba compiles with no CPU features, and the backend knows it (no AMX tiles,
    no packed words, no byte permutes) instead of assuming the host's."""
    script = "from refimpl.backends import numba_cpu as n; m = n.runtime.machine(); print(n.amx.TILES_COMPILED, "
    script += "n.packed_words.PACKED_COMPILED, m.tiles_granted, m.packed_compiled, m.permutes_compiled)"
    r = run(env={"NUMBA_CPU_NAME": "generic"}, python=script)
    assert r.returncode == 0 and r.stdout.split() == ["False"] * 5, r.stdout + r.stderr


# a processor with AVX2 and FMA but no AVX-512 (Haswell's features, as LLVM names them: many laptops)
AVX2 = {
    "NUMBA_CPU_NAME": "haswell",
    "NUMBA_CPU_FEATURES": "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+movbe,+pclmul,"
    "+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+x87,+xsave",
}
# the kernels' tests whose code takes another way there: the matrix products (no packed words; a batch's rows
# in four passes over a weight row), the fused generation step and a batch's bits and codes, the codec
# decoder's and the speaker encoder's convolutions (no direct kernel: BLAS's products)
WITHOUT_AVX512 = (
    *(f"tests/backends/numba_cpu/test_{name}.py" for name in ("linear", "transformer", "conv", "codec_decoder")),
    "tests/backends/numba_cpu/test_speaker_encoder.py",
    "tests/tts/test_talker.py::test_a_batch_of_four_texts_gives_the_codes_of_four_single_runs",
)


@pytest.fixture(scope="module")
def avx2_cache(tmp_path_factory):
    """One Numba cache for the kernels compiled for ``AVX2``, shared by the tests that compile them."""
    return tmp_path_factory.mktemp("numba-cache-avx2")


def test_a_processor_without_avx512_passes_the_kernels_tests(avx2_cache):
    """Compiled for AVX2 (``AVX2``), the backend knows the packed words, the direct kernel and 512-bit vectors
    are not there, and the tests of the kernels that then take another way pass: their twins against the
    references, each row of a batch with the bits of its text alone (there in four passes over each weight
    row, 16 vector registers holding 4 rows' sums of one vector of the lanes), a batch's codes those of the
    single runs.  Compiled into a cache of their own (``avx2_cache``)."""
    env = dict(AVX2, NUMBA_CACHE_DIR=str(avx2_cache))
    script = "from refimpl.backends import numba_cpu as n; print(n.packed_words.PACKED_COMPILED, "
    script += "n.conv.direct_kernel_takes(64, 64, 7), n.amx.TILES_COMPILED, n.linear.VECTOR_REGISTERS == 32)"
    r = run(env=env, python=script)
    assert r.returncode == 0 and r.stdout.split() == ["False"] * 4, r.stdout + r.stderr
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *WITHOUT_AVX512]
    r = subprocess.run(command, capture_output=True, text=True, env=dict(BASE, **env), cwd=REPO, timeout=1800)
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert r.returncode == 0 and re.search(r"\b\d{2,} passed", summary) and "failed" not in summary, r.stdout[-3000:]


GENERATION_PRODUCTS = """
import sys
import numpy as np
from refimpl.backends.numba_cpu import linear


def generation_products():
    rng = np.random.default_rng(7)
    products = []
    for O, I in [(48, 1024), (37, 200), (5, 16)]:  # (a model's width, a multiple of the 64 lanes, and others)
        bits = (rng.standard_normal((O, I)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        x = rng.standard_normal((6, I)).astype(np.float32)
        one, rows = np.empty(O, np.float32), np.empty((6, O), np.float32)
        linear._matvec_bf16_into(x[0], bits, one)
        linear._bf16_rows_times(x, bits, rows)
        prompt = rng.standard_normal((25, I)).astype(np.float32)
        prompt_out = np.empty((25, O), np.float32)
        linear._bf16_block_times(prompt, bits, prompt_out, 2)
        products += [one, rows.ravel(), prompt_out.ravel()]
    return np.concatenate(products)


if __name__ == "__main__":
    np.save(sys.argv[1], generation_products())
"""


def test_a_generations_products_have_the_same_bits_on_every_processor(tmp_path, avx2_cache):
    """A step's bf16 products (one row; a batch's rows) and a prompt's (25 rows: the block kernel) sum in an
    order written out in 16-lane vectors, not left to LLVM's loop vectoriser, whose order follows the vector
    width: compiled for AVX2 (``AVX2``, in the AVX2 tests' cache) or with no CPU features at all, they give
    the bits they give compiled for this processor (in this process).  Before, the one-row kernel's and the
    block kernel's bits differed between AVX-512 and AVX2 (LLVM vectorised their loops with other lanes of
    sums on each)."""
    script = tmp_path / "products.py"
    script.write_text(GENERATION_PRODUCTS)
    here: dict = {}
    exec(compile(GENERATION_PRODUCTS, str(script), "exec"), here)
    expected = here["generation_products"]()
    assert expected.shape == ((1 + 6 + 25) * (48 + 37 + 5),)
    for name, env in [
        ("avx2", dict(AVX2, NUMBA_CACHE_DIR=str(avx2_cache))),
        ("generic", {"NUMBA_CPU_NAME": "generic"}),
    ]:
        env.setdefault("NUMBA_CACHE_DIR", str(tmp_path / f"cache-{name}"))
        command = [sys.executable, str(script), str(tmp_path / f"{name}.npy")]
        r = subprocess.run(command, capture_output=True, text=True, env=dict(BASE, **env), cwd=REPO, timeout=600)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), expected, err_msg=name)


# ----------------------------------------------------------------------------- REFIMPL_ switches


@pytest.mark.parametrize("variable", sorted(environment.SWITCHES))
def test_a_switch_that_is_not_1_or_0_is_one_error(tmp_path, variable):
    """REFIMPL_AMX=flase kept the default silently (only "0" counted): every switch takes 1 or 0 (true/false,
    yes/no, on/off) and anything else is refused before any work."""
    r = run("say", "Hi.", "-o", tmp_path / "o.wav", env={variable: "flase"})
    assert_one_line_error(r, f"environment variable {variable}='flase': expected 1 or 0")
    assert not (tmp_path / "o.wav").exists()


def test_switch_values(monkeypatch):
    for value, expected in [("1", True), (" ON ", True), ("yes", True), ("0", False), ("False", False), ("", True)]:
        monkeypatch.setenv("REFIMPL_AMX", value)
        assert environment.switch("REFIMPL_AMX") is expected, value
    monkeypatch.delenv("REFIMPL_AMX")
    assert environment.switch("REFIMPL_AMX") is True and environment.switch("REFIMPL_DEBUG") is False


INTERNAL_ERROR = textwrap.dedent(
    """
    import sys, refimpl.cli as c
    c.cmd_info = lambda args, say: 1 / 0
    p = c.build_parser
    def patched():
        parser = p()
        for action in parser._subparsers._group_actions:
            action.choices["info"].set_defaults(func=c.cmd_info)
        return parser
    c.build_parser = patched
    sys.argv = ["refimpl", "info"]
    sys.exit(c.main())
    """
)


@pytest.mark.parametrize("value, traceback", [("1", True), ("0", False), ("", False)])
def test_refimpl_debug_shows_the_traceback_of_an_internal_error(value, traceback):
    """REFIMPL_DEBUG=0 used to show the traceback too (any value did)."""
    r = run(env={"REFIMPL_DEBUG": value}, python=INTERNAL_ERROR)
    assert ("Traceback" in r.stderr) is traceback, r.stderr
    assert (r.returncode, "refimpl: internal error: ZeroDivisionError" in r.stderr) == (
        (1, False) if traceback else (3, True)
    )


def test_an_unknown_backend_name_is_one_error(tmp_path):
    r = run("say", "Hi.", "-o", tmp_path / "o.wav", env={"REFIMPL_BACKEND": "fast"})
    assert_one_line_error(r, "environment variable REFIMPL_BACKEND: unknown backend 'fast'")


# ----------------------------------------------------------------------------- the table


def test_every_variable_the_package_reads_is_in_the_table():
    """The one table of docs/limits.md lists every REFIMPL_* and NUMBA_* name in the package's code."""
    names = set()
    for path in (REPO / "refimpl").rglob("*.py"):
        names |= set(re.findall(r"\b((?:REFIMPL|NUMBA)_[A-Z_]+[A-Z])\b", path.read_text()))
    text = (REPO / "docs" / "limits.md").read_text()
    table = text[text.index("## The environment") :]
    table = table[: table.find("\n## ", 1) if "\n## " in table[1:] else len(table)]
    rows = {m for line in table.splitlines() if line.startswith("|") for m in re.findall(r"`([A-Z_]+)", line)}
    assert names - rows == set(), "not in the table of docs/limits.md: " + ", ".join(sorted(names - rows))
    assert set(environment.SWITCHES) <= rows
