"""Hostile codes and texts: integer kinds of every width and sign, values at and past the ends of the
codebook, texts with lone surrogates and random Unicode at the tokenizer's boundary."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import CHECKPOINTS
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refimpl import CheckpointError, Qwen3TTS
from refimpl.tts.text_tokenizer import load_text_tokenizer

CODEBOOK = 64  # the tiny speech tokenizer


# ----------------------------------------------------------------------------- codes


@pytest.mark.parametrize("method", ["decode", "decode_full", "stream"])
def test_uint64_max_is_out_of_range_not_minus_one(speech_tokenizers, method):
    """2^64 - 1 used to wrap to -1 on the cast to int64: a padding frame, decoded to empty audio."""
    tok = speech_tokenizers["f32"]
    codes = np.zeros((2, 16), np.uint64)
    codes[0, 0] = np.iinfo(np.uint64).max
    call = tok.stream().push if method == "stream" else getattr(tok, method)
    with pytest.raises(ValueError, match="code 18446744073709551615 at frame 0, group 0 is outside"):
        call(codes)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32"])
def test_every_integer_kind_decodes_like_int64(speech_tokenizers, dtype):
    tok = speech_tokenizers["f32"]
    codes = np.random.default_rng(0).integers(0, CODEBOOK, (3, 16))
    np.testing.assert_array_equal(tok.decode(codes.astype(dtype)), tok.decode(codes))


@pytest.mark.parametrize("value", [CODEBOOK, 2**31, -2, np.iinfo(np.int64).min])
def test_codes_past_either_end(speech_tokenizers, value):
    codes = np.zeros((2, 16), np.int64)
    codes[1, 5] = value
    with pytest.raises(ValueError, match=f"code {value} at frame 1, group 5 is outside"):
        speech_tokenizers["f32"].decode(codes)


def test_float_and_bool_codes_are_refused(speech_tokenizers):
    with pytest.raises(ValueError, match="integer dtype, got float64"):
        speech_tokenizers["f32"].decode(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="integer dtype, got bool"):
        speech_tokenizers["f32"].decode(np.zeros((2, 16), bool))


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.int8, np.int16, np.int64, np.uint8, np.uint32, np.uint64]),
        st.tuples(st.integers(0, 3), st.sampled_from([15, 16, 17])),
    )
)
def test_random_code_arrays(speech_tokenizers, codes):
    """Any integer array either decodes to 1920 samples per valid frame or gives one ValueError."""
    tok = speech_tokenizers["f32"]
    try:
        wav = tok.decode(codes)
    except ValueError as e:
        assert "code" in str(e)
        return
    as_int = codes.astype(object)
    assert codes.shape[1] == 16 and all(-1 <= v < CODEBOOK for v in as_int.ravel())
    assert wav.shape == (1920 * int(np.sum(as_int[:, 0] != -1)),) and np.isfinite(wav).all()


# ----------------------------------------------------------------------------- text


@pytest.fixture(scope="module")
def text_tokenizer():
    return load_text_tokenizer(CHECKPOINTS / "tiny-customvoice")


def test_lone_surrogate_is_a_value_error(text_tokenizer):
    with pytest.raises(ValueError, match=r"text is not valid Unicode: lone surrogate U\+D800 at character 1"):
        text_tokenizer.encode("a\ud800b")
    with pytest.raises(ValueError, match=r"text\[1\] is not valid Unicode: lone surrogate U\+DCFF"):
        text_tokenizer.encode_batch(["ok", "bad \udcff"])


def test_lone_surrogate_in_every_text_argument():
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    for kwargs in (dict(text="Hi \udc80"), dict(text="Hi", instruct="calm \ud83d")):
        with pytest.raises(ValueError, match="lone surrogate"):
            tts.generate_custom_voice(speaker="vivian", max_new_tokens=2, **{"text": "Hi", **kwargs})


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40))
def test_random_unicode_at_the_tokenizer(text_tokenizer, text):
    """Any str (surrogates included) gives ids inside the vocabulary, or the lone-surrogate error."""
    try:
        ids = text_tokenizer.encode(text)
    except ValueError as e:
        assert "lone surrogate" in str(e)
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        return
    assert all(0 <= i < text_tokenizer.vocab_size for i in ids)
    assert (len(ids) == 0) == (len(text) == 0)


@pytest.mark.parametrize(
    "name, raw, fragment",
    [
        ("vocab.json", b"[1]", "expected a JSON object"),
        ("vocab.json", b'{"a": "\xff"}', "not valid UTF-8"),
        ("merges.txt", b"a b\n\xff\xfe c\n", "not valid UTF-8"),
        ("tokenizer_config.json", b"{", "not valid JSON"),
        ("generation_config.json", b"[]", "expected a JSON object"),
    ],
)
def test_malformed_text_files_name_the_file(tmp_path, name, raw, fragment):
    d = tmp_path / "m"
    shutil.copytree(CHECKPOINTS / "tiny-customvoice", d)
    (d / name).write_bytes(raw)
    with pytest.raises(CheckpointError) as info:
        Qwen3TTS.from_pretrained(d)
    assert name in str(info.value) and fragment in str(info.value)


def test_reference_codes_of_a_voice_clone_prompt_are_range_checked():
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-base")
    prompt = tts.create_voice_clone_prompt((np.zeros(4000, np.float32), 24000), ref_text="A reference.")
    prompt[0].ref_code = np.full_like(prompt[0].ref_code, np.iinfo(np.uint64).max, dtype=np.uint64)
    with pytest.raises(ValueError, match="reference codes: code 18446744073709551615 at frame 0, group 0 is outside"):
        tts.generate_voice_clone("Hello.", voice_clone_prompt=prompt, max_new_tokens=3)


@pytest.mark.parametrize("eos", [-1, 10**6])
def test_eos_outside_the_vocabulary_is_refused(eos):
    """An EOS id that can never be drawn would make generation run to max_new_tokens every time."""
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    with pytest.raises(ValueError, match=f"eos_token_id {eos} is outside the talker vocabulary"):
        tts.generate_custom_voice("Hi.", speaker="vivian", eos_token_id=eos, max_new_tokens=3)


# ----------------------------------------------------------------------------- sampling arguments


@pytest.fixture(scope="module")
def tiny_tts():
    return Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")


@pytest.mark.parametrize(
    "keyword, value",
    [
        ("temperature", 1e-40),  # below float32's smallest normal number: the scores overflow
        ("temperature", 1e300),  # becomes infinity in float32: -inf / inf is NaN
        ("subtalker_temperature", 1e-40),
        ("repetition_penalty", 1e-40),
        ("repetition_penalty", 1e300),
    ],
)
def test_sampling_divisors_outside_the_compute_dtype_are_refused(tiny_tts, keyword, value):
    """These used to give NaN scores and code 0 at every step; now one ValueError naming the keyword."""
    with pytest.raises(ValueError, match=f"{keyword} must lie in \\[1.175e-38, 3.403e\\+38\\].*float32"):
        tiny_tts.generate_custom_voice("Hi.", speaker="vivian", max_new_tokens=3, **{keyword: value})


def test_a_divisor_valid_in_float64_is_checked_against_float64():
    from refimpl.sampling import SamplingSettings

    SamplingSettings(temperature=1e-40).validate(np.float64)  # a normal float64 number
    with pytest.raises(ValueError, match="float32"):
        SamplingSettings(temperature=1e-40).validate(np.float32)


def test_scores_that_overflow_when_scaled_are_an_error_naming_the_setting():
    """A normal temperature can still overflow large scores: refused, not turned into NaN."""
    from refimpl.sampling import apply_repetition_penalty, apply_temperature

    scores = np.array([[1e30, -np.inf, 2.0]], np.float32)
    with pytest.raises(ValueError, match="temperature 1e-10 makes the scores overflow float32"):
        apply_temperature(scores, 1e-10)
    np.testing.assert_array_equal(apply_temperature(scores, 2.0), scores / np.float32(2))
    with pytest.raises(ValueError, match="repetition_penalty 1e-10 makes the scores overflow"):
        apply_repetition_penalty(scores, [[0]], 1e-10)


@pytest.mark.parametrize("bad, index", [(np.nan, 1), (np.inf, 1), (1.0, 1), (-0.25, 1)])
def test_replayed_draws_must_be_finite_uniforms(tiny_tts, bad, index):
    """A replayed uniform outside [0, 1) (NaN picked code 0 silently) is a ValueError naming its index."""
    draws = np.full(64, 0.5)
    draws[index] = bad
    with pytest.raises(ValueError, match=f"random_draws\\[{index}\\] is .*not a uniform in \\[0, 1\\)"):
        tiny_tts.generate_custom_voice("Hi.", speaker="vivian", max_new_tokens=3, random_draws=draws)
    with pytest.raises(ValueError, match="real numbers"):
        tiny_tts.generate_custom_voice("Hi.", speaker="vivian", max_new_tokens=3, random_draws=np.array(["0.5"]))
