"""The commands of ``refimpl``: say, design, clone (synthesis), codec encode / decode, info.

Each handler takes the parsed arguments and the ``Reporter`` and returns the exit status; the port
author's commands (trace, compare, golden, conformance) are in ``refimpl/porting/``."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np

from ..backends import active_backend
from ..io.hub import DATA, KIND_TO_EMBEDDED, embedded_model, resolve_model
from ..io.memory import loading
from .files import (
    MAX_WAV_BYTES,
    AudioOutput,
    input_bytes,
    output_name,
    read_codes,
    read_text_argument,
    write_audio,
    write_output,
)
from .output import CliError, Reporter, embedded_model_note

# model kind a command needs -> the embedded tiny checkpoint of that kind (refimpl/data/)
DEFAULT_MODELS = {kind: embedded_model(kind) for kind in KIND_TO_EMBEDDED}
RELEASED_HINT = (
    "pass --model with a released checkpoint for real speech: a directory, or a repo id already "
    "in the Hugging Face cache (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, -Base, -1.7B-VoiceDesign)"
)


def model_dir(args, kind: str, say: Reporter) -> Path:
    """The model directory of a command: ``--model`` is a directory, an embedded model name ("default" is the
    embedded model of the command's ``kind``, or "default-base", ...) or a Hugging Face repo id found in the
    local cache (``refimpl.io.hub.resolve_model``); without ``--model``, ``DEFAULT_MODELS[kind]``."""
    path = resolve_model(args.model, kind) if args.model else DEFAULT_MODELS[kind]
    if path.resolve().parent == DATA:
        embedded_model_note(say)
    return path


def load_tts(path: Path, dtype):
    from ..tts.model import Qwen3TTS

    with loading(f"the model in {path}"):  # memory that runs out while loading says so (io/memory.py)
        return Qwen3TTS.from_pretrained(path, dtype=dtype)


def load_codec(args, say: Reporter):
    from ..codec.speech_tokenizer import SpeechTokenizer

    path = model_dir(args, "custom_voice", say)
    with loading(f"the speech tokenizer of {path}"):
        return SpeechTokenizer.from_pretrained(path, dtype=args.dtype_np)


def generation_kwargs(args) -> dict:
    from ..porting.commands import TEXT_FEEDS

    kw = {"seed": args.seed}
    if args.greedy:
        kw.update(do_sample=False, subtalker_dosample=False)
    if args.max_new_tokens is not None:
        kw["max_new_tokens"] = args.max_new_tokens
    if args.text_feed is not None:
        kw["non_streaming_mode"] = TEXT_FEEDS[args.text_feed]
    return kw


def run_synthesis(args, say: Reporter, kind: str, method: str, make_call) -> int:
    """Shared body of say / design / clone: load, generate (or stream) with ``make_call(tts)`` as the
    arguments, with progress bars, and write the WAV (streamed to standard output chunk by chunk)."""
    path = model_dir(args, kind, say)
    t0 = time.perf_counter()
    tts = load_tts(path, args.dtype_np)
    say(f"loaded {path} in {time.perf_counter() - t0:.1f} s")
    call = dict(make_call(tts), **generation_kwargs(args))
    if "text" in call:
        call["text"] = read_text_argument(call["text"])
    t0 = time.perf_counter()
    sr = tts.sample_rate
    if args.stream:
        schedule = {} if args.chunk_frames is None else {"chunk_frames": args.chunk_frames}  # else the API's
        chunks = getattr(tts, "stream_" + method)(**schedule, **call)
        output = AudioOutput(args.output, sr, args.float_wav)
        write_stream(chunks, output, say)
        samples = output.samples
    else:
        wavs, sr, codes = getattr(tts, "generate_" + method)(return_codes=True, progress=say.progress, **call)
        samples = wavs[0].shape[0]
    elapsed = time.perf_counter() - t0
    seconds = samples / sr
    rtf = f", real-time factor {elapsed / seconds:.2f}" if seconds > 0 else ""
    say(f"{seconds:.2f} s of audio in {elapsed:.2f} s{rtf}")
    if args.stream:
        output.close()
    else:
        write_audio(args.output, wavs[0], sr, args.float_wav)
    say(f"wrote {output_name(args.output)}")
    return 0


def write_stream(chunks, output: AudioOutput, say: Reporter) -> None:
    """Each streamed waveform chunk to ``output`` as it comes, with a bar counting seconds of audio (and
    the time to the first chunk, the latency a listener would wait).  The bar is made once the first chunk
    is written: making it imports tqdm, which would delay the first audio."""
    t0 = time.perf_counter()
    bar, first = None, True
    for chunk in chunks:
        waited = time.perf_counter() - t0
        output.write(chunk)
        if first:
            first, bar = False, say.bar(desc="streamed audio")
            if bar is not None:
                bar.set_postfix_str(f"first chunk after {waited:.2f} s", refresh=False)
        if bar is not None:
            bar.update(round(chunk.shape[0] / output.sample_rate, 2))
    if bar is not None:
        bar.close()


def cmd_say(args, say: Reporter) -> int:
    def call(tts):
        speaker = args.speaker
        if speaker is None:
            speakers = tts.get_supported_speakers() or []
            if not speakers:
                raise CliError(
                    "this checkpoint has no preset speakers: 'say' needs a CustomVoice checkpoint "
                    "(use 'design' or 'clone' for the other model types)"
                )
            speaker = sorted(speakers)[0]
            say(f"speaker: {speaker} (choose with --speaker; see 'refimpl info')")
        if args.instruct and tts.tts_model_size is not None and tts.tts_model_size in "0b6":
            say("note: --instruct is ignored by 0.6B CustomVoice models (as by the official)")
        return dict(text=args.text, speaker=speaker, language=args.language, instruct=args.instruct)

    return run_synthesis(args, say, "custom_voice", "custom_voice", call)


def cmd_design(args, say: Reporter) -> int:
    return run_synthesis(
        args,
        say,
        "voice_design",
        "voice_design",
        lambda tts: dict(text=args.text, instruct=args.instruct, language=args.language),
    )


def cmd_clone(args, say: Reporter) -> int:
    from ..io.audio import read_wav

    if args.ref_text is None and not args.x_vector_only:
        raise CliError("clone needs --ref-text (the transcript of --ref-audio) or --x-vector-only")
    audio, sr = read_wav(args.ref_audio)
    if audio.ndim == 2:
        say(f"note: {audio.shape[1]}-channel reference audio mixed down to mono")
        audio = audio.mean(axis=1)
    return run_synthesis(
        args,
        say,
        "base",
        "voice_clone",
        lambda tts: dict(
            text=args.text,
            language=args.language,
            ref_audio=(audio, sr),
            ref_text=args.ref_text,
            x_vector_only_mode=args.x_vector_only,
        ),
    )


def cmd_codec_encode(args, say: Reporter) -> int:
    from ..io.audio import read_wav, read_wav_bytes

    data = input_bytes(args.input, "a WAV file", b"RIFF", MAX_WAV_BYTES)
    audio, sr = read_wav(args.input) if data is None else read_wav_bytes(data, "standard input")
    if audio.ndim == 2:
        say(f"note: {audio.shape[1]}-channel audio mixed down to mono")
        audio = audio.mean(axis=1)
    tok = load_codec(args, say)
    if sr != tok.input_sample_rate:
        say(f"note: resampling {sr} Hz to {tok.input_sample_rate} Hz")
    t0 = time.perf_counter()
    say(f"encoding {audio.shape[0] / sr:.2f} s of audio (one pass: no progress bar)")
    codes = tok.encode(audio, sr=sr)
    say(
        f"encoded {audio.shape[0] / sr:.2f} s into {codes.shape[0]} frames x {codes.shape[1]} codes "
        f"in {time.perf_counter() - t0:.2f} s"
    )
    buffer = io.BytesIO()
    np.save(buffer, codes)
    write_output(args.output, buffer.getvalue())
    say(f"wrote {output_name(args.output)}")
    return 0


def cmd_codec_decode(args, say: Reporter) -> int:
    codes = read_codes(args.input)
    tok = load_codec(args, say)
    t0 = time.perf_counter()
    if args.stream:
        if len(codes) == 0:
            tok.decode_full(codes)  # validates the (empty) array's shape
        stream, output = tok.stream(), AudioOutput(args.output, tok.sample_rate, args.float_wav)
        bar = None  # (made after the first chunk's audio, as in write_stream)
        for start in range(0, len(codes), args.chunk_frames):
            chunk = codes[start : start + args.chunk_frames]
            output.write(stream.push(chunk))
            if start == 0:
                bar = say.bar(desc="decoding", total=len(codes))
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        samples = output.samples
    else:
        wav = tok.decode(codes, progress=say.progress)
        samples = wav.shape[0]
    elapsed = time.perf_counter() - t0
    seconds = samples / tok.sample_rate
    say(
        f"{seconds:.2f} s of audio in {elapsed:.2f} s"
        + (f", real-time factor {elapsed / seconds:.2f}" if seconds else "")
    )
    if args.stream:
        output.close()
    else:
        write_audio(args.output, wav, tok.sample_rate, args.float_wav)
    say(f"wrote {output_name(args.output)}")
    return 0


def cmd_info(args, say: Reporter) -> int:
    from ..io.model_info import describe_model

    path = model_dir(args, "custom_voice", Reporter(quiet=True))
    if path.resolve().parent == DATA:  # 'refimpl info' always says what the embedded model is
        embedded_model_note(say, always=True)
        say(f"note: {RELEASED_HINT}")
    info = describe_model(path, args.dtype_np)
    backend, why = active_backend()
    info["backend"] = f"{backend} ({why})"
    if args.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(map(str, value)) if value else "(none)"
        print(f"{key:<{width}}  {value}")
    return 0
