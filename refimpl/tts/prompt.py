"""The talker prompt: what goes in at every position, for every official mode.

Every prompt position is the SUM of two streams, both at talker width:

    text stream   text_projection(text_embedding(text id))          (every position has one)
    codec stream  one of: nothing | codec_embedding(control id) | the speaker vector |
                  a whole reference frame (sum of its 16 code embeddings)

A prompt is therefore fully described by ids (``PromptLayout``): a text id per position, a [T, 16]
array of codes (-1 = absent; a control id sits in column 0 alone), the position of the speaker vector,
and the "trailing" text ids that are fed one per generation step after the prompt.

Layout of one item (``docs/talker.md`` draws it; P = tts_pad, B = tts_bos, E = tts_eos text ids;
text = ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` tokenised, so ids[:3] is the
role prefix, ids[3:-5] the text, and the last 5 close the turn and open the reply):

    [instruct ids]      text: <|im_start|>user\\n{instruct}<|im_end|>\\n   codec: -       (when given)
    role                text: ids[0:3]                                      codec: -
    codec prefix        text: P ... P B                                     codec: think, think_bos, lang,
                                                                                   think_eos, [speaker], pad
                        (no language -> nothink, think_bos, think_eos)
    then one of:
    streaming           text: ids[3]                  + codec bos; trailing = ids[4:-5] + [E]
    non-streaming       text: ids[3:-5] + [E]         + codec pad each; then P + codec bos; trailing = [P]
    voice clone ICL     text t = ref_ids[3:-2] + ids[3:-5] + [E]; codec c = [bos] + reference frames
        non-streaming   t + codec pad each, then c + P each;                     trailing = [P]
        streaming       len(t) > len(c): t[:len(c)] + c;                         trailing = t[len(c):]
                        else:            (t padded with P to len(c)) + c;        trailing = [P]

After the prompt, generation step g feeds (sum of the 16 embeddings of the frame just made) +
(trailing[g] if g < len(trailing) else P).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..io.config import config_from_dict
from ..io.validate import check_codes, check_tts_config
from .talker import TalkerConfig

__all__ = [
    "TTSConfig",
    "PromptLayout",
    "resolve_language_id",
    "build_layout",
    "embed_layout",
    "assemble_batch",
    "ROLE_TOKENS",
    "TEXT_TAIL_TOKENS",
    "REF_TAIL_TOKENS",
]

ROLE_TOKENS = 3  # <|im_start|> assistant \n
TEXT_TAIL_TOKENS = 5  # <|im_end|> \n <|im_start|> assistant \n
REF_TAIL_TOKENS = 2  # <|im_end|> \n


@dataclass
class TTSConfig:
    """The top level of a Qwen3-TTS model's config.json."""

    talker_config: TalkerConfig | None = None
    speaker_encoder_config: dict | None = None
    tokenizer_type: str | None = None
    tts_model_size: str | None = None
    tts_model_type: str | None = None
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> TTSConfig:
        data = dict(data or {})
        talker = data.pop("talker_config", None)
        cfg = config_from_dict(cls, data)
        cfg.talker_config = TalkerConfig.from_dict(talker)
        check_tts_config(cfg)
        cfg.speaker_encoder_config = dict(cfg.speaker_encoder_config or {})
        return cfg


@dataclass
class PromptLayout:
    """The ids of one prompt (see the module docstring)."""

    text_ids: np.ndarray  # [T] text id per position
    codec_codes: np.ndarray  # [T, Q] codes; -1 = no codec part (group 0 holds control ids too)
    speaker_position: int  # position whose codec part is the speaker vector; -1 = none
    trailing_ids: np.ndarray  # [N] text ids fed one per generation step
    segments: list  # [(name, start, end)] for documentation and tests

    def __len__(self) -> int:
        return len(self.text_ids)


def resolve_language_id(cfg: TTSConfig, language: str, speaker: str | None):
    """The codec language id for a language name ('auto' -> None), with the dialect rule: a preset
    speaker marked as a dialect speaker switches Chinese or auto to that dialect's id."""
    t = cfg.talker_config
    if language is None:
        raise ValueError("language must be a language name or 'auto', not None")
    lang = str(language).lower()
    if lang == "auto":
        language_id = None
    elif lang in t.codec_language_id:
        language_id = t.codec_language_id[lang]
    else:
        raise ValueError(f"unsupported language {language!r}; the checkpoint knows {sorted(t.codec_language_id)}")
    if lang in ("chinese", "auto") and speaker not in (None, ""):
        dialect = t.spk_is_dialect.get(speaker.lower(), False)
        if dialect is not False and dialect is not None:
            if dialect not in t.codec_language_id:
                raise ValueError(
                    f"speaker {speaker!r} is marked as dialect {dialect!r}, which is not in codec_language_id"
                )
            language_id = t.codec_language_id[dialect]
    return language_id


def _check_ids(ids, what: str, head: int, tail: int, minimum_body: int = 1) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if len(ids) < head + tail + minimum_body:
        raise ValueError(
            f"{what} has {len(ids)} tokens: too short to hold the chat template "
            f"({head} + {tail} template tokens) and at least {minimum_body} text token(s)"
        )
    return ids


def build_layout(
    cfg: TTSConfig,
    input_ids,
    language: str = "auto",
    speaker: str | None = None,
    has_speaker_vector: bool = False,
    instruct_ids=None,
    ref_ids=None,
    ref_codes=None,
    non_streaming_mode: bool = False,
) -> PromptLayout:
    """The prompt of one item, as ids.

    input_ids        tokenised ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``
    speaker          a preset speaker name (CustomVoice) or None
    has_speaker_vector  True when a voice-clone x-vector fills the speaker slot (Base)
    instruct_ids     tokenised ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` or None
    ref_ids, ref_codes  voice clone ICL: tokenised ``<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`` and the
                     reference codes [T_ref, 16]
    """
    t = cfg.talker_config
    Q = t.num_code_groups
    ids = _check_ids(input_ids, "the text prompt", ROLE_TOKENS, TEXT_TAIL_TOKENS)
    language_id = resolve_language_id(cfg, language, speaker if not has_speaker_vector else None)

    text, codes, segments = [], [], []
    speaker_position = -1

    def add(name, text_ids, codec_rows):
        start = len(text)
        text.extend(int(i) for i in text_ids)
        codes.extend(codec_rows)
        segments.append((name, start, len(text)))

    def control(i):
        row = np.full(Q, -1, dtype=np.int64)
        row[0] = i
        return row

    none = np.full(Q, -1, dtype=np.int64)

    if instruct_ids is not None:
        instruct_ids = np.asarray(instruct_ids, dtype=np.int64).reshape(-1)
        add("instruct", instruct_ids, [none] * len(instruct_ids))
    add("role", ids[:ROLE_TOKENS], [none] * ROLE_TOKENS)

    # codec prefix: think/nothink tags, [language], [speaker], pad -- with tts_pad ... tts_bos as text
    if language_id is None:
        tags = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        tags = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
    prefix_rows = [control(i) for i in tags]
    if has_speaker_vector:
        speaker_position = len(text) + len(prefix_rows)
        prefix_rows.append(none)
    elif speaker not in (None, ""):
        if speaker.lower() not in t.spk_id:
            raise ValueError(f"unsupported speaker {speaker!r}; the checkpoint knows {sorted(t.spk_id)}")
        prefix_rows.append(control(t.spk_id[speaker.lower()]))
    prefix_rows.append(control(t.codec_pad_id))
    add("codec_prefix", [cfg.tts_pad_token_id] * (len(prefix_rows) - 1) + [cfg.tts_bos_token_id], prefix_rows)

    body = ids[ROLE_TOKENS:-TEXT_TAIL_TOKENS]
    P, E = cfg.tts_pad_token_id, cfg.tts_eos_token_id
    if ref_codes is not None:
        if ref_ids is None:
            raise ValueError("voice clone ICL needs the reference text (ref_text)")
        ref = _check_ids(ref_ids, "the reference text prompt", ROLE_TOKENS, REF_TAIL_TOKENS)
        ref_codes = check_codes(ref_codes, Q, t.code_predictor_config.vocab_size, what="reference codes")
        icl_text = list(ref[ROLE_TOKENS:-REF_TAIL_TOKENS]) + list(body) + [E]
        icl_codec = [control(t.codec_bos_id)] + list(ref_codes)
        if non_streaming_mode:
            add("icl_text", icl_text, [control(t.codec_pad_id)] * len(icl_text))
            add("icl_codec", [P] * len(icl_codec), icl_codec)
            trailing = [P]
        elif len(icl_text) > len(icl_codec):
            add("icl", icl_text[: len(icl_codec)], icl_codec)
            trailing = icl_text[len(icl_codec) :]
        else:
            add("icl", icl_text + [P] * (len(icl_codec) - len(icl_text)), icl_codec)
            trailing = [P]
    elif non_streaming_mode:
        add("text", list(body) + [E], [control(t.codec_pad_id)] * (len(body) + 1))
        add("bos", [P], [control(t.codec_bos_id)])
        trailing = [P]
    else:
        add("first_text", body[:1], [control(t.codec_bos_id)])
        trailing = list(body[1:]) + [E]
    return PromptLayout(
        np.asarray(text, dtype=np.int64),
        np.stack(codes).astype(np.int64),
        speaker_position,
        np.asarray(trailing, dtype=np.int64),
        segments,
    )


def embed_layout(talker, layout: PromptLayout, speaker_vector=None):
    """Prompt vectors [T, C]: text stream + codec stream at every position."""
    text_tc = talker.embed_text(layout.text_ids)
    codes = layout.codec_codes
    codec_tc = np.zeros_like(text_tc)
    has0 = codes[:, 0] >= 0
    codec_tc[nn.to_device(has0)] = talker.embed_codec(codes[has0, 0])
    for g in range(1, codes.shape[1]):
        present = codes[:, g] >= 0
        if present.any():
            rows = nn.to_device(present)
            codec_tc[rows] += talker.code_predictor.embed(g, codes[present, g])
    if layout.speaker_position >= 0:
        if speaker_vector is None:
            raise ValueError("this prompt has a speaker slot but no speaker vector was given")
        v = np.asarray(speaker_vector, dtype=text_tc.dtype).reshape(-1)
        if v.shape[0] != text_tc.shape[1]:
            raise ValueError(f"speaker embedding has {v.shape[0]} values, the talker width is {text_tc.shape[1]}")
        codec_tc[layout.speaker_position] = nn.to_device(v)
    return text_tc + codec_tc


def assemble_batch(prompts_tc: list, trailing_nc: list, pad_vector_c):
    """Left-pad a batch of prompts with zero vectors.

    returns embeds [B, T, C], key_valid [B, T] (False on padding), positions [B, T] (0, 1, ... from each
    row's first real position; padding gets 1, as the official), trailing [B, N, C] (padded with the
    tts_pad vector).  The vectors stay on the backend of the prompts; key_valid and positions are host
    bookkeeping (the generation loop extends them)."""
    B = len(prompts_tc)
    T = max(p.shape[0] for p in prompts_tc)
    C = prompts_tc[0].shape[1]
    dtype = prompts_tc[0].dtype
    embeds = nn.zeros((B, T, C), dtype=dtype)
    valid = np.zeros((B, T), dtype=bool)
    for b, p in enumerate(prompts_tc):
        embeds[b, T - p.shape[0] :] = p
        valid[b, T - p.shape[0] :] = True
    positions = np.where(valid, np.cumsum(valid, axis=1) - 1, 1)
    N = max(t.shape[0] for t in trailing_nc)
    trailing = np.broadcast_to(nn.to_device(pad_vector_c).astype(dtype, copy=False), (B, N, C)).copy()
    for b, t in enumerate(trailing_nc):
        trailing[b, : t.shape[0]] = t
    return embeds, valid, positions, trailing
