"""refimpl compare on runs that differ in where, not only whether (refimpl/porting/compare.py): runs of
another length cap compared over the frames both have, a shape mismatch failing in its place in the
execution order, and the first divergent frame and sample of a waveform and of the decoder's tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import SpeechTokenizer
from refimpl.cli import main
from refimpl.io.hub import embedded_model
from refimpl.porting import trace_files as tracing
from refimpl.porting.compare import FrameDivergence, compare_traces

SAY = ["trace", "say", "Hello there, how are you?", "--speaker", "vivian", "--greedy", "-q"]
SAY += ["--model", str(CHECKPOINTS / "tiny-customvoice")]
HOP = 1920  # samples of a frame at 24 kHz
FRONT_END = "decoder.quantizer.rvq_first.vq.layers.0.project_out"  # [1, T, 16], the decoder's first tensor


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Greedy say traces (with the codec decoder) capped at 5 and 4 new tokens: 4 and 3 frames."""
    out = tmp_path_factory.mktemp("runs")
    paths = {}
    for cap in (5, 4):
        paths[cap] = out / f"cap{cap}.safetensors"
        assert main(SAY + ["--max-new-tokens", str(cap), "-o", str(paths[cap])]) == 0
    return paths


def compare_json(capsys, *args) -> tuple:
    status = main(["compare", *map(str, args), "--json"])
    return status, json.loads(capsys.readouterr().out)


def row_of(report: dict, key: str) -> dict:
    (row,) = [r for r in report["rows"] if r["key"] == key]
    return row


def test_runs_of_another_length_cap_compare_the_frames_both_have(runs, tmp_path, capsys):
    long, short = tracing.load_trace(runs[5]), tracing.load_trace(runs[4])
    assert (long["refimpl.codes.0"].shape, short["refimpl.codes.0"].shape) == ((4, 16), (3, 16))
    assert (long.metadata["input"]["max_new_tokens"], short.metadata["input"]["max_new_tokens"]) == (5, 4)
    for reference, candidate, frames in ((runs[5], runs[4], (4, 3)), (runs[4], runs[5], (3, 4))):
        status, report = compare_json(capsys, reference, candidate)
        assert status == 0 and report["passed"] and report["metadata_mismatches"] == []
        assert report["shape_mismatches"] == [] and report["first_divergence"] is None
        caps = (frames[0] + 1, frames[1] + 1)
        assert f"max_new_tokens differs: reference {caps[0]}, candidate {caps[1]}" in report["notes"][0]
        assert report["notes"][1].startswith(f"the reference has {frames[0]} frames and the candidate {frames[1]}: ")
        assert "compared over the first 3" in report["notes"][1]
        codes, wave = row_of(report, "refimpl.codes.0"), row_of(report, "decoder")
        assert codes["compared_frames"] == wave["compared_frames"] == 3 and codes["shape"] == [frames[0], 16]
        assert wave["shape"] == [1, 1, frames[0] * HOP] and len(wave["frame_errors"]) == 3
        assert row_of(report, "decoder.pre_transformer")["compared_frames"] == 3
    # exit 1 by the values: the shorter run's waveform off from its frame 2 on
    items = [(k, v.copy()) for k, v in short.items]
    dict(items)["decoder"][..., 2 * HOP + 100 :] += np.float32(1e-3)
    tracing.Trace(items, short.metadata).save(tmp_path / "port.safetensors")
    assert main(["compare", str(runs[5]), str(tmp_path / "port.safetensors")]) == 1
    out = capsys.readouterr().out
    assert "note: max_new_tokens differs: reference 5, candidate 4" in out
    assert f"first divergence (execution order): decoder: first divergent frame 2 (sample {2 * HOP + 100})" in out


def test_a_length_difference_no_cap_explains_is_a_shape_mismatch(runs):
    long, short = tracing.load_trace(runs[5]), tracing.load_trace(runs[4])
    # the shorter run claims a cap of 10: it stopped before it (EOS), a difference of the runs themselves
    claims = tracing.Trace(short.items, dict(short.metadata, generation=dict(short.metadata["generation"])))
    claims.metadata["generation"]["max_new_tokens"] = 10
    report = compare_traces(long, claims)
    assert not report.passed and report.first_failure.key == FRONT_END
    assert report.first_failure.shape_mismatch == [[1, 4, 16], [1, 3, 16]]
    assert ["refimpl.codes.0", [4, 16], [3, 16]] in report.shape_mismatches
    assert any("stopped before its max_new_tokens" in n for n in report.notes)
    assert report.first_divergence.frame == 3 and report.first_divergence.reference_id is not None  # EOS
    # codec decodes of 8 and 12 frames record no cap
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    codes = np.random.default_rng(1).integers(0, 64, (12, 16))
    report = compare_traces(tracing.trace_codec_decode(tok, codes), tracing.trace_codec_decode(tok, codes[:8]))
    assert report.compared == 0 and len(report.shape_mismatches) == report.covered > 200


def test_a_shape_mismatch_upstream_is_the_first_divergence(runs, tmp_path, capsys):
    short = tracing.load_trace(runs[4])
    later = "decoder.pre_transformer.layers.0.mlp"
    items = []
    for k, v in short.items:
        if k == FRONT_END:  # a front end that emits 4 frames more
            v = np.concatenate([v, np.repeat(v[:, -1:], 4, axis=1)], axis=1)
        items.append((k, v * np.float32(1.01) if k == later else v))
    port = tracing.Trace(items, short.metadata)
    port.save(tmp_path / "port.safetensors")
    # against a run of another length the caps explain (the command line), and of the same length
    status, report = compare_json(capsys, runs[5], tmp_path / "port.safetensors")
    assert status == 1 and report["first_failure"] == FRONT_END
    assert report["shape_mismatches"] == [[FRONT_END, [1, 4, 16], [1, 7, 16]]]
    assert row_of(report, FRONT_END)["shape_mismatch"] == [[1, 4, 16], [1, 7, 16]]
    assert not row_of(report, later)["ok"]  # fails too, but later in the execution order
    keys = [r["key"] for r in report["rows"]]
    assert keys.index(FRONT_END) < keys.index(later)
    same = compare_traces(short, port)
    assert same.first_failure.key == FRONT_END and same.first_failure.shape_mismatch == [[1, 3, 16], [1, 7, 16]]
    out = same.format()
    expected = f"first divergence (execution order): {FRONT_END}: shape: reference (1, 3, 16), candidate (1, 7, 16)"
    assert expected in out and out.count("FAIL  <- first divergence") == 1


def streamed_decode(tok, codes, chunk: int = 4, left: int = 25) -> np.ndarray:
    """A serving engine's decode: each chunk of frames re-decoded with only ``left`` frames before it."""
    pieces = []
    for start in range(0, codes.shape[0], chunk):
        lo = max(0, start - left)
        pieces.append(np.asarray(tok.decode_full(codes[lo : start + chunk]))[(start - lo) * HOP :])
    return np.concatenate(pieces)


def test_a_streamed_decode_with_a_short_left_context_diverges_at_its_frame(tmp_path, capsys):
    # the decoder's receptive field is longer than 25 frames: the first chunk decoded without all of it
    # starts at frame 28 (chunks of 4); every frame before it is the exact decode (float64: to the bit, about)
    tok = SpeechTokenizer.from_pretrained(embedded_model() / "speech_tokenizer", dtype=np.float64)
    codes = np.random.default_rng(0).integers(0, 64, (40, 16))
    reference = tracing.trace_codec_decode(tok, codes)
    port = tracing.Trace([("decoder", streamed_decode(tok, codes)[None, None])], {})
    report = compare_traces(reference, port, "float64")
    row = report.first_failure
    assert (row.key, row.first_frame, row.first_sample) == ("decoder", 28, 28 * HOP)
    assert len(row.frame_errors) == 40 and max(row.frame_errors[:28]) < 1e-13 < row.tol < row.frame_errors[28]
    d = report.first_divergence
    assert isinstance(d, FrameDivergence) and (d.frame, d.sample, d.error) == (28, 28 * HOP, row.frame_errors[28])
    reference.save(tmp_path / "ref.safetensors")
    port.save(tmp_path / "port.npz")
    status, data = compare_json(capsys, tmp_path / "ref.safetensors", tmp_path / "port.npz", "--precision", "float64")
    assert status == 1 and data["first_failure"] == "decoder"
    assert {k: data["first_divergence"][k] for k in ("key", "frame", "sample")} == {
        "key": "decoder",
        "frame": 28,
        "sample": 28 * HOP,
    }
    assert row_of(data, "decoder")["first_frame"] == 28 and len(row_of(data, "decoder")["frame_errors"]) == 40
    main(["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "port.npz"), "--precision", "float64"])
    assert "first divergence (execution order): decoder: first divergent frame 28 (sample 53760)" in (
        capsys.readouterr().out
    )


def test_every_decoder_tensor_maps_its_time_axis_to_frames():
    # codes that differ from frame 5 on: the decoder is causal, so every tensor that depends on the codes
    # (channels first or last, upsampled, the untrimmed transposed convs, the attention details) first
    # diverges at frame 5; 7 frames, fewer than a transposed conv's r = 8 tail steps
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer", dtype=np.float64)
    codes = np.random.default_rng(2).integers(0, 64, (7, 16))
    other = codes.copy()
    other[5] = (other[5] + 1) % 64
    reference = tracing.trace_codec_decode(tok, codes, attention=True)
    report = compare_traces(reference, tracing.trace_codec_decode(tok, other, attention=True), "float64")
    failing = [r for r in report.rows if not r.ok]
    assert len(failing) > 200 and {r.first_frame for r in failing} == {5}
    assert all(len(r.frame_errors) == 7 and max(r.frame_errors[:5]) <= r.tol for r in failing)
    keys = {r.key for r in failing}
    for key in (
        FRONT_END,  # [B, T, C]
        "decoder.pre_transformer.layers.0.self_attn.q_norm",  # [B, T, H, D]
        "refimpl.decoder.pre_transformer.layers.0.self_attn.attn_probs",  # [B, H, T, S]
        "decoder.upsample.1.1.pwconv1",  # channels last at 4 steps a frame
        "decoder.decoder.1.block.1.conv",  # [B, C, 32 T + 8]: untrimmed
        "decoder",
    ):
        assert key in keys, key
    wave = next(r for r in failing if r.key == "decoder")
    assert 5 * HOP <= wave.first_sample < 6 * HOP
    untouched = [r for r in report.rows if r.ok]  # rotary tables and masks: no frame diverges
    assert untouched and all(r.first_frame is None for r in untouched)
