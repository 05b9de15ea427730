"""Fill CuPy's kernel cache before the GPU tests start their processes side by side.

    python benchmarks/gpu_warmup.py [--backend cupy|strict]

Every twin of refimpl/backends/cupy_cuda/ and every CuPy operation the stages use is compiled (NVRTC) the
first time it runs, and CuPy keeps the result on disk (``CUPY_CACHE_DIR``, default ~/.cupy/kernel_cache):
this runs the tiny committed models once on the device, in float32 and float64 (decode, streaming decode,
encode, the speaker encoder, greedy generation), so that the parity processes that benchmarks/gpu_check.sh
starts at once load compiled kernels instead of each compiling the same 100-250.  Prints what ran, the
seconds, and the number of files in the kernel cache before and after.  Exit status 2 when the backend
cannot run here (no CuPy, no device: what is missing is printed), 1 when a part failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TINY = REPO / "golden" / "checkpoints"


def cache_files() -> int | None:
    """The number of files in CuPy's on-disk kernel cache (None where the folder does not exist yet)."""
    folder = Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else None


def warm(dtype) -> None:
    from refimpl import Qwen3TTS, SpeechTokenizer

    tok = SpeechTokenizer.from_pretrained(TINY / "tiny-speech-tokenizer", dtype=dtype)
    codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(9, tok.num_quantizers))
    tok.decode(codes)
    stream = tok.stream()
    for i in range(0, 9, 4):
        stream.push(codes[i : i + 4])
    audio = (0.3 * np.sin(np.arange(12000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
    tok.encode(audio, sr=24000)
    tts = Qwen3TTS.from_pretrained(TINY / "tiny-customvoice", dtype=dtype)
    tts.generate_custom_voice(
        "Warm up.", speaker="vivian", language="english", do_sample=False, subtalker_dosample=False, max_new_tokens=3
    )
    base = Qwen3TTS.from_pretrained(TINY / "tiny-base", dtype=dtype)
    base.extract_speaker_embedding(audio, 24000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cupy", choices=("cupy", "strict"), help="strict: a CPU dry run")
    args = ap.parse_args()
    from refimpl.backends import BackendUnavailable, use_backend

    before = cache_files()
    try:
        scope = use_backend(args.backend)
        scope.__enter__()
    except BackendUnavailable as e:
        print(f"warm-up skipped: {e}")
        return 2
    failed = False
    try:
        for dtype in (np.float32, np.float64):
            t0 = time.perf_counter()
            try:
                warm(dtype)
                print(f"warm-up {np.dtype(dtype).name} on {args.backend}: {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception:
                failed = True
                print(f"warm-up {np.dtype(dtype).name} FAILED:\n{traceback.format_exc()}", flush=True)
    finally:
        scope.__exit__(None, None, None)
    print(f"kernel cache files: {before} before, {cache_files()} after")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
