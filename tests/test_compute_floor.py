"""benchmarks/compute_floor.py: the products' multiply-adds counted as the reference runs them (against the
speaker encoder's architecture written out by hand), and the peak probe's chains all computed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CHECKPOINTS

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import compute_floor  # noqa: E402

from refimpl import nn  # noqa: E402
from refimpl.tts import speaker_encoder as speaker  # noqa: E402


def speaker_encoder_macs(cfg, T: int) -> int:
    """The ECAPA-TDNN's multiply-adds over T mel frames, from its architecture: the first TDNN; per SE-Res2Net
    block two 1x1 TDNNs, the Res2Net's groups but the first, and the squeeze-excitation's two 1x1 convs on
    the time average; the aggregation's TDNN; the pooling's TDNN on the frames alone (the statistics' share
    is a bias: a plain product, not counted) and its conv; the final 1x1 conv on the pooled statistics."""
    C, K = cfg.enc_channels, cfg.enc_kernel_sizes
    s, A, E = cfg.enc_res2net_scale, cfg.enc_attention_channels, cfg.enc_se_channels
    macs = C[0] * cfg.mel_dim * K[0] * T
    for i in range(1, len(C) - 1):
        macs += C[i] * C[i - 1] * T + (s - 1) * (C[i] // s) ** 2 * K[i] * T + C[i] * C[i] * T
        macs += E * C[i] + C[i] * E
    macs += C[-1] * sum(C[1:-1]) * K[-1] * T
    macs += A * C[-1] * T + C[-1] * A * T
    return macs + cfg.enc_dim * 2 * C[-1]


def test_count_products_is_the_speaker_encoders_architecture():
    enc = speaker.SpeakerEncoder.from_pretrained(CHECKPOINTS / "tiny-speaker-encoder")
    T = 57
    mels = np.random.default_rng(0).standard_normal((1, T, enc.config.mel_dim)).astype(np.float32)
    counts = compute_floor.count_products(lambda: enc.forward(mels))
    assert set(counts) == {"conv1d"}, counts
    assert counts["conv1d"] == speaker_encoder_macs(enc.config, T)
    assert compute_floor.products_gflop(lambda: enc.forward(mels)) == 2 * counts["conv1d"] / 1e9


def test_counting_leaves_the_primitives_as_they_were():
    enc = speaker.SpeakerEncoder.from_pretrained(CHECKPOINTS / "tiny-speaker-encoder")
    mels = np.random.default_rng(1).standard_normal((1, 40, enc.config.mel_dim)).astype(np.float32)
    before = enc.forward(mels)
    primitives = (nn.conv1d, nn.conv_transpose1d, nn.linear)

    def forward_then_fail():
        enc.forward(mels)
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        compute_floor.count_products(forward_then_fail)
    assert (nn.conv1d, nn.conv_transpose1d, nn.linear) == primitives
    np.testing.assert_array_equal(enc.forward(mels), before)


def test_count_products_counts_each_kind_of_product(speech_tokenizers):
    tok = speech_tokenizers["f32"]
    codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(6, tok.num_quantizers))
    counts = compute_floor.count_products(lambda: tok.decode(codes))
    assert set(counts) == {"conv1d", "conv_transpose1d", "linear"}, counts
    longer = compute_floor.count_products(lambda: tok.decode(np.concatenate([codes, codes])))
    for kind, n in counts.items():  # (twice the frames: more products of every kind, at most twice as many)
        assert n < longer[kind] <= 2 * n, (kind, n, longer[kind])


def test_fma_chains_computes_every_chain():
    x = np.random.default_rng(0).uniform(-1, 1, 44).astype(np.float32)
    out = np.empty(16 * compute_floor.FMA_CHAINS, np.float32)
    compute_floor._fma_chains(3, x, out)
    s = np.float64(x[2])
    for i in range(compute_floor.FMA_CHAINS):
        a = x[16 + i : 32 + i].astype(np.float64)
        for _ in range(3):  # each step one rounding to float32, as a fused multiply-add rounds
            a = (a + x[:16].astype(np.float64) * s).astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(out[16 * i : 16 * (i + 1)], a, rtol=2e-7, atol=1e-7)


def test_floor_note_names_the_floor_and_its_ratio():
    note = compute_floor.floor_note(9.0, 200e9, 0.09)
    assert note == "(products 9.0 GFLOP: 0.045 s at the peak 200 GFLOP/s, 0.50 of the official's time)"
    assert "official" not in compute_floor.floor_note(9.0, 200e9, None)


def test_predictor_floor_counts_every_step_of_a_frame_for_every_row():
    from refimpl import Qwen3TTS

    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    cp = tts.talker.code_predictor
    weights = {k[len(cp.w.prefix) :]: v for k, v in cp.w.weights.items() if k.startswith(cp.w.prefix)}
    layers = sum(v.size for k, v in weights.items() if k.startswith("model.layers.") and v.ndim == 2)
    heads = sum(weights[f"lm_head.{g}.weight"].size for g in range(cp.n_groups))
    projection = weights["small_to_mtp_projection.weight"].size
    one = compute_floor.predictor_floor(tts, 1, 2.0)  # (a peak of 2 FLOP/s: the seconds are the multiply-adds)
    # every step runs each layer's matrices for at least its last position (the first step has two positions),
    # projects its positions and runs its own head once
    steps, shared = cp.n_groups, heads + (cp.n_groups + 1) * projection
    assert steps * layers + shared <= one <= (steps + 1) * layers + shared
    assert compute_floor.predictor_floor(tts, 3, 2.0) == pytest.approx(3 * one, rel=1e-12)
