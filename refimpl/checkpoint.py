"""Reading and writing Hugging Face style checkpoints, with no framework.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or the sharded
``model-0000x-of-0000y.safetensors`` files listed by ``model.safetensors.index.json``.

The safetensors format is simple enough to read by hand, and doing so lets us read bfloat16
(which ``safetensors.numpy`` refuses, and which the released Qwen3-TTS checkpoints use):

    [8 bytes: little-endian u64 N] [N bytes: JSON header] [raw little-endian tensor bytes]

The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` with
offsets relative to the end of the header.  A bfloat16 number is the upper 16 bits of a float32,
so widening it is a shift: ``float32_bits = bf16_bits << 16``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

__all__ = [
    "CheckpointError",
    "compute_dtype",
    "WeightSpec",
    "WeightView",
    "read_config",
    "read_safetensors_file",
    "read_checkpoint_weights",
    "tensor_headers",
    "check_weights",
    "check_prefixes",
    "write_safetensors_file",
    "bf16_bits_to_float32",
    "float32_to_bf16_bits",
]


class CheckpointError(ValueError):
    """A checkpoint directory or weight file is missing, malformed, or does not fit the model."""


COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def compute_dtype(dtype) -> type:
    """The compute dtype of a model as a NumPy scalar type: float32 (like the official model) or float64
    (the higher-precision oracle mode); anything else is a ValueError."""
    if np.dtype(dtype) not in COMPUTE_DTYPES:
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64, not {np.dtype(dtype)}")
    return np.dtype(dtype).type


# safetensors dtype name -> numpy dtype of the stored bytes (bf16 is read as raw uint16 bits)
_STORED_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class WeightView:
    """The tensors under one checkpoint-name prefix, reached by the rest of their names.

        layer = WeightView(weights, "model.layers.3.")
        layer["self_attn.q_proj.weight"]        # is weights["model.layers.3.self_attn.q_proj.weight"]
        attn = layer.sub("self_attn.")          # attn["q_proj.weight"], the same tensor
        attn.get("q_proj.bias")                 # None when the checkpoint has no such tensor

    Stage code binds one view per layer once, so a line names the tensor as the checkpoint does,
    without the common prefix."""

    __slots__ = ("weights", "prefix")

    def __init__(self, weights: Mapping[str, np.ndarray], prefix: str = ""):
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> np.ndarray:
        return self.weights[self.prefix + name]

    def get(self, name: str, default=None):
        return self.weights.get(self.prefix + name, default)

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.weights

    def sub(self, prefix: str) -> "WeightView":
        return WeightView(self.weights, self.prefix + prefix)

    def __repr__(self) -> str:
        return f"WeightView({self.prefix!r})"


def bf16_bits_to_float32(bits_u16: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bit patterns (uint16) to float32, exactly."""
    return (bits_u16.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even, like torch) and return the uint16 bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding_bias = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = np.where(np.isnan(x), bits | np.uint32(0x00400000), bits + rounding_bias)
    return (rounded >> 16).astype(np.uint16)


def read_config(directory: str | os.PathLike) -> dict:
    """Read ``config.json`` of a checkpoint directory as a plain dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {directory!s}")
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None


def _read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path} is too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > os.path.getsize(path) - 8:
            raise CheckpointError(f"{path}: header length {n} runs past the end of the file")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: malformed safetensors header ({e})") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def read_safetensors_file(path: str | os.PathLike, dtype=np.float32, names: Iterable[str] | None = None) -> dict:
    """Read tensors from one ``.safetensors`` file.

    Floating tensors are converted to ``dtype`` (bf16/f16/f32 -> float32 or float64); integer tensors
    keep their type.  The file is memory-mapped, so only the tensors asked for are read from disk, and a
    tensor already stored in ``dtype`` is returned as a read-only view of the map rather than copied
    (copy it before modifying it).
    """
    path = Path(path)
    header, data_start = _read_header(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    wanted = header.keys() if names is None else [n for n in names if n in header]
    out = {}
    for name in wanted:
        info = header[name]
        stored = _STORED_DTYPES.get(info["dtype"])
        if stored is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * stored.itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} byte range does not match shape {shape}")
        arr = raw[data_start + begin:data_start + end].view(stored).reshape(shape)
        if info["dtype"] == "BF16":
            arr = bf16_bits_to_float32(arr)
        if arr.dtype.kind == "f":
            # stored in the compute dtype: a read-only view of the memory map (no copy, pages read on use);
            # otherwise a converted copy
            arr = np.ascontiguousarray(arr, dtype=dtype)
        else:
            arr = np.array(arr)
        out[name] = arr
    return out


def _weight_files(directory: Path) -> list[Path]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        with open(index, "r", encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shard files listed in the index are missing: {missing}")
        return [directory / name for name in files]
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {directory!s}")


def tensor_headers(directory: str | os.PathLike) -> dict:
    """Name -> (stored dtype, shape) of every tensor of a checkpoint directory, from the headers only."""
    out = {}
    for path in _weight_files(Path(directory)):
        header, _ = _read_header(path)
        out.update({name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()})
    return out


def read_checkpoint_weights(directory: str | os.PathLike, dtype=np.float32, prefix: str = "") -> dict:
    """Read every tensor of a checkpoint directory (single file or shards) whose name starts with
    ``prefix``; the prefix is removed from the returned names."""
    directory = Path(directory)
    out = {}
    for path in _weight_files(directory):
        header, _ = _read_header(path)
        names = [n for n in header if n.startswith(prefix)]
        for name, arr in read_safetensors_file(path, dtype, names).items():
            out[name[len(prefix):]] = arr
    return out


@dataclass(frozen=True)
class WeightSpec:
    """One tensor a network expects: its name, its shape, and how the synthetic-checkpoint generator
    should initialise it (see ``refimpl.synthetic``)."""

    name: str
    shape: tuple
    init: str = "linear"


def check_weights(weights: Mapping[str, np.ndarray], spec: Iterable[WeightSpec], where: str,
                  allow_extra: bool = False) -> None:
    """Compare loaded tensors with what a network expects; raise one error listing every problem."""
    spec = list(spec)
    expected = {s.name: tuple(s.shape) for s in spec}
    missing = [f"{n} {list(shape)}" for n, shape in expected.items() if n not in weights]
    wrong = [f"{n}: expected {list(shape)}, found {list(weights[n].shape)}"
             for n, shape in expected.items() if n in weights and tuple(weights[n].shape) != shape]
    extra = [] if allow_extra else sorted(n for n in weights if n not in expected)
    if not (missing or wrong or extra):
        return
    lines = [f"{where}: the weights do not fit the config"]
    if missing:
        lines.append(f"  missing tensors ({len(missing)}): " + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else ""))
    if wrong:
        lines.append(f"  mis-shaped tensors ({len(wrong)}): " + "; ".join(wrong[:20]) + (" ..." if len(wrong) > 20 else ""))
    if extra:
        lines.append(f"  unexpected tensors ({len(extra)}): " + ", ".join(extra[:20]) + (" ..." if len(extra) > 20 else ""))
    raise CheckpointError("\n".join(lines))


def check_prefixes(directory: str | os.PathLike, prefixes: Iterable[str], where: str) -> None:
    """Every tensor of a checkpoint directory must belong to one of the networks (name prefixes) that
    the loader reads; anything else is reported by name rather than silently ignored."""
    prefixes = tuple(prefixes)
    stray = sorted(n for n in tensor_headers(directory) if not n.startswith(prefixes))
    if stray:
        raise CheckpointError(f"{where}: unexpected tensors ({len(stray)}), not under {list(prefixes)}: "
                              + ", ".join(stray[:20]) + (" ..." if len(stray) > 20 else ""))


def write_safetensors_file(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], dtype: str = "float32",
                           metadata: Mapping[str, str] | None = None, sort: bool = True) -> None:
    """Write tensors as safetensors.  ``dtype`` is ``"float32"``, ``"float16"``, ``"bfloat16"`` or
    ``"float64"`` and applies to floating tensors, or ``"keep"``: each floating tensor in its own dtype;
    integer tensors are stored as they are.  The tensors are laid out in name order, or in the
    mapping's order with ``sort=False``."""
    float_codes = {"float32": ("F32", np.dtype("<f4")), "float16": ("F16", np.dtype("<f2")),
                   "bfloat16": ("BF16", None), "float64": ("F64", np.dtype("<f8"))}
    own_codes = {np.dtype(v[1]): (v[0], v[1]) for k, v in float_codes.items() if v[1] is not None}
    if dtype not in float_codes and dtype != "keep":
        raise ValueError(f"unsupported checkpoint dtype {dtype!r}; use float32, float16, bfloat16 or float64")
    int_codes = {np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL"}
    header, blobs, offset = {}, [], 0
    for name in (sorted(tensors) if sort else tensors):
        arr = np.asarray(tensors[name])
        if arr.dtype.kind == "f":
            code, np_dtype = own_codes[arr.dtype] if dtype == "keep" else float_codes[dtype]
            data = float32_to_bf16_bits(arr.astype(np.float32)) if code == "BF16" else arr.astype(np_dtype)
        else:
            code = int_codes[arr.dtype]
            data = arr
        blob = np.ascontiguousarray(data).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = dict(metadata)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the format aligns the data start to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
