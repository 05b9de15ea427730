"""Record which sampling settings the official wrapper uses: call argument, generation_config.json, or its
built-in default -> golden/generation_defaults.json.

    .oracle-venv/bin/python golden/oracle/record_generation_defaults.py

The tiny CustomVoice checkpoint is copied (links to its files) with a generation_config.json of our own
that sets only some keys (``CONFIG``), and with an empty one (``{}``; the official loader refuses a
checkpoint without the file).  For each case the public
``Qwen3TTSModel.generate_custom_voice`` is called with some keywords given, some left out and some
passed as None; ``model.generate`` (what the wrapper hands the merged settings to) is wrapped to record
the ten settings it receives.  Where those settings are greedy (the config or the call turns sampling
off) the generated codes are recorded too, so a test can check that the settings really drive the run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from common import CHECKPOINTS, GOLDEN, np, to_numpy, torch, versions  # noqa: I001
from qwen_tts import Qwen3TTSModel

KEYS = (
    "do_sample",
    "top_k",
    "top_p",
    "temperature",
    "repetition_penalty",
    "subtalker_dosample",
    "subtalker_top_k",
    "subtalker_top_p",
    "subtalker_temperature",
    "max_new_tokens",
)

# some keys only: the others must come from the official built-in defaults
CONFIG = {
    "do_sample": False,
    "subtalker_dosample": False,
    "top_k": 7,
    "temperature": 0.5,
    "repetition_penalty": 1.3,
    "max_new_tokens": 5,
}

TEXT = dict(text="Hello, world!", speaker="vivian", language="english")

# name -> (checkpoint: "config" (with CONFIG) or "empty" (generation_config.json is {}), call keywords)
CASES = {
    "neither": ("config", {}),
    "call_wins": ("config", {"max_new_tokens": 4, "repetition_penalty": 1.0, "top_p": 0.5}),
    "call_none": ("config", {"max_new_tokens": None, "top_k": None, "repetition_penalty": None}),
    "empty_config": ("empty", {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": 3}),
}


def checkpoint_copy(root: Path, name: str) -> Path:
    """tiny-customvoice with CONFIG ("config") or {} ("empty") as its generation_config.json."""
    source = CHECKPOINTS / "tiny-customvoice"
    target = root / name
    target.mkdir()
    for entry in source.iterdir():
        if entry.name != "generation_config.json":
            os.symlink(entry, target / entry.name)
    config = CONFIG if name == "config" else {}
    (target / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


def record_case(model, call: dict) -> dict:
    seen = {}
    original = model.model.generate

    def generate(*args, **kwargs):
        seen.update({k: kwargs[k] for k in KEYS})
        return original(*args, **kwargs)

    model.model.generate = generate
    try:
        with torch.inference_mode():
            _, _ = model.generate_custom_voice(**TEXT, **call)
    finally:
        model.model.generate = original
    return seen


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="generation-defaults-"))
    try:
        models = {
            name: Qwen3TTSModel.from_pretrained(str(checkpoint_copy(root, name)), dtype=torch.float32)
            for name in ("config", "empty")
        }
        codes_of = {}
        for model in models.values():
            model.model.eval()
            original = model.model.generate

            def generate(*args, _original=original, **kwargs):
                codes, hiddens = _original(*args, **kwargs)
                codes_of["last"] = [to_numpy(c).astype(np.int64).tolist() for c in codes]
                return codes, hiddens

            model.model.generate = generate
        cases = {}
        for name, (checkpoint, call) in CASES.items():
            used = record_case(models[checkpoint], call)
            entry = {"checkpoint": checkpoint, "call": call, "used": used}
            if not used["do_sample"] and not used["subtalker_dosample"]:
                entry["codes"] = codes_of["last"][0]
            cases[name] = entry
            print(name, used, len(entry.get("codes", [])), "frames")
    finally:
        shutil.rmtree(root)
    out = {"versions": versions(), "text": TEXT, "generation_config": CONFIG, "cases": cases}
    path = GOLDEN / "generation_defaults.json"
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
