"""Parity of the talker, code predictor, prompts, sampling processors and generation with the official
implementation (golden/talker.npz, recorded by golden/oracle/record_talker.py on the tiny full models),
plus the mRoPE reduction, the API's rules and its input checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import CHECKPOINTS, GOLDEN, assert_close_to_oracle

from refimpl import nn, sampling
from refimpl.recorder import Recorder
from refimpl.tts import text_tokenizer as text
from refimpl.tts.model import Qwen3TTS, VoiceClonePromptItem
from refimpl.tts.prompt import build_layout
from refimpl.tts.talker import mrope_stream_of_channel, multimodal_rope_cos_sin

GOLD = np.load(GOLDEN / "talker.npz")
CASES = json.loads(str(GOLD["cases"]))
PROMPTS = json.loads(str(GOLD["prompts"]))
PRECISIONS = ("f32", "f64")
DTYPES = {"f32": np.float32, "f64": np.float64}
GREEDY = dict(do_sample=False, subtalker_dosample=False)
_MODELS = {}

WAVEFORM_ATOL = 2e-5  # official float32 waveform vs ours, on the same (equal) codes; see test_greedy_*


def model(kind: str, precision: str = "f32") -> Qwen3TTS:
    if (kind, precision) not in _MODELS:
        _MODELS[(kind, precision)] = Qwen3TTS.from_pretrained(CHECKPOINTS / f"tiny-{kind}", dtype=DTYPES[precision])
        _MODELS[(kind, precision)].keep_logits = True  # check_trace compares every step's logits
    return _MODELS[(kind, precision)]


def prompt_items(names) -> list:
    return [
        VoiceClonePromptItem(
            ref_code=GOLD[f"prompt/{n}/ref_code"] if f"prompt/{n}/ref_code" in GOLD.files else None,
            ref_spk_embedding=GOLD[f"prompt/{n}/spk"],
            x_vector_only_mode=PROMPTS[n]["x_vector_only_mode"],
            icl_mode=not PROMPTS[n]["x_vector_only_mode"],
            ref_text=PROMPTS[n]["ref_text"],
        )
        for n in names
    ]


def run(case: dict, precision: str, **extra):
    kw = dict(case["kwargs"])
    names = kw.pop("prompts", None)
    if names is not None:
        kw["voice_clone_prompt"] = prompt_items(names)
    m = model(case["model"], precision)
    wavs, sr, codes = getattr(m, case["method"])(**kw, **GREEDY, return_codes=True, **extra)
    return m, wavs, sr, codes


def n_items(case: dict) -> int:
    return len(case["kwargs"]["text"]) if isinstance(case["kwargs"]["text"], list) else 1


def check_trace(trace, key: str, precision: str):
    """Prompt vectors, talker logits (prefill + each step) and code-predictor logits vs the official."""

    def both(name):
        return GOLD[f"{key}/f32/{name}"], GOLD[f"{key}/f64/{name}"]

    assert_close_to_oracle(trace.prompt_embeds, *both("prompt_embeds"), precision, f"{key} prompt vectors")
    np.testing.assert_array_equal(trace.key_valid, GOLD[f"{key}/{precision}/attention_mask"].astype(bool))
    assert_close_to_oracle(trace.trailing, *both("trailing"), precision, f"{key} trailing text vectors")
    logits = np.concatenate([trace.prefill_logits[None]] + [x[None] for x in trace.step_logits])
    assert_close_to_oracle(logits, *both("logits"), precision, f"{key} talker logits")
    assert_close_to_oracle(
        np.stack(trace.predictor_logits), *both("predictor_logits"), precision, f"{key} code predictor logits"
    )


# ----------------------------------------------------------------------------- parity, every mode


@pytest.mark.parametrize("kind", ("customvoice", "voicedesign", "base"))
def test_weight_spec_is_the_official_state_dict(kind):
    from refimpl.io.checkpoint import read_config
    from refimpl.porting.synthetic import tts_model_weight_spec

    official = json.loads(str(GOLD[f"state_dict/{kind}"]))
    ours = {s.name: list(s.shape) for s in tts_model_weight_spec(read_config(CHECKPOINTS / f"tiny-{kind}"))}
    assert ours == official


def test_golden_file_covers_every_mode():
    methods = {c["method"] for c in CASES.values()}
    assert methods == {"generate_custom_voice", "generate_voice_design", "generate_voice_clone"}
    kw = [c["kwargs"] for c in CASES.values()]
    assert any(k.get("non_streaming_mode") is False for k in kw) and any(k.get("non_streaming_mode", True) for k in kw)
    assert any(isinstance(k["text"], list) for k in kw)  # batches
    assert any(k.get("instruct") for k in kw)  # instructions
    refs = {n: GOLD[f"prompt/{n}/ref_code"].shape[0] for n in PROMPTS if f"prompt/{n}/ref_code" in GOLD.files}
    assert min(refs.values()) < 8 < max(refs.values())  # ICL: text longer / shorter than the codes
    assert "torch==" in str(GOLD["versions"]) and "qwen-tts==" in str(GOLD["versions"])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("key", sorted(CASES))
def test_greedy_generation_matches_official(key, precision):
    case = CASES[key]
    m, wavs, sr, codes = run(case, precision)
    assert sr == 24000 and len(codes) == len(wavs) == n_items(case)
    for i, c in enumerate(codes):
        np.testing.assert_array_equal(c, GOLD[f"{key}/{precision}/codes/{i}"], err_msg=f"{key} item {i} codes")
        assert c.dtype == np.int64 and c.shape[1] == 16
        assert wavs[i].dtype == np.float32
        if precision == "f32":  # the waveform path, incl. the ICL reference cut
            assert wavs[i].shape == GOLD[f"{key}/wav/{i}"].shape
            # the decoder's float32 tolerance (docs/golden.md: 4 x its measured official noise of ~3.8e-6,
            # plus the eps floor, ~1.6e-5), rounded up; measured here: <= 3.5e-6
            np.testing.assert_allclose(wavs[i], GOLD[f"{key}/wav/{i}"], rtol=0, atol=WAVEFORM_ATOL)
    check_trace(m.last_log, key, precision)


def test_greedy_choices_are_not_near_ties():
    """Code equality is only meaningful if no greedy choice is within the float32 noise of a tie."""
    for key in list(CASES) + ["eos"]:
        for name, width in (("logits", 64), ("predictor_logits", None)):
            top2 = np.sort(GOLD[f"{key}/f32/{name}"][..., :width], axis=-1)[..., -2:]
            noise = np.max(np.abs(GOLD[f"{key}/f32/{name}"] - GOLD[f"{key}/f64/{name}"]))
            assert np.min(top2[..., 1] - top2[..., 0]) > 20 * noise, (key, name)


def test_without_eos_the_last_code0_is_not_expanded():
    for key, case in CASES.items():
        for i in range(n_items(case)):
            assert GOLD[f"{key}/f32/codes/{i}"].shape[0] == case["kwargs"]["max_new_tokens"] - 1, key


@pytest.mark.parametrize("precision", PRECISIONS)
def test_eos_stops_each_row_like_official(precision):
    """The official EOS rule on a talker whose EOS row of codec_head was biased (the row is in the golden
    file): rows stop at different steps, each is cut before its EOS, and no EOS within 2 steps."""
    case = json.loads(str(GOLD["eos/case"]))
    m = model(case["model"], precision)
    saved = m.talker.weights["codec_head.weight"]
    eos = m.config.talker_config.codec_eos_token_id
    biased = saved.copy()
    biased[eos] = nn.to_device(GOLD["eos/codec_head_eos_row"])  # the weights may live on a device backend
    m.talker.weights["codec_head.weight"] = biased
    try:
        wavs, sr, codes = getattr(m, case["method"])(**case["kwargs"], **GREEDY, return_codes=True)
    finally:
        m.talker.weights["codec_head.weight"] = saved
    lengths = [c.shape[0] for c in codes]
    assert len(set(lengths)) == 2 and max(lengths) < case["kwargs"]["max_new_tokens"] - 1
    for i, c in enumerate(codes):
        np.testing.assert_array_equal(c, GOLD[f"eos/{precision}/codes/{i}"])
        assert not np.any(c[:, 0] == eos)
        assert wavs[i].shape == (1920 * lengths[i],)
    first_eos = [int(np.argmax(np.stack(m.last_log.code0)[:, b] == eos)) for b in range(2)]
    assert first_eos == lengths  # the k-th code 0 (0-based) is EOS after k frames
    check_trace(m.last_log, "eos", precision)


BATCH_TEXTS = ["Good morning everyone, thank you for listening.", "Yes.", "The weather is nice today.", "Call me."]


@pytest.fixture(scope="module")
def bf16_customvoice(tmp_path_factory):
    """The tiny CustomVoice with its weights stored in bfloat16, as released: its matrices load as bf16 words,
    which the numba backend's fused step reads (a float32 checkpoint's stay on the layer by layer path)."""
    import shutil

    from refimpl.io.checkpoint import read_safetensors_file, write_safetensors_file

    directory = tmp_path_factory.mktemp("bf16") / "tiny-customvoice"
    shutil.copytree(CHECKPOINTS / "tiny-customvoice", directory)
    tensors = {k: np.array(v) for k, v in read_safetensors_file(directory / "model.safetensors").items()}
    write_safetensors_file(directory / "model.safetensors", tensors, "bfloat16", metadata={"format": "pt"})
    return Qwen3TTS.from_pretrained(directory)


@pytest.mark.parametrize("weights", ("float32", "bf16"))
def test_a_batch_of_four_texts_gives_the_codes_of_four_single_runs(weights, backend, bf16_customvoice, monkeypatch):
    """Greedy, four different texts (different prompt lengths: the batch is left-padded) in one call give
    each text the codes of its own run alone.  On numba with bf16 weights the batch's steps and prompt run
    in the fused step, four rows at a time (each weight read once for the four)."""
    m = model("customvoice") if weights == "float32" else bf16_customvoice
    fused_rows = []
    if backend == "numba" and weights == "bf16":
        from refimpl.backends import numba_cpu

        steps = numba_cpu.transformer._decoder_steps_bf16

        def counted(x_btc, *args):
            fused_rows.append(x_btc.shape[0])
            return steps(x_btc, *args)

        monkeypatch.setattr(numba_cpu.transformer, "_decoder_steps_bf16", counted)
    kw = dict(speaker="serena", language="english", max_new_tokens=8, return_codes=True, **GREEDY)
    batch = m.generate_custom_voice(BATCH_TEXTS, **kw)[2]
    fused = backend == "numba" and weights == "bf16"
    assert set(fused_rows) == ({len(BATCH_TEXTS)} if fused else set())  # every fused call took the four rows
    fused_rows.clear()
    for text_, codes in zip(BATCH_TEXTS, batch, strict=True):
        np.testing.assert_array_equal(codes, m.generate_custom_voice(text_, **kw)[2][0], err_msg=text_)
    assert set(fused_rows) == ({1} if fused else set())


@pytest.mark.parametrize("weights", ("float32", "bf16"))
def test_an_unrecorded_code_predictor_step_computes_its_last_position_alone(weights, backend, bf16_customvoice):
    """Unrecorded, a code-predictor step's last layer runs past its keys and values for the last position
    alone (the first step has two positions: the Talker's hidden state and the code-0 embedding): a frame's
    codes and every head's logits keep the bits of the same steps over every position.  Recorded, the steps
    run over every position (the trace holds each head over both positions of the first step)."""
    m = model("customvoice") if weights == "float32" else bf16_customvoice
    cp = m.talker.code_predictor
    hidden_bc, code0_emb_bc = np.random.default_rng(3).standard_normal((2, 2, cp.talker_hidden)).astype(np.float32)

    def greedy(g, logits_bv):
        return np.argmax(nn.to_host(logits_bv), axis=-1).astype(np.int64)

    step, positions, every_position = cp.step, [], [False]

    def counted(x_btc, caches, record, last_only=False):
        h_btc = step(x_btc, caches, record, last_only and not every_position[0])
        positions.append((x_btc.shape[1], h_btc.shape[1]))
        return h_btc

    def frame(**kw):
        positions.clear()
        codes, logits = cp.predict_frame(nn.to_device(hidden_bc), nn.to_device(code0_emb_bc), greedy, **kw)
        return nn.to_host(codes), nn.to_host(logits), list(positions)

    cp.step = counted
    try:
        codes, logits, seen = frame()
        every_position[0] = True
        codes_all, logits_all, seen_all = frame()
        every_position[0] = False
        trace: dict = {}
        *_, seen_recorded = frame(record=Recorder(trace))
    finally:
        del cp.step
    assert seen == [(2, 1)] + [(1, 1)] * (cp.n_groups - 1)
    assert seen_all == seen_recorded == [(2, 2)] + [(1, 1)] * (cp.n_groups - 1)
    np.testing.assert_array_equal(codes, codes_all)
    np.testing.assert_array_equal(logits.view(np.uint32), logits_all.view(np.uint32))
    assert trace["lm_head.0"].shape[:2] == (2, 2)


# ----------------------------------------------------------------------------- sampling processors

_OFFICIAL_STEP = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "MinLengthLogitsProcessor": "min_new_tokens",  # min_length = min_new_tokens here: the same EOS guard twice
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "SuppressTokensLogitsProcessor": "suppress",
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
}


@pytest.mark.parametrize("who", ("talker", "predictor"))
def test_processed_scores_match_official_processors(who):
    settings_kw = json.loads(str(GOLD["sampling/settings"]))
    settings = sampling.SamplingSettings(
        **{k: v for k, v in settings_kw.items() if k in sampling.SamplingSettings.__dataclass_fields__}
    )
    cfg = model("customvoice").config.talker_config

    def ours(scores, previous):  # every step our scoring applies, by name, in order
        recorded = {}
        if who == "talker":
            sampling.talker_scores(scores, previous, settings, cfg.codec_eos_token_id, Recorder(recorded))
        else:
            sampling.subtalker_scores(scores, settings, Recorder(recorded))
        return recorded

    k = 0
    while f"sampling/{who}/{k}/names" in GOLD.files:
        names = json.loads(str(GOLD[f"sampling/{who}/{k}/names"]))
        previous = GOLD[f"sampling/{who}/{k}/input_ids"]
        stages = ours(GOLD[f"sampling/{who}/{k}/stage0"], previous)
        official_order = list(dict.fromkeys(_OFFICIAL_STEP[n] for n in names[1:]))
        assert official_order == list(stages)
        for j, name in enumerate(names[1:], start=1):
            scores = stages[_OFFICIAL_STEP[name]]
            expected = GOLD[f"sampling/{who}/{k}/stage{j}"]
            np.testing.assert_array_equal(np.isneginf(scores), np.isneginf(expected), err_msg=f"{who} {k} {name}")
            finite = np.isfinite(expected)
            np.testing.assert_allclose(scores[finite], expected[finite], rtol=1e-6, atol=0, err_msg=f"{name}")
        k += 1
    assert k >= 3


def test_top_k_top_p_and_penalty_rules():
    s = np.array([[3.0, 1.0, 1.0, -2.0, 0.5]], dtype=np.float32)
    assert np.isneginf(sampling.apply_top_k(s, 2)).tolist() == [[False, False, False, True, True]]  # ties kept
    assert np.isfinite(sampling.apply_top_p(s, 0.0)).sum() == 1  # the best id always survives
    assert np.isfinite(sampling.apply_top_p(s, 1.0)).all()
    p = sampling.apply_repetition_penalty(s, [[0, 3, 3]], 2.0)
    np.testing.assert_array_equal(p, [[1.5, 1.0, 1.0, -4.0, 0.5]])
    sup = sampling.suppressed_ids(1088, eos_id=166)
    assert sup[0] == 64 and sup[-1] == 1087 and 166 not in sup and len(sup) == 1023


def test_sampling_is_seeded_and_respects_the_code_ranges():
    m = model("customvoice")
    kw = dict(text=["Hello, world!", "Yes."], speaker="serena", language="english", max_new_tokens=5, return_codes=True)
    _, _, a = m.generate_custom_voice(**kw, seed=7)
    _, _, b = m.generate_custom_voice(**kw, seed=7)
    _, _, c = m.generate_custom_voice(**kw, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    for x in a + c:  # suppression leaves only the 64 codes (and EOS) for code 0; the predictor has 64 ids
        assert x.min() >= 0 and x.max() < 64


def test_sampling_draws_follow_the_distribution():
    rng = np.random.default_rng(0)
    with np.errstate(divide="ignore"):
        scores = np.log(np.array([[0.5, 0.3, 0.2, 0.0]]))
    draws = np.array([sampling.choose(scores, True, rng)[0] for _ in range(4000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2, 0.0], atol=0.03)
    assert sampling.choose(scores, False, None)[0] == 0


# ----------------------------------------------------------------------------- mRoPE


@pytest.mark.parametrize("section,head_dim", [((24, 20, 20), 128), ((3, 3, 2), 16), ((2, 2, 2), 12)])
@pytest.mark.parametrize("interleaved", (True, False))
def test_mrope_with_equal_streams_is_ordinary_rope(section, head_dim, interleaved):
    positions = np.array([[1, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])  # left padding in row 0
    for dtype in (np.float32, np.float64):
        cos, sin = multimodal_rope_cos_sin(np.stack([positions] * 3), head_dim, 1e6, section, interleaved, dtype)
        cos1, sin1 = nn.rope_cos_sin(positions, head_dim, 1e6, dtype)
        np.testing.assert_array_equal(cos, cos1)
        np.testing.assert_array_equal(sin, sin1)
        c_row, s_row = nn.rope_cos_sin(positions[1], head_dim, 1e6, dtype)
        np.testing.assert_array_equal(cos1[1], c_row)
        np.testing.assert_array_equal(sin1[1], s_row)
    # with different streams the channels really come from different streams
    streams = np.stack([positions, positions + 7, positions + 20])
    cos, _ = multimodal_rope_cos_sin(streams, head_dim, 1e6, section, interleaved, np.float64)
    which = mrope_stream_of_channel(section, interleaved, head_dim)
    for s in range(3):
        ref, _ = nn.rope_cos_sin(streams[s], head_dim, 1e6, np.float64)
        np.testing.assert_array_equal(cos[..., which == s], ref[..., which == s])


def test_released_mrope_channel_assignment():
    which = mrope_stream_of_channel((24, 20, 20), True, 128)
    np.testing.assert_array_equal(which[:64], which[64:])
    assert np.bincount(which[:64]).tolist() == [24, 20, 20]
    assert which[:6].tolist() == [0, 1, 2, 0, 1, 2] and which[60:64].tolist() == [0, 0, 0, 0]


# ----------------------------------------------------------------------------- prompt construction


def test_prompt_layouts():
    m = model("customvoice")
    cfg, t = m.config, m.config.talker_config
    ids = m._tokenize(text.assistant_prompt("Hello, world!"))
    body = ids[3:-5]
    stream = build_layout(cfg, ids, "english", "vivian", non_streaming_mode=False)
    assert [s[0] for s in stream.segments] == ["role", "codec_prefix", "first_text"]
    assert stream.codec_codes[3:9, 0].tolist() == [
        t.codec_think_id,
        t.codec_think_bos_id,
        t.codec_language_id["english"],
        t.codec_think_eos_id,
        t.spk_id["vivian"],
        t.codec_pad_id,
    ]
    assert stream.text_ids[3:9].tolist() == [cfg.tts_pad_token_id] * 5 + [cfg.tts_bos_token_id]
    assert stream.trailing_ids.tolist() == body[1:].tolist() + [cfg.tts_eos_token_id]
    non = build_layout(cfg, ids, "auto", None, non_streaming_mode=True)
    assert non.codec_codes[3:6, 0].tolist() == [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    assert non.trailing_ids.tolist() == [cfg.tts_pad_token_id] and len(non) == 3 + 4 + len(body) + 2
    # dialect speakers switch Chinese / auto to their dialect, not other languages
    assert build_layout(cfg, ids, "chinese", "eric").codec_codes[5, 0] == t.codec_language_id["sichuan_dialect"]
    assert build_layout(cfg, ids, "auto", "Dylan").codec_codes[5, 0] == t.codec_language_id["beijing_dialect"]
    assert build_layout(cfg, ids, "english", "eric").codec_codes[5, 0] == t.codec_language_id["english"]


def test_icl_layouts_for_both_length_cases():
    m = model("base")
    cfg = m.config
    ids = m._tokenize(text.assistant_prompt("Yes."))
    ref = m._tokenize(text.reference_prompt("Hi."))
    long_ref = np.zeros((12, 16), dtype=np.int64)
    short = build_layout(cfg, ids, "auto", has_speaker_vector=True, ref_ids=ref, ref_codes=long_ref)
    n_text = len(ref) - 5 + len(ids) - 8 + 1
    assert short.trailing_ids.tolist() == [cfg.tts_pad_token_id]
    assert short.text_ids[-13:].tolist()[n_text:] == [cfg.tts_pad_token_id] * (13 - n_text)
    long = build_layout(cfg, ids, "auto", has_speaker_vector=True, ref_ids=ref, ref_codes=long_ref[:2])
    assert len(long.trailing_ids) == n_text - 3 and long.trailing_ids[-1] == cfg.tts_eos_token_id
    assert long.speaker_position == 3 + 3


# ----------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("key", ("cv_stream", "vd_nonstream", "vc_icl_long_text"))
def test_streaming_yields_the_same_audio_chunk_by_chunk(key):
    case = CASES[key]
    kw = dict(case["kwargs"])
    names = kw.pop("prompts", None)
    if names is not None:
        kw["voice_clone_prompt"] = prompt_items(names)
    m = model(case["model"])
    chunks = list(getattr(m, case["method"].replace("generate_", "stream_"))(**kw, **GREEDY, chunk_frames=2))
    codes = GOLD[f"{key}/f32/codes/0"]
    assert [len(c) for c in chunks] == [2 * 1920] * (len(codes) // 2) + [1920] * (len(codes) % 2)
    assert all(c.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.stack(m.last_log.frames)[:, 0], codes)
    np.testing.assert_allclose(np.concatenate(chunks), GOLD[f"{key}/wav/0"], rtol=0, atol=WAVEFORM_ATOL)
    with pytest.raises(ValueError, match="one text"):
        next(getattr(m, case["method"].replace("generate_", "stream_"))(**{**kw, "text": ["a", "b"]}))


def test_released_talker_presets_match_the_released_file_sizes():
    """The RELEASED_TALKER_* presets give exactly the bf16 sizes of the released model.safetensors files
    (1.81 GB 0.6B-CustomVoice, 1.83 GB 0.6B-Base with its speaker encoder, 3.83 GB 1.7B-VoiceDesign)."""
    from refimpl.porting import presets
    from refimpl.tts.speaker_encoder import SpeakerEncoderConfig, speaker_encoder_weight_spec
    from refimpl.tts.talker import TalkerConfig, talker_weight_spec

    def n_params(spec):
        return sum(int(np.prod(s.shape)) for s in spec)

    talker_06 = n_params(talker_weight_spec(TalkerConfig.from_dict(presets.RELEASED_TALKER_0_6B_CUSTOMVOICE)))
    speaker = n_params(speaker_encoder_weight_spec(SpeakerEncoderConfig.from_dict(presets.RELEASED_SPEAKER_ENCODER)))
    talker_17 = n_params(talker_weight_spec(TalkerConfig.from_dict(presets.RELEASED_TALKER_1_7B)))
    assert round(2 * talker_06 / 1e9, 2) == 1.81
    assert round(2 * (talker_06 + speaker) / 1e9, 2) == 1.83
    assert round(2 * talker_17 / 1e9, 2) == 3.83


# ----------------------------------------------------------------------------- API rules and bad inputs


def test_supported_speakers_and_languages():
    cv = model("customvoice")
    assert cv.get_supported_speakers() == ["dylan", "eric", "serena", "vivian"]
    assert cv.get_supported_languages() == ["auto", "chinese", "english", "german", "japanese"]
    assert model("base").get_supported_speakers() == []


def test_instruct_is_dropped_on_0b6_custom_voice_models():
    m = model("customvoice")
    kw = dict(text="Yes.", speaker="vivian", max_new_tokens=3, return_codes=True, **GREEDY)
    plain = m.generate_custom_voice(**kw)[2][0]
    plain_length = m.last_log.prompt_embeds.shape[1]
    m.generate_custom_voice(**kw, instruct="A calm voice.")
    assert m.last_log.prompt_embeds.shape[1] > plain_length  # 1b7: the instruction is in the prompt
    saved = m.tts_model_size
    m.tts_model_size = "0b6"
    try:
        dropped = m.generate_custom_voice(**kw, instruct="A calm voice.")[2][0]
    finally:
        m.tts_model_size = saved
    assert m.last_log.prompt_embeds.shape[1] == plain_length
    np.testing.assert_array_equal(dropped, plain)


def test_bad_inputs_raise_value_errors():
    cv, vd, base = model("customvoice"), model("voicedesign"), model("base")
    ok = dict(max_new_tokens=2)
    cases = [
        (lambda: cv.generate_custom_voice("Hi.", speaker="nobody", **ok), "nobody"),
        (lambda: cv.generate_custom_voice("Hi.", speaker="vivian", language="klingon", **ok), "klingon"),
        (lambda: cv.generate_custom_voice("", speaker="vivian", **ok), "empty"),
        (lambda: cv.generate_custom_voice(["a", "b", "c"], speaker=["vivian", "eric"], **ok), "mismatch"),
        (lambda: cv.generate_voice_design("Hi.", instruct="calm", **ok), "voice_design"),
        (lambda: vd.generate_custom_voice("Hi.", speaker="vivian", **ok), "custom_voice"),
        (lambda: cv.generate_voice_clone("Hi.", ref_audio=(np.zeros(24000, np.float32), 24000)), "base"),
        (lambda: base.generate_voice_clone("Hi.", **ok), "ref_audio"),
        (lambda: base.create_voice_clone_prompt((GOLD["prompt/xvec_a/audio"], 24000)), "ref_text"),
        (
            lambda: base.generate_voice_clone(
                "Hi.",
                voice_clone_prompt=[
                    VoiceClonePromptItem(
                        GOLD["prompt/icl_long_ref/ref_code"], GOLD["prompt/icl_long_ref/spk"], False, True, None
                    )
                ],
                **ok,
            ),
            "ref_text",
        ),
        (lambda: base.create_voice_clone_prompt(np.zeros(24000, np.float32), x_vector_only_mode=True), "tuple"),
        (lambda: vd.generate_voice_design(["a", "b"], instruct=["x", "y", "z"], **ok), "mismatch"),
        (lambda: cv.generate_custom_voice("Hi.", speaker="vivian", top_p=2.0), "top_p"),
        (lambda: cv.generate_custom_voice("Hi.", speaker="vivian", max_new_tokens=0), "max_new_tokens"),
        (lambda: cv.generate_custom_voice("Hi.", speaker="vivian", temperature=0.0), "temperature"),
        (lambda: cv.generate_custom_voice("Hi.", speaker="vivian", beam_width=3), "beam_width"),
        (
            lambda: base.generate_voice_clone(
                "Hi.", voice_clone_prompt=[VoiceClonePromptItem(None, np.zeros(5, np.float32), True, False)], **ok
            ),
            "speaker embedding",
        ),
        (lambda: Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=np.float16), "dtype"),
        (lambda: Qwen3TTS.from_pretrained(CHECKPOINTS / "no-such-model"), "does not exist"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert words.lower() in str(info.value).lower(), (words, str(info.value))


def test_voice_clone_prompt_from_audio_matches_official_prompt():
    """create_voice_clone_prompt on the recorded audio gives the official reference codes and x-vector
    (through refimpl.tts.speaker_encoder and the codec encoder), so the whole voice-clone path is covered."""
    m = model("base")
    for name, p in PROMPTS.items():
        item = m.create_voice_clone_prompt(
            (GOLD[f"prompt/{name}/audio"], 24000), ref_text=p["ref_text"], x_vector_only_mode=p["x_vector_only_mode"]
        )[0]
        np.testing.assert_allclose(item.ref_spk_embedding, GOLD[f"prompt/{name}/spk"], rtol=0, atol=1e-5)
        if p["x_vector_only_mode"]:
            assert item.ref_code is None and not item.icl_mode
        else:
            np.testing.assert_array_equal(item.ref_code, GOLD[f"prompt/{name}/ref_code"])


def test_last_trace_keeps_logits_only_when_asked():
    """By default ``last_log`` holds the codes and prompt but no logits (they are most of its size);
    ``keep_logits = True`` keeps one [B, V] talker row per step and one [B, 15, V'] block per frame."""
    m = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    kwargs = dict(speaker="vivian", language="english", max_new_tokens=5, do_sample=False, subtalker_dosample=False)
    m.generate_custom_voice("Logits or not.", **kwargs)
    assert m.last_log.prefill_logits is None and m.last_log.step_logits == [] == m.last_log.predictor_logits
    frames = len(m.last_log.frames)
    assert frames > 0 and len(m.last_log.code0) >= frames
    m.keep_logits = True
    m.generate_custom_voice("Logits or not.", **kwargs)
    assert len(m.last_log.predictor_logits) == frames == len(m.last_log.frames)
    assert m.last_log.prefill_logits.shape[0] == 1 and len(m.last_log.step_logits) == len(m.last_log.code0) - 1


@pytest.mark.parametrize("sampled", [False, True])
def test_the_last_code0_runs_its_talker_step_only_when_looked_at(sampled):
    """The code 0 of the last step (``max_new_tokens``) is never expanded into a frame: its Talker step runs
    only where its logits are kept or recorded.  The frames and the audio are the same either way (a sampled
    run draws nothing after the last frame), with one Talker pass fewer; kept or recorded, the run has a
    code 0 and logits for every step, as the official's."""
    m = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    passes = []
    forward = m.talker.forward
    m.talker.forward = lambda *a, **k: passes.append(a[0].shape[1]) or forward(*a, **k)
    sampling_kw = dict(do_sample=True, subtalker_dosample=True, seed=7) if sampled else GREEDY
    kwargs = dict(speaker="vivian", language="english", return_codes=True, **sampling_kw)
    # without EOS: max_new_tokens = 2 is one frame, 6 is five (the tiny model ends later than that)
    for n in (2, 6):
        results = {}
        for how in ("summary", "kept", "recorded"):
            passes.clear()
            m.keep_logits = how == "kept"
            extra = {"trace": {}} if how == "recorded" else {}
            wavs, _, codes = m.generate_custom_voice("One step fewer.", max_new_tokens=n, **kwargs, **extra)
            assert codes[0].shape == (n - 1, 16), "the case must end by max_new_tokens, not by EOS"
            results[how] = (wavs[0], codes[0], len(passes), len(m.last_log.code0))
        wav, codes, talker_passes, code0s = results["summary"]
        assert (talker_passes, code0s) == (n - 1, n - 1)  # prefill + n - 2 steps; no step for the last code 0
        for how in ("kept", "recorded"):
            assert results[how][2:] == (n, n)  # prefill + n - 1 steps, a code 0 for every step
            np.testing.assert_array_equal(results[how][1], codes)
            np.testing.assert_array_equal(results[how][0], wav)
    m.keep_logits = True
    m.generate_custom_voice("One step fewer.", max_new_tokens=2, **kwargs)
    assert len(m.last_log.step_logits) == 1  # the official's second talker logits, for a comparison
