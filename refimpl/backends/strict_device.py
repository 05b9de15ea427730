"""A stand-in for a device array library, NumPy underneath, at least as strict as CuPy: the test backend.

CI has no GPU, so the CuPy backend's data flow is proven on the CPU with this module.  Its array type,
``StrictArray``, wraps a NumPy array (it is NOT an ndarray subclass: ``np.asarray`` would see through a
subclass) and behaves like a ``cupy.ndarray`` where that matters for correctness:

    refused (TypeError), as CuPy refuses it:
        np.asarray(a), np.array(a), a.__array__()          implicit device -> host conversion
        a + host_ndarray, np.where(a, host_ndarray, ...)    mixing a device array with a host array
        a[host_ndarray], a[...] = host_ndarray              host arrays as indices or values
        operator.index(a)                                   (CuPy has no ``__index__``: it would be a sync)
    refused, stricter than CuPy:
        xp.asarray(host_ndarray), a[[0, 2]]                 uploads must go through ``to_device`` (counted)
        any NumPy function or ufunc that is not in ``CUPY_FUNCTIONS`` / ``CUPY_UFUNCS`` below
    allowed, and COUNTED (``transfers``):
        to_host(a), a.get()                                 explicit device -> host copy   ("to_host")
        to_device(host)                                     explicit host -> device copy   ("to_device")
        float(a), int(a), bool(a), a.item(), a.tolist()     a synchronising read of values  ("sync")

Everything else (ufuncs, ``np.concatenate``, ``np.matmul``, indexing with ints, slices, None, Ellipsis and
other StrictArrays, views, in-place updates) runs NumPy on the wrapped arrays, so a pipeline run on this
backend gives results EQUAL to the numpy backend, bit for bit; any implicit host round trip fails.

Python and NumPy scalars mix freely with StrictArrays (CuPy accepts them).  Where CuPy's results differ from
NumPy's, the stand-in returns CuPy's:
    reductions, ``array_equal``, ``allclose``, ``count_nonzero``   0-d StrictArrays (NumPy: host scalars), so
                                                                 ``if np.allclose(a, b):`` is a counted sync
    a[device_int_index] with an index out of range                wraps around (NumPy raises IndexError)
and a keyword argument CuPy's function lacks (``np.sum(a, where=...)``, ``np.max(a, initial=...)``, a ufunc's
``where=``) is refused (``CUPY_KEYWORDS``), as CuPy refuses it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import special as _scipy_special

__all__ = [
    "StrictArray",
    "xp",
    "special",
    "to_device",
    "to_host",
    "available",
    "TWINS",
    "transfers",
    "reset_transfers",
    "CUPY_FUNCTIONS",
    "CUPY_UFUNCS",
]

TWINS: dict = {}  # no faster twins: the reference primitives run, on StrictArrays

# Explicit transfers and synchronising reads since the last ``reset_transfers()``.
transfers: Counter = Counter()


def reset_transfers() -> None:
    transfers.clear()


def available() -> None:
    """The stand-in needs nothing but NumPy: always available."""


IMPLICIT_MESSAGE = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly."
)

# The NumPy ufuncs CuPy implements (``cupy.<name>``; CuPy's ``__array_ufunc__`` looks them up by name).
CUPY_UFUNCS = frozenset(
    """
    absolute add arccos arccosh arcsin arcsinh arctan arctan2 arctanh bitwise_and bitwise_or bitwise_xor
    cbrt ceil conjugate copysign cos cosh deg2rad degrees divide equal exp exp2 expm1 fabs float_power floor
    floor_divide fmax fmin fmod greater greater_equal hypot invert isfinite isinf isnan ldexp left_shift less
    less_equal log log10 log1p log2 logaddexp logaddexp2 logical_and logical_not logical_or logical_xor matmul
    maximum minimum multiply negative nextafter not_equal positive power rad2deg radians reciprocal remainder
    right_shift rint sign signbit sin sinh sqrt square subtract tan tanh true_divide trunc
""".split()
)

# The NumPy functions (``__array_function__``) CuPy implements under the same name, written down from
# CuPy's comparison table (docs.cupy.dev, "Comparison Table"); only what a NumPy reference stage plausibly
# uses.  Absent on purpose (CuPy lacks them or they are host-only): np.lib.stride_tricks.as_strided with
# arbitrary strides, np.put_along_axis, np.fft (no stage calls it on device arrays), np.errstate.
CUPY_FUNCTIONS = frozenset(
    """
    all allclose amax amin any append argmax argmin argpartition argsort argwhere around array_equal
    array_split atleast_1d atleast_2d atleast_3d broadcast_arrays broadcast_to clip concatenate copy
    count_nonzero cumprod cumsum diff dot einsum empty_like expand_dims flatnonzero flip full_like
    inner isclose linspace matmul max mean min moveaxis nan_to_num nonzero ones_like outer pad partition
    prod ptp ravel repeat reshape result_type roll rollaxis round shape size sort split squeeze stack std sum
    swapaxes take take_along_axis tensordot tile transpose tril triu var vstack hstack where zeros_like ndim
    may_share_memory shares_memory array_equiv searchsorted unique sliding_window_view
""".split()
)


# The keyword arguments CuPy's functions take (docs.cupy.dev, each function's signature), where NumPy's take
# more (NumPy's ``where=``, ``initial=``, ``subok=``, ``order=`` of many, ``device=`` of NumPy 2 ...).  A keyword
# not listed for its function is refused; a function of CUPY_FUNCTIONS without an entry takes none.
_REDUCE = "axis dtype out keepdims"
CUPY_KEYWORDS = {
    name: frozenset(keywords.split())
    for name, keywords in {
        "all": "axis out keepdims",
        "any": "axis out keepdims",
        "allclose": "rtol atol equal_nan",
        "isclose": "rtol atol equal_nan",
        "amax": "axis out keepdims",
        "amin": "axis out keepdims",
        "max": "axis out keepdims",
        "min": "axis out keepdims",
        "ptp": "axis out keepdims",
        "sum": _REDUCE,
        "prod": _REDUCE,
        "mean": _REDUCE,
        "std": _REDUCE + " ddof",
        "var": _REDUCE + " ddof",
        "argmax": _REDUCE,
        "argmin": _REDUCE,
        "cumsum": "axis dtype out",
        "cumprod": "axis dtype out",
        "count_nonzero": "axis",
        "append": "axis",
        "argpartition": "kth axis",
        "partition": "kth axis",
        "argsort": "axis kind",
        "sort": "axis kind",
        "around": "decimals out",
        "round": "decimals out",
        "array_equal": "equal_nan",
        "array_split": "indices_or_sections axis",
        "split": "indices_or_sections axis",
        "broadcast_to": "shape",
        "clip": "a_min a_max out",
        "concatenate": "axis out dtype casting",
        "stack": "axis out dtype casting",
        "vstack": "dtype casting",
        "hstack": "dtype casting",
        "copy": "order",
        "diff": "n axis prepend append",
        "dot": "out",
        "outer": "out",
        "einsum": "dtype optimize casting",
        "empty_like": "dtype order shape",
        "zeros_like": "dtype order shape",
        "ones_like": "dtype order shape",
        "full_like": "fill_value dtype order shape",
        "expand_dims": "axis",
        "squeeze": "axis",
        "flip": "axis",
        "linspace": "num endpoint retstep dtype axis",
        "moveaxis": "source destination",
        "rollaxis": "axis start",
        "roll": "shift axis",
        "nan_to_num": "copy nan posinf neginf",
        "pad": "pad_width mode constant_values",
        "ravel": "order",
        "repeat": "repeats axis",
        "reshape": "order",
        "size": "axis",
        "swapaxes": "axis1 axis2",
        "take": "indices axis out",
        "take_along_axis": "indices axis",
        "tensordot": "axes",
        "tile": "reps",
        "transpose": "axes",
        "tril": "k",
        "triu": "k",
        "may_share_memory": "max_work",
        "shares_memory": "max_work",
        "searchsorted": "side sorter",
        "unique": "return_index return_inverse return_counts axis equal_nan",
        "sliding_window_view": "window_shape axis writeable",
        # creation functions of the namespace
        "zeros": "dtype order",
        "ones": "dtype order",
        "empty": "dtype order",
        "full": "fill_value dtype order",
        "arange": "start stop step dtype",
    }.items()
}
CUPY_UFUNC_KEYWORDS = {  # a CuPy ufunc's keywords, per method
    "__call__": frozenset({"out", "dtype", "casting"}),
    "reduce": frozenset({"axis", "dtype", "out", "keepdims"}),
    "accumulate": frozenset({"axis", "dtype", "out"}),
    "outer": frozenset({"out", "dtype", "casting"}),
}
# The functions whose result CuPy returns as a 0-d device array where NumPy returns a Python scalar.
ZERO_D_RESULTS = frozenset({"array_equal", "allclose", "count_nonzero"})


def _check_keywords(name: str, kwargs: dict, allowed: frozenset | None = None) -> None:
    """TypeError naming the keyword arguments of ``kwargs`` that CuPy's ``name`` does not take."""
    allowed = CUPY_KEYWORDS.get(name, frozenset()) if allowed is None else allowed
    refused = sorted(set(kwargs) - allowed)
    if refused:
        raise TypeError(
            f"numpy.{name}: CuPy's {name} takes no keyword argument {', '.join(map(repr, refused))} "
            "(refimpl.backends.strict_device.CUPY_KEYWORDS)"
        )


class StrictArray:
    """A NumPy array on the pretend device.  Build one with ``to_device`` or the ``xp`` functions."""

    __slots__ = ("_data",)
    __array_priority__ = 1000  # binary operators with a host ndarray come here (and are refused)

    def __init__(self, data: np.ndarray):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"StrictArray wraps a numpy.ndarray, not {type(data).__name__}")
        self._data = data

    # -- what a device array may tell without a transfer

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    nbytes = property(lambda self: self._data.nbytes)
    itemsize = property(lambda self: self._data.itemsize)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: self._data.flags)
    T = property(lambda self: StrictArray(self._data.T))

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StrictArray(shape={self.shape}, dtype={self.dtype})"

    __hash__ = None

    # -- refused: implicit conversion to the host

    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT_MESSAGE)

    def __index__(self):
        raise TypeError(
            "a StrictArray cannot be used as a Python index (that would be an implicit sync); use int(a) explicitly"
        )

    # -- allowed and counted: explicit transfer and synchronising reads

    def get(self) -> np.ndarray:
        """A host copy (as ``cupy.ndarray.get``)."""
        transfers["to_host"] += 1
        return self._data.copy()

    def _sync(self):
        transfers["sync"] += 1
        return self._data

    def __bool__(self):
        return bool(self._sync())

    def __float__(self):
        return float(self._sync())

    def __int__(self):
        return int(self._sync())

    def __complex__(self):
        return complex(self._sync())

    def item(self, *args):
        return self._sync().item(*args)

    def tolist(self):
        return self._sync().tolist()

    # -- indexing: ints, slices, None, Ellipsis, booleans and StrictArrays; never host arrays or lists

    def __getitem__(self, key):
        return _wrap(self._data[_wrapped_index(_unwrap_index(key), self.shape)])

    def __setitem__(self, key, value):
        self._data[_wrapped_index(_unwrap_index(key), self.shape)] = _unwrap(value, "assign")

    def __iter__(self):
        for i in range(len(self._data)):
            yield self[i]

    # -- NumPy protocols: only what CuPy has, never mixed with host arrays

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc.__name__ not in CUPY_UFUNCS:
            raise TypeError(f"numpy.{ufunc.__name__} is not a ufunc CuPy implements")
        if method not in CUPY_UFUNC_KEYWORDS:
            raise TypeError(f"ufunc method {method!r} is not supported on device arrays")
        _check_keywords(f"{ufunc.__name__}.{method}", kwargs, CUPY_UFUNC_KEYWORDS[method])
        args = [_unwrap(x, f"numpy.{ufunc.__name__}") for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o, f"numpy.{ufunc.__name__}(out=)") for o in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        name = func.__name__
        if name not in CUPY_FUNCTIONS:
            raise TypeError(
                f"numpy.{name} is not in the CuPy functions this stand-in allows "
                "(refimpl.backends.strict_device.CUPY_FUNCTIONS)"
            )
        if any(issubclass(t, np.ndarray) for t in types):
            raise TypeError(f"numpy.{name}: a device array cannot be mixed with a host numpy.ndarray")
        _check_keywords(name, kwargs)
        result = func(*_unwrap_tree(args, f"numpy.{name}"), **_unwrap_tree(kwargs, f"numpy.{name}"))
        if name in ZERO_D_RESULTS and isinstance(result, _SCALARS):
            return StrictArray(np.asarray(result))  # CuPy: a 0-d device array, not a host scalar
        return _wrap(result)

    # -- methods (each one CuPy's ndarray has)

    def astype(self, dtype, copy: bool = True):
        return StrictArray(self._data.astype(dtype, copy=copy))

    def copy(self):
        return StrictArray(self._data.copy())

    def reshape(self, *shape):
        return StrictArray(self._data.reshape(*shape))

    def transpose(self, *axes):
        return StrictArray(self._data.transpose(*axes))

    def swapaxes(self, a, b):
        return StrictArray(self._data.swapaxes(a, b))

    def ravel(self):
        return StrictArray(self._data.ravel())

    def view(self, dtype):
        return StrictArray(self._data.view(dtype))

    def fill(self, value):
        self._data.fill(_unwrap(value, "fill"))


_METHOD_KEYWORDS = {"clip": frozenset({"min", "max", "out"}), "flatten": frozenset({"order"})}  # else the function's


def _reduction(name):
    allowed = _METHOD_KEYWORDS.get(name, CUPY_KEYWORDS.get(name, frozenset()))

    def method(self, *args, **kwargs):
        _check_keywords(f"ndarray.{name}", kwargs, allowed)
        return _wrap(getattr(self._data, name)(*_unwrap_tree(args, name), **_unwrap_tree(kwargs, name)))

    method.__name__ = name
    return method


for _name in (
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "all",
    "any",
    "cumsum",
    "prod",
    "std",
    "var",
    "clip",
    "nonzero",
    "squeeze",
    "flatten",
    "repeat",
    "take",
    "sort",
    "argsort",
):
    setattr(StrictArray, _name, _reduction(_name))


def _binary(ufunc, reflected=False):
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


def _inplace(ufunc):
    def method(self, other):
        ufunc(self, other, out=(self,))
        return self

    return method


for _op, _uf in (
    ("add", np.add),
    ("sub", np.subtract),
    ("mul", np.multiply),
    ("truediv", np.true_divide),
    ("floordiv", np.floor_divide),
    ("mod", np.remainder),
    ("pow", np.power),
    ("matmul", np.matmul),
    ("and", np.bitwise_and),
    ("or", np.bitwise_or),
    ("xor", np.bitwise_xor),
    ("lshift", np.left_shift),
    ("rshift", np.right_shift),
):
    setattr(StrictArray, f"__{_op}__", _binary(_uf))
    setattr(StrictArray, f"__r{_op}__", _binary(_uf, reflected=True))
    setattr(StrictArray, f"__i{_op}__", _inplace(_uf))
for _op, _uf in (
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
    ("eq", np.equal),
    ("ne", np.not_equal),
):
    setattr(StrictArray, f"__{_op}__", _binary(_uf))
StrictArray.__neg__ = lambda self: np.negative(self)
StrictArray.__pos__ = lambda self: np.positive(self)
StrictArray.__abs__ = lambda self: np.absolute(self)
StrictArray.__invert__ = lambda self: np.invert(self)


# ----------------------------------------------------------------------------- wrapping and unwrapping


_SCALARS = (bool, int, float, complex, np.generic)


def _wrap(result):
    """NumPy results back on the pretend device: arrays and NumPy scalars (as 0-d arrays, like CuPy)
    wrapped, tuples and lists element by element; Python values (shapes, dtypes) as they are."""
    if isinstance(result, np.ndarray):
        return StrictArray(result)
    if isinstance(result, np.generic):
        return StrictArray(np.asarray(result))
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return tuple(_wrap(r) for r in result)
    if isinstance(result, list):
        return [_wrap(r) for r in result]
    return result


def _unwrap(x, where: str):
    """The NumPy array under a StrictArray; scalars pass; a host ndarray is refused."""
    if isinstance(x, StrictArray):
        return x._data
    if isinstance(x, np.ndarray):
        raise TypeError(
            f"{where}: a host numpy.ndarray cannot be mixed with device arrays (upload it with to_device first)"
        )
    return x


def _unwrap_tree(x, where: str):
    if isinstance(x, (StrictArray, np.ndarray)):
        return _unwrap(x, where)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap_tree(v, where) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap_tree(v, where) for k, v in x.items()}
    return x


def _unwrap_index(key):
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    if isinstance(key, StrictArray):
        return key._data
    if key is None or key is Ellipsis or isinstance(key, (slice, bool, int, np.integer)):
        return key
    if isinstance(key, np.ndarray):
        raise TypeError("a host numpy.ndarray cannot index a device array (upload the index with to_device)")
    raise TypeError(
        f"index of type {type(key).__name__} is not allowed on a device array (ints, slices, None, "
        "Ellipsis and device arrays only)"
    )


def _wrapped_index(key, shape):
    """``key`` (unwrapped) with every integer index array taken modulo the length of the axis it indexes:
    CuPy wraps out-of-range integer array indices around where NumPy raises IndexError.  Python ints, slices,
    None, Ellipsis and boolean masks are left as they are (CuPy checks scalar indices as NumPy does)."""
    parts = key if isinstance(key, tuple) else (key,)
    if not any(isinstance(k, np.ndarray) and k.dtype.kind in "iu" for k in parts):
        return key

    def width(k):  # the axes of the array an index component consumes
        if k is None:
            return 0
        if isinstance(k, np.ndarray) and k.dtype == bool:
            return k.ndim
        return 1

    n_ellipsis = len(shape) - sum(width(k) for k in parts if k is not Ellipsis)
    axis, wrapped = 0, []
    for k in parts:
        if k is Ellipsis:
            axis += n_ellipsis
        elif isinstance(k, np.ndarray) and k.dtype.kind in "iu" and shape[axis] > 0:
            k = np.mod(k, shape[axis])
        wrapped.append(k)
        axis += 0 if k is Ellipsis else width(k)
    return tuple(wrapped) if isinstance(key, tuple) else wrapped[0]


# ----------------------------------------------------------------------------- transfers


def to_device(host) -> StrictArray:
    """Upload a host array (or nested lists / scalars) to the pretend device: a copy, counted."""
    if isinstance(host, StrictArray):
        raise TypeError("to_device: the array is already on the device")
    transfers["to_device"] += 1
    return StrictArray(np.array(host, copy=True))


def to_host(device_array) -> np.ndarray:
    """Download a StrictArray to a host ndarray (a copy, counted); anything else is a TypeError."""
    if not isinstance(device_array, StrictArray):
        raise TypeError(f"to_host expects a StrictArray, got {type(device_array).__name__}")
    return device_array.get()


# ----------------------------------------------------------------------------- the array namespace ``xp``


def _creation(func):
    def create(*args, **kwargs):
        _check_keywords(func.__name__, kwargs)
        return StrictArray(func(*_unwrap_tree(args, func.__name__), **_unwrap_tree(kwargs, func.__name__)))

    create.__name__ = func.__name__
    return create


def _asarray(x, dtype=None):
    """Like ``cupy.asarray`` for device arrays and Python values; a host ndarray must use ``to_device``."""
    if isinstance(x, StrictArray):
        return x if dtype is None else x.astype(dtype, copy=False)
    if isinstance(x, np.ndarray) or (
        isinstance(x, (list, tuple)) and any(isinstance(v, (np.ndarray, StrictArray)) for v in x)
    ):
        raise TypeError("xp.asarray: host arrays reach the device through to_device (counted), not asarray")
    return StrictArray(np.asarray(x, dtype=dtype))


class _Special:
    """``cupyx.scipy.special`` for the functions the primitives use."""

    erf = staticmethod(lambda x: _wrap(_scipy_special.erf(_unwrap(x, "special.erf"))))
    expit = staticmethod(lambda x: _wrap(_scipy_special.expit(_unwrap(x, "special.expit"))))


class _Namespace:
    """The stand-in's ``cupy``: creation functions, ``special``, dtypes and constants, and every function
    of ``CUPY_FUNCTIONS`` / ``CUPY_UFUNCS`` under its NumPy name (refusing host arrays)."""

    special = _Special()
    ndarray = StrictArray
    asarray = staticmethod(_asarray)
    array = staticmethod(lambda x, dtype=None: _asarray(x, dtype).copy())
    zeros = staticmethod(_creation(np.zeros))
    ones = staticmethod(_creation(np.ones))
    empty = staticmethod(_creation(np.empty))
    full = staticmethod(_creation(np.full))
    arange = staticmethod(_creation(np.arange))
    inf, nan, pi, newaxis = np.inf, np.nan, np.pi, np.newaxis

    def __getattr__(self, name):
        if name in CUPY_UFUNCS or name in CUPY_FUNCTIONS:
            func = getattr(np, name)

            def call(*args, **kwargs):
                return func(*args, **kwargs) if _has_device_array(args) else _creation(func)(*args, **kwargs)

            call.__name__ = name
            return call
        if isinstance(getattr(np, name, None), type) and issubclass(getattr(np, name), np.generic):
            return getattr(np, name)  # dtypes: xp.float32, xp.int64 ...
        raise AttributeError(
            f"the strict device namespace has no {name!r} (CuPy has no such function, or the stand-in does not list it)"
        )


def _has_device_array(args) -> bool:
    return any(isinstance(a, StrictArray) or (isinstance(a, (list, tuple)) and _has_device_array(a)) for a in args)


xp = _Namespace()
special = xp.special  # what refimpl.backends.special_module hands the primitives for StrictArrays
