"""The qwentts.cpp dump adapter (refimpl/porting/adapters/qwentts_cpp.py): its debug dumps read under our names,
and our traces written as its dumps. The dump files here are written by the tests from the format's
description (the module docstring: int32 ndims, int32 shape, float32 data), never copied from qwentts.cpp."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import Qwen3TTS
from refimpl.porting import trace_files as tracing
from refimpl.porting.adapters.qwentts_cpp import (
    QWENTTS_NAMES,
    QwenttsDumpError,
    read_qwentts_bin,
    read_qwentts_dump,
    write_qwentts_dump,
)
from refimpl.porting.compare import compare_traces

T, H, V, Q = 5, 8, 12, 4  # prompt positions, hidden size, Talker vocabulary, codebooks
SEMANTIC = "refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes"
ACOUSTIC = "refimpl.encoder.quantizer.acoustic_residual_vector_quantizer.layers.{}.codes"


def write_by_hand(path, array) -> None:
    """One dump file as the format lays it out: [ndims: int32] [shape: int32 x ndims] [data: float32 x numel]."""
    a = np.asarray(array, dtype=np.float32)
    path.write_bytes(struct.pack(f"<i{a.ndim}i", a.ndim, *a.shape) + a.astype("<f4").tobytes())


def read_by_hand(path) -> np.ndarray:
    data = path.read_bytes()
    (ndims,) = struct.unpack("<i", data[:4])
    shape = struct.unpack(f"<{ndims}i", data[4 : 4 + 4 * ndims])
    return np.frombuffer(data[4 + 4 * ndims :], "<f4").reshape(shape)


def a_dump(folder, rng) -> dict:
    """The files of a voice clone in context, as a run with a dump_dir leaves them."""
    folder.mkdir()
    codes = rng.integers(0, 64, (3, Q))
    files = {
        "prompt-ids": rng.integers(0, 700, 9),
        "talker-input-embed": rng.standard_normal((T, H)),
        "trailing-text-hidden": rng.standard_normal((2, H)),
        "tts-pad-embed": rng.standard_normal(H),
        "talker-hidden-prefill-l0": rng.standard_normal((T, H)),
        "talker-hidden-prefill-l7": rng.standard_normal((T, H)),
        "talker-hidden-prefill-final": rng.standard_normal((T, H)),
        "talker-logits-prefill": rng.standard_normal(V),
        "codes-step0": codes[0],
        "next-emb-step0": rng.standard_normal(H),
        "talker-hidden-step1": rng.standard_normal(H),
        "codes-full": codes,
        "output-audio": rng.standard_normal(3 * 1920),
        "spk-emb": rng.standard_normal(H),
        "mel-spk": rng.standard_normal((7, 16)),
        "ref-codes": rng.integers(0, 64, (Q, 2)),
    }
    for name, a in files.items():
        write_by_hand(folder / f"{name}.bin", a)
    return files


def test_a_dump_reads_under_our_names_in_execution_order(tmp_path):
    files = a_dump(tmp_path / "dump", np.random.default_rng(0))
    trace = read_qwentts_dump(tmp_path / "dump")
    assert trace.keys == [
        "refimpl.speaker_encoder.mel",
        "speaker_encoder",
        SEMANTIC,
        *[ACOUSTIC.format(j) for j in range(Q - 1)],
        "qwentts.prompt-ids",
        "refimpl.talker.prompt.embeds",
        "refimpl.talker.prompt.trailing",
        "refimpl.talker.prompt.tts_pad",
        "talker.model.layers.0:0",
        "talker.model.layers.7:0",
        "talker.model.norm:0",
        "refimpl.talker.sampling.logits:0",
        "qwentts.next-emb-step0",
        "talker.model.norm:1",
        "refimpl.codes.0",
        "refimpl.waveform.0",
    ]
    f32 = {k: np.asarray(v, np.float32) for k, v in files.items()}
    assert np.array_equal(trace["refimpl.talker.prompt.embeds"], f32["talker-input-embed"][None])
    assert np.array_equal(trace["talker.model.layers.7:0"], f32["talker-hidden-prefill-l7"][None])
    assert np.array_equal(trace["refimpl.talker.sampling.logits:0"], f32["talker-logits-prefill"][None])
    assert np.array_equal(trace["talker.model.norm:1"], f32["talker-hidden-step1"][None, None])
    assert np.array_equal(trace["speaker_encoder"], f32["spk-emb"][None])
    assert trace["refimpl.codes.0"].dtype == np.int64 and np.array_equal(trace["refimpl.codes.0"], files["codes-full"])
    assert np.array_equal(trace[SEMANTIC], files["ref-codes"][:1])
    assert np.array_equal(trace["qwentts.prompt-ids"], files["prompt-ids"])
    assert trace.metadata["qwentts_files"][0] == "mel-spk"


def test_a_file_whose_header_disagrees_with_its_size_is_refused(tmp_path):
    path = tmp_path / "codes-full.bin"
    path.write_bytes(struct.pack("<3i", 2, 3, 4) + b"\0" * 4 * 11)
    with pytest.raises(QwenttsDumpError, match=r"shape \[3, 4\] needs 48 bytes of float32, the file has 44"):
        read_qwentts_bin(path)
    path.write_bytes(struct.pack("<3i", 2, -1, 4))
    with pytest.raises(QwenttsDumpError, match="negative dimension"):
        read_qwentts_bin(path)
    path.write_bytes(struct.pack("<i", 1 << 20))
    with pytest.raises(QwenttsDumpError, match="ndims 1048576"):
        read_qwentts_bin(path)
    path.write_bytes(b"\1\0")
    with pytest.raises(QwenttsDumpError, match="shorter than the dump header"):
        read_qwentts_bin(path)


def test_codes_that_are_not_integers_or_disagree_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    write_by_hand(tmp_path / "a" / "codes-full.bin", [[1.5, 2.0]])
    with pytest.raises(QwenttsDumpError, match="codes-full: holds values that are not integers"):
        read_qwentts_dump(tmp_path / "a")
    (tmp_path / "b").mkdir()
    write_by_hand(tmp_path / "b" / "codes-full.bin", [[1, 2], [3, 4]])
    write_by_hand(tmp_path / "b" / "codes-step0.bin", [1, 3])
    with pytest.raises(QwenttsDumpError, match="codes-step0 is not frame 0 of codes-full"):
        read_qwentts_dump(tmp_path / "b")
    (tmp_path / "c").mkdir()
    write_by_hand(tmp_path / "c" / "talker-input-embed.bin", np.zeros((1, 2, 3)))
    with pytest.raises(QwenttsDumpError, match="qwentts.cpp writes this tensor with 2 axes"):
        read_qwentts_dump(tmp_path / "c")
    (tmp_path / "d").mkdir()
    with pytest.raises(QwenttsDumpError, match="holds no .bin file"):
        read_qwentts_dump(tmp_path / "d")


def test_a_trace_is_written_where_its_cossim_scripts_read_the_official_dumps(tmp_path):
    rng = np.random.default_rng(1)
    trace = tracing.Trace(
        [
            ("refimpl.talker.prompt.embeds", rng.standard_normal((1, T, H))),
            ("talker.model.layers.0:0", rng.standard_normal((1, T, H))),
            ("talker.model.layers.1:0", rng.standard_normal((1, T, H))),  # not one it dumps: left out
            ("talker.codec_head:0", rng.standard_normal((1, T, V))),  # an official hook dump: the last position
            ("talker.model.norm:1", rng.standard_normal((1, 1, H))),
            ("refimpl.codes.0", rng.integers(0, 64, (3, Q))),
            (SEMANTIC, rng.integers(0, 64, (1, 2))),
            (ACOUSTIC.format(0), rng.integers(0, 64, (1, 2))),
        ],
        {},
    )
    paths = write_qwentts_dump(trace, tmp_path / "python" / "customvoice")
    assert sorted(p.name for p in paths) == sorted(
        f"{n}.bin"
        for n in (
            "talker-input-embed",
            "talker-hidden-prefill-l0",
            "talker-logits-prefill",
            "talker-hidden-step1",
            "codes-full",
            "codes-step0",
            "ref-codes",
        )
    )
    folder = tmp_path / "python" / "customvoice"
    f32 = {k: np.asarray(v, np.float32) for k, v in trace.items}  # the format's only type
    assert np.array_equal(read_by_hand(folder / "talker-input-embed.bin"), f32["refimpl.talker.prompt.embeds"][0])
    assert np.array_equal(read_by_hand(folder / "talker-logits-prefill.bin"), f32["talker.codec_head:0"][0, -1])
    assert read_by_hand(folder / "talker-hidden-step1.bin").shape == (H,)
    assert np.array_equal(read_by_hand(folder / "codes-step0.bin"), trace["refimpl.codes.0"][0])
    assert read_by_hand(folder / "ref-codes.bin").shape == (2, 2)


def test_a_real_trace_goes_through_the_dump_and_back_within_float32(tmp_path):
    """Our float64 trace of the tiny model, written as qwentts.cpp's dump and read back, passes compare's
    float32 rule against itself over every tensor of the dump: the names map to the same tensors."""
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice", dtype=np.float64)
    opts = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=4)
    trace = tracing.trace_generation(tts, "say", text="Hi.", speaker="vivian", **opts)
    write_qwentts_dump(trace, tmp_path / "dump")
    back = read_qwentts_dump(tmp_path / "dump")
    report = compare_traces(trace, back, "float32")
    assert len(report.rows) == len(back.keys) == 9  # embeds, trailing, tts_pad, layer 0, norm 0, logits, norm 1, ...
    assert report.passed, [r.key for r in report.rows if not r.ok]
    assert set(QWENTTS_NAMES) >= {"talker-input-embed", "codes-full", "output-audio", "talker-hidden-prefill-l{n}"}
