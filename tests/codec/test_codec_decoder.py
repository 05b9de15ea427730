"""Parity of the 12 Hz codec decoder with the official implementation (golden/codec_decoder.npz,
recorded by golden/oracle/record_codec_decoder.py on golden/checkpoints/tiny-speech-tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GOLDEN, assert_close_to_oracle

from refimpl.codec import decoder as codec_decoder

GOLD = np.load(GOLDEN / "codec_decoder.npz")
KEYS = sorted({k.split("/")[0] for k in GOLD.files if k.startswith("t")}, key=lambda k: int(k[1:]))
PRECISIONS = ("f32", "f64")


def test_golden_file_covers_the_required_cases():
    lengths = [int(k[1:]) for k in KEYS]
    window = 8  # tiny decoder sliding_window
    assert 1 in lengths and any(n % 2 == 1 and n > 1 for n in lengths)
    assert any(n > window for n in lengths) and any(n > 300 for n in lengths)
    assert "torch==2.13.0" in str(GOLD["versions"]) and "qwen-tts==" in str(GOLD["versions"])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("key", KEYS)
def test_every_stage_matches_official(speech_tokenizers, key, precision):
    tok = speech_tokenizers[precision]
    codes = GOLD[f"{key}/codes"]
    trace = {}
    wav = codec_decoder.decode_codes(tok.decoder_weights, tok.decoder_config, codes.T[None], trace=trace)
    checked = 0
    for stage in codec_decoder.STAGES:
        name = f"{key}/{precision}/stage/{stage}"
        if name in GOLD.files:
            assert_close_to_oracle(
                trace[stage][0],
                GOLD[f"{key}/f32/stage/{stage}"],
                GOLD[f"{key}/f64/stage/{stage}"],
                precision,
                f"{key} stage {stage}",
            )
            checked += 1
    if int(key[1:]) <= 10:
        assert checked == len(codec_decoder.STAGES)
    assert_close_to_oracle(wav[0], GOLD[f"{key}/f32/full"], GOLD[f"{key}/f64/full"], precision, f"{key} waveform")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("key", KEYS)
def test_decode_full_and_official_chunked_decode(speech_tokenizers, key, precision):
    tok = speech_tokenizers[precision]
    codes = GOLD[f"{key}/codes"]
    T = codes.shape[0]
    full = tok.decode_full(codes)
    assert full.dtype == np.dtype(precision.replace("f", "float")) and full.shape == (T * 1920,)
    assert_close_to_oracle(full, GOLD[f"{key}/f32/full"], GOLD[f"{key}/f64/full"], precision, f"{key} decode_full")
    wav = tok.decode(codes)
    assert wav.shape == (T * 1920,)
    if T <= 300:  # one chunk: the official decode is the single pass
        assert_close_to_oracle(wav, GOLD[f"{key}/f32/full"], GOLD[f"{key}/f64/full"], precision, f"{key} decode")
    else:
        head = slice(0, 300 * 1920)
        assert_close_to_oracle(
            wav[head],
            GOLD[f"{key}/f32/full"][head],
            GOLD[f"{key}/f64/full"][head],
            precision,
            f"{key} decode, first chunk",
        )
        assert_close_to_oracle(
            wav[300 * 1920 :],
            GOLD[f"{key}/f32/decode_after_300"],
            GOLD[f"{key}/f64/decode_after_300"],
            precision,
            f"{key} decode, second chunk",
        )
        # and chunking is visible: the second chunk sees only 25 frames of context, less than the receptive
        # field of the tiny decoder's 4 layers of 8-frame windows, so it differs from the single pass (the
        # far context is damped by the layer scales, so the difference is small, but far above float64 noise)
        if precision == "f64":
            assert np.max(np.abs(wav[300 * 1920 :] - full[300 * 1920 :])) > 1e-8


def test_waveform_is_not_trivial():
    wav = GOLD["t311/f64/full"]
    assert np.std(wav) > 0.1 and np.mean(np.abs(wav) >= 1.0) < 0.05


def test_padding_and_batch_like_the_official(speech_tokenizers):
    tok = speech_tokenizers["f32"]
    a, b = GOLD["batch/a"], GOLD["batch/b"]
    # the official wrapper pads a list to the longest with -1 and cuts each output to its own length
    wa, wb = tok.decode([a, b])
    assert wa.shape == (a.shape[0] * 1920,) and wb.shape == (b.shape[0] * 1920,)
    for ours, off, name in ((wa, GOLD["batch/f32/a"], "a"), (wb, GOLD["batch/f32/b"], "b")):
        err = np.max(np.abs(ours - off))  # float32 only: the decoder's float32 tolerance (~1.6e-5), rounded up
        assert err < 2e-5, f"batch item {name}: {err}"
    padded = np.concatenate([a, -np.ones((4, 16), dtype=np.int64)])
    np.testing.assert_allclose(tok.decode(padded), wa, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((3, 15), dtype=np.int64), "16 code groups"),
        (np.zeros((3,), dtype=np.int64), "rank 2"),
        (np.zeros((1, 3, 16), dtype=np.int64), "rank 2"),
        (np.zeros((3, 16), dtype=np.float32) + 0.5, "integer dtype"),
        (np.full((3, 16), 64), "outside [0, 64)"),
        (np.full((3, 16), -2), "outside [0, 64)"),
    ],
)
def test_bad_codes_are_rejected_with_a_clear_message(speech_tokenizers, bad, message):
    tok = speech_tokenizers["f32"]
    for method in (tok.decode, tok.decode_full, lambda c: tok.stream().push(c)):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
            method(bad)


def test_minus_one_inside_a_real_frame_is_rejected(speech_tokenizers):
    codes = np.zeros((4, 16), dtype=np.int64)
    codes[1, 5] = -1
    with pytest.raises(ValueError, match="frame 1, group 5"):
        speech_tokenizers["f32"].decode(codes)
    with pytest.raises(ValueError, match="outside"):  # decode_full and streaming take no padding at all
        speech_tokenizers["f32"].decode_full(-np.ones((2, 16), dtype=np.int64))


def test_empty_sequence(speech_tokenizers):
    tok = speech_tokenizers["f32"]
    assert tok.decode(np.zeros((0, 16), dtype=np.int64)).shape == (0,)
    assert tok.decode_full(np.zeros((0, 16), dtype=np.int64)).shape == (0,)


def test_public_attributes(speech_tokenizers):
    tok = speech_tokenizers["f32"]
    assert (tok.sample_rate, tok.num_quantizers, tok.samples_per_frame) == (24000, 16, 1920)


def test_nested_lists_and_batches(speech_tokenizers):
    """A nested list [T][16] is one sequence; a list of [T, 16] arrays is a batch."""
    tok = speech_tokenizers["f64"]
    codes = GOLD["t7/codes"]
    one = tok.decode(codes)
    np.testing.assert_array_equal(tok.decode(codes.tolist()), one)
    np.testing.assert_array_equal(tok.decode_full(codes.tolist()), tok.decode_full(codes))
    batch = tok.decode([codes, codes[:3]])
    assert isinstance(batch, list) and len(batch) == 2 and batch[1].shape == (3 * 1920,)
    np.testing.assert_allclose(batch[0], one, rtol=0, atol=1e-12)
    assert tok.decode([]) == []
