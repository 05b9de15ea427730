"""Shared set-up for the oracle scripts: they run the official ``qwen-tts`` package (PyTorch) on the
committed synthetic checkpoints and record its outputs as golden files.

Run them in the oracle environment (see ``golden/README.md``), never in the default test suite.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent
REPO = GOLDEN.parent
CHECKPOINTS = GOLDEN / "checkpoints"

# The official package imports sox/onnxruntime/torchaudio for its 25 Hz tokenizer only: stub them.
sys.path.insert(0, str(HERE / "stubs"))
sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, os.cpu_count() or 1))


def versions() -> str:
    import importlib.metadata as md
    names = ["torch", "transformers", "qwen-tts", "numpy"]
    return ", ".join(f"{n}=={md.version(n)}" for n in names)


def save_golden(name: str, arrays: dict) -> Path:
    """Write ``golden/<name>.npz`` (compressed) with a ``versions`` entry naming the oracle."""
    path = GOLDEN / f"{name}.npz"
    arrays = dict(arrays)
    arrays["versions"] = np.array(versions())
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {len(arrays)} arrays)")
    return path


def to_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()
