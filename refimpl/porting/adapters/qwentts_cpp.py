"""qwentts.cpp's debug dumps read under our names, and our traces written as its dumps (docs/ports.md).

qwentts.cpp (a GGML port; its CPU wheel is ``realtimetts-qwen-native-cpu``) writes, when a synthesis is given a
``dump_dir``, one file per tensor, ``<dump_dir>/<name>.bin``. The format, as its ``src/debug.h`` describes
it: ``[ndims: int32] [shape: int32 x ndims] [data: float32 x numel]``, little-endian, the data row-major;
integer tensors (token ids, codes) are written as float32 values. Its own check (the ``tests/debug-*-cossim.py``
scripts) writes the official model's tensors in the same format into a second folder and compares the two
folders file by file (cosine similarity and max |difference|).

The names, as ``QWENTTS_NAMES`` (its file -> our key; its files have no batch axis, ours do):

    talker-input-embed            refimpl.talker.prompt.embeds      [T, H]  -> [1, T, H]  the Talker's prefill input
    trailing-text-hidden          refimpl.talker.prompt.trailing    [T', H] -> [1, T', H]
    tts-pad-embed                 refimpl.talker.prompt.tts_pad     [H]
    talker-hidden-prefill-l{n}    talker.model.layers.{n}:0         [T, H]  -> [1, T, H]  n = 0, 7, 14, 21, 27
    talker-hidden-prefill-final   talker.model.norm:0               [T, H]  -> [1, T, H]
    talker-logits-prefill         refimpl.talker.sampling.logits:0  [V]     -> [1, V]     the codec head, last position
    talker-hidden-step1           talker.model.norm:1               [H]     -> [1, 1, H]  the second Talker call
    codes-full                    refimpl.codes.0                   [T, Q]  (integers stored as float32)
    output-audio                  refimpl.waveform.0                [N]     the audio at 24 kHz
    spk-emb                       speaker_encoder                   [D]     -> [1, D]     the x-vector of a clone
    mel-spk                       refimpl.speaker_encoder.mel       [T, M]
    ref-codes                     the codec encoder's codes         [Q, T]  -> Q keys of [1, T]: codebook 0
                                  refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes,
                                  codebook j > 0 ...acoustic_residual_vector_quantizer.layers.{j-1}.codes

``codes-step0`` (frame 0 of ``codes-full``) is checked against ``codes-full`` and left out; a file of no name
above (``prompt-ids``, ``next-emb-step0``, the codec encoder's stage dumps) is kept as ``qwentts.<name>``.

    port = read_qwentts_dump("dump/")            # a Trace: refimpl compare, or a conformance results folder
    write_qwentts_dump(trace, "python/custom/")  # our reference where its cossim scripts read the official's
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np

from ...io.files import InputError, read_limited, write_atomically
from ..trace_files import Trace

__all__ = ["QWENTTS_NAMES", "read_qwentts_bin", "write_qwentts_bin", "read_qwentts_dump", "write_qwentts_dump"]
__all__ += ["QwenttsDumpError"]

SEMANTIC = "refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes"
ACOUSTIC = "refimpl.encoder.quantizer.acoustic_residual_vector_quantizer.layers.{j}.codes"
# its file -> (our key, the file's axes, the batch axes of size 1 ours has in front)
FILES = {
    "mel-spk": ("refimpl.speaker_encoder.mel", 2, 0),
    "spk-emb": ("speaker_encoder", 1, 1),
    "talker-input-embed": ("refimpl.talker.prompt.embeds", 2, 1),
    "trailing-text-hidden": ("refimpl.talker.prompt.trailing", 2, 1),
    "tts-pad-embed": ("refimpl.talker.prompt.tts_pad", 1, 0),
    "talker-hidden-prefill-final": ("talker.model.norm:0", 2, 1),
    "talker-logits-prefill": ("refimpl.talker.sampling.logits:0", 1, 1),
    "talker-hidden-step1": ("talker.model.norm:1", 1, 2),
    "codes-full": ("refimpl.codes.0", 2, 0),
    "output-audio": ("refimpl.waveform.0", 1, 0),
}
QWENTTS_NAMES = {name: key for name, (key, _, _) in FILES.items()}
QWENTTS_NAMES["talker-hidden-prefill-l{n}"] = "talker.model.layers.{n}:0"
QWENTTS_NAMES["ref-codes"] = f"{SEMANTIC}, {ACOUSTIC} (j = codebook - 1)"
INTEGER_FILES = ("codes-full", "codes-step0", "ref-codes", "prompt-ids", "instruct-ids")
LAYER = re.compile(r"talker-hidden-prefill-l(\d{1,4})")
BISECT_LAYERS = (0, 7, 14, 21, 27)  # the Talker layers qwentts.cpp dumps (its TALKER_BISECT_LAYERS)
ORDER = (  # execution order of the known files (a layer's place: the layers in their order, after the embeds)
    "audio-input",
    "mel-spk",
    "spk-emb",
    "ref-codes",
    "prompt-ids",
    "talker-input-embed",
    "trailing-text-hidden",
    "tts-pad-embed",
    "<layers>",
    "talker-hidden-prefill-final",
    "talker-logits-prefill",
    "codes-step0",
    "next-emb-step0",
    "talker-hidden-step1",
    "codes-full",
    "output-audio",
)
MAX_NDIMS = 8
MAX_FILE_BYTES = 1 << 30  # one tensor: 1 GiB (an hour of audio is 350 MB)
MAX_FILES = 10_000
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


class QwenttsDumpError(InputError):
    """A file or folder that is not a qwentts.cpp dump, or a trace that cannot be written as one."""


# ----------------------------------------------------------------------------- one file


def read_qwentts_bin(path) -> np.ndarray:
    """One dump file as a float32 array of its shape, its header checked against its size."""
    data = read_limited(path, MAX_FILE_BYTES, f"qwentts.cpp dump {path}", QwenttsDumpError, regular_only=True)
    if len(data) < 4:
        raise QwenttsDumpError(f"{path}: {len(data)} bytes, shorter than the dump header's int32 ndims")
    (ndims,) = struct.unpack("<i", data[:4])
    if not 0 <= ndims <= MAX_NDIMS or len(data) < 4 + 4 * ndims:
        raise QwenttsDumpError(f"{path}: ndims {ndims} (at most {MAX_NDIMS}, and its shape must follow)")
    shape = struct.unpack(f"<{ndims}i", data[4 : 4 + 4 * ndims])
    if any(d < 0 for d in shape):
        raise QwenttsDumpError(f"{path}: shape {list(shape)} has a negative dimension")
    numel = int(np.prod(shape, dtype=object))
    body = len(data) - 4 - 4 * ndims
    if body != 4 * numel:
        raise QwenttsDumpError(f"{path}: shape {list(shape)} needs {4 * numel} bytes of float32, the file has {body}")
    return np.frombuffer(data, dtype="<f4", offset=4 + 4 * ndims).reshape(shape).astype(np.float32)


def write_qwentts_bin(path, array) -> Path:
    """``array`` as one dump file (float32 values; integers exactly up to 2**24)."""
    a = np.asarray(array)
    if a.ndim > MAX_NDIMS:
        raise QwenttsDumpError(f"{path}: {a.ndim} axes; the dump format takes at most {MAX_NDIMS}")
    if a.dtype.kind in "iu" and a.size and np.abs(a.astype(np.int64)).max() > 1 << 24:
        raise QwenttsDumpError(f"{path}: integers above 2**24 are not exact in the format's float32")
    header = struct.pack(f"<i{a.ndim}i", a.ndim, *a.shape)
    write_atomically(path, [header, np.ascontiguousarray(a, dtype="<f4").tobytes()])
    return Path(path)


def as_integers(name: str, a: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(a)) or not np.array_equal(a, np.round(a)):
        raise QwenttsDumpError(f"{name}: holds values that are not integers (codes and ids are stored as float32)")
    return a.astype(np.int64)


# ----------------------------------------------------------------------------- qwentts.cpp -> ours


def _rank(stem: str) -> tuple:
    m = LAYER.fullmatch(stem)
    if m:
        return (ORDER.index("<layers>"), int(m.group(1)), stem)
    return (ORDER.index(stem) if stem in ORDER else len(ORDER), 0, stem)


def _ours(stem: str, a: np.ndarray) -> list:
    """[(our key, array)] of one file, in our shapes."""
    m = LAYER.fullmatch(stem)
    if m:
        return [(f"talker.model.layers.{int(m.group(1))}:0", _batched(stem, a, 2, 1))]
    if stem == "ref-codes":
        codes = as_integers(stem, _batched(stem, a, 2, 0))
        return [(SEMANTIC if j == 0 else ACOUSTIC.format(j=j - 1), codes[j][None]) for j in range(codes.shape[0])]
    if stem in FILES:
        key, ndim, batch = FILES[stem]
        out = _batched(stem, a, ndim, batch)
        return [(key, as_integers(stem, out) if stem in INTEGER_FILES else out)]
    return [(f"qwentts.{stem}", as_integers(stem, a) if stem in INTEGER_FILES else a)]


def _batched(stem: str, a: np.ndarray, ndim: int, batch: int) -> np.ndarray:
    """``a`` of ``ndim`` axes, with ``batch`` leading axes of size 1 added."""
    if a.ndim != ndim:
        raise QwenttsDumpError(f"{stem}: shape {list(a.shape)}; qwentts.cpp writes this tensor with {ndim} axes")
    return a.reshape((1,) * batch + a.shape)


def read_qwentts_dump(folder) -> Trace:
    """A qwentts.cpp dump folder as a trace under our names (``QWENTTS_NAMES``), in execution order; the
    metadata names the files read (``qwentts_files``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise QwenttsDumpError(
            f"{folder}: not a folder (qwentts.cpp writes one .bin file per tensor into its dump_dir)"
        )
    files = sorted(p for p in folder.iterdir() if p.suffix == ".bin")
    if len(files) > MAX_FILES:
        raise QwenttsDumpError(f"{folder}: {len(files)} .bin files, more than {MAX_FILES}")
    files.sort(key=lambda p: _rank(p.stem))
    items, arrays = [], {}
    for path in files:
        if not NAME.fullmatch(path.stem):
            raise QwenttsDumpError(f"{path}: not a name qwentts.cpp writes")
        arrays[path.stem] = read_qwentts_bin(path)
    if not arrays:
        raise QwenttsDumpError(f"{folder} holds no .bin file of a qwentts.cpp dump")
    for stem, a in arrays.items():
        if stem == "codes-step0" and "codes-full" in arrays:
            full = arrays["codes-full"]
            if full.ndim != 2 or not full.shape[0] or not np.array_equal(full[0], a.reshape(-1)):
                raise QwenttsDumpError(f"{folder}: codes-step0 is not frame 0 of codes-full")
            continue
        items += _ours(stem, a)
    meta = {"producer": "qwentts.cpp dump", "dtype": "float32", "qwentts_files": list(arrays)}
    return Trace(items, meta)


# ----------------------------------------------------------------------------- ours -> qwentts.cpp


def qwentts_tensors(trace: Trace) -> dict:
    """file name -> array: the tensors of ``trace`` (a generation's, batch item 0) that qwentts.cpp dumps."""
    keys = set(trace.keys)
    out = {}
    for name, (key, _, batch) in FILES.items():
        if key in keys:
            out[name] = _unbatched(key, np.asarray(trace[key]), batch)
        elif key == "refimpl.talker.sampling.logits:0" and "talker.codec_head:0" in keys:
            out[name] = np.asarray(trace["talker.codec_head:0"])[0, -1]  # an official hook dump: the last position
    for n in BISECT_LAYERS:
        key = f"talker.model.layers.{n}:0"
        if key in keys:
            out[f"talker-hidden-prefill-l{n}"] = _unbatched(key, np.asarray(trace[key]), 1)
    if "codes-full" in out:
        codes = out["codes-full"]
        if codes.ndim != 2 or not codes.shape[0]:
            raise QwenttsDumpError(f"refimpl.codes.0: shape {list(codes.shape)}, not [frames, codebooks]")
        out["codes-step0"] = codes[0]
    if SEMANTIC in keys:
        rows = [np.asarray(trace[SEMANTIC]).reshape(-1)]
        j = 0
        while ACOUSTIC.format(j=j) in keys:
            rows.append(np.asarray(trace[ACOUSTIC.format(j=j)]).reshape(-1))
            j += 1
        if len({r.shape for r in rows}) != 1:
            raise QwenttsDumpError("the codec encoder's per-layer codes differ in length")
        out["ref-codes"] = np.stack(rows)
    if not out:
        raise QwenttsDumpError("the trace holds none of the tensors qwentts.cpp dumps (see QWENTTS_NAMES)")
    return out


def _unbatched(key: str, a: np.ndarray, batch: int) -> np.ndarray:
    if a.ndim < batch or a.shape[:batch] != (1,) * batch:
        raise QwenttsDumpError(f"{key}: shape {list(a.shape)}; qwentts.cpp's dump has one item (a batch of 1)")
    return a.reshape(a.shape[batch:])


def write_qwentts_dump(trace: Trace, folder) -> list:
    """Write the tensors of ``trace`` that qwentts.cpp dumps into ``folder`` (made if absent), one
    ``<name>.bin`` each, where its cossim scripts put the official model's dumps; returns the paths.
    Floats are rounded to float32, the format's only type."""
    tensors = qwentts_tensors(trace)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [write_qwentts_bin(folder / f"{name}.bin", a) for name, a in tensors.items()]
