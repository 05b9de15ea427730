"""One conformance case through candle-tts, inside its own environment (the standard library and
``candle-tts`` only: the package needs no NumPy, and this worker never imports refimpl). Run by
benchmarks/ports/candle_tts.py as ``ENV/bin/python -I candle_tts_worker.py JOB.json``; ``-I`` keeps this
folder off sys.path, where candle_tts.py would shadow the package.

JOB.json: {"case", "action" (clone | speaker | encode), "model" (a Hugging Face checkpoint folder),
"pcm" (the reference's samples, floats), "sample_rate", "transcript" (null: x-vector only), "text",
"options" (candle-tts's options JSON: seed, temperature, max_tokens, language), "out"}.

Writes to OUT/.candle-case.json, a dot file the grader skips, what candle-tts gave and how long each step
took: "voice" (the voice JSON's payload: ``speaker_embedding``, ``ref_codes`` [T, 16], ``ref_text_ids``),
and for a clone "samples" and "sample_rate" (the audio). candle_tts.py turns it into the suite's .npy files.
An error of candle-tts ends the worker with a traceback and exit status 1: the case failed to run.
"""

import json
import sys
import time
from pathlib import Path

import candle_tts


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    record = {"case": job["case"], "action": job["action"], "candle_tts": candle_tts.__version__}
    record["candle_tts_module"] = candle_tts.__file__
    t0 = time.perf_counter()
    engine = candle_tts.Engine.load(job["model"], "qwen3", "cpu")
    record["load_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    voice_json = engine.extract_voice(job["pcm"], int(job["sample_rate"]), job.get("transcript"))
    record["voice_s"] = round(time.perf_counter() - t0, 3)
    voice = json.loads(voice_json)
    record["voice_header"] = {k: v for k, v in voice.items() if k != "payload"}
    record["voice"] = voice["payload"]
    if job["action"] == "clone":
        t0 = time.perf_counter()
        audio = engine.synthesize(job["text"], voice_json, json.dumps(job["options"]))
        record["synthesize_s"] = round(time.perf_counter() - t0, 3)
        record["sample_rate"] = audio.sample_rate
        record["samples"] = audio.samples
    (out / ".candle-case.json").write_text(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
