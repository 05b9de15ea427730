"""The model-directory layouts of the text-tokenizer golden file, shared by the oracle recorder
(golden/oracle/record_text_tokenizer.py) and the tests (tests/tts/test_text_tokenizer.py), so that both
build exactly the same directories.  Needs no torch.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from refimpl.porting import synthetic

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
REAL_MERGES = CHECKPOINTS / "qwen3-text-bpe" / "merges.txt.xz"
TINY_DIR = CHECKPOINTS / "tiny-text-tokenizer"
RELEASED_CONFIG = {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}
OLDER_CONFIG = {"model_type": "qwen3_tts", "transformers_version": "4.57.1"}

# name -> (vocabulary, write tokenizer.json?, config.json contents or None)
LAYOUTS = {
    "tiny": ("tiny", False, RELEASED_CONFIG),
    "tiny_tokenizer_json": ("tiny", True, RELEASED_CONFIG),
    "real_released": ("real", False, RELEASED_CONFIG),
    "real_tokenizer_json": ("real", True, RELEASED_CONFIG),
    "real_config_4_57_1": ("real", False, OLDER_CONFIG),
    "real_no_config": ("real", False, None),
}


def read_real_merges() -> list:
    """The real Qwen BPE merges (committed compressed; the first line of merges.txt is a header)."""
    with lzma.open(REAL_MERGES, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [tuple(line.split(" ")) for line in lines[1:] if line]


def write_layout(directory: Path, name: str, real_merges: list | None = None) -> None:
    """Write layout ``name`` into ``directory`` (``real_merges`` may be passed to avoid re-reading them)."""
    vocab_kind, with_json, config = LAYOUTS[name]
    if vocab_kind == "tiny":
        synthetic.write_tiny_text_tokenizer(directory, tokenizer_json=with_json)
    else:
        merges = real_merges if real_merges is not None else read_real_merges()
        synthetic.write_text_tokenizer(directory, merges, synthetic.QWEN3_TTS_ADDED_TOKENS, tokenizer_json=with_json)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
