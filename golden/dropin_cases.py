"""What the drop-in recording and its test share: the integer-only reference signal and the "@..."
placeholders of golden/dropin.json's calls (NumPy only: imported by golden/oracle/record_dropin.py in the
oracle environment and by tests/test_dropin.py without torch)."""

from __future__ import annotations

import base64
import wave
from pathlib import Path

import numpy as np


def reference_pcm16(n: int = 9600, step: int = 7) -> np.ndarray:
    """A deterministic int16 test signal from integer arithmetic only (a sawtooth near 150 Hz under a
    rising envelope, plus hashed-index noise), identical on every machine and NumPy version."""
    t = np.arange(n, dtype=np.int64)
    saw = (t * step % 160) * 150 - 12000
    envelope = 1024 + (t * 3072) // n  # /4096 below: from 0.25 to 1
    noise = ((t * 1103515245 + 12345) % 2147483648) // 65536 % 2001 - 1000
    return ((saw * envelope) // 4096 + noise).astype(np.int16)


def write_pcm16(path: Path, samples: np.ndarray, sr: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(samples.astype("<i2").tobytes())


class Placeholders:
    """Turns the "@..." arguments of a recorded call into values: "@ref.wav" (the reference WAV's path),
    "@b64:ref.wav" (it as a base64 data URL), "@array16k" / "@array16k_short" (float arrays of the
    reference signal), and "@KIND:NAME" (an earlier call's output NAME: "wav0" its first waveform with
    its rate, "prompt"/"codes" as it is, "dicts" its codes as a list of dicts, "padded" its codes padded
    with -1 into one array).  ``to_numpy`` turns the official's tensors into arrays (np.asarray here)."""

    def __init__(self, wav_path: Path, to_numpy=np.asarray):
        self.wav = Path(wav_path)
        self.to_numpy = to_numpy
        self.outputs = {}

    def value(self, v):
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if not (isinstance(v, str) and v.startswith("@")):
            return v
        kind, _, name = v[1:].partition(":")
        if v == "@ref.wav":
            return str(self.wav)
        if v == "@b64:ref.wav":
            return "data:audio/wav;base64," + base64.b64encode(self.wav.read_bytes()).decode("ascii")
        if v == "@array16k":
            return reference_pcm16(8000, 5).astype(np.float32) / 32768
        if v == "@array16k_short":
            return reference_pcm16(3000, 9).astype(np.float32) / 32768
        out = self.outputs[name]
        if kind == "wav0":
            return (out[0][0], out[1])
        if kind in ("prompt", "codes"):
            return out
        codes = out.audio_codes
        if kind == "dicts":
            return [{"audio_codes": self.to_numpy(c)} for c in codes]
        if kind == "padded":
            padded = np.full((len(codes), max(len(c) for c in codes), codes[0].shape[1]), -1, dtype=np.int64)
            for i, c in enumerate(codes):
                padded[i, : len(c)] = self.to_numpy(c)
            return {"audio_codes": padded}
        raise ValueError(f"unknown placeholder {v}")
