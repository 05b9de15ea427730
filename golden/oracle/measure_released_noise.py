"""Measure the official model's float32 noise at the RELEASED size, side by side with ours
-> golden/trace/precision_noise_released.json.

    REFIMPL_BENCH_DIR=DIR .oracle-venv/bin/python golden/oracle/measure_released_noise.py [--chunked] [--talker]

``NOISE_RATIO`` (refimpl/porting/compare.py) is max |official_f32 - official_f64| / (eps32 * scale) over
every module output on the TINY checkpoints (``record_trace_keys.py``).  This script asks whether that
ratio still bounds the official float32 noise on the full-size synthetic checkpoints of
``benchmarks/common.py`` (seed 0, in ``$REFIMPL_BENCH_DIR``, default ``bench-checkpoints/``; written by
``released_speech_tokenizer()`` / ``released_custom_voice_0_6b()`` there, never committed):

- codec-decode: the conformance suite's case ``codec-decode`` (4 frames of codes from
  ``random_codes(4, 2048, 16, case_seed("codec-decode"))``), decoder traced, on
  ``released-speech-tokenizer``; and, as the control, the same case on ``tiny-speech-tokenizer``
  (codes below its codebook size of the same seed; summary only);
- ``--chunked``: the case ``codec-decode-chunked`` (330 frames, the official chunked decode), official
  only, the waveform only;
- ``--talker``: the say case of ``record_trace_keys.py`` at full size (``released-0.6b-customvoice``,
  greedy, 3 new tokens), prefill calls only (as ``precision_noise.json``), and every call while both runs
  chose the same codes.

Output: per network part the largest ratio and where (``summary``), per tensor the ratios of ``COLUMNS``
(codec-decode).  ``grade_noise_ratio`` is what ``refimpl conformance grade`` reports for our float32
reference: max |ours_f32 - ours_f64| / tolerance (the NOISE_RATIO rule); ``official_graded`` the same for
the official float32 run graded as a port.  Deterministic: a rerun writes the same bytes.

For every module output common to the official hook dump (``hook_dump.py``) and our trace
(``refimpl.porting.trace_files``), with scale = max(1, max |reference|) and eps = eps32, it records
|a - b| / (eps * scale) for: official_f32 vs official_f64 (the official noise), ours_f32 vs official_f64,
ours_f32 vs ours_f64 (what the conformance suite grades), official_f32 vs ours_f64, and ours_f64 vs
official_f64 (relative: the float64 agreement).  Ours runs on the default backend ("auto": the numba twins
in float32) and on the plain numpy reference.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from pathlib import Path

from common import CHECKPOINTS, REPO, make_float64_oracle, np, to_numpy, torch, versions  # noqa: I001
from hook_dump import named_calls, run_codec_decode, run_generation

from refimpl import use_backend
from refimpl.codec.speech_tokenizer import SpeechTokenizer
from refimpl.porting.compare import NOISE_FACTOR, NOISE_RATIO, tolerance
from refimpl.porting.conformance.suite import case_seed, random_codes
from refimpl.porting.trace_files import trace_codec_decode, trace_generation

EPS32 = float(np.finfo(np.float32).eps)
OUT = REPO / "golden" / "trace" / "precision_noise_released.json"
SAY = dict(text="Hi.", speaker="vivian", language="english", do_sample=False, subtalker_dosample=False)
SAY_NEW_TOKENS = 3


def ratio(a, ref) -> float:
    """max |a - ref| / (eps32 * max(1, max |ref|))."""
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    return float(np.max(np.abs(a - ref))) / (EPS32 * scale) if ref.size else 0.0


def part_of(key: str) -> str:
    """The network part of a key: decoder.quantizer / pre_conv / pre_transformer / upsample / decoder.N
    (the waveform stack's blocks) / the waveform; talker / talker.code_predictor."""
    parts = key.split(":")[0].split(".")
    if parts[0] == "decoder":
        if len(parts) == 1:
            return "decoder (waveform)"
        if parts[1] == "decoder":
            return ".".join(parts[:3])
        return ".".join(parts[:2])
    if parts[0] == "talker":
        return "talker.code_predictor" if len(parts) > 1 and parts[1] == "code_predictor" else "talker"
    return parts[0]


def compare(off32: dict, off64: dict, ours: dict, keys: list) -> list:
    """One row per key: the ratios of the module docstring, and the grade of ours_f32 against ours_f64
    under the suite's tolerance (the NOISE_RATIO rule) and under the rule with this array's official noise."""
    rows = []
    for key in keys:
        o32, o64 = off32[key], off64[key]
        if o32.dtype.kind != "f" or o32.shape != o64.shape:
            continue
        row = {"key": key, "part": part_of(key), "shape": list(o32.shape), "official": ratio(o32, o64)}
        for backend, (u32, u64) in ours.items():
            if key not in u32 or u32[key].shape != o32.shape:
                continue
            noise = float(np.max(np.abs(o32.astype(np.float64) - o64))) if o64.size else 0.0
            err = float(np.max(np.abs(u32[key].astype(np.float64) - u64[key]))) if o64.size else 0.0
            row[backend] = {
                "ours_vs_official_f64": ratio(u32[key], o64),
                "ours_vs_ours_f64": ratio(u32[key], u64[key]),
                "official_f32_vs_ours_f64": ratio(o32, u64[key]),
                "ours_vs_official_f32": ratio(u32[key], o32),
                "f64_relative": ratio(u64[key], o64) * EPS32,
                # what the suite grades (ours_f32 against our f64 reference), as a fraction of its tolerance
                "grade_noise_ratio": err / tolerance(u64[key], "float32", network=key.split(".")[0].split(":")[0]),
                # the same error against the rule with this array's measured official noise
                "grade_measured_noise": err / tolerance(o64, "float32", noise=noise),
                # the official float32 graded as a port by the suite: against our f64, under NOISE_RATIO
                "official_graded": float(np.max(np.abs(o32.astype(np.float64) - u64[key])))
                / tolerance(u64[key], "float32", network=key.split(".")[0].split(":")[0]),
            }
        rows.append(row)
    return rows


COLUMNS = (
    "key",
    "official",
    "auto:ours_vs_ours_f64",
    "auto:ours_vs_official_f64",
    "numpy:ours_vs_ours_f64",
    "auto:grade_noise_ratio",
    "auto:official_graded",
)


def table_row(row: dict) -> list:
    """One tensor as the COLUMNS (ratios to 4 significant digits)."""
    out = [row["key"]]
    for column in COLUMNS[1:]:
        backend, _, what = column.rpartition(":")
        value = row[backend][what] if backend else row[what]
        out.append(float(f"{value:.4g}"))
    return out


def summarise(rows: list) -> dict:
    """Per part: the largest official ratio and ours (per backend), with where."""
    out = {}
    for row in rows:
        s = out.setdefault(row["part"], {"tensors": 0})
        s["tensors"] += 1
        candidates = {"official": row["official"]}
        for backend in ("auto", "numpy"):
            for what in (
                "ours_vs_official_f64",
                "ours_vs_ours_f64",
                "official_f32_vs_ours_f64",
                "grade_noise_ratio",
                "official_graded",
            ):
                if backend in row:
                    candidates[f"{backend}:{what}"] = row[backend][what]
        for name, value in candidates.items():
            if value > s.get(name, {"max": -1.0})["max"]:
                s[name] = {"max": value, "at": row["key"]}
    return out


def backend(name: str):
    """The default backend for "auto" (the numba twins in float32, numpy in float64), else ``name``."""
    return contextlib.nullcontext() if name == "auto" else use_backend(name)


def ours_codec_decode(directory, codes) -> dict:
    ours = {}
    for name in ("auto", "numpy"):
        with backend(name):
            pair = []
            for dtype in (np.float32, np.float64):
                tok = SpeechTokenizer.from_pretrained(directory, dtype=dtype)
                pair.append(dict(trace_codec_decode(tok, codes).items))
                del tok
        ours[name] = tuple(pair)
    return ours


def measure_codec_decode(directory) -> dict:
    """The suite's case codec-decode on ``directory``: its codes as ``suite.case_inputs`` makes them."""
    tok = SpeechTokenizer.from_pretrained(directory, dtype=np.float64)
    codes = random_codes(4, tok.codebook_size, tok.num_quantizers, case_seed("codec-decode"))
    del tok
    t0 = time.perf_counter()
    off32 = named_calls(run_codec_decode(directory, codes, "float32"))
    gc.collect()
    off64 = dict(named_calls(run_codec_decode(directory, codes, "float64")))
    gc.collect()
    t_official = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = ours_codec_decode(directory, codes)
    t_ours = time.perf_counter() - t0
    keys = [k for k, _ in off32]
    missing = [k for k in keys if k not in ours["auto"][0]]
    rows = compare(dict(off32), off64, ours, keys)
    return {
        "checkpoint": directory.name,
        "codes": {"seed": case_seed("codec-decode"), "shape": list(codes.shape), "values": codes.tolist()},
        "official_keys": len(keys),
        "not_in_ours": missing,
        "summary": summarise(rows),
        "columns": list(COLUMNS),
        "tensors": [table_row(r) for r in rows],
    }, {"official": t_official, "ours": t_ours}


def measure_chunked(directory) -> dict:
    """The suite's case codec-decode-chunked (330 frames, the official decode: chunks of 300 with 25 frames
    of left context), official only and the waveform only (no hooks): does the noise grow with length?"""
    from qwen_tts import Qwen3TTSTokenizer

    codes = random_codes(330, 2048, 16, case_seed("codec-decode-chunked"))
    wav = {}
    for dtype in ("float32", "float64"):
        tok = Qwen3TTSTokenizer.from_pretrained(str(directory), dtype=torch.float32)
        if dtype == "float64":
            make_float64_oracle(tok.model.decoder)
        with torch.inference_mode():
            wav[dtype] = to_numpy(tok.model.decode(torch.from_numpy(codes[None])).audio_values[0])
        del tok
        gc.collect()
    per_frame = [
        ratio(wav["float32"][i * 1920 : (i + 1) * 1920], wav["float64"][i * 1920 : (i + 1) * 1920]) for i in range(330)
    ]
    worst = ratio(wav["float32"], wav["float64"])
    return {
        "codes": {"seed": case_seed("codec-decode-chunked"), "shape": list(codes.shape)},
        "official_waveform": worst,
        "worst_frame": int(np.argmax(per_frame)),
        "official_waveform_first_4_frames": max(per_frame[:4]),
        "official_graded_against_official_f64": worst / (NOISE_FACTOR * (NOISE_RATIO["float32"]["decoder"] + 1)),
    }


def measure_talker(bench) -> dict:
    from refimpl.tts.model import Qwen3TTS

    directory = bench / "released-0.6b-customvoice"
    kwargs = dict(SAY, max_new_tokens=SAY_NEW_TOKENS)
    t0 = time.perf_counter()
    off32 = named_calls(run_generation(directory, "generate_custom_voice", kwargs, "float32"))
    gc.collect()
    off64 = dict(named_calls(run_generation(directory, "generate_custom_voice", kwargs, "float64")))
    gc.collect()
    t_official = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = {}
    for name in ("auto",):
        with backend(name):
            pair = []
            for dtype in (np.float32, np.float64):
                tts = Qwen3TTS.from_pretrained(directory, dtype=dtype)
                pair.append(dict(trace_generation(tts, "say", decoder=False, **kwargs).items))
                del tts
                gc.collect()
        ours[name] = tuple(pair)
    t_ours = time.perf_counter() - t0
    keys = [k for k, _ in off32 if k.startswith("talker.") and k in off64]
    codes32, codes64 = ours["auto"][0]["refimpl.codes.0"], ours["auto"][1]["refimpl.codes.0"]
    prefill = [k for k in keys if ":" not in k or k.endswith(":0")]
    # every call is a like-for-like comparison only while the runs chose the same codes.  The official
    # runs: the embeddings of the chosen codes (bf16 weights, exact in float32 and float64) are equal bit
    # for bit.  Ours (which records no embedding call) against the official: every common call's float64
    # agreement (``f64_relative``, a code chosen differently would part them by far more than 1e-10).
    embeddings = [k for k in keys if "codec_embedding" in k]
    same_shapes = all(dict(off32)[k].shape == off64[k].shape for k in keys)
    official_equal = same_shapes and all(ratio(dict(off32)[k], off64[k]) == 0.0 for k in embeddings)
    rows = compare(dict(off32), off64, ours, keys)
    return {
        "checkpoint": directory.name,
        "input": dict(kwargs),
        "ours_codes_f32_equal_f64": bool(np.array_equal(codes32, codes64)),
        "ours_codes": np.asarray(codes32).tolist(),
        "official_codes_f32_equal_f64": official_equal,
        "official_keys_not_in_ours": sum(k not in ours["auto"][0] for k in keys),
        "ours_f64_vs_official_f64_relative_max": max(r["auto"]["f64_relative"] for r in rows if "auto" in r),
        "prefill": {"summary": summarise([r for r in rows if r["key"] in set(prefill)]), "tensors": len(prefill)},
        "all_calls": {"summary": summarise(rows), "tensors": len(keys)},
    }, {"official": t_official, "ours": t_ours}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--talker", action="store_true", help="also the 0.6B CustomVoice Talker (say, 3 new tokens)")
    p.add_argument("--chunked", action="store_true", help="also the official 330-frame chunked decode (waveform)")
    p.add_argument("-o", "--output", default=str(OUT))
    args = p.parse_args(argv)
    bench = Path(os.environ.get("REFIMPL_BENCH_DIR", REPO / "bench-checkpoints"))
    needed = ["released-speech-tokenizer"] + (["released-0.6b-customvoice"] if args.talker else [])
    absent = [name for name in needed if not (bench / name / "model.safetensors").is_file()]
    if absent:
        p.error(
            f"{', '.join(absent)} not in {bench}: set REFIMPL_BENCH_DIR, or write them with "
            "benchmarks/common.py (released_speech_tokenizer(), released_custom_voice_0_6b())"
        )
    result = {
        "versions": versions(),
        "eps": EPS32,
        "noise_ratio_tiny": NOISE_RATIO["float32"],
    }
    # the control: the same case on the tiny checkpoint (summary only)
    tiny, _ = measure_codec_decode(CHECKPOINTS / "tiny-speech-tokenizer")
    result["codec_decode_tiny"] = {k: v for k, v in tiny.items() if k not in ("columns", "tensors")}
    result["codec_decode"], seconds = measure_codec_decode(bench / "released-speech-tokenizer")
    print(json.dumps(result["codec_decode"]["summary"], indent=1))
    print("codec-decode seconds:", {k: round(v, 1) for k, v in seconds.items()})
    if args.chunked:
        result["codec_decode_chunked"] = measure_chunked(bench / "released-speech-tokenizer")
        print(json.dumps(result["codec_decode_chunked"], indent=1))
    if args.talker:
        result["say"], seconds = measure_talker(bench)
        print(json.dumps({k: v for k, v in result["say"].items() if k != "ours_codes"}, indent=1))
        print("say seconds:", {k: round(v, 1) for k, v in seconds.items()})
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
