"""Draw every figure of docs/ from the package itself; the PNGs are committed beside this script.

    python docs/figures/make_figures.py              # rewrite docs/figures/*.png
    python docs/figures/make_figures.py --out DIR    # write them elsewhere (the test does this)

Needs matplotlib (``pip install ".[docs]"``).  Figures that show data draw it from the tiny checkpoints
embedded in the package (refimpl/data/default-*: random weights in the released layout), computed here
with refimpl's own functions; figures that show structure (masks, caches, the decoder chain) compute it
from the same functions the networks call (``nn.causal_window_mask``, ``prompt.build_layout``, ...)
and from the released configuration (``refimpl.porting.presets``).  Every shape a figure prints comes from
one of the two: a released shape from a preset configuration, a tiny one from running the embedded model
(pipeline_shapes.png, transformer_layer.png, speaker_encoder.png).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # draw from this working tree even when refimpl is also installed
    sys.path.insert(0, str(REPO))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle  # noqa: E402

import refimpl  # noqa: E402
from refimpl import nn
from refimpl.codec import decoder as codec_decoder
from refimpl.codec import quantization
from refimpl.io.checkpoint import read_checkpoint_weights  # noqa: E402
from refimpl.porting import presets  # noqa: E402
from refimpl.tts.mel import mel_filterbank, mel_spectrogram  # noqa: E402
from refimpl.tts.prompt import assemble_batch, build_layout, embed_layout  # noqa: E402
from refimpl.tts.text_tokenizer import assistant_prompt, instruct_prompt, reference_prompt  # noqa: E402

DATA = REPO / "refimpl" / "data"
OUT = Path(__file__).resolve().parent
SR = 24000

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.titlesize": 10,
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)
SEGMENT_COLOURS = {
    "instruct": "#f4d6a0",
    "role": "#d9d9d9",
    "codec_prefix": "#b9d7ef",
    "text": "#c8e6c0",
    "first_text": "#c8e6c0",
    "bos": "#f7c6c6",
    "icl": "#e1cdf0",
    "icl_text": "#c8e6c0",
    "icl_codec": "#e1cdf0",
    "trailing": "#ffffff",
}


def save(fig, out: Path, name: str) -> None:
    fig.savefig(out / name, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def test_signal(seconds: float, seed: int = 0):
    """Deterministic audio with some structure: a rising chirp, a two-tone hum and noise bursts."""
    t = np.arange(int(seconds * SR)) / SR
    rng = np.random.default_rng(seed)
    chirp = 0.4 * np.sin(2 * np.pi * (120 * t + 900 * t**2 / seconds))
    hum = 0.2 * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 0.7 * t) > 0)
    bursts = 0.15 * rng.standard_normal(t.size) * (np.sin(2 * np.pi * 1.3 * t) > 0.6)
    return chirp + hum + bursts


# ----------------------------------------------------------------------------- 0. overview


def overview(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(13, 6.0))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 6.0)
    ax.axis("off")

    def box(x, y, w, h, text, colour, size=9):
        ax.add_patch(
            FancyBboxPatch(
                (x, y), w, h, boxstyle="round,pad=0.04", facecolor=colour, edgecolor="#333333", linewidth=0.8
            )
        )
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, text="", colour="#333333", label_at=None, **kw):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="-|>", color=colour, linewidth=1.2, **kw))
        if text and x0 == x1:  # a vertical arrow: the label beside it
            ax.text(x0 + 0.1, (y0 + y1) / 2, text, ha="left", va="center", fontsize=7.5, color="#333333")
        elif text:
            x, y = label_at if label_at else ((x0 + x1) / 2, (y0 + y1) / 2 + 0.12)
            ax.text(x, y, text, ha="center", va="bottom", fontsize=7.5, color="#333333")

    box(0.1, 4.3, 1.7, 0.7, '"Hello!"', "#ffffff", 10)
    box(2.3, 4.3, 1.9, 0.7, "text tokenizer\n(byte-level BPE)", "#fefcbf")
    arrow(1.8, 4.65, 2.3, 4.65)
    box(4.7, 3.2, 2.2, 2.2, "prompt\n\ntext stream\n+\ncodec stream", "#c6f6d5")
    arrow(4.2, 4.65, 4.7, 4.65, "ids")
    box(0.1, 2.9, 1.7, 0.9, "reference audio\n(voice clone)", "#ffffff")
    box(2.1, 3.3, 1.5, 0.6, "speaker encoder", "#fed7e2", 8.5)
    box(2.1, 2.5, 1.5, 0.6, "codec encoder", "#e9d8fd", 8.5)
    arrow(1.8, 3.45, 2.1, 3.6)
    arrow(1.8, 3.2, 2.1, 2.8)
    arrow(3.6, 3.6, 4.7, 3.6, "x-vector")
    arrow(3.6, 2.8, 4.7, 3.3, "ref. codes")
    box(7.7, 3.9, 2.0, 1.5, "Talker\n28 transformer layers\n+ KV cache", "#bee3f8", 9.5)
    arrow(6.9, 4.65, 7.7, 4.65, "vectors")
    box(10.3, 4.3, 2.5, 0.7, "logits → code 0\n(or EOS: stop)", "#ffffff")
    arrow(9.7, 4.65, 10.3, 4.65)
    box(10.3, 2.5, 2.5, 1.3, "code predictor\n5 layers, 15 steps\n→ codes 1 … 15", "#bee3f8")
    arrow(11.55, 4.3, 11.55, 3.8, "code 0")
    arrow(9.2, 3.9, 10.3, 3.3, "hidden h", colour="#2b6cb0", label_at=(9.45, 3.2))
    box(10.3, 1.2, 2.5, 0.7, "frame: 16 codes", "#fefcbf")
    arrow(11.55, 2.5, 11.55, 1.9)
    box(6.0, 1.2, 3.6, 0.7, "sum of the 16 code embeddings\n+ next text vector", "#c6f6d5", 8.5)
    arrow(10.3, 1.55, 9.6, 1.55)
    arrow(7.8, 1.9, 8.3, 3.9, "next position", colour="#c05621", connectionstyle="arc3,rad=-0.2")
    box(6.0, 0.1, 3.6, 0.7, "codec decoder (causal)\n→ 1920 samples at 24 kHz per frame", "#e9d8fd", 8.5)
    arrow(11.55, 1.2, 9.6, 0.45, "frames, as they come", colour="#553c9a")
    box(2.3, 0.1, 2.6, 0.7, "waveform (streamed\nchunk by chunk)", "#ffffff", 8.5)
    arrow(6.0, 0.45, 4.9, 0.45)
    ax.text(
        0.1,
        5.75,
        "One generation step makes one 80 ms frame: the Talker chooses code 0, the code predictor codes "
        "1–15, the frame goes back in as the next position",
        fontsize=10,
    )
    save(fig, out, "overview.png")


# ----------------------------------------------------------------------------- 1. prompt layouts


def prompt_layouts(out: Path) -> None:
    cv = refimpl.Qwen3TTS.from_pretrained(DATA / "default-customvoice")
    base = refimpl.Qwen3TTS.from_pretrained(DATA / "default-base")
    tok = cv.text_tokenizer
    ids = lambda s: np.asarray(tok.encode(s), dtype=np.int64)  # noqa: E731
    text = ids(assistant_prompt("Hi there."))
    ref_codes = base.speech_tokenizer.encode(test_signal(0.24), sr=SR)  # 3 frames of real codes
    cases = [
        (
            "CustomVoice, non-streaming text (the default): speaker vivian, English",
            cv,
            dict(language="english", speaker="vivian", non_streaming_mode=True),
        ),
        (
            "CustomVoice, streaming text: the text arrives one token per generated frame",
            cv,
            dict(language="english", speaker="vivian", non_streaming_mode=False),
        ),
        (
            "with an instruction (VoiceDesign; CustomVoice 1.7B), language auto",
            cv,
            dict(language="auto", speaker=None, instruct_ids=ids(instruct_prompt("calm")), non_streaming_mode=True),
        ),
        (
            "voice clone, x-vector only (Base): the speaker slot holds the x-vector",
            base,
            dict(language="english", has_speaker_vector=True, non_streaming_mode=False),
        ),
        (
            "voice clone ICL, streaming (the default): reference text + new text beside the reference frames",
            base,
            dict(
                language="english",
                has_speaker_vector=True,
                ref_ids=ids(reference_prompt("Ok.")),
                ref_codes=ref_codes,
                non_streaming_mode=False,
            ),
        ),
        (
            "voice clone ICL, non-streaming: all text first, then the reference frames",
            base,
            dict(
                language="english",
                has_speaker_vector=True,
                ref_ids=ids(reference_prompt("Ok.")),
                ref_codes=ref_codes,
                non_streaming_mode=True,
            ),
        ),
    ]

    def text_label(cfg, i):
        special = {cfg.tts_pad_token_id: "PAD", cfg.tts_bos_token_id: "BOS", cfg.tts_eos_token_id: "EOS"}
        if i in special:
            return special[i]
        s = tok.id_to_token(int(i))
        shown = {"<|im_start|>": "<im_start>", "<|im_end|>": "<im_end>"}
        return shown.get(s, s.replace("Ġ", "␣").replace("Ċ", "\\n"))

    def codec_label(cfg, row, is_speaker):
        t = cfg.talker_config
        if is_speaker:
            return "x-vector"
        if row[0] < 0:
            return "·"
        if (row >= 0).all():
            return "frame"
        names = {
            t.codec_pad_id: "pad",
            t.codec_bos_id: "bos",
            t.codec_think_id: "think",
            t.codec_nothink_id: "nothink",
            t.codec_think_bos_id: "think_bos",
            t.codec_think_eos_id: "think_eos",
        }
        names.update({v: k for k, v in t.codec_language_id.items()})
        names.update({v: k for k, v in t.spk_id.items()})
        return names.get(int(row[0]), str(row[0]))

    fig, axes = plt.subplots(len(cases), 1, figsize=(13, 1.75 * len(cases)))
    for ax, (title, model, kw) in zip(axes, cases, strict=True):
        cfg = model.config
        layout = build_layout(cfg, text, **kw)
        segment_of = {}
        for name, start, end in layout.segments:
            for p in range(start, end):
                segment_of[p] = name
        n = len(layout)
        trailing = list(layout.trailing_ids)
        shown_trailing = trailing[:5]
        for p in range(n + len(shown_trailing) + 1):
            if p < n:
                colour = SEGMENT_COLOURS[segment_of[p]]
                top = text_label(cfg, layout.text_ids[p])
                bottom = codec_label(cfg, layout.codec_codes[p], p == layout.speaker_position)
            elif p < n + len(shown_trailing):
                colour, top, bottom = "#ffffff", text_label(cfg, shown_trailing[p - n]), "frame"
            else:
                colour, top, bottom = "#ffffff", "PAD…" if len(trailing) <= len(shown_trailing) else "…", "frame…"
            x = p + (0.6 if p >= n else 0)
            style = dict(facecolor=colour, edgecolor="#555555", linewidth=0.6, linestyle="-" if p < n else "--")
            ax.add_patch(Rectangle((x, 1), 0.95, 1, **style))
            ax.add_patch(Rectangle((x, 0), 0.95, 1, **style))
            ax.text(x + 0.47, 1.5, top, ha="center", va="center", fontsize=6.5, rotation=90)
            ax.text(x + 0.47, 0.5, bottom, ha="center", va="center", fontsize=6.5, rotation=90)
        ax.axvline(n + 0.3, color="#aa0000", linewidth=1)
        ax.text(
            n + 0.35,
            2.12,
            "generation, one position per frame: trailing text + frame →",
            fontsize=7,
            color="#aa0000",
            va="bottom",
        )
        for name, start, end in layout.segments:
            ax.text((start + end) / 2, 2.12, name, ha="center", va="bottom", fontsize=7, color="#333333")
        ax.text(-0.3, 1.5, "text", ha="right", va="center", fontsize=8)
        ax.text(-0.3, 0.5, "codec", ha="right", va="center", fontsize=8)
        ax.set_xlim(-2.2, 31)
        ax.set_ylim(-0.05, 2.9)
        ax.set_title(f"{title}   ({n} positions)", loc="left", fontsize=9)
        ax.axis("off")
    fig.suptitle(
        "The Talker prompt: at every position, text stream + codec stream (summed); '·' = no codec part",
        x=0.07,
        ha="left",
        y=1.0,
    )
    fig.tight_layout()
    save(fig, out, "prompt_layouts.png")


# ----------------------------------------------------------------------------- 2. attention masks


def attention_masks(out: Path) -> None:
    fig, axes = plt.subplots(1, 5, figsize=(15, 3.6), gridspec_kw=dict(width_ratios=[1, 1, 1, 0.8, 0.9]))
    cmap = matplotlib.colors.ListedColormap(["#f2f2f2", "#2b6cb0"])

    def draw(ax, allowed, title, xlabels=None, ylabels=None):
        ax.imshow(allowed, cmap=cmap, vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        if xlabels is not None:
            ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7)
        if ylabels is not None:
            ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
        ax.set_xticks(np.arange(-0.5, allowed.shape[1]), minor=True)
        ax.set_yticks(np.arange(-0.5, allowed.shape[0]), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.8)
        ax.tick_params(which="minor", length=0)

    p = np.arange(10)
    draw(axes[0], nn.causal_window_mask(p, p), "causal (Talker, code predictor)", p, p)
    p = np.arange(14)
    draw(axes[1], nn.causal_window_mask(p, p, window=5), "causal, sliding window 5\n(codec decoder: 72 frames)", p, p)

    # a batch of two prompts (5 and 8 positions), left-padded as generation does
    H = 4
    embeds, valid, positions, _ = assemble_batch([np.ones((5, H)), np.ones((8, H))], [np.ones((1, H))] * 2, np.zeros(H))
    S = valid.shape[1]
    allowed = nn.causal_window_mask(np.arange(S), np.arange(S)) & valid[0][None, :]
    draw(
        axes[2],
        allowed,
        "left padding: row 0 of a batch\n(5-position prompt beside an 8-position one)",
        [f"{c}\n{'pad' if not v else q}" for c, v, q in zip(range(S), valid[0], positions[0], strict=True)],
        range(S),
    )
    axes[2].set_xlabel("cache index / rotary position")
    for s in np.flatnonzero(~valid[0]):
        axes[2].add_patch(
            Rectangle((s - 0.5, -0.5), 1, S, facecolor="none", edgecolor="#c53030", hatch="///", linewidth=0)
        )

    # streaming decode: a push of 3 frames at positions 12..14 over the cached window
    window = 5
    queries = np.arange(12, 15)
    keys = np.arange(12 - (window - 1), 15)
    draw(
        axes[3],
        nn.causal_window_mask(queries, keys, window),
        "streaming decoder: a push\nof 3 frames, window 5",
        keys,
        queries,
    )
    axes[3].axvline(window - 1.5, color="#c53030", linewidth=1.5)
    axes[3].set_xlabel(f"key position: {window - 1} cached | {len(queries)} new")

    # grouped-query attention: query head h reads key/value head h // (H / G)
    ax = axes[4]
    Hq, G = 4, 2
    for h in range(Hq):
        g = h // (Hq // G)
        ax.plot([0, 1], [h, g * (Hq - 1) / (G - 1)], color="#2b6cb0", linewidth=1.2)
        ax.add_patch(plt.Circle((0, h), 0.22, color="#2b6cb0"))
        ax.text(-0.35, h, f"q head {h}", ha="right", va="center", fontsize=8)
    for g in range(G):
        y = g * (Hq - 1) / (G - 1)
        ax.add_patch(plt.Circle((1, y), 0.22, color="#dd6b20"))
        ax.text(1.35, y, f"k/v head {g}", ha="left", va="center", fontsize=8)
    ax.set_xlim(-1.4, 2.4)
    ax.set_ylim(Hq - 0.4, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("grouped-query attention:\nhead h reads k/v head h // (H/G)", fontsize=9)
    fig.suptitle("Who may attend to whom (blue = allowed), from refimpl.nn.causal_window_mask", x=0.01, ha="left")
    fig.tight_layout()
    save(fig, out, "attention_masks.png")


# ----------------------------------------------------------------------------- 3. KV caches


def kv_caches(out: Path) -> None:
    cv = refimpl.Qwen3TTS.from_pretrained(DATA / "default-customvoice")
    layout = build_layout(
        cv.config, cv.text_tokenizer.encode(assistant_prompt("Hello!")), "english", "vivian", non_streaming_mode=True
    )
    T, steps = len(layout), 6
    window = presets.TINY_SPEECH_TOKENIZER["decoder_config"]["sliding_window"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), gridspec_kw=dict(width_ratios=[1.25, 1.05, 1.2]))

    # Talker: prefill writes T positions, each step appends one
    ax = axes[0]
    for step in range(steps + 1):
        n = T + step
        for s in range(n):
            colour = "#90cdf4" if s < T else "#2b6cb0"
            if s == n - 1 or (step == 0):
                colour = "#f6ad55" if (step > 0 and s == n - 1) or (step == 0) else colour
            ax.add_patch(Rectangle((s, step), 0.9, 0.8, color=colour))
    ax.set_xlim(-0.5, T + steps + 0.5)
    ax.set_ylim(steps + 1, -0.3)
    ax.set_yticks(
        np.arange(steps + 1) + 0.4, ["prefill → frame 0"] + [f"frame {i} in → frame {i + 1}" for i in range(steps)]
    )
    ax.set_xticks(range(0, T + steps + 1, 2))
    ax.set_xlabel("cached position (keys and values of every layer)")
    ax.set_title(
        f"Talker: the prompt ({T} positions, light blue) once,\nthen one position per generated frame", fontsize=9
    )

    # code predictor: a fresh cache per frame, positions 0..15
    ax = axes[1]
    for step in range(15):
        n = 2 + step
        for s in range(n):
            new = (step == 0) or s == n - 1
            ax.add_patch(Rectangle((s, step), 0.9, 0.8, color="#f6ad55" if new else "#2b6cb0"))
        ax.text(n + 0.3, step + 0.4, f"→ code {step + 1}", fontsize=7, va="center")
    ax.set_xlim(-0.5, 21)
    ax.set_ylim(15, -0.3)
    ax.set_yticks([0.4, 1.4, 14.4], ["[h, code 0]", "code 1 in", "code 14 in"])
    ax.set_xticks([0, 1, 5, 10, 15], ["h", "c0", "5", "10", "15"])
    ax.set_xlabel("cached position")
    ax.set_title(
        "code predictor, one frame: [h, code 0], then one code per step;\nthe cache starts empty again for every frame",
        fontsize=9,
    )

    # codec decoder stream: the last window - 1 frames per layer
    ax = axes[2]
    frames = 14
    for f in range(frames):
        kept = range(max(0, f - (window - 1)), f)
        for s in kept:
            ax.add_patch(Rectangle((s, f), 0.9, 0.8, color="#2b6cb0"))
        ax.add_patch(Rectangle((f, f), 0.9, 0.8, color="#f6ad55"))
    ax.set_xlim(-0.5, frames + 0.5)
    ax.set_ylim(frames, -0.3)
    ax.set_yticks(np.arange(0, frames, 2) + 0.4, [f"frame {i}" for i in range(0, frames, 2)])
    ax.set_xticks(range(0, frames + 1, 2))
    ax.set_xlabel("frame position")
    ax.set_title(
        f"codec decoder stream (tiny model, window {window}):\n"
        f"keeps the last {window - 1} frames' keys/values per layer (released: 71)",
        fontsize=9,
    )
    fig.suptitle("KV caches through generation (blue = cached, orange = new this call)", x=0.01, ha="left")
    fig.tight_layout()
    save(fig, out, "kv_caches.png")


# ----------------------------------------------------------------------------- 4. decoder chain


def released_decoder_config():
    """The released speech tokenizer's decoder_config (refimpl.porting.presets), as attributes."""
    return SimpleNamespace(**presets.RELEASED_SPEECH_TOKENIZER["decoder_config"])


def decoder_chain(out: Path) -> None:
    tok = refimpl.SpeechTokenizer.from_pretrained(DATA / "default-customvoice" / "speech_tokenizer")
    codes = np.random.default_rng(1).integers(0, tok.codebook_size, size=(3, 16))
    trace = {}
    codec_decoder.decode_codes(tok.decoder_weights, tok.decoder_config, codes.T[None], trace=trace)
    rel = released_decoder_config()
    per_frame = [("codes", 16, 1, "1 frame = 16 codes")]
    per_frame.append(("quantizer", rel.codebook_dim, 1, "sum of codebook rows, 2 projections"))
    per_frame.append(("pre_conv", rel.latent_dim, 1, "causal conv k3"))
    per_frame.append(
        ("pre_transformer", rel.latent_dim, 1, f"{rel.num_hidden_layers} layers, window {rel.sliding_window}")
    )
    rate = 1
    for i, r in enumerate(rel.upsampling_ratios):
        rate *= r
        per_frame.append((f"upsample.{i}", rel.latent_dim, rate, f"transposed conv ×{r} + ConvNeXt"))
    per_frame.append(("decoder.0", rel.decoder_dim, rate, "causal conv k7"))
    for i, r in enumerate(rel.upsample_rates):
        rate *= r
        per_frame.append(
            (
                f"decoder.{i + 1}",
                rel.decoder_dim // 2 ** (i + 1),
                rate,
                f"SnakeBeta, transposed conv ×{r}, 3 residual units",
            )
        )
    per_frame.append((f"decoder.{len(rel.upsample_rates) + 2}", 1, rate, "SnakeBeta, conv k7 → waveform"))

    fig = plt.figure(figsize=(13, 7.2))
    ax = fig.add_axes([0.0, 0.0, 0.42, 0.93])
    ax.set_xlim(0, 10)
    ax.set_ylim(len(per_frame), -0.6)
    ax.axis("off")
    ax.set_title(
        "released config, per frame of 80 ms: box width ~ log(samples), height ~ log(channels)", loc="left", fontsize=9
    )
    for y, (name, channels, samples, what) in enumerate(per_frame):
        width = 0.6 + 4.4 * np.log(samples) / np.log(1920)
        height = 0.25 + 0.6 * np.log2(channels) / np.log2(2048)
        ax.add_patch(
            FancyBboxPatch(
                (0.2, y + 0.5 - height / 2),
                width,
                height,
                boxstyle="round,pad=0.02",
                facecolor="#bee3f8",
                edgecolor="#2b6cb0",
            )
        )
        ax.text(0.35, y + 0.5, name, va="center", fontsize=8)
        ax.text(
            5.4,
            y + 0.36,
            f"[{channels}, {samples}·T]" if samples > 1 else f"[{channels}, T]",
            va="center",
            fontsize=8,
            family="monospace",
        )
        ax.text(5.4, y + 0.72, what, va="center", fontsize=7, color="#555555")

    stages = [
        "quantizer",
        "pre_conv",
        "pre_transformer",
        "upsample.0",
        "upsample.1",
        "decoder.0",
        "decoder.1",
        "decoder.2",
        "decoder.3",
        "decoder.4",
        "decoder.6",
    ]
    axes = [fig.add_axes([0.47, 0.86 - i * 0.083, 0.52, 0.07]) for i in range(len(stages))]
    for ax, name in zip(axes, stages, strict=True):
        x = trace[name]  # [B, C, T]; the transformer's output is [B, T, C]
        y = x[0, :, 0] if name == "pre_transformer" else x[0, 0]
        if y.size <= 64:  # one value per time step: draw it as a constant over its interval
            ax.stairs(y, np.linspace(0, 3, y.size + 1), linewidth=0.8, color="#2b6cb0", baseline=None)
        else:
            ax.plot((np.arange(y.size) + 0.5) / y.size * 3, y, linewidth=0.5, color="#2b6cb0")
        ax.set_xlim(0, 3)
        ax.set_yticks([])
        ax.text(
            1.0, 0.5, f" {name}  {list(x.shape)}", transform=ax.transAxes, fontsize=7, va="center", family="monospace"
        )
        for f in (1, 2):
            ax.axvline(f, color="#aaaaaa", linewidth=0.6, linestyle=":")
        if name != stages[-1]:
            ax.set_xticks([])
        else:
            ax.set_xlabel("time in frames (3 frames = 240 ms)")
    axes[0].set_title("the tiny embedded model, channel 0 of each stage, 3 random frames", loc="left", fontsize=10)
    fig.suptitle("The codec decoder: 1 value per frame becomes 1920 samples (2·2·8·5·4·3)", x=0.01, y=1.0, ha="left")
    save(fig, out, "decoder_chain.png")


# ----------------------------------------------------------------------------- 5. streaming state


def streaming_state(out: Path) -> None:
    rel = released_decoder_config()
    rows = [("pre_conv (k 3)", rel.codebook_dim * 2, "conv")]
    keys = 2 * rel.num_key_value_heads * rel.head_dim * (rel.sliding_window - 1)
    rows += [(f"pre_transformer layer {i}", keys, "kv") for i in range(rel.num_hidden_layers)]
    rows += [
        (f"upsample.{i} ConvNeXt dwconv (k 7)", rel.latent_dim * 6, "conv") for i in range(len(rel.upsampling_ratios))
    ]
    rows += [("decoder.0 (k 7)", rel.latent_dim * 6, "conv")]
    for i, r in enumerate(rel.upsample_rates):
        c_out = rel.decoder_dim // 2 ** (i + 1)
        rows.append((f"decoder.{i + 1} transposed ×{r} tail", c_out * r, "tail"))
        rows.append((f"decoder.{i + 1} 3 residual units (k 7, d 1/3/9)", c_out * 6 * (1 + 3 + 9), "conv"))
    rows.append(("decoder.6 (k 7)", (rel.decoder_dim // 2 ** len(rel.upsample_rates)) * 6, "conv"))
    colours = {"conv": "#2b6cb0", "kv": "#dd6b20", "tail": "#38a169"}

    tok = refimpl.SpeechTokenizer.from_pretrained(DATA / "default-customvoice" / "speech_tokenizer")
    codes = np.random.default_rng(2).integers(0, tok.codebook_size, size=(12, 16))
    full = tok.decode_full(codes)
    stream = tok.stream()
    pushes = [2, 1, 4, 0, 5]
    parts, start = [], 0
    for n in pushes:
        parts.append(stream.push(codes[start : start + n]))
        start += n

    fig = plt.figure(figsize=(13, 6.4))
    ax = fig.add_axes([0.29, 0.06, 0.3, 0.86])
    names = [r[0] for r in rows]
    ax.barh(range(len(rows)), [r[1] for r in rows], color=[colours[r[2]] for r in rows])
    ax.set_yticks(range(len(rows)), names, fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("floats carried between pushes (released config)")
    total = sum(r[1] for r in rows)
    ax.set_title(f"what the decoder keeps: {total / 1e6:.2f} M floats in all", fontsize=9, loc="left")
    handles = [
        Patch(color=colours[kind], label=label)
        for kind, label in (
            ("conv", "causal conv: the last (k−1)·d inputs"),
            ("kv", f"attention: keys + values of {rel.sliding_window - 1} frames"),
            ("tail", "transposed conv: k − stride partial outputs"),
        )
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower right")

    ax1 = fig.add_axes([0.66, 0.55, 0.33, 0.37])
    ax2 = fig.add_axes([0.66, 0.08, 0.33, 0.33])
    start = 0
    palette = ["#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c"]
    for i, part in enumerate(parts):
        t = (start + np.arange(part.size)) / 1920
        ax1.plot(t, part, linewidth=0.4, color=palette[i % len(palette)])
        start += part.size
        ax1.axvline(start / 1920, color="#888888", linewidth=0.6, linestyle=":")
    ax1.set_title(
        f"pushes of {pushes} frames (tiny model): each push returns\nexactly its frames' samples",
        fontsize=9,
        loc="left",
    )
    ax1.set_xlim(0, len(codes))
    ax1.set_xlabel("time in frames")
    diff = np.abs(np.concatenate(parts) - full)
    ax2.semilogy(np.arange(diff.size) / 1920, np.maximum(diff, 1e-10), linewidth=0.4, color="#555555")
    ax2.set_xlim(0, len(codes))
    ax2.set_ylim(1e-10, 1e-4)
    ax2.set_title("|streamed − one pass| (float32 summation order only)", fontsize=9, loc="left")
    ax2.set_xlabel("time in frames")
    for b in np.cumsum(pushes):
        ax2.axvline(b, color="#888888", linewidth=0.6, linestyle=":")
    fig.suptitle("Streaming decode: the state carried between pushes, and what it buys", x=0.01, ha="left")
    save(fig, out, "streaming_state.png")


# ----------------------------------------------------------------------------- 6. mel spectrogram + waveform


def mel_and_waveform(out: Path) -> None:
    tts = refimpl.Qwen3TTS.from_pretrained(DATA / "default-customvoice")
    wavs, sr, codes = tts.generate_custom_voice(
        "Hello from the reference implementation.",
        speaker="vivian",
        language="english",
        seed=0,
        max_new_tokens=31,
        return_codes=True,
    )
    wav = wavs[0]
    mels = mel_spectrogram(wav)
    fb = mel_filterbank(SR, 1024, 128, 0, 12000)
    fig, axes = plt.subplots(3, 1, figsize=(11, 7.4), gridspec_kw=dict(height_ratios=[0.8, 1.3, 1.0]))
    t = np.arange(wav.size) / sr
    axes[0].plot(t, wav, linewidth=0.3, color="#2b6cb0")
    axes[0].set_xlim(0, t[-1])
    axes[0].set_title(
        "generate_custom_voice on the embedded tiny model (random weights, seed 0): "
        f"{len(codes[0])} frames → "
        f"{wav.size} samples at {sr} Hz (noise, not speech)",
        loc="left",
    )
    axes[0].set_xlabel("seconds")
    im = axes[1].imshow(
        mels, origin="lower", aspect="auto", cmap="magma", extent=(0, mels.shape[1] * 256 / SR, 0, mels.shape[0])
    )
    axes[1].set_title(
        f"its log-mel spectrogram as the speaker encoder sees it: {list(mels.shape)} "
        "(128 mel bands, hop 256 = 10.7 ms)",
        loc="left",
    )
    axes[1].set_ylabel("mel band")
    axes[1].set_xlabel("seconds")
    fig.colorbar(im, ax=axes[1], pad=0.01, label="log mel")
    hz = np.arange(fb.shape[1]) * SR / 1024
    for m in range(0, 128, 6):
        axes[2].plot(hz, fb[m], linewidth=0.8)
    axes[2].set_xlim(0, 12500)
    axes[2].set_title(
        "the Slaney mel filterbank (every 6th of 128 triangles): narrow and tall at low "
        "frequencies, wide and low above 1 kHz",
        loc="left",
    )
    axes[2].set_xlabel("Hz")
    axes[2].set_ylabel("weight")
    fig.tight_layout()
    save(fig, out, "mel_and_waveform.png")


# ----------------------------------------------------------------------------- 7. RVQ residuals


def rvq_residuals(out: Path) -> None:
    tok = refimpl.SpeechTokenizer.from_pretrained(DATA / "default-customvoice" / "speech_tokenizer")
    w = read_checkpoint_weights(tok.directory, np.float32, prefix="encoder.")
    q = "quantizer.acoustic_residual_vector_quantizer"
    # the effective codebook of layer j: embed_sum / max(cluster_usage, 1e-5), [K, D]
    codebooks = [
        w[f"{q}.layers.{j}.codebook.embed_sum"] / np.maximum(w[f"{q}.layers.{j}.codebook.cluster_usage"], 1e-5)[:, None]
        for j in range(15)
    ]
    latent_tc = tok.encode_latent(test_signal(48.0), sr=SR)  # [600, hidden] real latents
    x_td = latent_tc @ w[f"{q}.input_proj.weight"][:, :, 0].T
    train, held_out = x_td[np.arange(len(x_td)) % 4 != 0], x_td[::4]  # fit on 3/4, show 1/4

    def chain(x, codebooks):
        r, norms = x.copy(), [np.linalg.norm(x, axis=-1).mean()]
        for e_kd in codebooks:
            idx, _ = quantization.nearest_rows(r, e_kd)
            r = r - e_kd[idx]
            norms.append(np.linalg.norm(r, axis=-1).mean())
        return np.array(norms)

    checkpoint = chain(held_out, codebooks)
    # the same rule with codebooks fitted by k-means to the training frames, one layer after the other
    rng = np.random.default_rng(0)
    K = codebooks[0].shape[0]
    fitted, r = [], train.copy()
    for _ in range(15):
        e_kd = r[rng.choice(len(r), K, replace=False)].copy()
        for _ in range(8):
            idx, _ = quantization.nearest_rows(r, e_kd)
            for k in range(K):
                members = r[idx == k]
                if len(members):
                    e_kd[k] = members.mean(axis=0)
        idx, _ = quantization.nearest_rows(r, e_kd)
        r = r - e_kd[idx]
        fitted.append(e_kd)
    trained = chain(held_out, fitted)

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    n = np.arange(16)
    axes[0].plot(n, checkpoint / checkpoint[0], "o-", color="#dd6b20", label="tiny checkpoint (random codebooks)")
    axes[0].plot(
        n,
        trained / trained[0],
        "o-",
        color="#2b6cb0",
        label=f"{K}-row codebooks fitted by k-means\non other frames (what training does)",
    )
    axes[0].set_xlabel("acoustic codes used")
    axes[0].set_ylabel("mean |residual| / mean |x|")
    axes[0].set_ylim(0, max(1.25, checkpoint.max() / checkpoint[0] + 0.05))
    axes[0].legend(fontsize=8)
    axes[0].set_title(
        f"residual after each code: {len(held_out)} held-out frames of the tiny encoder's latent",
        loc="left",
        fontsize=9,
    )
    bars = chain(held_out[3:4], fitted)
    axes[1].bar(n, bars, color="#2b6cb0")
    axes[1].set_xlabel("acoustic codes used")
    axes[1].set_ylabel("|residual|")
    axes[1].set_title(
        "one held-out frame, fitted codebooks: each code removes part of what is left", loc="left", fontsize=9
    )
    fig.suptitle(
        "Residual vector quantisation: code j is the nearest row to what codes 0..j−1 left over", x=0.01, ha="left"
    )
    fig.tight_layout()
    save(fig, out, "rvq_residuals.png")


# ----------------------------------------------------------------------------- 8. SnakeBeta


def snake_beta(out: Path) -> None:
    x = np.linspace(-4, 4, 801)[None, None, :]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for a, b in ((1.0, 1.0), (3.0, 1.0), (1.0, 0.3), (3.0, 0.3)):
        y = nn.snake_beta(x.copy(), np.log(np.array([a])), np.log(np.array([b])))
        ax.plot(x[0, 0], y[0, 0], label=f"α = {a:g}, β = {b:g}", linewidth=1.2)
    ax.plot(x[0, 0], x[0, 0], color="#888888", linestyle=":", linewidth=1, label="x")
    ax.set_xlabel("x")
    ax.set_ylabel("SnakeBeta(x)")
    ax.legend(fontsize=8)
    ax.set_title(
        "SnakeBeta: x + sin²(αx)/β — a periodic ripple on the identity\n(α sets its frequency, 1/β its height)",
        fontsize=9,
        loc="left",
    )
    fig.tight_layout()
    save(fig, out, "snake_beta.png")


# ----------------------------------------------------------------------------- 9. the pipeline, shapes on the arrows


def shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def tiny_pipeline_shapes() -> dict:
    """The shape of every arrow of pipeline_shapes.png, per mode, from running the embedded tiny models
    with the package's pieces (the same steps as docs/walkthrough.py and docs/clone_walkthrough.py)."""
    models = {
        m: refimpl.Qwen3TTS.from_pretrained(DATA / f"default-{m}") for m in ("customvoice", "voicedesign", "base")
    }
    ref_audio = (0.5 * test_signal(0.5)).astype(np.float32)
    base = models["base"]
    xvec = base.extract_speaker_embedding(ref_audio, SR)
    mels = base.speaker_encoder.mels(ref_audio)
    ref_codes = base.speech_tokenizer.encode(ref_audio, sr=SR)
    cases = {
        "custom voice": ("customvoice", dict(language="english", speaker="vivian", non_streaming_mode=True), None),
        "voice design": ("voicedesign", dict(language="english", non_streaming_mode=True), "instruct"),
        "clone, x-vector": ("base", dict(language="english", has_speaker_vector=True), "xvec"),
        "clone, ICL": ("base", dict(language="english", has_speaker_vector=True), "icl"),
    }
    found = {}
    for mode, (name, kw, extra) in cases.items():
        tts = models[name]
        talker, t_cfg = tts.talker, tts.config.talker_config
        ids = np.asarray(tts.text_tokenizer.encode(assistant_prompt("Hello!")), dtype=np.int64)
        s = {"ids": ids.shape}
        if extra == "instruct":
            kw["instruct_ids"] = np.asarray(tts.text_tokenizer.encode(instruct_prompt("a calm voice")), dtype=np.int64)
            s["instruct"] = kw["instruct_ids"].shape
        if extra == "icl":
            kw["ref_ids"] = np.asarray(tts.text_tokenizer.encode(reference_prompt("Okay.")), dtype=np.int64)
            kw["ref_codes"] = ref_codes
            s["ref_ids"], s["ref_codes"] = kw["ref_ids"].shape, ref_codes.shape
        if extra in ("xvec", "icl"):
            s["audio"], s["mel"], s["xvec"] = ref_audio.shape, mels.shape, xvec.shape
        layout = build_layout(tts.config, ids, **kw)
        prompt_tc = embed_layout(talker, layout, xvec if extra in ("xvec", "icl") else None)
        T = len(layout)
        caches = talker.new_caches(batch=1)
        hidden_bc = talker.forward(prompt_tc[None], np.arange(T)[None], np.ones((1, T), dtype=bool), caches)[:, -1]
        logits_bv = talker.logits(hidden_bc)
        code0_b = np.argmax(logits_bv[:, : t_cfg.code_predictor_config.vocab_size], axis=-1)
        rest_b15, _ = talker.code_predictor.predict_frame(
            hidden_bc, talker.embed_codec(code0_b), lambda g, x: np.argmax(x, axis=-1)
        )
        frame_16 = np.concatenate([code0_b, rest_b15[0]])
        samples = tts.speech_tokenizer.decode_full(frame_16[None])
        s.update(prompt=prompt_tc.shape, hidden=hidden_bc.shape[1:], logits=logits_bv.shape[1:], code0=code0_b.shape)
        s.update(frame=frame_16.shape, samples=samples.shape, layers=t_cfg.num_hidden_layers)
        found[mode] = s
    return found


def released_pipeline_sizes() -> dict:
    """The released sizes of the same arrows (refimpl.porting.presets), per mode: (0.6B, 1.7B) or (1.7B,)."""
    dec = presets.RELEASED_SPEECH_TOKENIZER["decoder_config"]
    per_frame = int(np.prod(dec["upsampling_ratios"]) * np.prod(dec["upsample_rates"]))
    se = (presets.RELEASED_SPEAKER_ENCODER, presets.RELEASED_SPEAKER_ENCODER_1_7B)

    def sizes(talkers, encoders=None):
        h = "|".join(str(t["hidden_size"]) for t in talkers)
        return dict(
            H=h,
            V=talkers[0]["vocab_size"],
            G=talkers[0]["num_code_groups"],
            layers=talkers[0]["num_hidden_layers"],
            samples=per_frame,
            mel=presets.RELEASED_SPEAKER_ENCODER["mel_dim"],
            enc="|".join(str(e["enc_dim"]) for e in encoders) if encoders else None,
        )

    return {
        "custom voice": sizes((presets.RELEASED_TALKER_0_6B_CUSTOMVOICE, presets.RELEASED_TALKER_1_7B_CUSTOMVOICE)),
        "voice design": sizes((presets.RELEASED_TALKER_1_7B,)),
        "clone, x-vector": sizes((presets.RELEASED_TALKER_0_6B, presets.RELEASED_TALKER_1_7B), se),
        "clone, ICL": sizes((presets.RELEASED_TALKER_0_6B, presets.RELEASED_TALKER_1_7B), se),
    }


RELEASED_COLOUR, TINY_COLOUR = "#1a4f8b", "#777777"


def pipeline_shapes(out: Path) -> None:
    tiny, rel = tiny_pipeline_shapes(), released_pipeline_sizes()
    modes = list(tiny)
    row_h = 3.3
    fig, ax = plt.subplots(figsize=(19, 2.75 * len(modes) + 0.6))
    ax.set_xlim(0, 23.6)
    ax.set_ylim(0, row_h * len(modes) + 0.5)
    ax.axis("off")

    def box(x0, x1, y, h, text, colour, size=8.5):
        ax.add_patch(
            FancyBboxPatch(
                (x0, y), x1 - x0, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="#333333", linewidth=0.8
            )
        )
        ax.text((x0 + x1) / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, released, small, **kw):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="-|>", color="#333333", linewidth=1.1, **kw))
        arrow_labels((x0 + x1) / 2, (y0 + y1) / 2, released, small)

    def elbow(x0, y0, x1, y1, released, small):
        """Right, then up into the bottom of a box; the labels on the horizontal part."""
        ax.annotate(
            "",
            (x1, y1),
            (x0, y0),
            arrowprops=dict(
                arrowstyle="-|>", color="#333333", linewidth=1.1, connectionstyle="angle,angleA=0,angleB=90,rad=0"
            ),
        )
        arrow_labels((x0 + x1) / 2, y0, released, small)

    def arrow_labels(lx, ly, released, small):
        ax.text(lx, ly + 0.1, released, ha="center", va="bottom", fontsize=8, color=RELEASED_COLOUR, weight="bold")
        ax.text(lx, ly - 0.1, small, ha="center", va="top", fontsize=8, color=TINY_COLOUR)

    for r, mode in enumerate(modes):
        t, R = tiny[mode], rel[mode]
        base = row_h * (len(modes) - 1 - r) + 0.2
        y_main, h = base + 2.0, 0.8
        ym = y_main + h / 2
        H = R["H"]
        ax.text(0.1, base + 3.05, f"{mode}", fontsize=10.5, weight="bold", va="center")
        sizes_note = {
            "custom voice": "released 0.6B | 1.7B CustomVoice",
            "voice design": "released 1.7B VoiceDesign",
        }.get(mode, "released 0.6B | 1.7B Base")
        ax.text(
            2.3,
            base + 3.05,
            f"{sizes_note}  ·  tiny: refimpl/data/default-{'base' if 'clone' in mode else mode.replace(' ', '')}",
            fontsize=8,
            color="#555555",
            va="center",
        )
        text_box = '"Hello!" + transcript\ntext tokenizer' if mode == "clone, ICL" else '"Hello!"\ntext tokenizer'
        box(0.3, 2.3, y_main, h, text_box, "#fefcbf")
        ids = "[N+K]" if mode == "clone, ICL" else "[N]"
        small_ids = (
            f"{shape_text(t['ids'])} + {shape_text(t['ref_ids'])}" if mode == "clone, ICL" else shape_text(t["ids"])
        )
        arrow(2.3, ym, 7.4, ym, f"text ids {ids}", small_ids)
        box(7.4, 9.4, y_main, h, "prompt: text +\ncodec streams", "#c6f6d5")
        arrow(9.4, ym, 11.3, ym, f"[T, {H}]", shape_text(t["prompt"]))
        box(11.3, 13.1, y_main, h, f"Talker\n{R['layers']} layers (tiny {t['layers']})", "#bee3f8")
        arrow(13.1, ym, 14.8, ym, f"logits [{R['V']}]", shape_text(t["logits"]))
        box(14.8, 16.2, y_main, h, "processors,\nchoose code 0", "#ffffff")
        arrow(16.2, ym, 17.5, ym, "code 0 [1]", shape_text(t["code0"]))
        box(17.5, 19.3, y_main, h, "code predictor\n15 steps", "#bee3f8")
        arrow(19.3, ym, 20.6, ym, f"frame [{R['G']}]", shape_text(t["frame"]))
        box(20.6, 22.2, y_main, h, "codec decoder", "#e9d8fd")
        arrow(22.2, ym, 23.5, ym, f"[{R['samples']}]", shape_text(t["samples"]))
        ax.text(22.85, y_main - 0.35, "samples / frame", ha="center", fontsize=7, color="#555555")
        # the Talker's last hidden state also feeds the code predictor
        ax.annotate(
            "",
            (18.4, y_main),
            (12.2, y_main),
            arrowprops=dict(arrowstyle="-|>", color="#2b6cb0", linewidth=1.0, connectionstyle="arc3,rad=0.15"),
        )
        ax.text(15.3, y_main - 0.75, f"hidden h [{H}]", ha="center", fontsize=8, color=RELEASED_COLOUR, weight="bold")
        ax.text(15.3, y_main - 0.95, shape_text(t["hidden"]), ha="center", va="top", fontsize=8, color=TINY_COLOUR)
        # the conditioning of each mode, into the prompt box from below
        y1 = base + 0.75
        if mode == "custom voice":
            box(0.3, 2.3, y1, 0.7, 'speaker "vivian"', "#ffffff")
            elbow(2.3, y1 + 0.35, 8.4, y_main, "speaker id [1]", "[1]")
        elif mode == "voice design":
            box(0.3, 2.3, y1, 0.7, '"a calm voice"\ntext tokenizer', "#fefcbf")
            elbow(2.3, y1 + 0.35, 8.4, y_main, "instruct ids [M]", shape_text(t["instruct"]))
        else:
            y1 = base + 1.0 if mode == "clone, ICL" else base + 0.75
            box(0.3, 1.4, y1, 0.7, "reference\naudio", "#ffffff")
            arrow(1.4, y1 + 0.35, 2.5, y1 + 0.35, "[S]", shape_text(t["audio"]))
            box(2.5, 3.4, y1, 0.7, "log-mel", "#fed7e2")
            arrow(3.4, y1 + 0.35, 4.5, y1 + 0.35, f"[F, {R['mel']}]", shape_text(t["mel"]))
            box(4.5, 5.6, y1, 0.7, "ECAPA-\nTDNN", "#fed7e2")
            elbow(
                5.6,
                y1 + 0.35,
                8.0 if mode == "clone, ICL" else 8.4,
                y_main,
                f"x-vector [{R['enc']}]",
                shape_text(t["xvec"]),
            )
            if mode == "clone, ICL":
                y2 = base + 0.05
                box(0.3, 1.4, y2, 0.7, "reference\naudio", "#ffffff")
                arrow(1.4, y2 + 0.35, 2.5, y2 + 0.35, "[S]", shape_text(t["audio"]))
                box(2.5, 4.3, y2, 0.7, "codec encoder", "#e9d8fd")
                elbow(4.3, y2 + 0.35, 8.9, y_main, f"ref. codes [R, {R['G']}]", shape_text(t["ref_codes"]))
    ax.text(
        0.1,
        row_h * len(modes) + 0.25,
        "Every arrow: released shape (bold, refimpl/porting/presets.py; a|b = 0.6B|1.7B) above, the embedded tiny "
        "model's (grey, computed by running it) below.  N, K, M: text ids; T: prompt positions; S: samples; "
        "F: mel frames; R: reference frames",
        fontsize=9,
    )
    save(fig, out, "pipeline_shapes.png")


# ----------------------------------------------------------------------------- 10. one transformer layer


def tiny_layer_shapes() -> dict:
    """The recorded output shapes of layer 0 of the tiny CustomVoice Talker and code predictor (a greedy
    generation's last call, one new position), by official module name, without the batch axis."""
    tts = refimpl.Qwen3TTS.from_pretrained(DATA / "default-customvoice")
    trace = {}
    tts.generate_custom_voice(
        "Hi",
        speaker="vivian",
        language="english",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=2,
        trace=trace,
    )
    found = {}
    for stack, prefix in (("talker", "talker.model.layers.0."), ("predictor", "talker.code_predictor.model.layers.0.")):
        found[stack] = {k[len(prefix) :]: v.shape[1:] for k, v in trace.items() if k.startswith(prefix)}
    return found


def layer_shape_rows(c: dict, recorded: dict | None) -> list:
    """[(row, [shape text, ...])] for one stack: from a config (released) or from recorded shapes (tiny)."""
    if recorded is not None:  # the recorded shapes, T standing for the time axis
        r = {k: ["T"] + [str(s) for s in v[1:]] for k, v in recorded.items()}
        fmt = lambda k: "[" + ", ".join(r[k]) + "]"  # noqa: E731
        q, k_ = fmt("self_attn.q_norm"), fmt("self_attn.k_norm")
        return [
            ("x", [fmt("input_layernorm")]),
            ("norm1", [fmt("input_layernorm")]),
            ("qkv", [f"q {fmt('self_attn.q_proj')}", f"k {fmt('self_attn.k_proj')}", f"v {fmt('self_attn.v_proj')}"]),
            ("qknorm", [f"q {q}", f"k {k_}"]),
            ("rope", [f"q {q}", f"k {k_}"]),
            ("attn", [f"{fmt('self_attn.q_proj')} (heads joined)"]),
            ("o", [fmt("self_attn.o_proj")]),
            ("add1", [fmt("self_attn")]),
            ("norm2", [fmt("post_attention_layernorm")]),
            ("gateup", [f"{fmt('mlp.gate_proj')} ×2"]),
            ("act", [fmt("mlp.act_fn")]),
            ("down", [fmt("mlp.down_proj")]),
            ("add2", [fmt("mlp")]),
        ]
    H, Hq, G, D, I = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["intermediate_size"],
    )
    return [
        ("x", [f"[T, {H}]"]),
        ("norm1", [f"[T, {H}]"]),
        ("qkv", [f"q [T, {Hq * D}]", f"k [T, {G * D}]", f"v [T, {G * D}]"]),
        ("qknorm", [f"q [T, {Hq}, {D}]", f"k [T, {G}, {D}]"]),
        ("rope", [f"q [T, {Hq}, {D}]", f"k [T, {G}, {D}]"]),
        ("attn", [f"[T, {Hq * D}] (heads joined)"]),
        ("o", [f"[T, {H}]"]),
        ("add1", [f"[T, {H}]"]),
        ("norm2", [f"[T, {H}]"]),
        ("gateup", [f"[T, {I}] ×2"]),
        ("act", [f"[T, {I}]"]),
        ("down", [f"[T, {H}]"]),
        ("add2", [f"[T, {H}]"]),
    ]


def transformer_layer(out: Path) -> None:
    tiny = tiny_layer_shapes()
    talker = presets.RELEASED_TALKER_1_7B_CUSTOMVOICE
    columns = [
        ("Talker, released 1.7B", layer_shape_rows(talker, None), RELEASED_COLOUR),
        ("code predictor, released", layer_shape_rows(talker["code_predictor_config"], None), RELEASED_COLOUR),
        ("Talker, tiny (recorded)", layer_shape_rows(None, tiny["talker"]), TINY_COLOUR),
        ("code predictor, tiny (rec.)", layer_shape_rows(None, tiny["predictor"]), TINY_COLOUR),
    ]
    rows = [
        ("x", "layer input x", "#ffffff"),
        ("norm1", "RMSNorm  (input_layernorm)", "#fefcbf"),
        ("qkv", None, None),
        ("qknorm", None, None),
        ("rope", None, None),
        (
            "attn",
            "attention: softmax(q·kᵀ/√D + causal mask)·v\n"
            "query head h reads k/v head h // (Hq/G); keys/values → KV cache",
            "#bee3f8",
        ),
        ("o", "o_proj  (linear)", "#bee3f8"),
        ("add1", "+  (residual)", "#ffffff"),
        ("norm2", "RMSNorm  (post_attention_layernorm)", "#fefcbf"),
        ("gateup", None, None),
        ("act", "SiLU(gate) ⊙ up", "#c6f6d5"),
        ("down", "down_proj  (linear)", "#c6f6d5"),
        ("add2", "+  (residual) → next layer", "#ffffff"),
    ]
    n = len(rows)
    fig, ax = plt.subplots(figsize=(15, 8.6))
    ax.set_xlim(0, 15)
    ax.set_ylim(-0.3, n + 0.9)
    ax.axis("off")
    y_of = {key: n - 1 - i + 0.5 for i, (key, _, _) in enumerate(rows)}

    def box(xc, w, y, text, colour, size=8.5):
        ax.add_patch(
            FancyBboxPatch(
                (xc - w / 2, y - 0.3),
                w,
                0.6,
                boxstyle="round,pad=0.03",
                facecolor=colour,
                edgecolor="#333333",
                linewidth=0.8,
            )
        )
        ax.text(xc, y, text, ha="center", va="center", fontsize=size)

    def down(x, y0, y1):
        ax.annotate("", (x, y1 + 0.31), (x, y0 - 0.31), arrowprops=dict(arrowstyle="-|>", color="#333333", lw=1))

    X = 3.0
    for key, text, colour in rows:
        y = y_of[key]
        if key == "qkv":
            for xc, name in ((1.6, "q_proj"), (3.0, "k_proj"), (4.4, "v_proj")):
                box(xc, 1.2, y, name, "#bee3f8")
        elif key == "qknorm":
            box(1.6, 1.2, y, "q_norm (RMS\nper head)", "#fefcbf", 7.5)
            box(3.0, 1.2, y, "k_norm (RMS\nper head)", "#fefcbf", 7.5)
        elif key == "rope":
            box(1.6, 1.2, y, "RoPE(q)", "#e9d8fd")
            box(3.0, 1.2, y, "RoPE(k)", "#e9d8fd")
        elif key == "gateup":
            box(2.2, 1.5, y, "gate_proj", "#c6f6d5")
            box(3.8, 1.5, y, "up_proj", "#c6f6d5")
        else:
            box(X, 4.6 if key == "attn" else 3.4, y, text, colour, 8 if key == "attn" else 8.5)
    # the arrows
    down(X, y_of["x"], y_of["norm1"])
    for xc in (1.6, 3.0, 4.4):
        ax.annotate("", (xc, y_of["qkv"] + 0.31), (X, y_of["norm1"] - 0.31), arrowprops=dict(arrowstyle="-|>", lw=1))
    for xc in (1.6, 3.0):
        down(xc, y_of["qkv"], y_of["qknorm"])
        down(xc, y_of["qknorm"], y_of["rope"])
        down(xc, y_of["rope"], y_of["attn"])
    ax.annotate("", (4.4, y_of["attn"] + 0.31), (4.4, y_of["qkv"] - 0.31), arrowprops=dict(arrowstyle="-|>", lw=1))
    for a, b in (("attn", "o"), ("o", "add1"), ("add1", "norm2"), ("act", "down"), ("down", "add2")):
        down(X, y_of[a], y_of[b])
    for xc in (2.2, 3.8):
        ax.annotate("", (xc, y_of["gateup"] + 0.31), (X, y_of["norm2"] - 0.31), arrowprops=dict(arrowstyle="-|>", lw=1))
        ax.annotate("", (X, y_of["act"] + 0.31), (xc, y_of["gateup"] - 0.31), arrowprops=dict(arrowstyle="-|>", lw=1))
    # the residual paths, on the left
    for a, b in (("x", "add1"), ("add1", "add2")):
        ax.plot([X - 1.75, 0.35, 0.35], [y_of[a], y_of[a], y_of[b]], color="#c05621", lw=1.2)
        ax.annotate(
            "", (X - 1.72, y_of[b]), (0.35, y_of[b]), arrowprops=dict(arrowstyle="-|>", color="#c05621", lw=1.2)
        )
    ax.text(
        0.45, (y_of["x"] + y_of["add1"]) / 2 + 1.2, "residual", rotation=90, color="#c05621", fontsize=8, va="center"
    )

    # the shape table
    x0, dx = 6.0, 2.3
    for j, (title, shapes, colour) in enumerate(columns):
        ax.text(x0 + j * dx, n + 0.35, title, fontsize=8.5, weight="bold", color=colour, va="center")
        for key, lines in shapes:
            y = y_of[key]
            for i, line in enumerate(lines):
                ax.text(
                    x0 + j * dx,
                    y + (len(lines) - 1) * 0.14 - i * 0.28,
                    line,
                    fontsize=7.5,
                    family="monospace",
                    color=colour,
                    va="center",
                )
    for key, _, _ in rows:
        ax.plot([5.6, 15], [y_of[key] - 0.5] * 2, color="#eeeeee", lw=0.6, zorder=0)
    ax.text(
        0.0,
        n + 0.75,
        "One Talker / code-predictor layer (refimpl/transformer.py: transformer_layer, attention_block, swiglu_mlp): "
        "the output after each part, for one batch row (T new positions)",
        fontsize=10,
    )
    save(fig, out, "transformer_layer.png")


# ----------------------------------------------------------------------------- 11. the speaker encoder


def speaker_encoder_figure(out: Path) -> None:
    base = refimpl.Qwen3TTS.from_pretrained(DATA / "default-base")
    trace = {}
    base.extract_speaker_embedding((0.5 * test_signal(0.5)).astype(np.float32), SR, trace=trace)
    rec = {k.removeprefix("speaker_encoder."): v.shape for k, v in trace.items()}
    rel = presets.RELEASED_SPEAKER_ENCODER
    C, A, S, E = rel["enc_channels"], rel["enc_attention_channels"], rel["enc_se_channels"], rel["enc_dim"]
    k, d, scale = rel["enc_kernel_sizes"], rel["enc_dilations"], rel["enc_res2net_scale"]

    def tiny(name, transpose=False):
        shape = rec[name][1:] if len(rec[name]) == 3 else rec[name]
        shape = shape[::-1] if transpose else shape
        return shape_text(["F" if s == rec["mel"][0] else s for s in shape])

    main = [
        ("log mels, transposed", "#ffffff", f"[{rel['mel_dim']}, F]", tiny("mel", transpose=True)),
        (f"blocks.0: TDNN k{k[0]} (conv + ReLU)", "#fed7e2", f"[{C[0]}, F]", tiny("blocks.0")),
    ]
    for i in range(1, len(C) - 1):
        main.append(
            (f"blocks.{i}: SE-Res2Net, k{k[i]} dilation {d[i]}", "#fbb6ce", f"[{C[i]}, F]", tiny(f"blocks.{i}"))
        )
    main += [
        ("concatenate blocks 1–3", "#ffffff", f"[{sum(C[1:-1])}, F]", shape_text([rec["mfa"][1], "F"])),
        (f"mfa: TDNN k{k[-1]}", "#fed7e2", f"[{C[-1]}, F]", tiny("mfa")),
        ("asp: attentive statistics pooling", "#bee3f8", f"[{2 * C[-1]}, 1]", tiny("asp")),
        ("fc: conv k1 → x-vector", "#c6f6d5", f"[{E}]", shape_text(trace["speaker_encoder"].shape[1:])),
    ]
    block = [
        ("block input x", "#ffffff", f"[{C[1]}, F]", tiny("blocks.0")),
        ("tdnn1: TDNN k1", "#fed7e2", f"[{C[1]}, F]", tiny("blocks.1.tdnn1")),
        (
            f"split into {scale} groups x₀…x₇",
            "#ffffff",
            f"{scale} × [{C[1] // scale}, F]",
            f"{scale} × {shape_text([rec['blocks.1.res2net_block.blocks.0'][1], 'F'])}",
        ),
        (
            f"Res2Net: y₀ = x₀,  y₁ = TDNN k{k[1]} d{d[1]}(x₁),\nyⱼ = TDNN k{k[1]} d{d[1]}(xⱼ + yⱼ₋₁)",
            "#fbb6ce",
            f"{scale - 1} × [{C[1] // scale}, F]",
            f"{scale - 1} × {shape_text([rec['blocks.1.res2net_block.blocks.0'][1], 'F'])}",
        ),
        ("concatenate y₀…y₇", "#ffffff", f"[{C[1]}, F]", tiny("blocks.1.res2net_block")),
        ("tdnn2: TDNN k1", "#fed7e2", f"[{C[1]}, F]", tiny("blocks.1.tdnn2")),
        ("SE: mean over time → conv → ReLU", "#fefcbf", f"[{S}, 1]", tiny("blocks.1.se_block.relu")),
        ("conv → sigmoid: a gate per channel", "#fefcbf", f"[{C[1]}, 1]", tiny("blocks.1.se_block.sigmoid")),
        ("x' · gates, + x (residual)", "#ffffff", f"[{C[1]}, F]", tiny("blocks.1")),
    ]
    asp = [
        ("x from mfa", "#ffffff", f"[{C[-1]}, F]", tiny("mfa")),
        ("[x; mean(x); std(x)] (global context)", "#ffffff", f"[{3 * C[-1]}, F]", tiny("asp.context")),
        ("TDNN k1 → tanh", "#fed7e2", f"[{A}, F]", tiny("asp.tanh")),
        ("conv k1 → softmax over time", "#bee3f8", f"[{C[-1]}, F]", tiny("asp.weights")),
        ("weighted mean; weighted std", "#bee3f8", f"[{2 * C[-1]}, 1]", tiny("asp")),
    ]

    fig, axes = plt.subplots(1, 3, figsize=(15.5, 6.6))
    titles = (
        "ECAPA-TDNN: mels → x-vector",
        "one SE-Res2Net block (blocks.1)",
        "attentive statistics pooling (asp)",
    )
    for ax, items, title in zip(axes, (main, block, asp), titles, strict=True):
        n = len(items)
        ax.set_xlim(0, 10)
        ax.set_ylim(-0.2, 9.9)
        ax.axis("off")
        ax.set_title(title, loc="left", fontsize=10)
        step = 9.0 / max(n, 7)
        for i, (label, colour, released, small) in enumerate(items):
            y = 9.0 - i * step
            ax.add_patch(
                FancyBboxPatch(
                    (0.2, y - 0.34),
                    6.4,
                    0.68,
                    boxstyle="round,pad=0.03",
                    facecolor=colour,
                    edgecolor="#333333",
                    linewidth=0.8,
                )
            )
            ax.text(3.4, y, label, ha="center", va="center", fontsize=8 if "\n" not in label else 7.5)
            ax.text(6.85, y + 0.13, released, fontsize=7.5, family="monospace", color=RELEASED_COLOUR, va="center")
            ax.text(6.85, y - 0.17, small, fontsize=7.5, family="monospace", color=TINY_COLOUR, va="center")
            if i:
                ax.annotate("", (3.4, y + 0.37), (3.4, y + step - 0.37), arrowprops=dict(arrowstyle="-|>", lw=1))
    fig.suptitle(
        "The speaker encoder (refimpl/tts/speaker_encoder.py), per channel × mel frame F: released 0.6B Base "
        "(bold blue, presets.py) above, the embedded tiny model's recorded shapes (grey) below",
        x=0.01,
        ha="left",
        fontsize=10,
    )
    save(fig, out, "speaker_encoder.png")


FIGURES = {
    "overview.png": overview,
    "prompt_layouts.png": prompt_layouts,
    "attention_masks.png": attention_masks,
    "kv_caches.png": kv_caches,
    "decoder_chain.png": decoder_chain,
    "streaming_state.png": streaming_state,
    "mel_and_waveform.png": mel_and_waveform,
    "rvq_residuals.png": rvq_residuals,
    "snake_beta.png": snake_beta,
    "pipeline_shapes.png": pipeline_shapes,
    "transformer_layer.png": transformer_layer,
    "speaker_encoder.png": speaker_encoder_figure,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output directory (default: docs/figures)")
    parser.add_argument("only", nargs="*", help="figure names to draw (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        if not args.only or name in args.only or name.removesuffix(".png") in args.only:
            draw(args.out)
            print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
