"""A cloned voice, computed by hand: reference audio -> x-vector and reference codes -> the ICL prompt ->
two frames -> samples, checked bit for bit against ``Qwen3TTS.generate_voice_clone``.

Run it from the repository root (or open docs/clone_walkthrough.ipynb, generated from this file):

    python docs/clone_walkthrough.py

It loads the tiny Base model embedded in the package (``refimpl/data/default-base``: random weights in the
released layout, Talker and x-vector 24 wide), makes a half-second reference recording, runs the speaker
encoder (log mels -> ECAPA-TDNN -> x-vector) and the codec encoder (waveform -> 16 codes per frame), lays
out the in-context-learning prompt, runs the Talker and the code predictor for two frames, decodes them
after the reference frames, and checks every number against the public API.  The ``# %%`` lines cut it
into the numbered sections of docs/clone_walkthrough.md, whose output blocks are this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # docs/ (a notebook runs there)
REPO = HERE.parent
if str(REPO) not in sys.path:  # run against this working tree even when refimpl is also installed
    sys.path.insert(0, str(REPO))

import refimpl  # noqa: E402
from refimpl import sampling  # noqa: E402
from refimpl.codec.decoder import decode_codes  # noqa: E402
from refimpl.tts import prompt  # noqa: E402
from refimpl.tts.prompt import build_layout, embed_layout  # noqa: E402
from refimpl.tts.speaker_encoder import encode_mels  # noqa: E402
from refimpl.tts.text_tokenizer import assistant_prompt, reference_prompt  # noqa: E402

try:  # figures are drawn where matplotlib is installed (pip install ".[docs]"); a notebook shows them inline
    import matplotlib.pyplot as plt
except ImportError:
    plt = None

MODEL = REPO / "refimpl" / "data" / "default-base"
TEXT, LANGUAGE = "Hello!", "english"
REF_TEXT = "Okay, listen to my voice."  # the transcript of the reference recording
SR = 24000


def show(name: str, value) -> None:
    """Print a name with the shape (arrays) or the value (short lists, numbers)."""
    if isinstance(value, np.ndarray):
        print(f"  {name:<40} {str(list(value.shape)):<16} {value.dtype}")
    else:
        print(f"  {name:<40} {value}")


class Stages(dict):
    """A trace that keeps only the stages named (a stage function records every submodule)."""

    def __init__(self, names):
        super().__init__()
        self.names, self.recorded = list(names), 0

    def __setitem__(self, name, value):
        self.recorded += 1  # every array the stage function recorded
        if name in self.names:
            super().__setitem__(name, value)


tts = refimpl.Qwen3TTS.from_pretrained(MODEL, dtype=np.float32)
cfg, talker, tok, se = tts.config, tts.talker, tts.speech_tokenizer, tts.speaker_encoder
t = cfg.talker_config
print(
    f"model: {MODEL.name}: talker width {t.hidden_size}, {t.num_hidden_layers} layers; "
    f"speaker encoder channels {list(se.config.enc_channels)} -> x-vector {se.config.enc_dim}"
)

# %% 1. The reference recording
# half a second at 24 kHz: a rising chirp and a hum (any mono recording of the voice to clone will do)
n = np.arange(SR // 2)
ref_audio = (
    0.4 * np.sin(2 * np.pi * (150 * n / SR + 400 * (n / SR) ** 2)) + 0.1 * np.sin(2 * np.pi * 90 * n / SR)
).astype(np.float32)
show("reference audio (24 kHz)", ref_audio)
show("seconds", len(ref_audio) / SR)
show("transcript", repr(REF_TEXT))

# %% 2. The log-mel spectrogram
# 1024-point STFT every 256 samples (10.7 ms), 128 Slaney mel bands up to 12 kHz, log
mels_tm = se.mels(ref_audio)
show("log mels [frames, bands]", mels_tm)
pad = (1024 - 256) // 2  # reflect padding on both sides, so that frame k is centred on sample 256 k
show(f"frames = 1 + (N + 2*{pad} - 1024) // 256", 1 + (len(ref_audio) + 2 * pad - 1024) // 256)
if plt is not None:
    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.imshow(mels_tm.T, origin="lower", aspect="auto", cmap="magma")
    ax.set(xlabel="mel frame (10.7 ms)", ylabel="mel band", title="what the speaker encoder hears")

# %% 3. ECAPA-TDNN: the x-vector
# the network over the mels, keeping the output of each block (the trace records every submodule)
n_blocks = len(se.config.enc_channels) - 1
stages = Stages(["blocks.0", *(f"blocks.{i}" for i in range(1, n_blocks)), "mfa", "asp.weights", "asp", "fc"])
traced_d = encode_mels(se.weights, se.config, mels_tm[None], trace=stages)[0]
print(f"  {len(stages)} of the {stages.recorded} arrays the network recorded:")
for name, value in stages.items():
    show(name, value)
show("x-vector", traced_d)
xvec_d = encode_mels(se.weights, se.config, mels_tm[None])[0]  # nothing recorded: each TDNN is one call
err = np.max(np.abs(xvec_d - traced_d)) / np.max(np.abs(traced_d))
print(f"    max |untraced - traced| / max |x-vector| {'<' if err < 1e-5 else '>='} 1e-5 (float32 summation order only)")
assert err < 1e-5
assert np.array_equal(xvec_d, tts.extract_speaker_embedding(ref_audio, SR)), "x-vector differs from the API"
print("    untraced = Qwen3TTS.extract_speaker_embedding, bit for bit")

# %% 4. The codec encoder: reference codes
# the same waveform through the codec encoder: SEANet (x960 down), a transformer, x2 down, split RVQ
strides = list(reversed(tok.config["encoder_config"]["upsampling_ratios"]))  # the decoder's, reversed
show("SEANet strides, then the downsample's", f"{strides} x 2 = {int(np.prod(strides)) * 2} samples per frame")
stages = Stages(["encoder", "encoder_transformer", "downsample"])
ref_codes_r16 = tok.encode(ref_audio, sr=SR, trace=stages)
print(f"  {len(stages)} of the {stages.recorded} arrays the encoder recorded:")
for name, value in stages.items():
    show(name, value)
show("reference codes [frames, 16]", ref_codes_r16)
show("frames = ceil(N / 1920)", -(-len(ref_audio) // 1920))
print("    frame 0:", ref_codes_r16[0].tolist())

# %% 5. The ICL prompt
ids = np.asarray(tts.text_tokenizer.encode(assistant_prompt(TEXT)), dtype=np.int64)
ref_ids = np.asarray(tts.text_tokenizer.encode(reference_prompt(REF_TEXT)), dtype=np.int64)
show("text ids (chat template)", ids)
show("reference text ids (chat template)", ref_ids)
layout = build_layout(
    cfg,
    ids,
    language=LANGUAGE,
    has_speaker_vector=True,
    ref_ids=ref_ids,
    ref_codes=ref_codes_r16,
    non_streaming_mode=False,
)
show("segments", [(name, end - start) for name, start, end in layout.segments])
show("speaker slot (the x-vector) at position", layout.speaker_position)
n_ref = len(ref_ids) - prompt.ROLE_TOKENS - prompt.REF_TAIL_TOKENS  # without the chat templates' role and tail
n_text = len(ids) - prompt.ROLE_TOKENS - prompt.TEXT_TAIL_TOKENS
show("icl text: reference + text + tts_eos", f"{n_ref} + {n_text} + 1 = {n_ref + n_text + 1} ids")
icl_start, icl_end = next((s, e) for name, s, e in layout.segments if name == "icl")
show("icl codec rows: bos + reference frames", f"{icl_end - icl_start} = 1 + {len(ref_codes_r16)}")
show("trailing text ids (one per new frame)", layout.trailing_ids)
prompt_tc = embed_layout(talker, layout, xvec_d)  # text stream + codec stream; the x-vector in its slot
trailing_nc = talker.embed_text(layout.trailing_ids)
pad_c = talker.embed_text([cfg.tts_pad_token_id])[0]
show("prompt vectors", prompt_tc)
text_tc = talker.embed_text(layout.text_ids)
assert np.array_equal(prompt_tc[layout.speaker_position], text_tc[layout.speaker_position] + xvec_d)
print(f"    position {layout.speaker_position} = the text stream's pad vector + the x-vector")

# %% 6. The Talker over the prompt, then frame 0
T = len(layout)
cache = talker.new_caches(batch=1)
hidden_bc = talker.forward(prompt_tc[None], np.arange(T)[None], np.ones((1, T), dtype=bool), cache)[:, -1]
logits_bv = talker.logits(hidden_bc)
show("logits of code 0 (talker vocab)", logits_bv)
eos = t.codec_eos_token_id
penalty = tts.generate_defaults.get("repetition_penalty", 1.05)
min_new_tokens = sampling.SamplingSettings().min_new_tokens


def next_frame(logits_bv, hidden_bc, previous_bn):
    """Greedy code 0 after the processors, then codes 1..15 from the code predictor: a frame [1, 16]."""
    scores = sampling.apply_repetition_penalty(logits_bv, previous_bn, penalty)
    scores = sampling.apply_min_new_tokens(scores, previous_bn.shape[1], min_new_tokens, eos)
    scores = sampling.apply_suppression(scores, sampling.suppressed_ids(t.vocab_size, eos))
    code0_b = np.argmax(scores, axis=-1)
    rest_b15, _ = talker.code_predictor.predict_frame(
        hidden_bc, talker.embed_codec(code0_b), lambda g, logits_bv: np.argmax(logits_bv, axis=-1)
    )
    frame_b16 = np.concatenate([code0_b[:, None], rest_b15], axis=1)
    print("    codes:", frame_b16[0].tolist())
    return frame_b16


def talker_step(frame_b16, step):
    """The frame back in as position T + step (its 16 embeddings summed + the next text vector)."""
    text_c = trailing_nc[step] if step < len(trailing_nc) else pad_c
    x_btc = (talker.embed_frames(frame_b16) + text_c)[:, None]
    hidden_bc = talker.forward(x_btc, np.array([[T + step]]), np.ones((1, T + step + 1), dtype=bool), cache)[:, -1]
    show(f"position {T + step}: keys/values cached", f"{T + step + 1} positions")
    return hidden_bc, talker.logits(hidden_bc)


frames = [next_frame(logits_bv, hidden_bc, np.zeros((1, 0), dtype=np.int64))]
hidden_bc, logits_bv = talker_step(frames[0], step=0)

# %% 7. Frame 1
frames.append(next_frame(logits_bv, hidden_bc, frames[0][:, :1]))
hidden_bc, logits_bv = talker_step(frames[1], step=1)
codes_t16 = np.concatenate(frames, axis=0)
show("new codes", codes_t16)

# %% 8. Decoding after the reference
# the decoder gets the reference frames first, as left context, and their samples are cut off
both_t16 = np.concatenate([ref_codes_r16, codes_t16], axis=0)
both_wav = decode_codes(tok.decoder_weights, tok.decoder_config, both_t16.T[None])[0]
cut = len(ref_codes_r16) * tok.samples_per_frame
wav = both_wav[cut:]
show("reference + new frames", both_t16)
show("decoded", both_wav)
show("cut: reference frames x 1920", cut)
show("waveform of the new frames", wav)
if plt is not None:
    fig, ax = plt.subplots(figsize=(8, 2.2))
    ax.plot(np.arange(both_wav.size) / SR, both_wav, linewidth=0.4)
    ax.axvline(cut / SR, color="#c53030")
    ax.set(xlabel="seconds", title="decoded reference frames | new frames (kept)")

# %% 9. The public API agrees
wavs, sr, api_codes = tts.generate_voice_clone(
    TEXT,
    language=LANGUAGE,
    ref_audio=(ref_audio, SR),
    ref_text=REF_TEXT,
    do_sample=False,
    subtalker_dosample=False,
    max_new_tokens=3,
    return_codes=True,
)
show("generate_voice_clone codes", api_codes[0])
show("waveform", wavs[0])
assert np.array_equal(api_codes[0], codes_t16), "codes differ from the public API"
assert sr == SR and np.array_equal(wavs[0], wav), "waveform differs from the public API"
print("    the same codes and the same samples")
