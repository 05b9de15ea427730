"""Write the committed tiny synthetic checkpoints (seeded random weights, real layout and names).

    python golden/make_checkpoints.py

Deterministic: rerunning it rewrites byte-identical files.  Needs only refimpl (no torch).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from refimpl import presets, synthetic  # noqa: E402

CHECKPOINTS = HERE / "checkpoints"


def main() -> None:
    synthetic.write_speech_tokenizer(CHECKPOINTS / "tiny-speech-tokenizer", presets.preset(presets.TINY_SPEECH_TOKENIZER),
                                     seed=1234)
    print("wrote", CHECKPOINTS / "tiny-speech-tokenizer")
    from refimpl import speaker  # the Base models' speaker encoder, standalone (same tensors, same seed)
    speaker.write_speaker_encoder(CHECKPOINTS / "tiny-speaker-encoder", presets.preset(presets.TINY_SPEAKER_ENCODER),
                                  seed=1234)
    print("wrote", CHECKPOINTS / "tiny-speaker-encoder")
    # the tiny text tokenizer (vocab.json + merges.txt + tokenizer_config.json, released format)
    synthetic.write_tiny_text_tokenizer(CHECKPOINTS / "tiny-text-tokenizer")
    print("wrote", CHECKPOINTS / "tiny-text-tokenizer")


if __name__ == "__main__":
    main()
