"""One conformance case through vox, inside vox's own environment (NumPy and ``vox-tts`` only; never imports
refimpl). Run by benchmarks/ports/vox.py as ``ENV/bin/python -I vox_worker.py JOB.json``; ``-I`` keeps this
folder off sys.path, where vox.py would shadow the package.

JOB.json: {"case", "action" (say | clone | speaker | encode), "model" (.tmod), "threads", "out" (the case's
results folder), "text", "speaker", "language", "ref_audio", "ref_text", "x_vector_only", "max_frames"}.

Writes, under the suite's plain names (docs/conformance.md, "What a port gives"):
  say, clone   waveform.npy (float32, 24 kHz), what vox's Python API returns: audio only, no codes
  clone        voice.tvoice (vox's saved voice, a safetensors file), from it speaker_encoder.npy (the x-vector)
               and, in context, the reference's codes split into the encoder quantizer's per-layer keys
  speaker      voice.tvoice and x_vector.npy
  encode       voice.tvoice and codes.npy: the reference codes vox computes when it clones a voice in context
  .vox-case.json  what ran and how long each step took (a dot file: the grader skips it)
"""

import json
import struct
import sys
import time
from pathlib import Path

import numpy as np
import vox

SAFETENSORS_DTYPES = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I16": "<i2", "U8": "u1"}
GREEDY = dict(temperature=0.0, sub_temperature=0.0, decoder_mode="reference")
PLACEHOLDER_REF_TEXT = "reference"  # cloning in context needs a transcript; the codes do not depend on it
SEMANTIC = "refimpl.encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codes"
ACOUSTIC = "refimpl.encoder.quantizer.acoustic_residual_vector_quantizer.layers.{}.codes"


def read_safetensors(path: Path) -> dict:
    """name -> array of a safetensors file (the format: 8-byte header length, JSON header, data)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        raw = data[8 + n + begin : 8 + n + end]
        out[name] = np.frombuffer(raw, SAFETENSORS_DTYPES[h["dtype"]]).reshape(h["shape"])
    return out


def save_voice(voice, out: Path) -> dict:
    path = out / "voice.tvoice"
    voice.save(str(path))
    return read_safetensors(path)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    record = {"case": job["case"], "action": job["action"], "vox": vox.__version__, "vox_module": vox.__file__}
    t0 = time.perf_counter()
    engine = vox.Engine(job["model"], "cpu", int(job["threads"]))
    record["load_s"] = round(time.perf_counter() - t0, 3)
    action = job["action"]
    t0 = time.perf_counter()
    if action == "say":
        voice = engine.speaker_voice(job["speaker"], job.get("instruct") or None)
    else:
        ref_text = job.get("ref_text") or (PLACEHOLDER_REF_TEXT if action == "encode" else None)
        xvector_only = action == "speaker" or bool(job.get("x_vector_only"))
        voice = engine.clone_voice(job["ref_audio"], ref_text, xvector_only=xvector_only)
    record["voice_s"] = round(time.perf_counter() - t0, 3)
    if action != "say":
        tensors = save_voice(voice, out)
        record["voice_tensors"] = {k: list(v.shape) for k, v in tensors.items()}
        if action == "speaker":
            np.save(out / "x_vector.npy", tensors["speaker_emb"].astype(np.float32))
        elif action == "encode":
            np.save(out / "codes.npy", tensors["ref_codes"].astype(np.int64))
        else:
            np.save(out / "speaker_encoder.npy", tensors["speaker_emb"].astype(np.float32)[None])
            if "ref_codes" in tensors:
                codes = tensors["ref_codes"].astype(np.int64)  # [T, 16]: codebook 0 semantic, 1..15 acoustic
                np.save(out / f"{SEMANTIC}.npy", codes[None, :, 0])
                for j in range(1, codes.shape[1]):
                    np.save(out / f"{ACOUSTIC.format(j - 1)}.npy", codes[None, :, j])
    if action in ("say", "clone"):
        t0 = time.perf_counter()
        audio = engine.synthesize(
            job["text"], voice, max_frames=int(job["max_frames"]), language=job.get("language") or "auto", **GREEDY
        )
        record["synthesize_s"] = round(time.perf_counter() - t0, 3)
        record["samples"] = int(audio.size)
        record["frames"] = audio.size / 1920
        np.save(out / "waveform.npy", np.asarray(audio, dtype=np.float32))
    record["stats"] = engine.stats()
    (out / ".vox-case.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
