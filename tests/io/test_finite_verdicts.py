"""The store of finiteness verdicts (refimpl/io/finite_verdicts.py): a second load of an unchanged checkpoint
file does not read its weights again for the check; anything changed, racy, damaged or unwritable is checked
as before, with the same errors."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import CHECKPOINTS

from refimpl import Qwen3TTS, SpeechTokenizer
from refimpl.io import checkpoint, finite_verdicts
from refimpl.io.checkpoint import (
    CheckpointError,
    WeightSpec,
    check_weights,
    read_safetensors_file,
    write_safetensors_file,
)

POISONED = "decoder.pre_conv.conv.bias"  # a tensor of the tiny codec's file (float32, read from the map)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store of this test's own; files copied a moment ago count as old enough to remember (the racy
    rule has its own test)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("REFIMPL_CACHE_DIR", str(folder))
    monkeypatch.setattr(finite_verdicts, "RACY_NS", 0)
    return folder / "finite"


@pytest.fixture
def checked(monkeypatch):
    """The names each finiteness check reads (one list per call of ``non_finite_tensors``)."""
    calls = []
    real = checkpoint.non_finite_tensors

    def spy(weights, names, *args, **kwargs):
        calls.append(list(names))
        return real(weights, names, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "non_finite_tensors", spy)
    return calls


def read_names(calls) -> int:
    names = sum(len(c) for c in calls)
    calls.clear()
    return names


def copy_codec(tmp_path):
    target = tmp_path / "codec"
    shutil.copytree(CHECKPOINTS / "tiny-speech-tokenizer", target)
    return target


def store_files(store) -> list:
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def load_error(directory) -> str:
    with pytest.raises(CheckpointError) as info:
        SpeechTokenizer.from_pretrained(directory)
    return str(info.value)


def poison_in_place(path, name, value=np.nan):
    """``name``'s first value set to ``value`` in the file itself (same inode, same size), and its mtime moved
    a second on, so that the stamp changes even where the file system's clock is coarse."""
    header, data_start = checkpoint._read_header(path)
    assert header[name]["dtype"] == "F32"
    begin = header[name]["data_offsets"][0]
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(data_start + begin)
        f.write(np.array([value], "<f4").tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_ino == before.st_ino


def test_a_second_load_of_an_unchanged_file_reads_no_weight_for_the_check(tmp_path, store, checked):
    d = copy_codec(tmp_path)
    first = SpeechTokenizer.from_pretrained(d)
    assert read_names(checked) == len(first.decoder_weights) and len(store_files(store)) == 1
    second = SpeechTokenizer.from_pretrained(d)
    assert read_names(checked) == 0
    assert second.decoder_weights.keys() == first.decoder_weights.keys()
    for name, arr in first.decoder_weights.items():
        np.testing.assert_array_equal(second.decoder_weights[name], arr)
    codes = np.zeros((3, second.num_quantizers), np.int64)
    np.testing.assert_array_equal(second.decode(codes), first.decode(codes))
    second._load_encoder()  # the encoder's tensors: the same file, added to its verdict
    assert read_names(checked) > 0
    SpeechTokenizer.from_pretrained(d)._load_encoder()
    assert read_names(checked) == 0 and len(store_files(store)) == 1


def test_a_whole_model_loads_again_without_the_check(tmp_path, store, checked):
    d = tmp_path / "model"
    shutil.copytree(CHECKPOINTS / "tiny-base", d)
    first = Qwen3TTS.from_pretrained(d)
    assert read_names(checked) > 0 and len(store_files(store)) == 2  # the model's file and its codec's
    second = Qwen3TTS.from_pretrained(d)
    assert read_names(checked) == 0
    for name, arr in first.talker.weights.items():
        np.testing.assert_array_equal(np.asarray(second.talker.weights[name]), np.asarray(arr))


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_file_rewritten_with_a_nan_is_checked_again(tmp_path, store, monkeypatch, how):
    d = copy_codec(tmp_path)
    SpeechTokenizer.from_pretrained(d)  # remembered finite
    path = d / "model.safetensors"
    if how == "in place":
        poison_in_place(path, POISONED)
    else:
        tensors = {k: np.array(v) for k, v in read_safetensors_file(path).items()}
        tensors[POISONED][0] = np.nan
        write_safetensors_file(path, tensors)
    with_store = load_error(d)
    monkeypatch.setenv("REFIMPL_CACHE_DIR", "off")
    assert with_store == load_error(d)
    assert r"holding NaN or infinity (1): pre_conv.conv.bias" in with_store


def test_a_bad_tensor_is_never_recorded(tmp_path, store, checked):
    d = copy_codec(tmp_path)
    poison_in_place(d / "model.safetensors", POISONED, np.inf)
    first = load_error(d)
    [name] = store_files(store)
    remembered = json.loads((store / name).read_text())["finite"]
    assert POISONED not in remembered and len(remembered) > 0
    assert load_error(d) == first
    assert checked[-1] == ["pre_conv.conv.bias"]  # the second time, only the tensor not remembered


def test_a_racy_stamp_is_not_recorded(tmp_path, monkeypatch, checked):
    """A file changed within RACY_NS of its reading (here: just copied) is checked at every load."""
    monkeypatch.setenv("REFIMPL_CACHE_DIR", str(tmp_path / "cache"))
    d = copy_codec(tmp_path)
    SpeechTokenizer.from_pretrained(d)
    SpeechTokenizer.from_pretrained(d)
    assert not (tmp_path / "cache").exists()
    assert len(checked) == 2 and checked[0] == checked[1] and checked[0]


def test_a_stamp_that_moves_during_the_check_is_not_recorded(tmp_path, store, monkeypatch):
    d = copy_codec(tmp_path)
    real = checkpoint.non_finite_tensors

    def touching(weights, names, *args, **kwargs):
        os.utime(d / "model.safetensors")  # the file changes while it is checked
        return real(weights, names, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "non_finite_tensors", touching)
    SpeechTokenizer.from_pretrained(d)
    assert store_files(store) == []


def write_store(store, text: bytes | str) -> None:
    [name] = store_files(store)
    (store / name).write_bytes(text.encode() if isinstance(text, str) else text)


def edited(key, value):
    def edit(data):
        return json.dumps(dict(data, **{key: value}))

    return edit


BAD_STORE_FILES = {
    "not JSON": lambda data: b"\x00\xffnot json",
    "not an object": lambda data: json.dumps([data]),
    "too large": lambda data: json.dumps(dict(data, padding="x" * finite_verdicts.MAX_STORE_BYTES)),
    "another format": edited("format", 2),
    "another file's": edited("path", "/elsewhere/model.safetensors"),
    "another stamp": lambda data: json.dumps(dict(data, stamp=[data["stamp"][0] + 1, *data["stamp"][1:]])),
    "a stamp of booleans": lambda data: json.dumps(dict(data, stamp=[True] * 5)),
    "names not strings": edited("finite", [1, 2]),
    "names not a list": edited("finite", "pre_conv.conv.bias"),
    "deeply nested": lambda data: "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("damage", sorted(BAD_STORE_FILES))
def test_a_damaged_or_foreign_store_file_is_ignored(tmp_path, store, checked, damage):
    d = copy_codec(tmp_path)
    SpeechTokenizer.from_pretrained(d)
    everything = read_names(checked)
    [name] = store_files(store)
    write_store(store, BAD_STORE_FILES[damage](json.loads((store / name).read_text())))
    SpeechTokenizer.from_pretrained(d)
    assert read_names(checked) == everything


def test_a_directory_in_place_of_the_store_file_is_ignored(tmp_path, store, checked):
    d = copy_codec(tmp_path)
    SpeechTokenizer.from_pretrained(d)
    everything = read_names(checked)
    [name] = store_files(store)
    (store / name).unlink()
    (store / name).mkdir()
    for _ in range(2):  # not read, and not replaced (a failed write is ignored)
        SpeechTokenizer.from_pretrained(d)
        assert read_names(checked) == everything


def test_an_unwritable_store_folder_loads_and_records_nothing(tmp_path, monkeypatch, checked):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("REFIMPL_CACHE_DIR", str(blocker))  # its finite/ cannot be made
    monkeypatch.setattr(finite_verdicts, "RACY_NS", 0)
    d = copy_codec(tmp_path)
    for _ in range(2):
        SpeechTokenizer.from_pretrained(d)
        assert read_names(checked) > 0
    assert blocker.read_text() == "" and sorted(os.listdir(tmp_path)) == ["a file", "codec"]


@pytest.mark.parametrize("value", ["off", "0", "no", "FALSE"])
def test_the_store_can_be_turned_off(tmp_path, monkeypatch, checked, value):
    monkeypatch.setenv("REFIMPL_CACHE_DIR", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(finite_verdicts, "RACY_NS", 0)
    d = copy_codec(tmp_path)
    for _ in range(2):
        SpeechTokenizer.from_pretrained(d)
        assert read_names(checked) > 0
    assert finite_verdicts.directory() is None and sorted(os.listdir(tmp_path)) == ["codec"]


def test_where_the_store_is(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for unset in ("", " "):
        monkeypatch.setenv("REFIMPL_CACHE_DIR", unset)
        assert finite_verdicts.directory() == tmp_path / "xdg" / "refimpl" / "finite"
    monkeypatch.delenv("REFIMPL_CACHE_DIR")
    assert finite_verdicts.directory() == tmp_path / "xdg" / "refimpl" / "finite"
    monkeypatch.setenv("REFIMPL_CACHE_DIR", str(tmp_path / "mine"))
    assert finite_verdicts.directory() == tmp_path / "mine" / "finite"


def test_only_the_files_own_read_only_words_are_remembered(tmp_path, store, checked):
    """A bfloat16 matrix's words (a view of the map, or their copy) are covered; a tensor converted on reading
    (a writeable copy), or any array a caller puts in the dict, is checked at every load."""
    rng = np.random.default_rng(0)
    tensors = {"m.weight": rng.standard_normal((8, 16)), "v.bias": rng.standard_normal(16)}
    path = tmp_path / "m.safetensors"
    write_safetensors_file(path, {k: v.astype(np.float32) for k, v in tensors.items()}, "bfloat16")
    spec = [WeightSpec(name, arr.shape) for name, arr in tensors.items()]
    for huge_pages in (False, True, False):
        check_weights(read_safetensors_file(path, keep_bf16=True, huge_pages=huge_pages), spec, "net")
    assert checked == [["m.weight", "v.bias"], ["v.bias"], ["v.bias"]]
    checked.clear()
    check_weights(read_safetensors_file(path, np.float64), spec, "net")  # converted: writeable copies
    assert checked == [["m.weight", "v.bias"]]
    checked.clear()
    weights = read_safetensors_file(path, keep_bf16=True)
    bad = weights["m.weight"].bits.copy()  # the caller's own array: checked
    bad[0, 0] = 0x7FC0  # NaN
    weights["m.weight"] = type(weights["m.weight"])(bad)
    with pytest.raises(CheckpointError, match=r"holding NaN or infinity \(1\): m.weight"):
        check_weights(weights, spec, "net")
