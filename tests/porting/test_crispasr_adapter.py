"""The CrispASR dump adapter (refimpl/porting/adapters/crispasr.py): its qwen3-tts debug dumps read under our
names, and our codes written as its replay file. The dump files here are written by the tests from the
format's description (the module docstring: raw little-endian float32 or int32, no header), never copied from
CrispASR."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.porting.adapters.crispasr import (
    CRISPASR_NAMES,
    CrispasrDumpError,
    read_crispasr_dump,
    read_crispasr_file,
    write_replay_codes,
)

T, H, V, VC, FRAMES = 5, 8, 12, 6, 2  # prompt positions, Talker width, its vocabulary, predictor's, frames


def raw(path, array, dtype="<f4") -> None:
    path.write_bytes(np.asarray(array).astype(dtype).tobytes())


def a_dump(tmp_path, rng) -> tuple:
    """The files of a two-frame custom-voice run with DUMP_DIR and DUMP_LOGITS set, as the format lays them out."""
    dump, logits = tmp_path / "dump", tmp_path / "logits"
    dump.mkdir()
    logits.mkdir()
    arrays = {"prompt": rng.standard_normal((T, H)), "codes": rng.integers(0, 64, (FRAMES, 16))}
    raw(dump / "icl_prefill.bin", arrays["prompt"])
    for f in range(FRAMES):
        arrays[f"logits{f}"] = rng.standard_normal(V)
        raw(logits / f"talker_s00_{f:04d}.f32", arrays[f"logits{f}"])
        raw(logits / f"talker_s01_{f:04d}.f32", rng.standard_normal(V))  # a second synthesis: not read
        for k in range(15):
            arrays[f"cp{f}.{k}"] = rng.standard_normal(VC)
            raw(dump / f"cp_f{f:03d}_step{k:02d}_logits.bin", arrays[f"cp{f}.{k}"])
            raw(dump / f"cp_f{f:03d}_step{k:02d}_embed.bin", rng.standard_normal(2 * H if k == 0 else H))
            raw(dump / f"cp_f{f:03d}_step{k:02d}_id.bin", [arrays["codes"][f, k + 1]], "<i4")
    raw(dump / "talker_prefill_logits.bin", arrays["logits0"])
    raw(dump / "generated_codes_s00.bin", arrays["codes"].reshape(-1), "<i4")
    raw(dump / "generated_codes_s01.bin", rng.integers(0, 64, 16), "<i4")
    return dump, logits, arrays


def test_a_dump_reads_under_our_names_in_execution_order(tmp_path):
    dump, logits, arrays = a_dump(tmp_path, np.random.default_rng(0))
    trace = read_crispasr_dump(dump, hidden=H, logits_dir=logits)
    keys = trace.keys
    assert keys[0] == "refimpl.talker.prompt.embeds" and keys[-1] == "refimpl.codes.0"
    np.testing.assert_array_equal(trace["refimpl.talker.prompt.embeds"], arrays["prompt"][None].astype(np.float32))
    np.testing.assert_array_equal(trace["refimpl.codes.0"], arrays["codes"])
    for f in range(FRAMES):
        logits_key = f"refimpl.talker.sampling.logits:{f}"
        assert trace[logits_key].shape == (1, V)
        np.testing.assert_array_equal(trace[logits_key][0], arrays[f"logits{f}"].astype(np.float32))
        for k in range(15):
            key = f"refimpl.talker.code_predictor.sampling.logits:{15 * f + k}"
            np.testing.assert_array_equal(trace[key][0], arrays[f"cp{f}.{k}"].astype(np.float32))
            assert keys.index(logits_key) < keys.index(key)  # the frame's Talker call, then its predictor's
        assert trace[f"crispasr.cp_f{f:03d}_step00_embed"].shape == (2 * H,)
        assert trace[f"crispasr.cp_f{f:03d}_step01_id"].dtype == np.int64
    assert "crispasr.talker_prefill_logits" not in keys  # frame 0's logits, checked equal
    assert trace.metadata["producer"] == "CrispASR qwen3-tts dump"
    assert set(CRISPASR_NAMES.values()) >= {"refimpl.talker.prompt.embeds", "refimpl.codes.0"}


def test_teacher_forcing_keeps_what_did_not_see_our_history_out_of_the_grade(tmp_path):
    dump, logits, _ = a_dump(tmp_path, np.random.default_rng(1))
    trace = read_crispasr_dump(dump, hidden=H, logits_dir=logits, teacher_forced=True)
    graded = [k for k in trace.keys if not k.startswith("crispasr.")]
    assert "refimpl.codes.0" not in graded and "crispasr.replayed_codes" in trace.keys
    assert [k for k in graded if "code_predictor" in k] == [
        f"refimpl.talker.code_predictor.sampling.logits:{15 * f}" for f in range(FRAMES)
    ]
    second = read_crispasr_dump(dump, hidden=H, logits_dir=logits, synthesis=1)
    assert second["refimpl.codes.0"].shape == (1, 16)


def test_without_the_width_or_the_logits_folder(tmp_path):
    dump, _, arrays = a_dump(tmp_path, np.random.default_rng(2))
    trace = read_crispasr_dump(dump)
    assert trace["crispasr.icl_prefill"].shape == (T * H,)
    np.testing.assert_array_equal(trace["crispasr.talker_prefill_logits"], arrays["logits0"].astype(np.float32))


def test_bad_dumps_are_named(tmp_path):
    dump, logits, _ = a_dump(tmp_path, np.random.default_rng(3))
    with pytest.raises(CrispasrDumpError, match="rows of 7"):
        read_crispasr_dump(dump, hidden=7, logits_dir=logits)
    (dump / "talker_prefill_logits.bin").write_bytes(np.zeros(V, "<f4").tobytes())  # another synthesis's: kept aside
    assert "crispasr.talker_prefill_logits" in read_crispasr_dump(dump, hidden=H, logits_dir=logits).keys
    (dump / "odd.bin").write_bytes(b"abc")
    with pytest.raises(CrispasrDumpError, match="whole number of 4-byte"):
        read_crispasr_file(dump / "odd.bin")
    with pytest.raises(CrispasrDumpError, match="not a folder"):
        read_crispasr_dump(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CrispasrDumpError, match="holds no file"):
        read_crispasr_dump(empty)


def test_the_replay_file(tmp_path):
    codes = np.arange(32, dtype=np.int64).reshape(2, 16)
    path = write_replay_codes(codes, tmp_path / "replay.txt")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and [int(v) for v in lines[1].split()] == list(range(16, 32))
    for bad in (codes[:, :15], codes.astype(np.float32), -codes):
        with pytest.raises(CrispasrDumpError):
            write_replay_codes(bad, tmp_path / "bad.txt")
