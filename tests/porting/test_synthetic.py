"""Synthetic checkpoints: the text tokenizer with the released added-token ids (the full-size checkpoints), and
the config keys of the released files that only ports read.

The full-size synthetic checkpoints keep the tiny BPE vocabulary but put every added token at the id the
released tokenizer gives it (a port may hard-code them); the tiny ones keep their own numbering.
"""

from __future__ import annotations

import json

import pytest
from conftest import CHECKPOINTS

from refimpl.codec.decoder import DecoderConfig, decoder_weight_spec
from refimpl.porting import presets, synthetic
from refimpl.tts.text_tokenizer import assistant_prompt, instruct_prompt, load_text_tokenizer, reference_prompt

# released facts (the released config.json and tokenizer_config.json)
RELEASED_TEXT_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<think>": 151667,
    "</think>": 151668,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
}
RELEASED_CONFIG_IDS = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}

PROMPTS = [
    assistant_prompt("Hello, world! This is a tiny text for a tiny tokenizer."),
    assistant_prompt("今天天气很好，我们一起去公园散步吧。こんにちは、世界。"),
    assistant_prompt("In 2024, call 555-0134 at 10:30 am, or pay $19.99. I'LL say HelloWorld."),
    assistant_prompt("\nA leading newline, <tts_pad> and <|im_start|> inside the text."),
    reference_prompt('She said: "I\'ll read the book tonight."'),
    instruct_prompt("A warm, gentle female voice."),
    *synthetic.TINY_TEXT_CORPUS.splitlines(),
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The tiny tokenizer with its own numbering and with the released ids (no config.json: both with the
    Qwen2 split pattern, so the token strings must be equal for every text)."""
    root = tmp_path_factory.mktemp("text")
    tiny = synthetic.write_tiny_text_tokenizer(root / "tiny")
    released = synthetic.write_tiny_text_tokenizer(root / "released", released_ids=True)
    return root, tiny, released


def test_released_ids_are_the_released_ones(tokenizers):
    root, _, released = tokenizers
    assert {t: released[t] for t in RELEASED_TEXT_IDS} == RELEASED_TEXT_IDS
    contents = [t for t, _ in synthetic.QWEN3_TTS_ADDED_TOKENS]
    assert released == {t: presets.RELEASED_FIRST_ADDED_TEXT_ID + k for k, t in enumerate(contents)}
    tok = load_text_tokenizer(root / "released")
    assert tok.added_tokens == released
    assert tok.base_vocab_size == presets.RELEASED_FIRST_ADDED_TEXT_ID
    assert tok.vocab_size == max(released.values()) + 1 <= presets.RELEASED_TEXT_VOCAB_SIZE


def test_released_ids_encode_as_before_apart_from_the_specials(tokenizers):
    root, tiny, released = tokenizers
    old, new = load_text_tokenizer(root / "tiny"), load_text_tokenizer(root / "released")
    renumber = {tiny[t]: released[t] for t in tiny}
    first_unused = min(tiny.values())
    for text in PROMPTS:
        before, after = old.encode(text), new.encode(text)
        assert [old.id_to_token(i) for i in before] == [new.id_to_token(i) for i in after], text
        assert after == [renumber.get(i, i) for i in before], text
        assert all(i < first_unused or i >= presets.RELEASED_FIRST_ADDED_TEXT_ID for i in after)
        assert new.decode(after) == old.decode(before) == text


def test_the_unused_ids_are_named_and_never_made(tokenizers):
    root, tiny, _ = tokenizers
    vocab = json.loads((root / "released" / "vocab.json").read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(presets.RELEASED_FIRST_ADDED_TEXT_ID))
    first_unused = min(tiny.values())
    assert vocab[synthetic.unused_vocab_entry(first_unused)] == first_unused
    merges = (root / "released" / "merges.txt").read_text(encoding="utf-8")
    assert merges == (root / "tiny" / "merges.txt").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="inside"):
        synthetic.write_text_tokenizer(root / "bad", [], synthetic.TINY_TEXT_ADDED_TOKENS, first_added_id=100)


def test_tokenizer_json_has_the_released_ids(tmp_path):
    released = synthetic.write_tiny_text_tokenizer(tmp_path, tokenizer_json=True, released_ids=True)
    definition = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert {t["content"]: t["id"] for t in definition["added_tokens"]} == released
    tok = load_text_tokenizer(tmp_path)
    assert tok.source == "tokenizer.json" and tok.added_tokens == released


@pytest.mark.parametrize("talker", ["RELEASED_TALKER_0_6B", "RELEASED_TALKER_0_6B_CUSTOMVOICE", "RELEASED_TALKER_1_7B"])
def test_released_presets_have_room_for_the_released_ids(talker):
    last = presets.RELEASED_FIRST_ADDED_TEXT_ID + len(synthetic.QWEN3_TTS_ADDED_TOKENS)
    assert getattr(presets, talker)["text_vocab_size"] == presets.RELEASED_TEXT_VOCAB_SIZE >= last


def test_write_tts_model_follows_the_talkers_text_vocabulary(tmp_path):
    """A talker with the released text vocabulary gets the released ids (the config's ids follow); one
    without (the tiny presets) keeps the tiny numbering.  A tiny talker stands in for the released one."""
    tiny = presets.TINY_TTS_MODELS["customvoice"]
    wide = dict(presets.preset(tiny["talker"]), text_vocab_size=presets.RELEASED_TEXT_VOCAB_SIZE)
    configs = {}
    for name, talker in (("tiny", tiny["talker"]), ("wide", wide)):
        directory = synthetic.write_tts_model(tmp_path / name, tiny["tts_model_type"], tiny["tts_model_size"], talker)
        configs[name] = json.loads((directory / "config.json").read_text())
    assert {k: configs["wide"][k] for k in RELEASED_CONFIG_IDS} == RELEASED_CONFIG_IDS
    assert configs["wide"]["talker_config"]["text_vocab_size"] == presets.RELEASED_TEXT_VOCAB_SIZE
    assert configs["tiny"]["im_start_token_id"] == 673 and configs["tiny"]["talker_config"]["text_vocab_size"] == 704
    assert "text_vocab_size" not in tiny["talker"]  # the preset is not edited


# ----------------------------------------------------------------------------- the keys only ports read

TALKERS = [name for name in dir(presets) if name.startswith(("RELEASED_TALKER_", "TINY_TALKER_"))]
QUANTIZER_KEYS = ("num_semantic_quantizers", "vector_quantization_hidden_dimension")


def quantizer_layout(decoder_config: dict) -> dict:
    """The decoder's split RVQ as its weights have it: the layers of the semantic part, and the width the
    quantizer takes in and gives back (its input projection's input)."""
    shapes = {s.name: s.shape for s in decoder_weight_spec(DecoderConfig.from_dict(decoder_config))}
    semantic = [n for n in shapes if n.startswith("quantizer.rvq_first.vq.layers.") and n.endswith(".embedding_sum")]
    return {
        "num_semantic_quantizers": len(semantic),
        "vector_quantization_hidden_dimension": shapes["quantizer.rvq_first.input_proj.weight"][1],
    }


def test_presets_carry_the_keys_only_ports_read():
    """The released values (presets.py says where they come from): position_id_per_seconds in every talker, and in
    the decoder's config the split RVQ's layout, which the weights fix (1 and the released codebook_dim 512)."""
    assert len(TALKERS) >= 7
    for name in TALKERS:
        assert getattr(presets, name)["position_id_per_seconds"] == presets.RELEASED_POSITION_ID_PER_SECONDS, name
    for tokenizer in (presets.RELEASED_SPEECH_TOKENIZER, presets.TINY_SPEECH_TOKENIZER):
        decoder = tokenizer["decoder_config"]
        assert {k: decoder[k] for k in QUANTIZER_KEYS} == quantizer_layout(decoder)
    assert quantizer_layout(presets.RELEASED_SPEECH_TOKENIZER["decoder_config"])["num_semantic_quantizers"] == 1


def test_written_checkpoints_carry_the_keys_only_ports_read(tmp_path):
    """What the writer writes, and the committed tiny checkpoints it wrote (golden/make_checkpoints.py)."""
    tiny = presets.TINY_TTS_MODELS["base"]
    written = synthetic.write_tts_model(
        tmp_path / "base", tiny["tts_model_type"], tiny["tts_model_size"], tiny["talker"], tiny["speaker_encoder"]
    )
    for directory in (written, *(CHECKPOINTS / f"tiny-{kind}" for kind in presets.TINY_TTS_MODELS)):
        talker = json.loads((directory / "config.json").read_text())["talker_config"]
        assert talker["position_id_per_seconds"] == presets.RELEASED_POSITION_ID_PER_SECONDS, directory.name
    for directory in (written / "speech_tokenizer", CHECKPOINTS / "tiny-speech-tokenizer"):
        decoder = json.loads((directory / "config.json").read_text())["decoder_config"]
        assert {k: decoder[k] for k in QUANTIZER_KEYS} == quantizer_layout(decoder), directory
