"""Checks of values that come from outside, in a range where the math works.

Config values: every number a network's math needs (sizes, epsilons, RoPE bases, token ids, rates), checked
when a config is read (``check_*_config``, one call in each config's ``from_dict``), so that an impossible
value (a negative ``rms_norm_eps``, ``rope_theta`` 0, an EOS id outside the vocabulary, an output rate of 0)
is one ``CheckpointError`` naming the key and the value, instead of NaN output or an ``IndexError`` later.

Non-finite values: ``check_finite`` after a network stage, ``first_non_finite`` to name the first stage of a
trace that went non-finite (``NonFiniteError``, a ``ValueError``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping

import numpy as np

from .checkpoint import CheckpointError

__all__ = [
    "check_talker_config",
    "check_code_predictor_config",
    "check_tts_config",
    "check_decoder_config",
    "check_encoder_config",
    "check_speaker_encoder_config",
    "check_speech_tokenizer_config",
    "check_codes",
    "NonFiniteError",
    "check_finite",
    "first_non_finite",
    "raise_non_finite_stage",
]


# ----------------------------------------------------------------------------- single values


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


# Counts that repeat a block (layers, quantizers, code groups) build one weight-spec entry per repetition
# before the checkpoint is compared with it: bounded so that a damaged config cannot make that list endless.
# Released models have at most 32.
MAX_REPEATS = 4096


def positive_int(where: str, key: str, value, minimum: int = 1) -> None:
    if not _is_int(value) or value < minimum:
        raise CheckpointError(f"{where}.{key} must be an integer >= {minimum}, got {value!r}")


def repeat_count(where: str, key: str, value, minimum: int = 1) -> None:
    if not _is_int(value) or not minimum <= value <= MAX_REPEATS:
        raise CheckpointError(f"{where}.{key} must be an integer in [{minimum}, {MAX_REPEATS}], got {value!r}")


def positive_number(where: str, key: str, value) -> None:
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not number or not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"{where}.{key} must be a finite number > 0, got {value!r}")


def finite_number(where: str, key: str, value) -> None:
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not number or not math.isfinite(value):
        raise CheckpointError(f"{where}.{key} must be a finite number, got {value!r}")


def token_id(where: str, key: str, value, vocab_size: int, vocab_name: str = "vocab_size") -> None:
    if not _is_int(value) or not 0 <= value < vocab_size:
        raise CheckpointError(
            f"{where}.{key} is {value!r}, outside the vocabulary [0, {vocab_size}) ({vocab_name} {vocab_size})"
        )


def positive_ints(where: str, key: str, values, allow_empty: bool = False) -> None:
    if not isinstance(values, (list, tuple)) or (not values and not allow_empty):
        raise CheckpointError(f"{where}.{key} must be a non-empty list of integers >= 1, got {values!r}")
    for value in values:
        if not _is_int(value) or value < 1:
            raise CheckpointError(f"{where}.{key} must hold integers >= 1, got {list(values)!r}")


def _check_transformer(where: str, cfg, eps_key: str = "rms_norm_eps") -> None:
    """What every transformer here needs: positive sizes, a positive norm epsilon and RoPE base, and a
    head_dim that is given or follows from hidden_size / num_attention_heads."""
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
    ):
        positive_int(where, key, getattr(cfg, key))
    repeat_count(where, "num_hidden_layers", cfg.num_hidden_layers, minimum=0)
    positive_number(where, eps_key, getattr(cfg, eps_key))
    positive_number(where, "rope_theta", cfg.rope_theta)
    if cfg.head_dim is not None:
        positive_int(where, "head_dim", cfg.head_dim)
    elif cfg.hidden_size < cfg.num_attention_heads:
        raise CheckpointError(
            f"{where}: hidden_size {cfg.hidden_size} is smaller than num_attention_heads "
            f"{cfg.num_attention_heads}, so head_dim = hidden_size // heads would be 0"
        )


# ----------------------------------------------------------------------------- configs


def check_code_predictor_config(cfg) -> None:
    where = "code_predictor_config"
    _check_transformer(where, cfg)
    positive_int(where, "vocab_size", cfg.vocab_size)
    repeat_count(where, "num_code_groups", cfg.num_code_groups, minimum=2)
    if getattr(cfg, "use_sliding_window", False):
        positive_int(where, "sliding_window", cfg.sliding_window)


def check_talker_config(cfg) -> None:
    where = "talker_config"
    _check_transformer(where, cfg)
    for key in ("vocab_size", "text_hidden_size"):
        positive_int(where, key, getattr(cfg, key))
    repeat_count(where, "num_code_groups", cfg.num_code_groups, minimum=2)
    if cfg.text_vocab_size is not None:
        positive_int(where, "text_vocab_size", cfg.text_vocab_size)
    for key in (
        "codec_eos_token_id",
        "codec_think_id",
        "codec_nothink_id",
        "codec_think_bos_id",
        "codec_think_eos_id",
        "codec_pad_id",
        "codec_bos_id",
    ):
        token_id(where, key, getattr(cfg, key), cfg.vocab_size)
    for table in ("spk_id", "codec_language_id", "spk_is_dialect"):
        entries = getattr(cfg, table)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise CheckpointError(
                f"{where}.{table} must be a JSON object (speaker or language name -> value), got {entries!r}"
            )
        if table == "spk_is_dialect":
            continue
        for name, value in entries.items():
            for v in value if isinstance(value, list) else [value]:
                token_id(where, f"{table}[{name!r}]", v, cfg.vocab_size)


def check_tts_config(cfg) -> None:
    """The top level: the text-side special ids must lie in the talker's text vocabulary."""
    text_vocab = cfg.talker_config.text_vocab_size if cfg.talker_config is not None else None
    for key in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"):
        value = getattr(cfg, key)
        if text_vocab is None:
            positive_int("config", key, value, minimum=0)
        else:
            token_id("config", key, value, text_vocab, "talker_config.text_vocab_size")


def check_decoder_config(cfg) -> None:
    where = "decoder_config"
    _check_transformer(where, cfg)
    for key in ("codebook_size", "latent_dim", "sliding_window", "decoder_dim", "codebook_dim"):
        positive_int(where, key, getattr(cfg, key))
    repeat_count(where, "num_quantizers", cfg.num_quantizers)
    positive_ints(where, "upsample_rates", cfg.upsample_rates)
    positive_ints(where, "upsampling_ratios", cfg.upsampling_ratios, allow_empty=True)
    finite_number(where, "layer_scale_initial_scale", cfg.layer_scale_initial_scale)


def check_encoder_config(cfg) -> None:
    where = "encoder_config"
    _check_transformer(where, cfg, eps_key="norm_eps")
    for key in (
        "sampling_rate",
        "num_filters",
        "kernel_size",
        "last_kernel_size",
        "residual_kernel_size",
        "dilation_growth_rate",
        "compress",
        "codebook_size",
        "codebook_dim",
        "vector_quantization_hidden_dimension",
        "upsample_groups",
        "sliding_window",
    ):
        positive_int(where, key, getattr(cfg, key))
    repeat_count(where, "num_quantizers", cfg.num_quantizers)
    repeat_count(where, "num_residual_layers", cfg.num_residual_layers, minimum=0)
    positive_ints(where, "upsampling_ratios", cfg.upsampling_ratios)
    if cfg.frame_rate is not None:
        positive_number(where, "frame_rate", cfg.frame_rate)
        seanet_rate = math.ceil(cfg.sampling_rate / math.prod(cfg.upsampling_ratios))
        if not seanet_rate / cfg.frame_rate <= MAX_REPEATS:
            raise CheckpointError(
                f"{where}.frame_rate {cfg.frame_rate!r} is too small: the downsampling ratio "
                f"{seanet_rate} / frame_rate must be at most {MAX_REPEATS}"
            )
    if not _is_int(cfg.num_semantic_quantizers) or not 0 <= cfg.num_semantic_quantizers <= cfg.num_quantizers:
        raise CheckpointError(
            f"{where}.num_semantic_quantizers must be an integer in [0, num_quantizers "
            f"{cfg.num_quantizers}], got {cfg.num_semantic_quantizers!r}"
        )


def check_speaker_encoder_config(cfg) -> None:
    where = "speaker_encoder_config"
    for key in ("mel_dim", "enc_dim", "enc_attention_channels", "enc_res2net_scale", "enc_se_channels", "sample_rate"):
        positive_int(where, key, getattr(cfg, key))
    for key in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
        positive_ints(where, key, getattr(cfg, key))


def check_speech_tokenizer_config(config: Mapping, num_quantizers: int) -> None:
    """The speech tokenizer's top level (rates and the number of codes the encoder keeps)."""
    where = "speech tokenizer config"
    for key in ("output_sample_rate", "input_sample_rate", "decode_upsample_rate", "encode_downsample_rate"):
        if key in config:
            positive_int(where, key, config[key])
    if "encoder_valid_num_quantizers" in config:
        value = config["encoder_valid_num_quantizers"]
        if not _is_int(value) or not 1 <= value <= num_quantizers:
            raise CheckpointError(
                f"{where}.encoder_valid_num_quantizers must be an integer in [1, "
                f"{num_quantizers}] (the decoder's num_quantizers), got {value!r}"
            )


# ----------------------------------------------------------------------------- codes


def check_codes(codes, groups: int, codebook_size: int, allow_padding: bool = False, what: str = "codes") -> np.ndarray:
    """Codes [T, groups] of any integer dtype (signed or unsigned) with values in [0, codebook_size) (or -1
    for a whole padding frame when ``allow_padding``), returned as int64.  The range is checked before the
    cast, so a uint64 2^64 - 1 is out of range instead of wrapping to -1."""
    arr = np.asarray(codes)
    if arr.dtype == object:
        raise ValueError(f"{what} must be a rectangular integer array [T, {groups}]")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must have an integer dtype, got {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{what} must have rank 2, [T, {groups}] (frames x code groups); got shape {arr.shape}")
    if arr.shape[1] != groups:
        raise ValueError(
            f"{what} must have {groups} code groups per frame (shape [T, {groups}]); got shape {arr.shape}"
        )
    low = -1 if allow_padding else 0
    bad = (arr < low) | (arr >= codebook_size)
    if allow_padding:  # -1 marks a padding frame: group 0 is -1; a -1 inside a real frame is an error
        bad |= (arr == -1) & (arr[:, :1] != -1)
    if bad.any():
        t, q = np.argwhere(bad)[0]
        allowed = f"[0, {codebook_size})" + (" or -1 padding" if allow_padding else "")
        raise ValueError(
            f"{what}: code {arr[t, q]} at frame {t}, group {q} is outside {allowed} ({int(bad.sum())} such codes)"
        )
    return arr.astype(np.int64)


# ----------------------------------------------------------------------------- non-finite values


class NonFiniteError(ValueError):
    """A network stage produced NaN or infinite values (from extreme input or damaged weights)."""


def check_finite(x, stage: str, hint: str = "") -> None:
    """Raise NonFiniteError naming ``stage`` if ``x`` holds NaN or infinity."""
    x = np.asarray(x)
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise NonFiniteError(
            f"{stage} produced non-finite values ({bad} of {x.size} are NaN or infinite)"
            + (f"; {hint}" if hint else "")
        )


def first_non_finite(trace: Mapping) -> str | None:
    """The name of the first array (in recording order) of a trace that holds NaN or infinity."""
    for name, value in trace.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            return name
    return None


def raise_non_finite_stage(network: str, run_traced, hint: str = "") -> None:
    """A network's output held NaN or infinity: run it again with a trace (only now, so the normal path
    pays nothing) and raise NonFiniteError naming the first stage that went non-finite."""
    trace = {}
    with np.errstate(all="ignore"):
        run_traced(trace)
    stage = first_non_finite(trace) or "output"
    raise NonFiniteError(
        f"{network}: stage {stage!r} produced non-finite values (NaN or infinity): damaged "
        f"weights or extreme input{'; ' + hint if hint else ''}"
    )


def count(minimum: int):
    """An argparse type: an integer >= minimum, else a usage error naming the option
    (every integer option of the command line: ``refimpl say``, ``trace``, ``golden``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse
