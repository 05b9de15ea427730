"""One speed measure of one port, or of refimpl, in a fresh process; run by benchmarks/ports/speed.py. A port's
run is ``ENV/bin/python -I speed_worker.py JOB.json`` in its own environment (the standard library and the
port's package only: it never imports refimpl); refimpl's is the project's Python on the same file, so that
both sides are timed by the same lines.

JOB.json: {"port" (refimpl | vox | qwentts_cpp | candle_tts | mlx_audio), "measure" (frames | first-audio | decode),
"started" (the parent's ``time.time()`` just before it started this process), "model" (what the port loads:
a .tmod, [talker GGUF, codec GGUF], a checkpoint folder), "threads", "mode" (say | clone), "text",
"language", "speaker", "ref_audio" (a clone's 24 kHz reference, a list of floats), "feed" (refimpl's text
feed: streaming | non-streaming), "sampling" (qwentts.cpp's synthesize keywords), "lengths" (frames: the
max-token values of the warm-up, the short and the long generation), "first" (first-audio: the max-token
value), "stream" (first-audio: the port's streaming API, else the whole audio), "codes" (decode: a .npy)}.

Prints one line of JSON, the last line of its output:
  frames       {"runs": [{"seconds", "samples"} of the short, then the long generation]}, after a warm-up
               generation of the long length, not timed (and, in refimpl, the weights' copy in huge pages,
               as its own benchmarks wait for it); each generation gives its whole audio, decode included.
               Where the side can tell its generation from its decode, each run also holds "generation_s":
               refimpl's seconds less its decode's (its speech tokenizer's decode timed, "decode_s"),
               qwentts.cpp's own stage timings of the call (its "[Perf]" log lines: Talker steps, code
               predictor, host work; "stages" holds them all, the codec's included)
  first-audio  {"first_audio_s": time.time() at the first audio minus "started", "samples", "load_s"}
  decode       {"seconds", "samples"}: the decode of the codes, after a warm-up decode of their first frames
"""

import json
import os
import re
import sys
import time
from pathlib import Path

WARM_DECODE_FRAMES = 10  # the decode's warm-up: its first calls paid, not a second whole decode (slow ports)
GREEDY_VOX = dict(temperature=0.0, sub_temperature=0.0, decoder_mode="reference")


class Refimpl:
    """refimpl, through its public API, on the default backend."""

    def __init__(self, job: dict):
        from refimpl import Qwen3TTS

        self.job = job
        self.tts = Qwen3TTS.from_pretrained(job["model"])
        self.decode_s = 0.0  # the speech tokenizer's decode in the last generate
        decode = self.tts.speech_tokenizer.decode

        def timed_decode(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return decode(*args, **kwargs)
            finally:
                self.decode_s += time.perf_counter() - t0

        self.tts.speech_tokenizer.decode = timed_decode
        self.prompt = None
        if job["mode"] == "clone":
            import numpy as np

            audio = (np.asarray(job["ref_audio"], dtype=np.float32), 24000)
            self.prompt = self.tts.create_voice_clone_prompt(audio, x_vector_only_mode=True)

    def _options(self, n: int) -> dict:
        j = self.job
        options = dict(language=j["language"], non_streaming_mode=j["feed"] == "non-streaming", max_new_tokens=n)
        return dict(options, do_sample=False, subtalker_dosample=False)

    def generate(self, n: int) -> int:
        j = self.job
        self.decode_s = 0.0
        if self.prompt is None:
            wavs, _ = self.tts.generate_custom_voice(j["text"], j["speaker"], **self._options(n))
        else:
            wavs, _ = self.tts.generate_voice_clone(j["text"], voice_clone_prompt=self.prompt, **self._options(n))
        return len(wavs[0])

    def generation_only(self, seconds: float) -> dict:
        """The last generate's time less its decode's: the prompt, the Talker and the code predictor."""
        return {"generation_s": seconds - self.decode_s, "decode_s": self.decode_s}

    def first_chunk(self, n: int) -> int:
        j = self.job
        if self.prompt is None:
            stream = self.tts.stream_custom_voice(j["text"], j["speaker"], **self._options(n))
        else:
            stream = self.tts.stream_voice_clone(j["text"], voice_clone_prompt=self.prompt, **self._options(n))
        return len(next(stream))

    def decode(self, codes) -> int:
        return len(self.tts.speech_tokenizer.decode(codes))

    def settle(self) -> None:
        """The steady state, as refimpl's own benchmarks time it: the weights' copy in huge pages made (a
        thread copies them after the load, when a core is idle)."""
        from refimpl.backends.host_memory import wait_for_huge_pages

        wait_for_huge_pages()


class Vox:
    """vox's Engine: greedy, its streaming text feed, the official 300/25 decode (as vox_worker.py)."""

    def __init__(self, job: dict):
        import vox

        self.job = job
        self.engine = vox.Engine(job["model"], "cpu", int(job["threads"]))
        self.voice = self.engine.speaker_voice(job["speaker"], None)

    def _options(self, n: int) -> dict:
        return dict(max_frames=n, language=self.job["language"], **GREEDY_VOX)

    def generate(self, n: int) -> int:
        return int(self.engine.synthesize(self.job["text"], self.voice, **self._options(n)).size)

    def first_chunk(self, n: int) -> int:
        return int(next(iter(self.engine.stream(self.job["text"], self.voice, **self._options(n)))).size)


# qwentts.cpp's stage timings, logged at the end of each synthesis (its pipeline-tts.cpp, tts_log_perf)
PERF_LINE = re.compile(r"\[Perf\] (?P<stage>\w+) (?P<ms>[0-9.]+) ms(?: \((?P<frames>\d+) frames)?")
GENERATION_STAGES = ("TalkerDecode", "CodePredictor", "HostCompose")  # its "ms/frame AR": no prompt, no codec


def perf_stages(lines: list) -> dict | None:
    """qwentts.cpp's "[Perf] STAGE 12.3 ms ..." log lines of one synthesis -> {"stages": {stage: ms},
    "frames": its frame count, "generation_s": the Talker steps, the code predictor and the host work in
    seconds}; None where a generation stage is missing (a version that logs otherwise)."""
    stages, frames = {}, None
    for line in lines:
        m = PERF_LINE.search(line)
        if m:
            stages[m["stage"]] = float(m["ms"])
            frames = int(m["frames"]) if m["frames"] else frames
    if not all(s in stages for s in GENERATION_STAGES):
        return None
    return {"stages": stages, "frames": frames, "generation_s": sum(stages[s] for s in GENERATION_STAGES) / 1000}


class QwenttsCpp:
    """qwentts.cpp's QwenTTS (ctypes): greedy with the checkpoint's sampling values, no dump_dir (as
    qwentts_cpp_worker.py, less its dumps); its log lines caught (and passed on to stderr) for its stage
    timings."""

    def __init__(self, job: dict):
        import qwentts_cpp_cpu as qt

        self.job = job
        talker, codec = job["model"]
        self.log = []
        self.tts = qt.QwenTTS(talker, codec, cpu_threads=int(job["threads"]))
        self.tts.set_log_callback(self._logged)

    def _logged(self, level: int, message: str) -> None:
        self.log.append(message)
        print(message, file=sys.stderr, flush=True)

    def _options(self, n: int) -> dict:
        j = self.job
        return dict(text=j["text"], lang=j["language"], speaker=j["speaker"], max_new_tokens=n, seed=0, **j["sampling"])

    def generate(self, n: int) -> int:
        self.log.clear()
        samples, _ = self.tts.synthesize(**self._options(n))
        return int(samples.size)

    def generation_only(self, seconds: float) -> dict:
        """The last synthesis's own stage timings (``perf_stages``), {} where it logged none."""
        return perf_stages(self.log) or {}

    def first_chunk(self, n: int) -> int:
        chunk, _ = next(iter(self.tts.stream(**self._options(n))))
        return int(chunk.size)


class CandleTts:
    """candle-tts's Engine: a voice from the reference's x-vector, then greedy synthesis (as candle_tts_worker.py)."""

    def __init__(self, job: dict):
        import candle_tts

        self.job = job
        self.engine = candle_tts.Engine.load(job["model"], "qwen3", "cpu")
        self.voice = self.engine.extract_voice(job["ref_audio"], 24000, None)

    def generate(self, n: int) -> int:
        options = {"seed": 0, "temperature": 0, "max_tokens": n, "language": self.job["language"]}
        return len(self.engine.synthesize(self.job["text"], self.voice, json.dumps(options)).samples)


class MlxAudio:
    """mlx-audio's model on MLX's CPU backend, widened to float32 and greedy as mlx_audio_worker.py runs it
    (its ``widen`` and ``GREEDY``, loaded from that file); its stream yields a chunk every
    ``streaming_interval`` seconds of audio, here 0.08: one frame, as refimpl's first chunk."""

    def __init__(self, job: dict):
        import importlib.util

        from mlx_audio.tts.utils import load_model

        spec = importlib.util.spec_from_file_location(
            "mlx_audio_worker", Path(__file__).with_name("mlx_audio_worker.py")
        )
        worker = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(worker)
        self.job, self.greedy = job, worker.GREEDY
        self.model = load_model(Path(job["model"]))
        worker.widen(self.model)

    def _results(self, n: int, **stream):
        j = self.job
        return self.model.generate_custom_voice(
            j["text"], j["speaker"], language=j["language"], max_tokens=n, **self.greedy, **stream
        )

    def generate(self, n: int) -> int:
        import numpy as np

        return sum(np.array(r.audio).size for r in self._results(n))  # np.array: MLX computes lazily

    def first_chunk(self, n: int) -> int:
        import numpy as np

        return int(np.array(next(iter(self._results(n, stream=True, streaming_interval=0.08))).audio).size)

    def decode(self, codes) -> int:
        import mlx.core as mx
        import numpy as np

        audio, lengths = self.model.speech_tokenizer.decode(mx.array(codes[None]))
        return int(np.array(audio[0])[: int(lengths[0])].size)


PORTS = {"refimpl": Refimpl, "vox": Vox, "qwentts_cpp": QwenttsCpp, "candle_tts": CandleTts, "mlx_audio": MlxAudio}


def timed(fn, *args) -> dict:
    t0 = time.perf_counter()
    samples = fn(*args)
    return {"seconds": time.perf_counter() - t0, "samples": samples}


def timed_generation(port, n: int) -> dict:
    """``timed(port.generate, n)``, with the generation alone where the side tells it (``generation_only``)."""
    run = timed(port.generate, n)
    tell = getattr(port, "generation_only", None)
    return dict(run, **(tell(run["seconds"]) if tell else {}))


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    t0 = time.perf_counter()
    port = PORTS[job["port"]](job)
    load_s = time.perf_counter() - t0
    measure = job["measure"]
    if measure == "first-audio":
        samples = (port.first_chunk if job["stream"] else port.generate)(int(job["first"]))
        first_audio_s = time.time() - float(job["started"])
        result = {"first_audio_s": first_audio_s, "samples": samples, "load_s": load_s}
    elif measure == "frames":
        warm, short, long = (int(n) for n in job["lengths"])
        port.generate(warm)  # not timed: first calls, caches
        getattr(port, "settle", lambda: None)()
        result = {"runs": [timed_generation(port, short), timed_generation(port, long)], "load_s": load_s}
    elif measure == "decode":
        import numpy as np

        codes = np.load(job["codes"])
        port.decode(codes[:WARM_DECODE_FRAMES])  # not timed: first calls
        getattr(port, "settle", lambda: None)()
        result = dict(timed(port.decode, codes), load_s=load_s)
    else:
        raise SystemExit(f"unknown measure {measure!r}")
    print(json.dumps(result), flush=True)
    os._exit(0)  # a stream left open (its threads) does not hold the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
