"""Damaged and hostile checkpoints: every variant is made from a copy of a tiny committed checkpoint and must
give one CheckpointError that names the file and the problem (never a TypeError, a wrong tensor, or a read
outside the file)."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from conftest import CHECKPOINTS, read_or_named_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl import SpeechTokenizer
from refimpl.io.checkpoint import CheckpointError, read_checkpoint_weights, read_safetensors_file
from refimpl.porting import presets, synthetic

SOURCE = CHECKPOINTS / "tiny-speech-tokenizer"


def copy_checkpoint(tmp_path, source=SOURCE):
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def split_file(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join_file(path, header, data: bytes):
    head = json.dumps(header).encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def edit_header(path, edit):
    """Rewrite a safetensors file's header, changed in place by ``edit(header)``, keeping the data bytes."""
    header, data = split_file(path)
    edit(header)
    join_file(path, header, data)


def first_two(header):
    """The two tensors stored first (same shape [64] in the tiny decoder)."""
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    return names[0], names[2]


def assert_checkpoint_error(directory, *fragments):
    with pytest.raises(CheckpointError) as info:
        SpeechTokenizer.from_pretrained(directory)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_the_committed_checkpoint_loads(tmp_path):
    d = copy_checkpoint(tmp_path)
    assert SpeechTokenizer.from_pretrained(d).decode(np.zeros((1, 16), np.int64)).shape == (1920,)


def test_negative_begin_offset(tmp_path):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(data_offsets=[-8, 248]))
    assert_checkpoint_error(d, "model.safetensors", name, "non-negative")


def test_overlapping_tensors(tmp_path):
    d = copy_checkpoint(tmp_path)
    header, _ = split_file(d / "model.safetensors")
    a, b = first_two(header)

    def alias(h):
        h[b]["data_offsets"] = list(h[a]["data_offsets"])

    edit_header(d / "model.safetensors", alias)
    assert_checkpoint_error(d, "overlap", a)


def test_gap_between_tensors(tmp_path):
    d = copy_checkpoint(tmp_path)
    header, data = split_file(d / "model.safetensors")
    a, _ = first_two(header)
    for info in header.values():  # move every tensor 8 bytes on, leaving 8 bytes that belong to no tensor
        if isinstance(info, dict) and "data_offsets" in info:
            info["data_offsets"] = [o + 8 for o in info["data_offsets"]]
    join_file(d / "model.safetensors", header, b"\0" * 8 + data)
    assert_checkpoint_error(d, "belong to no tensor", a)


def test_truncated_data(tmp_path):
    d = copy_checkpoint(tmp_path)
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[:-4])
    assert_checkpoint_error(d, "model.safetensors", "run past the end of the data")


def test_trailing_bytes(tmp_path):
    d = copy_checkpoint(tmp_path)
    with open(d / "model.safetensors", "ab") as f:
        f.write(b"\0" * 16)
    assert_checkpoint_error(d, "model.safetensors", "truncated or padded")


def test_header_length_past_the_end(tmp_path):
    d = copy_checkpoint(tmp_path)
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[:8] = struct.pack("<Q", 2**63)
    (d / "model.safetensors").write_bytes(bytes(raw))
    assert_checkpoint_error(d, "header length", "past the end of the file")


def test_float_tensor_relabelled_as_integers(tmp_path):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(dtype="I32"))
    assert_checkpoint_error(d, "stored as integers", "decoder.0.conv.bias (int32)")


def test_dtype_and_byte_count_disagree(tmp_path):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(dtype="F64"))
    assert_checkpoint_error(d, name, "holds 256 bytes", "needs 512")


def test_shape_and_byte_count_disagree(tmp_path):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(shape=[65]))
    assert_checkpoint_error(d, name, "needs 260")


@pytest.mark.parametrize("dtype", ["F8", "complex64", 7, None])
def test_unknown_dtype(tmp_path, dtype):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(dtype=dtype))
    assert_checkpoint_error(d, name, "unsupported dtype")


@pytest.mark.parametrize("key", ["dtype", "shape", "data_offsets"])
def test_entry_lacks_a_key(tmp_path, key):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].pop(key))
    assert_checkpoint_error(d, name, f"lacks {key}")


@pytest.mark.parametrize(
    "bad",
    [
        {"shape": [-64]},
        {"shape": "64"},
        {"shape": [64.0]},
        {"data_offsets": [0]},
        {"data_offsets": [256, 0]},
        {"data_offsets": [0, True]},
    ],
)
def test_malformed_shape_or_offsets(tmp_path, bad):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h[name].update(bad))
    assert_checkpoint_error(d, name, next(iter(bad)))


@pytest.mark.parametrize("header", [[], "x", 3, None])
def test_header_is_not_a_json_object(tmp_path, header):
    d = copy_checkpoint(tmp_path)
    _, data = split_file(d / "model.safetensors")
    join_file(d / "model.safetensors", header, data)
    assert_checkpoint_error(d, "model.safetensors", "must be a JSON object")


def test_header_entry_is_not_an_object(tmp_path):
    d = copy_checkpoint(tmp_path)
    name = "decoder.decoder.0.conv.bias"
    edit_header(d / "model.safetensors", lambda h: h.update({name: [0, 256]}))
    assert_checkpoint_error(d, name, "must be a JSON object")


def test_header_not_utf8(tmp_path):
    d = copy_checkpoint(tmp_path)
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[9] = 0xFF
    (d / "model.safetensors").write_bytes(bytes(raw))
    assert_checkpoint_error(d, "model.safetensors", "malformed safetensors header")


# ----------------------------------------------------------------------------- shards and JSON files


def sharded(tmp_path):
    config = presets.preset(presets.TINY_SPEECH_TOKENIZER)
    d = tmp_path / "sharded"
    synthetic.write_speech_tokenizer(d, config, seed=3, max_shard_bytes=400_000)
    shards = sorted(d.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    return d, shards


def test_shard_path_outside_the_directory(tmp_path):
    d, shards = sharded(tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(shards[0], outside)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        if shard == shards[0].name:
            index["weight_map"][name] = "../outside.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_checkpoint_error(d, "model.safetensors.index.json", "'../outside.safetensors'", "not a file name inside")


@pytest.mark.parametrize("shard", ["/etc/passwd", "sub/model.safetensors", "..", ""])
def test_shard_names_that_are_not_plain_file_names(tmp_path, shard):
    d, _ = sharded(tmp_path)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_checkpoint_error(d, repr(shard), "not a file name inside")


def test_two_shards_define_the_same_tensor(tmp_path):
    d, shards = sharded(tmp_path)
    header0, data0 = split_file(shards[0])
    header1, data1 = split_file(shards[1])
    name = next(k for k in header0 if k != "__metadata__")
    info = dict(header0[name])
    begin, end = info["data_offsets"]
    info["data_offsets"] = [len(data1), len(data1) + end - begin]
    header1[name] = info
    join_file(shards[1], header1, data1 + data0[begin:end])
    assert_checkpoint_error(d, name, "defined twice", shards[0].name, shards[1].name)


def test_index_lists_a_tensor_under_the_wrong_shard(tmp_path):
    d, shards = sharded(tmp_path)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name = next(n for n, s in index["weight_map"].items() if s == shards[0].name)
    index["weight_map"][name] = shards[1].name
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_checkpoint_error(d, name, f"listed in {shards[1].name}", f"is in {shards[0].name}")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[]", "expected a JSON object"),
        ("{", "not valid JSON"),
        ('{"weight_map": []}', "weight_map must be"),
        ('{"weight_map": {"a": 3}}', "not a file name"),
    ],
)
def test_malformed_index(tmp_path, text, fragment):
    d, _ = sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(text)
    assert_checkpoint_error(d, "model.safetensors.index.json", fragment)


@pytest.mark.parametrize(
    "raw, fragment",
    [(b"[1, 2]", "expected a JSON object"), (b'{"a": ', "not valid JSON"), (b'{"a": "\xff\xfe"}', "not valid UTF-8")],
)
def test_malformed_config_json_names_the_file(tmp_path, raw, fragment):
    d = copy_checkpoint(tmp_path)
    (d / "config.json").write_bytes(raw)
    assert_checkpoint_error(d, "config.json", fragment)


# ----------------------------------------------------------------------------- fuzzing


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_are_refused_cleanly(tmp_path, blob):
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(blob)
    read_or_named_error(read_safetensors_file, path, CheckpointError)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.text(max_size=5),
        st.one_of(
            st.none(),
            st.integers(-(2**70), 2**70),
            st.text(max_size=4),
            st.fixed_dictionaries(
                {
                    "dtype": st.sampled_from(["F32", "I64", "BF16", "X"]),
                    "shape": st.lists(st.integers(-2, 2**40), max_size=3),
                    "data_offsets": st.lists(st.integers(-10, 2**63), max_size=3),
                }
            ),
        ),
        max_size=4,
    ),
    st.binary(max_size=64),
)
def test_random_headers_are_refused_cleanly(tmp_path, header, data):
    """Whatever the header says, reading either gives tensors that lie inside the data section or one
    CheckpointError; never another exception."""
    path = tmp_path / "fuzz.safetensors"
    join_file(path, header, data)
    out = read_or_named_error(read_safetensors_file, path, CheckpointError)
    if out is None:
        return
    assert sum(a.nbytes for a in out.values()) <= len(data) * 2  # float16 widens to float32


def test_read_checkpoint_weights_checks_before_reading(tmp_path):
    """The header check runs for tensors that were not asked for, too."""
    d = copy_checkpoint(tmp_path)
    edit_header(d / "model.safetensors", lambda h: h["decoder.decoder.0.conv.bias"].update(data_offsets=[0, 8]))
    with pytest.raises(CheckpointError, match="decoder.0.conv.bias"):
        read_checkpoint_weights(d, prefix="encoder.")


def test_deeply_nested_header_is_a_named_error(tmp_path):
    """A header nested past Python's recursion limit: a CheckpointError naming the file, not RecursionError."""
    d = copy_checkpoint(tmp_path)
    head = b'{"__metadata__": {"x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
    assert_checkpoint_error(d, "model.safetensors", "nested more than 64 levels deep")


def test_weight_file_that_is_a_device_is_refused(tmp_path):
    d = copy_checkpoint(tmp_path)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to("/dev/zero")
    # /dev/zero is not a regular file: is_file() is False, so the checkpoint has no weight file at all
    assert_checkpoint_error(d, "no model.safetensors")
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_safetensors_file(d / "model.safetensors")


def test_a_failed_checkpoint_write_keeps_the_previous_file(tmp_path):
    """write_safetensors_file under a file-size limit: the previous file stays whole, no temporary left."""
    import resource
    import signal
    import subprocess
    import sys

    from conftest import REPO

    target = tmp_path / "w.safetensors"
    target.write_bytes(b"previous")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

    script = (
        "import sys, numpy as np\n"
        "from refimpl.io.checkpoint import write_safetensors_file\n"
        "write_safetensors_file(sys.argv[1], {'w': np.ones(1 << 16, np.float32)})\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(target)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=limit,
    )
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
