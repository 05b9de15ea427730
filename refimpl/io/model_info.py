"""A summary of a checkpoint directory, read from its config and safetensors headers (no weights loaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError, read_config, tensor_headers

__all__ = ["describe_model"]


def _count(directory: Path, dtype=np.float32) -> tuple[int, dict, int]:
    """Total parameters of a checkpoint directory, per top-level name prefix, and the bytes they take
    once loaded at ``dtype`` (in float32 the Talker's bfloat16 matrices stay 2 bytes a value)."""
    total, by_prefix, nbytes = 0, {}, 0
    for name, (stored, shape) in tensor_headers(directory).items():
        n = int(np.prod(shape, dtype=np.int64))
        total += n
        prefix = name.split(".")[0]
        by_prefix[prefix] = by_prefix.get(prefix, 0) + n
        kept_bf16 = stored == "BF16" and len(shape) == 2 and prefix == "talker" and np.dtype(dtype) == np.float32
        nbytes += n * (2 if kept_bf16 else np.dtype(dtype).itemsize)
    return total, by_prefix, nbytes


def _human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".strip()


def describe_model(path, dtype=np.float32) -> dict:
    """Model type and size, preset speakers, languages, stored dtype, parameters and memory at ``dtype``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"model directory {str(path)!r} does not exist")
    config = read_config(path)
    talker = config.get("talker_config") or {}
    info = {"directory": str(path)}
    if "decoder_config" in config:  # a bare speech tokenizer
        info["model type"] = "speech tokenizer (12 Hz codec)"
    else:
        info["model type"] = str(config.get("tts_model_type", "unknown"))
        info["talker"] = (
            f"hidden {talker.get('hidden_size')}, {talker.get('num_hidden_layers')} layers, "
            f"{talker.get('num_attention_heads')} heads / {talker.get('num_key_value_heads')} kv heads"
        )
        info["speakers"] = sorted((talker.get("spk_id") or {}).keys())
        info["languages"] = ["auto"] + sorted((talker.get("codec_language_id") or {}).keys())
    stored = sorted({dt for dt, _ in tensor_headers(path).values()})
    total, parts, nbytes = _count(path, dtype)
    codec_dir = path / "speech_tokenizer"
    if codec_dir.is_dir():
        codec_total, _, codec_bytes = _count(codec_dir, dtype)
        parts["speech_tokenizer"] = codec_total
        total += codec_total
        nbytes += codec_bytes
    info["stored dtype"] = ", ".join(stored)
    info["compute dtype"] = np.dtype(dtype).name
    info["parameters"] = f"{total:,} ({_human(total)}: " + ", ".join(f"{k} {_human(v)}" for k, v in parts.items()) + ")"
    info["memory"] = (
        _human(nbytes, "B") + f" of weights computing in {np.dtype(dtype).name} (bfloat16 matrices "
        "of the Talker stay as stored in float32)"
    )
    return info
