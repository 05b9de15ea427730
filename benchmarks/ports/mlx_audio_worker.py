"""One conformance case through mlx-audio, inside mlx-audio's own environment (NumPy, SciPy, MLX and
``mlx-audio`` only; never imports refimpl). Run by benchmarks/ports/mlx_audio.py as
``ENV/bin/python -I mlx_audio_worker.py JOB.json``; ``-I`` keeps this folder off sys.path, where
mlx_audio.py would shadow the package.

JOB.json: {"case", "action" (say | design | decode | encode | speaker), "model" (the Hugging Face folder:
mlx-audio has no converter, ``load_model`` reads it), "dtype" (float32: ``Module.set_dtype(mx.float32)``
after loading, on each child where the whole model refuses; stored: as loaded), "out" (the case's results
folder), "text", "speaker", "instruct", "language", "max_tokens", "codes" (.npy), "audio" (.wav)}.

Writes, under the suite's plain names (docs/conformance.md, "What a port gives"):
  say, design  codes.npy (int64 [T, 16]): the codes the generation hands to ``speech_tokenizer.decode``,
               caught by wrapping that method of the loaded model (mlx-audio's API returns audio only);
               waveform.npy (float32, 24 kHz): the audio ``generate_custom_voice`` /
               ``generate_voice_design`` returns
  decode       waveform.npy: ``model.speech_tokenizer.decode(codes)``, the decode the generation uses
  encode       codes.npy: ``model.speech_tokenizer.encode(audio)``, transposed to [T, 16]
  speaker      x_vector.npy: ``model.extract_speaker_embedding(audio, 24000)``
  .mlx-case.json  what ran, how long each step took, and an error the decode raised after the codes were
               caught (a dot file: the grader skips it)
"""

import json
import sys
import time
import traceback
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import scipy.io.wavfile
from mlx.utils import tree_flatten
from mlx_audio.tts.utils import load_model

GREEDY = dict(temperature=0.0)  # mlx-audio: temperature <= 0 is argmax, for the Talker and the code predictor


def read_wav(path: str) -> tuple:
    rate, samples = scipy.io.wavfile.read(path)
    return rate, np.asarray(samples, dtype=np.float32)


def widen(module) -> None:
    """``Module.set_dtype(mx.float32)``, applied to the children of a module where the whole module refuses
    (the loaded speech tokenizer holds an attribute ``Module.update`` cannot walk)."""
    try:
        module.set_dtype(mx.float32)
    except TypeError:
        for child in module.values():
            for c in child if isinstance(child, list) else [child]:
                if isinstance(c, nn.Module):
                    widen(c)


def catch_codes(model, out: Path, record: dict) -> None:
    """Wrap the loaded model's ``speech_tokenizer.decode``: the codes it is given are saved before it runs."""
    decode = model.speech_tokenizer.decode

    def recording_decode(codes):
        np.save(out / "codes.npy", np.array(codes)[0].astype(np.int64))  # [1, T, 16] -> [T, 16]
        record["codes_caught"] = list(np.array(codes).shape)
        return decode(codes)

    model.speech_tokenizer.decode = recording_decode


def generate(model, job: dict, out: Path, record: dict) -> None:
    catch_codes(model, out, record)
    kwargs = dict(language=job["language"], max_tokens=int(job["max_tokens"]), **GREEDY)
    t0 = time.perf_counter()
    try:
        if job["action"] == "say":
            results = list(
                model.generate_custom_voice(job["text"], job["speaker"], instruct=job.get("instruct"), **kwargs)
            )
        else:
            results = list(model.generate_voice_design(job["text"], job["instruct"], **kwargs))
    except Exception as e:  # the decode may fail after the codes were caught: the codes are still graded
        if "codes_caught" not in record:
            raise
        record["decode_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        record["decode_traceback"] = traceback.format_exc()[-3000:]
        results = []
    record["generate_s"] = round(time.perf_counter() - t0, 3)
    if results:
        audio = np.concatenate([np.array(r.audio, dtype=np.float32) for r in results])
        np.save(out / "waveform.npy", audio)
        record.update(samples=int(audio.size), frames=audio.size / 1920, results=len(results))


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    record = {"case": job["case"], "action": job["action"], "mlx": mx.__version__, "device": str(mx.default_device())}
    t0 = time.perf_counter()
    model = load_model(Path(job["model"]))
    if job["dtype"] == "float32":
        widen(model)
    record["dtypes"] = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    record["load_s"] = round(time.perf_counter() - t0, 3)
    action = job["action"]
    t0 = time.perf_counter()
    if action in ("say", "design"):
        generate(model, job, out, record)
    elif action == "decode":
        codes = np.load(job["codes"])  # [T, 16]
        audio, lengths = model.speech_tokenizer.decode(mx.array(codes[None]))
        audio = np.array(audio[0], dtype=np.float32)[: int(lengths[0])]
        np.save(out / "waveform.npy", audio)
        record.update(samples=int(audio.size), frames=audio.size / 1920)
    else:
        rate, samples = read_wav(job["audio"])
        if rate != 24000:
            raise SystemExit(f"{job['audio']}: {rate} Hz; mlx-audio's encoders take 24 kHz samples")
        if action == "encode":
            codes = model.speech_tokenizer.encode(mx.array(samples)[None, None])  # [1, 16, T]
            np.save(out / "codes.npy", np.array(codes)[0].T.astype(np.int64))
        else:
            x_vector = model.extract_speaker_embedding(mx.array(samples), sr=rate)  # [1, D]
            np.save(out / "x_vector.npy", np.array(x_vector, dtype=np.float32).reshape(-1))
    record["run_s"] = round(time.perf_counter() - t0, 3)
    (out / ".mlx-case.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
