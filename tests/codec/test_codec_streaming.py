"""Streaming decode equals the single-pass decode, for any split of any code sequence (hypothesis)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# float64: streaming and the single pass compute the same sums in a different order (the left context
# is concatenated instead of zero-padded, the transposed-conv tails are added separately), so they agree
# to rounding: <= 1e-9 is the contract (measured: ~1e-14).  float32: the same reordering at float32
# precision; measured max 3e-6 over many random splits, tolerance 2e-5 (waveform values are O(1)).
TOLERANCE = {"f64": 1e-9, "f32": 2e-5}


@st.composite
def codes_and_splits(draw):
    T = draw(st.integers(min_value=0, max_value=40))
    seed = draw(st.integers(min_value=0, max_value=2**31 - 1))
    codes = np.random.default_rng(seed).integers(0, 64, size=(T, 16))
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=T), max_size=8)))  # repeats = empty pushes
    bounds = [0] + cuts + [T]
    return codes, [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize("precision", ["f64", "f32"])
def test_streaming_equals_decode_full(speech_tokenizers, precision):
    tok = speech_tokenizers[precision]

    @settings(
        max_examples=30 if precision == "f64" else 15,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(codes_and_splits())
    def check(case):
        codes, parts = case
        stream = tok.stream()
        chunks = []
        for a, b in parts:
            out = stream.push(codes[a:b])
            assert out.shape == ((b - a) * 1920,), "a push returns exactly the samples of its frames"
            chunks.append(out)
        streamed = np.concatenate(chunks)
        full = tok.decode_full(codes)
        assert streamed.dtype == full.dtype
        err = float(np.max(np.abs(streamed - full))) if full.size else 0.0
        assert err <= TOLERANCE[precision], f"{len(parts)} pushes of {codes.shape[0]} frames: {err:.3e}"

    check()


def test_streaming_is_not_redecoding(speech_tokenizers):
    """The state is bounded: after many frames the transformer caches hold window - 1 frames."""
    tok = speech_tokenizers["f64"]
    stream = tok.stream()
    codes = np.random.default_rng(7).integers(0, 64, size=(50, 16))
    for t in range(0, 50, 5):
        stream.push(codes[t : t + 5])
    window = tok.decoder_config.sliding_window
    for cache in stream.state.kv:
        k, v = cache.view()
        assert cache.kept == window - 1 and k.shape[2] == window - 1 and v.shape[2] == window - 1
        assert cache.length == 50
    assert stream.frames_done == 50
    # the longest carried conv context is the dilated k7 conv of the last residual units: 6 * 9 samples
    assert max(stream.state.context_lengths().values()) == 6 * 9


def test_every_conv_streams_with_its_own_state(speech_tokenizers):
    """The conv states are named as the conv units' weights (``{name}.conv.weight``), a push uses every
    one, and a streaming conv that finds no state (or one of the other kind) is an error, never the
    silent zero padding that would restart it at every push."""
    from refimpl import nn

    tok = speech_tokenizers["f64"]
    codes = np.random.default_rng(3).integers(0, 64, size=(3, 16))
    stream = tok.stream()
    units = {n[: -len(".conv.weight")] for n in tok.decoder_weights if n.endswith(".conv.weight")}
    assert set(stream.state.convs) == units and len(units) == 2 + 2 * 2 + 4 * (1 + 3 * 2) + 1
    stream.push(codes)
    for name, state in stream.state.convs.items():
        held = state.context_bct if isinstance(state, nn.CausalConvState) else state.tail_bot
        assert held is not None, f"the push did not use the state of {name}"
    for name in ("pre_conv", "upsample.1.1.dwconv", "upsample.0.0", "decoder.2.block.3.conv1", "decoder.6"):
        broken = tok.stream()
        del broken.state.convs[name]
        with pytest.raises(LookupError, match=re.escape(f"conv {name!r} finds no state")):
            broken.push(codes)
    swapped = tok.stream()
    swapped.state.convs["decoder.1.block.1"] = nn.CausalConvState()
    with pytest.raises(LookupError, match="'decoder.1.block.1' finds a CausalConvState .* not a TransposedConvState"):
        swapped.push(codes)


def test_streams_of_one_tokenizer_share_its_workspace(speech_tokenizers, backend, monkeypatch):
    """A stream's pushes take their outputs from the tokenizer's workspace (the buffers the streams before
    made), and a buffer a stream's state still holds is never handed to another: two streams pushed in
    turns give the bits each gives alone (every twin's output from the workspace, however small)."""
    from refimpl.backends import host_memory

    monkeypatch.setattr(host_memory, "RECYCLE_MIN_BYTES", 0)
    tok = speech_tokenizers["f32"]
    codes = np.random.default_rng(11).integers(0, 64, size=(2, 12, 16))
    bounds = [0, 1, 5, 6, 12]
    alone = []
    for c in codes:
        stream = tok.stream()
        alone.append([stream.push(c[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    streams = [tok.stream(), tok.stream()]
    assert all(host_memory.workspace_of(s) is host_memory.workspace_of(tok) for s in streams)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        for stream, c, pushes in zip(streams, codes, alone, strict=True):
            np.testing.assert_array_equal(stream.push(c[a:b]), pushes[i])
    if backend == "numba":  # (its twins take their outputs from the workspace)
        assert host_memory.workspace_of(tok).buffers


def test_a_tokenizers_first_stream_reads_its_weights_pages_once(speech_tokenizers, monkeypatch):
    """The first stream of a tokenizer starts one thread that reads a byte of every page of the decoder's
    weights (``read_every_page``: contiguous host arrays only, none changed); later streams start none."""
    from refimpl.io import mapped_files

    read = []
    monkeypatch.setattr(mapped_files, "read_every_page", lambda arrays: read.append(list(arrays)))
    tok = speech_tokenizers["f32"]
    tok.__dict__.pop("_weight_pages_read", None)
    tok.stream()
    tok.stream()
    for _ in range(100):
        if read:
            break
        time.sleep(0.01)
    assert len(read) == 1 and len(read[0]) == len(tok.decoder_weights)
    odd = [np.arange(8.0), np.arange(4096.0).reshape(64, 64)[:, ::2], np.arange(4096, dtype=np.float32), "x"]
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in odd]
    monkeypatch.undo()
    mapped_files.read_every_page(odd)
    assert all(np.array_equal(a, b) for a, b in zip(odd, before, strict=True))


def test_long_stream_against_golden(speech_tokenizers):
    """Streaming a long golden sequence in uneven chunks matches the official single pass."""
    from conftest import GOLDEN, assert_close_to_oracle

    gold = np.load(GOLDEN / "codec_decoder.npz")
    codes = gold["t311/codes"]
    for precision in ("f32", "f64"):
        stream = speech_tokenizers[precision].stream()
        bounds = [0, 1, 2, 9, 9, 80, 200, 311]
        wav = np.concatenate([stream.push(codes[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        assert_close_to_oracle(wav, gold["t311/f32/full"], gold["t311/f64/full"], precision, "streamed t311")
