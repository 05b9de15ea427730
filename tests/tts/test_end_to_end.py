"""End to end: streaming synthesis equals decoding the generated codes in one pass, for every mode.

``stream_*`` runs the Talker and feeds each group of ``chunk_frames`` frames to the exact streaming
decoder as soon as they exist.  With the same seed (or greedy) it must produce the same codes as
``generate_*`` and audio equal to ``SpeechTokenizer.decode_full`` of those codes (for ICL voice clone:
of reference + new codes, minus the reference's samples).  Checked in float64, where the only
difference is summation order (tolerance 1e-9, as the decoder's streaming contract), over random
chunk sizes, seeds, sampling settings and lengths (hypothesis).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CHECKPOINTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl import Qwen3TTS

MODELS = {}


def model(kind: str) -> Qwen3TTS:
    if kind not in MODELS:
        MODELS[kind] = Qwen3TTS.from_pretrained(CHECKPOINTS / f"tiny-{kind}", dtype=np.float64)
    return MODELS[kind]


def reference_audio():
    t = np.arange(24000 * 3 // 4) / 24000.0
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32), 24000


def voice_clone_prompt(x_vector_only: bool):
    key = f"prompt-{x_vector_only}"
    if key not in MODELS:
        MODELS[key] = model("base").create_voice_clone_prompt(
            reference_audio(), ref_text="A short reference.", x_vector_only_mode=x_vector_only
        )
    return MODELS[key]


MODES = {
    "custom_voice": (
        "customvoice",
        "custom_voice",
        dict(text="Streaming is exact.", speaker="vivian", language="english"),
    ),
    "custom_voice_streaming_text": (
        "customvoice",
        "custom_voice",
        dict(text="Text fed token by token.", speaker="eric", non_streaming_mode=False),
    ),
    "voice_design": ("voicedesign", "voice_design", dict(text="Designed voice.", instruct="A bright voice.")),
    "voice_clone_icl": ("base", "voice_clone", dict(text="Cloned, in context.")),
    "voice_clone_xvector": ("base", "voice_clone", dict(text="Cloned from an x-vector.")),
}


def expected_chunk_frames(chunk_frames, T: int) -> list:
    """The frames of each chunk for T frames: an int n gives n, n, ...; a list its sizes, the last one
    repeated; the last chunk holds what is left."""
    sizes = [chunk_frames] if isinstance(chunk_frames, int) else list(chunk_frames)
    out = []
    while sum(out) < T:
        out.append(min(sizes[min(len(out), len(sizes) - 1)], T - sum(out)))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(sorted(MODES)),
    chunk_frames=st.one_of(st.integers(1, 9), st.lists(st.integers(1, 5), min_size=1, max_size=4)),
    seed=st.integers(0, 10_000),
    do_sample=st.booleans(),
    max_new_tokens=st.integers(1, 14),
)
def test_streamed_chunks_equal_decode_full_of_the_generated_codes(mode, chunk_frames, seed, do_sample, max_new_tokens):
    kind, method, kwargs = MODES[mode]
    m = model(kind)
    kwargs = dict(kwargs, seed=seed, do_sample=do_sample, subtalker_dosample=do_sample, max_new_tokens=max_new_tokens)
    ref_codes = None
    if method == "voice_clone":
        prompt = voice_clone_prompt(x_vector_only=mode.endswith("xvector"))
        kwargs["voice_clone_prompt"] = prompt
        ref_codes = prompt[0].ref_code
    wavs, sr, codes = getattr(m, "generate_" + method)(return_codes=True, **kwargs)
    chunks = list(getattr(m, "stream_" + method)(chunk_frames=chunk_frames, **kwargs))
    streamed_codes = np.stack(m.last_log.frames)[:, 0] if m.last_log.frames else np.zeros((0, 16), np.int64)
    np.testing.assert_array_equal(streamed_codes, codes[0])  # same seed -> same codes
    T = codes[0].shape[0]
    assert [len(c) for c in chunks] == [n * 1920 for n in expected_chunk_frames(chunk_frames, T)]
    assert all(c.dtype == np.float32 for c in chunks)
    streamed = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    tok = m.speech_tokenizer
    if ref_codes is None:
        expected = tok.decode_full(codes[0])
    else:
        expected = tok.decode_full(np.concatenate([ref_codes, codes[0]]))[len(ref_codes) * 1920 :]
    assert streamed.shape == expected.shape
    if T:
        # float64 decode, float32 chunks: the float32 rounding of the output (<= 6e-8 for |x| <= 1) dominates
        assert np.max(np.abs(streamed - expected)) <= 1e-9 + np.finfo(np.float32).eps
        # and the non-streamed generate_* output (the official 300-frame chunked decode) is the same audio here
        np.testing.assert_allclose(wavs[0], expected.astype(np.float32), rtol=0, atol=1e-6)


def test_stream_argument_errors():
    m = model("customvoice")
    with pytest.raises(ValueError, match="chunk_frames"):
        m.stream_custom_voice("hi", speaker="vivian", chunk_frames=0)
    with pytest.raises(ValueError, match="one text"):
        m.stream_custom_voice(["a", "b"], speaker="vivian")
    with pytest.raises(ValueError, match="empty"):
        m.stream_custom_voice("", speaker="vivian")
    with pytest.raises(ValueError, match="base"):
        m.stream_voice_clone("hi", ref_audio=reference_audio(), x_vector_only_mode=True)


def test_default_stream_yields_audio_after_one_frame_then_growing_chunks():
    """The default schedule (1, 2, 4): the first chunk as soon as ONE frame exists, then 2 frames, then 4 at
    a time; the concatenation is the one-pass decode of the same codes."""
    m = model("customvoice")
    gen = m.stream_custom_voice(
        "A longer sentence so that there are many frames.",
        speaker="serena",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=20,
    )
    first = next(gen)
    assert first.shape == (1920,) and len(m.last_log.frames) == 1
    second = next(gen)
    assert second.shape == (2 * 1920,) and len(m.last_log.frames) == 3
    chunks = [first, second, *gen]
    T = len(m.last_log.frames)
    assert [len(c) // 1920 for c in chunks] == expected_chunk_frames([1, 2, 4], T) and T == 19
    expected = m.speech_tokenizer.decode_full(np.stack(m.last_log.frames)[:, 0])
    assert np.max(np.abs(np.concatenate(chunks) - expected)) <= 1e-9 + np.finfo(np.float32).eps


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4", (), (2, 0), [1, None]])
def test_chunk_frames_must_be_positive_integers(bad):
    with pytest.raises(ValueError, match="chunk_frames"):
        model("customvoice").stream_custom_voice("hi", speaker="vivian", chunk_frames=bad)


def test_first_chunk_arrives_before_generation_ends():
    """The generator yields as soon as chunk_frames frames exist: after the first chunk only that many
    frames have been generated."""
    m = model("customvoice")
    gen = m.stream_custom_voice(
        "A longer sentence so that there are many frames.",
        speaker="serena",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=20,
        chunk_frames=3,
    )
    first = next(gen)
    assert first.shape == (3 * 1920,) and len(m.last_log.frames) == 3
    rest = list(gen)
    assert len(m.last_log.frames) == 19 and sum(len(c) for c in rest) == 16 * 1920
