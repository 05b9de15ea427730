"""``Qwen3TTS.from_pretrained`` reads the codec in a thread beside the Talker's check: under the caller's
backend, with the errors in the order of a sequential load (the Talker's first), and in the caller's thread on
a device backend."""

from __future__ import annotations

import threading

import pytest

import refimpl.tts.model as model
from refimpl import Qwen3TTS, active_backend, use_backend
from refimpl.io.checkpoint import CheckpointError


@pytest.fixture
def codec_loads(monkeypatch):
    """Each codec load's (thread name, active backend), the load itself unchanged."""
    seen = []
    load = model.SpeechTokenizer.from_pretrained

    def recorded(*args, **kwargs):
        seen.append((threading.current_thread().name, active_backend()[0]))
        return load(*args, **kwargs)

    monkeypatch.setattr(model.SpeechTokenizer, "from_pretrained", recorded)
    return seen


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_the_codec_loads_under_the_callers_backend(codec_loads, backend):
    with use_backend(backend):
        tts = Qwen3TTS.from_pretrained("default")
    assert tts.speech_tokenizer is not None
    ((thread, seen),) = codec_loads
    assert seen == backend
    assert (thread == threading.current_thread().name) == (backend == "strict")  # a device backend: no thread


def test_the_talkers_error_comes_first_then_the_codecs(monkeypatch):
    def broken_codec(*args, **kwargs):
        raise CheckpointError("the codec's own error")

    monkeypatch.setattr(model.SpeechTokenizer, "from_pretrained", broken_codec)
    with pytest.raises(CheckpointError, match="the codec's own error"):
        Qwen3TTS.from_pretrained("default")

    def broken_talker(*args, **kwargs):
        raise CheckpointError("the Talker's own error")

    monkeypatch.setattr(model, "Talker", broken_talker)
    with pytest.raises(CheckpointError, match="the Talker's own error"):
        Qwen3TTS.from_pretrained("default")
