"""Generation: prompt vectors -> codec frames [T, 16] per item, as the official ``generate``.

One generation step for a batch (B rows), after the prompt has been run through the talker
(prefill), with ``logits`` the talker's output at the last position and ``h`` its hidden state there:

    1. code 0:   scores = talker_scores(logits, codes 0 so far)   (``refimpl.sampling``)
                 c0 = argmax or sample; rows that already ended get EOS again
    2. stop when every row has produced EOS, or after ``max_new_tokens`` codes 0.  The code 0 drawn
       at the last step is never expanded into a frame, so without EOS a run returns
       max_new_tokens - 1 frames.  (The official runs that last Talker step all the same; here it runs
       only where its logits are looked at: kept in the ``GenerationLog`` or recorded.)
    3. codes 1..15: the code predictor on [h, codec_embedding(c0)]  (``refimpl.tts.code_predictor``)
    4. next talker input = sum of the 16 code embeddings of this frame
                           + the trailing text vector of this step (or tts_pad once the text ran out)
       at the next position of each row; one talker step with the KV cache -> new h, logits.

Finally each row is cut before its first frame whose code 0 is EOS.

On a device backend the networks, their KV caches and the prompt vectors stay on the device; what
crosses to the host per frame is exactly the logits the 16 codes are chosen from (one row of at most
vocab_size values each).  Sampling runs on the host, in float64, on those copies: the same arithmetic
on every backend, so the same recorded uniforms give the same ids (``refimpl.sampling.choose``), and the
chosen ids (host int64) are uploaded where they index an embedding table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import nn, sampling
from ..backends import host_memory
from ..io.validate import check_finite
from ..recorder import NULL_RECORDER, Recorder
from ..sampling import SamplingSettings
from .prompt import assemble_batch

__all__ = ["GenerationLog", "iterate_frames", "generate_codes", "check_prompt_length"]

# NaN logits would silently become code 0 (argmax) and EOS would never come: checked at every step
NON_FINITE_HINT = "damaged weights or an extreme speaker embedding?"


@dataclass
class GenerationLog:
    """What a run saw, for tests and debugging (filled when passed to ``generate_codes``); host arrays.
    It is ``Qwen3TTS.last_log``: a summary of one generation, not a module trace (those are recorded by
    ``refimpl.recorder`` and written by ``refimpl.porting.trace_files``).
    With ``keep_logits=False`` the three logits fields stay empty: they are most of its size (at the
    released sizes about 130 KB a frame, a gigabyte for the longest generations)."""

    prefill_logits: np.ndarray | None = None  # [B, V] talker logits at the last prompt position
    step_logits: list = field(default_factory=list)  # [B, V] per decode step
    predictor_logits: list = field(default_factory=list)  # [B, 15, V'] per frame
    code0: list = field(default_factory=list)  # [B] chosen code 0 per step (see ``wants_last_step``)
    frames: list = field(default_factory=list)  # [B, 16] per expanded frame
    prompt_embeds: np.ndarray | None = None  # [B, T, C] after left padding
    key_valid: np.ndarray | None = None  # [B, T]
    positions: np.ndarray | None = None  # [B, T]
    trailing: np.ndarray | None = None  # [B, N, C]
    keep_logits: bool = True

    def set(self, **values) -> None:
        for name, value in values.items():
            if self.keep_logits or name not in LOGITS_FIELDS:
                setattr(self, name, nn.to_host(value))

    def add(self, name: str, value) -> None:
        if self.keep_logits or name not in LOGITS_FIELDS:
            getattr(self, name).append(nn.to_host(value))


LOGITS_FIELDS = ("prefill_logits", "step_logits", "predictor_logits")

GenerationTrace = GenerationLog  # vocab: old name: the log of one generation, not a trace; kept for callers


class _NoLog:
    """Stands in for a ``GenerationLog`` when none is kept."""

    keep_logits = False

    def set(self, **values) -> None:
        pass

    def add(self, name: str, value) -> None:
        pass


def wants_last_step(log, record: Recorder) -> bool:
    """Whether to run the Talker step of the last code 0 (``max_new_tokens``), which no frame expands:
    only to keep or record its logits (a step-by-step comparison with the official, which runs it).
    Otherwise a run of ``max_new_tokens=2`` (prompt, one frame) skips a whole Talker step, at the 0.6B
    sizes about 880 MB of weights read for a code nobody uses; ``log.code0`` then ends with the last
    expanded frame's code 0, and a sampled run draws nothing for the skipped step."""
    return record.enabled or log.keep_logits


def check_prompt_length(positions_bt, max_new_tokens: int, max_position_embeddings: int) -> None:
    """Before any work: the prompt's positions plus one per generation step (the last code 0 is not fed
    back) must stay below the talker's ``max_position_embeddings``, the longest sequence it supports."""
    prompt = int(positions_bt.max()) + 1 if positions_bt.size else 0
    last = prompt - 1 + max(int(max_new_tokens) - 1, 0)
    if last >= max_position_embeddings:
        raise ValueError(
            f"the prompt has {prompt} positions and generation may add {max(int(max_new_tokens) - 1, 0)} "
            f"more, past the talker's max_position_embeddings {max_position_embeddings}: shorten the "
            "text (or reference) or lower max_new_tokens"
        )


def iterate_frames(
    talker,
    prompts_tc: list,
    trailing_nc: list,
    pad_vector_c,
    settings: SamplingSettings,
    eos_id: int,
    rng: np.random.Generator | sampling.UniformDraws | None = None,
    log: GenerationLog | None = None,
    record: Recorder = NULL_RECORDER,
    forced_btq=None,
):
    """Generate frame by frame: yields one int64 array [B, 16] per expanded frame, as soon as it is made.
    A row that already produced EOS gets frames whose code 0 is EOS (cut them, see ``generate_codes``).

    ``forced_btq`` (teacher forcing, [B, T, 16], code 0 = EOS where a row has ended): every code is still
    chosen and recorded (``sampling.chosen``), but the forced one is what the run continues with (history,
    penalty, next input, the frame yielded); after T frames every row gets EOS.  So the logits of every
    step are those of the forced history, comparable with a port's that produced these codes.

    ``record`` (a root ``Recorder``) receives every module output of the Talker and the code predictor
    under the official names (``talker.model.layers.0.mlp:3``... once named by ``CallLog.named``) and,
    under ``refimpl.talker.``, the prompt, the scores after each sampling step and the chosen ids."""
    settings.validate()
    log = log if log is not None else _NoLog()
    embeds, valid, positions, trailing = assemble_batch(prompts_tc, trailing_nc, pad_vector_c)
    check_prompt_length(positions, settings.max_new_tokens, talker.cfg.max_position_embeddings)
    if not 0 <= eos_id < talker.cfg.vocab_size:  # an EOS that can never be drawn: generation would never stop
        raise ValueError(f"eos_token_id {eos_id} is outside the talker vocabulary [0, {talker.cfg.vocab_size})")
    log.set(prompt_embeds=embeds, key_valid=valid, positions=positions, trailing=trailing)
    extra = record.extra_scope("talker.")
    extra("prompt.embeds", embeds)
    extra("prompt.key_valid", valid)
    extra("prompt.positions", positions)
    extra("prompt.trailing", trailing)
    extra("prompt.tts_pad", nn.to_host(pad_vector_c))
    B = embeds.shape[0]
    Q = talker.cfg.num_code_groups
    pad_vector = nn.to_device(pad_vector_c).astype(embeds.dtype, copy=False)

    sub_extra = extra.scope("code_predictor.sampling.")
    frame_logits = []  # the host copies of this frame's code-predictor logits
    forced_btq = None if forced_btq is None else check_forced(forced_btq, B, Q, talker.cfg.vocab_size, eos_id)
    now = [0]  # the step being expanded (what choose_sub forces)

    def choose_sub(g, logits_bv):
        logits_bv = nn.to_host(logits_bv)  # the one copy down
        frame_logits.append(logits_bv)
        check_finite(logits_bv, f"code predictor (group {g + 1} logits)", NON_FINITE_HINT)
        sub_extra("logits", logits_bv)
        ids = sampling.choose(
            sampling.subtalker_scores(logits_bv, settings, sub_extra), settings.subtalker_dosample, rng
        )
        sub_extra("chosen", ids)
        return ids if forced_btq is None else forced_btq[:, now[0], g + 1]

    caches = talker.new_caches(B)
    hidden, logits = talker_step(talker, embeds, positions, valid, caches, record)  # prefill
    logits = nn.to_host(logits)
    check_finite(logits, "talker (prompt prefill logits)", NON_FINITE_HINT)
    log.set(prefill_logits=logits)
    next_position = positions[:, -1] + 1
    previous = np.zeros((B, 0), dtype=np.int64)
    finished = np.zeros(B, dtype=bool)
    for step in range(settings.max_new_tokens):
        extra("sampling.logits", logits)
        scores = sampling.talker_scores(logits, previous, settings, eos_id, extra.scope("sampling."))  # 1. code 0
        code0 = np.where(finished, eos_id, sampling.choose(scores, settings.do_sample, rng))
        extra("sampling.chosen", code0)
        if forced_btq is not None:  # the history is the forced one
            code0 = forced_btq[:, step, 0] if step < forced_btq.shape[1] else np.full(B, eos_id, dtype=np.int64)
            now[0] = step
        previous = np.concatenate([previous, code0[:, None]], axis=1)
        finished |= code0 == eos_id
        log.add("code0", code0)
        if finished.all() or step + 1 == settings.max_new_tokens:  # 2. stop
            return
        frame_logits.clear()
        rest, predictor_logits = talker.code_predictor.predict_frame(
            hidden, talker.embed_codec(code0), choose_sub, Q - 1, record.scope("talker.code_predictor.")
        )  # 3.
        if not isinstance(predictor_logits, np.ndarray):  # on a device: the host copies already made
            predictor_logits = np.stack(frame_logits, axis=1)
        log.add("predictor_logits", predictor_logits)
        frame = np.concatenate([code0[:, None], rest], axis=1)
        log.add("frames", frame)
        yield frame
        host_memory.note_frames()  # (a generation long enough starts the weights' copy into huge pages)
        if step + 2 == settings.max_new_tokens and not wants_last_step(log, record):
            return  # the next step's code 0 would only be drawn (stop at 2.): its Talker step not run
        text_c = trailing[:, step] if step < trailing.shape[1] else np.broadcast_to(pad_vector, (B, pad_vector.size))
        x = (talker.embed_frames(frame) + text_c)[:, None]  # 4. next input
        valid = np.concatenate([valid, np.ones((B, 1), dtype=bool)], axis=1)
        hidden, logits = talker_step(talker, x, next_position[:, None], valid, caches, record)
        logits = nn.to_host(logits)
        check_finite(logits, f"talker (logits of generation step {step + 1})", NON_FINITE_HINT)
        next_position = next_position + 1
        log.add("step_logits", logits)


def check_forced(forced_btq, B: int, Q: int, vocab_size: int, eos_id: int) -> np.ndarray:
    """Forced codes as int64 [B, T, Q], every id in the talker's vocabulary (code 0) or the codebook."""
    f = np.asarray(forced_btq)
    if f.ndim != 3 or f.shape[0] != B or f.shape[2] != Q or f.dtype.kind not in "iu":
        raise ValueError(f"forced codes must be integers [B={B}, T, {Q}], got {f.dtype} {list(f.shape)}")
    f = f.astype(np.int64)
    if f.size and (f.min() < 0 or f[..., 0].max() >= vocab_size):
        raise ValueError(f"forced codes out of range [0, {vocab_size}): {f.min()}..{f.max()}")
    return f


def talker_step(talker, x_btc, positions_bt, valid_bs, caches, record: Recorder = NULL_RECORDER):
    """One Talker pass over new positions -> (hidden [B, C], logits [B, V]) at the last one.  When
    tracing, the official modules ``talker.model``, ``talker.codec_head`` and ``talker`` are recorded
    over all new positions, as the official forward computes them."""
    # What is read decides what is computed: a trace reads every new position (the official modules' outputs),
    # generation the last one's alone, and the fused stack then runs its last layer for that position only.
    last_only = not record.enabled
    hidden_btc = talker.forward(x_btc, positions_bt, valid_bs, caches, record.scope("talker.model."), last_only)
    hidden = hidden_btc[:, -1]
    logits = talker.logits(hidden)
    record("talker.model", hidden_btc)
    record("talker", record.lazy("talker.codec_head", talker.logits, hidden_btc))  # the Talker's output is its head's
    return hidden, logits


def generate_codes(
    talker,
    prompts_tc: list,
    trailing_nc: list,
    pad_vector_c,
    settings: SamplingSettings,
    eos_id: int,
    rng: np.random.Generator | sampling.UniformDraws | None = None,
    log: GenerationLog | None = None,
    record: Recorder = NULL_RECORDER,
    *,
    progress=None,
    forced_codes=None,
):
    """Generate frames for a batch of prompts; returns one int64 array [T_i, 16] per item (each row cut
    before its first frame whose code 0 is EOS).  ``progress``: None (silent) or a callable
    ``progress(iterable, desc) -> iterable`` wrapped around the frame loop, e.g. ``tqdm.tqdm``.
    ``forced_codes``: one [T_i, 16] array per item to teacher-force (``iterate_frames``); the run then
    returns them and lasts max T_i + 1 steps, whatever ``settings.max_new_tokens``."""
    Q = talker.cfg.num_code_groups
    forced = None
    if forced_codes is not None:
        forced = forced_frames(forced_codes, len(prompts_tc), Q, eos_id)
        settings = replace(settings, max_new_tokens=forced.shape[1] + 1)
    frames = iterate_frames(talker, prompts_tc, trailing_nc, pad_vector_c, settings, eos_id, rng, log, record, forced)
    frames = list(frames if progress is None else progress(frames, "generating frames"))
    B = len(prompts_tc)
    codes_bt16 = np.stack(frames, axis=1) if frames else np.zeros((B, 0, Q), dtype=np.int64)
    out = []
    for b in range(B):
        stops = np.flatnonzero(codes_bt16[b, :, 0] == eos_id)
        n = stops[0] if stops.size else codes_bt16.shape[1]
        out.append(codes_bt16[b, :n].copy())
    return out


def forced_frames(forced_codes: list, B: int, Q: int, eos_id: int) -> np.ndarray:
    """One [T_i, Q] code array per item -> [B, max T_i, Q], rows past their end padded with EOS frames."""
    if len(forced_codes) != B:
        raise ValueError(f"forced codes for {len(forced_codes)} items, the batch has {B}")
    items = [np.asarray(c) for c in forced_codes]
    for i, c in enumerate(items):
        if c.ndim != 2 or c.shape[1] != Q or (c.size and c.dtype.kind not in "iu"):
            raise ValueError(f"forced codes of item {i} must be integers [T, {Q}], got {c.dtype} {list(c.shape)}")
    T = max(c.shape[0] for c in items)
    out = np.zeros((B, T, Q), dtype=np.int64)
    out[:, :, 0] = eos_id
    for i, c in enumerate(items):
        out[i, : c.shape[0]] = c
    return out
