"""WAV files in and out (16-bit PCM or 32-bit float), with clear errors.

Reading returns float samples in [-1, 1] and the file's sample rate; channels are kept
(``[N]`` mono or ``[N, C]``), since each consumer decides how to mix down.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from scipy.io import wavfile

__all__ = ["read_wav", "write_wav"]

_INTEGER_SCALE = {np.dtype("int16"): 32768.0, np.dtype("int32"): 2147483648.0, np.dtype("uint8"): 128.0}


def read_wav(path) -> tuple[np.ndarray, int]:
    """Read a WAV file -> (float32 samples [N] or [N, C] in [-1, 1], sample rate)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"audio file {path!r} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", wavfile.WavFileWarning)
            sr, data = wavfile.read(path)
    except Exception as e:  # scipy raises ValueError / struct errors / EOFError for damaged files
        raise ValueError(f"cannot read audio file {path!r} as WAV: {e}") from None
    if data.dtype == np.uint8:
        audio = (data.astype(np.float32) - 128.0) / 128.0
    elif data.dtype in _INTEGER_SCALE:
        audio = data.astype(np.float32) / np.float32(_INTEGER_SCALE[data.dtype])
    elif data.dtype.kind == "f":
        audio = data.astype(np.float32)
    else:
        raise ValueError(f"audio file {path!r}: unsupported sample format {data.dtype}")
    return audio, int(sr)


def write_wav(path, audio, sample_rate: int, sample_format: str = "pcm16") -> None:
    """Write mono float audio as WAV: ``sample_format`` is ``"pcm16"`` (clipped to [-1, 1], rounded)
    or ``"float"`` (32-bit IEEE float, unclipped)."""
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"write_wav expects mono audio [N], got shape {audio.shape}")
    if sample_format == "pcm16":
        data = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    elif sample_format == "float":
        data = audio.astype(np.float32)
    else:
        raise ValueError(f"unknown sample format {sample_format!r}: use 'pcm16' or 'float'")
    wavfile.write(os.fspath(path), int(sample_rate), data)

