"""``SpeechTokenizer``: the 12 Hz codec, audio <-> 16 codes per 12.5 Hz frame.

tok = SpeechTokenizer.from_pretrained("Qwen3-TTS-12Hz-0.6B-Base")   # or its speech_tokenizer/
wav = tok.decode(codes)            # [T, 16] ints -> [T * 1920] floats, like the official decode
wav = tok.decode_full(codes)       # one causal pass, no chunking
stream = tok.stream()              # exact streaming decode
for part in parts: out.append(stream.push(part))
codes = tok.encode(wav, sr=24000)  # [N] floats -> [ceil(N / 1920), 16] int64, like the official encode
latent = tok.encode_latent(wav, sr=24000)  # the continuous latent before quantisation, [T, hidden]
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar, cast, overload

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .. import nn
from ..backends import device_backend, on_model_backend
from ..backends.bf16 import upload_weights
from ..backends.host_memory import workspace_of
from ..io.audio import audio_as_float, check_amplitude, check_sample_rate, resample
from ..io.checkpoint import (
    CheckpointError,
    check_prefixes,
    check_weights,
    compute_dtype,
    read_checkpoint_weights,
    read_config,
)
from ..io.hub import resolve_model
from ..io.mapped_files import read_pages_beside
from ..io.validate import check_codes, check_finite, check_speech_tokenizer_config, raise_non_finite_stage
from ..recorder import Recorder
from . import decoder as codec_decoder
from . import encoder as codec_encoder
from . import quantization
from .decoder import DecoderConfig

__all__ = ["SpeechTokenizer", "resolve_speech_tokenizer_dir", "Encoded", "prepare_audio"]

# The official decode works in chunks of 300 frames, each decoded with up to 25 frames of left context.
OFFICIAL_CHUNK_FRAMES = 300
OFFICIAL_LEFT_CONTEXT_FRAMES = 25

# ``progress=``: None, or a callable ``progress(iterable, desc) -> iterable`` such as ``tqdm.tqdm``
Progress = Callable[[Iterable[Any], str], Iterable[Any]]


def resolve_speech_tokenizer_dir(path: str | os.PathLike[str]) -> Path:
    """Accept a speech-tokenizer directory or a full Qwen3-TTS model directory (with speech_tokenizer/)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"model directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} is not a directory")
    if (path / "speech_tokenizer" / "config.json").is_file():
        return path / "speech_tokenizer"
    if (path / "config.json").is_file():
        config = read_config(path)
        if "decoder_config" in config:
            return path
        raise CheckpointError(f"{path} holds a model config but no speech_tokenizer/ directory")
    raise CheckpointError(f"no config.json (nor speech_tokenizer/config.json) in {path}")


class Encoded(NamedTuple):
    codes: np.ndarray  # [T, 16] int64
    latent: np.ndarray  # [T, hidden] the encoder output before quantisation
    margins: np.ndarray  # [T, 16] distance to the second-nearest codebook row minus to the nearest


R = TypeVar("R")


class PerAudio(Protocol[R]):
    """How ``encode``, ``encode_latent`` and ``encode_detailed`` are typed (their signature, said once): one
    waveform gives one result, a list of them a list."""

    @overload
    def __call__(
        self,
        audio: np.ndarray,
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> R: ...
    @overload
    def __call__(
        self,
        audio: list[np.ndarray],
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> list[R]: ...
    @overload
    def __call__(
        self,
        audio: Sequence[Any],
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> R | list[R]: ...


class PerAudioMethod(Protocol[R]):
    """A method typed as ``PerAudio`` once bound (``per_audio``)."""

    def __get__(self, tokenizer: Any, owner: Any) -> PerAudio[R]: ...


def per_audio(result: type[R]) -> Callable[[Callable[..., Any]], PerAudioMethod[R]]:
    """Types a method as ``PerAudio[result]`` for its callers (the method itself is left as it is)."""
    return lambda method: cast("PerAudioMethod[R]", method)


class SpeechTokenizer:
    """The 12 Hz speech tokenizer (codec).  Arrays are NumPy; ``dtype`` is the compute dtype
    (float32 like the official model, or float64 as a higher-precision oracle).

    Built while a device backend is active (``use_backend("cupy")``), its weights are uploaded once and
    ``backend`` remembers it: its methods then run there (NumPy in, NumPy out) whatever host backend is
    active (``refimpl.backends.model_scope``)."""

    def __init__(
        self, config: dict, decoder_weights: dict, dtype: DTypeLike = np.float32, directory: Path | None = None
    ) -> None:
        self.config = config
        self.dtype = np.dtype(dtype).type
        self.directory = directory
        self.decoder_config = DecoderConfig.from_dict(config.get("decoder_config"))
        check_speech_tokenizer_config(config, self.decoder_config.num_quantizers)
        check_weights(
            decoder_weights,
            codec_decoder.decoder_weight_spec(self.decoder_config),
            f"speech tokenizer decoder ({directory})",
        )
        self.backend = device_backend()
        self.decoder_weights = decoder_weights = upload_weights(decoder_weights)
        self.codebooks = quantization.dequantize_tables(decoder_weights, self.decoder_config)  # effective RVQ tables
        self.sample_rate = int(config.get("output_sample_rate", 24000))
        self.input_sample_rate = int(config.get("input_sample_rate", 24000))
        self.num_quantizers = self.decoder_config.num_quantizers
        self.codebook_size = self.decoder_config.codebook_size
        self.samples_per_frame = int(config.get("decode_upsample_rate", self.decoder_config.samples_per_frame))
        if self.samples_per_frame != self.decoder_config.samples_per_frame:
            raise CheckpointError(
                f"decode_upsample_rate {self.samples_per_frame} does not match the product of the decoder's "
                f"upsampling factors {self.decoder_config.samples_per_frame}"
            )
        self._encoder: tuple[codec_encoder.EncoderConfig, dict, Any] | None = None

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], dtype: DTypeLike = np.float32, revision: str | None = None
    ) -> SpeechTokenizer:
        """Load a speech-tokenizer directory, or the speech_tokenizer/ of a model directory.  ``path`` may
        also be an embedded model name or a Hugging Face repo id in the local cache
        (``refimpl.io.hub.resolve_model``)."""
        dtype = compute_dtype(dtype)
        directory = resolve_speech_tokenizer_dir(resolve_model(path, revision=revision))
        config = read_config(directory)
        if "decoder_config" not in config:
            raise CheckpointError(f"{directory}/config.json has no decoder_config: not a 12 Hz speech tokenizer")
        check_prefixes(directory, ("encoder.", "decoder."), f"speech tokenizer ({directory})")
        weights = read_checkpoint_weights(directory, dtype, prefix="decoder.")
        return cls(config, weights, dtype, directory)

    # ------------------------------------------------------------------ input checking

    def check_codes(self, codes: ArrayLike, allow_padding: bool = False, what: str = "codes") -> np.ndarray:
        """``codes`` as an int64 array [T, num_quantizers] with every code in [0, codebook_size) (or -1 in
        group 0 for a padding frame when ``allow_padding``); ValueError naming the first bad code otherwise."""
        return check_codes(codes, self.num_quantizers, self.codebook_size, allow_padding, what)

    @staticmethod
    def _is_batch(codes: object) -> bool:
        """A list/tuple of [T, Q] sequences (arrays or nested lists) is a batch; a list of frames
        (nested lists [T][Q]) is one sequence; an empty list is an empty batch."""
        if not isinstance(codes, (list, tuple)):
            return False
        return len(codes) == 0 or np.ndim(codes[0]) >= 2

    # ------------------------------------------------------------------ decoding

    def _decode_frames(self, codes_tq: np.ndarray, trace: Recorder | dict | None = None) -> Any:
        """One causal pass over [T, Q] valid codes -> [T * samples_per_frame] (an array of the backend)."""
        codes_bqt = codes_tq.T[None]
        if codes_tq.shape[0] == 0:
            return nn.zeros(0, dtype=self.dtype)
        wav = codec_decoder.decode_codes(
            self.decoder_weights, self.decoder_config, codes_bqt, trace, tables=self.codebooks
        )
        if not np.isfinite(wav).all():
            raise_non_finite_stage(
                "codec decoder",
                lambda trace: codec_decoder.decode_codes(
                    self.decoder_weights, self.decoder_config, codes_bqt, trace=trace, tables=self.codebooks
                ),
            )
        return wav[0]

    # (overloads) an array is one sequence, one result; a list or tuple may be a batch, a list of results
    @overload
    def decode_full(self, codes: np.ndarray, trace: Recorder | dict | None = None) -> np.ndarray: ...
    @overload
    def decode_full(self, codes: Sequence[Any], trace: Recorder | dict | None = None) -> np.ndarray | list[Any]: ...
    @on_model_backend
    def decode_full(
        self, codes: np.ndarray | Sequence[Any], trace: Recorder | dict | None = None
    ) -> np.ndarray | list[Any]:
        """One causal pass over the whole sequence (no chunking): [T, 16] -> [T * 1920].
        A list of sequences gives a list of waveforms.  ``trace`` (a dict or ``Recorder``) receives every
        module's output (``refimpl.porting.trace_files``)."""
        if self._is_batch(codes):
            return [self.decode_full(c, trace) for c in codes]
        return nn.to_host(self._decode_frames(self.check_codes(codes, allow_padding=False), trace))

    @overload
    def decode(self, codes: np.ndarray, *, progress: Progress | None = None) -> np.ndarray: ...
    @overload
    def decode(self, codes: Sequence[Any], *, progress: Progress | None = None) -> np.ndarray | list[Any]: ...
    @on_model_backend
    def decode(self, codes: np.ndarray | Sequence[Any], *, progress: Progress | None = None) -> np.ndarray | list[Any]:
        """Decode like the official ``Qwen3TTSTokenizer.decode``: [T, 16] -> [n_valid * 1920].

        Frames whose group-0 code is -1 are padding: they are decoded as code 0 (as the official
        clamps them) and the output is cut to 1920 samples per non-padding frame.  Long sequences are
        decoded in chunks of 300 frames, each with 25 frames of left context whose output is dropped,
        so for more than 300 frames the result differs (slightly) from ``decode_full``.  ``progress``:
        None (silent) or a callable ``progress(iterable, desc) -> iterable`` wrapped around the chunk
        loop, e.g. ``tqdm.tqdm``."""
        if self._is_batch(codes):
            return [self.decode(c, progress=progress) for c in codes]
        arr = self.check_codes(codes, allow_padding=True)
        n_valid = int(np.sum(arr[:, 0] > -1))
        arr = np.maximum(arr, 0)
        T, spf = arr.shape[0], self.samples_per_frame
        starts = range(0, T, OFFICIAL_CHUNK_FRAMES)
        chunks = []
        for start in starts if progress is None else progress(starts, "decoding 300-frame chunks"):
            end = min(start + OFFICIAL_CHUNK_FRAMES, T)
            context = OFFICIAL_LEFT_CONTEXT_FRAMES if start - OFFICIAL_LEFT_CONTEXT_FRAMES > 0 else start
            wav = self._decode_frames(arr[start - context : end])
            chunks.append(wav[context * spf :])
        wav = np.concatenate(chunks) if chunks else nn.zeros(0, dtype=self.dtype)
        return nn.to_host(wav[: n_valid * spf])

    @on_model_backend
    def stream(self) -> DecodeStream:
        """A stateful decoder: ``push(codes [n, 16])`` returns the ``n * 1920`` samples of those frames."""
        return DecodeStream(self)

    # ------------------------------------------------------------------ encoding

    def _load_encoder(self) -> tuple[codec_encoder.EncoderConfig, dict, Any]:
        """Read, check and cache the encoder weights on first use: (config, weights, codebook tables)."""
        if self._encoder is None:
            if "encoder_config" not in self.config:
                raise CheckpointError("the speech tokenizer config has no encoder_config: cannot encode")
            if self.directory is None:
                raise CheckpointError("this SpeechTokenizer was built without a directory: no encoder weights")
            cfg = codec_encoder.EncoderConfig.from_dict(self.config["encoder_config"])
            rate = int(self.config.get("encode_downsample_rate", cfg.samples_per_frame))
            if rate != cfg.samples_per_frame:
                raise CheckpointError(
                    f"encode_downsample_rate {rate} does not match the encoder's strides "
                    f"({cfg.samples_per_frame} samples per frame)"
                )
            weights = read_checkpoint_weights(self.directory, self.dtype, prefix="encoder.")
            check_weights(
                weights, codec_encoder.encoder_weight_spec(cfg), f"speech tokenizer encoder ({self.directory})"
            )
            weights = upload_weights(weights)
            self._encoder = (cfg, weights, quantization.encoder_tables(weights, cfg))
        return self._encoder

    @property
    def encoder_valid_num_quantizers(self) -> int:
        return int(self.config.get("encoder_valid_num_quantizers", self.num_quantizers))

    @per_audio(Encoded)
    @on_model_backend
    def encode_detailed(
        self,
        audio: np.ndarray | Sequence[Any],
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> Encoded | list[Encoded]:
        """Encode and return everything: an ``Encoded(codes [T, 16], latent [T, hidden], margins [T, 16])``
        per input (a list for a list input).  ``margins`` is, per code, the distance to the second-nearest
        codebook row minus the distance to the chosen one: a small margin is a near-tie.

        A list of waveforms is encoded as one batch, like the official encode: each is padded with zeros
        on the right to the longest, and each result is cut to ceil(own length / 1920) frames (so the last,
        partial, frame of a shorter input can differ from encoding it alone).  ``trace`` (a dict or
        ``Recorder``; also accepted by ``encode`` and ``encode_latent``) receives every module's output
        (``codec_encoder.encode_audio``, ``refimpl.porting.trace_files``)."""
        batch = SpeechTokenizer._is_audio_batch(audio)
        items = list(audio) if batch else [audio]
        if not items:
            raise ValueError("audio is empty: an empty list of waveforms")
        if encoder_attention not in codec_encoder.ATTENTION_MODES:
            raise ValueError(
                f"encoder_attention must be one of {codec_encoder.ATTENTION_MODES}, not {encoder_attention!r}"
            )
        target = self.input_sample_rate
        wavs = [
            prepare_audio(a, sr, target, self.dtype, f"audio[{i}]" if batch else "audio") for i, a in enumerate(items)
        ]
        cfg, weights, tables = self._load_encoder()
        lengths = [len(wav) for wav in wavs]
        audio_bn = np.zeros((len(wavs), max(lengths)), dtype=self.dtype)
        for i, wav in enumerate(wavs):
            audio_bn[i, : len(wav)] = wav
        device_audio_bn = nn.to_device(audio_bn)
        out = codec_encoder.encode_audio(
            weights, cfg, device_audio_bn, self.encoder_valid_num_quantizers, encoder_attention, tables, trace
        )
        out = codec_encoder.EncoderOutput(*(nn.to_host(x) for x in out))
        if not np.isfinite(out.latent_bct).all():
            raise_non_finite_stage(
                "codec encoder",
                lambda t: codec_encoder.encode_latent(weights, cfg, device_audio_bn, encoder_attention, t),
                f"largest |sample| {np.max(np.abs(audio_bn)):.3g}",
            )
        spf = cfg.samples_per_frame
        results = []
        for i, n in enumerate(lengths):
            T = math.ceil(n / spf)
            results.append(
                Encoded(
                    out.codes_bqt[i, :, :T].T.copy(),
                    out.latent_bct[i, :, :T].T.copy(),
                    out.margins_bqt[i, :, :T].T.copy(),
                )
            )
        return results if batch else results[0]

    @per_audio(np.ndarray)
    def encode(
        self,
        audio: np.ndarray | Sequence[Any],
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> np.ndarray | list[np.ndarray]:
        """Audio -> codes, like the official ``Qwen3TTSTokenizer.encode``: a 1-D array of N samples at
        ``sr`` Hz -> int64 ``[ceil(N / 1920), 16]``; a list of arrays -> a list (encoded as one batch).

        ``sr`` is required, as in the official encode.  Other sample rates are resampled to 24 kHz
        (``refimpl.io.audio.resample``: soxr HQ, as the official); stereo ``[N, 2]`` or ``[2, N]`` is averaged to
        mono with a warning.
        ``encoder_attention``: "full" (the official CPU result) or "sliding" (the config's window, as the
        official flash-attention path); see ``refimpl.codec.encoder``."""
        out = self.encode_detailed(audio, sr, encoder_attention, trace)
        return [e.codes for e in out] if isinstance(out, list) else out.codes

    @per_audio(np.ndarray)
    def encode_latent(
        self,
        audio: np.ndarray | Sequence[Any],
        sr: int | None = None,
        encoder_attention: str = "full",
        trace: Recorder | dict | None = None,
    ) -> np.ndarray | list[np.ndarray]:
        """The continuous latent before quantisation, ``[ceil(N / 1920), hidden_size]`` (the transpose of
        the official ``[1, hidden, T]`` downsample output); a list for a list input."""
        out = self.encode_detailed(audio, sr, encoder_attention, trace)
        return [e.latent for e in out] if isinstance(out, list) else out.latent

    @staticmethod
    def _is_audio_batch(audio: object) -> bool:
        return isinstance(audio, (list, tuple)) and len(audio) > 0 and not np.isscalar(audio[0])


def prepare_audio(
    audio: ArrayLike, sr: int | None, target_sr: int = 24000, dtype: DTypeLike = np.float32, what: str = "audio"
) -> np.ndarray:
    """Check one waveform and bring it to 1-D mono at ``target_sr`` in ``dtype``.

    Accepts a 1-D array (or list) of samples (floats; int16 / int32 / uint8 PCM are scaled to [-1, 1) as a
    WAV reader would), or stereo ``[N, 2]`` / ``[2, N]`` (averaged to mono, with a
    warning; ``[N, 1]`` / ``[1, N]`` are taken as mono).  Resamples with ``refimpl.io.audio.resample``.
    Raises ValueError for a missing or bad rate (``refimpl.io.audio.check_sample_rate``), a sample type with no
    standard scale, a bad rank or shape, empty audio, or NaN / infinite samples."""
    if sr is None:
        raise ValueError("the sample rate of audio arrays is required: pass sr= (as the official encode requires)")
    sr = check_sample_rate(sr)
    try:
        arr = np.asarray(audio)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{what} is not a rectangular array of samples ({e})") from None
    if isinstance(audio, (list, tuple)) and arr.dtype.kind in "iu":
        arr = arr.astype(np.float64)  # a list of Python numbers holds sample values, not PCM integers
    arr = audio_as_float(arr, what)  # int16 / int32 / uint8 PCM scaled to [-1, 1)
    if arr.ndim == 2:
        if arr.shape[1] in (1, 2):  # [N, C], the official layout
            channels_axis = 1
        elif arr.shape[0] in (1, 2):  # [C, N]
            channels_axis = 0
        else:
            raise ValueError(f"{what} must be mono [N] or stereo [N, 2] / [2, N]; got shape {arr.shape}")
        if arr.shape[channels_axis] == 2:
            warnings.warn(f"{what}: stereo input of shape {arr.shape} is averaged to mono", stacklevel=3)
        arr = arr.astype(np.float64).mean(axis=channels_axis)
    elif arr.ndim != 1:
        raise ValueError(
            f"{what} must have rank 1 (mono samples) or 2 (stereo); got rank {arr.ndim}, shape {arr.shape}"
        )
    if arr.shape[0] == 0:
        raise ValueError(f"{what} is empty (0 samples)")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{what} has {int(bad.sum())} NaN or infinite samples (first at index {int(np.argmax(bad))})")
    check_amplitude(arr, what)
    if sr != target_sr:
        arr = resample(arr.astype(np.float64), sr, int(target_sr))
    return np.ascontiguousarray(arr, dtype=dtype)


class DecodeStream:
    """Exact streaming decode of one sequence: ``push(codes [n, 16])`` returns the n * 1920 samples of
    those frames.  ``decoder`` is the ``codec_decoder.DecoderStream`` doing the work; its ``state``
    (a ``codec_decoder.DecoderState``) is everything carried between pushes.  Its pushes take their big
    outputs from the tokenizer's workspace (``refimpl/backends/host_memory.py``), the buffers the streams
    and decodes before made: a workspace of its own would start empty, its first pushes' outputs all fresh
    pages, each faulting at its first touch."""

    def __init__(self, tokenizer: SpeechTokenizer) -> None:
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend
        self._workspace = workspace_of(tokenizer)  # (the workspace ``on_model_backend`` finds: ``workspace_of``)
        self.decoder = codec_decoder.DecoderStream(
            tokenizer.decoder_weights,
            tokenizer.decoder_config,
            batch=1,
            dtype=tokenizer.dtype,
            tables=tokenizer.codebooks,
        )
        if not tokenizer.__dict__.get("_weight_pages_read"):  # (once a tokenizer)
            tokenizer.__dict__["_weight_pages_read"] = True
            spec = codec_decoder.decoder_weight_spec(tokenizer.decoder_config)
            weights = [tokenizer.decoder_weights[s.name] for s in reversed(spec)]
            read_pages_beside(weights, "refimpl-codec-pages")

    @property
    def frames_done(self) -> int:
        return self.decoder.frames_done

    @property
    def state(self) -> codec_decoder.DecoderState:
        return self.decoder.state

    @on_model_backend
    def push(self, codes: ArrayLike) -> np.ndarray:
        arr = np.asarray(codes)
        if arr.size == 0 and arr.ndim <= 2:
            arr = np.zeros((0, self.tokenizer.num_quantizers), dtype=np.int64)
        arr = self.tokenizer.check_codes(arr)
        wav = nn.to_host(self.decoder.push(arr.T[None])[0])
        check_finite(wav, "streaming codec decoder", "damaged weights?")
        return wav
