"""Shared benchmark helpers: full-size synthetic checkpoints made on demand, timing, the official side."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "golden" / "oracle" / "stubs"))  # for the official package, if importable
CACHE = Path(os.environ.get("REFIMPL_BENCH_DIR", REPO / "bench-checkpoints"))


def released_speech_tokenizer(seed: int = 0) -> Path:
    """The released speech-tokenizer config with seeded random weights (written once, ~680 MB)."""
    from refimpl import presets, synthetic
    path = CACHE / "released-speech-tokenizer"
    if not (path / "model.safetensors").is_file():
        print(f"writing a full-size synthetic speech tokenizer to {path} ...", flush=True)
        synthetic.write_speech_tokenizer(path, presets.preset(presets.RELEASED_SPEECH_TOKENIZER), seed=seed)
    return path


def best_time(fn, repeats: int = 3):
    """Best wall time of ``repeats`` calls (the least disturbed by the noisy 2-core machine), and the result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def official_available() -> bool:
    try:
        import qwen_tts  # noqa: F401
        import torch  # noqa: F401
        return True
    except Exception:
        return False
