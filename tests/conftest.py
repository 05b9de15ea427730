"""Shared fixtures: paths of the committed golden files and tiny checkpoints, and the tolerance rule."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# soxr (the resampler refimpl.io.audio shares with the official) is a declared dependency that a machine may
# lack (the GPU image has none): REFIMPL_HIDE_SOXR=1 runs the suite as there (tests/io/test_soxr_optional.py).
if os.environ.get("REFIMPL_HIDE_SOXR") == "1":
    sys.modules["soxr"] = None  # "import soxr" now fails, before refimpl.io.audio tries it

# The store of finiteness verdicts (refimpl/io/finite_verdicts.py) of the loads in this session, and in the
# processes its tests start, is a temporary folder of the session's: never the user's cache.
TEST_CACHE_DIR = tempfile.mkdtemp(prefix="refimpl-test-cache-")
os.environ["REFIMPL_CACHE_DIR"] = TEST_CACHE_DIR
atexit.register(shutil.rmtree, TEST_CACHE_DIR, ignore_errors=True)

# A first run's compile helper (refimpl/backends/numba_cpu/compile_helper.py) would start, in a fresh clone's
# first loads, processes compiling beside the tests into the same cache: off for the session and the processes
# its tests start, but where a test turns it on (tests/backends/numba_cpu/test_compile_helper.py).
os.environ["REFIMPL_COMPILE_HELPER"] = "0"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"
CHECKPOINTS = GOLDEN / "checkpoints"
if str(REPO) not in sys.path:  # tests run against the working tree even when refimpl is also installed
    sys.path.insert(0, str(REPO))

F32_EPS = float(np.finfo(np.float32).eps)

# The parity suite (every comparison with the official outputs, and the streaming properties) runs once
# per INSTALLED backend (``refimpl.backends.installed_backends``): the plain primitives ("numpy"), their fast
# CPU twins ("numba") and, where CuPy and a GPU are there, the GPU ("cupy"), each in float32 and float64.
PARITY_MODULES = {
    "test_codec_decoder",
    "test_codec_encoder",
    "test_codec_streaming",
    "test_speaker_encoder",
    "test_talker",
    "test_end_to_end",
}


def pytest_addoption(parser):
    from refimpl.backends import BACKENDS, TEST_BACKENDS

    parser.addoption(
        "--backend",
        action="append",
        choices=BACKENDS + TEST_BACKENDS,
        default=None,
        help="run the parity suite on this backend only (repeatable; default: every backend)",
    )


SOXR_MARKERS = ("needs_soxr", "soxr_optional")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_soxr: needs soxr's exact samples (skips, saying so, without soxr)")
    config.addinivalue_line("markers", "soxr_optional: reaches soxr where it is installed, passes without it too")


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_soxr"):
        from refimpl.io import audio

        if audio.soxr is None:
            pytest.skip("soxr is not installed here: the official resampling (soxr HQ) cannot be compared")


def undeclared_soxr_use(used: list, markers) -> str | None:
    """The failure message for a test that reached soxr (``used``: the soxr functions it called) without
    declaring it (neither marker of SOXR_MARKERS among ``markers``), else None."""
    if not used or any(m in SOXR_MARKERS for m in markers):
        return None
    return (
        f"this test called soxr.{used[0]} but is not marked needs_soxr (it would fail where soxr is not "
        "installed: mark it to skip there) or soxr_optional (it passes with the polyphase fallback too)"
    )


# Numba's settings as this session has them (the numba backend sets the processor's when it is imported):
# the processes that later tests start read them, so a test that leaves another value behind fails (a stray
# NUMBA_CACHE_DIR once sent every later subprocess to compile the kernels again, into an empty cache).
@pytest.fixture(autouse=True)
def numba_settings_are_kept():
    """Fail a test that changes NUMBA_CACHE_DIR or a setting the backend checks (``runtime.CHECKED_SETTINGS``)
    and does not put it back."""
    from refimpl.backends.numba_cpu import runtime  # (its settings made before the first test's are taken)

    settings = ("NUMBA_CACHE_DIR", *runtime.CHECKED_SETTINGS)
    before = {name: os.environ.get(name) for name in settings}
    yield
    changed = [f"{name}: {before[name]!r} -> {os.environ.get(name)!r}" for name in settings
               if os.environ.get(name) != before[name]]  # fmt: skip
    if changed:
        pytest.fail(f"this test left Numba's settings changed ({'; '.join(changed)}): set them with monkeypatch")


@pytest.fixture(autouse=True)
def soxr_use_is_declared(request, monkeypatch):
    """Fail a test that reaches soxr without one of SOXR_MARKERS: no test needs soxr silently."""
    from refimpl.io import audio

    real = audio.soxr
    if real is None:
        yield
        return
    used = []

    class Recording:
        def __getattr__(self, name):
            used.append(name)
            return getattr(real, name)

    monkeypatch.setattr(audio, "soxr", Recording())
    yield
    failure = undeclared_soxr_use(used, [m.name for m in request.node.iter_markers()])
    if failure:
        pytest.fail(failure)


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__ in PARITY_MODULES:
        from refimpl.backends import installed_backends

        names = metafunc.config.getoption("--backend") or list(installed_backends())
        metafunc.parametrize("backend", names, indirect=True, scope="module")


@pytest.fixture(autouse=True, scope="module")
def backend(request):
    """The backend a parity module runs on (parametrised by pytest_generate_tests); None elsewhere."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    from refimpl.backends import use_backend

    with use_backend(name):
        yield name


def assert_close_to_oracle(
    ours, off32, off64, precision: str, what: str, noise_factor: float = 4.0, f64_rel: float = 1e-10
):
    """The tolerance policy of docs/golden.md, implemented once in ``refimpl.porting.compare`` (``refimpl compare``
    uses the same rule).

    float64: |ours - official_f64| <= f64_rel * max(1, max|official|).
    float32: the official float32 output itself differs from the float64 run by ``noise`` (measured here,
    from the golden file); ours may differ from official_f32 AND from official_f64 by at most
    noise_factor * noise + noise_factor * eps32 * max|official| (the second term keeps a floor where the
    measured noise happens to be tiny)."""
    from refimpl.backends import to_host
    from refimpl.porting.compare import check_against_oracle

    ours = to_host(ours)  # a stage function called directly on a device backend returns a device array
    off64 = np.asarray(off64, dtype=np.float64)
    assert ours.shape == off64.shape, f"{what}: shape {ours.shape} != official {off64.shape}"
    c = check_against_oracle(ours, off32, off64, precision, noise_factor, f64_rel)
    if precision == "f64":
        assert c.err64 <= c.tol, f"{what} (float64): max |ours - official| = {c.err64:.3e} > {c.tol:.3e}"
        return c.err64, c.tol
    assert c.err32 <= c.tol, (
        f"{what} (float32): max |ours - official_f32| = {c.err32:.3e} > tol {c.tol:.3e} (noise {c.noise:.3e})"
    )
    assert c.err64 <= c.tol, (
        f"{what} (float32): max |ours - official_f64| = {c.err64:.3e} > tol {c.tol:.3e} (noise {c.noise:.3e})"
    )
    return c.err32, c.tol


@pytest.fixture(scope="session")
def tiny_speech_tokenizer_dir():
    return CHECKPOINTS / "tiny-speech-tokenizer"


class _TokenizersPerDevice:
    """``speech_tokenizers["f32"]``: the tiny tokenizer in that precision, loaded once per device backend
    (a model keeps the device its weights were uploaded to, so the GPU parity run needs its own)."""

    def __init__(self, directory):
        self.directory, self.loaded = directory, {}

    def __getitem__(self, precision: str):
        from refimpl import SpeechTokenizer
        from refimpl.backends import device_backend

        key = (device_backend(), precision)
        if key not in self.loaded:
            dtype = {"f32": np.float32, "f64": np.float64}[precision]
            self.loaded[key] = SpeechTokenizer.from_pretrained(self.directory, dtype=dtype)
        return self.loaded[key]


@pytest.fixture(scope="session")
def speech_tokenizers(tiny_speech_tokenizer_dir):
    return _TokenizersPerDevice(tiny_speech_tokenizer_dir)


def read_or_named_error(read, path, error=ValueError):
    """Fuzzing helper: ``read(path)`` either returns, or raises ``error`` whose message names the file."""
    try:
        return read(path)
    except error as e:
        assert path.name in str(e), str(e)
        return None
