"""Synthetic checkpoints: seeded random weights with the real names and shapes, in the real layout.

No machine here can download the released weights, so every test and benchmark runs on checkpoints
made by this module.  Each network module declares the tensors it expects as a list of
``WeightSpec(name, shape, init)``; the ``init`` names a distribution chosen so that a random network
still produces non-trivial output (activations neither vanish nor saturate):

=============  ==============================================================
``linear``     N(0, 1 / fan_in), fan_in = product of all but the first axis
``transpose``  N(0, 1 / (in_channels * k / 2)) (ConvTranspose weights, [in, out, k], k = 2 * stride)
``bias``       N(0, 0.02^2)
``norm``       1 + N(0, 0.1^2)  (RMSNorm / LayerNorm / BatchNorm weights)
``norm_bias``  N(0, 0.1^2)
``embedding``  N(0, 1)
``scale``      U(0.05, 0.5)     (LayerScale, ConvNeXt gamma)
``log_scale``  N(0, 0.2^2)      (SnakeBeta log-alpha / log-beta)
``usage``      U(0.5, 2.0)      (codebook cluster usage)
``variance``   U(0.5, 2.0)      (BatchNorm running variance)
``zeros`` / ``ones``
=============  ==============================================================

An init may carry a gain, ``"linear*0.3"``: the drawn tensor is multiplied by it (used where a residual
branch or an output layer should start small, as in a trained network).

Each tensor gets its own generator seeded by (seed, crc32(name)), so a tensor's values do not depend
on the order or presence of the others.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from .checkpoint import WeightSpec, write_safetensors_file

__all__ = ["random_tensor", "random_weights", "write_checkpoint", "speech_tokenizer_weight_spec",
           "write_speech_tokenizer"]


def random_tensor(spec: WeightSpec, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode("utf-8"))])
    shape = tuple(spec.shape)
    kind, _, gain = spec.init.partition("*")
    gain = float(gain) if gain else 1.0
    if kind == "linear":
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        x = rng.standard_normal(shape) / np.sqrt(fan_in)
    elif kind == "transpose":  # each output sample sums k / stride taps; stride is not known here, assume k / 2
        x = rng.standard_normal(shape) / np.sqrt(shape[0] * max(shape[2] // 2, 1))
    elif kind == "bias":
        x = 0.02 * rng.standard_normal(shape)
    elif kind == "norm":
        x = 1.0 + 0.1 * rng.standard_normal(shape)
    elif kind == "norm_bias":
        x = 0.1 * rng.standard_normal(shape)
    elif kind == "embedding":
        x = rng.standard_normal(shape)
    elif kind == "scale":
        x = rng.uniform(0.05, 0.5, shape)
    elif kind == "log_scale":
        x = 0.2 * rng.standard_normal(shape)
    elif kind in ("usage", "variance"):
        x = rng.uniform(0.5, 2.0, shape)
    elif kind == "zeros":
        x = np.zeros(shape)
    elif kind == "ones":
        x = np.ones(shape)
    else:
        raise ValueError(f"unknown init kind {kind!r} for {spec.name}")
    return (gain * x).astype(np.float32)


def random_weights(spec: Iterable[WeightSpec], seed: int) -> dict:
    """Seeded random float32 tensors for every entry of ``spec``."""
    return {s.name: random_tensor(s, seed) for s in spec}


def write_checkpoint(directory: str | os.PathLike, config: Mapping | None, tensors: Mapping[str, np.ndarray],
                     dtype: str = "float32", max_shard_bytes: int | None = None) -> Path:
    """Write ``config.json`` and the tensors as ``model.safetensors``, or, when ``max_shard_bytes`` is
    given and exceeded, as ``model-0000x-of-0000y.safetensors`` shards plus
    ``model.safetensors.index.json`` (the Hugging Face sharded layout)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        with open(directory / "config.json", "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    shards, current, current_bytes = [], {}, 0
    for name in sorted(tensors):
        n_bytes = tensors[name].size * itemsize
        if max_shard_bytes is not None and current and current_bytes + n_bytes > max_shard_bytes:
            shards.append(current)
            current, current_bytes = {}, 0
        current[name] = tensors[name]
        current_bytes += n_bytes
    shards.append(current)
    if len(shards) == 1:
        write_safetensors_file(directory / "model.safetensors", shards[0], dtype, metadata={"format": "pt"})
        return directory
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors_file(directory / file_name, shard, dtype, metadata={"format": "pt"})
        for name, arr in shard.items():
            weight_map[name] = file_name
            total += arr.size * itemsize
    with open(directory / "model.safetensors.index.json", "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")
    return directory


def speech_tokenizer_weight_spec(config: Mapping) -> list:
    """All tensors of a 12 Hz speech tokenizer checkpoint (``encoder.*`` and ``decoder.*``)."""
    from .codec_decoder import DecoderConfig, decoder_weight_spec
    from .codec_encoder import EncoderConfig, encoder_weight_spec

    spec = [WeightSpec("decoder." + s.name, s.shape, s.init)
            for s in decoder_weight_spec(DecoderConfig.from_dict(config["decoder_config"]))]
    spec += [WeightSpec("encoder." + s.name, s.shape, s.init)
             for s in encoder_weight_spec(EncoderConfig.from_dict(config["encoder_config"]))]
    return spec


def write_speech_tokenizer(directory: str | os.PathLike, config: Mapping, seed: int = 0,
                           dtype: str = "float32", max_shard_bytes: int | None = None) -> Path:
    """A complete synthetic speech-tokenizer directory: config.json, model.safetensors (or shards)
    and preprocessor_config.json, with seeded random weights."""
    from .presets import SPEECH_TOKENIZER_PREPROCESSOR

    directory = write_checkpoint(directory, config, random_weights(speech_tokenizer_weight_spec(config), seed),
                                 dtype, max_shard_bytes)
    with open(directory / "preprocessor_config.json", "w", encoding="utf-8") as f:
        json.dump(SPEECH_TOKENIZER_PREPROCESSOR, f, indent=2, sort_keys=True)
        f.write("\n")
    return directory
