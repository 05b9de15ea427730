"""One conformance case through qwentts.cpp, inside its own environment (NumPy and ``realtimetts-qwen-native-cpu``
only; never imports refimpl). Run by benchmarks/ports/qwentts_cpp.py as ``ENV/bin/python -I qwentts_cpp_worker.py
JOB.json``; ``-I`` keeps this folder off sys.path.

JOB.json: {"case", "action" (say | clone | speaker | encode), "talker", "codec" (the GGUF files), "threads",
"out" (the case's results folder), "dump" (qwentts.cpp's dump_dir), "text", "lang", "speaker", "instruct",
"ref_audio" (a .npy of 24 kHz float32 samples), "ref_text", "max_new_tokens", "sampling" (the keywords of its
synthesize call)}.

Writes, under the suite's plain names (docs/conformance.md, "What a port gives"):
  say, clone  waveform.npy (float32, 24 kHz), the audio its synthesize call returns; its dump_dir gets its
              debug dumps (the codes among them), read by the script with refimpl's adapter
  speaker     x_vector.npy: the speaker embedding its qt_extract_voice_ref gives for the audio
  encode      codes.npy ([T, 16]): the codec codes its qt_extract_voice_ref gives for the audio
  .qwentts-case.json  what ran and how long each step took (a dot file: the grader skips it)
The record is written before the synthesis too, so that a crash leaves what was done.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import qwentts_cpp_cpu as qt


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    record = {"case": job["case"], "action": job["action"], "qwentts": qt.__version__}
    note = out / ".qwentts-case.json"

    def save():
        note.write_text(json.dumps(record, indent=1) + "\n")

    t0 = time.perf_counter()
    tts = qt.QwenTTS(job["talker"], job["codec"], cpu_threads=int(job["threads"]))
    record["load_s"] = round(time.perf_counter() - t0, 3)
    record["native"] = tts.library.version()
    save()
    action = job["action"]
    audio = np.load(job["ref_audio"]).astype(np.float32) if job.get("ref_audio") else None
    if action in ("speaker", "encode"):
        t0 = time.perf_counter()
        voice = tts.extract_voice_ref(audio)
        record["extract_s"] = round(time.perf_counter() - t0, 3)
        if action == "speaker":
            np.save(out / "x_vector.npy", voice.ref_spk_emb.astype(np.float32))
        else:
            np.save(out / "codes.npy", voice.ref_codes.T.astype(np.int64))  # its [16, T] as the suite's [T, 16]
        record["voice"] = {"x_vector": list(voice.ref_spk_emb.shape), "codes": list(voice.ref_codes.shape)}
        save()
        return 0
    kwargs = dict(
        text=job["text"],
        lang=job.get("lang") or "auto",
        max_new_tokens=int(job["max_new_tokens"]),
        dump_dir=job["dump"],
        seed=0,
        **job["sampling"],
    )
    if action == "say":
        kwargs.update(speaker=job.get("speaker") or None, instruct=job.get("instruct") or None)
    else:
        kwargs.update(ref_audio_24k=audio, ref_text=job.get("ref_text") or None)
    Path(job["dump"]).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    samples, rate = tts.synthesize(**kwargs)
    record["synthesize_s"] = round(time.perf_counter() - t0, 3)
    record["profile"] = tts.last_synthesize_profile
    if rate != 24000:
        raise SystemExit(f"qwentts.cpp returned audio at {rate} Hz, not 24000")
    record["samples"] = int(samples.size)
    record["frames"] = samples.size / 1920
    np.save(out / "waveform.npy", np.asarray(samples, dtype=np.float32))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
