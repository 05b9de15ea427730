"""The cupy backend on a real GPU (opt-in: ``python -m pytest -m cuda``; benchmarks/gpu_check.sh runs it).

Every test skips, saying what is missing, where CuPy or a CUDA device is not there (the default run
deselects them all: setup.cfg).  On a GPU:
- each twin of refimpl/backends/cupy_cuda/ equals its NumPy reference on device arrays (float32, float64);
- every parity module (golden files of every stage, streaming properties) passes on the cupy backend, in
  float32 and float64 (each module in a ``pytest --backend cupy`` process of its own, all side by side);
- streaming decoding equals the one-pass decode on the device;
- greedy generation gives the CPU numpy backend's codes, and the weights are not uploaded again per call.
The speed of the released decoder on the GPU is a measurement, not a test: benchmarks/bench_gpu.py (the
"decode" part, with the target of at least 50x real time in float32) reports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import CHECKPOINTS, REPO
from conftest import PARITY_MODULES as conftest_parity_modules

from refimpl import backends as kernels
from refimpl import nn
from refimpl.backends import cupy_cuda
from refimpl.backends.cupy_cuda import attention as cuda_attention
from refimpl.backends.cupy_cuda import linear as cuda_linear

pytestmark = pytest.mark.cuda

DTYPES = (np.float32, np.float64)
PARITY_MODULES = tuple(sorted(conftest_parity_modules))  # the parity suite of tests/conftest.py
PARITY_TIMEOUT_S = int(os.environ.get("REFIMPL_CUDA_PARITY_TIMEOUT", "180"))  # per module


@pytest.fixture(scope="module", autouse=True)
def device():
    """The device description; the whole module skips with the reason when the backend cannot run here."""
    try:
        described = cupy_cuda.available()
    except cupy_cuda.BackendUnavailable as e:
        pytest.skip(str(e))
    print(f"\ncupy backend: {described}")
    return described


@pytest.fixture(scope="module")
def cp(device):
    return cupy_cuda.xp


def uses_cupy_backend():
    """The backend layer's use_backend("cupy"), or a skip where this tree's backend layer has none yet."""
    if "cupy" not in kernels.BACKENDS:
        pytest.skip("refimpl.backends has no 'cupy' backend in this tree (the backend layer routes it)")
    return kernels.use_backend("cupy")


def assert_matches_reference(got_device, ref, what: str, terms: int = 1):
    """Twin on the device vs reference on the host: float64 within 1e-12 x terms relative, float32 within
    4 eps x terms relative (sums of ``terms`` products in another order; a device math function of a few ulp)."""
    got = cupy_cuda.to_host(got_device)
    assert isinstance(got, np.ndarray) and got.shape == ref.shape and got.dtype == ref.dtype, what
    eps = 1e-12 if ref.dtype == np.float64 else 4 * np.finfo(np.float32).eps
    scale = max(1.0, float(np.max(np.abs(ref), initial=0.0)))
    err = float(np.max(np.abs(got.astype(np.float64) - ref), initial=0.0))
    assert err <= eps * terms * scale, f"{what}: max |twin - reference| = {err:.3e}"


# ----------------------------------------------------------------------------- each twin against its reference


def rope_per_batch(dtype):
    """Angles [2, 1, 9, 64] for two batches at different positions, as a layer hands them to apply_rope."""
    pairs = [nn.rope_cos_sin(np.arange(9) + shift, 64, 10000.0, dtype) for shift in (0, 5)]
    return tuple(np.stack([pair[i] for pair in pairs])[:, None] for i in (0, 1))


def twin_cases(dtype):
    rng = np.random.default_rng(0)
    r = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    x_btc = r(2, 9, 64)
    q, k, v = r(2, 8, 3, 64), r(2, 2, 40, 64), r(2, 2, 40, 64)
    valid = rng.random((2, 40)) < 0.8
    decode_mask = nn.AttentionMask(np.arange(37, 40), np.arange(40), 16, valid)
    prompt_q = r(1, 8, 40, 64)
    prompt_mask = nn.AttentionMask(np.arange(40), np.arange(40), None)
    return {  # name: (arguments, terms of the longest sum)
        "snake_beta": ((r(2, 16, 300) * 3, r(16) * 0.3, r(16) * 0.3), 1),
        "elu": ((r(3, 200) * 4,), 1),
        "silu": ((r(3, 200) * 4,), 1),
        "gelu_erf": ((r(3, 200) * 4,), 1),
        "softmax": ((r(4, 50) * 5,), 50),
        "linear": ((x_btc, r(48, 64), r(48)), 64),
        "rms_norm": ((x_btc, r(64), 1e-6), 64),
        "rms_norm_decode": ((r(2, 3, 1000), r(1000), 1e-6), 1000),
        "layer_norm": ((x_btc, r(64), r(64), 1e-5), 64),
        "conv1d": ((r(2, 32, 100), r(24, 32, 7), r(24), 2, 3, 1), 32 * 7),
        "conv1d_depthwise": ((r(2, 32, 100), r(32, 1, 7), r(32), 1, 1, 32), 7),
        "conv_transpose1d": ((r(2, 32, 50), r(32, 16, 8), r(16), 4), 32 * 2),
        "apply_rope": ((r(2, 4, 9, 64),) + nn.rope_cos_sin(np.arange(9), 64, 10000.0, dtype), 2),
        "apply_rope_prompt": ((r(2, 4, 9, 64), *rope_per_batch(dtype)), 2),
        "attention_decode": ((q, k, v, decode_mask, 0.125), 64 * 40),
        "attention_prompt": ((prompt_q, k[:1], v[:1], prompt_mask, 0.125), 64 * 40),
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_twin_equals_its_reference_on_the_device(cp, dtype):
    """Each primitive as the cupy backend runs it (its twin, or the reference formula run by CuPy through
    NumPy's dispatch) on device arrays, against the reference on the host."""
    for case, (args, terms) in twin_cases(dtype).items():
        name = case.split("_depthwise")[0].split("_decode")[0].split("_prompt")[0]
        ref = getattr(nn, name).reference(*args)
        device_args = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        with uses_cupy_backend():
            got = getattr(nn, name)(*device_args)
        assert_matches_reference(got, ref, f"{case} ({np.dtype(dtype).name})", terms)
    assert set(cupy_cuda.TWINS) <= {
        c.split("_depthwise")[0].split("_decode")[0].split("_prompt")[0] for c in twin_cases(dtype)
    }


def test_bf16_linear_on_the_device(cp):
    from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

    rng = np.random.default_rng(1)
    bits = float32_to_bf16_bits(rng.standard_normal((300, 512)).astype(np.float32))
    w_host, w_device = BF16Matrix(bits), BF16Matrix(cp.asarray(bits))
    for rows in (1, 4, cuda_linear.MATVEC_MAX_ROWS + 1):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        ref = nn.linear.reference(x, np.asarray(w_host))
        assert_matches_reference(cuda_linear.linear(cp.asarray(x), w_device), ref, f"bf16 linear, {rows} rows", 512)


def test_attention_kernel_on_a_long_cache(cp):
    """One query against 5000 cached keys (more than a block's threads many times over), window 4096, GQA 16/8:
    the keys split over 17 blocks per row (cuda_attention.attention_splits), then combined."""
    rng = np.random.default_rng(2)
    shapes = ((1, 16, 1, 128), (1, 8, 5000, 128), (1, 8, 5000, 128))
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    mask = nn.AttentionMask(np.array([4999]), np.arange(5000), 4096)
    ref = nn.attention.reference(q, k, v, mask, 128**-0.5)
    assert cuda_attention.attention_splits(16, 5000) == (17, 295)
    got = cuda_attention.attention_rows_kernel(cp.asarray(q), cp.asarray(k), cp.asarray(v), mask, 128**-0.5)
    assert_matches_reference(got, ref, "attention, 5000 keys", 128 * 4096)


# ----------------------------------------------------------------------------- the parity suite on the GPU


@pytest.fixture(scope="module")
def parity_runs():
    """Every parity module started at once, each in ``pytest --backend cupy`` of its own (the tiny models
    leave the GPU mostly idle: side by side they take the time of the slowest); {module: (Popen, start)}."""
    if "cupy" not in kernels.BACKENDS:
        pytest.skip("refimpl.backends has no 'cupy' backend in this tree (conftest's --backend would refuse it)")
    runs = {}
    for module in PARITY_MODULES:
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--maxfail=1000",  # every failure of the module, not only the first: one GPU run must show them all
            "-rfEs",
            "-p",
            "no:cacheprovider",
            "--backend",
            "cupy",
            str(next(REPO.glob(f"tests/**/{module}.py"))),
        ]
        runs[module] = (
            subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            time.perf_counter(),
        )
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("module", PARITY_MODULES)
def test_parity_module_passes_on_the_cupy_backend(parity_runs, module):
    """``pytest --backend cupy tests/<module>.py``: the module's every test (golden files of every stage in
    float32 and float64, streaming properties) on the GPU."""
    process, start = parity_runs[module]
    try:
        output, _ = process.communicate(timeout=max(1.0, PARITY_TIMEOUT_S - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"{module} on cupy did not finish in {PARITY_TIMEOUT_S} s:\n{output[-4000:]}")
    summary = (output.strip().splitlines() or ["(no output)"])[-1]
    print(f"\n{module} on cupy: {summary} ({time.perf_counter() - start:.0f} s)")
    assert process.returncode == 0, f"pytest --backend cupy {module}.py failed:\n{output[-8000:]}"


def test_streaming_decode_equals_one_pass_on_the_device():
    from refimpl import SpeechTokenizer

    with uses_cupy_backend():
        tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=np.float64)
    codes = np.random.default_rng(3).integers(0, tok.codebook_size, size=(37, tok.num_quantizers))
    full = tok.decode_full(codes)
    stream = tok.stream()
    chunks = [stream.push(codes[a:b]) for a, b in zip([0, 1, 4, 11, 12, 30], [1, 4, 11, 12, 30, 37], strict=True)]
    assert all(isinstance(p, np.ndarray) for p in chunks) and isinstance(full, np.ndarray)
    streamed = np.concatenate(chunks)
    assert streamed.shape == full.shape
    assert np.max(np.abs(streamed - full)) <= 1e-9 * max(1.0, np.max(np.abs(full)))


# ----------------------------------------------------------------------------- generation against the CPU


GREEDY = dict(
    text="The GPU speaks as the CPU does.",
    speaker="vivian",
    language="english",
    do_sample=False,
    subtalker_dosample=False,
    max_new_tokens=12,
    return_codes=True,
)


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_codes_equal_the_cpu_and_weights_are_uploaded_once(monkeypatch, dtype):
    from refimpl import Qwen3TTS

    path = CHECKPOINTS / "tiny-customvoice"
    with kernels.use_backend("numpy"):
        cpu = Qwen3TTS.from_pretrained(path, dtype=dtype)
        cpu_wavs, _, cpu_codes = cpu.generate_custom_voice(**GREEDY)
    with uses_cupy_backend():
        gpu = Qwen3TTS.from_pretrained(path, dtype=dtype)
        uploaded = []
        real_to_device = cupy_cuda.to_device
        monkeypatch.setattr(
            cupy_cuda, "to_device", lambda a: uploaded.append(np.asarray(a).nbytes) or real_to_device(a)
        )
        gpu_wavs, _, gpu_codes = gpu.generate_custom_voice(**GREEDY)
    np.testing.assert_array_equal(gpu_codes[0], cpu_codes[0])
    assert isinstance(gpu_wavs[0], np.ndarray) and gpu_wavs[0].dtype == cpu_wavs[0].dtype
    atol = 1e-9 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(gpu_wavs[0], cpu_wavs[0], rtol=0, atol=atol)
    weight_bytes = (path / "model.safetensors").stat().st_size
    print(
        f"\n{np.dtype(dtype).name}: {len(uploaded)} uploads, {sum(uploaded)} bytes during the call "
        f"(weights on disk: {weight_bytes} bytes), {len(gpu_codes[0])} frames"
    )
    assert sum(uploaded) < weight_bytes / 4, "the call uploaded about as much as the weights: they were not kept"
