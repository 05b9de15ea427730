"""Traces for port authors: every module's output under the official module path, one file per run.

    from refimpl.porting import trace_files
    trace = trace_files.trace_codec_decode(tokenizer, codes_tq)        # a Trace: ordered tensors + metadata
    trace.save("trace.safetensors")                               # or "trace.npz"
    trace = trace_files.load_trace("trace.safetensors")

The naming rule (docs/port_authors.md): a key is the path of a module in ``named_modules()`` of the
official object (``Qwen3TTSTokenizer.model`` for the codec stages, ``Qwen3TTSModel.model`` for the TTS
model), the value its output in the official layout; a module called more than once in the run gets
``:N`` on every call (N counts calls from 0).  Tensors that no module outputs (prompt vectors, masks,
sin tables, the scores after each sampling step, chosen ids, RVQ residuals and margins, the random
draws) are named ``refimpl.<where>.<what>``.  ``golden/oracle/hook_dump.py`` writes the same dump from
the official PyTorch model with forward hooks.

The file records, as JSON in the safetensors header (``__metadata__["refimpl.trace"]``; in an npz, the
entry ``__metadata__``): the producer and its version, backend, dtype, stage, the checkpoint's config
and a SHA-256 of its weight files, the input, the generation settings, and ``order``, the keys in
execution order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import stat
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..backends.bf16 import bf16_bits_to_float32
from ..codec.decoder import decoder_weight_spec
from ..codec.encoder import EncoderConfig, encoder_weight_spec
from ..io.checkpoint import STORED_DTYPES, read_config, read_safetensors_header, write_safetensors_file
from ..io.files import InputError, atomic_output, parse_json, read_npy_header
from ..io.mapped_files import track
from ..recorder import EXTRA_PREFIX, CallLog, Recorder, call_names
from .names import conv_wrappers, official_calls

if TYPE_CHECKING:  # for the annotations only: importing refimpl.porting does not load the models' modules
    from ..codec.speech_tokenizer import SpeechTokenizer
    from ..tts.model import Qwen3TTS

__all__ = [
    "Trace",
    "TraceError",
    "load_trace",
    "trace_codec_decode",
    "trace_codec_encode",
    "trace_speaker",
    "trace_generation",
    "METADATA_KEY",
    "STAGES",
    "NOT_TRACED",
    "MAX_KEY_CHARS",
]

METADATA_KEY = "refimpl.trace"
STAGES = ("codec-decode", "codec-encode", "speaker", "say", "design", "clone")

# Names our stage code records for its own tests that are not official module outputs (the official
# ``decoder.quantizer`` is only called through its ``decode`` method, ``decoder.upsample.0`` is a
# ModuleList, the mel spectrogram is computed outside the speaker encoder): they go to ``refimpl.``.
NOT_MODULES = (
    "decoder.quantizer",
    "decoder.upsample.0",
    "decoder.upsample.1",
    "speaker_encoder.mel",
    "speaker_encoder.asp.context",
    "speaker_encoder.asp.weights",
)

# Official modules that a trace of ours does not record: the embedding lookups (and the text projection)
# that the official code calls while it assembles the prompt and each next input, in a pattern of its
# own (a lookup per segment, per control token...).  Their results are what ``refimpl.talker.prompt.*``
# holds; every other module call of the official run is in our trace, in the same order and shape.
NOT_TRACED = (
    "talker.model.codec_embedding",
    "talker.model.text_embedding",
    "talker.text_projection",
    "talker.code_predictor.model.codec_embedding",
)


@dataclasses.dataclass
class Trace:
    """Tensors in execution order (``items``: [(key, array)]) and the metadata dict."""

    items: list
    metadata: dict

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.items]

    def __getitem__(self, key: str) -> np.ndarray:
        for k, v in self.items:
            if k == key:
                return v
        raise KeyError(key)

    def save(self, path: str | os.PathLike[str], fmt: str | None = None) -> Path:
        """Write ``path`` as safetensors (default) or npz (``fmt="npz"`` or a ``.npz`` name)."""
        path = Path(path)
        fmt = fmt or ("npz" if path.suffix == ".npz" else "safetensors")
        metadata = dict(self.metadata, order=self.keys)
        tensors = {k: storable(v) for k, v in self.items}
        if fmt == "npz":
            with atomic_output(path) as f:  # the metadata as UTF-8 JSON bytes (uint8 [n]): any npy reader takes them
                # mypy's complaint is real but theoretical: a tensor named "file" or "allow_pickle" would clash
                # with savez's own arguments
                np.savez(f, __metadata__=np.frombuffer(json.dumps(metadata).encode("utf-8"), np.uint8), **tensors)  # type: ignore[arg-type]
        elif fmt == "safetensors":
            write_safetensors_file(
                path, tensors, dtype="keep", metadata={METADATA_KEY: json.dumps(metadata)}, sort=False
            )
        else:
            raise ValueError(f"unknown trace format {fmt!r}: safetensors or npz")
        return path


def storable(value: ArrayLike) -> np.ndarray:
    """A contiguous array the writers accept: booleans as uint8, other integers as int64."""
    a = np.ascontiguousarray(value)
    if a.dtype == bool:
        return a.astype(np.uint8)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    return a


class TraceError(InputError):
    """A trace file cannot be used: not safetensors or npz, malformed, or holding non-numeric tensors."""


# a trace key is a module path with a call suffix (the longest official one has 70 characters); a longer
# key is refused when the trace is loaded, so that the work per key (names, prefixes, maps) stays bounded
MAX_KEY_CHARS = 1024


def check_key(path: object, name: str) -> None:
    if len(name) > MAX_KEY_CHARS:
        raise TraceError(
            f"{path}: tensor name {name[:40]!r}... is {len(name)} characters long, over the limit of {MAX_KEY_CHARS}"
        )


# deflate cannot expand data by more than about 1032 times: an npz member claiming more is a lie (or a
# zip bomb), refused before it is decompressed
MAX_DEFLATE_RATIO = 1100
NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats: what a trace compares


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace (ours, the official hook dump, or a port's) from .safetensors or .npz (told apart by
    their content, not their name).  Keys follow the metadata's ``order`` when it lists them, else the
    file's order.  Everything is checked before a tensor is read (``TraceError`` naming the file and the
    problem): a regular file (not a pipe or a device), the safetensors header as a checkpoint's
    (``checkpoint.read_safetensors_header``), every npz member's .npy header against the member's size,
    numeric tensors only, the metadata a JSON object nested at most ``files.MAX_JSON_DEPTH`` deep whose
    ``order`` is a list of names."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe or a device?)"
        raise TraceError(f"cannot read trace {path}: it is {kind}")
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic[:6] == b"\x93NUMPY":
        raise TraceError(f"{path} is a single .npy array, not a trace (a trace is a .safetensors or an .npz file)")
    if magic[:4] == b"PK\x03\x04" or (magic[:4] == b"PK\x05\x06"):
        arrays, metadata = read_npz_trace(path)
    else:
        if path.suffix == ".npz":
            raise TraceError(f"{path} is not an npz archive (no zip signature)")
        header, arrays = read_safetensors_trace(path)
        raw = header.pop("__metadata__", {}).get(METADATA_KEY)
        if raw is not None and not isinstance(raw, str):
            kind = type(raw).__name__
            raise TraceError(f"{path}: __metadata__[{METADATA_KEY!r}] must be a JSON string, found {kind}")
        metadata = trace_metadata(raw, path)
        if not metadata.get("order"):  # the file's own order (offsets)
            metadata["order"] = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    for name, array in arrays.items():
        check_key(path, name)
        if array.dtype.kind not in NUMERIC_KINDS:
            raise TraceError(f"{path}: tensor {name!r} has dtype {array.dtype}, not a number (bool, int, float)")
    order = list(dict.fromkeys(k for k in metadata.get("order", []) if k in arrays))
    listed = set(order)  # once: a set per key made this quadratic (a full-size trace holds 40,000 keys)
    order += [k for k in arrays if k not in listed]
    return Trace([(k, arrays[k]) for k in order], metadata)


def trace_metadata(raw: str | bytes | None, path: object) -> dict:
    """The metadata JSON of a trace (None: none recorded): an object whose ``order``, if given, lists names,
    and whose fields that refimpl reads have their types (``check_metadata``)."""
    if raw is None:
        return {}
    metadata = parse_json(raw, f"{path}: trace metadata", TraceError)
    if not isinstance(metadata, dict):
        raise TraceError(f"{path}: the trace metadata must be a JSON object, found a JSON {json_type(metadata)}")
    order = metadata.get("order")
    if order is not None and not (isinstance(order, list) and all(isinstance(k, str) for k in order)):
        raise TraceError(f"{path}: the trace metadata's order must be a list of tensor names")
    check_metadata(metadata, path)
    return metadata


JSON_TYPES = {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer", float: "number"}


def json_type(value: object) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


# The metadata fields refimpl reads (compare, diagnose, --replay, the conformance grader) and what each must
# be when present and not null; anything else in the metadata is kept and never interpreted.
METADATA_OBJECTS = ("config", "input", "generation")
METADATA_STRINGS = ("stage", "dtype", "producer", "model_dir", "weights_sha256")
# (object, field, least value) of the counts read from inside them
METADATA_COUNTS = (
    ("input", "frames", 0),
    ("input", "eos_token_id", 0),
    ("input", "max_new_tokens", 1),
    ("generation", "max_new_tokens", 1),
    ("generation", "min_new_tokens", 0),
)


def is_count(value: object, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_metadata(metadata: dict, path: object) -> None:
    """The types of the metadata fields refimpl reads: one ``TraceError`` naming the file and the field
    (a trace's metadata comes from outside: a port's dump, an edited file)."""

    def bad(field: str, what: str, value: object) -> NoReturn:
        found = json_type(value)
        raise TraceError(f"{path}: the trace metadata's {field} must be {what} (or null), found a JSON {found}")

    for field in METADATA_STRINGS:
        if metadata.get(field) is not None and not isinstance(metadata[field], str):
            bad(field, "a string", metadata[field])
    for field in METADATA_OBJECTS:
        if metadata.get(field) is not None and not isinstance(metadata[field], dict):
            bad(field, "a JSON object", metadata[field])
    for parent, field, least in METADATA_COUNTS:
        value = (metadata.get(parent) or {}).get(field)
        if value is not None and not is_count(value, least):
            bad(f"{parent}.{field}", f"an integer >= {least}", value)
    talker = (metadata.get("config") or {}).get("talker_config")
    if talker is not None and not isinstance(talker, dict):
        bad("config.talker_config", "a JSON object", talker)
    eos = (talker or {}).get("codec_eos_token_id")
    if eos is not None and not is_count(eos):
        bad("config.talker_config.codec_eos_token_id", "an integer >= 0", eos)
    generation = metadata.get("generation") or {}
    if generation.get("forced") is not None and not isinstance(generation["forced"], bool):
        bad("generation.forced", "true or false", generation["forced"])
    from ..sampling import SamplingSettings

    fields = {f.name for f in dataclasses.fields(SamplingSettings)}
    try:
        SamplingSettings(**{k: v for k, v in generation.items() if k in fields and v is not None}).validate()
    except ValueError as e:
        raise TraceError(f"{path}: the trace metadata's generation: {e}") from None


# io.checkpoint's STORED_DTYPES holds NumPy dtypes, but mypy infers its values as objects (hence the ignores)
SAFETENSORS_DTYPES = {code: stored.str for code, stored in STORED_DTYPES.items() if code != "BF16"}  # type: ignore[attr-defined]


def read_safetensors_trace(path: str | os.PathLike[str]) -> tuple[dict, dict[str, np.ndarray]]:
    """(header with ``__metadata__``, {name: array}) of a safetensors file, every dtype kept as stored
    (bfloat16 widened to float32), the arrays read-only views of a memory map.  The header is checked
    as a checkpoint's (``checkpoint.read_safetensors_header``); TraceError for anything wrong."""
    header, metadata, data_start = read_safetensors_header(path, TraceError)
    raw = np.memmap(path, dtype=np.uint8, mode="r") if header else np.zeros(0, np.uint8)
    if header:
        track(raw, path)  # named if the file shrinks under the map (io/mapped_files.py: a bus error)
    arrays = {}
    for name, h in header.items():
        begin, end = (data_start + o for o in h["data_offsets"])
        arr = raw[begin:end].view(STORED_DTYPES[h["dtype"]]).reshape(h["shape"])  # type: ignore[call-overload]
        arrays[name] = bf16_bits_to_float32(arr) if h["dtype"] == "BF16" else arr
    return dict(header, __metadata__=metadata), arrays


def read_npz_trace(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict]:
    """({name: array}, metadata) of an npz archive, each member's .npy header checked against the member's
    size before its data is read (a header claiming petabytes is refused, not allocated)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise TraceError(f"{path} is not a readable npz archive ({e})") from None
    arrays, raw_metadata = {}, None
    with archive:
        for member in archive.infolist():
            name = member.filename[:-4] if member.filename.endswith(".npy") else member.filename
            check_key(path, name)
            where = f"{path}: member {member.filename!r}"
            if name in arrays:
                raise TraceError(f"{where} appears twice")
            if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise TraceError(f"{where}: compression method {member.compress_type} (npz uses stored or deflate)")
            ratio = 1 if member.compress_type == zipfile.ZIP_STORED else MAX_DEFLATE_RATIO
            stored_bound = member.compress_size * ratio
            if member.file_size > stored_bound + 4096:
                raise TraceError(
                    f"{where} claims {member.file_size} bytes from {member.compress_size} compressed (a zip bomb?)"
                )
            try:
                with archive.open(member) as f:
                    shape, fortran, dtype = read_npy_header(f, where, "a tensor")
                    header_size = f.tell()
                    if dtype.hasobject:
                        raise TraceError(f"{where} holds Python objects, not numbers")
                    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if header_size + need != member.file_size:
                        raise TraceError(
                            f"{where}: its header claims shape {tuple(shape)} of {dtype} ({need} bytes) but "
                            f"the member holds {member.file_size - header_size} (truncated or damaged file?)"
                        )
                    data = f.read(need)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                if isinstance(e, TraceError):
                    raise
                raise TraceError(f"{where} cannot be read ({e})") from None
            if len(data) != need:
                raise TraceError(f"{where} is truncated")
            array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
            if name == "__metadata__":
                raw_metadata = metadata_text(array, where)
            else:
                arrays[name] = array
    return arrays, trace_metadata(raw_metadata, path)


def metadata_text(array: np.ndarray, where: str) -> str:
    """The JSON text of an npz ``__metadata__``: a 0-d unicode array (``np.array(json.dumps(...))``) or
    UTF-8 bytes as a uint8 vector (easier to write from C++)."""
    if array.dtype.kind == "U" and array.ndim == 0:
        return str(array)
    if array.dtype == np.uint8 and array.ndim == 1:
        try:
            return array.tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{where}: the metadata is not UTF-8 text ({e})") from None
    raise TraceError(f"{where}: the metadata must be a JSON string (a 0-d unicode array or UTF-8 bytes as uint8)")


# ----------------------------------------------------------------------------- metadata


def weights_hash(directory: str | os.PathLike[str]) -> str:
    """SHA-256 over the bytes of the directory's ``*.safetensors`` files, in name order."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def array_hash(a: ArrayLike) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()


def base_metadata(
    stage: str, directory: str | os.PathLike[str] | None, dtype: DTypeLike, inputs: dict, settings: dict | None = None
) -> dict:
    from .._version import __version__
    from ..backends import active_backend

    return {
        "producer": "refimpl",
        "refimpl_version": __version__,
        "backend": list(active_backend()),
        "dtype": np.dtype(dtype).name,
        "stage": stage,
        "model_dir": Path(directory).name if directory else None,
        "config": read_config(directory) if directory else None,
        "weights_sha256": weights_hash(directory) if directory else None,
        "input": inputs,
        "generation": settings,
    }


def finish(log: CallLog, metadata: dict, wrappers: frozenset = frozenset()) -> Trace:
    """Add the official names our stage code does not record (``refimpl.porting.names``; ``wrappers``: the
    run's conv units), name the calls by the ``:N`` rule and move our non-module stage records to ``refimpl.``."""
    calls = official_calls(log.calls, wrappers)
    keys = call_names([k for k, _ in calls])
    items = [
        (EXTRA_PREFIX + k if k.split(":")[0] in NOT_MODULES else k, v) for k, (_, v) in zip(keys, calls, strict=True)
    ]
    return Trace(items, metadata)


# ----------------------------------------------------------------------------- the stages


def record_decode(log: CallLog, tokenizer: SpeechTokenizer, codes_tq: np.ndarray, attention: bool = False) -> None:
    """The decoder's module outputs for codes [T, 16] (``decode_full``); ``decoder`` is the waveform [1, 1, N]."""
    wav = tokenizer.decode_full(codes_tq, trace=Recorder(log, "decoder.", attention))
    log["decoder"] = np.asarray(wav)[None, None, :]


def trace_codec_decode(tokenizer: SpeechTokenizer, codes_tq: ArrayLike, attention: bool = False) -> Trace:
    """Decode codes [T, 16] in one causal pass (``decode_full``), recording every module of
    ``Qwen3TTSTokenizer.model.decoder`` (keys ``decoder.*``); the last key, ``decoder``, is the waveform
    [1, 1, T * 1920].  ``attention``: also the post-RoPE q/k and attention probabilities of every layer
    (``recorder.record_attention_details``; large)."""
    log = CallLog()
    codes = tokenizer.check_codes(codes_tq)
    record_decode(log, tokenizer, codes, attention)
    meta = base_metadata(
        "codec-decode",
        tokenizer.directory,
        tokenizer.dtype,
        {"codes_sha256": array_hash(codes), "frames": int(codes.shape[0]), "codes": codes.tolist()},
    )
    return finish(log, meta, conv_wrappers("decoder.", decoder_weight_spec(tokenizer.decoder_config)))


def trace_codec_encode(tokenizer: SpeechTokenizer, audio: ArrayLike, sr: int = 24000, attention: bool = False) -> Trace:
    """Encode one waveform, recording the audio the encoder sees (``refimpl.encoder.input`` [1, N]: mono,
    resampled to 24 kHz, in the compute dtype), every module of ``Qwen3TTSTokenizer.model.encoder`` (keys
    ``encoder.*``) and, under ``refimpl.encoder.quantizer.*``, each RVQ layer's input residual, codes
    and nearest-code margin."""
    from ..codec.speech_tokenizer import prepare_audio

    log = CallLog()
    audio = np.asarray(audio)
    log[f"{EXTRA_PREFIX}encoder.input"] = prepare_audio(audio, sr, tokenizer.input_sample_rate, tokenizer.dtype)[None]
    tokenizer.encode_detailed(audio, sr, trace=Recorder(log, "encoder.", attention))
    meta = base_metadata(
        "codec-encode",
        tokenizer.directory,
        tokenizer.dtype,
        {"audio_sha256": array_hash(audio), "samples": int(audio.shape[0]), "sample_rate": int(sr)},
    )
    cfg = EncoderConfig.from_dict(tokenizer.config["encoder_config"])
    return finish(log, meta, conv_wrappers("encoder.", encoder_weight_spec(cfg)))


def trace_speaker(tts: Qwen3TTS, audio: ArrayLike, sr: int = 24000) -> Trace:
    """The x-vector of one waveform, recording the audio the encoder sees (``refimpl.speaker_encoder.input``
    [N]: resampled to 24 kHz, in the compute dtype), every module of ``Qwen3TTSModel.model.speaker_encoder``
    (keys ``speaker_encoder.*``; the last, ``speaker_encoder``, is the x-vector [1, D]) and the log mels
    (``refimpl.speaker_encoder.mel``, [T, 128])."""
    log = CallLog()
    audio = np.asarray(audio)
    if tts.speaker_encoder is not None:
        log[f"{EXTRA_PREFIX}speaker_encoder.input"] = tts.speaker_encoder.prepare_audio(audio, sr)
    tts.extract_speaker_embedding(audio, sr, trace=Recorder(log))
    meta = base_metadata(
        "speaker",
        tts.directory,
        tts.dtype,
        {"audio_sha256": array_hash(audio), "samples": int(audio.shape[0]), "sample_rate": int(sr)},
    )
    return finish(log, meta)


GENERATE_METHODS = {"say": "generate_custom_voice", "design": "generate_voice_design", "clone": "generate_voice_clone"}


def text_feed_default(stage: str) -> bool:
    """The ``non_streaming_mode`` of the stage's generate method when the call gives none (as the official:
    True for say and design, False for clone), read from its signature."""
    from ..tts.model import Qwen3TTS

    return inspect.signature(getattr(Qwen3TTS, GENERATE_METHODS[stage])).parameters["non_streaming_mode"].default


def trace_generation(
    tts: Qwen3TTS, stage: str, *, attention: bool = False, decoder: bool = True, **kwargs: Any
) -> Trace:
    """Run ``generate_custom_voice`` (say), ``generate_voice_design`` (design) or ``generate_voice_clone``
    (clone) with ``kwargs``, recording every Talker and code-predictor module call (``talker.*``, with
    ``:N`` per call), the prompt, the scores after each sampling step, the chosen ids, the generated
    codes (``refimpl.codes``, [T, 16] per item: ``refimpl.codes.{i}``) and every random uniform consumed
    (``refimpl.random_draws``; pass it back as ``random_draws=`` to replay).  The metadata's ``input``
    holds the keywords given, and ``non_streaming_mode`` always (the method's default when not given).

    ``forced_codes=`` (a [T, 16] array, or one per item: a port's codes) teacher-forces the run: every
    step continues with the forced codes, so each step's logits are those of the port's history;
    ``refimpl.codes.{i}`` are then the codes WE chose at each step on that history (compare them with the
    port's to judge every frame), ``refimpl.forced_codes.{i}`` the history, and the metadata say
    ``generation.forced``.

    ``decoder`` (default True): the generated codes (forced: the forced ones) are then decoded with
    ``decode_full`` under the codec decoder's names (``decoder.*``, ``decoder`` the waveform; ``:N`` per item
    of a batch); at the released size that is about 40 MB a frame.  ``refimpl.waveform.{i}`` is the audio
    the API returns (the official decode; in ICL mode with the reference's share cut), in the compute
    dtype.  ``attention``: the post-RoPE q/k and
    attention probabilities of every layer too (large).  In a voice clone in ICL mode the reference's codec
    encode is recorded too (``encoder.*``)."""
    log = CallLog()
    kwargs.setdefault("non_streaming_mode", text_feed_default(stage))  # the metadata's input always says it
    forced = kwargs.pop("forced_codes", None)
    if forced is not None:
        forced = [np.asarray(forced)] if np.ndim(forced) == 2 else [np.asarray(c) for c in forced]
        kwargs["forced_codes"] = forced
    wavs, sr, codes = getattr(tts, GENERATE_METHODS[stage])(
        trace=Recorder(log, attention=attention), return_codes=True, **kwargs
    )
    if decoder:  # the codes through the codec decoder, as the official generate ends (``decoder.*``)
        for c in codes:
            record_decode(log, tts.speech_tokenizer, c, attention)
    if forced is not None:  # the codes are ours, chosen on the forced history; the history is recorded too
        for i, c in enumerate(forced):
            log[f"{EXTRA_PREFIX}forced_codes.{i}"] = c
        codes = chosen_codes(log, len(forced), [c.shape[0] for c in forced], tts.talker.cfg.num_code_groups)
    for i, c in enumerate(codes):
        log[f"{EXTRA_PREFIX}codes.{i}"] = c
    # the API's audio last, after the codes it is made of (the model records it when it decodes them)
    audio = [(k, v) for k, v in log.calls if k.startswith(f"{EXTRA_PREFIX}waveform.")]
    log.calls = [(k, v) for k, v in log.calls if not k.startswith(f"{EXTRA_PREFIX}waveform.")] + audio
    kwargs.pop("forced_codes", None)
    inputs = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    if "ref_audio" in kwargs and isinstance(kwargs["ref_audio"], tuple):
        inputs["ref_audio_sha256"] = array_hash(kwargs["ref_audio"][0])
    settings, _, _, _ = tts._settings({k: v for k, v in kwargs.items() if k in GENERATION_KEYWORDS})
    generation = dict(dataclasses.asdict(settings), seed=kwargs.get("seed"), replayed="random_draws" in kwargs)
    if forced is not None:
        generation.update(
            forced=True,
            forced_codes_sha256=[array_hash(c) for c in forced],
            max_new_tokens=max(len(c) for c in forced) + 1,
        )
    meta = base_metadata(stage, tts.directory, tts.dtype, inputs, generation)
    st = tts.speech_tokenizer  # the codec's conv units, for its official wrapper names
    wrappers = conv_wrappers("decoder.", decoder_weight_spec(st.decoder_config)) if decoder else frozenset()
    if any(k.startswith("encoder.") for k, _ in log.calls):  # an ICL clone's reference encode
        encoder_cfg = EncoderConfig.from_dict(st.config["encoder_config"])
        wrappers |= conv_wrappers("encoder.", encoder_weight_spec(encoder_cfg))
    return finish(log, meta, wrappers)


def chosen_codes(log: CallLog, batch: int, lengths: list[int], groups: int) -> list[np.ndarray]:
    """The codes a teacher-forced run chose itself: code 0 of step t from ``sampling.chosen`` call t, code g
    from the code predictor's call t * (groups - 1) + g - 1; [T_i, groups] per item."""
    code0 = [v for k, v in log.calls if k == f"{EXTRA_PREFIX}talker.sampling.chosen"]
    rest = [v for k, v in log.calls if k == f"{EXTRA_PREFIX}talker.code_predictor.sampling.chosen"]
    out = []
    for b, T in enumerate(lengths):
        codes = np.zeros((T, groups), dtype=np.int64)
        for t in range(T):
            codes[t, 0] = code0[t][b]
            codes[t, 1:] = [rest[t * (groups - 1) + g][b] for g in range(groups - 1)]
        out.append(codes)
    return out


GENERATION_KEYWORDS = (
    "do_sample",
    "top_k",
    "top_p",
    "temperature",
    "repetition_penalty",
    "subtalker_dosample",
    "subtalker_top_k",
    "subtalker_top_p",
    "subtalker_temperature",
    "max_new_tokens",
    "seed",
)
