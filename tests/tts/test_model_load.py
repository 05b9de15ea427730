"""``Qwen3TTS.from_pretrained`` reads the codec in a thread beside the Talker's check: under the caller's
backend, with the errors in the order of a sequential load (the Talker's first), and in the caller's thread on
a device backend."""

from __future__ import annotations

import copy
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
    """The Talker's error, then the codec's (loaded in a thread), then the text tokenizer's (loaded while the
    codec's thread finishes): the order of a load in sequence."""

    def broken_tokenizer(*args, **kwargs):
        raise CheckpointError("the text tokenizer's own error")

    monkeypatch.setattr(model, "load_text_tokenizer", broken_tokenizer)
    with pytest.raises(CheckpointError, match="the text tokenizer's own error"):
        Qwen3TTS.from_pretrained("default")

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


def test_the_load_packs_the_code_predictors_matrices_before_their_first_use(monkeypatch, tmp_path):
    """On the numba backend the load hands the code predictor's read-packed matrices to the backend before the
    Talker is checked and built: once its threads are done, every one of them is packed, and the code
    predictor's first use finds the packing (none is made again).  The tiny CustomVoice in bfloat16, its code
    predictor 64 wide (packed words take widths of 64)."""
    pytest.importorskip("numba")
    from refimpl.backends.numba_cpu import packed_words
    from refimpl.porting import presets, synthetic

    if not packed_words.PACKED_COMPILED:
        pytest.skip("the packed kernel needs 512-bit byte shuffles (avx512bw)")
    talker = copy.deepcopy(presets.TINY_TALKER_CUSTOMVOICE)
    talker["code_predictor_config"].update(hidden_size=64, intermediate_size=128, head_dim=16)
    synthetic.write_tts_model(tmp_path, "custom_voice", "0b6", talker, dtype="bfloat16")
    with use_backend("numba"):
        tts = Qwen3TTS.from_pretrained(tmp_path)
    packed_words._wait_for_packing_ahead()
    matrices = [m for m in tts.talker.code_predictor.weights.values() if packed_words._packable(m)]
    assert matrices, "the embedded model's code predictor has no packable matrix: the test proves nothing"

    def packing_again(bits):
        raise AssertionError("packed again at the first use")

    monkeypatch.setattr(packed_words, "pack_words", packing_again)
    assert all(packed_words.packed_words(m) is not None for m in matrices)
