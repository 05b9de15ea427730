"""The device-array backend layer, proven on the CPU.

CI has no GPU, so the data flow of the CuPy backend is checked with ``refimpl/backends/strict_device.py``:
a NumPy-backed device array library at least as strict as CuPy (every implicit host round trip raises).

1. the stand-in itself refuses what it claims to refuse (each refusal tested) and counts transfers;
2. asking for "cupy" without CuPy, or without a GPU, is one clear error;
3. the whole pipeline under the strict backend equals the numpy backend bit for bit (NumPy underneath),
   with no implicit host conversion and a bounded number of explicit host syncs per generated frame;
4. a model remembers the backend it was loaded on;
5. the stage modules create no arrays with NumPy and call no scipy in their compute paths (an AST check).
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import Qwen3TTS
from refimpl import backends as kernels
from refimpl.backends import BackendUnavailable, strict_device, use_backend
from refimpl.backends.strict_device import StrictArray, to_device, to_host, xp
from refimpl.codec import speech_tokenizer

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- 1. the stand-in


@pytest.fixture
def a():
    return to_device(np.arange(6, dtype=np.float32).reshape(2, 3))


def test_implicit_conversion_to_the_host_is_refused(a):
    for convert in (np.asarray, np.array, lambda x: x.__array__(), np.ascontiguousarray):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(a)
    with pytest.raises(TypeError, match="Python index"):
        [0, 1, 2][a[0, 0].astype(np.int64)]


def test_mixing_with_host_arrays_is_refused(a):
    host = np.ones(3, dtype=np.float32)
    for mix in (
        lambda: a + host,
        lambda: host + a,
        lambda: a * host,
        lambda: np.maximum(a, host),
        lambda: np.where(a > 1, a, host),
        lambda: np.concatenate([a, host[None]]),
        lambda: np.matmul(a, host),
    ):
        with pytest.raises(TypeError, match="host numpy.ndarray"):
            mix()


def test_host_indices_values_and_uploads_through_asarray_are_refused(a):
    with pytest.raises(TypeError, match="cannot index a device array"):
        a[np.array([0, 1])]
    with pytest.raises(TypeError, match="not allowed on a device array"):
        a[[0, 1]]
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        a[0] = np.zeros(3, dtype=np.float32)
    with pytest.raises(TypeError, match="through to_device"):
        xp.asarray(np.zeros(3))
    with pytest.raises(TypeError, match="already on the device"):
        to_device(a)
    with pytest.raises(TypeError, match="expects a StrictArray"):
        to_host(np.zeros(3))


def test_functions_cupy_lacks_are_refused(a):
    with pytest.raises(TypeError, match="put_along_axis is not in the CuPy functions"):
        np.put_along_axis(a, to_device(np.zeros((2, 1), dtype=np.int64)), 0.0, axis=1)
    with pytest.raises(TypeError, match="not a ufunc CuPy implements"):
        np.spacing(a)
    with pytest.raises(AttributeError, match="no 'fft'"):
        _ = xp.fft
    assert "put_along_axis" not in strict_device.CUPY_FUNCTIONS


def test_keywords_cupy_lacks_are_refused(a):
    for call, keyword in (
        (lambda: np.sum(a, where=a > 1), "where"),
        (lambda: np.max(a, initial=0.0), "initial"),
        (lambda: np.mean(a, axis=0, where=a > 1), "where"),
        (lambda: np.exp(a, where=a > 1), "where"),
        (lambda: np.add.reduce(a, initial=1.0), "initial"),
        (lambda: np.copy(a, subok=True), "subok"),
        (lambda: a.sum(where=a > 1), "where"),
        (lambda: xp.zeros(3, device="cpu"), "device"),
        (lambda: xp.linspace(0, 1, 5, device="cpu"), "device"),
    ):
        with pytest.raises(TypeError, match=f"takes no keyword argument '{keyword}'"):
            call()
    # what CuPy takes passes
    assert np.sum(a, axis=0, keepdims=True, dtype=np.float64).shape == (1, 3)
    assert np.exp(a, out=(xp.empty((2, 3), np.float32),)).shape == (2, 3)
    assert to_host(a.clip(min=1, max=4)).max() == 4


def test_results_are_device_arrays_where_cupy_gives_them(a):
    for result in (np.array_equal(a, a), np.allclose(a, a), np.count_nonzero(a)):
        assert isinstance(result, StrictArray) and result.shape == ()
    strict_device.reset_transfers()
    assert bool(np.allclose(a, a)) and int(np.count_nonzero(a)) == 5
    assert strict_device.transfers["sync"] == 2  # reading them is a sync, as on CuPy


def test_out_of_range_integer_array_indices_wrap_as_in_cupy(a):
    index = to_device(np.array([0, 2, 3, -4]))  # 3 and -4 are out of range for an axis of 3
    np.testing.assert_array_equal(to_host(a[:, index]), to_host(a)[:, [0, 2, 0, 2]])
    np.testing.assert_array_equal(to_host(a[to_device(np.array([2, 5])), ...]), to_host(a)[[0, 1]])
    b = xp.zeros(4, np.float32)
    b[to_device(np.array([5]))] = 7  # writes wrap too
    np.testing.assert_array_equal(to_host(b), [0, 7, 0, 0])
    with pytest.raises(IndexError):  # a Python int is checked, as CuPy checks it
        a[5]


def test_what_is_allowed_computes_what_numpy_computes_and_counts_transfers(a):
    strict_device.reset_transfers()
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = a * np.float32(2) + 1  # NumPy and Python scalars mix freely
    b[:, 1] += a[:, 2]  # views and in-place updates write through
    b[to_device(np.array([True, False]))] = 0  # boolean device masks index
    expected = host * 2 + 1
    expected[:, 1] += host[:, 2]
    expected[[True, False]] = 0
    total = np.sum(np.exp(b), axis=None)  # a reduction is a 0-d device array, like CuPy's
    assert isinstance(total, StrictArray) and total.shape == ()
    assert np.array_equal(to_host(b), expected)
    assert float(total) == float(np.sum(np.exp(expected)))
    assert to_host(xp.special.erf(a)).dtype == np.float32
    assert strict_device.transfers == {"to_device": 1, "to_host": 2, "sync": 1}
    assert bool(a.max() > 4) and a.shape == (2, 3) and a.T.shape == (3, 2)
    assert strict_device.transfers["sync"] == 2


# ----------------------------------------------------------------------------- 2. cupy without CuPy / without a GPU


@pytest.fixture
def no_loaded_cupy(monkeypatch):
    """Forget any loaded CuPy backend for the duration of a test."""
    cupy = kernels.REGISTRY["cupy"]
    fresh = kernels.Backend(cupy.name, cupy.module_name, on_device=True)
    monkeypatch.setitem(kernels.REGISTRY, "cupy", fresh)


def test_cupy_without_cupy_is_one_clear_error(monkeypatch, no_loaded_cupy):
    monkeypatch.setitem(sys.modules, "cupy", None)  # "import cupy" now fails, as where it is not installed
    for ask in (
        lambda: use_backend("cupy").__enter__(),
        lambda: (monkeypatch.setenv("REFIMPL_BACKEND", "cupy"), kernels.active_backend()),
    ):
        with pytest.raises(BackendUnavailable, match=r"CuPy is not installed.*\[cuda12\].*\[cuda13\]"):
            ask()
    monkeypatch.delenv("REFIMPL_BACKEND")
    assert "cupy" not in kernels.installed_backends()
    assert kernels.active_backend()[0] == "auto"


def test_cupy_without_a_gpu_is_one_clear_error(monkeypatch, no_loaded_cupy):
    fake = types.ModuleType("cupy")  # CuPy installed, the CUDA runtime sees no device
    fake.__version__ = "0.0-test"

    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=no_device), is_available=lambda: False
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(BackendUnavailable, match=r"(?i)cupy.*installed.*CUDA.*device"), use_backend("cupy"):
        pass
    assert issubclass(BackendUnavailable, RuntimeError)


# ----------------------------------------------------------------------------- 2b. the registry and the "auto" rule


def test_one_backend_object_per_backend_in_one_registry():
    assert kernels.BACKENDS == ("numpy", "numba", "cupy") and kernels.TEST_BACKENDS == ("strict",)
    assert set(kernels.REGISTRY) == set(kernels.BACKENDS + kernels.TEST_BACKENDS)
    numpy_b, strict = kernels.backend("numpy"), kernels.backend("strict")
    assert numpy_b.xp is np and numpy_b.twins == {} and not numpy_b.on_device
    assert strict.xp is xp and strict.special is xp.special and strict.on_device
    host = np.arange(3.0)
    assert isinstance(strict.to_device(host), StrictArray) and np.array_equal(
        strict.to_host(strict.to_device(host)), host
    )
    assert kernels.twin_of("conv1d", "numba") is kernels.REGISTRY["numba"].twins["conv1d"]
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        kernels.backend("gpu")


def test_the_auto_rule_lives_in_backend_for_call(monkeypatch):
    f32, f64 = np.zeros(2, np.float32), np.zeros(2, np.float64)
    assert kernels.backend_for_call("auto", f32) == "numba"
    assert kernels.backend_for_call("auto", f64) == "numpy"
    assert kernels.backend_for_call("auto", None) == "numpy"
    assert kernels.backend_for_call("strict", f32) == "numpy"  # a host row on a device backend: the host reference
    assert kernels.backend_for_call("strict", to_device(f32)) == "strict"
    assert kernels.backend_for_call("numba", f64) == "numba"
    monkeypatch.delenv("REFIMPL_BACKEND", raising=False)
    assert kernels.active_backend() == ("auto", kernels.AUTO_RULE)


# The primitives the cupy backend has no twin of, and the two whose twins hand the shapes and dtypes their
# kernels do not take to the formula (rms_norm, apply_rope): the reference formulas run on device arrays
# through NumPy's dispatch.  Each, called under the strict stand-in on device arrays, equals the host reference.
def test_primitives_without_a_device_twin_run_their_formula_on_device_arrays():
    from refimpl import nn
    from refimpl.backends import cupy_cuda

    rng = np.random.default_rng(5)
    r = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    cases = {
        "softmax": (np.where(r(3, 6) > 1, -np.inf, r(3, 6)),),
        "rms_norm": (r(2, 5, 8), r(8), 1e-6),
        "layer_norm": (r(2, 5, 8), r(8), r(8), 1e-5),
        "apply_rope": (r(2, 3, 5, 8),) + nn.rope_cos_sin(np.arange(5), 8, 10000.0, np.float64),
        "conv_transpose1d": (r(2, 4, 7), r(4, 3, 5), r(3), 2),
    }
    assert not (set(cases) - {"rms_norm", "apply_rope"}) & set(cupy_cuda.TWINS)
    for name, args in cases.items():
        with use_backend("strict"):
            got = getattr(nn, name)(*(to_device(a) if isinstance(a, np.ndarray) else a for a in args))
        assert isinstance(got, StrictArray), name
        np.testing.assert_array_equal(to_host(got), getattr(nn, name).reference(*args), err_msg=name)


# ----------------------------------------------------------------------------- 3. the whole pipeline under "strict"


def loaded(kind: str, backend: str) -> Qwen3TTS:
    with use_backend(backend):
        return Qwen3TTS.from_pretrained(CHECKPOINTS / f"tiny-{kind}", dtype=np.float32)


@pytest.fixture
def host_reference():
    """The host side of every comparison runs the plain reference ("numpy"); the device models run on
    "strict" whatever is active (they remember their backend)."""
    with use_backend("numpy"):
        yield


@pytest.fixture(scope="module")
def pairs():
    """The tiny CustomVoice and Base models, loaded on the host (numpy) and on the strict device."""
    return {kind: (loaded(kind, "numpy"), loaded(kind, "strict")) for kind in ("customvoice", "base")}


def assert_equal_trees(host, device, what):
    """Equal values and types, element by element (lists, tuples, dicts, arrays); every array a host one."""
    assert type(host) is type(device), what
    if isinstance(host, dict):
        assert host.keys() == device.keys(), what
        for k in host:
            assert_equal_trees(host[k], device[k], f"{what}[{k!r}]")
    elif isinstance(host, (list, tuple)):
        assert len(host) == len(device), what
        for i, (h, d) in enumerate(zip(host, device, strict=True)):
            assert_equal_trees(h, d, f"{what}[{i}]")
    elif isinstance(host, np.ndarray):
        assert host.dtype == device.dtype and host.shape == device.shape, what
        assert np.array_equal(host, device, equal_nan=True), f"{what}: differs"
    else:
        assert host == device, what


def test_weights_are_on_the_device_once_loaded(pairs, host_reference):
    host, dev = pairs["base"]
    assert dev.backend == "strict" and host.backend is None
    for weights in (
        dev.talker.weights,
        dev.talker.code_predictor.weights,
        dev.speech_tokenizer.decoder_weights,
        dev.speaker_encoder.weights,
    ):
        assert weights and all(isinstance(w, StrictArray) for w in weights.values())
    for table in dev.speech_tokenizer.codebooks["rvq_rest"]:
        assert isinstance(table, StrictArray)
    assert not any(isinstance(w, StrictArray) for w in host.talker.weights.values())


def test_codec_decode_offline_chunked_and_streaming_equal_the_host(pairs, host_reference, monkeypatch):
    host, dev = (m.speech_tokenizer for m in pairs["customvoice"])
    monkeypatch.setattr(speech_tokenizer, "OFFICIAL_CHUNK_FRAMES", 16)  # the official chunked path, on a
    monkeypatch.setattr(speech_tokenizer, "OFFICIAL_LEFT_CONTEXT_FRAMES", 5)  # shorter input (3 chunks)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, host.codebook_size, size=(40, host.num_quantizers))
    padded = codes[:40].copy()
    padded[:3, 0] = -1  # padding frames
    for decode in ("decode", "decode_full"):
        assert_equal_trees(getattr(host, decode)(codes), getattr(dev, decode)(codes), decode)
    assert_equal_trees(host.decode(padded), dev.decode(padded), "decode with padding")
    streams = host.stream(), dev.stream()
    for start, stop in ((0, 1), (1, 6), (6, 6), (6, 40)):
        assert_equal_trees(*(s.push(codes[start:stop]) for s in streams), f"push {start}:{stop}")


@pytest.mark.soxr_optional  # 16 kHz audio is resampled: host and device alike, by either resampler
def test_codec_encode_and_speaker_encoder_equal_the_host(pairs, host_reference):
    host, dev = pairs["base"]
    t = np.arange(24000) / 24000.0
    wav = (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    assert_equal_trees(
        host.speech_tokenizer.encode_detailed([wav, wav[:9000]], sr=24000),
        dev.speech_tokenizer.encode_detailed([wav, wav[:9000]], sr=24000),
        "encode_detailed",
    )
    trace_h, trace_d = {}, {}
    assert_equal_trees(
        host.extract_speaker_embedding(wav, 16000, trace_h),
        dev.extract_speaker_embedding(wav, 16000, trace_d),
        "x-vector",
    )
    assert_equal_trees(trace_h, trace_d, "speaker encoder trace")


GREEDY = dict(do_sample=False, subtalker_dosample=False)


@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_generation_equals_the_host_with_the_same_draws(pairs, host_reference, sampling):
    host, dev = pairs["customvoice"]
    host.keep_logits = dev.keep_logits = True  # compare every step's logits too
    kwargs = dict(text="Device arrays.", speaker="vivian", language="english", max_new_tokens=12, return_codes=True)
    kwargs.update(GREEDY if sampling == "greedy" else dict(seed=5))
    trace_h, trace_d = {}, {}
    out_h = host.generate_custom_voice(trace=trace_h, **kwargs)
    if sampling == "sampled":  # the device run replays the host's uniforms: the ids must repeat exactly
        kwargs = dict(kwargs, seed=None, random_draws=trace_h["refimpl.random_draws"])
    out_d = dev.generate_custom_voice(trace=trace_d, **kwargs)
    assert_equal_trees(out_h, out_d, "wavs, sr, codes")
    assert_equal_trees(trace_h, trace_d, "trace")
    assert_equal_trees(vars(host.last_log), vars(dev.last_log), "GenerationLog")


def test_streaming_and_voice_clone_equal_the_host(pairs, host_reference):
    host, dev = pairs["customvoice"]
    kwargs = dict(text="Chunks.", speaker="eric", max_new_tokens=9, chunk_frames=2, seed=1)
    assert_equal_trees(list(host.stream_custom_voice(**kwargs)), list(dev.stream_custom_voice(**kwargs)), "chunks")
    host, dev = pairs["base"]
    t = np.arange(18000) / 24000.0
    ref = ((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    prompts = [m.create_voice_clone_prompt(ref, ref_text="A short reference.") for m in (host, dev)]
    assert_equal_trees(*(vars(p[0]) for p in prompts), "voice clone prompt")
    outs = [
        m.generate_voice_clone("Cloned.", voice_clone_prompt=p, max_new_tokens=8, seed=2, return_codes=True)
        for m, p in zip((host, dev), prompts, strict=True)
    ]
    assert_equal_trees(*outs, "voice clone")
    chunks = [
        list(m.stream_voice_clone("Cloned.", voice_clone_prompt=p, max_new_tokens=8, seed=2, chunk_frames=3))
        for m, p in zip((host, dev), prompts, strict=True)
    ]
    assert_equal_trees(*chunks, "voice clone stream")


def test_host_syncs_per_generated_frame_are_exactly_the_logits(pairs, host_reference):
    """Per generated frame the host reads exactly one logits row per code group (the talker's and the
    code predictor's 15), nothing else; uploads per frame are bounded too (ids and the position)."""
    _, dev = pairs["customvoice"]
    G = dev.talker.cfg.num_code_groups
    counts = {}
    for n in (4, 10):
        strict_device.reset_transfers()
        _, _, codes = dev.generate_custom_voice(
            "Counting syncs.", speaker="vivian", max_new_tokens=n, return_codes=True, **GREEDY
        )
        counts[n] = (len(codes[0]), dict(strict_device.transfers))
    (f1, c1), (f2, c2) = counts[4], counts[10]
    assert f2 > f1, "the greedy run must make more frames with a larger max_new_tokens"
    frames = f2 - f1
    reads = lambda c: c.get("to_host", 0) + c.get("sync", 0)  # noqa: E731
    assert reads(c2) - reads(c1) == G * frames, (c1, c2)
    # uploads per frame: the 15 code predictor ids, the frame's codes, the position (no padding: no key mask)
    assert (c2["to_device"] - c1["to_device"]) <= (G + 1) * frames, (c1, c2)


def test_a_model_runs_on_the_backend_it_was_loaded_on(pairs, host_reference):
    host, dev = pairs["customvoice"]
    with (
        pytest.raises(ValueError, match="loaded with its weights on the host.*use_backend\\('strict'\\)"),
        use_backend("strict"),
    ):
        host.generate_custom_voice("x", speaker="vivian", max_new_tokens=2, **GREEDY)
    with use_backend("numba"):  # a host backend asked for: the device model still runs on its device
        wavs, _ = dev.generate_custom_voice("x", speaker="vivian", max_new_tokens=2, **GREEDY)
    assert isinstance(wavs[0], np.ndarray)


def test_a_device_model_refuses_another_device(pairs, host_reference, monkeypatch):
    """A second device backend (the stand-in again, under another name): weights on one device cannot
    serve a run asked for on another."""
    other = kernels.Backend("other", "refimpl.backends.strict_device", on_device=True, offered=False)
    monkeypatch.setitem(kernels.REGISTRY, "other", other)
    _, dev = pairs["customvoice"]
    with (
        use_backend("other"),
        pytest.raises(ValueError, match="loaded on backend 'strict', not on the active 'other'"),
    ):
        dev.speech_tokenizer.decode(np.zeros((2, 16), dtype=np.int64))


# ----------------------------------------------------------------------------- 5. stage modules create no host arrays

# Every module that computes on the model's backend: the networks (refimpl/tts/, refimpl/codec/) and the
# shared network code beside them, found from the tree (the text tokenizer works on strings, on the host).
STAGE_MODULES = tuple(
    sorted(
        [
            p.relative_to(REPO / "refimpl").with_suffix("").as_posix().replace("/", ".")
            for sub in ("tts", "codec")
            for p in (REPO / "refimpl" / sub).glob("*.py")
            if p.name not in ("__init__.py", "text_tokenizer.py")
        ]
        + ["transformer", "sampling"]
    )
)
CREATION = {
    "zeros",
    "empty",
    "ones",
    "full",
    "arange",
    "eye",
    "identity",
    "linspace",
    "logspace",
    "tri",
    "indices",
    "fromfunction",
    "frombuffer",
    "fromiter",
}

# (module, function) -> why a NumPy creation there is right: each makes HOST data on purpose.
HOST_SIDE = {
    ("tts.talker", "mrope_stream_of_channel"): "a constant table of the config; uploaded once by its caller",
    ("tts.code_predictor", "CodePredictor.predict_frame"): "the chosen codes: ids are chosen on the host",
    ("tts.generate", "iterate_frames"): "host bookkeeping: codes so far, finished rows, the key-valid mask",
    ("tts.generate", "generate_codes"): "the generated codes: host ids, the public output",
    ("tts.generate", "forced_frames"): "teacher-forced codes: host ids, used where chosen ids are",
    ("sampling", "suppressed_ids"): "sampling runs on the host, on the copied logits (refimpl.tts.generate)",
    ("sampling", "apply_repetition_penalty"): "sampling runs on the host",
    ("sampling", "UniformDraws.recorded"): "the recorded uniforms: host float64",
    ("sampling", "choose"): "sampling runs on the host",
    ("tts.prompt", "build_layout"): "token ids of the prompt layout (host ids)",
    ("tts.prompt", "build_layout.control"): "token ids of the prompt layout (host ids)",
    ("tts.prompt", "assemble_batch"): "the key-valid mask: host bookkeeping the generation loop extends",
    ("tts.mel", "mel_filterbank"): "the log-mel front end runs on the host (input preprocessing)",
    ("tts.mel", "hann_window"): "the log-mel front end runs on the host",
    ("tts.mel", "stft_magnitude"): "the log-mel front end runs on the host",
    ("tts.mel", "real_fft"): "the log-mel front end runs on the host (SciPy's FFT)",
    ("codec.speech_tokenizer", "SpeechTokenizer.encode_detailed"): "assembles the host input batch, uploaded once",
    ("codec.speech_tokenizer", "DecodeStream.push"): "an empty host codes array for an empty push (input checking)",
    ("tts.warm_up", "code_predictor_frame"): "the numba backend's warm-up, on the host only; chosen ids are host ids",
    ("tts.warm_up", "decoder_pushes"): "codes: host ids, as a generation's (the codec uploads them)",
}


def numpy_creations_and_scipy(module: str) -> list:
    """[(function path, what)] for every NumPy creation call and every scipy import or use in ``module``."""
    tree = ast.parse((REPO / "refimpl" / (module.replace(".", "/") + ".py")).read_text())
    found = []

    def visit(node, path):
        for child in ast.iter_child_nodes(node):
            inner = path + [child.name] if isinstance(child, (ast.FunctionDef, ast.ClassDef)) else path
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and isinstance(child.func.value, ast.Name)
                and child.func.value.id in ("np", "numpy")
                and child.func.attr in CREATION
            ):
                found.append((".".join(path), f"np.{child.func.attr} (line {child.lineno})"))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [getattr(child, "module", None) or ""] + [a.name for a in child.names]
                if any(n.split(".")[0] == "scipy" for n in names):
                    found.append((".".join(path), f"scipy import (line {child.lineno})"))
            if isinstance(child, ast.Name) and child.id in ("special", "scipy"):
                found.append((".".join(path), f"{child.id} (line {child.lineno})"))
            visit(child, inner)

    visit(tree, [])
    return found


def test_stage_modules_create_arrays_and_call_special_functions_through_the_backend_layer():
    offending = [
        f"refimpl/{m.replace('.', '/')}.py: {where or '<module>'}: {what}"
        for m in STAGE_MODULES
        for where, what in numpy_creations_and_scipy(m)
        if (m, where) not in HOST_SIDE
    ]
    assert not offending, (
        "stage code creates arrays with NumPy or calls scipy; use nn.zeros / nn.arange / "
        "nn.sigmoid ... (or allow-list a host-side function here, with its reason):\n" + "\n".join(offending)
    )
    used = {(m, where) for m in STAGE_MODULES for where, _ in numpy_creations_and_scipy(m)}
    assert not set(HOST_SIDE) - used, f"allow-listed but no longer creating host arrays: {set(HOST_SIDE) - used}"


def test_the_ast_check_sees_what_it_forbids(tmp_path, monkeypatch):
    (tmp_path / "refimpl").mkdir()
    (tmp_path / "refimpl" / "fake.py").write_text(
        "import numpy as np\nfrom scipy import special\n\ndef f(x):\n    return np.zeros(3) + special.erf(x)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = numpy_creations_and_scipy("fake")
    assert ("f", "np.zeros (line 5)") in found and ("", "scipy import (line 2)") in found
    assert ("f", "special (line 5)") in found


def test_the_command_line_says_in_one_line_that_cupy_cannot_run(monkeypatch, capsys, no_loaded_cupy):
    from refimpl import cli

    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli.main(["info", "--backend", "cupy"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("refimpl: error:") and "CuPy is not installed" in err and "\n" not in err
