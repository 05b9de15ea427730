"""refimpl.porting.names: the official names a trace adds to what the stage code records, each the very
tensor that was computed (nothing computed twice), in the official call order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import SpeechTokenizer, nn
from refimpl.porting import trace_files
from refimpl.porting.names import official_calls


def test_conv_units_get_their_inner_conv_and_the_untrimmed_transposed_output():
    y, full = np.ones((1, 2, 4)), np.ones((1, 2, 6))
    calls = [
        ("decoder.pre_conv", y),
        ("refimpl.decoder.upsample.0.0.untrimmed", full),
        ("decoder.upsample.0.0", full[:, :, :4]),
        ("decoder.decoder.5", y),
    ]
    wrappers = frozenset({"decoder.pre_conv", "decoder.upsample.0.0"})
    out = official_calls(calls, wrappers)
    assert [k for k, _ in out] == [
        "decoder.pre_conv.conv",
        "decoder.pre_conv",
        "decoder.upsample.0.0.conv",
        "decoder.upsample.0.0",
        "decoder.decoder.5",
    ]
    assert out[0][1] is y and out[2][1] is full


def test_identity_qk_norm_and_per_layer_rotary_are_views_of_what_was_computed():
    cos_btd = np.arange(3 * 8.0).reshape(1, 3, 8)
    q_btc = np.arange(3 * 32.0).reshape(1, 3, 32)
    calls = [
        ("decoder.pre_transformer.rotary_emb", cos_btd),
        ("decoder.pre_transformer.layers.0.self_attn.q_proj", q_btc),
        ("decoder.pre_transformer.layers.0.self_attn.k_proj", q_btc[:, :, :16]),
    ]
    out = dict(official_calls(calls))
    q_norm = out["decoder.pre_transformer.layers.0.self_attn.q_norm"]
    assert q_norm.shape == (1, 3, 4, 8) and np.shares_memory(q_norm, q_btc)
    assert np.array_equal(q_norm[0, 2, 1], q_btc[0, 2, 8:16])
    assert out["decoder.pre_transformer.layers.0.self_attn.k_norm"].shape == (1, 3, 2, 8)

    calls = [
        ("refimpl.encoder.encoder_transformer.rope.cos", cos_btd),
        ("encoder.encoder_transformer.layers.1.self_attn.v_proj", q_btc),
    ]
    out = official_calls(calls)
    assert out[-1] == ("encoder.encoder_transformer.layers.1.self_attn.rotary_emb", cos_btd)
    with pytest.raises(ValueError, match="no refimpl.encoder.encoder_transformer.rope.cos recorded"):
        official_calls(calls[1:])


def test_tdnn_activation_comes_before_its_block():
    h = np.zeros((1, 4, 5))
    calls = [("speaker_encoder.blocks.2.tdnn1.conv", h), ("speaker_encoder.blocks.2.tdnn1", h)]
    keys = [k for k, _ in official_calls(calls)]
    assert keys == [
        "speaker_encoder.blocks.2.tdnn1.conv",
        "speaker_encoder.blocks.2.tdnn1.activation",
        "speaker_encoder.blocks.2.tdnn1",
    ]
    # an SE-Res2Net block is not a TDNN block
    assert [k for k, _ in official_calls([("speaker_encoder.blocks.2", h)])] == ["speaker_encoder.blocks.2"]


def test_identity_shortcut_is_the_residual_blocks_input():
    x, h = np.zeros((1, 4, 5)), np.ones((1, 4, 5))
    calls = [
        ("encoder.encoder.layers.3", x),
        ("encoder.encoder.layers.4.block.3", h),
        ("encoder.encoder.layers.4", x + h),
    ]
    out = official_calls(calls)
    assert [k for k, _ in out][2] == "encoder.encoder.layers.4.shortcut" and out[2][1] is x
    # with a shortcut conv the stage code records the shortcut itself: nothing is added
    conv_shortcut = frozenset({"encoder.encoder.layers.4.shortcut"})
    assert [k for k, _ in official_calls(calls, conv_shortcut)] == [k for k, _ in calls]


def test_a_traced_decode_runs_each_transposed_conv_once(monkeypatch):
    """The untrimmed output in a trace is the one the decoder computed, not a second convolution."""
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    codes = np.random.default_rng(1).integers(0, tok.codebook_size, size=(4, tok.num_quantizers))
    calls = []
    conv_transpose1d = nn.conv_transpose1d
    monkeypatch.setattr(nn, "conv_transpose1d", lambda *a, **k: calls.append(1) or conv_transpose1d(*a, **k))
    tok.decode_full(codes)
    untraced, calls[:] = len(calls), []
    trace = trace_files.trace_codec_decode(tok, codes)
    cfg = tok.decoder_config
    assert len(calls) == untraced == len(cfg.upsampling_ratios) + len(cfg.upsample_rates)
    for i, rate in enumerate(cfg.upsample_rates):  # kernel 2 * rate, stride rate: the last rate samples cut
        full, trimmed = trace[f"decoder.decoder.{i + 1}.block.1.conv"], trace[f"decoder.decoder.{i + 1}.block.1"]
        assert full.shape[-1] == trimmed.shape[-1] + rate and np.shares_memory(full, trimmed)
        np.testing.assert_array_equal(full[..., : trimmed.shape[-1]], trimmed)
