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
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ..codec.decoder import DecoderConfig, decoder_weight_spec
from ..codec.encoder import EncoderConfig, encoder_weight_spec
from ..io.checkpoint import WeightSpec, write_safetensors_file
from ..io.files import write_atomically
from ..tts.speaker_encoder import SpeakerEncoderConfig, speaker_encoder_checkpoint_spec
from ..tts.talker import TalkerConfig, talker_weight_spec
from ..tts.text_tokenizer import QWEN2_SPLIT_PATTERN, _byte_level_bpe_json, byte_alphabet_in_vocab_order
from .presets import (
    RELEASED_FIRST_ADDED_TEXT_ID,
    RELEASED_GENERATION_CONFIG,
    SPEECH_TOKENIZER_PREPROCESSOR,
    TINY_SPEECH_TOKENIZER,
    preset,
)

__all__ = [
    "random_tensor",
    "random_weights",
    "write_checkpoint",
    "speech_tokenizer_weight_spec",
    "write_speech_tokenizer",
    "write_text_tokenizer",
    "write_tiny_text_tokenizer",
    "unused_vocab_entry",
    "learn_bpe_merges",
    "write_speaker_encoder",
    "tts_model_weight_spec",
    "write_tts_model",
    "byte_level_vocab",
]


def write_json(path: str | os.PathLike, value: Any, newline: str = "\n", **dumps_options: Any) -> None:
    """One JSON file of a checkpoint, written atomically (a failed write keeps the previous file)."""
    write_atomically(path, (json.dumps(value, **dumps_options) + newline).encode("utf-8"))


def random_tensor(spec: WeightSpec, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode("utf-8"))])
    shape = tuple(spec.shape)
    kind, _, gain_text = spec.init.partition("*")
    gain = float(gain_text) if gain_text else 1.0
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


def random_weights(spec: Iterable[WeightSpec], seed: int) -> dict[str, np.ndarray]:
    """Seeded random float32 tensors for every entry of ``spec``."""
    return {s.name: random_tensor(s, seed) for s in spec}


def write_checkpoint(
    directory: str | os.PathLike,
    config: Mapping | None,
    tensors: Mapping[str, np.ndarray],
    dtype: str = "float32",
    max_shard_bytes: int | None = None,
) -> Path:
    """Write ``config.json`` and the tensors as ``model.safetensors``, or, when ``max_shard_bytes`` is
    given and exceeded, as ``model-0000x-of-0000y.safetensors`` shards plus
    ``model.safetensors.index.json`` (the Hugging Face sharded layout)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        write_json(directory / "config.json", config, indent=2, sort_keys=True)
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    shards: list[dict[str, np.ndarray]] = []
    current: dict[str, np.ndarray] = {}
    current_bytes = 0
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
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    write_json(directory / "model.safetensors.index.json", index, indent=2, sort_keys=True)
    return directory


def speech_tokenizer_weight_spec(config: Mapping) -> list[WeightSpec]:
    """All tensors of a 12 Hz speech tokenizer checkpoint (``encoder.*`` and ``decoder.*``)."""

    spec = [
        WeightSpec("decoder." + s.name, s.shape, s.init)
        for s in decoder_weight_spec(DecoderConfig.from_dict(config["decoder_config"]))
    ]
    spec += [
        WeightSpec("encoder." + s.name, s.shape, s.init)
        for s in encoder_weight_spec(EncoderConfig.from_dict(config["encoder_config"]))
    ]
    return spec


def write_speech_tokenizer(
    directory: str | os.PathLike,
    config: Mapping,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_bytes: int | None = None,
) -> Path:
    """A complete synthetic speech-tokenizer directory: config.json, model.safetensors (or shards)
    and preprocessor_config.json, with seeded random weights."""

    directory = write_checkpoint(
        directory, config, random_weights(speech_tokenizer_weight_spec(config), seed), dtype, max_shard_bytes
    )
    write_json(directory / "preprocessor_config.json", SPEECH_TOKENIZER_PREPROCESSOR, indent=2, sort_keys=True)
    return directory


# ---------------------------------------------------------------------------------------------
# text tokenizer files (vocab.json + merges.txt + tokenizer_config.json, the released layout)
# ---------------------------------------------------------------------------------------------

# Added tokens of the released Qwen3-TTS text tokenizer, ids 151643.. in this order: Qwen3's 26
# (the tool/fim/think ones are not "special"), then the audio/TTS ones.  <tts_pad>, <tts_text_bos>
# and <tts_text_eod> are the config's tts_pad/bos/eos ids 151671-151673.
QWEN3_TTS_ADDED_TOKENS = (
    [
        (t, True)
        for t in (
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
        )
    ]
    + [
        (t, False)
        for t in (
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        )
    ]
    + [
        (t, True)
        for t in (
            "<|audio_start|>",
            "<|audio_end|>",
            "<tts_pad>",
            "<tts_text_bos>",
            "<tts_text_eod>",
            "<tts_text_bos_single>",
            "<|audio_pad|>",
        )
    ]
)

# The tiny vocabulary keeps only the added tokens the TTS prompts use (same names, same relative order).
TINY_TEXT_ADDED_TOKENS = [
    (t, True)
    for t in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
        "<tts_text_bos_single>",
        "<|audio_pad|>",
    )
]

# Words that must be ONE token: the official prompt code slices the role prefix
# "<|im_start|>assistant\n" as exactly 3 ids and the tail "<|im_end|>\n<|im_start|>assistant\n" as 5.
TINY_TEXT_WHOLE_WORDS = ("assistant", "user", "system")

TINY_TEXT_CORPUS = """\
Hello, world! This is a tiny text for a tiny tokenizer. The quick brown fox jumps over the lazy dog.
She said: "I'll read the book tonight, and we're going to talk about it tomorrow."
Speech synthesis turns the text into sound; the speaker reads the words slowly and clearly.
In 2024 there were 365 days, 12 months and 52 weeks. Call 555-0134 at 10:30 am, or pay $19.99.
The weather is nice today, isn't it? Yes, it is very nice. Let's go for a walk in the park.
Good morning everyone, thank you for listening. Please speak a little louder, with a happy voice.
A warm, gentle female voice; a deep, calm male voice; an excited child who talks very fast.
今天天气很好，我们一起去公园散步吧。你好，世界！我是一个语音合成模型，很高兴认识你。
请用温柔的声音朗读这段文字。他说：“明天见！”我们明天早上八点在学校门口见面。
中文和英文混合的句子也很常见，比如 Qwen 模型可以说中文，也可以说 English。
こんにちは、世界。今日はいい天気ですね。ありがとうございます。
Bonjour tout le monde. Guten Tag! ¿Cómo estás? Ça va très bien, merci.
The numbers 0 1 2 3 4 5 6 7 8 9 and 3.14159, 2.71828, 1,000,000.
"""


def byte_level_vocab(merges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The Qwen2 numbering: the 256 byte symbols by code point (ids 0..255), then one id per merge in
    merge order (id 256 + rank).  Raises if two merges make the same token."""

    vocab = {s: i for i, s in enumerate(byte_alphabet_in_vocab_order())}
    for a, b in merges:
        if a not in vocab or b not in vocab:
            raise ValueError(f"merge ({a!r}, {b!r}) uses a symbol made by no earlier merge")
        if a + b in vocab:
            raise ValueError(f"merge ({a!r}, {b!r}) makes {a + b!r} a second time")
        vocab[a + b] = len(vocab)
    return vocab


def _byte_level_words(text: str) -> list[str]:
    """Pre-tokenise ``text`` the Qwen2 way and write each word in the byte-level alphabet."""
    import unicodedata

    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return [w for w, _ in pre.pre_tokenize_str(unicodedata.normalize("NFC", text))]


def learn_bpe_merges(text: str, num_merges: int, whole_words: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Deterministic BPE training: first the merges that build each of ``whole_words`` left to right,
    then, ``num_merges`` times, the most frequent adjacent pair over the words of ``text`` (ties go
    to the smallest pair in string order; stops early once every word is a single symbol)."""
    from collections import Counter

    merges: list[tuple[str, str]] = []
    made: set[str] = set()

    def add(a: str, b: str) -> None:
        merges.append((a, b))
        made.add(a + b)

    for word in whole_words:
        symbols = _byte_level_words(word)
        if len(symbols) != 1:
            raise ValueError(f"whole word {word!r} is not one pre-token")
        chars = list(symbols[0])
        for i in range(1, len(chars)):
            left = "".join(chars[:i])
            if left + chars[i] not in made:
                add(left, chars[i])

    words = Counter(_byte_level_words(text))
    split = {w: list(w) for w in words}
    for w in split:  # apply the whole-word merges first
        split[w] = _apply_merges(split[w], merges)
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, count in words.items():
            s = split[w]
            for a, b in pairwise(s):
                if a + b not in made:
                    pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        add(a, b)
        for w in split:
            split[w] = _apply_merges(split[w], [(a, b)])
    return merges


def _apply_merges(symbols: list[str], merges: Iterable[tuple[str, str]]) -> list[str]:
    for a, b in merges:
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols


def unused_vocab_entry(token_id: int) -> str:
    """The vocabulary entry that fills id ``token_id`` below ``first_added_id`` (``write_text_tokenizer``):
    no merge makes it, so no text encodes to it."""
    return f"<|unused_{token_id}|>"


def write_text_tokenizer(
    directory: str | os.PathLike,
    merges: Sequence[tuple[str, str]],
    added_tokens: Sequence[tuple[str, bool]],
    tokenizer_json: bool = False,
    first_added_id: int | None = None,
) -> dict[str, int]:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` in the released Qwen2 format
    (and ``tokenizer.json`` too when asked).  ``added_tokens`` is a list of (content, special); they take
    the ids from ``first_added_id`` on, in order (default: right after the BPE vocabulary).  The ids
    between the BPE vocabulary and ``first_added_id`` get ``unused_vocab_entry`` names in vocab.json: the
    official loader numbers the added tokens on from the vocabulary's size, so a gap cannot be left
    empty.  Returns {added token: id}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = byte_level_vocab(merges)
    if first_added_id is not None:
        if first_added_id < len(vocab):
            raise ValueError(f"first_added_id {first_added_id} lies inside the {len(vocab)}-entry vocabulary")
        for token_id in range(len(vocab), first_added_id):
            vocab[unused_vocab_entry(token_id)] = token_id
        if len(vocab) != first_added_id:
            raise ValueError("an unused vocabulary entry's name is already a token of the vocabulary")
    added = {content: len(vocab) + k for k, (content, _) in enumerate(added_tokens)}
    write_json(directory / "vocab.json", vocab, newline="", ensure_ascii=False)
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    write_atomically(directory / "merges.txt", merges_text.encode("utf-8"))
    entries = {
        str(added[c]): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": bool(special),
        }
        for c, special in added_tokens
    }
    specials = [c for c, special in added_tokens if special]
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": entries,
        "additional_special_tokens": [c for c in specials if c != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>" if "<|im_end|>" in added else None,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>" if "<|endoftext|>" in added else None,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    write_json(directory / "tokenizer_config.json", config, indent=2, ensure_ascii=False)
    if tokenizer_json:
        definition = _byte_level_bpe_json(vocab, merges, QWEN2_SPLIT_PATTERN)
        definition["added_tokens"] = [
            {
                "id": added[c],
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": bool(special),
            }
            for c, special in added_tokens
        ]
        write_json(directory / "tokenizer.json", definition, newline="", ensure_ascii=False)
    return added


def write_tiny_text_tokenizer(
    directory: str | os.PathLike, num_merges: int = 400, tokenizer_json: bool = False, released_ids: bool = False
) -> dict[str, int]:
    """The tiny text tokenizer of the synthetic checkpoints: 256 bytes + the merges that make
    "assistant", "user", "system" single tokens + ``num_merges`` merges learned from
    ``TINY_TEXT_CORPUS``, then ``TINY_TEXT_ADDED_TOKENS``.  Deterministic.  Returns {added token: id}
    (put im_start/im_end/tts_pad/tts_bos/tts_eos ids into the model's config.json from it).

    ``released_ids``: the added tokens are all of ``QWEN3_TTS_ADDED_TOKENS``, each at its released id
    (151643..151675), the ids between the tiny vocabulary and 151643 unused (``write_text_tokenizer``).
    The full-size checkpoints use it, so that a port which hard-codes the released ids reads the rows of
    the tokens it means."""
    merges = learn_bpe_merges(TINY_TEXT_CORPUS, num_merges, whole_words=TINY_TEXT_WHOLE_WORDS)
    if released_ids:
        return write_text_tokenizer(
            directory, merges, QWEN3_TTS_ADDED_TOKENS, tokenizer_json, first_added_id=RELEASED_FIRST_ADDED_TEXT_ID
        )
    return write_text_tokenizer(directory, merges, TINY_TEXT_ADDED_TOKENS, tokenizer_json=tokenizer_json)


def write_speaker_encoder(
    directory: str | os.PathLike, speaker_encoder_config: dict, seed: int = 0, dtype: str = "float32"
) -> Path:
    """A standalone synthetic speaker-encoder directory: config.json holding ``speaker_encoder_config``
    (and ``tts_model_type: base``), model.safetensors with the ``speaker_encoder.*`` tensors."""
    cfg = SpeakerEncoderConfig.from_dict(speaker_encoder_config)
    config = {"tts_model_type": "base", "speaker_encoder_config": dict(speaker_encoder_config)}
    return write_checkpoint(directory, config, random_weights(speaker_encoder_checkpoint_spec(cfg), seed), dtype)


# ---------------------------------------------------------------------------------------------
# full Qwen3-TTS model directories (talker + code predictor [+ speaker encoder], text tokenizer,
# generation_config.json, speech_tokenizer/)
# ---------------------------------------------------------------------------------------------


def tts_model_weight_spec(config: Mapping) -> list[WeightSpec]:
    """Every tensor of a full model's model.safetensors (full names: ``talker.*``, and
    ``speaker_encoder.*`` for Base models) from its config.json dict."""

    spec = [
        WeightSpec("talker." + s.name, s.shape, s.init)
        for s in talker_weight_spec(TalkerConfig.from_dict(config["talker_config"]))
    ]
    if config.get("tts_model_type") == "base":
        spec += speaker_encoder_checkpoint_spec(SpeakerEncoderConfig.from_dict(config["speaker_encoder_config"]))
    return spec


def write_tts_model(
    directory: str | os.PathLike,
    tts_model_type: str,
    tts_model_size: str,
    talker_config: Mapping,
    speaker_encoder_config: Mapping | None = None,
    seed: int = 0,
    dtype: str = "float32",
    speech_tokenizer_config: Mapping | None = None,
    speech_tokenizer_seed: int = 1234,
    generation_config: Mapping | None = None,
) -> Path:
    """A complete synthetic model directory in the released layout, with the tiny text tokenizer.

    The config's text ids (im_start/im_end, tts_pad/bos/eos) come from the written tokenizer.  A talker
    config with a ``text_vocab_size`` that has room for the released added-token ids (the ``RELEASED_TALKER_*``
    presets) gets the tokenizer with the released ids (``write_tiny_text_tokenizer(released_ids=True)``) and
    keeps its ``text_vocab_size``; any other (the tiny presets) gets the tiny numbering, and its
    ``text_vocab_size`` is the vocabulary's size rounded up to a multiple of 64 (as the released 151936 is
    padded past the last id)."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    talker = preset(dict(talker_config))
    released_ids = talker.get("text_vocab_size", 0) >= RELEASED_FIRST_ADDED_TEXT_ID + len(QWEN3_TTS_ADDED_TOKENS)
    added = write_tiny_text_tokenizer(directory, released_ids=released_ids)
    if not released_ids:
        talker["text_vocab_size"] = -(-(max(added.values()) + 1) // 64) * 64
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": tts_model_size,
        "tts_model_type": tts_model_type,
        "im_start_token_id": added["<|im_start|>"],
        "im_end_token_id": added["<|im_end|>"],
        "tts_pad_token_id": added["<tts_pad>"],
        "tts_bos_token_id": added["<tts_text_bos>"],
        "tts_eos_token_id": added["<tts_text_eod>"],
        "talker_config": talker,
    }
    if tts_model_type == "base":
        if speaker_encoder_config is None:
            raise ValueError("a base model needs speaker_encoder_config")
        config["speaker_encoder_config"] = dict(speaker_encoder_config)
    write_checkpoint(directory, config, random_weights(tts_model_weight_spec(config), seed), dtype)
    generation = dict(generation_config or RELEASED_GENERATION_CONFIG)
    write_json(directory / "generation_config.json", generation, indent=2, sort_keys=True)
    write_speech_tokenizer(
        directory / "speech_tokenizer",
        preset(speech_tokenizer_config or TINY_SPEECH_TOKENIZER),  # type: ignore[arg-type]  # any mapping copies
        seed=speech_tokenizer_seed,
    )
    return directory
