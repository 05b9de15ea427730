"""GPU timings of the cupy backend, full-size released dimensions (random weights), float32 and float64.

    python benchmarks/bench_gpu.py --out DIR [--parts decode,encode,end_to_end,official] [--frames 125]
                                   [--e2e-frames 25] [--repeats 3]

Run by benchmarks/gpu_check.sh (which also runs the cuda-marked tests).  Measures, each part on its own so
that one failure leaves the others:

    decode       10 s of audio (125 frames) through the released decoder, float32 and float64; the streaming
                 decoder with 5-frame pushes (float32), and its largest difference from the one-pass decode
    encode       10 s of audio through the released encoder, float32 and float64; codes equal to the CPU's
                 (numba backend, float32) counted
    end_to_end   text -> codes -> audio with the 0.6B CustomVoice model, greedy, float32 and (at most 10
                 frames) float64; the greedy codes compared with the CPU's (numba backend, float32; in
                 float64 a differing code can be a float32 near-tie, so that comparison is information)
    official     the official qwen-tts on the same GPU (CUDA PyTorch, float32) for the decode, the encode and
                 the end to end, when ``import qwen_tts, torch`` works and ``torch.cuda.is_available()``:
                 the ratios ours / official

Every time is the best of ``--repeats`` calls after one warm-up call (which compiles the kernels); the
device is synchronised before the clock stops (the public API returns NumPy arrays, so it is anyway).
The results go to DIR/bench_gpu.json, rewritten after every part, and a line per measurement to stdout.
The checkpoints are benchmarks/common.py's (``REFIMPL_BENCH_DIR``, default bench-checkpoints/); the end to
end is skipped when the 0.6B model is not there (gpu_check.sh writes it while the tests run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from common import CACHE, official_available

PARTS = ("decode", "encode", "end_to_end", "official")
TEXT = "Hello, world! This is a tiny text for a tiny tokenizer."
SPEAKER, LANGUAGE = "ryan", "english"
GREEDY = dict(do_sample=False, subtalker_dosample=False)
DTYPES = {"float32": np.float32, "float64": np.float64}


def synchronize() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def timed(fn, repeats: int):
    """(best seconds of ``repeats`` calls after one warm-up call, the last result)."""
    result = fn()
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, result


def test_audio(seconds: float, sr: int = 24000) -> np.ndarray:
    """The tone of bench_codec_encoder.py: harmonics with vibrato, a slow envelope, a little noise (float32)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_codec_encoder import test_audio as tone

    return tone(seconds, sr)


def load_on(backend: str, loader, *args, **kwargs):
    """``loader(*args, **kwargs)`` under ``use_backend(backend)``: the model keeps that backend's arrays."""
    from refimpl import use_backend

    with use_backend(backend):
        return loader(*args, **kwargs)


class Report:
    """The results, written to DIR/bench_gpu.json after every part."""

    def __init__(self, out: Path):
        self.path = out / "bench_gpu.json"
        self.data = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "errors": {},
        }
        self.codes = None  # the decoded codes, decoded again by the official

    def put(self, part: str, key: str, value) -> None:
        self.data.setdefault(part, {})[key] = value
        print(f"[{part}] {key}: {json.dumps(value)}", flush=True)
        self.write()

    def error(self, part: str, exc: BaseException) -> None:
        self.data["errors"][part] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print(f"[{part}] FAILED:\n{traceback.format_exc()}", flush=True)
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


def part_decode(report: Report, args) -> None:
    from common import released_speech_tokenizer

    from refimpl import SpeechTokenizer

    path = released_speech_tokenizer()
    for name, dtype in DTYPES.items():
        t0 = time.perf_counter()
        tok = load_on("cupy", SpeechTokenizer.from_pretrained, path, dtype=dtype)
        load_s = time.perf_counter() - t0
        codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(args.frames, tok.num_quantizers))
        audio_s = args.frames * tok.samples_per_frame / tok.sample_rate
        took, wav = timed(lambda: tok.decode(codes), args.repeats)
        report.put(
            "decode",
            name,
            {
                "frames": args.frames,
                "audio_s": audio_s,
                "seconds": took,
                "x_realtime": audio_s / took,
                "load_s": load_s,
                "output": type(wav).__name__,
            },
        )
        if name == "float32":

            def streamed():
                stream = tok.stream()
                return np.concatenate([stream.push(codes[i : i + 5]) for i in range(0, args.frames, 5)])

            took_s, pieces = timed(streamed, 1)
            report.put(
                "decode",
                "float32_stream_5_frames",
                {
                    "seconds": took_s,
                    "x_realtime": audio_s / took_s,
                    "max_abs_stream_minus_decode": float(np.max(np.abs(pieces - tok.decode_full(codes)))),
                },
            )
            report.codes = codes


def part_encode(report: Report, args) -> None:
    from common import released_speech_tokenizer

    from refimpl import SpeechTokenizer

    path = released_speech_tokenizer()
    audio = test_audio(args.seconds)
    cpu = load_on("numba", SpeechTokenizer.from_pretrained, path, dtype=np.float32)
    t0 = time.perf_counter()
    cpu_codes = cpu.encode(audio, sr=24000)
    cpu_s = time.perf_counter() - t0
    report.put("encode", "cpu_numba_float32", {"seconds": cpu_s, "cpus": os.cpu_count()})
    for name, dtype in DTYPES.items():
        tok = load_on("cupy", SpeechTokenizer.from_pretrained, path, dtype=dtype)
        took, codes = timed(lambda: tok.encode(audio, sr=24000), args.repeats)
        codes, cpu_c = np.asarray(codes), np.asarray(cpu_codes)
        equal = int((codes == cpu_c).sum()) if codes.shape == cpu_c.shape else None
        report.put(
            "encode",
            name,
            {
                "audio_s": args.seconds,
                "seconds": took,
                "x_realtime": args.seconds / took,
                "codes_equal_cpu": equal,
                "codes": int(cpu_c.size),
            },
        )


def part_end_to_end(report: Report, args) -> None:
    from refimpl import Qwen3TTS

    path = CACHE / "released-0.6b-customvoice"
    if not (path / "model.safetensors").is_file() or not (path / "speech_tokenizer").exists():
        report.put("end_to_end", "skipped", f"no 0.6B model in {path.name}/ (gpu_check.sh writes it)")
        return
    cpu = load_on("numba", Qwen3TTS.from_pretrained, path, dtype=np.float32)
    gen = dict(GREEDY, max_new_tokens=args.e2e_frames + 1)

    def run(model, **extra):
        wavs, sr, codes = model.generate_custom_voice(
            TEXT, speaker=SPEAKER, language=LANGUAGE, return_codes=True, **{**gen, **extra}
        )
        return wavs[0], codes[0]

    t0 = time.perf_counter()
    cpu_wav, cpu_codes = run(cpu)
    cpu_s = time.perf_counter() - t0
    report.put("end_to_end", "cpu_numba_float32", {"frames": len(cpu_codes), "seconds": cpu_s, "cpus": os.cpu_count()})
    cpu = None
    for name, dtype in DTYPES.items():
        extra = {} if name == "float32" else {"max_new_tokens": min(args.e2e_frames, 10) + 1}
        t0 = time.perf_counter()
        tts = load_on("cupy", Qwen3TTS.from_pretrained, path, dtype=dtype)
        load_s = time.perf_counter() - t0
        took, (wav, codes) = timed(lambda: run(tts, **extra), 1 if name == "float64" else args.repeats)
        n = len(codes)
        same = codes.shape == cpu_codes[:n].shape and bool(np.array_equal(codes, cpu_codes[:n]))  # a prefix
        report.put(
            "end_to_end",
            name,
            {
                "frames": n,
                "audio_s": len(wav) / 24000,
                "seconds": took,
                "ms_per_frame": 1000 * took / max(n, 1),
                "x_realtime": (len(wav) / 24000) / took,
                "load_s": load_s,
                "greedy_codes_equal_cpu_float32": same,
                "max_abs_wav_minus_cpu": float(np.max(np.abs(wav - cpu_wav[: len(wav)])))
                if same and name == "float32"
                else None,
            },
        )
        tts = None  # frees the device memory before the next precision loads


def part_official(report: Report, args) -> None:
    if not official_available():
        report.put("official", "skipped", "import qwen_tts, torch failed: no official side by side")
        return
    import torch

    if not torch.cuda.is_available():
        report.put("official", "skipped", f"torch {torch.__version__} sees no CUDA device")
        return
    from common import released_speech_tokenizer
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer

    device = "cuda:0"
    report.put("official", "torch", {"version": torch.__version__, "device": torch.cuda.get_device_name(0)})

    def on_gpu(cls, path):
        """The official class loaded onto the GPU: device_map (needs accelerate), else loaded and moved."""
        try:
            return cls.from_pretrained(str(path), dtype=torch.float32, device_map=device)
        except (ImportError, ValueError) as e:
            print(f"[official] device_map={device!r} failed ({e}): loading on the CPU and moving the model")
            official = cls.from_pretrained(str(path), dtype=torch.float32)
            official.model.to(device)
            official.device = torch.device(device)
            return official

    def official_timed(fn, repeats):
        def call():
            with torch.inference_mode():
                out = fn()
            torch.cuda.synchronize()
            return out

        call()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = call()
            best = min(best, time.perf_counter() - t0)
        return best, out

    path = released_speech_tokenizer()
    off_tok = on_gpu(Qwen3TTSTokenizer, path)
    codes = report.codes if report.codes is not None else np.random.default_rng(0).integers(0, 2048, (args.frames, 16))
    codes_t = torch.from_numpy(codes).to(device)
    took, _ = official_timed(lambda: off_tok.decode([{"audio_codes": codes_t}]), args.repeats)
    audio_s = len(codes) * 1920 / 24000
    ours = report.data.get("decode", {}).get("float32", {}).get("seconds")
    report.put(
        "official",
        "decode_float32",
        {"seconds": took, "x_realtime": audio_s / took, "ratio_ours_over_official": ours / took if ours else None},
    )
    audio = test_audio(args.seconds)
    took, _ = official_timed(lambda: off_tok.encode(audio, sr=24000), args.repeats)
    ours = report.data.get("encode", {}).get("float32", {}).get("seconds")
    report.put(
        "official",
        "encode_float32",
        {"seconds": took, "x_realtime": args.seconds / took, "ratio_ours_over_official": ours / took if ours else None},
    )
    off_tok = None
    model_path = CACHE / "released-0.6b-customvoice"
    if not (model_path / "model.safetensors").is_file():
        return
    off = on_gpu(Qwen3TTSModel, model_path)
    gen = dict(GREEDY, max_new_tokens=args.e2e_frames + 1)
    took, (wavs, _) = official_timed(
        lambda: off.generate_custom_voice(TEXT, speaker=SPEAKER, language=LANGUAGE, **gen), args.repeats
    )
    ours = report.data.get("end_to_end", {}).get("float32", {})
    report.put(
        "official",
        "end_to_end_float32",
        {
            "seconds": took,
            "audio_s": len(wavs[0]) / 24000,
            "ratio_ours_over_official": ours["seconds"] / took if ours.get("seconds") else None,
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu-results"))
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--frames", type=int, default=125, help="decoded frames (125: 10 s of audio)")
    ap.add_argument("--seconds", type=float, default=10.0, help="encoded audio seconds")
    ap.add_argument("--e2e-frames", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose among {', '.join(PARTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    from refimpl.backends import cupy_cuda

    try:
        report.put("device", "cupy", cupy_cuda.available())
    except cupy_cuda.BackendUnavailable as e:
        report.data["errors"]["device"] = str(e)
        report.write()
        print(f"no GPU run: {e}")
        return 2
    for part in parts:
        t0 = time.perf_counter()
        try:
            globals()[f"part_{part}"](report, args)
        except Exception as e:  # one failed part leaves the others
            report.error(part, e)
        print(f"[{part}] done in {time.perf_counter() - t0:.0f} s", flush=True)
    report.write()
    return 1 if report.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
