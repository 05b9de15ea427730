"""``Qwen3TTS``: the official public API (``qwen_tts.Qwen3TTSModel``) on the NumPy reference.

Loaded under a device backend (``with refimpl.use_backend("cupy"): Qwen3TTS.from_pretrained(...)``, or
``--backend cupy``) every network's weights go to the device once; the public methods stay NumPy in,
NumPy out and run on that device (docs/backends.md).

    tts = Qwen3TTS.from_pretrained("Qwen3-TTS-12Hz-1.7B-CustomVoice")          # dtype=numpy.float32
    wavs, sr = tts.generate_custom_voice("Hello.", speaker="vivian", language="english", seed=0)
    wavs, sr, codes = tts.generate_voice_design(["a", "b"], instruct="calm", return_codes=True,
                                                do_sample=False, subtalker_dosample=False)
    prompt = tts.create_voice_clone_prompt((audio, 16000), ref_text="...")        # Base models
    wavs, sr = tts.generate_voice_clone("Hi.", voice_clone_prompt=prompt)
    for chunk in tts.stream_custom_voice("Hello.", speaker="vivian", chunk_frames=4): ...   # one text

Every ``generate_*`` takes text as a string or a list (a batch); other per-item arguments may be one
value for the whole batch or a list of the same length (a list of one is broadcast), as the official.
Sampling keywords (``do_sample, top_k, top_p, temperature, repetition_penalty, subtalker_dosample,
subtalker_top_k, subtalker_top_p, subtalker_temperature, max_new_tokens``) default to the model's
generation_config.json, then to the official hard defaults.  ``seed`` seeds the NumPy generator used for
sampling; ``return_codes=True`` also returns the generated codes, one int64 array [T, 16] per item.
``trace=`` (a dict or ``refimpl.recorder.Recorder``) receives every module output under the official names
and the uniforms consumed (``refimpl.random_draws``); ``random_draws=`` replays such uniforms instead of
drawing them (docs/port_authors.md, ``refimpl.porting.trace_files``); ``forced_codes=`` (one [T, 16] array
per item, ``generate_*`` only) teacher-forces the run on those codes: it returns them, and its trace
records the logits of every step on that history.  ``progress=`` (``generate_*`` only; default
None: silent) is a callable ``progress(iterable, desc) -> iterable`` wrapped around the frame loop and
the decoder's chunk loop, e.g. ``progress=tqdm.tqdm`` (the command line passes its own bars).
"""

from __future__ import annotations

import contextvars
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from ..backends import device_backend, iterate_on_model_backend, on_model_backend, prepare_load
from ..backends.bf16 import BF16Matrix, mark_read_packed
from ..backends.host_memory import copy_into_huge_pages_later, huge_pages_enabled
from ..codec.speech_tokenizer import Progress, SpeechTokenizer
from ..io.audio import audio_as_float, check_sample_rate, read_wav
from ..io.checkpoint import (
    CheckpointError,
    check_prefixes,
    compute_dtype,
    is_lookup_table,
    read_checkpoint_weights,
    read_config,
    read_json_object,
    release_pages,
)
from ..io.hub import resolve_model
from ..io.mapped_files import read_pages_beside
from ..recorder import NULL_RECORDER, Recorder, as_recorder
from ..sampling import SamplingSettings, UniformDraws
from .code_predictor import read_packed_weight_names
from .generate import GenerationLog, generate_codes, iterate_frames
from .prompt import PromptLayout, TTSConfig, build_layout, embed_layout
from .speaker_encoder import SpeakerEncoder
from .talker import Talker
from .text_tokenizer import TextTokenizer, assistant_prompt, instruct_prompt, load_text_tokenizer, reference_prompt

__all__ = ["Qwen3TTS", "VoiceClonePromptItem", "HARD_DEFAULTS"]

# what the official wrapper falls back to when neither the call nor generation_config.json sets a value
HARD_DEFAULTS = dict(
    do_sample=True,
    top_k=50,
    top_p=1.0,
    temperature=0.9,
    repetition_penalty=1.05,
    subtalker_dosample=True,
    subtalker_top_k=50,
    subtalker_top_p=1.0,
    subtalker_temperature=0.9,
    max_new_tokens=2048,
)
_GEN_KEYS = tuple(HARD_DEFAULTS)
# the other keywords of every ``generate_*`` and ``stream_*`` call, read by ``_settings`` (in this order), and
# those that ``_generate`` reads (``trace`` in ``stream_*`` too); tests/porting/test_trace_options.py checks
# that ``refimpl trace`` reaches every one
_SETTINGS_KEYS = ("seed", "random_draws", "return_codes", "eos_token_id")
_GENERATE_KEYS = ("trace", "progress", "forced_codes")

# each mode (the name its ``generate_*`` and ``stream_*`` methods end in) -> the tts_model_type it needs
MODE_MODEL_TYPES = {"custom_voice": "custom_voice", "voice_design": "voice_design", "voice_clone": "base"}

# what every ``generate_*`` returns: (wavs, sample rate), and the codes [T, 16] of each item with return_codes=True
Generated = tuple[list[np.ndarray], int] | tuple[list[np.ndarray], int, list[np.ndarray]]
# a reference voice's audio: a WAV path, or (samples, sample rate)
RefAudio = str | Path | tuple[np.ndarray, int]
TTS = TypeVar("TTS", bound="Qwen3TTS")
R = TypeVar("R")


@dataclass
class VoiceClonePromptItem:
    """One reference voice (the official class of the same name, with NumPy arrays)."""

    ref_code: np.ndarray | None  # [T, 16] codes of the reference audio (ICL mode), None in x-vector mode
    ref_spk_embedding: np.ndarray  # [enc_dim] x-vector
    x_vector_only_mode: bool
    icl_mode: bool
    ref_text: str | None = None


@dataclass
class Prompts:
    """What a mode makes of its arguments: one entry per text, the same for every mode from there on."""

    layouts: list  # PromptLayout of each text
    speaker_vectors: list  # the x-vector in each prompt's speaker slot, or None (voice clone only)
    ref_codes: list  # the reference codes [T_ref, 16] each item's audio is decoded after (ICL), or None

    @classmethod
    def of_layouts(cls, layouts: list) -> Prompts:
        """The prompts of a mode without a reference voice."""
        return cls(layouts, [None] * len(layouts), [None] * len(layouts))


STREAM_CHUNK_FRAMES = (1, 2, 4)  # the default schedule: the first audio after one frame, then 2, then 4 at a time


def beside(load: Callable[..., R], *args: Any) -> Callable[[], R]:
    """Start ``load(*args)`` in a thread, in the caller's context (its backend); return the function that
    waits for it and gives its result or raises its error.  On a device backend it runs in the caller's
    thread when the result is asked for (a device's uploads stay on the thread that uses them)."""
    if device_backend() is not None:
        return partial(load, *args)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refimpl-load")
    future = pool.submit(contextvars.copy_context().run, load, *args)
    pool.shutdown(wait=False)  # (its thread ends with the load)
    return future.result


def code_predictor_read_packed(talker_weights: dict, cfg: Any) -> list:
    """The code predictor's read-packed matrices among the Talker's weights, marked as its constructor marks
    them (``mark_read_packed``: the same words, so what the backend makes of them now serves it later)."""
    names = ["code_predictor." + n for n in read_packed_weight_names(cfg.code_predictor_config, cfg.hidden_size)]
    marked = mark_read_packed(talker_weights, names)
    return [marked[n] for n in names if n in marked]


def warm_up_command(directory: Path) -> list[str] | None:
    """The command line of a first run's helper process for the model in ``directory``, which the numba backend
    starts on a first run on the machine to compile some of the model's kernels beside the load
    (``refimpl/tts/warm_up.py``): this interpreter (None where it cannot say where it is), the directory made
    absolute."""
    return [sys.executable, "-m", "refimpl.tts.warm_up", os.path.abspath(directory)] if sys.executable else None


def matrices_for_huge_pages(talker: Talker) -> list:
    """The Talker's bfloat16 matrices on the host that a generation step reads whole: every one but the
    lookup tables and the code predictor's read-packed matrices (the numba backend reads those from their
    packed copy; ``bf16.BF16Matrix.read_packed``), in the order of the steps (the Talker's, then the code
    predictor's)."""
    named = [(n, m) for n, m in talker.weights.items() if not n.startswith("code_predictor.")]
    named += list(talker.code_predictor.weights.items())
    return [
        m
        for n, m in named
        if isinstance(m, BF16Matrix) and isinstance(m.bits, np.ndarray) and not m.read_packed and not is_lookup_table(n)
    ]


def chunk_sizes(chunk_frames: int | Sequence[int]) -> Iterator[int]:
    """The frames of each streamed chunk, one after another, without end: ``chunk_frames`` an int (every
    chunk that many frames) or a sequence of ints (the first chunks' sizes; the last size repeats)."""
    sizes = (chunk_frames,) if isinstance(chunk_frames, (int, np.integer)) else chunk_frames
    try:
        sizes = tuple(sizes)
    except TypeError:
        sizes = ()
    if not sizes or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in sizes):
        raise ValueError(f"chunk_frames must be a positive integer or a sequence of them, got {chunk_frames!r}")
    return itertools.chain(sizes[:-1], itertools.repeat(sizes[-1]))


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) and not _is_audio_tuple(x) else [x]


def _is_audio_tuple(x: object) -> TypeGuard[tuple[np.ndarray, Any]]:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray)


def _per_text(texts: list, **arguments: tuple[Any, Any]) -> list[list]:
    """Each argument, given as ``(value, default)``, as one value per text: a list of len(texts) as it is,
    a list of one repeated, a single value (None -> default) for every text.  Returns the lists in the
    order given; ValueError naming the lengths when a list has another length (as the official)."""
    out = []
    for value, default in arguments.values():
        if isinstance(value, list):
            out.append(value * len(texts) if len(value) == 1 else list(value))
        else:
            out.append([default if value is None else value] * len(texts))
    if any(len(values) != len(texts) for values in out):
        sizes = ", ".join(f"{name}={len(values)}" for name, values in zip(arguments, out, strict=True))
        raise ValueError(f"Batch size mismatch: text={len(texts)}, {sizes}")
    return out


def record_layouts(record: Recorder, layouts: list) -> None:
    """Trace the ids of each prompt (``refimpl.talker.prompt.{text_ids, codec_ids, trailing_ids}.{item}``;
    codec_ids [T, 16] with -1 where a position has no codec part)."""
    for i, lay in enumerate(layouts):
        record.extra(f"talker.prompt.text_ids.{i}", np.asarray(lay.text_ids, dtype=np.int64))
        record.extra(f"talker.prompt.codec_ids.{i}", np.asarray(lay.codec_codes, dtype=np.int64))
        record.extra(f"talker.prompt.trailing_ids.{i}", np.asarray(lay.trailing_ids, dtype=np.int64))


def record_draws(record: Recorder, rng: object) -> None:
    """Trace the uniforms a run consumed (``refimpl.random_draws``), when ``rng`` keeps them."""
    if isinstance(rng, UniformDraws):
        record.extra("random_draws", rng.recorded())


class Qwen3TTS:
    """A Qwen3-TTS model (CustomVoice, VoiceDesign or Base) in NumPy.

    Each mode is one method that checks its arguments and turns them into ``Prompts``
    (``_custom_voice_prompts``, ``_voice_design_prompts``, ``_voice_clone_prompts``; their ``record`` traces
    what that runs: a voice clone's reference encode); the mode's public ``generate_*`` and ``stream_*``
    hand that method to the one generation path (``_generate``) or the one streaming path (``_stream``)."""

    def __init__(
        self,
        config: dict,
        talker: Talker,
        text_tokenizer: TextTokenizer,
        speech_tokenizer: SpeechTokenizer,
        speaker_encoder: SpeakerEncoder | None = None,
        generate_defaults: dict | None = None,
        dtype: DTypeLike = np.float32,
        directory: Path | None = None,
    ) -> None:
        self.config = TTSConfig.from_dict(config)
        self.talker = talker
        self.text_tokenizer = text_tokenizer
        self.speech_tokenizer = speech_tokenizer
        self.speaker_encoder = speaker_encoder
        self.generate_defaults = dict(generate_defaults or {})
        self.dtype = np.dtype(dtype).type
        self.directory = directory
        self.tts_model_type = self.config.tts_model_type
        self.tts_model_size = self.config.tts_model_size
        self.tokenizer_type = self.config.tokenizer_type
        self.last_log: GenerationLog | None = None
        # last_log keeps every step's logits only when asked (about 130 KB a frame at the released sizes)
        self.keep_logits = False
        # the device backend the networks were built under (None: the host); the public methods run there
        self.backend = getattr(talker, "backend", None)

    @property
    def last_trace(self) -> GenerationLog | None:  # vocab: old name
        """``last_log`` under its old name: what the last generation saw (not a trace)."""
        return self.last_log

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls: type[TTS], path: str | os.PathLike[str], dtype: DTypeLike = np.float32, revision: str | None = None
    ) -> TTS:
        """Load a model directory: config.json, model.safetensors (or shards), the text tokenizer files,
        generation_config.json and speech_tokenizer/.  ``path`` is a directory, an embedded model name
        ("default", "default-base", ...) or a Hugging Face repo id in the local cache
        ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", at ``revision``); see ``refimpl.io.hub.resolve_model``."""
        dtype = compute_dtype(dtype)
        directory = resolve_model(path, revision=revision)
        config = read_config(directory)
        if "talker_config" not in config:
            raise CheckpointError(f"{directory}/config.json has no talker_config: not a Qwen3-TTS model")
        cfg = TTSConfig.from_dict(config)
        check_prefixes(directory, ("talker.", "speaker_encoder."), f"Qwen3-TTS model ({directory})")
        if not (directory / "speech_tokenizer" / "config.json").is_file():
            raise CheckpointError(f"{directory} has no speech_tokenizer/config.json")
        # float32: bfloat16 matrices stay as stored (half the memory; widened where used, exactly), read from
        # the memory map until their copy in huge pages is made, on an idle core (off the first audio's path)
        talker_weights = read_checkpoint_weights(
            directory, dtype, prefix="talker.", keep_bf16=dtype == np.float32, huge_pages=False
        )
        # (numba: the first audio's kernels loaded from its cache and the code predictor's matrices packed, in
        # threads beside the checks; on a first run, a helper process compiling beside this one)
        read_packed = code_predictor_read_packed(talker_weights, cfg.talker_config)
        prepare_load(dtype, read_packed, warm_up_command(directory))
        # the codec read and checked beside the Talker (both wait mostly in NumPy loops and page faults, which
        # let the other threads run); its error, if any, is raised after the Talker's, as in sequence
        codec = beside(SpeechTokenizer.from_pretrained, directory / "speech_tokenizer", dtype)
        talker = Talker(cfg.talker_config, talker_weights, dtype)  # type: ignore[arg-type]  # from_dict sets it
        matrices = matrices_for_huge_pages(talker)  # (their pages mapped beside the load, not in the prompt's loops)
        read_pages_beside([m.bits for m in matrices], "refimpl-talker-pages")
        if huge_pages_enabled():
            copy_into_huge_pages_later(matrices, release=release_pages)
        speaker_encoder = None
        if cfg.tts_model_type == "base":
            speaker_encoder = SpeakerEncoder.from_pretrained(directory, dtype)
        # the text tokenizer while the codec's thread finishes (its load holds the interpreter, the codec's
        # mostly not); the codec's error, if any, still comes first, as in sequence
        try:
            text_tokenizer = load_text_tokenizer(directory)
        except Exception:
            codec()
            raise
        speech_tokenizer = codec()
        defaults = {}
        if (directory / "generation_config.json").is_file():
            defaults = read_json_object(directory / "generation_config.json")
        return cls(
            config,
            talker,
            text_tokenizer,
            speech_tokenizer,
            speaker_encoder,
            defaults,
            dtype,
            directory,
        )

    # ------------------------------------------------------------------ what the model supports

    def get_supported_speakers(self) -> list[str]:
        """Preset speaker names (lowercase, sorted); empty for Base and VoiceDesign models."""
        return sorted({str(s).lower() for s in self.config.talker_config.spk_id})  # type: ignore[union-attr]

    def get_supported_languages(self) -> list[str]:
        """'auto' and every language of codec_language_id except the dialects (lowercase, sorted)."""
        langs = {"auto"} | {str(k).lower() for k in self.config.talker_config.codec_language_id if "dialect" not in k}  # type: ignore[union-attr]
        return sorted(langs)

    @property
    def sample_rate(self) -> int:
        return int(self.speech_tokenizer.sample_rate)

    def _check_languages(self, languages: list) -> None:
        supported = set(self.get_supported_languages())
        bad = [lang for lang in languages if lang is None or str(lang).lower() not in supported]
        if bad:
            raise ValueError(f"Unsupported languages: {bad}. Supported: {sorted(supported)}")

    def _check_speakers(self, speakers: list) -> None:
        supported = set(self.get_supported_speakers())
        bad = [s for s in speakers if s not in (None, "") and str(s).lower() not in supported]
        if bad:
            raise ValueError(f"Unsupported speakers: {bad}. Supported: {sorted(supported)}")

    def _require_type(self, model_type: str, method: str) -> None:
        if self.tts_model_type != model_type:
            raise ValueError(
                f"{method} needs a {model_type!r} model; this checkpoint has tts_model_type "
                f"{self.tts_model_type!r} (size {self.tts_model_size!r})"
            )

    # ------------------------------------------------------------------ the modes' prompts

    @staticmethod
    def _texts(text: str | Sequence[str]) -> list[str]:
        """``text`` (a string, or a list: a batch) as a list of non-empty strings."""
        texts = _as_list(text)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text[{i}] must be a string, got {type(t).__name__}")
            if t == "":
                raise ValueError(f"text[{i}] is empty: there is nothing to say")
        return texts

    def _tokenize(self, text: str) -> np.ndarray:
        return np.asarray(self.text_tokenizer.encode(text), dtype=np.int64)

    def _layout(
        self,
        text: str,
        language: str,
        non_streaming_mode: bool,
        speaker: str | None = None,
        instruct: str | None = None,
        has_speaker_vector: bool = False,
        ref: VoiceClonePromptItem | None = None,
    ) -> PromptLayout:
        """The prompt of one text (``build_layout``): its chat turn, the language, a preset ``speaker`` or
        an x-vector's slot, the ``instruct`` turn (None or "": none) and, for an ICL voice clone, the
        reference's text and codes (``ref``, a ``VoiceClonePromptItem``)."""
        return build_layout(
            self.config,
            self._tokenize(assistant_prompt(text)),
            language,
            speaker,
            has_speaker_vector=has_speaker_vector,
            instruct_ids=None if instruct in (None, "") else self._tokenize(instruct_prompt(instruct)),
            # an ICL reference always has its text (``_voice_clone_prompts`` checks it)
            ref_ids=None if ref is None else self._tokenize(reference_prompt(ref.ref_text)),  # type: ignore[arg-type]
            ref_codes=None if ref is None else ref.ref_code,
            non_streaming_mode=non_streaming_mode,
        )

    def _custom_voice_prompts(
        self,
        text: str | Sequence[str],
        speaker: str | list[str] | None,
        language: str | list[str] | None,
        instruct: str | list[str] | None,
        non_streaming_mode: bool,
        record: Recorder = NULL_RECORDER,
    ) -> Prompts:
        """CustomVoice: a preset speaker's id in the speaker slot, and the instruct turn (not on 0.6B)."""
        texts = self._texts(text)
        if self.tts_model_size is not None and self.tts_model_size in "0b6":  # the official rule, verbatim
            instruct = None
        languages, speakers, instructs = _per_text(
            texts, language=(language, "Auto"), speaker=(speaker, None), instruct=(instruct, "")
        )
        self._check_languages(languages)
        self._check_speakers(speakers)
        return Prompts.of_layouts(
            [
                self._layout(t, lang, non_streaming_mode, speaker=spk, instruct=ins)
                for t, lang, spk, ins in zip(texts, languages, speakers, instructs, strict=True)
            ]
        )

    def _voice_design_prompts(
        self,
        text: str | Sequence[str],
        instruct: str | list[str] | None,
        language: str | list[str] | None,
        non_streaming_mode: bool,
        record: Recorder = NULL_RECORDER,
    ) -> Prompts:
        """VoiceDesign: no speaker; the voice is the instruct turn (always used)."""
        texts = self._texts(text)
        languages, instructs = _per_text(texts, language=(language, "Auto"), instruct=(instruct, None))
        self._check_languages(languages)
        return Prompts.of_layouts(
            [
                self._layout(t, lang, non_streaming_mode, instruct=ins)
                for t, lang, ins in zip(texts, languages, instructs, strict=True)
            ]
        )

    def _voice_clone_prompts(
        self,
        text: str | Sequence[str],
        language: str | list[str] | None,
        ref_audio: RefAudio | Sequence[RefAudio] | None,
        ref_text: str | list[str | None] | None,
        x_vector_only_mode: bool | list[bool],
        voice_clone_prompt: VoiceClonePromptItem | Sequence[VoiceClonePromptItem] | dict | None,
        non_streaming_mode: bool,
        record: Recorder = NULL_RECORDER,
    ) -> Prompts:
        """Voice clone (Base): the reference's x-vector in the speaker slot and, in ICL mode, its text and
        codes before the new text.  The reference voice is ``voice_clone_prompt``, else made from
        ``ref_audio`` (``create_voice_clone_prompt``, traced into ``record``)."""
        texts = self._texts(text)
        (languages,) = _per_text(texts, language=(language, "Auto"))
        self._check_languages(languages)
        items = self._voice_clone_items(ref_audio, ref_text, x_vector_only_mode, voice_clone_prompt, record)
        (items,) = _per_text(texts, prompt=(items, None))

        prompts = Prompts([], [], [])
        for t, lang, it in zip(texts, languages, items, strict=True):
            if not isinstance(it, VoiceClonePromptItem):
                raise ValueError(f"voice_clone_prompt items must be VoiceClonePromptItem, got {type(it).__name__}")
            icl = bool(it.icl_mode) and it.ref_code is not None
            if icl and (it.ref_text is None or it.ref_text == ""):
                raise ValueError("ref_text is required in ICL mode (x_vector_only_mode=False)")
            use_vector = bool(it.x_vector_only_mode) or bool(it.icl_mode)
            layout = self._layout(t, lang, non_streaming_mode, has_speaker_vector=use_vector, ref=it if icl else None)
            prompts.layouts.append(layout)
            prompts.speaker_vectors.append(it.ref_spk_embedding if use_vector else None)
            prompts.ref_codes.append(it.ref_code)
        return prompts

    # ------------------------------------------------------------------ generation

    @on_model_backend
    def generate_custom_voice(
        self,
        text: str | Sequence[str],
        speaker: str | list[str] | None,
        language: str | list[str] | None = None,
        instruct: str | list[str] | None = None,
        non_streaming_mode: bool = True,
        **kwargs: Any,
    ) -> Generated:
        """Speech in a preset speaker's voice (CustomVoice models); ``instruct`` is ignored on 0.6B models."""
        prompts = partial(self._custom_voice_prompts, text, speaker, language, instruct, non_streaming_mode)
        return self._generate("custom_voice", prompts, kwargs)

    @on_model_backend
    def generate_voice_design(
        self,
        text: str | Sequence[str],
        instruct: str | list[str] | None,
        language: str | list[str] | None = None,
        non_streaming_mode: bool = True,
        **kwargs: Any,
    ) -> Generated:
        """Speech in a voice described by ``instruct`` (VoiceDesign models); an empty instruct means none."""
        prompts = partial(self._voice_design_prompts, text, instruct, language, non_streaming_mode)
        return self._generate("voice_design", prompts, kwargs)

    @on_model_backend
    def generate_voice_clone(
        self,
        text: str | Sequence[str],
        language: str | list[str] | None = None,
        ref_audio: RefAudio | Sequence[RefAudio] | None = None,
        ref_text: str | list[str | None] | None = None,
        x_vector_only_mode: bool | list[bool] = False,
        voice_clone_prompt: VoiceClonePromptItem | Sequence[VoiceClonePromptItem] | dict | None = None,
        non_streaming_mode: bool = False,
        **kwargs: Any,
    ) -> Generated:
        """Speech in the voice of reference audio (Base models): x-vector only, or ICL (reference text +
        reference codes continue into the new text)."""
        prompts = partial(
            self._voice_clone_prompts,
            text,
            language,
            ref_audio,
            ref_text,
            x_vector_only_mode,
            voice_clone_prompt,
            non_streaming_mode,
        )
        return self._generate("voice_clone", prompts, kwargs)

    def _generate(self, mode: str, make_prompts: Callable[[Recorder], Prompts], kwargs: dict[str, Any]) -> Generated:
        """The body of every ``generate_*``: the model type the mode needs, the call's options out of
        ``kwargs`` (trace, progress, forced codes, sampling), the prompts (``make_prompts(record) ->
        Prompts``), the codes, then the audio (``_finish``)."""
        self._require_type(MODE_MODEL_TYPES[mode], f"generate_{mode}")
        trace, progress, forced = (kwargs.pop(k, None) for k in _GENERATE_KEYS)
        record = as_recorder(trace)
        settings, rng, return_codes, eos_id = self._settings(kwargs)
        prompts = make_prompts(record)
        self.last_log = GenerationLog(keep_logits=self.keep_logits)
        codes = self.generate_codes_from_layouts(
            prompts.layouts,
            prompts.speaker_vectors,
            settings,
            rng,
            eos_id,
            self.last_log,
            record,
            progress=progress,
            forced_codes=forced,
        )
        return self._finish(codes, return_codes, prompts.ref_codes, progress, record)

    def _settings(self, kwargs: dict[str, Any]) -> tuple[SamplingSettings, UniformDraws, bool, int]:
        """The sampling keywords of a ``generate_*`` or ``stream_*`` call (``_GEN_KEYS``, then
        ``_SETTINGS_KEYS``) -> (SamplingSettings, the random draws, return_codes, the EOS id)."""
        kwargs = dict(kwargs)
        seed, random_draws, return_codes, eos = (kwargs.pop(k, None) for k in _SETTINGS_KEYS)
        unknown = sorted(k for k in kwargs if k not in _GEN_KEYS)
        if unknown:
            raise ValueError(
                f"unknown generation keyword(s) {unknown}; accepted: {list(_GEN_KEYS)} + "
                f"{', '.join(_SETTINGS_KEYS)}, trace"
            )
        merged = {}
        for k in _GEN_KEYS:
            v = kwargs.get(k)
            merged[k] = v if v is not None else self.generate_defaults.get(k, HARD_DEFAULTS[k])
        settings = SamplingSettings(**merged)
        settings.validate(self.dtype)
        eos_id = self.config.talker_config.codec_eos_token_id if eos is None else int(eos)  # type: ignore[union-attr]
        return settings, UniformDraws(np.random.default_rng(seed), random_draws), bool(return_codes), eos_id

    @on_model_backend
    def generate_codes_from_layouts(
        self,
        layouts: list,
        speaker_vectors: list,
        settings: SamplingSettings,
        rng: UniformDraws | np.random.Generator,
        eos_id: int,
        log: GenerationLog | None = None,
        record: Recorder = NULL_RECORDER,
        *,
        progress: Progress | None = None,
        forced_codes: Sequence[np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """The model part of every mode: prompts (as ``PromptLayout``) -> codes [T, 16] per item.
        ``record`` receives the module outputs (``refimpl.porting.trace_files``) and, when ``rng`` is a
        ``UniformDraws``, every uniform consumed as ``refimpl.random_draws``."""
        prompts, trailing, pad = self._embed_prompts(layouts, speaker_vectors, record)
        codes = generate_codes(
            self.talker,
            prompts,
            trailing,
            pad,
            settings,
            eos_id,
            rng,
            log,
            record,
            progress=progress,
            forced_codes=forced_codes,
        )
        record_draws(record, rng)
        return codes

    def _embed_prompts(self, layouts: list, speaker_vectors: list, record: Recorder) -> tuple[list, list, Any]:
        """The vectors generation starts from: each prompt [T, C] (its speaker slot filled), each text's
        trailing vectors [N, C] and the tts_pad vector [C]; ``record`` receives the layouts' ids."""
        record_layouts(record, layouts)
        prompts = [embed_layout(self.talker, lay, vec) for lay, vec in zip(layouts, speaker_vectors, strict=True)]
        trailing = [self.talker.embed_text(lay.trailing_ids) for lay in layouts]
        pad = self.talker.embed_text([self.config.tts_pad_token_id])[0]
        return prompts, trailing, pad

    def _finish(
        self,
        codes: list[np.ndarray],
        return_codes: bool,
        ref_codes: list,
        progress: Progress | None = None,
        record: Recorder = NULL_RECORDER,
    ) -> Generated:
        """The audio of each item's codes, float32 as the official returns it; ``record`` receives it in the
        compute dtype (``refimpl.waveform.{i}``)."""
        wavs = []
        for i, (c, ref) in enumerate(zip(codes, ref_codes, strict=True)):
            if ref is None:
                wav = self.speech_tokenizer.decode(c, progress=progress)
            else:  # voice clone ICL: decode reference + new codes together, then cut the reference's share
                both = np.concatenate([np.asarray(ref, dtype=np.int64), c], axis=0)
                wav = self.speech_tokenizer.decode(both, progress=progress)
                wav = wav[int(len(ref) / max(len(both), 1) * wav.shape[0]) :]
            record.extra(f"waveform.{i}", wav)
            wavs.append(np.asarray(wav, dtype=np.float32))
        return (wavs, self.sample_rate, codes) if return_codes else (wavs, self.sample_rate)

    # ------------------------------------------------------------------ streaming

    @on_model_backend
    def stream_custom_voice(
        self,
        text: str | Sequence[str],
        speaker: str | list[str] | None,
        language: str | list[str] | None = None,
        instruct: str | list[str] | None = None,
        non_streaming_mode: bool = True,
        chunk_frames: int | Sequence[int] = STREAM_CHUNK_FRAMES,
        **kwargs: Any,
    ) -> Iterator[np.ndarray]:
        """Like ``generate_custom_voice`` for ONE text, but yields float32 waveform chunks while the frames
        are generated: ``chunk_frames`` frames each (n * 1920 samples), or with a sequence the first chunks'
        sizes, the last one repeated (default (1, 2, 4): the first audio as soon as one frame exists).
        The concatenated chunks are the same samples whatever the sizes, to float32 summation order (the
        same in float64 to rounding; docs/end_to_end.md)."""
        prompts = partial(self._custom_voice_prompts, text, speaker, language, instruct, non_streaming_mode)
        return self._stream("custom_voice", prompts, chunk_frames, kwargs)

    @on_model_backend
    def stream_voice_design(
        self,
        text: str | Sequence[str],
        instruct: str | list[str] | None,
        language: str | list[str] | None = None,
        non_streaming_mode: bool = True,
        chunk_frames: int | Sequence[int] = STREAM_CHUNK_FRAMES,
        **kwargs: Any,
    ) -> Iterator[np.ndarray]:
        """Like ``generate_voice_design`` for ONE text, yielding float32 waveform chunks (see
        ``stream_custom_voice``)."""
        prompts = partial(self._voice_design_prompts, text, instruct, language, non_streaming_mode)
        return self._stream("voice_design", prompts, chunk_frames, kwargs)

    @on_model_backend
    def stream_voice_clone(
        self,
        text: str | Sequence[str],
        language: str | list[str] | None = None,
        ref_audio: RefAudio | Sequence[RefAudio] | None = None,
        ref_text: str | list[str | None] | None = None,
        x_vector_only_mode: bool | list[bool] = False,
        voice_clone_prompt: VoiceClonePromptItem | Sequence[VoiceClonePromptItem] | dict | None = None,
        non_streaming_mode: bool = False,
        chunk_frames: int | Sequence[int] = STREAM_CHUNK_FRAMES,
        **kwargs: Any,
    ) -> Iterator[np.ndarray]:
        """Like ``generate_voice_clone`` for ONE text, yielding float32 waveform chunks (see
        ``stream_custom_voice``); in ICL mode the reference codes are pushed through the streaming
        decoder first as left context and their audio is not yielded."""
        prompts = partial(
            self._voice_clone_prompts,
            text,
            language,
            ref_audio,
            ref_text,
            x_vector_only_mode,
            voice_clone_prompt,
            non_streaming_mode,
        )
        return self._stream("voice_clone", prompts, chunk_frames, kwargs)

    def _stream(
        self,
        mode: str,
        make_prompts: Callable[[Recorder], Prompts],
        chunk_frames: int | Sequence[int],
        kwargs: dict[str, Any],
    ) -> Iterator[np.ndarray]:
        """The body of every ``stream_*``, its arguments checked at the call (as ``_generate``; ``kwargs``
        takes ``trace`` and the sampling keywords), then a generator: frames -> the exact streaming
        decoder -> float32 chunks (the concatenation equals ``SpeechTokenizer.decode_full`` of the codes,
        i.e. the official decode up to 300 frames).  ``trace`` receives the generation's trace, as
        ``generate_codes_from_layouts``."""
        self._require_type(MODE_MODEL_TYPES[mode], f"stream_{mode}")
        record = as_recorder(kwargs.pop("trace", None))
        settings, rng, _, eos_id = self._settings(kwargs)
        prompts = make_prompts(record)
        if len(prompts.layouts) != 1:
            raise ValueError(f"streaming takes one text at a time, got a batch of {len(prompts.layouts)}")
        sizes = chunk_sizes(chunk_frames)
        embedded, trailing, pad = self._embed_prompts(prompts.layouts, prompts.speaker_vectors, record)
        self.last_log = GenerationLog(keep_logits=self.keep_logits)
        log = self.last_log
        ref_codes = prompts.ref_codes[0]

        def chunks() -> Iterator[np.ndarray]:
            decoder = self.speech_tokenizer.stream()
            if ref_codes is not None:
                decoder.push(np.asarray(ref_codes, dtype=np.int64))  # left context only
            pending, target = [], next(sizes)
            for frame in iterate_frames(self.talker, embedded, trailing, pad, settings, eos_id, rng, log, record):
                pending.append(frame[0])
                if len(pending) == target:
                    yield np.asarray(decoder.push(np.stack(pending)), dtype=np.float32)
                    pending, target = [], next(sizes)
            if pending:
                yield np.asarray(decoder.push(np.stack(pending)), dtype=np.float32)
            record_draws(record, rng)

        return iterate_on_model_backend(self, chunks())

    # ------------------------------------------------------------------ reference voices (Base: voice clone)

    @on_model_backend
    def extract_speaker_embedding(
        self, audio: np.ndarray, sr: int = 24000, trace: Recorder | dict | None = None
    ) -> np.ndarray:
        """The x-vector [enc_dim] of mono audio (resampled to 24 kHz when ``sr`` differs).  ``trace`` (a dict
        or ``Recorder``) receives every module's output under ``speaker_encoder.`` (``refimpl.porting.trace_files``)."""
        if self.speaker_encoder is None:
            raise ValueError(f"extract_speaker_embedding needs a 'base' model (this one is {self.tts_model_type!r})")
        record = as_recorder(trace).scope("speaker_encoder.")
        xvec = self.speaker_encoder.embed(audio, sr, record)
        record.output(xvec[None])
        return xvec

    @on_model_backend
    def create_voice_clone_prompt(
        self,
        ref_audio: RefAudio | Sequence[RefAudio],
        ref_text: str | list[str | None] | None = None,
        x_vector_only_mode: bool | list[bool] = False,
        trace: Recorder | dict | None = None,
    ) -> list[VoiceClonePromptItem]:
        """Reference voice(s) -> ``VoiceClonePromptItem`` list: the reference codes (ICL mode) and x-vector.
        ``trace`` receives the speaker encoder's module outputs and, when an item is in ICL mode, the codec
        encoder's (``encoder.*``, the names of ``Qwen3TTSTokenizer.model``: the official object runs it
        outside ``Qwen3TTSModel.model``)."""
        self._require_type("base", "create_voice_clone_prompt")
        audios = _as_list(ref_audio)
        ref_texts = _as_list(ref_text) if isinstance(ref_text, list) else [ref_text] * len(audios)
        xvec = (
            _as_list(x_vector_only_mode) if isinstance(x_vector_only_mode, list) else [x_vector_only_mode] * len(audios)
        )
        if len(ref_texts) != len(audios) or len(xvec) != len(audios):
            raise ValueError(
                f"Batch size mismatch: ref_audio={len(audios)}, ref_text={len(ref_texts)}, "
                f"x_vector_only_mode={len(xvec)}"
            )
        loaded = [self._load_audio(a) for a in audios]
        for i, (rt, xo) in enumerate(zip(ref_texts, xvec, strict=True)):
            if not xo and (rt is None or rt == ""):
                raise ValueError(f"ref_text is required when x_vector_only_mode=False (ICL mode). Bad index={i}")
        rates = {sr for _, sr in loaded}
        # the ICL reference's codec encode is traced too (under the codec's names, ``encoder.*``)
        encode_trace = as_recorder(trace).scope("encoder.") if not all(xvec) else None
        if len(rates) == 1:
            codes = self.speech_tokenizer.encode([w for w, _ in loaded], sr=loaded[0][1], trace=encode_trace)
        else:
            codes = [self.speech_tokenizer.encode(w, sr=sr, trace=encode_trace) for w, sr in loaded]
        items = []
        for (wav, sr), code, rt, xo in zip(loaded, codes, ref_texts, xvec, strict=True):
            emb = self.extract_speaker_embedding(wav, sr, trace)
            items.append(
                VoiceClonePromptItem(
                    ref_code=None if xo else np.asarray(code, dtype=np.int64),
                    ref_spk_embedding=np.asarray(emb),
                    x_vector_only_mode=bool(xo),
                    icl_mode=bool(not xo),
                    ref_text=rt,
                )
            )
        return items

    def _voice_clone_items(
        self,
        ref_audio: RefAudio | Sequence[RefAudio] | None,
        ref_text: str | list[str | None] | None,
        x_vector_only_mode: bool | list[bool],
        voice_clone_prompt: VoiceClonePromptItem | Sequence[VoiceClonePromptItem] | dict | None,
        record: Recorder,
    ) -> list[VoiceClonePromptItem]:
        """The reference voices of a voice clone call: ``voice_clone_prompt`` (a list of items, one item, or
        the dict form), else those ``create_voice_clone_prompt`` makes of ``ref_audio``."""
        if voice_clone_prompt is None:
            if ref_audio is None:
                raise ValueError("Either `voice_clone_prompt` or `ref_audio` must be provided.")
            return self.create_voice_clone_prompt(ref_audio, ref_text, x_vector_only_mode, record)
        if isinstance(voice_clone_prompt, dict):
            return self._items_from_dict(voice_clone_prompt)
        if isinstance(voice_clone_prompt, VoiceClonePromptItem):
            return [voice_clone_prompt]
        return list(voice_clone_prompt)

    @staticmethod
    def _items_from_dict(d: dict) -> list[VoiceClonePromptItem]:
        try:
            n = len(d["ref_spk_embedding"])
            return [
                VoiceClonePromptItem(
                    ref_code=d["ref_code"][i] if d.get("ref_code") is not None else None,
                    ref_spk_embedding=d["ref_spk_embedding"][i],
                    x_vector_only_mode=bool(d["x_vector_only_mode"][i]),
                    icl_mode=bool(d["icl_mode"][i]),
                    ref_text=(d.get("ref_text") or [None] * n)[i],
                )
                for i in range(n)
            ]
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(
                f"voice_clone_prompt dict is malformed ({e!r}); pass the list that create_voice_clone_prompt returns"
            ) from None

    def _load_audio(self, a: object) -> tuple[np.ndarray, int]:
        if _is_audio_tuple(a):
            wav, sr = a
            wav = audio_as_float(wav, "ref_audio")  # int16 / int32 / uint8 PCM scaled to [-1, 1)
            if wav.ndim > 1:
                wav = np.mean(wav, axis=-1)
            return wav.astype(np.float32), check_sample_rate(sr, "ref_audio sample rate")
        if isinstance(a, np.ndarray):
            raise ValueError("For numpy waveform input, pass a tuple (audio, sr).")
        if isinstance(a, (str, Path)):
            wav, sr = read_wav(a)
            if wav.ndim > 1:
                wav = wav.mean(axis=-1)
            return wav.astype(np.float32), int(sr)
        raise ValueError(f"Unsupported audio input type: {type(a).__name__}; pass (waveform, sr) or a WAV path")
