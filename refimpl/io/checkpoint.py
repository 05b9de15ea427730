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
import math
import mmap
import os
import stat
import struct
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.bf16 import BF16Matrix, bf16_bits_to_float32, float32_to_bf16_bits
from ..backends.host_memory import huge_page_array, huge_pages_enabled
from . import finite_verdicts
from .files import MAX_JSON_BYTES, InputError, atomic_output, parse_json, plain_file_name, read_limited
from .mapped_files import track
from .memory import check_room, file_size, names_the_file_when_memory_runs_out

__all__ = [
    "CheckpointError",
    "compute_dtype",
    "WeightSpec",
    "WeightView",
    "read_config",
    "read_safetensors_file",
    "read_checkpoint_weights",
    "tensor_headers",
    "read_json_object",
    "read_safetensors_header",
    "STORED_DTYPES",
    "check_weights",
    "check_prefixes",
    "write_safetensors_file",
]


class CheckpointError(InputError):
    """A checkpoint directory or weight file is missing, malformed, or does not fit the model."""


COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def compute_dtype(dtype) -> type:
    """The compute dtype of a model as a NumPy scalar type: float32 (like the official model) or float64
    (the higher-precision oracle mode); anything else is a ValueError."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64, not {dtype!r}") from None
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64, not {np.dtype(dtype)}")
    return np.dtype(dtype).type


# safetensors dtype name -> numpy dtype of the stored bytes (bf16 is read as raw uint16 bits)
STORED_DTYPES = {
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
    without the common prefix.  A view of a view is a view of the same dict (``WeightView(layer, "mlp.")``
    is ``layer.sub("mlp.")``): ``weights`` is always the whole dict, ``prefix`` the whole prefix, so that a
    stage takes either the dict or a view of it."""

    __slots__ = ("weights", "prefix")

    def __init__(self, weights: Mapping[str, np.ndarray] | WeightView, prefix: str = ""):
        if isinstance(weights, WeightView):
            weights, prefix = weights.weights, weights.prefix + prefix
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> np.ndarray:
        return self.weights[self.prefix + name]

    def get(self, name: str, default=None):
        return self.weights.get(self.prefix + name, default)

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.weights

    def sub(self, prefix: str) -> WeightView:
        return WeightView(self.weights, self.prefix + prefix)

    def __repr__(self) -> str:
        return f"WeightView({self.prefix!r})"


def read_json_object(path: str | os.PathLike, what: str = "") -> dict:
    """Read a JSON file that must hold an object (a dict); any problem is a CheckpointError naming the file:
    larger than ``MAX_JSON_BYTES`` (checked before reading; a stream is read up to it), not UTF-8 JSON,
    nested deeper than ``files.MAX_JSON_DEPTH``."""
    path = Path(path)
    raw = read_limited(path, MAX_JSON_BYTES, str(path), CheckpointError, regular_only=True)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not valid UTF-8 text: {e}") from None
    data = parse_json(text, str(path), CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object{what}, found a JSON {type(data).__name__}")
    return data


def read_config(directory: str | os.PathLike) -> dict:
    """Read ``config.json`` of a checkpoint directory as a plain dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {directory!s}")
    return read_json_object(path)


# ----------------------------------------------------------------------------- safetensors headers
#
# A header is checked completely before any tensor is read: a damaged or hand-edited file must not be
# able to make us read header bytes as weights, alias two tensors, or read a float tensor as integers.

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


def _read_header(path: Path) -> tuple[dict, int]:
    """The checked header of a safetensors file (``__metadata__`` removed) and where its data starts."""
    header, _, data_start = read_safetensors_header(path)
    return header, data_start


def read_safetensors_header(path, error=CheckpointError) -> tuple[dict, dict, int]:
    """(tensor entries, ``__metadata__`` or {}, where the data starts) of a safetensors file, every entry
    checked (``check_tensor_entry``) and the data section covered exactly (``check_data_covered``); any
    problem is one ``error`` naming the file.  Only a regular file is read (the tensors are memory-mapped
    from it): a pipe or a device is refused before it is opened."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe or a device?)"
        raise error(f"cannot read {path} as safetensors: it is {kind}")
    file_size = info.st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise error(f"{path} is too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > file_size - 8:
                raise error(f"{path}: header length {n} runs past the end of the file")
            if n > MAX_HEADER_BYTES:
                raise error(f"{path}: header length {n} is over the format's limit of {MAX_HEADER_BYTES} bytes")
            raw = f.read(n)
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    header = parse_json(raw, f"{path}: malformed safetensors header: the header", error)
    if not isinstance(header, dict):
        raise error(f"{path}: the safetensors header must be a JSON object, found a JSON {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise error(f"{path}: __metadata__ must be a JSON object, found {type(metadata).__name__}")
    try:
        for name, entry in header.items():
            check_tensor_entry(path, name, entry)
        check_data_covered(path, header, file_size - 8 - n)
    except CheckpointError as e:
        raise error(str(e)) from None
    return header, metadata or {}, 8 + n


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_tensor_entry(path, name: str, info) -> None:
    """One header entry: an object with a known dtype, a shape of non-negative ints, and a byte range
    [begin, end] whose length is exactly the shape's element count times the dtype's size."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: entry must be a JSON object, found {type(info).__name__}")
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in info]
    if missing:
        raise CheckpointError(f"{where}: entry lacks {', '.join(missing)}")
    stored = STORED_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if stored is None:
        raise CheckpointError(
            f"{where} has unsupported dtype {info['dtype']!r} (supported: {', '.join(STORED_DTYPES)})"
        )
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    offsets = info["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise CheckpointError(f"{where}: data_offsets must be two non-negative integers [begin, end], got {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise CheckpointError(f"{where}: data_offsets end {end} is before begin {begin}")
    count = math.prod(shape)
    if end - begin != count * stored.itemsize:
        raise CheckpointError(
            f"{where}: byte range [{begin}, {end}) holds {end - begin} bytes, but shape "
            f"{tuple(shape)} of {info['dtype']} needs {count * stored.itemsize}"
        )


def check_data_covered(path, header: Mapping[str, dict], data_size: int) -> None:
    """The tensors' byte ranges must tile the data section exactly: in range, no overlap, no gap."""
    position, previous = 0, None
    for name, info in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, end = info["data_offsets"]
        if begin < position:
            raise CheckpointError(
                f"{path}: tensor {name!r} bytes [{begin}, {end}) overlap tensor {previous!r} (which ends at {position})"
            )
        if begin > position:
            raise CheckpointError(f"{path}: bytes [{position}, {begin}) before tensor {name!r} belong to no tensor")
        if end > data_size:
            raise CheckpointError(
                f"{path}: tensor {name!r} bytes [{begin}, {end}) run past the end of the data ({data_size} bytes)"
            )
        position, previous = end, name
    if position != data_size:
        raise CheckpointError(
            f"{path}: the data section has {data_size} bytes but the tensors cover {position} "
            "(truncated or padded file)"
        )


@names_the_file_when_memory_runs_out
def read_safetensors_file(
    path: str | os.PathLike,
    dtype=np.float32,
    names: Iterable[str] | None = None,
    keep_bf16: bool = False,
    huge_pages: bool = True,
) -> dict:
    """Read tensors from one ``.safetensors`` file.

    Floating tensors are converted to ``dtype`` (bf16/f16/f32 -> float32 or float64); integer tensors
    keep their type.  The file is memory-mapped, so only the tensors asked for are read from disk, and a
    tensor already stored in ``dtype`` is returned as a read-only view of the map rather than copied
    (copy it before modifying it).  With ``keep_bf16`` (float32 only), a bfloat16 matrix stays as its
    16-bit words in a ``BF16Matrix``, widened where it is used: the words of a matrix the kernels stream
    (every one but the embedding tables) copied unchanged into 2 MB huge pages where the host-memory policy
    places them (``refimpl.backends.host_memory.huge_pages_enabled``), the others a view of the map;
    ``huge_pages=False`` leaves them all in the map (a loader that copies them later, off the first call's path).
    """
    path = Path(path)
    header, data_start = _read_header(path)
    # plain ndarray views of the map (the map stays open through their base): np.memmap's own views run
    # Python at every index (a generation step's embedding rows: 20-50 us a lookup)
    wanted = header.keys() if names is None else [n for n in names if n in header]
    kept = [n for n in wanted if keep_bf16 and np.dtype(dtype) == np.float32 and _is_bf16_matrix(header[n])]
    read_whole = [n for n in kept if not is_lookup_table(n)]
    copying = huge_pages and huge_pages_enabled()
    # out of address space (ulimit -v): said before a byte is allocated (io/memory.py)
    check_room(str(path), load_bytes(path, header, wanted, kept, read_whole if copying else [], dtype))
    version = finite_verdicts.FileVersion.of(path)  # (taken before the map: what the check's verdict is of)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    track(mapped, path)  # named if the file shrinks under the map (io/mapped_files.py: a bus error)
    raw = mapped.view(np.ndarray)
    copies = _read_copies(path, data_start, header, read_whole) if copying else {}
    out = {}
    for name in wanted:
        info = header[name]
        stored = STORED_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if name in kept:
            words = copies[name] if name in copies else raw[data_start + begin : data_start + end]
            out[name] = BF16Matrix(words.view(stored).reshape(shape))
            continue
        arr = raw[data_start + begin : data_start + end].view(stored).reshape(shape)
        if info["dtype"] == "BF16":
            arr = bf16_bits_to_float32(arr)
        # a float stored in the compute dtype: a read-only view of the memory map (no copy, pages read on use);
        # otherwise a converted copy
        out[name] = np.ascontiguousarray(arr, dtype=dtype) if arr.dtype.kind == "f" else np.array(arr)
    if version is not None:
        for name in wanted:
            note_read_from(out[name], version, name)
    return out


def load_bytes(path: Path, header: Mapping[str, dict], wanted, kept, read_whole, dtype) -> int:
    """A lower bound of the address space ``read_safetensors_file`` holds at once: the map of the whole file,
    the huge-page copies and the converted tensors."""
    nbytes = {n: info["data_offsets"][1] - info["data_offsets"][0] for n, info in header.items()}
    total = file_size(path) + sum(-(-nbytes[n] // 64) * 64 for n in read_whole)
    for name in set(wanted) - set(kept):
        stored = np.dtype(STORED_DTYPES[header[name]["dtype"]])
        if stored.kind != "f":
            total += nbytes[name]  # an integer tensor: copied
        elif stored != np.dtype(dtype):
            total += nbytes[name] // stored.itemsize * np.dtype(dtype).itemsize  # converted
    return total


def _is_bf16_matrix(info: dict) -> bool:
    return info["dtype"] == "BF16" and len(info["shape"]) == 2


def is_lookup_table(name: str) -> bool:
    """An embedding table (``...embedding.weight``, ``embed_tokens``): read by rows, never read whole,
    so it stays memory-mapped (the pages of the looked-up rows are read on use)."""
    return "embed" in name


def _read_copies(path: Path, data_start: int, header: Mapping[str, dict], names: list) -> dict:
    """The stored bytes of tensors ``names``, unchanged (bfloat16 words stay 16-bit words), read from the
    file into one array placed in huge pages (``host_memory.huge_page_array``), each tensor on a cache
    line: name -> read-only uint8 array.  The file is read with ``readinto``, so its page-cache pages are
    not mapped into this process: the resident memory is the copy, about the size of the tensors, as it
    was with the memory map."""
    if not names:
        return {}
    align = 64  # each tensor starts on a cache line
    slots, total = {}, 0
    for name in sorted(names, key=lambda n: header[n]["data_offsets"][0]):  # file order: sequential reads
        begin, end = header[name]["data_offsets"]
        slots[name] = (total, begin, end)
        total += -(-(end - begin) // align) * align
    if total == 0:
        return {}
    arena = huge_page_array(total)
    out = {}
    with open(path, "rb", buffering=0) as f:
        for name, (at, begin, end) in slots.items():
            target = memoryview(arena[at : at + end - begin])
            f.seek(data_start + begin)
            filled = 0
            while filled < end - begin:
                n = f.readinto(target[filled:])
                if not n:
                    raise CheckpointError(f"{path}: tensor {name!r} ends past the end of the file (truncated?)")
                filled += n
            copy = arena[at : at + end - begin]
            copy.flags.writeable = False
            out[name] = copy
    arena.flags.writeable = False  # (nothing writes the copies again: read-only views of a read-only array)
    return out


def _weight_files(directory: Path) -> list[Path]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        files = sorted(set(_index_weight_map(index).values()))
        for name in files:
            check_shard_path(directory, index, name)
        missing = [name for name in files if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shard files listed in the index are missing: {missing}")
        return [directory / name for name in files]
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {directory!s}")


def _index_weight_map(index: Path) -> dict:
    """``weight_map`` of a shard index: tensor name -> shard file name, checked to be strings."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: weight_map must be a non-empty JSON object (tensor name -> shard file)")
    bad = [name for name, shard in weight_map.items() if not isinstance(shard, str)]
    if bad:
        raise CheckpointError(f"{index}: weight_map[{bad[0]!r}] is {weight_map[bad[0]]!r}, not a file name")
    return weight_map


def check_shard_path(directory: Path, index: Path, name: str) -> None:
    """A shard named by an index must be a plain file name in the checkpoint directory (no folder part,
    no ``..``, not absolute).  The name is checked, not where it resolves to: the Hugging Face cache
    keeps checkpoint files as symbolic links into its blob store."""
    if not plain_file_name(name):
        raise CheckpointError(
            f"{index}: shard path {name!r} is not a file name inside the checkpoint directory {directory}"
        )


def checked_headers(directory: str | os.PathLike) -> list:
    """(path, header) of every weight file of a checkpoint directory; a tensor defined by two shards, or
    listed by the index under a shard that does not hold it, is an error."""
    directory = Path(directory)
    files = _weight_files(directory)
    out, seen = [], {}
    for path in files:
        header, _ = _read_header(path)
        for name in header:
            if name in seen:
                raise CheckpointError(
                    f"{directory}: tensor {name!r} is defined twice, in {seen[name].name} and {path.name}"
                )
            seen[name] = path
        out.append((path, header))
    index = directory / "model.safetensors.index.json"
    if len(files) > 1 or files[0].name != "model.safetensors":
        for name, shard in _index_weight_map(index).items():
            if seen.get(name) is None or seen[name].name != Path(shard).name:
                where = seen[name].name if name in seen else "no shard"
                raise CheckpointError(f"{index}: tensor {name!r} is listed in {shard}, but is in {where}")
    return out


def tensor_headers(directory: str | os.PathLike) -> dict:
    """Name -> (stored dtype, shape) of every tensor of a checkpoint directory, from the headers only."""
    out = {}
    for _, header in checked_headers(directory):
        out.update({name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()})
    return out


def read_checkpoint_weights(
    directory: str | os.PathLike, dtype=np.float32, prefix: str = "", keep_bf16: bool = False, huge_pages: bool = True
) -> dict:
    """Read every tensor of a checkpoint directory (single file or shards) whose name starts with
    ``prefix``; the prefix is removed from the returned names.  ``keep_bf16``, ``huge_pages``: see
    ``read_safetensors_file``."""
    out = {}
    for path, header in checked_headers(directory):
        names = [n for n in header if n.startswith(prefix)]
        for name, arr in read_safetensors_file(path, dtype, names, keep_bf16, huge_pages).items():
            out[name[len(prefix) :]] = arr
    return out


@dataclass(frozen=True)
class WeightSpec:
    """One tensor a network expects: its name, its shape, and how the synthetic-checkpoint generator
    should initialise it (see ``refimpl.porting.synthetic``)."""

    name: str
    shape: tuple
    init: str = "linear"


def check_weights(
    weights: Mapping[str, np.ndarray], spec: Iterable[WeightSpec], where: str, allow_extra: bool = False
) -> None:
    """Compare loaded tensors with what a network expects (names, shapes, floating dtype, finite values);
    raise one error listing every problem.  A tensor read from a file whose remembered verdict names it
    finite is not read again (``non_finite_unless_remembered``)."""
    spec = list(spec)
    expected = {s.name: tuple(s.shape) for s in spec}
    missing = [f"{n} {list(shape)}" for n, shape in expected.items() if n not in weights]
    wrong = [
        f"{n}: expected {list(shape)}, found {list(weights[n].shape)}"
        for n, shape in expected.items()
        if n in weights and tuple(weights[n].shape) != shape
    ]
    extra = [] if allow_extra else sorted(n for n in weights if n not in expected)
    not_float = [f"{n} ({weights[n].dtype})" for n in expected if n in weights and weights[n].dtype.kind != "f"]
    not_finite = non_finite_unless_remembered(weights, [n for n in expected if n in weights])
    if not (missing or wrong or extra or not_float or not_finite):
        return
    lines = [
        f"{where}: the weights do not fit the config"
        if missing or wrong or extra or not_float
        else f"{where}: damaged weights"
    ]
    if missing:
        lines.append(
            f"  missing tensors ({len(missing)}): " + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        )
    if wrong:
        lines.append(
            f"  mis-shaped tensors ({len(wrong)}): " + "; ".join(wrong[:20]) + (" ..." if len(wrong) > 20 else "")
        )
    if not_finite:
        lines.append(
            f"  tensors holding NaN or infinity ({len(not_finite)}): "
            + ", ".join(not_finite[:20])
            + (" ..." if len(not_finite) > 20 else "")
        )
    if not_float:
        lines.append(
            f"  tensors stored as integers, not floating point ({len(not_float)}): "
            + ", ".join(not_float[:20])
            + (" ..." if len(not_float) > 20 else "")
        )
    if extra:
        lines.append(
            f"  unexpected tensors ({len(extra)}): " + ", ".join(extra[:20]) + (" ..." if len(extra) > 20 else "")
        )
    raise CheckpointError("\n".join(lines))


# ----------------------------------------------------------------------------- where a tensor was read from
#
# The tensors ``read_safetensors_file`` returns as the file's own bytes, read-only (views of the map, the
# huge-page copies, a BF16Matrix's words), are noted with the file version and the name they were read
# from, so that the finiteness check may take its verdict from the store (``finite_verdicts``).  A tensor
# converted to another dtype is a writeable copy its owner may change (and float64 -> float32 may overflow):
# never noted, always checked, as are arrays a caller builds.

_read_from: dict[int, tuple] = {}  # id of the words -> (weak reference to them, FileVersion, tensor name)


def _words(arr):
    return arr.bits if isinstance(arr, BF16Matrix) else arr


def note_read_from(arr, version: finite_verdicts.FileVersion, name: str) -> None:
    """Note that ``arr`` holds the stored values of tensor ``name`` of ``version`` (if it is read-only)."""
    words = _words(arr)
    if not isinstance(words, np.ndarray) or words.flags.writeable:
        return
    key = id(words)
    _read_from[key] = (weakref.ref(words, lambda _, key=key: _read_from.pop(key, None)), version, name)


def read_from(arr) -> tuple | None:
    """(FileVersion, tensor name) that ``arr`` was read from, still read-only; None for anything else."""
    words = _words(arr)
    entry = _read_from.get(id(words))
    if entry is None or entry[0]() is not words or words.flags.writeable:
        return None
    return entry[1], entry[2]


def non_finite_unless_remembered(weights: Mapping[str, np.ndarray], names) -> list:
    """``non_finite_tensors`` of ``names``, less the tensors read from a file version whose verdict in the store
    (``finite_verdicts``) names them finite; the tensors found finite are added to their file's verdict."""
    origins = {name: read_from(weights[name]) for name in names}
    known = {version: finite_verdicts.remembered(version) for version in {o[0] for o in origins.values() if o}}
    unknown = [n for n in names if not origins[n] or origins[n][1] not in known[origins[n][0]]]
    bad = non_finite_tensors(weights, unknown)
    found: dict = {}
    for name in set(unknown).difference(bad):
        if origins[name]:
            version, stored_name = origins[name]
            found.setdefault(version, set()).add(stored_name)
    for version, finite in found.items():
        finite_verdicts.remember(version, finite)
    return bad


def non_finite_tensors(weights: Mapping[str, np.ndarray], names, span: int = 1 << 22) -> list:
    """Names of floating tensors that hold NaN or infinity, read in spans (no full-size temporary).  The
    pages of a memory-mapped lookup table are given back as soon as they are checked (``release_pages``):
    generation reads a few of its rows, so the check must not leave the whole table in this process's
    memory (the Talker's text embedding alone is 622 MB of the 0.6B model's 1.81 GB)."""
    bad = []
    exponents = np.empty(span, np.uint16)  # (one buffer for every span: no temporaries to map)
    for name in names:
        arr = weights[name]
        if isinstance(arr, BF16Matrix):  # NaN or infinity: all 8 exponent bits set, the largest exponent
            flat = arr.bits.reshape(-1)
            release = is_lookup_table(name)
            finite = True
            for i in range(0, flat.size, span):
                part = flat[i : i + span]
                if finite and isinstance(part, np.ndarray):  # host words: their exponents in the one buffer
                    np.bitwise_and(part, 0x7F80, out=exponents[: part.size])
                    finite = int(exponents[: part.size].max()) != 0x7F80
                elif finite:  # a device's words: its own arrays
                    finite = not bool((part & 0x7F80 == 0x7F80).any())
                if release:
                    release_pages(part)
                elif not finite:
                    break
            if not finite:
                bad.append(name)
            continue
        if arr.dtype.kind != "f":
            continue
        flat = arr.reshape(-1)
        if any(not np.isfinite(flat[i : i + span]).all() for i in range(0, flat.size, span)):
            bad.append(name)
    return bad


def _file_map_under(arr):
    """The ``mmap`` whose memory ``arr`` views (the map of the ``np.memmap`` among its bases), else None."""
    while arr is not None:
        if isinstance(arr, np.memmap):
            return getattr(arr, "_mmap", None)
        arr = getattr(arr, "base", None)
    return None


def release_pages(arr) -> bool:
    """Give back this process's mapping of the whole pages under ``arr`` when it is a view of a read-only
    memory map of a file (``madvise(MADV_DONTNEED)``): the values are unchanged, and a later read maps the
    pages again from the file (from the system's page cache while it holds them).  Returns whether it did
    (False for arrays in memory, or where the system has no ``MADV_DONTNEED``)."""
    mapping = _file_map_under(arr)
    if mapping is None or not hasattr(mmap, "MADV_DONTNEED") or arr.size == 0:
        return False
    start = np.frombuffer(mapping, dtype=np.uint8, count=0).ctypes.data  # where the map begins
    first = arr.ctypes.data - start
    begin = -(-first // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages only: neighbours keep theirs
    end = (first + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > begin:
        mapping.madvise(mmap.MADV_DONTNEED, begin, end - begin)
    return True


def check_prefixes(directory: str | os.PathLike, prefixes: Iterable[str], where: str) -> None:
    """Every tensor of a checkpoint directory must belong to one of the networks (name prefixes) that
    the loader reads; anything else is reported by name rather than silently ignored."""
    prefixes = tuple(prefixes)
    stray = sorted(n for n in tensor_headers(directory) if not n.startswith(prefixes))
    if stray:
        raise CheckpointError(
            f"{where}: unexpected tensors ({len(stray)}), not under {list(prefixes)}: "
            + ", ".join(stray[:20])
            + (" ..." if len(stray) > 20 else "")
        )


def write_safetensors_file(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    dtype: str = "float32",
    metadata: Mapping[str, str] | None = None,
    sort: bool = True,
) -> None:
    """Write tensors as safetensors.  ``dtype`` is ``"float32"``, ``"float16"``, ``"bfloat16"`` or
    ``"float64"`` and applies to floating tensors, or ``"keep"``: each floating tensor in its own dtype;
    integer tensors are stored as they are.  The tensors are laid out in name order, or in the
    mapping's order with ``sort=False``."""
    float_codes = {
        "float32": ("F32", np.dtype("<f4")),
        "float16": ("F16", np.dtype("<f2")),
        "bfloat16": ("BF16", None),
        "float64": ("F64", np.dtype("<f8")),
    }
    own_codes = {np.dtype(v[1]): (v[0], v[1]) for k, v in float_codes.items() if v[1] is not None}
    if dtype not in float_codes and dtype != "keep":
        raise ValueError(f"unsupported checkpoint dtype {dtype!r}; use float32, float16, bfloat16 or float64")
    int_codes = {np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors) if sort else tensors:
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
    with atomic_output(path) as f:  # a failed write leaves the previous file as it was
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
