"""Record the official talker / code predictor / generation on the tiny full models -> golden/talker.npz.

    .oracle-venv/bin/python golden/oracle/record_talker.py

(``.oracle-venv`` is the environment ``bash golden/oracle/setup_oracle.sh`` creates, see golden/README.md.)

For every case (each official mode and option: CustomVoice streaming / non-streaming / dialect / instruct /
batch, VoiceDesign, voice clone x-vector and ICL with both text-vs-codec length cases, mixed batch, and an
EOS case) the public ``Qwen3TTSModel.generate_*`` call is run with GREEDY settings (do_sample=False,
subtalker_dosample=False) in float32 (the official precision) and in float64 (the same modules cast to
double, with the official float32-only RoPE and RMSNorm steps made float64, ``common.make_float64_oracle``).
Hooks record, per run:

    prompt_embeds [B, T, H], attention_mask [B, T], trailing [B, N, H], tts_pad [H]   (talker.generate inputs)
    logits [S, B, V]          codec_head at the last position: prefill, then every decode step
    predictor_logits [F, B, 15, V']   the code predictor's 15 heads for every frame
    codes/<i> [T_i, 16]       what the official generate returns per item
    wav/<i>                   the public API's waveform (float32 run only)

Sampling: ``sampling/*`` holds, for a few sampled steps of the talker and of the code predictor, the
scores before and after each official logits processor (LogitsProcessorList patched to record them),
with the generated ids the processors saw.

The voice-clone prompts (reference codes + x-vector) come from the official ``create_voice_clone_prompt``
on synthetic audio and are stored with the cases, so the talker checks do not depend on the encoders.
"""

from __future__ import annotations

import json

from common import CHECKPOINTS, make_float64_oracle, np, save_golden, to_numpy, torch  # noqa: I001
from qwen_tts import Qwen3TTSModel
from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem
from transformers.generation import logits_process

GREEDY = dict(do_sample=False, subtalker_dosample=False)


def synthetic_audio(seconds: float, seed: int, sr: int = 24000) -> np.ndarray:
    """A deterministic voiced-like test signal: a few harmonics with vibrato plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t) + 10 * seed
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 * (1 + 0.5 * np.sin(2 * np.pi * 1.3 * t))
    return (x + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


# name -> (model, method, keyword arguments); voice clone cases name their prompts in "prompts"
CASES = {
    "cv_stream": (
        "customvoice",
        "generate_custom_voice",
        dict(text="Hello, world!", speaker="Vivian", language="English", non_streaming_mode=False, max_new_tokens=7),
    ),
    "cv_nonstream": (
        "customvoice",
        "generate_custom_voice",
        dict(text="Hello, world!", speaker="vivian", language="english", max_new_tokens=6),
    ),
    "cv_dialect_instruct": (
        "customvoice",
        "generate_custom_voice",
        dict(
            text="今天天气很好。",
            speaker="eric",
            language="Auto",
            instruct="A warm, gentle female voice.",
            non_streaming_mode=False,
            max_new_tokens=5,
        ),
    ),
    "cv_batch": (
        "customvoice",
        "generate_custom_voice",
        dict(
            text=["Good morning everyone, thank you for listening.", "Yes."],
            speaker=["serena", "dylan"],
            language=["Chinese", "auto"],
            instruct=["", "Please speak a little louder."],
            non_streaming_mode=False,
            max_new_tokens=6,
        ),
    ),
    "cv_batch_nonstream": (
        "customvoice",
        "generate_custom_voice",
        dict(
            text=["The weather is nice today.", "Call 555-0134 at 10:30 am."],
            speaker="serena",
            language=["german", "japanese"],
            max_new_tokens=5,
        ),
    ),
    "vd_nonstream": (
        "voicedesign",
        "generate_voice_design",
        dict(text="Speech synthesis turns the text into sound.", instruct="A deep, calm male voice.", max_new_tokens=6),
    ),
    "vd_batch_stream": (
        "voicedesign",
        "generate_voice_design",
        dict(
            text=["Bonjour tout le monde.", "Let's go for a walk in the park."],
            instruct=["An excited child who talks very fast.", ""],
            language=["english", "auto"],
            non_streaming_mode=False,
            max_new_tokens=6,
        ),
    ),
    "vc_xvec": (
        "base",
        "generate_voice_clone",
        dict(text="I'll read the book tonight.", language="English", prompts=["xvec_a"], max_new_tokens=6),
    ),
    "vc_icl_long_text": (
        "base",
        "generate_voice_clone",
        dict(
            text="She said: we're going to talk about it tomorrow, and the day after.",
            language="english",
            prompts=["icl_short_ref"],
            max_new_tokens=6,
        ),
    ),
    "vc_icl_short_text": (
        "base",
        "generate_voice_clone",
        dict(text="Yes.", language="auto", prompts=["icl_long_ref"], max_new_tokens=6),
    ),
    "vc_icl_nonstream": (
        "base",
        "generate_voice_clone",
        dict(
            text="Thank you for listening.",
            language="English",
            prompts=["icl_short_ref"],
            non_streaming_mode=True,
            max_new_tokens=5,
        ),
    ),
    "vc_batch": (
        "base",
        "generate_voice_clone",
        dict(
            text=["Good morning.", "The quick brown fox jumps over the lazy dog."],
            language=["english", "chinese"],
            prompts=["xvec_a", "icl_long_ref"],
            max_new_tokens=6,
        ),
    ),
}

# reference voices: (seconds of audio, seed, ref_text, x_vector_only_mode)
PROMPTS = {
    "xvec_a": (1.0, 1, None, True),
    "icl_short_ref": (0.4, 2, "Hello, world! This is a tiny text for a tiny tokenizer.", False),
    "icl_long_ref": (2.0, 3, "Hi.", False),
}

# the EOS case: the CustomVoice model with codec_head's EOS row replaced (stored in the golden file)
EOS_CASE = (
    "customvoice",
    "generate_custom_voice",
    dict(
        text=["Hello, world!", "Good morning everyone, thank you for listening."],
        speaker="vivian",
        language="english",
        non_streaming_mode=False,
        max_new_tokens=12,
    ),
)

# sampled runs whose logits-processor inputs/outputs are recorded
SAMPLING_CASE = (
    "customvoice",
    "generate_custom_voice",
    dict(
        text=["Hello, world!", "Yes."],
        speaker="serena",
        language="english",
        non_streaming_mode=False,
        max_new_tokens=5,
        do_sample=True,
        top_k=40,
        top_p=0.8,
        temperature=0.7,
        repetition_penalty=1.5,
        subtalker_dosample=True,
        subtalker_top_k=10,
        subtalker_top_p=0.9,
        subtalker_temperature=1.3,
    ),
)


class Recorder:
    """Hooks on one official model that collect the talker's inputs and every logits vector."""

    def __init__(self, model):
        self.model = model
        self.reset()
        talker = model.model.talker
        talker.codec_head.register_forward_hook(lambda m, i, o: self.logits.append(to_numpy(o[:, -1])))
        for g, head in enumerate(talker.code_predictor.lm_head):
            head.register_forward_hook(lambda m, i, o, g=g: self.predictor.append((g, to_numpy(o[:, -1]))))
        original_talker_generate = talker.generate

        def talker_generate(*args, **kwargs):
            self.inputs = {
                k: to_numpy(kwargs[k])
                for k in ("inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed")
            }
            return original_talker_generate(*args, **kwargs)

        talker.generate = talker_generate
        original_generate = model.model.generate

        def generate(*args, **kwargs):
            codes, hiddens = original_generate(*args, **kwargs)
            self.codes = [to_numpy(c) for c in codes]
            return codes, hiddens

        model.model.generate = generate

    def reset(self):
        self.logits, self.predictor, self.inputs, self.codes = [], [], None, None

    def arrays(self, prefix: str) -> dict:
        out = {
            f"{prefix}/prompt_embeds": self.inputs["inputs_embeds"],
            f"{prefix}/attention_mask": self.inputs["attention_mask"].astype(np.int8),
            f"{prefix}/trailing": self.inputs["trailing_text_hidden"],
            f"{prefix}/tts_pad": self.inputs["tts_pad_embed"].reshape(-1),
            f"{prefix}/logits": np.stack(self.logits),
        }
        groups = [g for g, _ in self.predictor]
        n_heads = max(groups) + 1 if groups else 0
        if self.predictor:
            assert groups == list(range(n_heads)) * (len(groups) // n_heads)
            frames = np.stack([x for _, x in self.predictor]).reshape(
                len(groups) // n_heads, n_heads, *self.predictor[0][1].shape
            )
            out[f"{prefix}/predictor_logits"] = frames.transpose(0, 2, 1, 3)  # [F, B, 15, V']
        for i, c in enumerate(self.codes):
            out[f"{prefix}/codes/{i}"] = c.astype(np.int64)
        return out


def load(kind: str, precision: str):
    m = Qwen3TTSModel.from_pretrained(str(CHECKPOINTS / f"tiny-{kind}"), dtype=torch.float32)
    m.model.eval()
    if precision == "f64":
        make_float64_oracle(m.model)
    return m


def prompt_items(spec_names, store: dict):
    return [
        VoiceClonePromptItem(
            ref_code=None if store[n]["ref_code"] is None else torch.from_numpy(store[n]["ref_code"]),
            ref_spk_embedding=torch.from_numpy(store[n]["spk"]),
            x_vector_only_mode=store[n]["xvec"],
            icl_mode=not store[n]["xvec"],
            ref_text=store[n]["ref_text"],
        )
        for n in spec_names
    ]


def run_case(model, rec: Recorder, method: str, kwargs: dict, prompts: dict):
    kwargs = dict(kwargs)
    names = kwargs.pop("prompts", None)
    if names is not None:
        kwargs["voice_clone_prompt"] = prompt_items(names, prompts)
    gen = {**GREEDY, **{k: v for k, v in kwargs.items() if k in GREEDY}}
    kwargs = {k: v for k, v in kwargs.items() if k not in GREEDY}
    rec.reset()
    with torch.inference_mode():
        wavs, sr = getattr(model, method)(**kwargs, **gen)
    assert sr == 24000
    return wavs


def record_sampling(golden: dict) -> None:
    """Scores before/after each official processor for a sampled run (talker and code predictor)."""
    kind, method, kwargs = SAMPLING_CASE
    model = load(kind, "f32")
    calls = []
    original_call = logits_process.LogitsProcessorList.__call__

    def call(self, input_ids, scores, **kw):
        stages = [("input", to_numpy(scores))]
        for p in self:
            scores = p(input_ids, scores)
            stages.append((type(p).__name__, to_numpy(scores)))
        calls.append((to_numpy(input_ids), stages))
        return scores

    logits_process.LogitsProcessorList.__call__ = call
    torch.manual_seed(0)
    try:
        with torch.inference_mode():
            getattr(model, method)(**kwargs)
    finally:
        logits_process.LogitsProcessorList.__call__ = original_call
    vocab = model.model.config.talker_config.vocab_size
    talker_calls = [c for c in calls if c[1][0][1].shape[-1] == vocab]
    predictor_calls = [c for c in calls if c[1][0][1].shape[-1] != vocab]
    for who, selected in (("talker", talker_calls), ("predictor", predictor_calls[:6])):
        for k, (ids, stages) in enumerate(selected):
            golden[f"sampling/{who}/{k}/input_ids"] = ids.astype(np.int64)
            golden[f"sampling/{who}/{k}/names"] = np.array(json.dumps([n for n, _ in stages]))
            for j, (_, s) in enumerate(stages):
                golden[f"sampling/{who}/{k}/stage{j}"] = s
    golden["sampling/settings"] = np.array(json.dumps(kwargs))


def make_prompts(base_model) -> dict:
    prompts = {}
    for name, (seconds, seed, ref_text, xvec) in PROMPTS.items():
        audio = synthetic_audio(seconds, seed)
        with torch.inference_mode():
            item = base_model.create_voice_clone_prompt((audio, 24000), ref_text=ref_text, x_vector_only_mode=xvec)[0]
        prompts[name] = {
            "audio": audio,
            "ref_text": ref_text,
            "xvec": xvec,
            "spk": to_numpy(item.ref_spk_embedding),
            "ref_code": None if item.ref_code is None else to_numpy(item.ref_code).astype(np.int64),
        }
    return prompts


def find_eos_row(model, rec: Recorder) -> np.ndarray:
    """A codec_head EOS row that makes the two items of EOS_CASE stop at different steps (greedy):
    the original row plus beta times the mean final hidden state of a plain run."""
    kind, method, kwargs = EOS_CASE
    head = model.model.talker.codec_head.weight
    eos = model.model.config.talker_config.codec_eos_token_id
    original = head.data[eos].clone()
    hidden = []
    hook = model.model.talker.codec_head.register_forward_hook(lambda m, i, o: hidden.append(i[0][:, -1]))
    run_case(model, rec, method, kwargs, {})
    hook.remove()
    direction = torch.cat(hidden).mean(0)
    direction = direction / direction.norm()
    for beta in np.arange(0.5, 12.0, 0.25):
        head.data[eos] = original + float(beta) * direction
        run_case(model, rec, method, kwargs, {})
        lengths = [len(c) for c in rec.codes]
        if len(set(lengths)) == 2 and max(lengths) < kwargs["max_new_tokens"] - 1 and min(lengths) >= 2:
            row = head.data[eos].clone()
            head.data[eos] = original
            print(f"EOS row: beta {beta}, frame counts {lengths}")
            return to_numpy(row)
    raise RuntimeError("no EOS bias found that stops the two items at different steps")


def main() -> None:
    golden = {}
    models = {(k, p): load(k, p) for k in ("customvoice", "voicedesign", "base") for p in ("f32", "f64")}
    recorders = {key: Recorder(m) for key, m in models.items()}
    for kind in ("customvoice", "voicedesign", "base"):  # the official tensor names and shapes
        sd = models[(kind, "f32")].model.state_dict()
        golden[f"state_dict/{kind}"] = np.array(json.dumps({k: list(v.shape) for k, v in sd.items()}))
    prompts = make_prompts(models[("base", "f32")])
    for name, p in prompts.items():
        golden[f"prompt/{name}/audio"] = p["audio"]
        golden[f"prompt/{name}/spk"] = p["spk"]
        if p["ref_code"] is not None:
            golden[f"prompt/{name}/ref_code"] = p["ref_code"]
    golden["prompts"] = np.array(
        json.dumps({n: {"ref_text": p["ref_text"], "x_vector_only_mode": p["xvec"]} for n, p in prompts.items()})
    )
    golden["cases"] = np.array(
        json.dumps({n: {"model": k, "method": m, "kwargs": kw} for n, (k, m, kw) in CASES.items()})
    )
    for name, (kind, method, kwargs) in CASES.items():
        for prec in ("f32", "f64"):
            wavs = run_case(models[(kind, prec)], recorders[(kind, prec)], method, kwargs, prompts)
            golden.update(recorders[(kind, prec)].arrays(f"{name}/{prec}"))
            if prec == "f32":
                for i, w in enumerate(wavs):
                    golden[f"{name}/wav/{i}"] = np.asarray(w, dtype=np.float32)
        print(name, [golden[f"{name}/f32/codes/{i}"].shape[0] for i in range(len(wavs))])

    # EOS: the same bias row in both precisions
    kind, method, kwargs = EOS_CASE
    row = find_eos_row(models[(kind, "f32")], recorders[(kind, "f32")])
    golden["eos/codec_head_eos_row"] = row
    golden["eos/case"] = np.array(json.dumps({"model": kind, "method": method, "kwargs": kwargs}))
    for prec in ("f32", "f64"):
        m = models[(kind, prec)]
        head = m.model.talker.codec_head.weight
        eos = m.model.config.talker_config.codec_eos_token_id
        saved = head.data[eos].clone()
        head.data[eos] = torch.from_numpy(row).to(head.dtype)
        wavs = run_case(m, recorders[(kind, prec)], method, kwargs, {})
        golden.update(recorders[(kind, prec)].arrays(f"eos/{prec}"))
        head.data[eos] = saved
        if prec == "f32":
            for i, w in enumerate(wavs):
                golden[f"eos/wav/{i}"] = np.asarray(w, dtype=np.float32)
    print("eos", [golden[f"eos/f32/codes/{i}"].shape[0] for i in range(2)])

    record_sampling(golden)
    save_golden("talker", golden)


if __name__ == "__main__":
    main()
