"""Write the committed tiny synthetic checkpoints (seeded random weights, real layout and names).

    python golden/make_checkpoints.py

Deterministic: rerunning it rewrites byte-identical files.  Needs only refimpl (no torch).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from refimpl.porting import presets, synthetic  # noqa: E402

CHECKPOINTS = HERE / "checkpoints"
EMBEDDED = HERE.parent / "refimpl" / "data"


def main() -> None:
    synthetic.write_speech_tokenizer(
        CHECKPOINTS / "tiny-speech-tokenizer", presets.preset(presets.TINY_SPEECH_TOKENIZER), seed=1234
    )
    print("wrote", CHECKPOINTS / "tiny-speech-tokenizer")
    synthetic.write_speaker_encoder(
        CHECKPOINTS / "tiny-speaker-encoder", presets.preset(presets.TINY_SPEAKER_ENCODER), seed=1234
    )
    print("wrote", CHECKPOINTS / "tiny-speaker-encoder")
    # the tiny text tokenizer (vocab.json + merges.txt + tokenizer_config.json, released format)
    synthetic.write_tiny_text_tokenizer(CHECKPOINTS / "tiny-text-tokenizer")
    print("wrote", CHECKPOINTS / "tiny-text-tokenizer")
    # full models (talker + code predictor [+ speaker encoder], tokenizer, generation_config.json,
    # speech_tokenizer/ identical to tiny-speech-tokenizer); VoiceDesign stored in bfloat16
    for kind, seed, dtype in (
        ("customvoice", 101, "float32"),
        ("voicedesign", 102, "bfloat16"),
        ("base", 1234, "float32"),
    ):
        m = presets.TINY_TTS_MODELS[kind]
        synthetic.write_tts_model(
            CHECKPOINTS / f"tiny-{kind}",
            m["tts_model_type"],
            m["tts_model_size"],
            presets.preset(m["talker"]),
            m.get("speaker_encoder"),
            seed=seed,
            dtype=dtype,
        )
        print("wrote", CHECKPOINTS / f"tiny-{kind}")
        # the same model, byte for byte, embedded in the package as the default of the command line
        # (refimpl/data is package data; tests/cli/test_cli.py checks the two copies stay identical)
        synthetic.write_tts_model(
            EMBEDDED / f"default-{kind}",
            m["tts_model_type"],
            m["tts_model_size"],
            presets.preset(m["talker"]),
            m.get("speaker_encoder"),
            seed=seed,
            dtype=dtype,
        )
        print("wrote", EMBEDDED / f"default-{kind}")


if __name__ == "__main__":
    main()
