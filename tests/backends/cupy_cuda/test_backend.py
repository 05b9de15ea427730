"""The cupy backend as a package (refimpl/backends/cupy_cuda/), checked on a machine without a GPU (and
without CuPy):

- every twin of ``TWINS`` has the signature of its primitive;
- every ``.cu`` file of kernels/ is read by a room and defines the kernels that room launches, and setup.cfg
  ships each as package data (so a wheel or sdist holds them);
- asking for the backend without CuPy, or without a device, is one error naming what is missing;
- importing refimpl does not import CuPy.
Each room's twins: tests/backends/cupy_cuda/test_<room>.py; the twins inside the whole pipeline:
tests/backends/cupy_cuda/test_pipeline.py; the same twins on a real GPU: tests/backends/test_cuda.py.
"""

from __future__ import annotations

import configparser
import inspect
import subprocess
import sys
import types

import numpy as np
import pytest
from conftest import REPO

from refimpl import nn
from refimpl.backends import cupy_cuda
from refimpl.backends.cupy_cuda import attention as cuda_attention
from refimpl.backends.cupy_cuda import conv as cuda_conv
from refimpl.backends.cupy_cuda import device as cuda_device
from refimpl.backends.cupy_cuda import elementwise as cuda_elementwise
from refimpl.backends.cupy_cuda import linear as cuda_linear
from refimpl.backends.cupy_cuda import transformer as cuda_transformer

from .replays import defines_kernel

PACKAGE = REPO / "refimpl" / "backends" / "cupy_cuda"
ROOMS = (cuda_elementwise, cuda_linear, cuda_conv, cuda_attention, cuda_transformer)


def test_every_twin_has_the_signature_of_its_primitive():
    for name, twin in cupy_cuda.TWINS.items():
        primitive = getattr(nn, name)
        assert hasattr(primitive, "reference"), f"nn.{name} is not a @primitive"
        assert inspect.signature(twin) == inspect.signature(primitive.reference), name
        assert f"nn.{name}" in twin.__doc__, f"the docstring of the {name} twin does not name its primitive"


# ----------------------------------------------------------------------------- the CUDA C, shipped with the package


def test_every_cu_file_is_read_by_a_room_and_defines_its_kernels():
    """A room with hand-written kernels names its file (``CU_FILE``); kernels/ holds exactly those files, each
    read as the installed package reads it and defining every kernel its room launches."""
    named = {room.CU_FILE: room for room in ROOMS if hasattr(room, "CU_FILE")}
    assert sorted(named) == sorted(p.name for p in (PACKAGE / "kernels").iterdir())
    launched = {
        cuda_linear: ("bf16_rows_times",),
        cuda_attention: cuda_attention.INSTANCES,
        cuda_transformer: cuda_transformer.INSTANCES,
    }
    assert set(launched) == set(named.values())
    for room, names in launched.items():
        for name in names:
            assert defines_kernel(room.CU_FILE, name), f"kernels/{room.CU_FILE} defines no kernel {name}"


def test_each_cu_file_is_compiled_once_with_its_instances(monkeypatch):
    """``device.kernel``, with a stand-in for CuPy's RawModule: each file is compiled once, from the text the
    package ships, with the template instances of its room (none for the extern "C" bf16 kernel)."""
    compiled = []

    class RawModule:
        def __init__(self, code, name_expressions=None):
            compiled.append((code, name_expressions))

        def get_function(self, name):
            return name

    monkeypatch.setattr(cuda_device, "array_module", lambda: types.SimpleNamespace(RawModule=RawModule))
    cuda_device.kernel.cache_clear()
    cuda_device._raw_module.cache_clear()
    try:
        for room, names in ((cuda_attention, cuda_attention.INSTANCES), (cuda_transformer, cuda_transformer.INSTANCES)):
            assert [room._kernel(name) for name in names * 2] == list(names * 2)
        assert cuda_device.kernel(cuda_linear.CU_FILE, "bf16_rows_times") == "bf16_rows_times"
    finally:
        cuda_device.kernel.cache_clear()
        cuda_device._raw_module.cache_clear()
    assert compiled == [
        (cuda_device.cuda_source(cuda_attention.CU_FILE), cuda_attention.INSTANCES),
        (cuda_device.cuda_source(cuda_transformer.CU_FILE), cuda_transformer.INSTANCES),
        (cuda_device.cuda_source(cuda_linear.CU_FILE), None),
    ]


def test_setup_cfg_ships_every_cu_file_as_package_data():
    """setup.cfg's package data of refimpl.backends.cupy_cuda matches every .cu file: a wheel and an sdist
    built from it hold the CUDA sources the rooms read at run time."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "setup.cfg", encoding="utf-8")
    patterns = [p.strip() for p in config["options.package_data"]["refimpl.backends.cupy_cuda"].split(",")]
    shipped = {path for pattern in patterns if pattern for path in PACKAGE.glob(pattern)}
    sources = set(PACKAGE.rglob("*.cu"))
    assert sources and sources <= shipped, sorted(str(p.relative_to(PACKAGE)) for p in sources - shipped)


# ----------------------------------------------------------------------------- asking for the backend


@pytest.fixture
def fresh_availability():
    cupy_cuda.available.cache_clear()
    yield
    cupy_cuda.available.cache_clear()


def test_without_cupy_the_error_names_the_extras(monkeypatch, fresh_availability):
    monkeypatch.setitem(sys.modules, "cupy", None)  # "import cupy" fails as when it is not installed
    with pytest.raises(cupy_cuda.BackendUnavailable, match=r"CuPy is not installed.*\[cuda12\].*\[cuda13\]"):
        cupy_cuda.available()
    with pytest.raises(RuntimeError, match="CuPy is not installed"):
        cupy_cuda.to_device(np.zeros(3))
    with pytest.raises(cupy_cuda.BackendUnavailable):
        _ = cupy_cuda.xp


def fake_cupy(device_count):
    """A stand-in ``cupy`` whose CUDA runtime raises as CuPy's does on a machine without a driver or device."""

    def get_device_count():
        if isinstance(device_count, Exception):
            raise device_count
        return device_count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    return types.SimpleNamespace(__version__="99.0.0", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize(
    "count, said",
    [
        (
            RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"),
            "cudaErrorNoDevice: no CUDA-capable device is detected",
        ),
        (0, "reports 0 devices"),
    ],
)
def test_without_a_device_the_error_says_what_cupy_said(monkeypatch, fresh_availability, count, said):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(count))
    with pytest.raises(cupy_cuda.BackendUnavailable) as raised:
        cupy_cuda.available()
    assert "CuPy 99.0.0 is installed but found no usable CUDA device" in str(raised.value)
    assert said in str(raised.value)


def test_to_host_keeps_numpy_arrays_and_calls_get():
    a = np.arange(3)
    assert cupy_cuda.to_host(a) is a
    assert cupy_cuda.to_host(types.SimpleNamespace(get=lambda: a)) is a
    with pytest.raises(AttributeError, match="no attribute 'cupy'"):
        _ = cupy_cuda.cupy


def test_importing_refimpl_and_the_backend_module_does_not_import_cupy():
    code = (
        "import sys, refimpl, refimpl.backends.cupy_cuda, refimpl.tts; "
        "assert 'cupy' not in sys.modules, 'cupy imported'; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
