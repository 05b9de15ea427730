"""The vox dump adapter (refimpl/porting/adapters/vox.py): our traces written in the format ``vox verify``
reads, and vox's dumps read under our names. The dumps here are written by the tests from the format's
description (the module docstring), never copied from vox."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import Qwen3TTS
from refimpl.porting import trace_files as tracing
from refimpl.porting.adapters.vox import VOX_NAMES, VoxDumpError, read_vox_dump, write_vox_dump
from refimpl.porting.compare import compare_traces

V, VP, Q = 12, 5, 4  # Talker vocabulary, code-predictor vocabulary, codebooks
DTYPES = {"F32": "<f4", "I32": "<i4", "I64": "<i8", "F64": "<f8"}


def read_by_hand(path) -> tuple:
    """(tensors with their dtype codes, metadata): the safetensors layout read with struct and json."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        array = np.frombuffer(data[8 + n + a : 8 + n + b], DTYPES[h["dtype"]]).reshape(h["shape"])
        tensors[name] = (h["dtype"], array)
    return tensors, metadata


def write_by_hand(path, tensors: dict, metadata: dict) -> None:
    """A safetensors file from (dtype code, array) pairs, as vox's dumper lays one out."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, (code, array) in tensors.items():
        blob = np.ascontiguousarray(array, DTYPES[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def synthetic_trace(frames: int = 3, batch: int = 2, non_streaming: bool = False) -> tracing.Trace:
    """A generation trace of ``frames`` frames without EOS (frames + 1 Talker steps), float64, batch 2."""
    rng = np.random.default_rng(0)
    items = []
    for s in range(frames + 1):
        items.append((f"refimpl.talker.sampling.logits:{s}", rng.standard_normal((batch, V))))
        for g in range(Q - 1 if s < frames else 0):
            items.append(
                (f"refimpl.talker.code_predictor.sampling.logits:{s * (Q - 1) + g}", rng.standard_normal((batch, VP)))
            )
    for i in range(batch):
        items.append((f"refimpl.codes.{i}", rng.integers(0, VP, (frames, Q))))
    for i in range(batch):
        items.append((f"refimpl.waveform.{i}", rng.standard_normal(frames * 1920) * 0.1))
    inputs = {"text": ["Hello.", "Two."], "speaker": ["vivian", "ryan"], "non_streaming_mode": non_streaming}
    return tracing.Trace(items, {"stage": "say", "dtype": "float64", "input": inputs, "refimpl_version": "x"})


@pytest.mark.parametrize("item", [0, 1])
def test_a_trace_is_written_as_vox_reads_its_dump(tmp_path, item):
    trace = synthetic_trace()
    write_vox_dump(trace, tmp_path / "d.safetensors", item=item)
    tensors, meta = read_by_hand(tmp_path / "d.safetensors")
    assert {k: v[0] for k, v in tensors.items()} == {
        "talker_logits": "F32",
        "predictor_logits": "F32",
        "codes": "I32",
        "wav": "F32",
    }
    talker, predictor = tensors["talker_logits"][1], tensors["predictor_logits"][1]
    assert talker.shape == (4, V) and predictor.shape == (3, Q - 1, VP)
    for s in range(4):
        assert np.array_equal(talker[s], trace[f"refimpl.talker.sampling.logits:{s}"][item].astype(np.float32))
    for f in range(3):
        for g in range(Q - 1):
            want = trace[f"refimpl.talker.code_predictor.sampling.logits:{f * (Q - 1) + g}"][item]
            assert np.array_equal(predictor[f, g], want.astype(np.float32))
    assert np.array_equal(tensors["codes"][1], trace[f"refimpl.codes.{item}"])
    assert np.array_equal(tensors["wav"][1], trace[f"refimpl.waveform.{item}"].astype(np.float32))
    assert all(isinstance(v, str) for v in meta.values())  # vox reads every metadata value as a string
    assert meta["text"] == ["Hello.", "Two."][item] and meta["speaker"] == ["vivian", "ryan"][item]
    assert meta["language"] == "auto" and meta["voice"] == "" and meta["ref_frames"] == "0"


def test_a_vox_dump_reads_under_our_names_in_execution_order(tmp_path):
    rng = np.random.default_rng(1)
    frames, steps = 2, 3
    dump = {
        "spk_mels": ("F32", rng.standard_normal((1, 7, 128))),
        "spk_emb": ("F32", rng.standard_normal(6)),
        "talker_logits": ("F32", rng.standard_normal((steps, V))),
        "predictor_logits": ("F32", rng.standard_normal((frames, Q - 1, VP))),
        "codes": ("I32", rng.integers(0, VP, (frames, Q))),
        "wav": ("F32", rng.standard_normal(frames * 1920)),
    }
    write_by_hand(tmp_path / "vox.safetensors", dump, {"text": "Hi.", "language": "auto"})
    trace = read_vox_dump(tmp_path / "vox.safetensors")
    assert trace.keys == [
        "refimpl.speaker_encoder.mel",
        "speaker_encoder",
        "refimpl.talker.sampling.logits:0",
        *[f"refimpl.talker.code_predictor.sampling.logits:{n}" for n in range(3)],
        "refimpl.talker.sampling.logits:1",
        *[f"refimpl.talker.code_predictor.sampling.logits:{n}" for n in range(3, 6)],
        "refimpl.talker.sampling.logits:2",
        "refimpl.codes.0",
        "refimpl.waveform.0",
    ]
    f32 = {k: np.asarray(v[1], DTYPES[v[0]]) for k, v in dump.items()}
    assert np.array_equal(trace["refimpl.talker.sampling.logits:2"], f32["talker_logits"][2:3])
    assert np.array_equal(trace["refimpl.talker.code_predictor.sampling.logits:4"], f32["predictor_logits"][1, 1][None])
    assert np.array_equal(trace["speaker_encoder"], f32["spk_emb"][None])
    assert np.array_equal(trace["refimpl.speaker_encoder.mel"], f32["spk_mels"][0])
    assert trace["refimpl.codes.0"].dtype == np.int64 and np.array_equal(trace["refimpl.codes.0"], dump["codes"][1])
    assert trace.metadata["vox"] == {"text": "Hi.", "language": "auto"}


def test_codes_of_another_width_are_refused_as_vox_would_misread_them(tmp_path):
    write_by_hand(tmp_path / "v.safetensors", {"codes": ("I64", np.zeros((2, Q)))}, {"text": "Hi."})
    with pytest.raises(VoxDumpError, match="codes is I64; vox's verifier reads it as I32"):
        read_vox_dump(tmp_path / "v.safetensors")


def test_the_non_streaming_feed_and_a_clone_without_its_voice_are_refused(tmp_path):
    with pytest.raises(VoxDumpError, match="non-streaming text feed"):
        write_vox_dump(synthetic_trace(non_streaming=True), tmp_path / "a.safetensors")
    clone = synthetic_trace()
    clone.metadata["stage"] = "clone"
    with pytest.raises(VoxDumpError, match="needs voice="):
        write_vox_dump(clone, tmp_path / "b.safetensors")
    write_vox_dump(clone, tmp_path / "b.safetensors", voice="me.tvoice")
    assert read_by_hand(tmp_path / "b.safetensors")[1]["voice"] == "me.tvoice"


def test_a_real_trace_goes_through_the_dump_and_back_within_float32(tmp_path):
    """Our float64 trace of the tiny model, written as vox's dump and read back, passes compare's float32
    rule against itself over every tensor of the dump: the names map to the same tensors."""
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=np.float64)
    opts = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=4, non_streaming_mode=False)
    trace = tracing.trace_generation(tts, "say", text="Hi.", speaker="vivian", **opts)
    back = read_vox_dump(write_vox_dump(trace, tmp_path / "ref.safetensors"))
    report = compare_traces(trace, back, "float32")
    assert len(report.rows) == len(back.keys) == 4 + 3 * 15 + 2  # 4 steps, 3 frames of 15 groups, codes, audio
    assert report.passed, [r.key for r in report.rows if not r.ok]
    assert set(VOX_NAMES) >= {"talker_logits", "predictor_logits", "codes", "wav"}
