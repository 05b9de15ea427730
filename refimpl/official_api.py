"""A drop-in for the official Python API: ``qwen_tts.Qwen3TTSModel`` and ``qwen_tts.Qwen3TTSTokenizer``.

    import refimpl as qwen_tts
    model = qwen_tts.Qwen3TTSModel.from_pretrained("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
                                                   device_map="cuda:0", dtype=torch.bfloat16)
    wavs, sr = model.generate_custom_voice(text="Hello.", speaker="Vivian", language="English")
    tokenizer = qwen_tts.Qwen3TTSTokenizer.from_pretrained("Qwen/Qwen3-TTS-Tokenizer-12Hz")
    enc = tokenizer.encode("speech.wav")          # enc.audio_codes: a list of int64 [T, 16] arrays
    wavs, sr = tokenizer.decode(enc)

Same names, arguments, defaults and return types as the official package (0.1.1), with NumPy arrays
where it returns torch tensors.  The differences, all deliberate:

- ``device_map="cuda:0"`` (or "cuda", "auto") loads the model on the cupy backend when CuPy and a GPU are
  there (docs/backends.md), else on the CPU with a one-time note saying what is missing.  Keyword
  arguments that only steer PyTorch (``attn_implementation``, ``low_cpu_mem_usage``, ...) are accepted
  and ignored, with a one-time ``IgnoredArgumentWarning``.  ``dtype`` (or ``torch_dtype``)
  chooses the compute dtype: float32 (the default) or float64; ``torch.bfloat16`` / ``torch.float16`` /
  ``"auto"`` run float32 math from the stored (bfloat16) weights, which the one-time note says: the
  official runs bfloat16 math then, so its output differs from ours at bfloat16 rounding level.
- ``Qwen3TTSTokenizer.from_pretrained(..., attn_implementation="flash_attention_2")`` makes the official
  codec encoder attend within its sliding window; here it selects ``encoder_attention="sliding"``, the same
  math (docs/codec_encoder.md).  Every other value is the full attention of the CPU paths.
- Names resolve offline (``refimpl.io.hub.resolve_model``): a directory, an embedded model ("default", ...),
  or a Hugging Face repo id already in the local cache.  Audio given as a URL is refused (nothing here
  uses the network); a path or a base64 string must hold a WAV file (the official also reads other formats).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np

from .codec.speech_tokenizer import SpeechTokenizer, prepare_audio
from .io.audio import read_wav, read_wav_bytes
from .io.hub import resolve_model
from .tts.model import Qwen3TTS, VoiceClonePromptItem

__all__ = [
    "Qwen3TTSModel",
    "Qwen3TTSTokenizer",
    "Qwen3TTSTokenizerV2EncoderOutput",
    "VoiceClonePromptItem",
    "IgnoredArgumentWarning",
]


class IgnoredArgumentWarning(UserWarning):
    """A keyword argument of the official API that has no meaning here (said once per argument)."""


# keyword arguments of the official from_pretrained that only place or schedule PyTorch work
IGNORED_LOAD_ARGS = (
    "attn_implementation",
    "low_cpu_mem_usage",
    "trust_remote_code",
    "use_safetensors",
    "local_files_only",
    "token",
    "use_auth_token",
    "force_download",
    "resume_download",
    "proxies",
    "max_memory",
    "offload_folder",
    "offload_state_dict",
)
IGNORED_BECAUSE = {
    "max_memory": "refimpl places no weights by a memory budget",
    "attn_implementation": "every attention implementation computes the same attention here (only the codec "
    "encoder's flash-attention window differs; Qwen3TTSTokenizer honours it)",
    "low_cpu_mem_usage": "refimpl maps the weights it reads without a second copy",
}
USED_LOAD_ARGS = ("dtype", "torch_dtype", "revision", "cache_dir", "device_map", "device")
# what Qwen3TTSTokenizer.encode takes: a WAV path or base64 string, or samples (with ``sr``)
AudioInput = str | os.PathLike | np.ndarray
_NOTED: set[str] = set()


def note_once(key: str, message: str, stacklevel: int = 4) -> None:
    """Warn ``message`` (an ``IgnoredArgumentWarning``) the first time ``key`` is seen in this process;
    ``stacklevel`` 4 points at the caller of ``from_pretrained``."""
    if key not in _NOTED:
        _NOTED.add(key)
        warnings.warn(message, IgnoredArgumentWarning, stacklevel=stacklevel)


def compute_dtype_of(dtype: Any) -> type[np.floating]:
    """The official ``dtype=`` (a torch dtype, its name, "auto", or a NumPy dtype) -> float32 or float64.

    float32 / float64 map to themselves; bfloat16, float16 and "auto" to float32 with a note (float32 math
    from the stored weights, where the official computes in the reduced precision)."""
    if dtype is None:
        return np.float32
    name = str(dtype).removeprefix("torch.")
    if name in ("float32", "float", "float64", "double"):
        return np.float64 if name in ("float64", "double") else np.float32
    if name in ("bfloat16", "float16", "half", "auto"):
        note_once(
            f"dtype={name}",
            f"dtype={name}: refimpl computes in float32 from the stored weights "
            f"(bfloat16 matrices are widened exactly); the official computes in {name}, so its output "
            "differs at that precision's rounding level",
            stacklevel=5,
        )
        return np.float32
    try:
        kind = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"dtype must be float32 or float64 (or torch.bfloat16 / torch.float16 / 'auto', "
            f"run in float32), not {dtype!r}"
        ) from None
    if kind not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, not {kind}")
    return kind.type


def load_arguments(kwargs: dict[str, Any], where: str) -> dict[str, Any]:
    """Split the official ``from_pretrained`` keyword arguments: returns ``dtype`` (float32 / float64),
    ``revision`` and ``cache_dir``; notes the ignored ones once; TypeError for any other name."""
    unknown = sorted(k for k in kwargs if k not in IGNORED_LOAD_ARGS + USED_LOAD_ARGS)
    if unknown:
        raise TypeError(
            f"{where}.from_pretrained got unexpected keyword argument(s) {unknown}; accepted: "
            f"{list(USED_LOAD_ARGS)}, and ignored: {list(IGNORED_LOAD_ARGS)}"
        )
    if kwargs.get("dtype") is not None and kwargs.get("torch_dtype") is not None:
        raise TypeError(f"{where}.from_pretrained: pass dtype or torch_dtype, not both")
    for key in IGNORED_LOAD_ARGS:
        if key in kwargs:
            note_once(
                key, f"{key}={kwargs[key]!r} is ignored: {IGNORED_BECAUSE.get(key, 'refimpl reads local files only')}"
            )
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    device = kwargs.get("device_map", kwargs.get("device"))
    return dict(
        dtype=compute_dtype_of(dtype),
        revision=kwargs.get("revision"),
        cache_dir=kwargs.get("cache_dir"),
        backend=backend_of_device(device),
    )


def backend_of_device(device: object) -> str | None:
    """The official ``device_map`` / ``device`` -> the backend the model is loaded on.

    "cuda", "cuda:0" and "auto" -> "cupy" when the CuPy backend can run here (docs/backends.md); otherwise,
    and for "cpu" or None, the host backends (None: the active one).  A CUDA device that cannot be had is
    said once (with what is missing), not an error: the official code then still runs, on the CPU.  Other
    devices and per-module device maps (dicts) are noted once and ignored."""
    if device is None or str(device) == "cpu":
        return None
    name = str(device)
    if name in ("cuda", "cuda:0", "auto"):
        from .backends import BackendUnavailable, device_module

        try:
            device_module("cupy")
        except BackendUnavailable as e:
            note_once("device_map", f"device_map={device!r}: running on the CPU, since {e}")
            return None
        return "cupy"
    note_once(
        "device_map",
        f"device_map={device!r} is ignored: refimpl runs on the CPU, or with the cupy "
        "backend on CUDA device 0 ('cuda:0')",
    )
    return None


def loaded_on(backend: str | None) -> contextlib.AbstractContextManager[object]:
    """The context a model is loaded in: ``use_backend(backend)`` for a device, else as it is."""
    if backend is None:
        return contextlib.nullcontext()
    from .backends import use_backend

    return use_backend(backend, "from_pretrained(device_map=...)")


# ----------------------------------------------------------------------------- audio given as a string


def is_url(s: str) -> bool:
    u = urlparse(s)
    return u.scheme in ("http", "https", "ftp") and bool(u.netloc)


def is_probably_base64(s: str) -> bool:
    """The official rule: a data URL, or a long string with no path separator."""
    return s.startswith("data:audio") or ("/" not in s and "\\" not in s and len(s) > 256)


def load_audio_string(s: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """A WAV path or base64 WAV (raw or ``data:audio/wav;base64,...``) -> (float32 mono samples [N], sr).
    A URL is a ValueError: nothing here uses the network."""
    s = os.fspath(s)
    if is_url(s):
        raise ValueError(
            f"audio URL {s[:80]!r} is not fetched: refimpl does not use the network; download the "
            "file and pass its path (or (waveform, sr))"
        )
    if is_probably_base64(s):
        payload = s.split(",", 1)[1] if s.strip().startswith("data:") and "," in s else s
        try:
            data = base64.b64decode(payload.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"audio string of {len(s)} characters is neither a file path nor valid base64") from None
        wav, sr = read_wav_bytes(data, "<base64 audio>")
    else:
        wav, sr = read_wav(s)
    if wav.ndim > 1:
        wav = wav.mean(axis=-1)
    return wav.astype(np.float32), int(sr)


# ----------------------------------------------------------------------------- Qwen3TTSModel


class Qwen3TTSModel(Qwen3TTS):
    """``qwen_tts.Qwen3TTSModel``: ``Qwen3TTS`` (which already has the official generate_custom_voice,
    generate_voice_design, generate_voice_clone, create_voice_clone_prompt, get_supported_speakers and
    get_supported_languages) loaded the official way and taking audio as the official does."""

    device = "cpu"

    @classmethod
    def from_pretrained(  # type: ignore[override]  # the official signature: only keyword arguments after the name
        cls, pretrained_model_name_or_path: str | os.PathLike[str], **kwargs: Any
    ) -> Qwen3TTSModel:
        """The official signature: a directory, embedded name or cached repo id; ``dtype`` and the
        ignored PyTorch arguments as the module docstring says."""
        args = load_arguments(kwargs, "Qwen3TTSModel")
        directory = resolve_model(pretrained_model_name_or_path, revision=args["revision"], cache_dir=args["cache_dir"])
        with loaded_on(args["backend"]):
            model = super().from_pretrained(directory, dtype=args["dtype"])
        model.device = "cuda:0" if args["backend"] else "cpu"
        return model

    def _load_audio(self, a: object) -> tuple[np.ndarray, int]:
        """A path / base64 string (``load_audio_string``), or as ``Qwen3TTS``: a (waveform, sr) tuple."""
        if isinstance(a, (str, os.PathLike)):
            return load_audio_string(a)
        return super()._load_audio(a)


# ----------------------------------------------------------------------------- Qwen3TTSTokenizer


class Qwen3TTSTokenizerV2EncoderOutput:
    """What the official 12 Hz ``encode`` returns (a transformers ``ModelOutput``): one field,
    ``audio_codes``, a list of int64 arrays [T_i, 16].  Read it as ``enc.audio_codes``,
    ``enc["audio_codes"]`` or ``enc[0]``; ``keys()``, iteration (over the keys) and ``to_tuple()`` as the
    official."""

    def __init__(self, audio_codes: list[np.ndarray]) -> None:
        self.audio_codes = audio_codes

    def keys(self) -> list[str]:
        return ["audio_codes"]

    def to_tuple(self) -> tuple[list[np.ndarray]]:
        return (self.audio_codes,)

    def __getitem__(self, key: str | int) -> list[np.ndarray]:
        if isinstance(key, str):
            if key != "audio_codes":
                raise KeyError(key)
            return self.audio_codes
        return self.to_tuple()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        shapes = [tuple(c.shape) for c in self.audio_codes]
        return f"Qwen3TTSTokenizerV2EncoderOutput(audio_codes=<{len(shapes)} arrays, shapes {shapes}>)"


class Qwen3TTSTokenizer:
    """``qwen_tts.Qwen3TTSTokenizer`` (12 Hz) over ``SpeechTokenizer`` (``self.tokenizer``)."""

    def __init__(self, tokenizer: SpeechTokenizer, encoder_attention: str = "full") -> None:
        self.tokenizer = tokenizer
        self.config = tokenizer.config
        self.device = "cpu"
        self.encoder_attention = encoder_attention

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike[str], **kwargs: Any) -> Qwen3TTSTokenizer:
        """A speech-tokenizer directory (or a model directory with speech_tokenizer/), an embedded model
        name or a cached repo id ("Qwen/Qwen3-TTS-Tokenizer-12Hz"); keyword arguments as the official."""
        attention = "sliding" if str(kwargs.get("attn_implementation", "")).startswith("flash_attention") else "full"
        args = load_arguments(kwargs, "Qwen3TTSTokenizer")
        directory = resolve_model(pretrained_model_name_or_path, revision=args["revision"], cache_dir=args["cache_dir"])
        with loaded_on(args["backend"]):
            tokenizer = cls(SpeechTokenizer.from_pretrained(directory, dtype=args["dtype"]), attention)
        tokenizer.device = "cuda:0" if args["backend"] else "cpu"
        return tokenizer

    # ------------------------------------------------------------------ what it is

    def get_model_type(self) -> str:
        return str(self.config.get("model_type", "qwen3_tts_tokenizer_12hz"))

    def get_input_sample_rate(self) -> int:
        return int(self.tokenizer.input_sample_rate)

    def get_output_sample_rate(self) -> int:
        return int(self.tokenizer.sample_rate)

    def get_encode_downsample_rate(self) -> int:
        return int(self.config.get("encode_downsample_rate", self.tokenizer.samples_per_frame))

    def get_decode_upsample_rate(self) -> int:
        return int(self.tokenizer.samples_per_frame)

    # ------------------------------------------------------------------ encode

    def load_audio(self, x: str | os.PathLike[str], target_sr: int) -> np.ndarray:
        """A WAV path or base64 WAV -> float32 mono samples at ``target_sr`` (the official method)."""
        wav, sr = load_audio_string(x)
        return prepare_audio(wav, sr, int(target_sr), np.float32, "audio")

    def _waveforms(self, audios: AudioInput | Sequence[AudioInput], sr: int | None) -> list[np.ndarray]:
        """Every accepted input (a path or base64 string, an array with ``sr``, or a list of either kind)
        -> a list of 1-D waveforms at the input sample rate."""
        if isinstance(audios, (str, os.PathLike, np.ndarray)):
            audios = [audios]
        if not isinstance(audios, (list, tuple)):
            raise TypeError(
                f"audios must be a path, a base64 string, an array or a list of them, not {type(audios).__name__}"
            )
        if len(audios) == 0:
            raise ValueError("audios is an empty list: nothing to encode")
        target, dtype = self.get_input_sample_rate(), self.tokenizer.dtype
        if all(isinstance(a, (str, os.PathLike)) for a in audios):
            return [prepare_audio(*load_audio_string(a), target, dtype, f"audios[{i}]") for i, a in enumerate(audios)]
        if not all(isinstance(a, np.ndarray) for a in audios):
            raise TypeError("Mixed input types are not supported. Use all paths/base64 or all numpy arrays.")
        if sr is None:
            raise ValueError("For numpy waveform input, you must provide `sr` (original sampling rate).")
        return [prepare_audio(a, sr, target, dtype, f"audios[{i}]") for i, a in enumerate(audios)]

    def encode(
        self, audios: AudioInput | Sequence[AudioInput], sr: int | None = None, return_dict: bool = True
    ) -> Qwen3TTSTokenizerV2EncoderOutput | tuple[list[np.ndarray]]:
        """Audio -> ``Qwen3TTSTokenizerV2EncoderOutput(audio_codes=[int64 [ceil(N_i / 1920), 16], ...])``
        (``(audio_codes,)`` when ``return_dict=False``), one entry per input, encoded as one batch."""
        wavs = self._waveforms(audios, sr)
        codes = self.tokenizer.encode(wavs, sr=self.get_input_sample_rate(), encoder_attention=self.encoder_attention)
        return Qwen3TTSTokenizerV2EncoderOutput(codes) if return_dict else (codes,)

    # ------------------------------------------------------------------ decode

    @staticmethod
    def _code_list(encoded: object) -> list[np.ndarray]:
        """The official decode inputs -> a list of [T, 16] code arrays (-1 rows are padding)."""
        if hasattr(encoded, "audio_codes"):
            codes = encoded.audio_codes
        elif isinstance(encoded, dict):
            if "audio_codes" not in encoded:
                raise ValueError("a dict passed to decode needs the key 'audio_codes'")
            codes = encoded["audio_codes"]
        elif isinstance(encoded, list) and encoded and all(isinstance(e, dict) for e in encoded):
            if not all("audio_codes" in e for e in encoded):
                raise ValueError("every dict passed to decode needs the key 'audio_codes'")
            codes = [e["audio_codes"] for e in encoded]
        else:
            raise TypeError("`encoded` must be an encode output, a dict, or a list of dicts.")
        if isinstance(codes, (list, tuple)):
            return [np.asarray(c) for c in codes]
        arr = np.asarray(codes)
        if arr.ndim == 2:  # one sequence [T, 16]
            return [arr]
        if arr.ndim == 3:  # a padded batch [B, T, 16]
            return list(arr)
        raise ValueError(f"audio_codes must be [T, 16], [B, T, 16] or a list of [T, 16]; got shape {arr.shape}")

    def decode(self, encoded: object) -> tuple[list[np.ndarray], int]:
        """Codes -> ``(wavs, sr)``: a list of float32 waveforms [n_valid_i * 1920] and the output rate.
        Each sequence is decoded as the official does (300-frame chunks, -1 frames are padding)."""
        wavs = [np.asarray(self.tokenizer.decode(c), dtype=np.float32) for c in self._code_list(encoded)]
        return wavs, self.get_output_sample_rate()
