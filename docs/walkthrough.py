"""One frame of Qwen3-TTS, computed by hand: text -> prompt -> Talker -> code predictor -> 1920 samples.

Run it from the repository root:

    python docs/walkthrough.py

It loads the tiny CustomVoice model embedded in the package (random weights in the released layout:
the numbers are meaningless, the computation is the real one), builds the prompt, runs the Talker and
the code predictor step by step, decodes the frames, prints the shape of everything on the way, and
checks the result against the public API (``Qwen3TTS.generate_custom_voice``, greedy).  The test suite
runs it (tests/test_docs.py).  docs/walkthrough.md reads it line by line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run against this working tree even when refimpl is also installed
    sys.path.insert(0, str(REPO))

import refimpl  # noqa: E402
from refimpl import sampling  # noqa: E402
from refimpl.codec.decoder import decode_codes  # noqa: E402
from refimpl.tts.prompt import build_layout, embed_layout  # noqa: E402
from refimpl.tts.text_tokenizer import assistant_prompt  # noqa: E402

MODEL = REPO / "refimpl" / "data" / "default-customvoice"  # what `refimpl say` uses without --model
TEXT, SPEAKER, LANGUAGE = "Hello!", "vivian", "english"


def show(name: str, value) -> None:
    """Print a name with the shape (arrays) or the value (short lists, numbers)."""
    if isinstance(value, np.ndarray):
        print(f"  {name:<34} {str(list(value.shape)):<16} {value.dtype}")
    else:
        print(f"  {name:<34} {value}")


def main() -> None:
    tts = refimpl.Qwen3TTS.from_pretrained(MODEL, dtype=np.float32)
    cfg, talker, tok = tts.config, tts.talker, tts.speech_tokenizer
    t = cfg.talker_config
    print(
        f"model: {MODEL.name}: talker width {t.hidden_size}, {t.num_hidden_layers} layers, "
        f"{t.num_attention_heads} query / {t.num_key_value_heads} key-value heads of {t.head_dim}; "
        f"code predictor width {t.code_predictor_config.hidden_size}"
    )

    # ---- 1. text -> ids -> prompt layout (ids per position) -> prompt vectors (two summed streams)
    print("\n1. the prompt")
    ids = np.asarray(tts.text_tokenizer.encode(assistant_prompt(TEXT)), dtype=np.int64)
    show("text ids (chat template)", ids)
    layout = build_layout(cfg, ids, language=LANGUAGE, speaker=SPEAKER, non_streaming_mode=True)
    show("layout.text_ids", layout.text_ids)
    show("layout.codec_codes (-1 = none)", layout.codec_codes)
    show("segments", [(name, end - start) for name, start, end in layout.segments])
    prompt_th = embed_layout(talker, layout)  # text stream + codec stream
    trailing_nh = talker.embed_text(layout.trailing_ids)  # fed one per step after the prompt
    pad_h = talker.embed_text([cfg.tts_pad_token_id])[0]  # ... then tts_pad forever
    show("prompt vectors", prompt_th)
    show("trailing text vectors", trailing_nh)

    # ---- 2. the Talker over the whole prompt (prefill) -> logits of code 0 of frame 0
    print("\n2. the Talker, prefill")
    T = len(layout)
    cache = talker.new_caches(batch=1)
    positions_bt = np.arange(T)[None]  # one row, no left padding
    key_valid_bs = np.ones((1, T), dtype=bool)
    hidden_bth = talker.forward(prompt_th[None], positions_bt, key_valid_bs, cache)
    hidden_bh = hidden_bth[:, -1]
    logits_bv = talker.logits(hidden_bh)
    show("hidden states", hidden_bth)
    show("logits of code 0 (talker vocab)", logits_bv)

    # greedy code 0: the processors that act without sampling (sampling.py's steps 1-3)
    eos = t.codec_eos_token_id
    penalty = tts.generate_defaults.get("repetition_penalty", 1.05)  # generation_config.json
    min_new_tokens = sampling.SamplingSettings().min_new_tokens  # 2: no EOS before 2 codes

    def choose_code0(logits_bv, previous_bn):
        scores = sampling.apply_repetition_penalty(logits_bv, previous_bn, penalty)
        scores = sampling.apply_min_new_tokens(scores, previous_bn.shape[1], min_new_tokens, eos)
        scores = sampling.apply_suppression(scores, sampling.suppressed_ids(t.vocab_size, eos))
        return np.argmax(scores, axis=-1)

    previous = np.zeros((1, 0), dtype=np.int64)
    frames = []
    for step in range(2):
        code0_b = choose_code0(logits_bv, previous)
        previous = np.concatenate([previous, code0_b[:, None]], axis=1)
        print(f"\n{3 + 2 * step}. frame {step}: code 0 = {int(code0_b[0])} (argmax after the processors)")

        # ---- 3./5. the code predictor: 15 sequential steps fill in codes 1..15 of this frame
        shapes = []

        def greedy(g, logits_bv):  # called once per step with head g's logits
            shapes.append(logits_bv.shape)
            return np.argmax(logits_bv, axis=-1)

        rest_b15, _ = talker.code_predictor.predict_frame(hidden_bh, talker.embed_codec(code0_b), greedy)
        show("code predictor steps", f"{len(shapes)} heads, logits {list(shapes[0])} each")
        frame_b16 = np.concatenate([code0_b[:, None], rest_b15], axis=1)
        show("frame (16 codes)", frame_b16)
        print("    codes:", frame_b16[0].tolist())
        frames.append(frame_b16)

        # ---- 4./6. one Talker step with the KV cache: the frame goes back in as one position
        print(f"\n{4 + 2 * step}. the Talker, one step (position {T + step})")
        text_h = trailing_nh[step] if step < len(trailing_nh) else pad_h
        x_bth = (talker.embed_frames(frame_b16) + text_h)[:, None]  # sum of 16 embeddings + text
        key_valid_bs = np.ones((1, T + step + 1), dtype=bool)
        hidden_bh = talker.forward(x_bth, np.array([[T + step]]), key_valid_bs, cache)[:, -1]
        logits_bv = talker.logits(hidden_bh)
        show("input vector", x_bth)
        show("keys/values cached", f"{T + step + 1} positions")
        show("logits of the next code 0", logits_bv)

    # ---- 7. decode: 16 codes per frame -> 1920 samples at 24 kHz
    print("\n7. the codec decoder")
    codes_t16 = np.concatenate(frames, axis=0)
    trace = {}
    wav = decode_codes(tok.decoder_weights, tok.decoder_config, codes_t16.T[None], trace=trace)[0]
    for name, value in trace.items():
        show(name, value)
    show("waveform", wav)
    assert np.array_equal(wav, tok.decode_full(codes_t16))
    stream = tok.stream()
    streamed = np.concatenate([stream.push(codes_t16[i : i + 1]) for i in range(len(codes_t16))])
    show("streamed, one frame per push", streamed)
    err = np.max(np.abs(streamed - wav))
    print(f"    max |streamed - one pass| {'<' if err < 2e-5 else '>='} 2e-5 (float32 summation order only)")
    assert err < 2e-5

    # ---- 8. the same through the public API
    print("\n8. the public API, greedy")
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
    assert sr == 24000 and np.array_equal(wavs[0], wav), "waveform differs from the public API"
    print("    the same codes and the same samples")


if __name__ == "__main__":
    main()
