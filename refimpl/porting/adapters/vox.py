"""Our traces in the dump format of vox's verifier, and back (docs/ports.md).

vox (``vox-tts``, a C++ engine) checks itself with ``vox verify --model M.tmod --dump D.safetensors``: it
feeds the dump's codes to the engine step by step (teacher forcing) and compares the Talker's and the code
predictor's logits of every step and the decoded waveform, then runs greedy and compares the audio. Its
dump (the format as vox's source distribution 0.19.5 reads it) is a safetensors file with

    talker_logits      F32 [steps, V]        the Talker's logits at the last position of each call
    predictor_logits   F32 [frames, Q-1, V'] the code predictor's logits: [f, g] for codebook g + 1 of frame f
    codes              I32 [frames, Q]       the generated frames (without an ICL reference's frames)
    wav                F32 [N]               the audio at 24 kHz
    spk_mels           F32 [1, T, 128]       the speaker encoder's input (optional)
    spk_emb            F32 [D]               the x-vector (optional)

and string metadata: ``text``, ``language``, and the voice: ``speaker`` / ``instruct`` for a named voice
(CustomVoice, VoiceDesign), else ``voice``, the path of a vox voice file (``.tvoice``); also
``ref_frames``, ``sample_rate``, ``seed``, ``generator``. vox reads every float as float32 and the codes as
int32, whatever the header says, and feeds the text one token per step: a dump is a run of the streaming
text feed (``non_streaming_mode=False``).

The names, as ``VOX_NAMES`` (vox's tensor -> our key; ``{s}`` a step, ``{n}`` a code-predictor call,
n = f (Q - 1) + g):

    talker_logits[s]       refimpl.talker.sampling.logits:{s}                 [B, V], row = the batch item
    predictor_logits[f, g] refimpl.talker.code_predictor.sampling.logits:{n}  [B, V']
    codes                  refimpl.codes.{item}                               [T, Q]
    wav                    refimpl.waveform.{item}                            [N] (the audio the API returns)
    spk_mels               refimpl.speaker_encoder.mel                        [T, 128]
    spk_emb                speaker_encoder                                    [1, D]

The sampling logits are the official ``talker.codec_head:{s}`` and ``talker.code_predictor.lm_head.{g}:{f}``
at the last position (equal to float32 summation order: the head runs on the last position alone); a trace
without them (an official hook dump) is written from those.

    write_vox_dump(trace, "ref.safetensors")           # then: vox verify --model M.tmod --dump ref.safetensors
    port = read_vox_dump("vox-dump.safetensors")       # a Trace: refimpl compare against our reference
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...io.checkpoint import STORED_DTYPES, read_safetensors_header, write_safetensors_file
from ...io.files import InputError
from ..trace_files import GENERATE_METHODS, Trace, text_feed_default

__all__ = ["VOX_NAMES", "write_vox_dump", "read_vox_dump", "VoxDumpError"]

VOX_NAMES = {
    "talker_logits": "refimpl.talker.sampling.logits:{s}",
    "predictor_logits": "refimpl.talker.code_predictor.sampling.logits:{n}",
    "codes": "refimpl.codes.{item}",
    "wav": "refimpl.waveform.{item}",
    "spk_mels": "refimpl.speaker_encoder.mel",
    "spk_emb": "speaker_encoder",
}
# what vox's verifier reads each tensor as (it copies the bytes, so the header's dtype must be this one)
VOX_DTYPES = {
    "talker_logits": "F32",
    "predictor_logits": "F32",
    "codes": "I32",
    "wav": "F32",
    "spk_mels": "F32",
    "spk_emb": "F32",
}
SEMANTIC_CODES = "refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes"
MAX_STEPS = 1 << 16  # a dump longer than 87 minutes of audio is not a dump of a run


class VoxDumpError(InputError):
    """A trace that cannot be written as a vox dump, or a vox dump that cannot be read."""


# ----------------------------------------------------------------------------- ours -> vox


def _has(trace: Trace, key: str) -> bool:
    return key in set(trace.keys)


def _row(trace: Trace, key: str, item: int) -> np.ndarray:
    """Batch row ``item`` of a [B, V] tensor."""
    a = np.asarray(trace[key])
    if a.ndim != 2 or not 0 <= item < a.shape[0]:
        raise VoxDumpError(f"{key}: shape {a.shape} has no batch row {item}")
    return a[item]


def _talker_logits(trace: Trace, s: int, item: int) -> np.ndarray:
    key = VOX_NAMES["talker_logits"].format(s=s)
    if _has(trace, key):
        return _row(trace, key, item)
    return np.asarray(trace[f"talker.codec_head:{s}"])[item, -1]  # an official hook dump


def _predictor_logits(trace: Trace, f: int, g: int, groups: int, item: int) -> np.ndarray:
    key = VOX_NAMES["predictor_logits"].format(n=f * groups + g)
    if _has(trace, key):
        return _row(trace, key, item)
    return np.asarray(trace[f"talker.code_predictor.lm_head.{g}:{f}"])[item, -1]


def _steps(trace: Trace) -> int:
    """The Talker calls of the run: the keys talker_logits can be written from."""
    keys = set(trace.keys)
    s = 0
    while VOX_NAMES["talker_logits"].format(s=s) in keys or f"talker.codec_head:{s}" in keys:
        s += 1
    return s


def _item_input(inputs: dict, field: str, item: int) -> Any:
    value = inputs.get(field)
    return value[item] if isinstance(value, list) else value


def vox_metadata(trace: Trace, item: int, voice: str | None) -> dict[str, str]:
    """The dump's string metadata from the trace's ``input`` (text, language, speaker, instruct)."""
    meta = trace.metadata or {}
    inputs = meta.get("input") or {}
    text = _item_input(inputs, "text", item)
    if not isinstance(text, str):
        raise VoxDumpError("the trace records no text (metadata input.text): it is not a generation's trace")
    stage = meta.get("stage")
    if stage in GENERATE_METHODS and inputs.get("non_streaming_mode", text_feed_default(stage)):
        raise VoxDumpError(
            "the trace is a run of the non-streaming text feed (non_streaming_mode=True); vox's verifier feeds "
            "the text one token per step: trace the run with --text-feed streaming"
        )
    language = _item_input(inputs, "language", item) or "auto"
    out = {"text": text, "language": str(language).lower(), "sample_rate": "24000"}
    out["speaker"] = str(_item_input(inputs, "speaker", item) or "")
    out["instruct"] = str(_item_input(inputs, "instruct", item) or "")
    out["voice"] = str(voice or "")
    if stage == "clone" and not voice:
        raise VoxDumpError("a voice clone's dump needs voice=: the path of the vox voice file (.tvoice) vox runs with")
    out["ref_frames"] = str(np.shape(trace[SEMANTIC_CODES])[-1]) if _has(trace, SEMANTIC_CODES) else "0"
    seed = (meta.get("generation") or {}).get("seed")
    out["seed"] = "" if seed is None else str(seed)
    out["generator"] = f"refimpl {meta.get('refimpl_version', '')} {meta.get('dtype', '')}".strip()
    return out


def vox_tensors(trace: Trace, item: int = 0) -> dict[str, np.ndarray]:
    """vox's tensors (float32 / int32) of batch item ``item`` of a generation trace."""
    codes_key = VOX_NAMES["codes"].format(item=item)
    if not _has(trace, codes_key):
        raise VoxDumpError(f"the trace has no {codes_key}: not a generation's trace, or no batch item {item}")
    codes = np.asarray(trace[codes_key])
    if codes.ndim != 2:
        raise VoxDumpError(f"{codes_key}: shape {codes.shape}, not [frames, codebooks]")
    frames, groups = codes.shape[0], codes.shape[1] - 1
    steps = min(_steps(trace), frames + 1)  # a row that ended keeps being stepped in a batch: not its steps
    if steps < frames:
        raise VoxDumpError(f"the trace has the Talker's logits of {steps} steps for {frames} frames")
    tensors = {
        "talker_logits": np.stack([_talker_logits(trace, s, item) for s in range(steps)]),
        "predictor_logits": np.stack(
            [np.stack([_predictor_logits(trace, f, g, groups, item) for g in range(groups)]) for f in range(frames)]
        ),
        "codes": codes,
    }
    wav_key = VOX_NAMES["wav"].format(item=item)
    if _has(trace, wav_key):
        tensors["wav"] = np.asarray(trace[wav_key]).reshape(-1)
    elif _has(trace, "decoder") and item == 0 and not _has(trace, SEMANTIC_CODES):
        tensors["wav"] = np.asarray(trace["decoder"]).reshape(-1)  # the one pass over the codes: the audio
    if _has(trace, VOX_NAMES["spk_emb"]):
        tensors["spk_mels"] = np.asarray(trace[VOX_NAMES["spk_mels"]])[None]
        tensors["spk_emb"] = np.asarray(trace[VOX_NAMES["spk_emb"]]).reshape(-1)
    return {k: v.astype(np.int32 if VOX_DTYPES[k] == "I32" else np.float32) for k, v in tensors.items()}


def write_vox_dump(trace: Trace, path: str | os.PathLike[str], item: int = 0, voice: str | None = None) -> Path:
    """Write batch item ``item`` of a generation trace (a run of the streaming text feed, ours or the
    official hook dump) as the dump ``vox verify --dump`` reads.  ``voice``: the vox voice file (.tvoice)
    of a voice clone, written into the metadata (a named voice is taken from the trace's speaker and
    instruct).  Floats are rounded to float32, the format's only float: a float64 trace is written as the
    float32 nearest to it."""
    metadata = vox_metadata(trace, item, voice)
    tensors = vox_tensors(trace, item)
    write_safetensors_file(path, tensors, dtype="keep", metadata=metadata, sort=False)
    return Path(path)


# ----------------------------------------------------------------------------- vox -> ours


def read_vox_dump(path: str | os.PathLike[str]) -> Trace:
    """A vox dump as a trace under our names (``VOX_NAMES``), in execution order, for ``refimpl compare``
    against our reference: the speaker encoder's mel and x-vector, then per step the Talker's logits and the
    frame's code-predictor logits, the codes, the audio.  The metadata keeps vox's own strings under
    ``vox``."""
    path = Path(path)
    header, metadata, start = read_safetensors_header(path, VoxDumpError)
    raw = np.memmap(path, dtype=np.uint8, mode="r") if header else np.zeros(0, np.uint8)
    arrays = {}
    for name, h in header.items():
        want = VOX_DTYPES.get(name)
        if want is not None and h["dtype"] != want:
            raise VoxDumpError(f"{path}: {name} is {h['dtype']}; vox's verifier reads it as {want}")
        begin, end = (start + o for o in h["data_offsets"])
        # (ignored: io.checkpoint's STORED_DTYPES holds NumPy dtypes, but mypy infers its values as objects)
        arrays[name] = raw[begin:end].view(STORED_DTYPES[h["dtype"]]).reshape(h["shape"])  # type: ignore[call-overload]
    items = []
    if "spk_mels" in arrays:
        items.append((VOX_NAMES["spk_mels"], _shaped(arrays, "spk_mels", 3)[0]))
    if "spk_emb" in arrays:
        items.append((VOX_NAMES["spk_emb"], _shaped(arrays, "spk_emb", 1)[None]))
    talker = _shaped(arrays, "talker_logits", 2) if "talker_logits" in arrays else np.zeros((0, 0), np.float32)
    predictor = _shaped(arrays, "predictor_logits", 3) if "predictor_logits" in arrays else None
    if talker.shape[0] > MAX_STEPS or (predictor is not None and predictor.shape[0] > MAX_STEPS):
        raise VoxDumpError(f"{path}: more than {MAX_STEPS} steps")
    frames = predictor.shape[0] if predictor is not None else 0
    groups = predictor.shape[1] if predictor is not None else 0
    for s in range(max(talker.shape[0], frames)):
        if s < talker.shape[0]:
            items.append((VOX_NAMES["talker_logits"].format(s=s), np.array(talker[s : s + 1])))
        for g in range(groups if s < frames else 0):
            logits = predictor[s, g][None]  # type: ignore[index]  # groups > 0: there is a predictor
            items.append((VOX_NAMES["predictor_logits"].format(n=s * groups + g), np.array(logits)))
    if "codes" in arrays:
        items.append((VOX_NAMES["codes"].format(item=0), _shaped(arrays, "codes", 2).astype(np.int64)))
    if "wav" in arrays:
        items.append((VOX_NAMES["wav"].format(item=0), np.array(_shaped(arrays, "wav", 1))))
    known = set(VOX_DTYPES)
    items += [(name, np.array(a)) for name, a in arrays.items() if name not in known]  # kept as they are
    if not items:
        raise VoxDumpError(f"{path} holds none of vox's dump tensors ({', '.join(VOX_DTYPES)})")
    meta = {"producer": "vox dump", "dtype": "float32", "vox": dict(metadata), "order": [k for k, _ in items]}
    return Trace(items, meta)


def _shaped(arrays: dict, name: str, ndim: int) -> np.ndarray:
    a = arrays[name]
    if a.ndim != ndim:
        raise VoxDumpError(f"{name}: shape {list(a.shape)}, vox's dump format has {ndim} axes")
    return a
