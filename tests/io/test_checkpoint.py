"""Checkpoint reading: safetensors by hand (bf16 included), shards, and clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import CHECKPOINTS
from safetensors.numpy import load_file, save_file

from refimpl import Qwen3TTS, SpeechTokenizer
from refimpl.backends.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from refimpl.io.checkpoint import (
    CheckpointError,
    WeightSpec,
    WeightView,
    check_weights,
    read_checkpoint_weights,
    read_safetensors_file,
    write_safetensors_file,
)
from refimpl.porting import presets, synthetic


def test_reads_what_the_safetensors_library_writes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float16),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
        "d": np.float32(2.5) * np.ones((0, 2), np.float32),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"))
    out = read_safetensors_file(tmp_path / "x.safetensors", np.float64)
    assert out["a"].dtype == np.float64 and out["c"].dtype == np.int64
    np.testing.assert_array_equal(out["a"], tensors["a"].astype(np.float64))
    np.testing.assert_array_equal(out["b"], tensors["b"].astype(np.float64))
    np.testing.assert_array_equal(out["c"], tensors["c"])
    assert out["d"].shape == (0, 2)


def test_what_we_write_is_read_by_the_safetensors_library(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"w": rng.standard_normal((7, 3)).astype(np.float32), "i": np.arange(4, dtype=np.int64)}
    write_safetensors_file(tmp_path / "y.safetensors", tensors)
    back = load_file(str(tmp_path / "y.safetensors"))
    np.testing.assert_array_equal(back["w"], tensors["w"])
    np.testing.assert_array_equal(back["i"], tensors["i"])


def test_bfloat16_rounding_and_widening():
    # exactly representable values survive; others round to nearest, ties to even (torch's rule)
    x = np.array([1.0, -2.5, 0.0, 3.0e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, np.inf, -np.inf], dtype=np.float32)
    back = bf16_bits_to_float32(float32_to_bf16_bits(x))
    expected = np.array([1.0, -2.5, 0.0, 2.9975e38, 1.0, 1.0 + 4 * 2**-8, 1.0, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_allclose(back[:3], expected[:3])
    assert back[4] == np.float32(1.0)  # halfway between 1 and 1 + 2^-7: ties to even (1.0)
    assert back[5] == np.float32(1.0 + 2**-6)  # halfway, rounds to the even neighbour 1 + 2^-6
    assert back[6] == np.float32(1.0)
    assert np.isinf(back[7]) and np.isinf(back[8])
    assert np.isnan(bf16_bits_to_float32(float32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    rng = np.random.default_rng(2)
    y = rng.standard_normal(10000).astype(np.float32)
    rel = np.abs(bf16_bits_to_float32(float32_to_bf16_bits(y)) - y) / np.abs(y)
    assert rel.max() <= 2**-8  # half an ulp of an 8-bit mantissa


def test_bf16_checkpoint_in_real_layout_loads(tmp_path):
    """A bf16 speech tokenizer (the released checkpoints are bf16) decodes like the f32 one rounded to bf16."""
    config = presets.preset(presets.TINY_SPEECH_TOKENIZER)
    synthetic.write_speech_tokenizer(tmp_path / "bf16", config, seed=5, dtype="bfloat16")
    with open(tmp_path / "bf16" / "model.safetensors", "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    w = read_checkpoint_weights(tmp_path / "bf16", np.float32, prefix="decoder.")
    ref = synthetic.random_weights(synthetic.speech_tokenizer_weight_spec(config), seed=5)
    name = "pre_conv.conv.weight"
    np.testing.assert_array_equal(w[name], bf16_bits_to_float32(float32_to_bf16_bits(ref["decoder." + name])))
    tok = SpeechTokenizer.from_pretrained(tmp_path / "bf16")
    assert tok.decode(np.zeros((2, 16), dtype=np.int64)).shape == (3840,)


def test_checkpoints_written_before_the_keys_only_ports_read_read_alike(tmp_path):
    """talker_config.position_id_per_seconds and the decoder's num_semantic_quantizers /
    vector_quantization_hidden_dimension (the released files have them, our synthetic ones since they were
    added to presets.py) are kept in the configs' ``extra`` and read by nothing: a checkpoint without them,
    as written before, gives the same codes and audio."""
    old = tmp_path / "tiny-customvoice"
    shutil.copytree(CHECKPOINTS / "tiny-customvoice", old)
    for path, section, keys in (
        (old / "config.json", "talker_config", ["position_id_per_seconds"]),
        (
            old / "speech_tokenizer" / "config.json",
            "decoder_config",
            ["num_semantic_quantizers", "vector_quantization_hidden_dimension"],
        ),
    ):
        config = json.loads(path.read_text())
        for key in keys:
            del config[section][key]
        path.write_text(json.dumps(config))
    runs = []
    for directory in (CHECKPOINTS / "tiny-customvoice", old):
        m = Qwen3TTS.from_pretrained(directory)
        extras = (m.config.talker_config.extra, m.speech_tokenizer.decoder_config.extra)
        wavs, _, codes = m.generate_custom_voice(
            "Hi.", "vivian", "english", max_new_tokens=4, return_codes=True, do_sample=False, subtalker_dosample=False
        )
        runs.append((extras, wavs[0], codes[0]))
    (new_extras, *new_out), (old_extras, *old_out) = runs
    assert new_extras == (
        {"position_id_per_seconds": presets.RELEASED_POSITION_ID_PER_SECONDS},
        {"num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": 32},
    )
    assert old_extras == ({}, {})
    for a, b in zip(new_out, old_out, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sharded_checkpoint_equals_single_file(tmp_path):
    config = presets.preset(presets.TINY_SPEECH_TOKENIZER)
    synthetic.write_speech_tokenizer(tmp_path / "one", config, seed=3)
    synthetic.write_speech_tokenizer(tmp_path / "many", config, seed=3, max_shard_bytes=200_000)
    shards = sorted(p.name for p in (tmp_path / "many").glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "many" / "model.safetensors.index.json").is_file()
    a = read_checkpoint_weights(tmp_path / "one")
    b = read_checkpoint_weights(tmp_path / "many")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    codes = np.random.default_rng(0).integers(0, 64, (3, 16))
    np.testing.assert_array_equal(
        SpeechTokenizer.from_pretrained(tmp_path / "one").decode(codes),
        SpeechTokenizer.from_pretrained(tmp_path / "many").decode(codes),
    )


def test_full_model_directory_with_speech_tokenizer_subfolder(tmp_path, tiny_speech_tokenizer_dir):
    import shutil

    shutil.copytree(tiny_speech_tokenizer_dir, tmp_path / "model" / "speech_tokenizer")
    (tmp_path / "model" / "config.json").write_text("{}")
    tok = SpeechTokenizer.from_pretrained(tmp_path / "model")
    assert tok.directory.name == "speech_tokenizer"


def test_weight_problems_are_listed_by_name():
    spec = [WeightSpec("a", (2, 3)), WeightSpec("b", (4,)), WeightSpec("c", (1,))]
    weights = {"a": np.zeros((3, 2)), "b": np.zeros(4), "zzz": np.zeros(1)}
    with pytest.raises(CheckpointError) as e:
        check_weights(weights, spec, "my net")
    msg = str(e.value)
    assert "missing tensors (1): c [1]" in msg and "a: expected [2, 3], found [3, 2]" in msg and "zzz" in msg


def test_missing_and_damaged_files_give_clear_errors(tmp_path, tiny_speech_tokenizer_dir):
    with pytest.raises(CheckpointError, match="does not exist"):
        SpeechTokenizer.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        SpeechTokenizer.from_pretrained(tmp_path / "empty")
    import shutil

    d = tmp_path / "broken"
    shutil.copytree(tiny_speech_tokenizer_dir, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        SpeechTokenizer.from_pretrained(d)
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(CheckpointError, match="malformed safetensors header"):
        SpeechTokenizer.from_pretrained(d)
    # a tensor missing from an otherwise valid file
    w = read_checkpoint_weights(tiny_speech_tokenizer_dir)
    del w["decoder.pre_conv.conv.bias"]
    write_safetensors_file(d / "model.safetensors", w)
    with pytest.raises(CheckpointError, match="missing tensors.*pre_conv.conv.bias"):
        SpeechTokenizer.from_pretrained(d)


def test_dtype_option(tiny_speech_tokenizer_dir):
    with pytest.raises(ValueError, match="float32 or numpy.float64"):
        SpeechTokenizer.from_pretrained(tiny_speech_tokenizer_dir, dtype=np.float16)


def test_synthetic_weights_are_deterministic_per_name():
    spec = [WeightSpec("x", (3, 4)), WeightSpec("y", (5,), "norm")]
    a = synthetic.random_weights(spec, seed=9)
    b = synthetic.random_weights(list(reversed(spec))[:1], seed=9)
    np.testing.assert_array_equal(a["y"], b["y"])
    assert not np.array_equal(a["x"], synthetic.random_weights(spec, seed=10)["x"])


def test_stray_tensors_are_reported(tmp_path, tiny_speech_tokenizer_dir):
    import shutil

    d = tmp_path / "stray"
    shutil.copytree(tiny_speech_tokenizer_dir, d)
    w = read_checkpoint_weights(tiny_speech_tokenizer_dir)
    w["vocoder.extra.weight"] = np.zeros(3, np.float32)
    write_safetensors_file(d / "model.safetensors", w)
    with pytest.raises(CheckpointError, match="unexpected tensors.*vocoder.extra.weight"):
        SpeechTokenizer.from_pretrained(d)
    w = read_checkpoint_weights(tiny_speech_tokenizer_dir)
    w["decoder.pre_conv.conv.extra"] = np.zeros(3, np.float32)  # inside a network: check_weights names it
    write_safetensors_file(d / "model.safetensors", w)
    with pytest.raises(CheckpointError, match="unexpected tensors.*pre_conv.conv.extra"):
        SpeechTokenizer.from_pretrained(d)


def test_sharded_bf16_full_model_loads_like_the_released_layout(tmp_path):
    """A full model re-saved as bf16 shards with an index (how the 1.7B release ships) generates the same
    greedy codes as the same weights in one bf16 file."""
    import shutil

    from conftest import CHECKPOINTS

    from refimpl import Qwen3TTS

    src = CHECKPOINTS / "tiny-base"
    one, many = tmp_path / "one", tmp_path / "many"
    for d in (one, many):
        shutil.copytree(src, d)
        (d / "model.safetensors").unlink()
    tensors = read_checkpoint_weights(src)
    synthetic.write_checkpoint(one, None, tensors, dtype="bfloat16")
    synthetic.write_checkpoint(many, None, tensors, dtype="bfloat16", max_shard_bytes=150_000)
    assert len(list(many.glob("model-*-of-*.safetensors"))) > 2
    prompt = dict(
        text="Sharded.",
        ref_audio=(np.sin(np.arange(12000) / 9.0).astype(np.float32), 24000),
        x_vector_only_mode=True,
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=6,
        return_codes=True,
    )
    _, _, codes_one = Qwen3TTS.from_pretrained(one).generate_voice_clone(**prompt)
    _, _, codes_many = Qwen3TTS.from_pretrained(many).generate_voice_clone(**prompt)
    np.testing.assert_array_equal(codes_one[0], codes_many[0])
    assert codes_one[0].shape[1] == 16


@pytest.mark.parametrize("huge_pages", ["1", "0"])
def test_bf16_matrices_kept_as_their_stored_words(tmp_path, monkeypatch, huge_pages):
    """keep_bf16: every 2-D bfloat16 tensor is a BF16Matrix holding exactly the stored 16-bit words
    (copied unchanged into huge-page anonymous memory, or a view of the map with REFIMPL_HUGE_PAGES=0 and
    for the embedding tables),
    read-only; 1-D bf16 tensors are widened; other dtypes unchanged."""
    from refimpl.backends import host_memory
    from refimpl.backends.bf16 import BF16Matrix

    monkeypatch.setenv("REFIMPL_HUGE_PAGES", huge_pages)
    rng = np.random.default_rng(4)
    tensors = {
        "a.weight": rng.standard_normal((33, 70)).astype(np.float32),
        "b.norm": rng.standard_normal(70).astype(np.float32),
        "c.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "d.empty": np.zeros((0, 4), np.float32),
        "e.embedding.weight": rng.standard_normal((9, 4)).astype(np.float32),
    }
    write_safetensors_file(tmp_path / "m.safetensors", tensors, "bfloat16")
    out = read_safetensors_file(tmp_path / "m.safetensors", np.float32, keep_bf16=True)
    for name in ("a.weight", "c.weight", "d.empty", "e.embedding.weight"):
        assert isinstance(out[name], BF16Matrix)
        np.testing.assert_array_equal(out[name].bits, float32_to_bf16_bits(tensors[name]))
        assert not out[name].bits.flags.writeable
    for name in ("a.weight", "c.weight"):
        assert _view_of_the_file(out[name].bits) == (huge_pages == "0")
    assert _view_of_the_file(out["e.embedding.weight"].bits)  # a lookup table stays mapped
    assert not any(isinstance(out[n].bits, np.memmap) for n in ("a.weight", "e.embedding.weight"))  # plain views
    np.testing.assert_array_equal(out["b.norm"], bf16_bits_to_float32(float32_to_bf16_bits(tensors["b.norm"])))
    assert host_memory.huge_pages_enabled() == (huge_pages == "1")
    if huge_pages == "1":  # one region for the file, each matrix on a cache line, the region on a 2 MB boundary
        first = out["a.weight"].bits.ctypes.data
        assert first % host_memory.HUGE_PAGE_BYTES == 0 and out["c.weight"].bits.ctypes.data % 64 == 0


def _view_of_the_file(a) -> bool:
    """Whether array ``a``'s memory is a memory map of the file (an ``np.memmap`` among its bases)."""
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = getattr(a, "base", None)
    return False


def _rss_file_bytes() -> int:
    """This process's resident pages of mapped files (Linux ``/proc/self/status``)."""
    return 1024 * int(next(line for line in open("/proc/self/status") if line.startswith("RssFile:")).split()[1])


def test_the_finiteness_check_gives_back_a_lookup_tables_pages(tmp_path):
    """A memory-mapped embedding table is read whole by the load's finiteness check, then its pages are given
    back (the process's mapped-file memory does not grow by the table), its values unchanged and read
    again on use; a table holding a NaN is still named."""
    from refimpl.io import checkpoint

    rng = np.random.default_rng(5)
    table = rng.standard_normal((4096, 1024)).astype(np.float32)  # 8 MB of bf16 words
    write_safetensors_file(tmp_path / "m.safetensors", {"x.embedding.weight": table}, "bfloat16")
    out = read_safetensors_file(tmp_path / "m.safetensors", np.float32, keep_bf16=True)
    words = out["x.embedding.weight"].bits
    before = _rss_file_bytes()
    assert checkpoint.non_finite_tensors(out, ["x.embedding.weight"], span=1 << 20) == []
    assert _rss_file_bytes() - before < words.nbytes // 4
    np.testing.assert_array_equal(words, float32_to_bf16_bits(table))  # read again from the file
    assert checkpoint.release_pages(words) and not checkpoint.release_pages(np.asarray(table))
    table[4000, 7] = np.nan
    write_safetensors_file(tmp_path / "n.safetensors", {"x.embedding.weight": table}, "bfloat16")
    bad = read_safetensors_file(tmp_path / "n.safetensors", np.float32, keep_bf16=True)
    assert checkpoint.non_finite_tensors(bad, ["x.embedding.weight"], span=1 << 20) == ["x.embedding.weight"]


def test_a_view_of_a_view_reads_the_same_dict():
    """A stage takes the weights dict or a view of it: a view made from a view (and ``layer_views`` of a view)
    holds the whole dict and the whole prefix, as the numba backend's fused stack reads them."""
    from refimpl.transformer import layer_views

    weights = {"model.layers.1.mlp.fc1.weight": np.ones(2)}
    model = WeightView(weights, "model.")
    layer = WeightView(model, "layers.1.")
    assert layer.weights is weights and layer.prefix == "model.layers.1."
    assert layer["mlp.fc1.weight"] is weights["model.layers.1.mlp.fc1.weight"]
    assert WeightView(layer).sub("mlp.").prefix == "model.layers.1.mlp."
    views = layer_views(model, "layers.", 2)
    assert all(v.weights is weights for v in views)
    assert [v.prefix for v in views] == ["model.layers.0.", "model.layers.1."]


def test_the_finiteness_check_reads_host_and_device_words_alike():
    """A bf16 matrix's words on the host (one buffer for their exponents) and on a device (the device's own
    arrays: the strict test backend) get the same verdicts, span by span: NaN and infinity found wherever
    they lie, finite words passed."""
    from refimpl.backends import REGISTRY
    from refimpl.backends.bf16 import BF16Matrix
    from refimpl.io.checkpoint import non_finite_tensors

    device = REGISTRY["strict"]
    device.load()
    finite = np.full((4, 64), 0x3F80, np.uint16)  # 1.0
    for special in (0x7FC0, 0xFF80, 0x7F80):  # NaN, -inf, +inf
        bad = finite.copy()
        bad[3, 63] = special  # in the last span
        for move in (np.asarray, device.to_device):
            weights = {"bad.weight": BF16Matrix(move(bad)), "good.weight": BF16Matrix(move(finite))}
            assert non_finite_tensors(weights, ["good.weight", "bad.weight"], span=100) == ["bad.weight"]
