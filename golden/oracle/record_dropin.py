"""Record what the official public API returns for its own README examples -> golden/dropin.json.

    .oracle-venv/bin/python golden/oracle/record_dropin.py

The examples of the official README (``Qwen3TTSModel.generate_custom_voice`` / ``generate_voice_design`` /
``generate_voice_clone`` / ``create_voice_clone_prompt``, ``Qwen3TTSTokenizer.encode`` / ``decode``) are run
on the tiny checkpoints of golden/checkpoints/, unchanged except: the tiny models' speakers (Vivian, Eric),
greedy decoding with ``max_new_tokens=6`` (so the result is deterministic and small), and a local WAV
(``reference_pcm16``, integer arithmetic only, so the test rebuilds it bit for bit) instead of the URLs.

Recorded per call: the types and lengths of what comes back, the sample rate, the codes the model
generated (captured from ``model.generate``) or the encoder returned, the talker's prompt vectors summed
over the hidden axis (one number per position: it tells the speaker, language and instruction apart even
where the tiny model's greedy codes do not), and per waveform its length, RMS, peak and first samples.
``tests/test_dropin.py`` runs the same calls through ``refimpl.Qwen3TTSModel`` /
``refimpl.Qwen3TTSTokenizer`` and compares.  Arguments starting with "@" are placeholders: "@ref.wav" the
reference WAV's path, "@b64:ref.wav" its base64 text, "@wav0:CASE" ``(wavs[0], sr)`` of an earlier case,
"@prompt:CASE" the prompt items an earlier case returned, "@codes:CASE" / "@dicts:CASE" / "@padded:CASE"
the codes an earlier case returned as the encode output, a list of dicts, a dict holding a padded [B, T, 16] array.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import CHECKPOINTS, GOLDEN, np, to_numpy, torch, versions  # noqa: I001
from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer

from golden.dropin_cases import Placeholders, reference_pcm16, write_pcm16

GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=6)
ZH = "其实我真的有发现，我是一个特别善于观察别人情绪的人。"
REF_TEXT = "Okay. Yeah. I resent you. I love you. I respect you. But you know what? You blew it!"

# name -> (model, method, keyword arguments); the greedy settings are added to every generate_* call
MODEL_CASES = [
    (
        "cv_single",
        "customvoice",
        "generate_custom_voice",
        dict(text=ZH, language="Chinese", speaker="Vivian", instruct="用特别愤怒的语气说"),
    ),
    (
        "cv_batch",
        "customvoice",
        "generate_custom_voice",
        dict(
            text=[ZH, "She said she would be here by noon."],
            language=["Chinese", "English"],
            speaker=["Vivian", "Eric"],
            instruct=["", "Very happy."],
        ),
    ),
    (
        "vd_single",
        "voicedesign",
        "generate_voice_design",
        dict(
            text="哥哥，你回来啦，人家等了你好久好久了，要抱抱！",
            language="Chinese",
            instruct="体现撒娇稚嫩的萝莉女声。",
        ),
    ),
    (
        "vd_batch",
        "voicedesign",
        "generate_voice_design",
        dict(
            text=["哥哥，你回来啦！", "It's in the top drawer... wait, it's empty?"],
            language=["Chinese", "English"],
            instruct=["体现撒娇稚嫩的萝莉女声。", "Speak in an incredulous tone."],
        ),
    ),
    (
        "vc_path",
        "base",
        "generate_voice_clone",
        dict(
            text="I am solving the equation: x = [-b ± √(b²-4ac)] / 2a?",
            language="English",
            ref_audio="@ref.wav",
            ref_text=REF_TEXT,
        ),
    ),
    (
        "prompt_path",
        "base",
        "create_voice_clone_prompt",
        dict(ref_audio="@ref.wav", ref_text=REF_TEXT, x_vector_only_mode=False),
    ),
    (
        "vc_prompt_batch",
        "base",
        "generate_voice_clone",
        dict(
            text=["Sentence A.", "Sentence B."],
            language=["English", "English"],
            voice_clone_prompt="@prompt:prompt_path",
        ),
    ),
    (
        "prompt_xvec_base64",
        "base",
        "create_voice_clone_prompt",
        dict(ref_audio="@b64:ref.wav", x_vector_only_mode=True),
    ),
    (
        "vc_xvec",
        "base",
        "generate_voice_clone",
        dict(text="Just the voice.", language="Auto", voice_clone_prompt="@prompt:prompt_xvec_base64"),
    ),
    (
        "design_ref",
        "voicedesign",
        "generate_voice_design",
        dict(
            text="H-hey! You dropped your calculus notebook?",
            language="English",
            instruct="Male, 17 years old, tenor range",
        ),
    ),
    (
        "prompt_design",
        "base",
        "create_voice_clone_prompt",
        dict(ref_audio="@wav0:design_ref", ref_text="H-hey! You dropped your calculus notebook?"),
    ),
    (
        "vc_design_batch",
        "base",
        "generate_voice_clone",
        dict(
            text=["No problem! I actually finished those.", "What? No! I mean yes."],
            language=["English", "English"],
            voice_clone_prompt="@prompt:prompt_design",
        ),
    ),
]

TOKENIZER_CASES = [
    ("enc_path", "encode", dict(audios="@ref.wav")),
    ("dec_enc_path", "decode", dict(encoded="@codes:enc_path")),
    ("enc_array_16k", "encode", dict(audios="@array16k", sr=16000)),
    ("enc_batch", "encode", dict(audios=["@array16k", "@array16k_short"], sr=16000)),
    ("dec_batch", "decode", dict(encoded="@codes:enc_batch")),
    ("dec_dicts", "decode", dict(encoded="@dicts:enc_batch")),
    ("dec_padded", "decode", dict(encoded="@padded:enc_batch")),
    ("enc_base64_tuple", "encode", dict(audios="@b64:ref.wav", return_dict=False)),
]


def wav_summary(w) -> dict:
    w = np.asarray(w, dtype=np.float64)
    return {
        "len": int(w.shape[0]),
        "rms": float(np.sqrt(np.mean(w**2))) if w.size else 0.0,
        "peak": float(np.max(np.abs(w))) if w.size else 0.0,
        "first": [float(x) for x in w[:8]],
    }


def describe_wavs_sr(out) -> dict:
    wavs, sr = out
    return {
        "type": type(out).__name__,
        "len": len(out),
        "wavs_type": type(wavs).__name__,
        "sr": sr,
        "sr_type": type(sr).__name__,
        "wav_types": [type(w).__name__ for w in wavs],
        "wav_dtypes": [str(w.dtype) for w in wavs],
        "wav_shapes": [list(w.shape) for w in wavs],
        "wavs": [wav_summary(w) for w in wavs],
    }


def describe_prompt(items) -> dict:
    return {
        "type": type(items).__name__,
        "item_types": [type(i).__name__ for i in items],
        "fields": list(items[0].__dataclass_fields__),
        "items": [
            {
                "ref_code": None if i.ref_code is None else to_numpy(i.ref_code).tolist(),
                "ref_code_dtype": None if i.ref_code is None else str(i.ref_code.dtype),
                "spk_shape": list(i.ref_spk_embedding.shape),
                "spk_first": [float(x) for x in to_numpy(i.ref_spk_embedding)[:8]],
                "x_vector_only_mode": i.x_vector_only_mode,
                "icl_mode": i.icl_mode,
                "ref_text": i.ref_text,
            }
            for i in items
        ],
    }


def describe_encoded(enc) -> dict:
    if isinstance(enc, tuple):
        return {
            "type": "tuple",
            "len": len(enc),
            "codes": [to_numpy(c).tolist() for c in enc[0]],
            "code_dtypes": [str(c.dtype) for c in enc[0]],
        }
    return {
        "type": type(enc).__name__,
        "keys": list(enc.keys()),
        "len": len(enc),
        "iter": list(iter(enc)),
        "item0_type": type(enc[0]).__name__,
        "codes_type": type(enc.audio_codes).__name__,
        "to_tuple_len": len(enc.to_tuple()),
        "code_dtypes": [str(c.dtype) for c in enc.audio_codes],
        "codes": [to_numpy(c).tolist() for c in enc.audio_codes],
    }


def record_models(ph: Placeholders) -> dict:
    models = {
        k: Qwen3TTSModel.from_pretrained(str(CHECKPOINTS / f"tiny-{k}"), dtype=torch.float32)
        for k in ("customvoice", "voicedesign", "base")
    }
    captured, prompts = [], []
    for m in models.values():
        original = m.model.generate

        def generate(*args, _original=original, **kwargs):
            codes, hidden = _original(*args, **kwargs)
            captured.append([to_numpy(c).tolist() for c in codes])
            return codes, hidden

        m.model.generate = generate
        original_talker = m.model.talker.generate

        def talker_generate(*args, _original=original_talker, **kwargs):
            prompts.append(to_numpy(kwargs["inputs_embeds"]).astype(np.float64))
            return _original(*args, **kwargs)

        m.model.talker.generate = talker_generate
    out = {
        "supported": {
            k: {"speakers": m.get_supported_speakers(), "languages": m.get_supported_languages()}
            for k, m in models.items()
        },
        "cases": [],
    }
    for name, kind, method, kwargs in MODEL_CASES:
        call = {k: ph.value(v) for k, v in kwargs.items()}
        if method.startswith("generate"):
            call.update(GREEDY)
        captured.clear()
        prompts.clear()
        with torch.inference_mode():
            result = getattr(models[kind], method)(**call)
        ph.outputs[name] = result
        record = {"name": name, "model": kind, "method": method, "kwargs": kwargs}
        if method == "create_voice_clone_prompt":
            record["returns"] = describe_prompt(result)
        else:
            record["returns"] = describe_wavs_sr(result)
            record["codes"] = captured[0]
            # the talker's prompt vectors [B, T, H], summed over H: one number per position and item
            record["prompt_sums"] = prompts[0].sum(axis=-1).tolist()
        out["cases"].append(record)
        print(name, "ok")
    return out


def record_tokenizer(ph: Placeholders) -> dict:
    tok = Qwen3TTSTokenizer.from_pretrained(str(CHECKPOINTS / "tiny-speech-tokenizer"), dtype=torch.float32)
    out = {
        "rates": {
            "model_type": tok.get_model_type(),
            "input": tok.get_input_sample_rate(),
            "output": tok.get_output_sample_rate(),
            "encode_downsample": tok.get_encode_downsample_rate(),
            "decode_upsample": tok.get_decode_upsample_rate(),
        },
        "cases": [],
    }
    for name, method, kwargs in TOKENIZER_CASES:
        call = {k: ph.value(v) for k, v in kwargs.items()}
        result = getattr(tok, method)(**call)
        ph.outputs[name] = result
        record = {
            "name": name,
            "method": method,
            "kwargs": kwargs,
            "returns": describe_encoded(result) if method == "encode" else describe_wavs_sr(result),
        }
        out["cases"].append(record)
        print(name, "ok")
    return out


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        write_pcm16(Path(folder) / "ref.wav", reference_pcm16(), 24000)
        ph = Placeholders(Path(folder) / "ref.wav", to_numpy)
        golden = {
            "versions": versions(),
            "greedy": GREEDY,
            "model": record_models(ph),
            "tokenizer": record_tokenizer(ph),
        }
    path = GOLDEN / "dropin.json"
    path.write_text(json.dumps(golden, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size / 1e3:.1f} kB)")


if __name__ == "__main__":
    main()
