"""One frame of Qwen3-TTS, computed by hand: text -> prompt -> Talker -> code predictor -> 1920 samples.

Run it from the repository root (or open docs/walkthrough.ipynb, generated from this file):

    python docs/walkthrough.py

It loads the tiny CustomVoice model embedded in the package (random weights in the released layout:
the numbers are meaningless, the computation is the real one), builds the prompt, runs the Talker and
the code predictor step by step, decodes the frames, prints the shape of everything on the way, and
checks the result against the public API (``Qwen3TTS.generate_custom_voice``, greedy).  The ``# %%``
lines cut it into the numbered sections of docs/walkthrough.md, whose output blocks are this script's
output (``python docs/tools/walkthroughs.py`` writes them; tests/test_docs.py checks them).
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
from refimpl.tts.prompt import build_layout, embed_layout  # noqa: E402
from refimpl.tts.text_tokenizer import assistant_prompt  # noqa: E402

try:  # figures are drawn where matplotlib is installed (pip install ".[docs]"); a notebook shows them inline
    import matplotlib.pyplot as plt
except ImportError:
    plt = None

MODEL = REPO / "refimpl" / "data" / "default-customvoice"  # what `refimpl say` uses without --model
TEXT, SPEAKER, LANGUAGE = "Hello!", "vivian", "english"


def show(name: str, value) -> None:
    """Print a name with the shape (arrays) or the value (short lists, numbers)."""
    if isinstance(value, np.ndarray):
        print(f"  {name:<34} {str(list(value.shape)):<16} {value.dtype}")
    else:
        print(f"  {name:<34} {value}")


class Stages(dict):
    """A trace that keeps only the stages named: a stage function records every submodule (the codec
    decoder about 230 of them), the page shows the few it explains."""

    def __init__(self, names):
        super().__init__()
        self.names, self.recorded = list(names), 0

    def __setitem__(self, name, value):
        self.recorded += 1  # every array the stage function recorded
        if name in self.names:
            super().__setitem__(name, value)


tts = refimpl.Qwen3TTS.from_pretrained(MODEL, dtype=np.float32)
cfg, talker, tok = tts.config, tts.talker, tts.speech_tokenizer
t = cfg.talker_config
print(
    f"model: {MODEL.name}: talker width {t.hidden_size}, {t.num_hidden_layers} layers, "
    f"{t.num_attention_heads} query / {t.num_key_value_heads} key-value heads of {t.head_dim}; "
    f"code predictor width {t.code_predictor_config.hidden_size}"
)

# %% 1. The prompt
# text -> ids -> prompt layout (ids per position) -> prompt vectors (two summed streams)
ids = np.asarray(tts.text_tokenizer.encode(assistant_prompt(TEXT)), dtype=np.int64)
show("text ids (chat template)", ids)
layout = build_layout(cfg, ids, language=LANGUAGE, speaker=SPEAKER, non_streaming_mode=True)
show("layout.text_ids", layout.text_ids)
show("layout.codec_codes (-1 = none)", layout.codec_codes)
show("segments", [(name, end - start) for name, start, end in layout.segments])
prompt_tc = embed_layout(talker, layout)  # text stream + codec stream
trailing_nc = talker.embed_text(layout.trailing_ids)  # fed one per step after the prompt
pad_c = talker.embed_text([cfg.tts_pad_token_id])[0]  # ... then tts_pad forever
show("prompt vectors", prompt_tc)
show("trailing text vectors", trailing_nc)

# %% 2. The Talker over the prompt (prefill)
# the whole prompt at once -> the KV cache filled, logits of code 0 of frame 0
T = len(layout)
cache = talker.new_caches(batch=1)
positions_bt = np.arange(T)[None]  # one row, no left padding
key_valid_bs = np.ones((1, T), dtype=bool)
hidden_btc = talker.forward(prompt_tc[None], positions_bt, key_valid_bs, cache)
hidden_bc = hidden_btc[:, -1]
logits_bv = talker.logits(hidden_bc)
show("hidden states", hidden_btc)
show("logits of code 0 (talker vocab)", logits_bv)

# %% 3. Code 0, then the code predictor
# greedy code 0: the processors that act without sampling (sampling.py's steps 1-3)
eos = t.codec_eos_token_id
penalty = tts.generate_defaults.get("repetition_penalty", 1.05)  # generation_config.json
min_new_tokens = sampling.SamplingSettings().min_new_tokens  # 2: no EOS before 2 codes


def choose_code0(logits_bv, previous_bn):
    scores = sampling.apply_repetition_penalty(logits_bv, previous_bn, penalty)
    scores = sampling.apply_min_new_tokens(scores, previous_bn.shape[1], min_new_tokens, eos)
    scores = sampling.apply_suppression(scores, sampling.suppressed_ids(t.vocab_size, eos))
    return np.argmax(scores, axis=-1)


def next_frame(logits_bv, hidden_bc, previous_bn):
    """Code 0 from the Talker's logits, codes 1..15 from the code predictor: one frame [1, 16]."""
    code0_b = choose_code0(logits_bv, previous_bn)
    print(f"  code 0 = {int(code0_b[0])} (argmax after the processors)")
    shapes = []

    def greedy(g, logits_bv):  # called once per step with head g's logits
        shapes.append(logits_bv.shape)
        return np.argmax(logits_bv, axis=-1)

    rest_b15, _ = talker.code_predictor.predict_frame(hidden_bc, talker.embed_codec(code0_b), greedy)
    show("code predictor steps", f"{len(shapes)} heads, logits {list(shapes[0])} each")
    frame_b16 = np.concatenate([code0_b[:, None], rest_b15], axis=1)
    show("frame (16 codes)", frame_b16)
    print("    codes:", frame_b16[0].tolist())
    return frame_b16


previous = np.zeros((1, 0), dtype=np.int64)  # the code 0s so far (for the repetition penalty)
frame_b16 = next_frame(logits_bv, hidden_bc, previous)
frames = [frame_b16]

# %% 4. One Talker step with the KV cache
# the frame goes back in as ONE position: the sum of its 16 code embeddings + the next text vector


def talker_step(frame_b16, step):
    """Feed frame ``step`` at position T + step; returns the new last hidden state and logits."""
    text_c = trailing_nc[step] if step < len(trailing_nc) else pad_c
    x_btc = (talker.embed_frames(frame_b16) + text_c)[:, None]
    key_valid_bs = np.ones((1, T + step + 1), dtype=bool)
    hidden_bc = talker.forward(x_btc, np.array([[T + step]]), key_valid_bs, cache)[:, -1]
    logits_bv = talker.logits(hidden_bc)
    show("input vector", x_btc)
    show("keys/values cached", f"{T + step + 1} positions")
    show("logits of the next code 0", logits_bv)
    return hidden_bc, logits_bv


hidden_bc, logits_bv = talker_step(frame_b16, step=0)

# %% 5. Frame 1: the same two steps
previous = np.concatenate([frame[:, :1] for frame in frames], axis=1)  # frame 0's code 0 is penalised now
show("repetition penalty on codes", f"{previous[0].tolist()} (penalty {penalty}, generation_config.json)")
frame_b16 = next_frame(logits_bv, hidden_bc, previous)
frames.append(frame_b16)
hidden_bc, logits_bv = talker_step(frame_b16, step=1)

# %% 6. Decoding
# 16 codes per frame -> 1920 samples at 24 kHz; the trace keeps the decoder's top-level stages only
codes_t16 = np.concatenate(frames, axis=0)
dc = tok.decoder_config
stages = Stages(
    ["quantizer", "pre_conv", "pre_transformer"]
    + [f"upsample.{i}" for i in range(len(dc.upsampling_ratios))]
    + [f"decoder.{i}" for i in range(len(dc.upsample_rates) + 3)]
)
wav = decode_codes(tok.decoder_weights, dc, codes_t16.T[None], trace=stages)[0]
print(f"  {len(stages)} of the {stages.recorded} arrays the decoder recorded:")
for name, value in stages.items():
    show(name, value)
show("waveform", wav)
untraced = tok.decode_full(codes_t16)  # nothing recorded: the numba backend runs each residual unit in one call
err = np.max(np.abs(untraced - wav))
print(f"    max |untraced - traced| {'<' if err < 2e-6 else '>='} 2e-6 (float32 summation order only)")
assert err < 2e-6
stream = tok.stream()
streamed = np.concatenate([stream.push(codes_t16[i : i + 1]) for i in range(len(codes_t16))])
show("streamed, one frame per push", streamed)
err = np.max(np.abs(streamed - wav))
print(f"    max |streamed - one pass| {'<' if err < 2e-5 else '>='} 2e-5 (float32 summation order only)")
assert err < 2e-5
if plt is not None:  # channel 0 of every stage, on one time axis (two frames = 160 ms)
    fig, axes = plt.subplots(len(stages), 1, figsize=(9, 0.55 * len(stages)), sharex=True)
    for ax, (name, x) in zip(axes, stages.items(), strict=True):
        y = (x[0, :, 0] if name == "pre_transformer" else x[0, 0]).astype(np.float64)  # [B, T, C] there
        ax.plot((np.arange(y.size) + 0.5) / y.size * len(frames), y, linewidth=0.6)
        ax.set_yticks([])
        ax.set_ylabel(f"{name} {list(x.shape)}", rotation=0, ha="right", va="center", fontsize=7)
    axes[-1].set_xlabel("time in frames")

# %% 7. The public API agrees
wavs, sr, api_codes = tts.generate_custom_voice(
    TEXT,
    speaker=SPEAKER,
    language=LANGUAGE,
    do_sample=False,
    subtalker_dosample=False,
    max_new_tokens=3,
    return_codes=True,
)
show("generate_custom_voice codes", api_codes[0])
show("waveform", wavs[0])
assert np.array_equal(api_codes[0], codes_t16), "codes differ from the public API"
assert sr == 24000 and np.array_equal(wavs[0], untraced), "waveform differs from the public API"
print("    the same codes and the same samples")
