"""The x-vector of 10 s of audio with the released 0.6B-Base speaker encoder dimensions (enc_dim 1024,
random weights, bf16 on disk).

    python benchmarks/bench_speaker_encoder.py [--seconds 10] [--repeats 7]

Prints our time (log-mel spectrogram + ECAPA-TDNN, and the mel share); when the official package is
importable (the oracle environment, golden/README.md), runs its speaker encoder module on the same
checkpoint and audio in the same process (the official ``extract_speaker_embedding`` path: its
``mel_spectrogram`` then ``Qwen3TTSSpeakerEncoder``, float32), the two sides taking turns
(``common.alternate``), and prints the ratio our best time / its best time and the largest difference
between the two x-vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import types

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from bench_codec_encoder import test_audio
from common import alternate, best_time, official_available, released_speaker_encoder

PREFIX = "speaker_encoder."


def official_encoder(path):
    """The official speaker-encoder module with the checkpoint's weights (float32 parameters)."""
    from qwen_tts.core.models import modeling_qwen3_tts as mq
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())["speaker_encoder_config"]
    module = mq.Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**config))
    state = {k[len(PREFIX) :]: v for k, v in load_file(str(path / "model.safetensors")).items() if k.startswith(PREFIX)}
    module.load_state_dict(state, strict=True)
    return module.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    from refimpl.tts.speaker_encoder import SpeakerEncoder

    path = released_speaker_encoder()
    enc = SpeakerEncoder.from_pretrained(path)
    audio = test_audio(args.seconds)
    mel_t, _ = best_time(lambda: enc.mels(audio), args.repeats)
    if not official_available():
        ours_t, ours = best_time(lambda: enc.embed(audio), args.repeats)
        print_ours(args.seconds, ours_t, ours, mel_t)
        print("official qwen-tts not importable: no side-by-side ratio (run in the oracle environment)")
        return
    import torch
    from qwen_tts.core.models import modeling_qwen3_tts as mq

    owner = types.SimpleNamespace(
        speaker_encoder=official_encoder(path), device=torch.device("cpu"), dtype=torch.float32
    )

    def official():
        with torch.inference_mode():
            return mq.Qwen3TTSForConditionalGeneration.extract_speaker_embedding(owner, audio=audio, sr=24000).numpy()

    ours_t, off_t, results = alternate(lambda: enc.embed(audio), official, args.repeats)
    ours, off = results["ours"], results["official"]
    print_ours(args.seconds, ours_t, ours, mel_t)
    print(
        f"official x-vector: {off_t:.3f} s, RTF {off_t / args.seconds:.4f}  (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    print(
        f"ratio refimpl / official: {ours_t / off_t:.2f}   max |refimpl - official| = "
        f"{np.max(np.abs(ours - off)):.2e} (x-vector max {np.max(np.abs(off)):.3g})"
    )


def print_ours(seconds: float, ours_t: float, ours, mel_t: float) -> None:
    print(
        f"refimpl  x-vector of {seconds:g} s audio (enc_dim {ours.shape[0]}, {os.cpu_count()} cpus): "
        f"{ours_t:.3f} s, RTF {ours_t / seconds:.4f} (of which the log-mel spectrogram {mel_t:.3f} s)"
    )


if __name__ == "__main__":
    main()
