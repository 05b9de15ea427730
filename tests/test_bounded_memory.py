"""Memory linear in the input's length: long texts (the Talker's prefill) and long audio (the codec encoder).

Each case runs in a fresh subprocess at three lengths, a short baseline b and two lengths L and 4L, and
reads the peak resident memory (``resource.getrusage``).  With memory linear in the length, the growth
above the baseline is about 4x from L to 4L; attention that materialises [T, T] scores makes it about 16x.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

PROBE = r"""
import resource, sys
import numpy as np
import refimpl
kind, n = sys.argv[1], int(sys.argv[2])
if kind == "text":
    tts = refimpl.Qwen3TTS.from_pretrained("golden/checkpoints/tiny-customvoice")
    rng = np.random.default_rng(0)
    text = " ".join("".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 5)) for _ in range(n))
    tts.generate_custom_voice(text, speaker="vivian", max_new_tokens=2, do_sample=False, subtalker_dosample=False)
else:
    tok = refimpl.SpeechTokenizer.from_pretrained("golden/checkpoints/tiny-speech-tokenizer")
    tok.encode(0.1 * np.random.default_rng(0).standard_normal(n * 24000).astype(np.float32), sr=24000)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_mib(kind: str, n: int) -> float:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, kind, str(n)], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1]) / 1024  # ru_maxrss is in KiB on Linux


@pytest.mark.parametrize(
    "kind, base, length",
    [
        ("text", 40, 200),  # words of 5 letters: about 5 tokens each, so 1000 and 4000 prompt tokens
        ("audio", 10, 40),  # seconds at 24 kHz: 1000 and 4000 encoder-transformer frames (25 Hz)
    ],
)
def test_peak_memory_grows_linearly(kind, base, length):
    baseline = peak_mib(kind, base)
    grow_1 = peak_mib(kind, length) - baseline
    grow_4 = peak_mib(kind, 4 * length) - baseline
    assert grow_4 <= 6 * max(grow_1, 0) + 64, (
        f"{kind}: peak memory grew by {grow_1:.0f} MiB at {length} and {grow_4:.0f} MiB at {4 * length} "
        f"(baseline {baseline:.0f} MiB at {base}): faster than linear"
    )
