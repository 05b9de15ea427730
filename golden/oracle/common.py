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


def use_float64_rope(model) -> int:
    """Make the official rotary embeddings compute their angles in float64.

    The official rotary modules force float32 (``inv_freq`` is made in float32 and the forward casts
    positions and frequencies with ``.float()``), so ``model.double()`` alone still rounds every RoPE
    angle to float32 (an error of ~1e-7 that then dominates the float64 comparison).  For the float64
    oracle we recompute cos/sin in float64 from the config's theta.  Returns the number of modules patched.
    """
    patched = 0
    for module in model.modules():
        name = type(module).__name__
        if not (name.endswith("RotaryEmbedding") or name.endswith("RotatoryEmbedding")):
            continue
        dim = module.inv_freq.shape[0] * 2
        theta = float(getattr(module.config, "rope_theta", 10000.0))
        inv_freq64 = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        scaling = float(getattr(module, "attention_scaling", 1.0))

        def forward(x, position_ids, _inv=inv_freq64, _scaling=scaling):
            freqs = position_ids.to(torch.float64)[..., None] * _inv  # [..., T, dim / 2]
            emb = torch.cat((freqs, freqs), dim=-1)
            return (emb.cos() * _scaling).to(x.dtype), (emb.sin() * _scaling).to(x.dtype)

        module.forward = forward
        patched += 1
    return patched


def use_float64_rms_norm(model) -> int:
    """Make the official RMSNorm modules compute in the input dtype.

    They upcast to float32 (``hidden_states.to(torch.float32)``), which under ``model.double()`` means
    a *downcast* that rounds every normalised activation to float32.  Returns the number patched."""
    patched = 0
    for module in model.modules():
        if not type(module).__name__.endswith("RMSNorm"):
            continue
        eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))

        def forward(x, _m=module, _eps=eps):
            return _m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps))

        module.forward = forward
        patched += 1
    return patched


def make_float64_oracle(model):
    """``model.double()`` plus the patches that remove the official code's hard-wired float32 steps
    (RoPE angles, RMSNorm), so that the float64 run is a true float64 computation."""
    model.double()
    return {"rope": use_float64_rope(model), "rms_norm": use_float64_rms_norm(model)}
