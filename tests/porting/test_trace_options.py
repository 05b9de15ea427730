"""Every keyword of the generation API reaches ``refimpl trace say|design|clone`` and the options of a
``refimpl golden`` case (docs/port_authors.md): the keywords are read from the generate methods'
signatures and the model's lists of the keywords it reads, so a keyword added to the API without a trace
option fails here.  And the text feed, the option this started with, traces what the API runs."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from refimpl import Qwen3TTS
from refimpl.cli import build_parser, main
from refimpl.porting import commands, golden_cases
from refimpl.porting import trace_files as tracing
from refimpl.recorder import CallLog, Recorder
from refimpl.tts import model as tts_model

STAGES = tuple(tracing.GENERATE_METHODS)

# keyword -> (the dest of its `refimpl trace` option, the arguments that set it, the keyword's value then)
TRACE_OPTIONS = {
    "text": ("input", None, None),  # the positional TEXT
    "speaker": ("speaker", ["--speaker", "ryan"], "ryan"),
    "instruct": ("instruct", ["--instruct", "Calm."], "Calm."),
    "language": ("language", ["--language", "english"], "english"),
    "ref_audio": ("ref_audio", ["--ref-audio", "me.wav"], "me.wav"),
    "ref_text": ("ref_text", ["--ref-text", "Hi."], "Hi."),
    "x_vector_only_mode": ("x_vector_only", ["--x-vector-only"], True),
    "non_streaming_mode": ("text_feed", None, None),  # both ways: test_text_feed_reaches_the_keyword
    "seed": ("seed", ["--seed", "7"], 7),
    "max_new_tokens": ("max_new_tokens", ["--max-new-tokens", "4"], 4),
    "do_sample": ("greedy", ["--greedy"], False),
    "top_k": ("top_k", ["--top-k", "3"], 3),
    "top_p": ("top_p", ["--top-p", "0.5"], 0.5),
    "temperature": ("temperature", ["--temperature", "0.7"], 0.7),
    "repetition_penalty": ("repetition_penalty", ["--repetition-penalty", "1.2"], 1.2),
    "subtalker_dosample": ("subtalker_greedy", ["--subtalker-greedy"], False),
    "subtalker_top_k": ("subtalker_top_k", ["--subtalker-top-k", "4"], 4),
    "subtalker_top_p": ("subtalker_top_p", ["--subtalker-top-p", "0.6"], 0.6),
    "subtalker_temperature": ("subtalker_temperature", ["--subtalker-temperature", "1.1"], 1.1),
    "eos_token_id": ("eos_token_id", ["--eos-token-id", "5"], 5),
}
# keywords of the API that are no `refimpl trace` option, and why
NOT_TRACE_OPTIONS = {
    # an object (create_voice_clone_prompt's items, or their dict): the trace makes it from --ref-audio,
    # --ref-text / --x-vector-only, and records that step too (the speaker encoder, an ICL encode)
    "voice_clone_prompt",
    "trace",  # what the command writes
    "return_codes",  # a trace always holds the codes (refimpl.codes.*)
    "progress",  # the command's own bars (-q: none)
    "random_draws",  # --replay TRACE
    "forced_codes",  # --force-codes CODES
}
# keywords of the API that are no option of a golden case, and why
NOT_CASE_OPTIONS = NOT_TRACE_OPTIONS | {
    "text",  # the case's input
}
REQUIRED = {"say": [], "design": ["--instruct", "Calm."], "clone": ["--ref-audio", "me.wav"]}


def api_keywords(stage: str) -> list:
    """The keywords the stage's generate method takes: its named parameters, then those its **kwargs
    reads (the sampling settings and the call's own options, as Qwen3TTS lists them)."""
    method = getattr(Qwen3TTS, tracing.GENERATE_METHODS[stage])
    named = [
        p.name
        for p in inspect.signature(method).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return named + list(tts_model._GEN_KEYS + tts_model._SETTINGS_KEYS + tts_model._GENERATE_KEYS)


def trace_args(stage: str, *extra):
    return build_parser().parse_args(["trace", stage, "Hello.", "-o", "t.safetensors", *REQUIRED[stage], *extra])


@pytest.mark.parametrize("stage", STAGES)
def test_every_api_keyword_is_a_trace_option(stage):
    """Each keyword of the generate method has its `refimpl trace` option (or is excluded above, with the
    reason), and the option, given, reaches the keyword that generation_options passes to the method."""
    keywords = [k for k in api_keywords(stage) if k not in NOT_TRACE_OPTIONS]
    missing = [k for k in keywords if k not in TRACE_OPTIONS]
    assert not missing, f"API keywords of {stage} without a refimpl trace option: {missing}"
    dests = vars(trace_args(stage))
    for keyword in keywords:
        dest, given, value = TRACE_OPTIONS[keyword]
        assert dest in dests, (stage, keyword, dest)
        if given is not None:
            assert commands.generation_options(trace_args(stage, *given))[keyword] == value, (stage, keyword)


def test_the_tables_name_only_api_keywords():
    """No stale entry: every keyword named above is one of some generate method."""
    keywords = {k for stage in STAGES for k in api_keywords(stage)}
    assert set(TRACE_OPTIONS) | NOT_CASE_OPTIONS <= keywords


@pytest.mark.parametrize("stage", STAGES)
def test_text_feed_reaches_the_keyword(stage):
    """--text-feed sets non_streaming_mode either way; without it the method's own default is passed (and
    so recorded in the trace's metadata)."""
    default = tracing.text_feed_default(stage)
    assert default is (stage != "clone")  # the official defaults
    assert commands.generation_options(trace_args(stage))["non_streaming_mode"] is default
    for feed, non_streaming in (("streaming", False), ("non-streaming", True)):
        opts = commands.generation_options(trace_args(stage, "--text-feed", feed))
        assert opts["non_streaming_mode"] is non_streaming


def test_subtalker_greedy_alone_and_against_greedy():
    """--greedy is greedy for both networks unless --[no-]subtalker-greedy says otherwise."""

    def sampling(*given):
        opts = commands.generation_options(trace_args("say", *given))
        return opts.get("do_sample"), opts.get("subtalker_dosample")

    assert sampling() == (None, None)  # not given: the checkpoint's generation_config.json
    assert sampling("--greedy") == (False, False)
    assert sampling("--subtalker-greedy") == (None, False)
    assert sampling("--greedy", "--no-subtalker-greedy") == (False, True)


@pytest.mark.parametrize(
    "option, value",
    [("--text-feed", "chunked"), ("--subtalker-top-k", "-1"), ("--subtalker-top-k", "1.5"), ("--eos-token-id", "-1")],
)
def test_bad_option_values_are_usage_errors(capsys, option, value):
    with pytest.raises(SystemExit) as e:
        trace_args("say", option, value)
    assert e.value.code == 2 and f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize("stage", STAGES)
def test_every_api_keyword_is_a_case_option(stage):
    missing = [
        k for k in api_keywords(stage) if k not in NOT_CASE_OPTIONS and k not in golden_cases.CASE_OPTIONS[stage]
    ]
    assert not missing, f"API keywords of {stage} that a golden case cannot give: {missing}"


GOOD = {
    "non_streaming_mode": False,
    "do_sample": False,
    "subtalker_dosample": True,  # a temperature is checked only where it is used
    "top_k": 0,
    "subtalker_top_k": 4,
    "top_p": 1,
    "subtalker_top_p": 0.5,
    "temperature": 0.7,
    "subtalker_temperature": 1.3,
    "repetition_penalty": 1.1,
    "eos_token_id": 0,
}


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("non_streaming_mode", "no", "options.non_streaming_mode must be true or false, got 'no'"),
        ("non_streaming_mode", None, "options.non_streaming_mode must be true or false"),
        ("non_streaming_mode", 0, "options.non_streaming_mode must be true or false"),
        ("subtalker_dosample", "true", "options.subtalker_dosample must be true or false"),
        ("subtalker_top_k", 1.5, "options.subtalker_top_k must be an integer >= 0"),
        ("subtalker_top_k", True, "options.subtalker_top_k must be an integer >= 0"),
        ("subtalker_top_k", -1, "options.subtalker_top_k must be an integer >= 0"),
        ("subtalker_top_p", "0.5", "options.subtalker_top_p must be a number"),
        ("subtalker_top_p", True, "options.subtalker_top_p must be a number"),
        ("subtalker_top_p", 2, "subtalker_top_p must be a number in [0, 1]"),
        ("subtalker_temperature", "hot", "options.subtalker_temperature must be a number"),
        ("subtalker_temperature", 0, "subtalker_temperature must be a positive number"),
        ("eos_token_id", -1, "options.eos_token_id must be an integer >= 0"),
        ("eos_token_id", "5", "options.eos_token_id must be an integer >= 0"),
    ],
)
def test_case_options_are_checked_by_type(tmp_path, key, value, fragment):
    where = "cases.jsonl:1"
    case = {"name": "a", "stage": "say", "input": "Hi.", "options": {"speaker": "vivian", **GOOD}}
    assert golden_cases.check_case(case, where, tmp_path)["options"] == case["options"]
    bad = dict(case, options=dict(case["options"], **{key: value}))
    with pytest.raises(ValueError, match="^" + where) as e:
        golden_cases.check_case(bad, where, tmp_path)
    assert fragment in str(e.value)


def test_trace_text_feed_streaming_is_the_apis_streaming_run(tmp_path):
    """`refimpl trace say --text-feed streaming` on the embedded checkpoint: another prompt and other codes
    than the default (non-streaming), the same prompt, logits and codes as generate_custom_voice with
    non_streaming_mode=False; a golden case with non_streaming_mode false traces the same."""
    text = "Text fed token by token."
    run = ["trace", "say", text, "--greedy", "--max-new-tokens", "4", "--no-decoder", "-q"]
    assert main([*run, "-o", str(tmp_path / "default.safetensors")]) == 0
    assert main([*run, "--text-feed", "streaming", "-o", str(tmp_path / "streaming.safetensors")]) == 0
    default = tracing.load_trace(tmp_path / "default.safetensors")
    streaming = tracing.load_trace(tmp_path / "streaming.safetensors")
    assert default.metadata["input"]["non_streaming_mode"] is True
    assert streaming.metadata["input"]["non_streaming_mode"] is False
    trailing = "refimpl.talker.prompt.trailing_ids.0"
    assert default[trailing].shape == (1,) and streaming[trailing].shape[0] > 1  # the text trails the prompt
    assert not np.array_equal(default["refimpl.codes.0"], streaming["refimpl.codes.0"])

    tts = Qwen3TTS.from_pretrained(golden_cases.EMBEDDED / golden_cases.STAGE_MODELS["say"])
    log = CallLog()
    _, _, codes = tts.generate_custom_voice(
        text,
        speaker=tts.get_supported_speakers()[0],
        non_streaming_mode=False,
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=4,
        return_codes=True,
        trace=Recorder(log),
    )
    api = dict(log.named())
    np.testing.assert_array_equal(streaming["refimpl.codes.0"], codes[0])
    for key in (trailing, "refimpl.talker.prompt.text_ids.0", "refimpl.talker.prompt.embeds", "talker.codec_head:0"):
        np.testing.assert_array_equal(streaming[key], api[key], err_msg=key)

    case = {"name": "fed", "stage": "say", "input": text}
    case["options"] = {"speaker": tts.get_supported_speakers()[0], "non_streaming_mode": False}
    case["options"].update(do_sample=False, subtalker_dosample=False, max_new_tokens=4)
    (tmp_path / "cases.jsonl").write_text(json.dumps(case) + "\n")
    assert main(["golden", "--cases", str(tmp_path / "cases.jsonl"), "-o", str(tmp_path / "corpus"), "-q"]) == 0
    traced = tracing.load_trace(tmp_path / "corpus" / "fed.safetensors")
    assert traced.metadata["input"]["non_streaming_mode"] is False
    np.testing.assert_array_equal(traced["refimpl.codes.0"], codes[0])


def test_replay_checks_the_text_feed(tmp_path, capsys):
    """--replay refuses a recorded run of the other text feed; a trace from before the metadata always
    held non_streaming_mode ran the default feed, and replays with it."""
    run = ["trace", "say", "Hi.", "--max-new-tokens", "3", "--no-decoder", "-q"]
    assert main([*run, "--text-feed", "streaming", "-o", str(tmp_path / "streaming.safetensors")]) == 0
    assert main([*run, "--replay", str(tmp_path / "streaming.safetensors"), "-o", str(tmp_path / "x.npz")]) == 1
    assert "non_streaming_mode: recorded False, now True" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()
    assert main([*run, "-o", str(tmp_path / "default.safetensors")]) == 0
    new = tracing.load_trace(tmp_path / "default.safetensors")
    new.metadata["input"].pop("non_streaming_mode")
    new.save(tmp_path / "old.safetensors")
    replay = ["--seed", "9", "--replay", str(tmp_path / "old.safetensors")]
    assert main([*run, *replay, "-o", str(tmp_path / "y.npz")]) == 0
    np.testing.assert_array_equal(tracing.load_trace(tmp_path / "y.npz")["refimpl.codes.0"], new["refimpl.codes.0"])
