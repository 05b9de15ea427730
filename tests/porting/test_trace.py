"""refimpl trace / compare / golden (docs/port_authors.md): our traces carry the official module keys
recorded by golden/oracle/record_trace_keys.py, agree with the official hook dumps, a perturbation is
found where it is, sampled generations replay from their recorded uniforms, corpora run in parallel."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import CHECKPOINTS, GOLDEN

from refimpl import Qwen3TTS, SpeechTokenizer
from refimpl.cli import main
from refimpl.porting import trace_files as tracing
from refimpl.porting.compare import EPS, NOISE_RATIO, compare_traces
from refimpl.recorder import NULL_RECORDER, CallLog, Recorder, call_names

TRACE_GOLDEN = GOLDEN / "trace"
INPUTS = np.load(TRACE_GOLDEN / "inputs.npz")
OFFICIAL = json.loads((TRACE_GOLDEN / "official_keys.json").read_text())["keys"]
GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=3)
SAMPLED = dict(
    do_sample=True,
    top_k=20,
    top_p=0.8,
    temperature=0.7,
    repetition_penalty=1.3,
    subtalker_dosample=True,
    subtalker_top_k=10,
    subtalker_top_p=0.9,
    subtalker_temperature=1.2,
    max_new_tokens=5,
)


def tts(kind: str):
    return Qwen3TTS.from_pretrained(CHECKPOINTS / f"tiny-{kind}")


def our_trace(stage: str) -> tracing.Trace:
    """The cases of golden/oracle/record_trace_keys.py, traced by us (float32)."""
    if stage in ("codec-decode", "codec-encode"):
        tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
        if stage == "codec-decode":
            return tracing.trace_codec_decode(tok, INPUTS["codes"])
        return tracing.trace_codec_encode(tok, INPUTS["encode_audio"])
    if stage == "speaker":
        return tracing.trace_speaker(tts("base"), INPUTS["speaker_audio"])
    if stage == "say":
        return tracing.trace_generation(
            tts("customvoice"), "say", text="Hi.", speaker="vivian", language="english", **GREEDY
        )
    if stage == "design":
        return tracing.trace_generation(
            tts("voicedesign"), "design", text="Hello.", instruct="A calm voice.", language="english", **GREEDY
        )
    return tracing.trace_generation(
        tts("base"),
        "clone",
        text="Hi.",
        language="english",
        ref_audio=(INPUTS["speaker_audio"], 24000),
        x_vector_only_mode=True,
        **GREEDY,
    )


@pytest.mark.parametrize("stage", tracing.STAGES)
def test_trace_keys_are_the_official_module_calls(stage):
    # (a generation's trace ends with the codec decoder, which the official dump of Qwen3TTSModel.model
    # does not hook: its keys are checked by the codec-decode case)
    skip = ("refimpl.", "decoder") if stage in ("say", "design", "clone") else ("refimpl.",)
    ours = [(k, list(v.shape)) for k, v in our_trace(stage).items if not k.startswith(skip)]
    official = [(k, s) for k, s in OFFICIAL[stage] if not k.split(":")[0].startswith(tracing.NOT_TRACED)]
    assert len(official) > 80
    assert [k for k, _ in ours] == [k for k, _ in official], "keys or execution order differ"
    assert ours == official, "shapes differ"
    # what we leave out is only the embedding lookups named in NOT_TRACED
    left_out = {k.split(":")[0] for k, _ in OFFICIAL[stage]} - {k.split(":")[0] for k, _ in ours}
    assert all(k.startswith(tracing.NOT_TRACED) for k in left_out), left_out


@pytest.mark.parametrize("stage", ["codec-decode", "speaker", "say"])
def test_compare_passes_against_the_official_hook_dump(stage, tmp_path, capsys):
    path = tmp_path / "ours.safetensors"
    ours = our_trace(stage)
    ours.save(path)
    official = TRACE_GOLDEN / f"official_{stage.replace('-', '_')}.safetensors"
    assert main(["compare", str(official), str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["first_failure"] is None and not report["shape_mismatches"]
    # the official dump records which run it is, as ours does, and the two agree (checked by compare)
    meta = tracing.load_trace(official).metadata
    ours_input = dict(ours.metadata["input"])
    if stage == "say":  # the official dump does not record the text feed: it ran the default, as ours did
        assert ours_input.pop("non_streaming_mode") is tracing.text_feed_default(stage) is True
    assert meta["input"] == ours_input
    for field in ("weights_sha256", "config", "model_dir", "dtype"):
        assert meta[field] == ours.metadata[field], field
    assert report["metadata_mismatches"] == []
    not_traced = [k for k, _ in OFFICIAL[stage] if k.split(":")[0].startswith(tracing.NOT_TRACED)]
    assert report["missing_in_candidate"] == not_traced
    assert len(report["rows"]) == len(OFFICIAL[stage]) - len(not_traced) > 100
    assert all(r["exact"] or r["cosine"] > 0.999999 for r in report["rows"])


def test_one_percent_perturbation_is_the_first_divergence(tmp_path, capsys):
    trace = our_trace("codec-decode")
    key = "decoder.pre_transformer.layers.0.mlp"
    items = [(k, v * np.float32(1.01) if k == key else v) for k, v in trace.items]
    tracing.Trace(items, trace.metadata).save(tmp_path / "perturbed.safetensors")
    trace.save(tmp_path / "ours.npz")
    official = str(TRACE_GOLDEN / "official_codec_decode.safetensors")
    for reference in (official, str(tmp_path / "ours.npz")):
        assert main(["compare", reference, str(tmp_path / "perturbed.safetensors"), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["first_failure"] == key
        assert [r["key"] for r in report["rows"] if not r["ok"]] == [key]
    assert main(["compare", official, str(tmp_path / "perturbed.safetensors")]) == 1
    out = capsys.readouterr().out
    assert f"first divergence (execution order): {key}" in out and "FAIL  <- first divergence" in out


def test_compare_findings_and_unusable_input(tmp_path, capsys):
    trace = our_trace("speaker")
    items = [(k, v[..., :-1] if k == "speaker_encoder.fc" else v) for k, v in trace.items if k != "speaker_encoder.mfa"]
    tracing.Trace(items, {}).save(tmp_path / "port.npz")
    assert (
        main(["compare", str(TRACE_GOLDEN / "official_speaker.safetensors"), str(tmp_path / "port.npz"), "--json"]) == 1
    )
    report = json.loads(capsys.readouterr().out)
    assert report["missing_in_candidate"] == ["speaker_encoder.mfa"]
    assert report["shape_mismatches"] == [["speaker_encoder.fc", [1, 24, 1], [1, 24, 0]]]
    assert report["first_failure"] == "speaker_encoder.fc"  # a shape mismatch fails in its place
    (row,) = [r for r in report["rows"] if r["key"] == "speaker_encoder.fc"]
    assert row["shape_mismatch"] == [[1, 24, 1], [1, 24, 0]] and not row["ok"] and row["max_abs"] is None
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    assert main(["compare", str(tmp_path / "junk.safetensors"), str(tmp_path / "port.npz")]) == 2
    assert main(["compare", str(tmp_path / "missing.safetensors"), str(tmp_path / "port.npz")]) == 2
    tracing.Trace([("other", np.zeros(3))], {}).save(tmp_path / "other.npz")
    assert main(["compare", str(tmp_path / "other.npz"), str(tmp_path / "port.npz")]) == 2


def test_metadata_and_formats(tmp_path):
    trace = our_trace("codec-decode")
    for name in ("t.safetensors", "t.npz"):
        trace.save(tmp_path / name)
        back = tracing.load_trace(tmp_path / name)
        assert back.keys == trace.keys
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(back.items, trace.items, strict=True))
        m = back.metadata
        assert m["producer"] == "refimpl" and m["stage"] == "codec-decode" and m["dtype"] == "float32"
        assert m["config"]["decoder_config"]["codebook_size"] == 64 and len(m["weights_sha256"]) == 64
        assert m["input"]["codes"] == INPUTS["codes"].tolist() and m["backend"] and m["refimpl_version"]
    import safetensors.numpy  # a standard reader sees the same file

    assert set(safetensors.numpy.load_file(str(tmp_path / "t.safetensors"))) == set(trace.keys)


def test_float64_trace_through_the_command_line(tmp_path):
    codes = tmp_path / "codes.npy"
    np.save(codes, INPUTS["codes"])
    out = tmp_path / "t64.safetensors"
    assert (
        main(
            [
                "trace",
                "codec-decode",
                str(codes),
                "--model",
                str(CHECKPOINTS / "tiny-speech-tokenizer"),
                "--dtype",
                "float64",
                "-o",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    t64 = tracing.load_trace(out)
    assert t64.metadata["dtype"] == "float64" and t64["decoder"].dtype == np.float64
    ours32 = our_trace("codec-decode")
    assert compare_traces(t64, ours32, "float32").passed
    assert not compare_traces(t64, ours32, "float64").passed  # float32 is not float64


def replay_choice(scores_bv, u_b):
    """The sampling procedure as docs/port_authors.md states it, written out again here."""
    s = np.asarray(scores_bv, dtype=np.float64)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    c = np.cumsum(p, axis=-1)
    ids = np.minimum(np.sum(c <= (u_b * c[:, -1])[:, None], axis=-1), s.shape[-1] - 1)
    return np.where(p[np.arange(len(ids)), ids] == 0, np.argmax(p, axis=-1), ids)


def test_sampled_generation_replays_bit_exactly(tmp_path):
    model = tts("customvoice")
    first = tracing.trace_generation(model, "say", text="Hello there.", speaker="vivian", seed=5, **SAMPLED)
    draws = first["refimpl.random_draws"]
    n_frames = first["refimpl.codes.0"].shape[0]
    assert n_frames >= 2 and draws.size == n_frames * 15 + n_frames + 1  # 15 per frame, one per code 0
    again = tracing.trace_generation(
        model, "say", text="Hello there.", speaker="vivian", seed=123, random_draws=draws, **SAMPLED
    )
    np.testing.assert_array_equal(again["refimpl.codes.0"], first["refimpl.codes.0"])
    np.testing.assert_array_equal(again["refimpl.random_draws"], draws)
    other = tracing.trace_generation(model, "say", text="Hello there.", speaker="vivian", seed=123, **SAMPLED)
    assert not np.array_equal(other["refimpl.random_draws"][: draws.size], draws)
    # the documented procedure, applied to the recorded final scores and uniforms, picks every recorded id
    uniforms = iter(draws)
    final = None
    for key, value in first.items:
        name = key.split(":")[0]
        if name.endswith(".sampling.top_p"):
            final = value
        elif name.endswith(".sampling.chosen"):
            np.testing.assert_array_equal(replay_choice(final, np.array([next(uniforms)])), value)
    assert next(uniforms, None) is None
    # the command line: --replay with another seed gives the same codes
    trace_path = tmp_path / "first.safetensors"
    first.save(trace_path)
    args = ["trace", "say", "Hello there.", "--speaker", "vivian", "--max-new-tokens", "5", "-q"]
    assert main(args + ["--seed", "5", "-o", str(tmp_path / "a.safetensors")]) == 0
    assert (
        main(
            args + ["--seed", "77", "--replay", str(tmp_path / "a.safetensors"), "-o", str(tmp_path / "b.safetensors")]
        )
        == 0
    )
    a, b = tracing.load_trace(tmp_path / "a.safetensors"), tracing.load_trace(tmp_path / "b.safetensors")
    np.testing.assert_array_equal(a["refimpl.codes.0"], b["refimpl.codes.0"])
    with pytest.raises(ValueError, match="ran out"):
        model.generate_custom_voice("Hello there.", speaker="vivian", random_draws=draws[:3], **SAMPLED)


def test_noise_ratios_are_the_measured_ones():
    measured = json.loads((TRACE_GOLDEN / "precision_noise.json").read_text())
    assert measured["eps"] == EPS
    for precision, networks in measured["max_ratio"].items():
        assert set(networks) == set(NOISE_RATIO[precision])
        for network, ratio in networks.items():
            assert ratio <= NOISE_RATIO[precision][network] <= ratio + 0.1, (precision, network)


def test_released_noise_ratios_are_the_measured_ones():
    """The released-size float32 ratios are the largest official noise measured there (decoder: every module
    of a 4-frame decode; talker: every Talker and code-predictor call of a 3-frame generation); the rest
    keep their tiny-checkpoint ratio."""
    from refimpl.porting.compare import NOISE_RATIO_RELEASED

    measured = json.loads((TRACE_GOLDEN / "precision_noise_released.json").read_text())
    decoder = max(part["official"]["max"] for part in measured["codec_decode"]["summary"].values())
    talker = max(part["official"]["max"] for part in measured["say"]["all_calls"]["summary"].values())
    released = NOISE_RATIO_RELEASED["float32"]
    assert decoder <= released["decoder"] <= decoder + 0.1 and talker <= released["talker"] <= talker + 0.1
    assert {k: v for k, v in released.items() if k not in ("decoder", "talker")} == {
        k: v for k, v in NOISE_RATIO["float32"].items() if k not in ("decoder", "talker")
    }
    assert released["decoder"] > 5 * NOISE_RATIO["float32"]["decoder"]  # why the released table exists


def write_cases(tmp_path) -> str:
    np.save(tmp_path / "codes.npy", INPUTS["codes"])
    cases = [
        {"name": "decode", "stage": "codec-decode", "input": "codes.npy"},
        {
            "name": "hi",
            "stage": "say",
            "input": "Hi.",
            "options": {"speaker": "vivian", "language": "english", **GREEDY},
        },
    ]
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    return str(path)


def check_corpus(out) -> None:
    """The corpus holds the two cases, equal to tracing them here (same inputs as our_trace)."""
    index = json.loads((out / "index.json").read_text())
    assert [c["name"] for c in index["cases"]] == ["decode", "hi"]
    for name, stage in (("decode", "codec-decode"), ("hi", "say")):
        entry = index["cases"][["decode", "hi"].index(name)]
        assert entry["stage"] == stage and entry["tensors"] > 200 and len(entry["sha256"]) == 64
        report = compare_traces(our_trace(stage), tracing.load_trace(out / entry["file"]), "float32")
        assert report.passed and not report.missing_in_candidate and not report.missing_in_reference


def test_golden_corpus_in_local_processes(tmp_path):
    cases = write_cases(tmp_path)
    model = str(CHECKPOINTS / "tiny-customvoice")
    assert main(["golden", "--model", model, "--cases", cases, "-o", str(tmp_path / "out"), "--jobs", "2", "-q"]) == 0
    check_corpus(tmp_path / "out")


def test_golden_corpus_on_a_local_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    cases = write_cases(tmp_path)
    model = str(CHECKPOINTS / "tiny-customvoice")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        assert (
            main(
                [
                    "golden",
                    "--model",
                    model,
                    "--cases",
                    cases,
                    "-o",
                    str(tmp_path / "out"),
                    "--dask",
                    cluster.scheduler_address,
                    "-q",
                ]
            )
            == 0
        )
    check_corpus(tmp_path / "out")


def test_naming_rule_and_null_recorder():
    assert call_names(["a", "b", "a", "c", "a"]) == ["a:0", "b", "a:1", "c", "a:2"]
    log = CallLog()
    record = Recorder(log, "talker.")
    record("model.norm", 1)
    record.scope("model.").output(2)
    record.extra("prompt.embeds", 3)
    record("model.norm", 4)
    assert log.named() == [
        ("talker.model.norm:0", 1),
        ("talker.model", 2),
        ("refimpl.talker.prompt.embeds", 3),
        ("talker.model.norm:1", 4),
    ]
    assert NULL_RECORDER.scope("x.") is NULL_RECORDER and NULL_RECORDER.extra_scope("y.") is NULL_RECORDER


def test_streaming_generation_traces_and_replays_like_generate():
    model = tts("customvoice")
    log = CallLog()
    chunks = list(
        model.stream_custom_voice(
            "Hello there.", speaker="vivian", seed=5, chunk_frames=2, trace=Recorder(log), **SAMPLED
        )
    )
    streamed = tracing.Trace(log.named(), {})
    whole = tracing.trace_generation(
        model, "say", text="Hello there.", speaker="vivian", seed=5, decoder=False, **SAMPLED
    )
    # a stream yields chunks: no whole waveform (refimpl.waveform) is recorded
    assert streamed.keys == [k for k in whole.keys if not k.startswith(("refimpl.codes", "refimpl.waveform"))]
    np.testing.assert_array_equal(streamed["refimpl.random_draws"], whole["refimpl.random_draws"])
    replayed = list(
        model.stream_custom_voice(
            "Hello there.",
            speaker="vivian",
            seed=9,
            chunk_frames=2,
            random_draws=whole["refimpl.random_draws"],
            **SAMPLED,
        )
    )
    np.testing.assert_array_equal(np.concatenate(replayed), np.concatenate(chunks))


def test_precision_flag_sets_the_rule(tmp_path, capsys):
    """A dump rounded to bfloat16 (as a bf16 port's outputs are) passes the bfloat16 rule, not float32's."""
    from refimpl.backends.bf16 import bf16_bits_to_float32, float32_to_bf16_bits

    trace = our_trace("codec-decode")
    rounded = [
        (k, bf16_bits_to_float32(float32_to_bf16_bits(v)) if v.dtype == np.float32 else v) for k, v in trace.items
    ]
    tracing.Trace(rounded, {}).save(tmp_path / "bf16.safetensors")
    official = str(TRACE_GOLDEN / "official_codec_decode.safetensors")
    assert main(["compare", official, str(tmp_path / "bf16.safetensors"), "--precision", "bfloat16"]) == 0
    assert main(["compare", official, str(tmp_path / "bf16.safetensors"), "--precision", "float32"]) == 1
    assert "first divergence" in capsys.readouterr().out


@pytest.mark.soxr_optional  # 8 kHz audio resampled: its length is checked, which either resampler gives
def test_traces_carry_the_input_audio_the_decoder_and_the_icl_encode(tmp_path):
    audio = INPUTS["speaker_audio"]
    speaker = our_trace("speaker")
    np.testing.assert_array_equal(speaker["refimpl.speaker_encoder.input"], audio.astype(np.float32))
    encode = our_trace("codec-encode")
    np.testing.assert_array_equal(encode["refimpl.encoder.input"], INPUTS["encode_audio"][None].astype(np.float32))
    resampled = tracing.trace_speaker(tts("base"), audio[::3].copy(), 8000)["refimpl.speaker_encoder.input"]
    assert resampled.shape == (3 * len(audio[::3]),)  # what the encoder saw: 24 kHz
    # a generation ends with the codec decoder of its codes, keys and values as the codec-decode trace
    say = our_trace("say")
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-customvoice" / "speech_tokenizer")
    decode = tracing.trace_codec_decode(tok, say["refimpl.codes.0"])
    decoder_keys = [k for k in say.keys if k.startswith(("decoder", "refimpl.decoder"))]
    assert decoder_keys == decode.keys and decoder_keys[-1] == "decoder"
    assert all(np.array_equal(say[k], decode[k]) for k in decoder_keys)
    # an ICL clone records the reference's codec encode under the codec's names
    clone = tracing.trace_generation(
        tts("base"), "clone", text="Hi.", ref_audio=(audio, 24000), ref_text="Hello.", decoder=False, **GREEDY
    )
    base_tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-base" / "speech_tokenizer")
    encoded = tracing.trace_codec_encode(base_tok, audio)
    encoder_keys = [k for k in clone.keys if k.startswith("encoder.")]
    assert encoder_keys and encoder_keys == [k for k in encoded.keys if k.startswith("encoder.")]
    assert compare_traces(encoded, clone, diagnose=False).passed
    assert not [k for k in clone.keys if k.startswith("decoder")]


def test_npz_metadata_is_utf8_json_bytes_and_the_old_form_still_reads(tmp_path):
    trace = our_trace("codec-decode")
    trace.save(tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz") as z:
        raw = z["__metadata__"]
    assert raw.dtype == np.uint8 and raw.ndim == 1
    assert json.loads(raw.tobytes().decode("utf-8"))["stage"] == "codec-decode"
    np.savez(tmp_path / "old.npz", __metadata__=np.array(json.dumps({"stage": "x", "order": ["b", "a"]})), a=1, b=2)
    old = tracing.load_trace(tmp_path / "old.npz")
    assert old.keys == ["b", "a"] and old.metadata["stage"] == "x"


def test_attention_details_are_opt_in(tmp_path):
    model = tts("customvoice")
    plain = our_trace("say")
    assert not [k for k in plain.keys if "q_rope" in k or "attn_probs" in k]
    detailed = tracing.trace_generation(
        model, "say", text="Hi.", speaker="vivian", language="english", attention=True, **GREEDY
    )
    assert [k for k in detailed.keys if not k.startswith("refimpl.")] == [
        k for k in plain.keys if not k.startswith("refimpl.")
    ]
    probs = detailed["refimpl.talker.model.layers.0.self_attn.attn_probs:0"]  # the prefill: [B, H, S, S]
    S = probs.shape[-1]
    assert probs.shape[2] == S and np.allclose(probs.sum(-1), 1, atol=1e-6)
    assert not probs[..., np.triu_indices(S, 1)[0], np.triu_indices(S, 1)[1]].any()  # causal
    q = detailed["refimpl.talker.model.layers.0.self_attn.q_rope:0"]
    q_norm = detailed["talker.model.layers.0.self_attn.q_norm:0"]  # [B, S, H, D] before RoPE
    np.testing.assert_allclose(q[:, :, 0], q_norm[:, 0], rtol=1e-6, atol=1e-6)  # position 0: RoPE is the identity
