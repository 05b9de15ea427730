"""One conformance case through CrispASR's qwen3-tts, inside its own environment (NumPy and ``crispasr`` only;
never imports refimpl). Run by benchmarks/ports/crispasr.py as ``ENV/bin/python -I crispasr_worker.py JOB.json``.

JOB.json: {"case", "model" (the Talker GGUF), "codec" (the codec GGUF), "threads", "out" (the case's results
folder), "text", "speaker", "instruct", "language", "replay" (a replay-codes file or null), "max_frames",
"raw" (take the unwatermarked audio)}.

The debug switches are CrispASR's environment variables, set here before the synthesis:
``CRISPASR_QWEN3_TTS_GREEDY=1`` (the Talker picks by argmax), ``_NO_EMBD_CACHE=1`` (below), ``_MAX_FRAMES``,
``_DUMP_DIR`` (``OUT/crispasr-dump/``),
``_DUMP_LOGITS`` (``OUT/crispasr-logits/``) and, with "replay", ``_REPLAY_CODES`` (teacher forcing: every
frame's 16 codes are the file's). Writes ``waveform.npy`` (float32, 24 kHz, what ``Session.synthesize``
returns, or ``synthesize_raw`` with "raw") and ``.crispasr-case.json`` (what ran, how long, its stderr is the
parent's); the dumps are read by the parent (``refimpl.porting.adapters.crispasr``).
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ENGLISH_TO_ISO = {"english": "en", "chinese": "zh", "german": "de", "japanese": "ja", "spanish": "es"}
ENGLISH_TO_ISO.update({"french": "fr", "korean": "ko", "russian": "ru", "italian": "it", "portuguese": "pt"})
ATTESTATION = "conformance check of synthetic random weights; the audio is compared numerically and discarded"


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    dump, logits = out / "crispasr-dump", out / "crispasr-logits"
    dump.mkdir(parents=True, exist_ok=True)
    logits.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        CRISPASR_QWEN3_TTS_GREEDY="1",
        CRISPASR_QWEN3_TTS_MAX_FRAMES=str(int(job["max_frames"])),
        CRISPASR_QWEN3_TTS_DUMP_DIR=str(dump),
        CRISPASR_QWEN3_TTS_DUMP_LOGITS=str(logits),
        # F32 files: its embedding cache converts rows with GGML's to_float, which F32 does not have, so every
        # synthesis of an F32 GGUF fails at frame 0 ("qwen3-tts synthesis failed") unless the cache is off
        CRISPASR_QWEN3_TTS_NO_EMBD_CACHE="1",
    )
    if job.get("replay"):
        os.environ["CRISPASR_QWEN3_TTS_REPLAY_CODES"] = job["replay"]
    import crispasr

    record = {"case": job["case"], "crispasr_module": crispasr.__file__, "replay": bool(job.get("replay"))}
    t0 = time.perf_counter()
    session = crispasr.Session(job["model"], n_threads=int(job["threads"]), backend="qwen3-tts")
    session.set_codec_path(job["codec"])
    record["load_s"] = round(time.perf_counter() - t0, 3)
    record["backend"] = session.backend
    if job.get("speaker"):
        session.set_speaker_name(job["speaker"])
    if job.get("instruct"):
        session.set_instruct(job["instruct"])
    language = ENGLISH_TO_ISO.get(str(job.get("language") or "auto").lower())
    if language:
        session.set_target_language(language)
    t0 = time.perf_counter()
    if job.get("raw"):
        session.accept_marking_responsibility(ATTESTATION)
        audio = session.synthesize_raw(job["text"])
    else:
        audio = session.synthesize(job["text"])
    record["synthesize_s"] = round(time.perf_counter() - t0, 3)
    record["samples"] = int(audio.size)
    record["frames"] = audio.size / 1920
    record["sample_rate"] = session.output_sample_rate() if hasattr(session, "output_sample_rate") else None
    np.save(out / "waveform.npy", np.asarray(audio, dtype=np.float32))
    (out / ".crispasr-case.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
