"""What every room of the cupy backend shares: CuPy itself, imported on first use; the check that it can run
(``available``); the two transfers; and the hand-written kernels, compiled from the ``.cu`` files of
``kernels/`` (package data, read on first use).

CuPy is imported only when a twin first runs or ``available()`` / ``array_module()`` is called: importing
``refimpl`` never needs it.  ``available()`` says in one error what is missing: CuPy itself (which extra
to install) or a CUDA device and driver (what CuPy said).
"""

from __future__ import annotations

import functools
import importlib.resources

import numpy as np

from .. import BackendUnavailable

INSTALL_HINT = (
    "pip install 'qwen3-tts-refimpl[cuda12]' for a CUDA 12 driver, or "
    "'qwen3-tts-refimpl[cuda13]' for a CUDA 13 driver (nvidia-smi shows the driver's CUDA version)"
)

# ----------------------------------------------------------------------------- CuPy, imported on demand


def _import_cupy():
    """The ``cupy`` module, or BackendUnavailable saying what is missing."""
    try:
        import cupy
    except ModuleNotFoundError as e:
        if e.name != "cupy":
            raise BackendUnavailable(f"backend 'cupy': CuPy is installed but a module it needs is missing ({e})") from e
        raise BackendUnavailable(f"backend 'cupy': CuPy is not installed; {INSTALL_HINT}") from e
    except ImportError as e:  # a CuPy built for another CUDA, or a missing CUDA library
        raise BackendUnavailable(
            f"backend 'cupy': CuPy is installed but cannot be imported: {e}; "
            f"the CuPy package must match the CUDA driver ({INSTALL_HINT})"
        ) from e
    return cupy


@functools.lru_cache(maxsize=1)
def available() -> str:
    """A one-line description of the device the twins run on ("CuPy 14.0.0, device 0: NVIDIA H200, ...");
    BackendUnavailable (one message) when CuPy is not installed, or installed without a usable CUDA device
    or driver.  The answer is cached; a failure is not (installing a driver needs a restart anyway)."""
    cupy = _import_cupy()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("the CUDA runtime reports 0 devices")
        device = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        runtime = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
    except Exception as e:  # CUDARuntimeError (no driver, no device), or the zero count above
        raise BackendUnavailable(
            f"backend 'cupy': CuPy {cupy.__version__} is installed but found no usable CUDA "
            f"device: {type(e).__name__}: {e}"
        ) from e
    version = lambda v: f"{v // 1000}.{v % 1000 // 10}"  # noqa: E731 - CUDA writes 12.4 as 12040
    return (
        f"CuPy {cupy.__version__}, device {device.id}: {name}, CUDA runtime {version(runtime)}, "
        f"driver {version(driver)}"
    )


def array_module():
    """The ``cupy`` module, once ``available()`` has said it can run (BackendUnavailable otherwise)."""
    available()
    return _import_cupy()


def special_module():
    """``cupyx.scipy.special``, the device's special functions (imported on first use)."""
    array_module()
    import cupyx.scipy.special

    return cupyx.scipy.special


# ----------------------------------------------------------------------------- arrays


def to_device(host_array):
    """A CuPy copy of a host array (a CuPy array is returned as it is)."""
    return array_module().asarray(host_array)


def to_host(device_array):
    """The NumPy copy of a CuPy array (a NumPy array, or anything else array-like, goes through np.asarray)."""
    if isinstance(device_array, np.ndarray):
        return device_array
    get = getattr(device_array, "get", None)
    return get() if callable(get) else np.asarray(device_array)


def on_device(*arrays):
    """Each argument as a CuPy array (None stays None): host arrays are uploaded, device arrays kept."""
    xp = array_module()
    return tuple(None if a is None else xp.asarray(a) for a in arrays)


def contiguous(array):
    """``array`` itself when it is C-contiguous (what a kernel indexes as flat memory), else a C-ordered copy."""
    return array if array.flags.c_contiguous else array.copy()


# ----------------------------------------------------------------------------- the kernels of kernels/*.cu


@functools.cache
def cuda_source(file_name: str) -> str:
    """The CUDA C of ``kernels/<file_name>``, read from the installed package (setup.cfg ships the ``.cu``
    files as package data)."""
    return (importlib.resources.files(__package__) / "kernels" / file_name).read_text(encoding="utf-8")


@functools.cache
def _raw_module(file_name: str, instances: tuple):
    """``kernels/<file_name>`` compiled by CuPy's RawModule (NVRTC), with the template ``instances``."""
    if instances:
        return array_module().RawModule(code=cuda_source(file_name), name_expressions=instances)
    return array_module().RawModule(code=cuda_source(file_name))


@functools.cache
def kernel(file_name: str, name: str, instances: tuple = ()):
    """The compiled kernel ``name`` of ``kernels/<file_name>``: the file compiled once, on first use, with
    its template ``instances`` ("attention_rows<float>", ...: CuPy's name_expressions; none for a file of
    ``extern "C"`` kernels)."""
    return _raw_module(file_name, instances).get_function(name)
