"""Name maps (refimpl/porting/name_maps.py): a port's own names, shapes and last-position dumps compared
with the official keys through ``refimpl compare --map``."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import CHECKPOINTS, GOLDEN

from refimpl import Qwen3TTS, SpeechTokenizer
from refimpl.cli import main
from refimpl.porting import trace_files as tracing
from refimpl.porting.name_maps import NameMap, parse_selector

MAP = {
    "tensors": {
        "blk.{i}.ffn_out": "talker.model.layers.{i}.mlp:0",
        "step{n}.logits_last": {"key": "talker.codec_head:{n}", "select": "0, -1"},
        "embd": {"key": "refimpl.talker.prompt.embeds", "reshape": [1, -1, 32]},
        "codes": "refimpl.codes.0",
    }
}
TOML = """
[tensors]
"blk.{i}.ffn_out" = "talker.model.layers.{i}.mlp:0"
"codes" = "refimpl.codes.0"

[tensors."step{n}.logits_last"]
key = "talker.codec_head:{n}"
select = "0, -1"

[tensors.embd]
key = "refimpl.talker.prompt.embeds"
reshape = [1, -1, 32]
"""


@pytest.fixture(scope="module")
def reference():
    tts = Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-customvoice")
    opts = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=4)
    return tracing.trace_generation(tts, "say", text="Hi.", speaker="vivian", **opts)


def port_dump(reference, layer_scale: float = 1.0) -> tracing.Trace:
    """What a port dumps: its own names, no batch axis, the logits of the last position only, a flat
    embedding, and a codes array."""
    items = [
        (f"blk.{i}.ffn_out", reference[f"talker.model.layers.{i}.mlp:0"][0] * np.float32(s))
        for i, s in ((0, 1.0), (1, layer_scale))
    ]
    items += [(f"step{n}.logits_last", reference[f"talker.codec_head:{n}"][0, -1]) for n in range(3)]
    items += [("embd", reference["refimpl.talker.prompt.embeds"].reshape(-1)), ("codes", reference["refimpl.codes.0"])]
    return tracing.Trace(items, {})


@pytest.mark.parametrize("form", ["json", "toml"])
def test_a_map_with_patterns_selectors_and_reshapes(reference, tmp_path, capsys, form):
    if form == "toml" and sys.version_info < (3, 11):
        pytest.skip("TOML maps need tomllib (Python >= 3.11)")
    path = tmp_path / f"map.{form}"
    path.write_text(json.dumps(MAP) if form == "json" else TOML)
    reference.save(tmp_path / "ref.safetensors")
    port_dump(reference).save(tmp_path / "port.safetensors")
    args = ["compare", str(tmp_path / "ref.safetensors"), str(tmp_path / "port.safetensors"), "--map", str(path)]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    compared = [r["key"] for r in report["rows"]]
    assert set(compared) == {
        "talker.model.layers.0.mlp:0",
        "talker.model.layers.1.mlp:0",
        "talker.codec_head:0[0, -1]",
        "talker.codec_head:1[0, -1]",
        "talker.codec_head:2[0, -1]",
        "refimpl.talker.prompt.embeds",
        "refimpl.codes.0",
    }
    assert report["missing_in_reference"] == []
    assert any("singleton axes" in n for n in report["notes"]) and any(
        "renamed by the map" in n for n in report["notes"]
    )
    # a bug in the port's layer 1 is found under the official name
    port_dump(reference, layer_scale=1.01).save(tmp_path / "port.safetensors")
    assert main(args + ["--json"]) == 1
    assert json.loads(capsys.readouterr().out)["first_failure"] == "talker.model.layers.1.mlp:0"


def test_a_prefix_hint_and_the_prefix_rules(tmp_path, capsys):
    tok = SpeechTokenizer.from_pretrained(CHECKPOINTS / "tiny-speech-tokenizer")
    trace = tracing.trace_codec_decode(tok, np.load(GOLDEN / "trace" / "inputs.npz")["codes"])
    unprefixed = [(k[len("decoder.") :], v) for k, v in trace.items if k.startswith("decoder.")]
    tracing.Trace(unprefixed, {}).save(tmp_path / "port.npz")
    official = str(GOLDEN / "trace" / "official_codec_decode.safetensors")
    assert main(["compare", official, str(tmp_path / "port.npz")]) == 2
    err = capsys.readouterr().err
    assert "no key in common" in err and "prefix 'decoder.' added" in err and '"add_prefix": "decoder."' in err
    (tmp_path / "map.json").write_text(json.dumps({"add_prefix": "decoder."}))
    assert main(["compare", official, str(tmp_path / "port.npz"), "--map", str(tmp_path / "map.json")]) == 0


def test_bad_maps_get_one_clear_error(reference, tmp_path, capsys):
    assert parse_selector("..., 1:3, -1") == (Ellipsis, slice(1, 3), -1)
    for bad in ("", "a", "1:2:3:4", "..., ..."):
        with pytest.raises(ValueError, match="selector"):
            parse_selector(bad)
    for data, message in (
        ({"tensors": {"x": {"key": "k", "shape": [1]}}}, "unknown field"),
        ({"tensors": {"x": "a.{i}"}}, "does not define"),
        ({"tensors": {"x": {"key": "k", "reshape": [0]}}}, "reshape"),
        ({"renames": {}}, "unknown field"),
        ([], "an object"),
    ):
        with pytest.raises(ValueError, match=message):
            NameMap(data)
    twice = NameMap({"tensors": {"a": "refimpl.codes.0", "b": "refimpl.codes.0"}})
    with pytest.raises(ValueError, match="both map to refimpl.codes.0"):
        twice.apply(reference, tracing.Trace([("a", np.zeros(1)), ("b", np.zeros(1))], {}))
    misfit = NameMap({"tensors": {"a": {"key": "refimpl.codes.0", "select": "0, 0, 0"}}})
    with pytest.raises(ValueError, match="does not fit"):
        misfit.apply(reference, tracing.Trace([("a", np.zeros(1))], {}))
    (tmp_path / "m.json").write_text("{not json")
    reference.save(tmp_path / "ref.safetensors")
    ref = str(tmp_path / "ref.safetensors")
    assert main(["compare", ref, ref, "--map", str(tmp_path / "m.json")]) == 2
    assert "m.json is not valid JSON" in capsys.readouterr().err
