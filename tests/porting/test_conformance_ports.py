"""Simulated ports graded by the conformance suite: refimpl itself in float32 with ONE mistake that a real
port made, run on a case's inputs as the suite runs it (``suite.reference_trace``), its trace or only its
plain outputs graded against the float64 reference.  Each must fail, named at its first divergence.

A mistake is a ``monkeypatch`` of the refimpl function the stage code calls (``nn.snake_beta``,
``codec.decoder.transposed_conv``, ...), run under the numpy backend so that no fast twin bypasses it.  The
same run without the mistake passes every case it touches (``test_without_a_mistake_the_port_passes``):
what fails below is the mistake, not the harness.  The numbers in the comments are measured on the tiny
embedded checkpoints (docs/conformance.md, "Simulated ports").
"""

from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl import nn
from refimpl.codec import decoder as codec_decoder
from refimpl.codec.speech_tokenizer import SpeechTokenizer
from refimpl.io.audio import read_wav
from refimpl.porting import trace_files
from refimpl.porting.conformance import grade, suite
from refimpl.tts import code_predictor, mel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance-ports") / "suite"
    manifest = suite.make_suite(out)
    models = suite.Models({kind: out / entry["path"] for kind, entry in manifest["checkpoints"].items()})
    return out, {c["name"]: c for c in manifest["cases"]}, models


def case_inputs(suite_dir: Path, entry: dict) -> dict:
    """The case's inputs as the port reads them from the suite: name -> (array, sample rate or None)."""
    inputs = {}
    for name, file in entry["inputs"].items():
        path = suite_dir / "cases" / entry["name"] / file
        if file.endswith(".wav"):
            inputs[name] = read_wav(path)
        elif name != "uniforms":  # the sampled case's replay, not an input of these ports
            inputs[name] = (np.load(path), None)
    return inputs


def run_port(made, name: str) -> trace_files.Trace:
    """The case run as the suite runs it, in float32, on the numpy backend (the patched primitives' own bodies)."""
    suite_dir, entries, models = made
    case = next(c for c in suite.CASES if c.name == name)
    with refimpl.use_backend("numpy"):
        return suite.reference_trace(case, models, case_inputs(suite_dir, entries[name]), np.float32)


def grade_trace(made, name: str, trace: trace_files.Trace, results: Path) -> dict:
    """A port that dumps its whole trace: RESULTS/<case>.safetensors."""
    results.mkdir(parents=True, exist_ok=True)
    trace.save(results / f"{name}.safetensors")
    return graded(made, name, results)


def grade_outputs(made, name: str, trace: trace_files.Trace, results: Path) -> dict:
    """A port that dumps only the case's plain outputs (codes.npy, waveform.npy, x_vector.npy)."""
    _, entries, _ = made
    folder = results / name
    folder.mkdir(parents=True)
    for out, key in entries[name]["outputs"].items():
        np.save(folder / f"{out}.npy", np.squeeze(trace[key]))
    return graded(made, name, results)


def graded(made, name: str, results: Path) -> dict:
    report = grade.grade_suite(made[0], results, "float32")
    others = {c["name"]: c["status"] for c in report["cases"] if c["name"] != name}
    assert set(others.values()) == {"not_run"}, others
    return next(c for c in report["cases"] if c["name"] == name)


def checks(case: dict) -> dict:
    return {c["name"]: c["status"] for c in case["checks"]}


def tensor(case: dict, key: str) -> dict:
    return next(t for t in case["tensors"] if t["key"] == key)


def ratio(t: dict) -> float:
    return t["max_abs"] / t["tol"]


def first_failure_in_order(case: dict) -> dict:
    """The first failing tensor; every tensor before it in execution order passes."""
    i = next(i for i, t in enumerate(case["tensors"]) if not t["ok"])
    assert all(t["ok"] for t in case["tensors"][:i])
    assert case["tensors"][i]["key"] == case["first_failure"]
    return case["tensors"][i]


# ----------------------------------------------------------------------------- the mistakes


def snake_beta_without_exp(x_bct, log_alpha_c, log_beta_c):
    """SnakeBeta reading the checkpoint's log-parameters as alpha and beta (the exp forgotten)."""
    alpha = log_alpha_c[None, :, None]
    inv_beta = 1.0 / (log_beta_c[None, :, None] + x_bct.dtype.type(1e-9))
    return x_bct + inv_beta * np.sin(alpha * x_bct) ** 2


def transposed_conv_untrimmed(w, x_bct, stride, state, record):
    """``codec_decoder.transposed_conv`` offline, the ConvTranspose1d's last K - stride samples kept."""
    full_bct = nn.conv_transpose1d(x_bct, w["conv.weight"], w["conv.bias"], stride)
    record.extra("untrimmed", full_bct)
    record.output(full_bct)  # the mistake: full_bct[:, :, : T * stride] is the unit's output
    return full_bct


def transposed_conv_trimmed_left(w, x_bct, stride, state, record):
    """``codec_decoder.transposed_conv`` offline, the K - stride samples cut from the start, not the end."""
    full_bct = nn.conv_transpose1d(x_bct, w["conv.weight"], w["conv.bias"], stride)
    record.extra("untrimmed", full_bct)
    y_bct = full_bct[:, :, full_bct.shape[-1] - x_bct.shape[-1] * stride :]  # the mistake: the wrong side
    record.output(y_bct)
    return y_bct


def head_off_by_one(self, g: int, hidden_bc):
    """lm_head[g - 1] for codebook g + 1: the heads indexed with the codebook number less 2 (g + 1 - 2), so
    that codebook 1 reads lm_head[-1], the last head, without an error (a Python list), and each later
    codebook the head of the codebook before it."""
    return nn.linear(hidden_bc, self.w[f"lm_head.{(g - 1) % self.n_groups}.weight"])


def htk_hz_to_mel(f_hz):
    """The HTK mel scale (torchaudio's default), where the official filterbank is librosa's Slaney scale."""
    return 2595.0 * np.log10(1.0 + np.asarray(f_hz, dtype=np.float64) / 700.0)


def htk_mel_to_hz(m_mel):
    return 700.0 * (10.0 ** (np.asarray(m_mel, dtype=np.float64) / 2595.0) - 1.0)


class ShortContextStream:
    """A serving engine's streamed decode: each push re-decodes its frames with only 25 frames of left
    context (the decoder's attention window is 72 frames, its convolutions reach further) instead of
    carrying the decoder's state (``SpeechTokenizer.stream``)."""

    LEFT = 25

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.codes = np.zeros((0, tokenizer.num_quantizers), dtype=np.int64)

    def push(self, codes):
        t = len(self.codes)
        self.codes = np.concatenate([self.codes, codes])
        start = max(0, t - self.LEFT)
        return self.tokenizer.decode_full(self.codes[start:])[(t - start) * FRAME :]


def make_mistake(monkeypatch, name: str, made) -> None:
    """Inject the mistake ``name`` (undone by ``monkeypatch`` at the end of the test)."""
    if name == "snake-no-exp":
        monkeypatch.setattr(nn, "snake_beta", snake_beta_without_exp)
    elif name == "untrimmed":
        monkeypatch.setattr(codec_decoder, "transposed_conv", transposed_conv_untrimmed)
    elif name == "trimmed-left":
        monkeypatch.setattr(codec_decoder, "transposed_conv", transposed_conv_trimmed_left)
    elif name == "talker-eps":
        # the Talker's RMSNorms (every layer's, its q/k norms, the final one) with 1e-5: the codec decoder's
        # eps, where the Talker's config says 1e-6; the code predictor keeps its own 1e-6
        talker_cfg = made[2].tts("customvoice", np.float32).talker.cfg
        assert talker_cfg.rms_norm_eps == 1e-6
        monkeypatch.setattr(talker_cfg, "rms_norm_eps", 1e-5)
    elif name == "head-off-by-one":
        monkeypatch.setattr(code_predictor.CodePredictor, "head", head_off_by_one)
    elif name == "htk-mel":
        monkeypatch.setattr(mel, "hz_to_mel", htk_hz_to_mel)
        monkeypatch.setattr(mel, "mel_to_hz", htk_mel_to_hz)
        mel._mel_basis.cache_clear()  # the filterbank is made once per setting: make it again
    elif name == "short-context-stream":
        monkeypatch.setattr(SpeechTokenizer, "stream", lambda self: ShortContextStream(self))
    else:
        raise ValueError(name)


@pytest.fixture
def mel_cache():
    """The mel filterbank cache cleared after the test: no HTK filterbank outlives the HTK port."""
    yield
    mel._mel_basis.cache_clear()


MISTAKES = {  # mistake -> the case it shows in
    "snake-no-exp": "codec-decode",
    "untrimmed": "codec-decode",
    "trimmed-left": "codec-decode",
    "talker-eps": "say-greedy",
    "head-off-by-one": "say-greedy",
    "htk-mel": "speaker",
    "short-context-stream": "codec-decode-stream",
}


# ----------------------------------------------------------------------------- the control


def test_without_a_mistake_the_port_passes(made, tmp_path, mel_cache):
    """The harness alone (float32, numpy backend, the suite's own run of the case): every case the mistakes
    use passes as a trace and as plain outputs, so each failure below is its mistake's."""
    for name in sorted(set(MISTAKES.values())):
        trace = run_port(made, name)
        assert grade_trace(made, name, trace, tmp_path / "traces" / name)["status"] == "pass", name
        assert grade_outputs(made, name, trace, tmp_path / "plain" / name)["status"] == "pass", name


# ----------------------------------------------------------------------------- 1. an activation's formula


def test_snake_beta_without_exp_is_named_at_the_first_snake(made, tmp_path, monkeypatch):
    """SnakeBeta with alpha = log_alpha and beta = log_beta.  The first SnakeBeta in execution order is
    the one before the first waveform block's ConvTranspose (``decoder.decoder.1.block.0``); measured: 42.4
    off, 2.5e6 times its tolerance, the waveform from frame 0 (SNR -10 dB)."""
    make_mistake(monkeypatch, "snake-no-exp", made)
    trace = run_port(made, "codec-decode")
    case = grade_trace(made, "codec-decode", trace, tmp_path / "trace")
    assert case["status"] == "fail"
    first = first_failure_in_order(case)
    assert first["key"] == "decoder.decoder.1.block.0" and first["shape_mismatch"] is None
    assert ratio(first) > 1e3
    assert checks(case) == {"decoder": "fail", "waveform": "fail"}
    assert tensor(case, "decoder.decoder.0")["ok"]  # the conv that feeds it: still right

    plain = grade_outputs(made, "codec-decode", trace, tmp_path / "plain")  # only waveform.npy
    assert plain["status"] == "fail" and plain["first_failure"] == "decoder"  # the waveform's official key
    assert checks(plain) == {"waveform": "fail"}
    assert plain["waveform"]["first_divergent_frame"] == 0 and plain["waveform"]["first_divergent_sample"] == 0
    assert plain["waveform"]["snr_db"] < 0


# ----------------------------------------------------------------------------- 2. a transposed conv's trim


def test_an_untrimmed_transposed_conv_is_a_shape_mismatch_in_its_place(made, tmp_path, monkeypatch):
    """The waveform blocks' ConvTranspose (k = 2 * rate, stride = rate) not trimmed: rate samples too many.
    The upsample stages' ConvTransposes (k = stride) have nothing to trim and agree, so the first failure is
    the first waveform block's ConvTranspose, ``decoder.decoder.1.block.1`` ([1, 32, 136] for [1, 32, 128]):
    a shape mismatch, before every later tensor (whose shapes all differ) and the waveform."""
    make_mistake(monkeypatch, "untrimmed", made)
    trace = run_port(made, "codec-decode")
    case = grade_trace(made, "codec-decode", trace, tmp_path / "trace")
    assert case["status"] == "fail"
    first = first_failure_in_order(case)
    assert first["key"] == "decoder.decoder.1.block.1"
    assert first["shape_mismatch"] == [[1, 32, 128], [1, 32, 136]]
    assert "shape (1, 32, 136), the reference's (1, 32, 128)" in case["message"]
    assert tensor(case, "decoder.decoder.1.block.1.conv")["ok"]  # the ConvTranspose1d itself is right
    for key in ("decoder.upsample.0.0", "decoder.upsample.1.0"):  # k = stride: nothing to trim
        assert tensor(case, key)["ok"]
    later = case["tensors"][case["tensors"].index(first) + 1 :]
    assert sum(t["shape_mismatch"] is not None for t in later) > 50  # downstream fails too, after it
    assert tensor(case, "decoder")["shape_mismatch"] == [[1, 1, 7680], [1, 1, 8235]]
    assert checks(case) == {"decoder": "fail", "waveform": "fail"}

    # A port that dumps only audio: causal, so its first 7680 samples are right and the extra 555 come
    # after them; the grader says the length, and puts the divergence at the end of the reference's frames.
    plain = grade_outputs(made, "codec-decode", trace, tmp_path / "plain")
    assert plain["status"] == "fail" and "shape (8235,)" in plain["message"]
    wave = plain["waveform"]
    assert (wave["samples"], wave["samples_candidate"]) == (7680, 8235)
    assert wave["first_divergent_sample"] == 7680 and wave["first_divergent_frame"] == 4
    assert wave["snr_db"] > 100  # over the samples both have


def test_a_transposed_conv_trimmed_on_the_wrong_side_is_named_by_its_values(made, tmp_path, monkeypatch):
    """The same ConvTranspose trimmed at the start instead of the end: the right shape, wrong (shifted)
    samples; named at ``decoder.decoder.1.block.1`` by value."""
    make_mistake(monkeypatch, "trimmed-left", made)
    case = grade_trace(made, "codec-decode", run_port(made, "codec-decode"), tmp_path)
    first = first_failure_in_order(case)
    assert case["status"] == "fail" and first["key"] == "decoder.decoder.1.block.1"
    assert first["shape_mismatch"] is None and ratio(first) > 1e3
    assert not any(t["shape_mismatch"] for t in case["tensors"])
    assert case["waveform"]["first_divergent_frame"] == 0


# ----------------------------------------------------------------------------- 3. a norm's eps


def test_a_talker_rms_norm_eps_of_1e_5_is_seen_only_in_the_trace(made, tmp_path, monkeypatch):
    """RMSNorm with eps 1e-5 in the Talker (config: 1e-6).  On the tiny checkpoint it is visible at the
    Talker's first RMSNorm, ``talker.model.layers.0.input_layernorm:0`` (the prompt's positions): 4.9e-5
    off, 5.3 times the float32 tolerance of 9.2e-6; the Talker's worst tensor 10 times (layer 1's MLP).
    But no code changes (11 of 11 frames equal) and the decoder is untouched, so the waveform is the
    correct port's (SNR 120.9 dB): a port that dumps only codes and audio passes with this mistake."""
    make_mistake(monkeypatch, "talker-eps", made)
    trace = run_port(made, "say-greedy")
    case = grade_trace(made, "say-greedy", trace, tmp_path / "trace")
    assert case["status"] == "fail"
    first = first_failure_in_order(case)
    assert first["key"] == "talker.model.layers.0.input_layernorm:0"
    assert 2 < ratio(first) < 20  # the measured 5.3: a small mistake, yet over the tolerance
    status = checks(case)
    assert status["talker"] == "fail" and status["codes"] == "pass" and status["waveform"] == "pass"
    assert case["codes"]["frames_equal"] == case["codes"]["frames_reference"] == 11

    plain = grade_outputs(made, "say-greedy", trace, tmp_path / "plain")
    assert plain["status"] == "pass"  # what codes and audio cannot tell


# ----------------------------------------------------------------------------- 4. a head's index


def test_a_code_predictor_head_off_by_one_parts_at_frame_0_codebook_1(made, tmp_path, monkeypatch):
    """Codebook 1 from the last head: its logits, traced as the port's lm_head.0 of the first frame
    (``talker.code_predictor.lm_head.0:0``; every Talker tensor of the prompt before it passes), are the
    first failure, and the codes part at frame 0, codebook 1.  The Talker fails only from its next step
    on (its input is the frame's codes)."""
    make_mistake(monkeypatch, "head-off-by-one", made)
    trace = run_port(made, "say-greedy")
    case = grade_trace(made, "say-greedy", trace, tmp_path / "trace")
    assert case["status"] == "fail"
    first = first_failure_in_order(case)
    assert first["key"] == "talker.code_predictor.lm_head.0:0"
    div = case["codes"]["first_divergence"]
    assert (div["frame"], div["codebook"]) == (0, 1) and div["upstream"] == first["key"]
    assert "codes part at frame 0, codebook 1" in case["message"]
    status = checks(case)
    assert status["code_predictor"] == "fail" and status["codes"] == "fail"
    entry = made[1]["say-greedy"]
    talker = [t["key"] for t in case["tensors"] if grade.check_of(t["key"], entry) == "talker"]
    first_talker = next(t["key"] for t in case["tensors"] if t["key"] in talker and not t["ok"])
    assert first_talker.endswith(":1")  # the Talker's second step, after the wrong codes of frame 0

    plain = grade_outputs(made, "say-greedy", trace, tmp_path / "plain")
    div = plain["codes"]["first_divergence"]
    assert plain["status"] == "fail" and (div["frame"], div["codebook"]) == (0, 1)
    assert plain["codes"]["frames_equal"] == 0 and plain["waveform"]["first_divergent_frame"] == 0


# ----------------------------------------------------------------------------- 5. a front end's option


def test_an_htk_mel_scale_is_named_at_the_speaker_encoders_mel(made, tmp_path, monkeypatch, mel_cache):
    """The speaker encoder's filterbank on the HTK mel scale (torchaudio's default) instead of Slaney's.
    The filterbank is not traced; the log mel it makes (``refimpl.speaker_encoder.mel``) is the first
    failure (6.3 off in log units), before the ECAPA-TDNN's first conv; the x-vector fails."""
    make_mistake(monkeypatch, "htk-mel", made)
    trace = run_port(made, "speaker")
    case = grade_trace(made, "speaker", trace, tmp_path / "trace")
    assert case["status"] == "fail"
    first = first_failure_in_order(case)
    assert first["key"] == "refimpl.speaker_encoder.mel" and ratio(first) > 1e3
    assert tensor(case, "refimpl.speaker_encoder.input")["ok"]  # the audio it starts from is right
    assert checks(case) == {"speaker_encoder": "fail", "x_vector": "fail"}

    plain = grade_outputs(made, "speaker", trace, tmp_path / "plain")  # only x_vector.npy
    assert plain["status"] == "fail" and plain["first_failure"] == "speaker_encoder"
    assert checks(plain) == {"x_vector": "fail"}


# ----------------------------------------------------------------------------- 6. streaming's left context


def test_a_stream_with_25_frames_of_left_context_parts_at_frame_27(made, tmp_path, monkeypatch):
    """The exact-stream case (40 frames in pushes of 1, 2, 4, 4, ...) decoded by a stream that re-decodes
    each push with 25 frames of left context.  The pushes start at frames 0, 1, 3, 7, ..., 23, 27: up to
    frame 26 every push still decodes from frame 0, the push at 27 is the first without frames 0 and 1, so
    its first frame is the first divergent one.  Only the waveform is dumped."""
    make_mistake(monkeypatch, "short-context-stream", made)
    trace = run_port(made, "codec-decode-stream")
    case = grade_outputs(made, "codec-decode-stream", trace, tmp_path)
    wave = case["waveform"]
    assert case["status"] == "fail" and case["first_failure"] == "refimpl.waveform.0"
    assert checks(case) == {"waveform": "fail"}
    assert wave["first_divergent_frame"] == 27 and wave["first_divergent_sample"] // FRAME == 27
    assert max(wave["frame_errors"][:27]) <= wave["tol"] < wave["frame_errors"][27]
    assert "waveform from frame 27" in case["message"]
