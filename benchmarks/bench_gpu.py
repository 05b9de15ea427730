"""GPU timings of the cupy backend, full-size released dimensions (random weights), float32 and float64.

    python benchmarks/bench_gpu.py --out DIR [--parts decode,encode,end_to_end,official] [--frames 125]
                                   [--e2e-frames 25] [--repeats 3] [--codes FILE] [--append]
    python benchmarks/bench_gpu.py --out DIR --parts cpu_encode,cpu_end_to_end --append     (the CPU side)
    python benchmarks/bench_gpu.py --out DIR --backend strict --tiny ...                    (a CPU dry run)

Run by benchmarks/gpu_check.sh (which also runs the cuda-marked tests).  Measures, each part on its own so
that one failure leaves the others, the GPU parts first (their numbers never wait on the CPU):

    decode          10 s of audio (125 frames) through the released decoder, float32 and float64; the streaming
                    decoder with 5-frame pushes (float32), and its largest difference from the one-pass decode;
                    the target: at least 50x faster than real time in float32
    encode          10 s of audio through the released encoder, float32 and float64 (codes kept in --codes)
    end_to_end      text -> codes -> audio with the 0.6B CustomVoice model, greedy, float32 and (at most 10
                    frames) float64 (codes kept in --codes)
    official        the official qwen-tts on the same GPU (CUDA PyTorch, float32) for the decode, the encode and
                    the end to end, when ``import qwen_tts, torch`` works and ``torch.cuda.is_available()``:
                    the ratios ours / official
    cpu_encode      the CPU reference of the encode (numba backend, float32): its time, and how many of the GPU's
                    codes (from --codes) equal it
    cpu_end_to_end  the CPU reference of the end to end (numba, float32): its time, whether the GPU's greedy
                    codes equal it (in float64 a differing code can be a float32 near-tie: information only)

Every time is the best of ``--repeats`` calls after one warm-up call (which compiles the kernels); the
device is synchronised before the clock stops (the public API returns NumPy arrays, so it is anyway).
The results go to DIR/bench_gpu.json, rewritten after every measurement (``--append`` adds to the file
there), and a line per measurement to stdout.  The checkpoints are benchmarks/common.py's
(``REFIMPL_BENCH_DIR``, default bench-checkpoints/); the end to end is skipped when the 0.6B model is not
there (gpu_check.sh writes it while the tests run).  ``--backend strict --tiny`` runs every part's code on
the CPU (the strict stand-in device, the committed tiny checkpoints): the dry run of gpu_check.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import common  # noqa: F401  (first: OpenBLAS's idle spin set before NumPy loads it)
import numpy as np
from common import CACHE, official_available

GPU_PARTS = ("decode", "encode", "end_to_end", "official")
CPU_PARTS = ("cpu_encode", "cpu_end_to_end")
PARTS = GPU_PARTS + CPU_PARTS
TEXT = "Hello, world! This is a tiny text for a tiny tokenizer."
SPEAKER, LANGUAGE = "ryan", "english"
TINY_SPEAKER = "vivian"  # a speaker of the committed tiny CustomVoice checkpoint
GREEDY = dict(do_sample=False, subtalker_dosample=False)
DTYPES = {"float32": np.float32, "float64": np.float64}


BACKEND = {"name": "cupy"}  # the device backend measured (--backend; "strict" for the CPU dry run)


def synchronize() -> None:
    """Wait for the device (CuPy's work is asynchronous; the stand-in's is not)."""
    if BACKEND["name"] == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()


def checkpoints(args) -> dict:
    """The speech tokenizer's and the CustomVoice model's directories: the released sizes (benchmarks/common.py),
    or with --tiny the committed tiny checkpoints (for a dry run)."""
    if args.tiny:
        tiny = Path(__file__).resolve().parent.parent / "golden" / "checkpoints"
        return {
            "tokenizer": tiny / "tiny-speech-tokenizer",
            "model": tiny / "tiny-customvoice",
            "speaker": TINY_SPEAKER,
        }
    from common import released_speech_tokenizer

    return {"tokenizer": released_speech_tokenizer(), "model": CACHE / "released-0.6b-customvoice", "speaker": SPEAKER}


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

    def __init__(self, out: Path, append: bool = False, codes_path: Path | None = None):
        self.path = out / "bench_gpu.json"
        self.data = {}
        if append and self.path.is_file():
            self.data = json.loads(self.path.read_text())
        self.data.setdefault("runs", []).append(
            {
                "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "python": sys.version.split()[0],
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "argv": sys.argv[1:],
            }
        )
        self.data.setdefault("errors", {})
        self.codes = None  # the decoded codes, decoded again by the official
        self.codes_path = codes_path or out / "bench_codes.npz"

    def keep_codes(self, key: str, codes) -> None:
        """Add ``codes`` to the --codes file (what the CPU parts compare with, in another process)."""
        kept = self.kept_codes()
        kept[key] = np.asarray(codes)
        tmp = self.codes_path.with_name(self.codes_path.name + ".partial.npz")
        np.savez(tmp, **kept)
        os.replace(tmp, self.codes_path)

    def kept_codes(self) -> dict:
        if not self.codes_path.is_file():
            return {}
        with np.load(self.codes_path) as kept:
            return {k: kept[k] for k in kept.files}

    def put(self, part: str, key: str, value) -> None:
        self.data.setdefault(part, {})[key] = value
        print(f"[{part}] {key}: {json.dumps(value)}", flush=True)
        self.write()

    def error(self, part: str, exc: BaseException) -> None:
        self.data["errors"][part] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print(f"[{part}] FAILED:\n{traceback.format_exc()}", flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".partial")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.path)  # a step killed mid-write leaves the previous file whole


def part_decode(report: Report, args) -> None:
    from refimpl import SpeechTokenizer

    path = checkpoints(args)["tokenizer"]
    for name, dtype in DTYPES.items():
        t0 = time.perf_counter()
        tok = load_on(BACKEND["name"], SpeechTokenizer.from_pretrained, path, dtype=dtype)
        load_s = time.perf_counter() - t0
        codes = np.random.default_rng(0).integers(0, tok.codebook_size, size=(args.frames, tok.num_quantizers))
        audio_s = args.frames * tok.samples_per_frame / tok.sample_rate
        took, wav = timed(partial(tok.decode, codes), args.repeats)
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

            def streamed(tok=tok, codes=codes):
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
    from refimpl import SpeechTokenizer

    path = checkpoints(args)["tokenizer"]
    audio = test_audio(args.seconds)
    for name, dtype in DTYPES.items():
        tok = load_on(BACKEND["name"], SpeechTokenizer.from_pretrained, path, dtype=dtype)
        took, codes = timed(partial(tok.encode, audio, sr=24000), args.repeats)
        report.keep_codes(f"encode_{name}", codes)
        report.put("encode", name, {"audio_s": args.seconds, "seconds": took, "x_realtime": args.seconds / took})
        tok = None


def part_cpu_encode(report: Report, args) -> None:
    from refimpl import SpeechTokenizer

    cpu = load_on("numba", SpeechTokenizer.from_pretrained, checkpoints(args)["tokenizer"], dtype=np.float32)
    t0 = time.perf_counter()
    cpu_codes = np.asarray(cpu.encode(test_audio(args.seconds), sr=24000))
    report.put("encode", "cpu_numba_float32", {"seconds": time.perf_counter() - t0, "cpus": os.cpu_count()})
    kept = report.kept_codes()
    for name in DTYPES:
        codes = kept.get(f"encode_{name}")
        if codes is None:
            report.put("encode", f"{name}_codes_equal_cpu", "no GPU codes kept (the encode part did not run)")
            continue
        equal = int((codes == cpu_codes).sum()) if codes.shape == cpu_codes.shape else None
        report.put("encode", f"{name}_codes_equal_cpu", {"equal": equal, "codes": int(cpu_codes.size)})


def run_custom_voice(model, speaker: str, **gen):
    """Greedy text -> (waveform, codes) with ``model``."""
    wavs, sr, codes = model.generate_custom_voice(
        TEXT, speaker=speaker, language=LANGUAGE, return_codes=True, **dict(GREEDY, **gen)
    )
    return wavs[0], codes[0]


def part_end_to_end(report: Report, args) -> None:
    from refimpl import Qwen3TTS

    found = checkpoints(args)
    path = found["model"]
    if not (path / "model.safetensors").is_file() or not (path / "speech_tokenizer").exists():
        report.put("end_to_end", "skipped", f"no 0.6B model in {path.name}/ (gpu_check.sh writes it)")
        return
    for name, dtype in DTYPES.items():
        frames = args.e2e_frames if name == "float32" else min(args.e2e_frames, 10)
        t0 = time.perf_counter()
        tts = load_on(BACKEND["name"], Qwen3TTS.from_pretrained, path, dtype=dtype)
        load_s = time.perf_counter() - t0
        took, (wav, codes) = timed(
            partial(run_custom_voice, tts, found["speaker"], max_new_tokens=frames + 1),
            1 if name == "float64" else args.repeats,
        )
        report.keep_codes(f"end_to_end_{name}", codes)
        report.keep_codes(f"end_to_end_{name}_wav", wav)
        n = len(codes)
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
            },
        )
        tts = None  # frees the device memory before the next precision loads


def part_cpu_end_to_end(report: Report, args) -> None:
    from refimpl import Qwen3TTS

    found = checkpoints(args)
    path = found["model"]
    if not (path / "model.safetensors").is_file() or not (path / "speech_tokenizer").exists():
        report.put("end_to_end", "cpu_skipped", f"no 0.6B model in {path.name}/")
        return
    cpu = load_on("numba", Qwen3TTS.from_pretrained, path, dtype=np.float32)
    t0 = time.perf_counter()
    cpu_wav, cpu_codes = run_custom_voice(cpu, found["speaker"], max_new_tokens=args.e2e_frames + 1)
    cpu_s = time.perf_counter() - t0
    report.put("end_to_end", "cpu_numba_float32", {"frames": len(cpu_codes), "seconds": cpu_s, "cpus": os.cpu_count()})
    kept = report.kept_codes()
    for name in DTYPES:
        codes = kept.get(f"end_to_end_{name}")
        if codes is None:
            report.put("end_to_end", f"{name}_vs_cpu", "no GPU codes kept (the end_to_end part did not run)")
            continue
        n = len(codes)
        same = codes.shape == cpu_codes[:n].shape and bool(np.array_equal(codes, cpu_codes[:n]))  # a prefix
        wav = kept[f"end_to_end_{name}_wav"]
        report.put(
            "end_to_end",
            f"{name}_vs_cpu",
            {
                "greedy_codes_equal_cpu_float32": same,
                "frames_compared": n,
                "max_abs_wav_minus_cpu": float(np.max(np.abs(wav - cpu_wav[: len(wav)])))
                if same and name == "float32" and len(wav) <= len(cpu_wav)
                else None,
            },
        )


def part_official(report: Report, args) -> None:
    if not official_available():
        report.put("official", "skipped", "import qwen_tts, torch failed: no official side by side")
        return
    import torch

    if not torch.cuda.is_available():
        report.put("official", "skipped", f"torch {torch.__version__} sees no CUDA device")
        return
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

    path = checkpoints(args)["tokenizer"]
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
    model_path = checkpoints(args)["model"]
    if not (model_path / "model.safetensors").is_file():
        return
    off = on_gpu(Qwen3TTSModel, model_path)
    gen = dict(GREEDY, max_new_tokens=args.e2e_frames + 1)
    speaker = checkpoints(args)["speaker"]
    took, (wavs, _) = official_timed(
        lambda: off.generate_custom_voice(TEXT, speaker=speaker, language=LANGUAGE, **gen), args.repeats
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
    ap.add_argument("--parts", default=",".join(GPU_PARTS), help=f"among {', '.join(PARTS)}")
    ap.add_argument("--frames", type=int, default=125, help="decoded frames (125: 10 s of audio)")
    ap.add_argument("--seconds", type=float, default=10.0, help="encoded audio seconds")
    ap.add_argument("--e2e-frames", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--codes", type=Path, default=None, help="the GPU codes the CPU parts compare with (npz)")
    ap.add_argument("--append", action="store_true", help="add to DIR/bench_gpu.json instead of starting it anew")
    ap.add_argument("--backend", default="cupy", choices=("cupy", "strict"), help="strict: the CPU dry run")
    ap.add_argument("--tiny", action="store_true", help="the committed tiny checkpoints (for a dry run)")
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose among {', '.join(PARTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    BACKEND["name"] = args.backend
    report = Report(args.out, args.append, args.codes)
    if any(p in GPU_PARTS for p in parts):
        from refimpl.backends import BackendUnavailable, backend

        try:
            described = backend(args.backend).load().available()
            report.put("device", args.backend, described or f"the {args.backend} stand-in (a CPU dry run)")
        except BackendUnavailable as e:
            report.data["errors"]["device"] = str(e)
            report.write()
            print(f"no GPU run: {e}")
            parts = [p for p in parts if p in CPU_PARTS]
            if not parts:
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
