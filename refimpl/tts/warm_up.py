"""A model's kernels compiled by running its code predictor's frame and its codec decoder on zeros: the work
of a first run's helper process (``refimpl/backends/numba_cpu/compile_helper.py``), which a model's load starts
on a first run on the machine as ``python -m refimpl.tts.warm_up MODEL`` (``model.warm_up_command``).  What
it computes is thrown away; the kernels it compiles stay in Numba's cache, where the process that started it
finds them."""

from __future__ import annotations

import sys

import numpy as np

from ..backends import use_backend
from .model import STREAM_CHUNK_FRAMES, Qwen3TTS

WHOLE_DECODE_FRAMES = 30  # a whole decode as a sentence's: its pieces long enough to be shared out by time


def main(argv: list[str] | None = None) -> int:
    """The model ``argv[0]`` (a directory) loaded on the numba backend, then a code predictor's frame, then the
    decoder's streamed pushes and a whole decode, on zeros."""
    (directory,) = sys.argv[1:] if argv is None else argv
    with use_backend("numba"):
        tts = Qwen3TTS.from_pretrained(directory)
        code_predictor_frame(tts.talker)
        decoder_pushes(tts.speech_tokenizer)
    return 0


def code_predictor_frame(talker) -> None:
    """Codes 1 to 15 of one frame from a zero hidden state and code 0 (the code predictor's packing, its
    first step over two positions, its later steps and heads)."""
    hidden_bc = np.zeros((1, talker.cfg.hidden_size), dtype=np.float32)
    code0_bc = talker.embed_codec(np.zeros(1, dtype=np.int64))
    talker.code_predictor.predict_frame(hidden_bc, code0_bc, lambda g, logits_bv: np.zeros(1, dtype=np.int64))


def decoder_pushes(speech_tokenizer) -> None:
    """The decoder's streamed pushes of the default schedule's first chunks (1, 2 and 4 frames) and a whole
    decode of ``WHOLE_DECODE_FRAMES``, of code 0 everywhere."""
    stream = speech_tokenizer.stream()
    for frames in STREAM_CHUNK_FRAMES:
        stream.push(np.zeros((frames, speech_tokenizer.num_quantizers), dtype=np.int64))
    speech_tokenizer.decode(np.zeros((WHOLE_DECODE_FRAMES, speech_tokenizer.num_quantizers), dtype=np.int64))


if __name__ == "__main__":
    sys.exit(main())
