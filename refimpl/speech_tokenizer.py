"""``SpeechTokenizer``: the 12 Hz codec, audio <-> 16 codes per 12.5 Hz frame.

    tok = SpeechTokenizer.from_pretrained("Qwen3-TTS-12Hz-0.6B-Base")   # or its speech_tokenizer/
    wav = tok.decode(codes)            # [T, 16] ints -> [T * 1920] floats, like the official decode
    wav = tok.decode_full(codes)       # one causal pass, no chunking
    stream = tok.stream()              # exact streaming decode
    for part in parts: out.append(stream.push(part))
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import codec_decoder
from .checkpoint import CheckpointError, check_weights, read_checkpoint_weights, read_config
from .codec_decoder import DecoderConfig

__all__ = ["SpeechTokenizer", "resolve_speech_tokenizer_dir"]

# The official decode works in chunks of 300 frames, each decoded with up to 25 frames of left context.
OFFICIAL_CHUNK_FRAMES = 300
OFFICIAL_LEFT_CONTEXT_FRAMES = 25


def resolve_speech_tokenizer_dir(path) -> Path:
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


class SpeechTokenizer:
    """The 12 Hz speech tokenizer (codec).  Arrays are NumPy; ``dtype`` is the compute dtype
    (float32 like the official model, or float64 as a higher-precision oracle)."""

    def __init__(self, config: dict, decoder_weights: dict, dtype=np.float32, directory: Path | None = None):
        self.config = config
        self.dtype = np.dtype(dtype).type
        self.directory = directory
        self.decoder_config = DecoderConfig.from_dict(config.get("decoder_config"))
        check_weights(decoder_weights, codec_decoder.decoder_weight_spec(self.decoder_config),
                      f"speech tokenizer decoder ({directory})")
        self.decoder_weights = decoder_weights
        self._tables = codec_decoder.dequantize_tables(decoder_weights, self.decoder_config)
        self.sample_rate = int(config.get("output_sample_rate", 24000))
        self.input_sample_rate = int(config.get("input_sample_rate", 24000))
        self.num_quantizers = self.decoder_config.num_quantizers
        self.codebook_size = self.decoder_config.codebook_size
        self.samples_per_frame = int(config.get("decode_upsample_rate", self.decoder_config.samples_per_frame))
        if self.samples_per_frame != self.decoder_config.samples_per_frame:
            raise CheckpointError(
                f"decode_upsample_rate {self.samples_per_frame} does not match the product of the decoder's "
                f"upsampling factors {self.decoder_config.samples_per_frame}")
        self._encoder = None

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32) -> "SpeechTokenizer":
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be numpy.float32 or numpy.float64, not {np.dtype(dtype)}")
        directory = resolve_speech_tokenizer_dir(path)
        config = read_config(directory)
        if "decoder_config" not in config:
            raise CheckpointError(f"{directory}/config.json has no decoder_config: not a 12 Hz speech tokenizer")
        weights = read_checkpoint_weights(directory, dtype, prefix="decoder.")
        return cls(config, weights, dtype, directory)

    # ------------------------------------------------------------------ input checking

    def _check_codes(self, codes, allow_padding: bool, what: str = "codes") -> np.ndarray:
        arr = np.asarray(codes)
        if arr.dtype == object:
            raise ValueError(f"{what} must be a rectangular integer array [T, {self.num_quantizers}]")
        if arr.size and arr.dtype.kind not in "iu":
            raise ValueError(f"{what} must have an integer dtype, got {arr.dtype}")
        if arr.ndim != 2:
            raise ValueError(f"{what} must have rank 2, [T, {self.num_quantizers}] (frames x code groups); "
                             f"got shape {arr.shape}")
        if arr.shape[1] != self.num_quantizers:
            raise ValueError(f"{what} must have {self.num_quantizers} code groups per frame (shape [T, "
                             f"{self.num_quantizers}]); got shape {arr.shape}")
        arr = arr.astype(np.int64)
        low = -1 if allow_padding else 0
        bad = (arr < low) | (arr >= self.codebook_size)
        if allow_padding:  # -1 marks a padding frame: group 0 is -1; a -1 inside a real frame is an error
            bad |= (arr == -1) & (arr[:, :1] != -1)
        if bad.any():
            t, q = np.argwhere(bad)[0]
            allowed = f"[0, {self.codebook_size})" + (" or -1 padding" if allow_padding else "")
            raise ValueError(f"{what}: code {arr[t, q]} at frame {t}, group {q} is outside {allowed} "
                             f"({int(bad.sum())} such codes)")
        return arr

    @staticmethod
    def _is_batch(codes) -> bool:
        return isinstance(codes, (list, tuple)) and not (len(codes) and np.isscalar(codes[0]))

    # ------------------------------------------------------------------ decoding

    def _decode_frames(self, codes_tq: np.ndarray) -> np.ndarray:
        """One causal pass over [T, Q] valid codes -> [T * samples_per_frame]."""
        codes_bqt = codes_tq.T[None]
        if codes_tq.shape[0] == 0:
            return np.zeros(0, dtype=self.dtype)
        wav = codec_decoder.decode_codes(self.decoder_weights, self.decoder_config, codes_bqt, tables=self._tables)
        return wav[0]

    def decode_full(self, codes):
        """One causal pass over the whole sequence (no chunking): [T, 16] -> [T * 1920].
        A list of sequences gives a list of waveforms."""
        if self._is_batch(codes):
            return [self.decode_full(c) for c in codes]
        return self._decode_frames(self._check_codes(codes, allow_padding=False))

    def decode(self, codes):
        """Decode like the official ``Qwen3TTSTokenizer.decode``: [T, 16] -> [n_valid * 1920].

        Frames whose group-0 code is -1 are padding: they are decoded as code 0 (as the official
        clamps them) and the output is cut to 1920 samples per non-padding frame.  Long sequences are
        decoded in chunks of 300 frames, each with 25 frames of left context whose output is dropped,
        so for more than 300 frames the result differs (slightly) from ``decode_full``."""
        if self._is_batch(codes):
            return [self.decode(c) for c in codes]
        arr = self._check_codes(codes, allow_padding=True)
        n_valid = int(np.sum(arr[:, 0] > -1))
        arr = np.maximum(arr, 0)
        T, spf = arr.shape[0], self.samples_per_frame
        pieces, start = [], 0
        while start < T:
            end = min(start + OFFICIAL_CHUNK_FRAMES, T)
            context = OFFICIAL_LEFT_CONTEXT_FRAMES if start - OFFICIAL_LEFT_CONTEXT_FRAMES > 0 else start
            wav = self._decode_frames(arr[start - context:end])
            pieces.append(wav[context * spf:])
            start = end
        wav = np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)
        return wav[:n_valid * spf]

    def stream(self) -> "DecodeStream":
        """A stateful decoder: ``push(codes [n, 16])`` returns the ``n * 1920`` samples of those frames."""
        return DecodeStream(self)


class DecodeStream:
    """Exact streaming decode (see ``codec_decoder.DecoderStream`` for the carried state)."""

    def __init__(self, tokenizer: SpeechTokenizer):
        self.tokenizer = tokenizer
        self._stream = codec_decoder.DecoderStream(tokenizer.decoder_weights, tokenizer.decoder_config,
                                                   batch=1, dtype=tokenizer.dtype, tables=tokenizer._tables)

    @property
    def frames_done(self) -> int:
        return self._stream.frames_done

    def push(self, codes) -> np.ndarray:
        arr = np.asarray(codes)
        if arr.size == 0 and arr.ndim <= 2:
            arr = np.zeros((0, self.tokenizer.num_quantizers), dtype=np.int64)
        arr = self.tokenizer._check_codes(arr, allow_padding=False)
        return self._stream.push(arr.T[None])[0]
