"""refimpl compare as a debugger (refimpl/porting/diagnose.py): simulated ports that choose other codes,
one for each verdict, and the coverage / metadata findings at the top of the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import Qwen3TTS, nn, sampling
from refimpl.cli import main
from refimpl.porting import trace_files as tracing
from refimpl.porting.compare import compare_traces, tolerance

TEXT = "Hello there, how are you?"
GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=10)


@pytest.fixture(scope="module")
def model():
    return Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")


def say(model, **options):
    """A say trace without the codec decoder (not what these tests are about)."""
    return tracing.trace_generation(
        model, "say", text=TEXT, speaker="vivian", **{**GREEDY, "decoder": False, **options}
    )


@pytest.fixture(scope="module")
def reference(model):
    return say(model)


def first(report):
    d = report.first_divergence
    assert d is not None, "the codes should differ"
    return d


def test_a_port_without_the_repetition_penalty_is_a_rule_difference(model):
    reference = say(model, repetition_penalty=1.3)
    port = say(model, repetition_penalty=1.0)  # applies no penalty
    report = compare_traces(reference, port, "float32")
    d = first(report)
    assert (d.key, d.codebook, d.verdict, d.processor) == ("refimpl.codes.0", 0, "rule", "repetition_penalty")
    assert d.frame >= 1 and d.upstream is None  # no history at frame 0: nothing to penalise
    ref_codes, port_codes = reference["refimpl.codes.0"], port["refimpl.codes.0"]
    np.testing.assert_array_equal(ref_codes[: d.frame], port_codes[: d.frame])
    assert (d.reference_id, d.candidate_id) == (ref_codes[d.frame, 0], port_codes[d.frame, 0])
    # the port's pick is the argmax of the reference's logits after every processor but the penalty
    no_penalty = sampling.apply_suppression(
        reference[f"refimpl.talker.sampling.logits:{d.frame}"], sampling.suppressed_ids(1088, 166)
    )
    assert d.candidate_id == np.argmax(no_penalty[0]) != d.reference_id
    final = reference[f"refimpl.talker.sampling.suppress:{d.frame}"][0]
    assert d.margin == pytest.approx(final[d.reference_id] - final[d.candidate_id])
    assert d.margin > 2 * d.tolerance


def test_a_port_without_the_min_new_tokens_block_ends_at_once(model, monkeypatch):
    # a greedy pick at frame 0 made the EOS id, so that only the min_new_tokens block keeps it from ending
    eos = int(say(model)["refimpl.codes.0"][0, 0])
    reference = say(model, eos_token_id=eos)
    monkeypatch.setattr(sampling, "apply_min_new_tokens", lambda scores, *args: np.array(scores, copy=True))
    port = say(model, eos_token_id=eos)
    monkeypatch.undo()
    assert port["refimpl.codes.0"].shape == (0, 16) and reference["refimpl.codes.0"].shape[0] > 0
    d = first(compare_traces(reference, port))
    assert (d.frame, d.codebook, d.candidate_id) == (0, 0, eos)
    assert (d.verdict, d.processor) == ("rule", "min_new_tokens") and d.margin == float("inf")


def nudge_at(step: int, swap_with: int):
    """A port whose code-0 logits at one step are off by 1.5 x the margin of the top two, toward the second."""
    original = sampling.talker_scores
    calls = []

    def talker_scores(logits, previous, settings, eos_id, record=None):
        if len(calls) == step:
            logits = np.array(logits, copy=True)
            final = original(logits, previous, settings, eos_id)[0]
            best = int(np.argmax(final))
            logits[0, swap_with] += 1.5 * (final[best] - final[swap_with])
        calls.append(step)
        return original(logits, previous, settings, eos_id, record or sampling.NULL_RECORDER)

    return talker_scores


def test_logits_perturbed_within_the_tolerance_at_a_near_tie(model, reference, monkeypatch, tmp_path, capsys):
    # the step whose top two scores are closest
    margins = []
    for n in range(reference["refimpl.codes.0"].shape[0]):
        s = np.sort(reference[f"refimpl.talker.sampling.suppress:{n}"][0])[::-1]
        margins.append(s[0] - s[1])
    step = int(np.argmin(margins))
    final = reference[f"refimpl.talker.sampling.suppress:{step}"][0]
    second = int(np.argsort(final)[-2])
    logits = reference[f"refimpl.talker.sampling.logits:{step}"]
    bf16_tol = tolerance(logits, "bfloat16", network="talker")
    assert 1.5 * margins[step] < bf16_tol  # the perturbation is within what a bfloat16 port may do
    monkeypatch.setattr(sampling, "talker_scores", nudge_at(step, second))
    port = say(model)
    d = first(compare_traces(reference, port, "bfloat16"))
    assert (d.frame, d.codebook, d.reference_id, d.candidate_id) == (step, 0, int(np.argmax(final)), second)
    assert d.verdict == "near_tie" and d.processor is None
    assert d.margin == pytest.approx(margins[step]) and d.margin <= 2 * d.tolerance
    # the same pair judged by the float32 rule is no tie: the port's logits must be wrong
    d32 = first(compare_traces(reference, port, "float32"))
    assert d32.verdict == "numeric" and d32.margin > 2 * d32.tolerance
    # the command line: a bfloat16 port's dump, --json carries the verdict
    reference.save(tmp_path / "ref.safetensors")
    tracing.Trace(port.items, dict(port.metadata, dtype="bfloat16")).save(tmp_path / "port.safetensors")
    args = ["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "port.safetensors")]
    assert main(args + ["--precision", "bfloat16", "--json"]) == 1
    div = json.loads(capsys.readouterr().out)["first_divergence"]
    assert {k: div[k] for k in ("key", "frame", "codebook", "verdict", "processor")} == {
        "key": "refimpl.codes.0",
        "frame": step,
        "codebook": 0,
        "verdict": "near_tie",
        "processor": None,
    }
    assert set(div) >= {"reference_id", "candidate_id", "margin"}
    assert main(args + ["--precision", "bfloat16"]) == 1
    out = capsys.readouterr().out
    assert f"first divergent code: refimpl.codes.0 frame {step} codebook 0" in out and "near_tie" in out
    assert "cosine 1.000000" not in out and " integer " in out  # integer rows show no cosine


def interleaved_rope(x, cos, sin):
    """The classic port bug: rotating adjacent pairs (x0, x1), (x2, x3)... instead of the two halves."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = odd * c + even * s
    return out


def test_a_rope_bug_is_numeric_and_names_the_first_divergent_tensor(model, reference, monkeypatch):
    monkeypatch.setattr(nn, "apply_rope", interleaved_rope)
    port = say(model)
    report = compare_traces(reference, port)
    d = first(report)
    assert d.verdict == "numeric" and d.processor is None
    assert d.upstream == report.first_failure.key == "talker.model.layers.0.self_attn.o_proj:0"
    # with the attention details traced, the first divergent tensor is the rotated query itself
    monkeypatch.undo()
    detailed_reference = say(model, attention=True)
    monkeypatch.setattr(nn, "apply_rope", interleaved_rope)
    detailed = compare_traces(detailed_reference, say(model, attention=True))
    assert first(detailed).upstream == "refimpl.talker.model.layers.0.self_attn.q_rope:0"


def test_coverage_header_and_a_sparse_dump(reference, tmp_path, capsys):
    keep = ["talker.model.layers.0:0", "talker.codec_head:0", "refimpl.codes.0"]
    sparse = tracing.Trace([(k, reference[k]) for k in keep], {})
    reference.save(tmp_path / "ref.safetensors")
    sparse.save(tmp_path / "port.safetensors")
    args = ["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "port.safetensors")]
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"the candidate covers 3 of {len(reference.keys)} reference tensors, 3 compared"
    assert len(lines) < 15 and f"missing in candidate: {len(reference.keys) - 3} tensors (" in out
    assert main(args + ["--list-missing"]) == 0
    assert "talker.model.layers.1.mlp:0" in capsys.readouterr().out


def test_failures_and_context(reference, tmp_path, capsys):
    key = "talker.model.layers.1.mlp:0"
    items = [(k, v * np.float32(1.01) if k == key else v) for k, v in reference.items]
    reference.save(tmp_path / "ref.safetensors")
    tracing.Trace(items, reference.metadata).save(tmp_path / "port.safetensors")
    args = ["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "port.safetensors")]
    assert main(args + ["--failures"]) == 1
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("talker.")]
    assert [r.split()[0] for r in rows] == [key]
    assert main(args + ["--context", "2"]) == 1
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("talker.")]
    i = reference.keys.index(key)
    assert rows == reference.keys[i - 2 : i + 3]


def test_metadata_mismatches_are_an_error_unless_forced(model, reference, tmp_path, capsys):
    other = tracing.trace_generation(model, "say", text="Something else.", speaker="vivian", **GREEDY)
    reference.save(tmp_path / "ref.safetensors")
    other.save(tmp_path / "other.safetensors")
    args = ["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "other.safetensors")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "metadata differs: input.text: reference Hello there, how are you?, candidate Something else." in err
    assert "--force" in err
    assert main(args + ["--force"]) == 1
    assert capsys.readouterr().out.splitlines()[1].startswith("metadata differs: input.text")
    # another checkpoint, and a candidate that computed in another precision than the rule compared
    meta = dict(reference.metadata, weights_sha256="0" * 64, dtype="bfloat16")
    tracing.Trace(reference.items, meta).save(tmp_path / "cand.safetensors")
    assert main(["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "cand.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "metadata differs: weights_sha256" in err and "metadata differs: dtype: reference float32" in err


# ----------------------------------------------------------------------------- teacher forcing


def test_teacher_forcing_judges_every_frame_past_the_first_divergence(model, tmp_path, capsys):
    port = say(model, repetition_penalty=1.0)
    # forced on our own codes, the run is the free run, tensor for tensor
    free = say(model, repetition_penalty=1.3)
    again = say(model, repetition_penalty=1.3, forced_codes=free["refimpl.codes.0"])
    assert compare_traces(free, again).passed and again.metadata["generation"]["forced"]
    np.testing.assert_array_equal(again["refimpl.forced_codes.0"], free["refimpl.codes.0"])
    # forced on the port's codes: every differing code is judged, each one a penalty difference
    forced = say(model, repetition_penalty=1.3, forced_codes=port["refimpl.codes.0"])
    np.testing.assert_array_equal(forced["refimpl.forced_codes.0"], port["refimpl.codes.0"])
    ours, theirs = forced["refimpl.codes.0"], port["refimpl.codes.0"]
    assert ours.shape == theirs.shape
    report = compare_traces(forced, port)
    where = [(d.frame, d.codebook) for d in report.divergences]
    assert where == [(int(t), int(g)) for t, g in zip(*np.nonzero(ours != theirs), strict=True)] and len(where) >= 2
    assert {(d.verdict, d.processor) for d in report.divergences} == {("rule", "repetition_penalty")}
    # the talker's hidden states stay comparable after the first divergence: same history, same tensors
    last = f"talker.model:{ours.shape[0] - 1}"
    assert next(r for r in report.rows if r.key == last).ok
    free_report = compare_traces(free, port)
    assert len(free_report.divergences) == 1 and "--force-codes" in free_report.divergences[0].note
    # the command line: --force-codes takes a .npy or the port's trace
    np.save(tmp_path / "port_codes.npy", port["refimpl.codes.0"])
    port.save(tmp_path / "port.safetensors")
    common = ["trace", "say", TEXT, "--greedy", "--max-new-tokens", "10", "--repetition-penalty", "1.3", "-q"]
    common += ["--model", str(CHECKPOINTS / "tiny-customvoice"), "--speaker", "vivian"]
    for source in ("port_codes.npy", "port.safetensors"):
        out = tmp_path / f"forced-{source}.safetensors"
        assert main(common + ["--force-codes", str(tmp_path / source), "-o", str(out)]) == 0
        np.testing.assert_array_equal(tracing.load_trace(out)["refimpl.codes.0"], ours)
    assert main(["compare", str(out), str(tmp_path / "port.safetensors"), "--failures", "--force"]) == 1
    text = capsys.readouterr().out
    assert text.count("verdict rule, processor repetition_penalty") == len(where)


def test_trace_say_flags_and_replay_checks(model, tmp_path, capsys):
    base = ["trace", "say", TEXT, "--max-new-tokens", "4", "-q", "--model", str(CHECKPOINTS / "tiny-customvoice")]
    first = tmp_path / "first.safetensors"
    assert main(base + ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "1", "-o", str(first)]) == 0
    meta = tracing.load_trace(first).metadata
    assert meta["input"]["speaker"] == model.get_supported_speakers()[0]  # the default, as 'refimpl say'
    g = meta["generation"]
    assert (g["temperature"], g["top_k"], g["top_p"]) == (0.7, 5, 0.9)
    again = tmp_path / "again.safetensors"
    same = base + ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--replay", str(first), "-o", str(again)]
    assert main(same) == 0
    np.testing.assert_array_equal(
        tracing.load_trace(again)["refimpl.codes.0"], tracing.load_trace(first)["refimpl.codes.0"]
    )
    other = [base[0], base[1], "Other text."] + base[3:] + ["--replay", str(first), "-o", str(again)]
    assert main(other + ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9"]) == 1  # bad input
    assert "text: recorded 'Hello there, how are you?', now 'Other text.'" in capsys.readouterr().err
    assert (
        main(
            base + ["--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "--replay", str(first), "-o", str(again)]
        )
        == 1
    )
    assert "temperature: recorded 0.7, now 0.8" in capsys.readouterr().err
    greedy = tmp_path / "greedy.safetensors"
    assert main(base + ["--greedy", "-o", str(greedy)]) == 0
    assert main(base + ["--greedy", "--replay", str(greedy), "-o", str(again)]) == 1  # bad input
    assert "greedy run" in capsys.readouterr().err


SAMPLED = dict(do_sample=True, temperature=0.8, top_k=30, subtalker_dosample=True, subtalker_temperature=1.2)


@pytest.mark.parametrize(
    "reference_options, port_options, processor, talker",
    [
        (
            dict(repetition_penalty=1.3, subtalker_top_k=20),
            dict(repetition_penalty=1.0, subtalker_top_k=20),
            "repetition_penalty",
            True,
        ),
        (
            dict(repetition_penalty=1.05, subtalker_top_k=3),
            dict(repetition_penalty=1.05, subtalker_top_k=0),
            "top_k",
            False,
        ),
    ],
)
def test_sampled_rule_differences_replay_the_recorded_uniform(
    model, reference_options, port_options, processor, talker
):
    """A sampled port replaying our uniforms (refimpl.random_draws) but missing one processor: the verdict
    replays the very uniform of the differing code, for code 0 and for the code predictor's groups."""
    reference = say(model, seed=4, **SAMPLED, **reference_options)
    port = say(model, random_draws=reference["refimpl.random_draws"], **SAMPLED, **port_options)
    d = first(compare_traces(reference, port))
    assert (d.codebook == 0) == talker and (d.verdict, d.processor) == ("rule", processor)
    np.testing.assert_array_equal(reference["refimpl.codes.0"][: d.frame], port["refimpl.codes.0"][: d.frame])


def test_the_dtype_guard_flags_only_a_candidate_coarser_than_the_rule():
    from refimpl.porting.compare import metadata_mismatches

    assert metadata_mismatches({}, {"dtype": "float64"}, "float32") == []
    assert metadata_mismatches({}, {"dtype": "float32"}, "float32") == []
    assert metadata_mismatches({}, {"dtype": "bfloat16"}, "float32") == [
        ["dtype", "float32 (the rule compared)", "bfloat16"]
    ]
    assert metadata_mismatches({}, {"dtype": "float16"}, "bfloat16") == []
