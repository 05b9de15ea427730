"""Dump every module output of the OFFICIAL model with forward hooks, under the naming rule of
``refimpl trace`` (docs/port_authors.md), so that a dump of the official model, of refimpl and of a port
can be compared with ``refimpl compare``.

    .oracle-venv/bin/python golden/oracle/hook_dump.py codec-decode CODES.npy  --model DIR -o official.safetensors
    .oracle-venv/bin/python golden/oracle/hook_dump.py codec-encode AUDIO.wav  --model DIR -o official.safetensors
    .oracle-venv/bin/python golden/oracle/hook_dump.py speaker      AUDIO.wav  --model DIR -o official.safetensors
    .oracle-venv/bin/python golden/oracle/hook_dump.py say "Hello." --speaker vivian --model DIR -o official.safetensors

The naming rule: a key is the module's path in ``named_modules()`` of ``Qwen3TTSTokenizer.model`` (codec)
or ``Qwen3TTSModel.model`` (TTS); the value is its output (the first tensor of a tuple, the
``last_hidden_state`` of a model output, else its first field); a module called more than once gets
``:N`` on every call (N from 0), a module called once no suffix.  Execution order is kept in the
metadata (``order``) and in the file.  ``--dtype float64`` runs the float64 oracle, ``bfloat16`` /
``float16`` the whole model cast to that dtype.  Generation is greedy.

As a library (``record_calls``), this is what ``golden/oracle/record_trace_keys.py`` uses to write the
committed key lists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from pathlib import Path

from common import make_float64_oracle, np, to_numpy, torch, versions  # noqa: I001

from refimpl.io.checkpoint import write_safetensors_file


def first_tensor(output):
    """The tensor the naming rule records for one module output (None if it has none)."""
    if torch.is_tensor(output):
        return output
    hidden = getattr(output, "last_hidden_state", None)
    if torch.is_tensor(hidden):
        return hidden
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    if isinstance(output, (tuple, list)):
        for item in output:
            t = first_tensor(item)
            if t is not None:
                return t
    return None


@contextlib.contextmanager
def record_calls(root):
    """Forward hooks on every named module of ``root``; yields the list of (path, array) in call order."""
    calls, handles = [], []
    for name, module in root.named_modules():
        if not name:
            continue

        def hook(module, inputs, output, _name=name):
            t = first_tensor(output)
            if t is not None:
                calls.append((_name, to_numpy(t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).copy()))

        handles.append(module.register_forward_hook(hook))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def named_calls(calls) -> list:
    """Apply the ``:N`` suffix rule: [(key, array)] in call order."""
    total = Counter(name for name, _ in calls)
    seen = Counter()
    out = []
    for name, value in calls:
        key = f"{name}:{seen[name]}" if total[name] > 1 else name
        seen[name] += 1
        out.append((key, value))
    return out


def run_metadata(stage: str, model_dir, inputs: dict) -> dict:
    """The fields of a refimpl trace's metadata that say which run it is (docs/port_authors.md), computed
    as ``refimpl.porting.trace_files`` does, so that ``refimpl compare`` can check a dump against ours:
    ``input`` (for codes or audio their hash and size, for a generation the keywords), ``config``,
    ``weights_sha256``, ``model_dir``."""
    from refimpl.io.checkpoint import read_config
    from refimpl.porting.trace_files import array_hash, weights_hash

    if stage == "codec-decode":
        codes = np.asarray(inputs["codes"], dtype=np.int64)
        inp = {"codes_sha256": array_hash(codes), "frames": int(codes.shape[0]), "codes": codes.tolist()}
    elif stage in ("codec-encode", "speaker"):
        audio = np.asarray(inputs["audio"])
        inp = {"audio_sha256": array_hash(audio), "samples": int(audio.shape[0]), "sample_rate": 24000}
    else:
        inp = {k: v for k, v in inputs.items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    return {
        "stage": stage,
        "input": inp,
        "model_dir": Path(model_dir).name,
        "config": read_config(model_dir),
        "weights_sha256": weights_hash(model_dir),
    }


def write_dump(path: str, named: list, metadata: dict) -> None:
    tensors = {
        k: (v.astype(np.int64) if v.dtype.kind in "iu" else v.astype(np.uint8) if v.dtype == bool else v)
        for k, v in named
    }
    meta = {
        "refimpl.trace": json.dumps(
            {**metadata, "producer": "official hooks", "versions": versions(), "order": [k for k, _ in named]}
        )
    }
    write_safetensors_file(path, tensors, dtype="keep", metadata=meta, sort=False)


# ----------------------------------------------------------------------------- the stages

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def set_precision(model, dtype: str):
    """float64: the true float64 oracle (``make_float64_oracle``); bfloat16 / float16: the whole model cast,
    as a port computing in that dtype would; float32: as shipped."""
    if dtype == "float64":
        make_float64_oracle(model)
    elif dtype != "float32":
        model.to(TORCH_DTYPES[dtype])


def run_codec_decode(model_dir, codes_tq, dtype):
    from qwen_tts import Qwen3TTSTokenizer

    tok = Qwen3TTSTokenizer.from_pretrained(str(model_dir), dtype=torch.float32)
    set_precision(tok.model, dtype)
    with record_calls(tok.model) as calls, torch.inference_mode():
        tok.model.decoder(torch.from_numpy(np.asarray(codes_tq, dtype=np.int64).T[None].copy()))
    return calls


def run_codec_encode(model_dir, audio, dtype):
    from qwen_tts import Qwen3TTSTokenizer

    tok = Qwen3TTSTokenizer.from_pretrained(str(model_dir), dtype=torch.float32)
    set_precision(tok.model, dtype)
    x = torch.from_numpy(np.asarray(audio))[None].to(TORCH_DTYPES[dtype])
    with record_calls(tok.model) as calls, torch.inference_mode():
        tok.model.encode(x, torch.ones_like(x, dtype=torch.long))
    return calls


def run_speaker(model_dir, audio, dtype):
    from qwen_tts import Qwen3TTSModel

    m = Qwen3TTSModel.from_pretrained(str(model_dir), dtype=torch.float32)
    set_precision(m.model, dtype)
    with record_calls(m.model) as calls, torch.inference_mode():
        m.model.extract_speaker_embedding(audio=np.asarray(audio, dtype=np.float32), sr=24000)
    return calls


def run_generation(model_dir, method: str, kwargs: dict, dtype):
    from qwen_tts import Qwen3TTSModel

    m = Qwen3TTSModel.from_pretrained(str(model_dir), dtype=torch.float32)
    set_precision(m.model, dtype)
    with record_calls(m.model) as calls, torch.inference_mode():
        getattr(m, method)(**kwargs)
    return calls


def read_audio(path: str):
    from refimpl.io.audio import read_wav

    wav, sr = read_wav(path)
    assert sr == 24000, "give 24 kHz audio (the hook script does not resample)"
    return wav


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["codec-decode", "codec-encode", "speaker", "say", "design"])
    p.add_argument("input", help="codes .npy, a 24 kHz .wav, or the text")
    p.add_argument("--model", required=True)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--dtype", choices=list(TORCH_DTYPES), default="float32")
    p.add_argument("--speaker", default="vivian")
    p.add_argument("--language", default="auto")
    p.add_argument("--instruct", default=None)
    p.add_argument("--max-new-tokens", type=int, default=8)
    args = p.parse_args(argv)
    if args.stage == "codec-decode":
        inputs = {"codes": np.load(args.input)}
        calls = run_codec_decode(args.model, inputs["codes"], args.dtype)
    elif args.stage in ("codec-encode", "speaker"):
        inputs = {"audio": read_audio(args.input)}
        run = run_codec_encode if args.stage == "codec-encode" else run_speaker
        calls = run(args.model, inputs["audio"], args.dtype)
    else:
        greedy = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=args.max_new_tokens)
        if args.stage == "say":
            inputs = dict(text=args.input, speaker=args.speaker, language=args.language, instruct=args.instruct)
            calls = run_generation(args.model, "generate_custom_voice", {**inputs, **greedy}, args.dtype)
        else:
            inputs = dict(text=args.input, instruct=args.instruct or "", language=args.language)
            calls = run_generation(args.model, "generate_voice_design", {**inputs, **greedy}, args.dtype)
        inputs.update(greedy)
    metadata = dict(run_metadata(args.stage, args.model, inputs), dtype=args.dtype)
    write_dump(args.output, named_calls(calls), metadata)
    print(f"wrote {args.output}: {len(calls)} tensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
