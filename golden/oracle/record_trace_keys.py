"""Record the official module keys of every traced stage on the tiny checkpoints, a small official dump,
and the official model's rounding noise in float32 / bfloat16 / float16 -> golden/trace/.

    .oracle-venv/bin/python golden/oracle/record_trace_keys.py
    .oracle-venv/bin/python golden/oracle/record_trace_keys.py --dumps-only   # only the three official dumps

Writes:
    golden/trace/inputs.npz                     the inputs of the cases below (codes, audio)
    golden/trace/official_keys.json             per stage, [key, shape] of every recorded call, in order
    golden/trace/official_codec_decode.safetensors   the official float32 hook dump of the codec-decode case
    golden/trace/official_speaker.safetensors        the same for the speaker case
    golden/trace/official_say.safetensors            and for the (greedy) say case
    golden/trace/precision_noise.json           per precision and network (the first part of the key:
                                                decoder, encoder, speaker_encoder, talker), the max over its
    tensors of |official_p - official_f64| / (eps_p * max(1, max|official_f64|))

The noise measurement runs each case with the whole official model cast to the precision (bfloat16,
float16: what a port computing in that dtype does) and compares every module output with the float64
oracle.  Generation stages are measured on the prefill call only (``:0`` keys), where both runs see
the same input; later steps may follow different codes.
"""

from __future__ import annotations

import json

from common import CHECKPOINTS, GOLDEN, np, versions  # noqa: I001
from hook_dump import (
    named_calls,
    run_codec_decode,
    run_codec_encode,
    run_generation,
    run_metadata,
    run_speaker,
    write_dump,
)

OUT = GOLDEN / "trace"
EPS = {"float32": float(np.finfo(np.float32).eps), "bfloat16": 2.0**-7, "float16": float(np.finfo(np.float16).eps)}
GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=3)


def make_inputs() -> dict:
    rng = np.random.default_rng(20261130)
    return {
        "codes": rng.integers(0, 64, size=(1, 16)).astype(np.int64),
        "encode_audio": (0.3 * rng.standard_normal(3000)).astype(np.float32),
        "speaker_audio": (0.1 * rng.standard_normal(6000)).astype(np.float32),
    }


def cases(inputs: dict) -> dict:
    """stage -> a function of the dtype returning the official calls (the tests run the same cases)."""
    st = CHECKPOINTS / "tiny-speech-tokenizer"
    return {
        "codec-decode": lambda d: run_codec_decode(st, inputs["codes"], d),
        "codec-encode": lambda d: run_codec_encode(st, inputs["encode_audio"], d),
        "speaker": lambda d: run_speaker(CHECKPOINTS / "tiny-base", inputs["speaker_audio"], d),
        "say": lambda d: run_generation(
            CHECKPOINTS / "tiny-customvoice",
            "generate_custom_voice",
            dict(text="Hi.", speaker="vivian", language="english", **GREEDY),
            d,
        ),
        "design": lambda d: run_generation(
            CHECKPOINTS / "tiny-voicedesign",
            "generate_voice_design",
            dict(text="Hello.", instruct="A calm voice.", language="english", **GREEDY),
            d,
        ),
        "clone": lambda d: run_generation(
            CHECKPOINTS / "tiny-base",
            "generate_voice_clone",
            dict(
                text="Hi.",
                language="english",
                ref_audio=(inputs["speaker_audio"], 24000),
                x_vector_only_mode=True,
                **GREEDY,
            ),
            d,
        ),
    }


def noise_ratios(named_p: list, named_64: dict, eps: float, prefill_only: bool) -> dict:
    ratios = {}
    for key, value in named_p:
        ref = named_64.get(key)
        if (
            ref is None
            or ref.shape != value.shape
            or value.dtype.kind != "f"
            or (prefill_only and ":" in key and not key.endswith(":0"))
        ):
            continue
        scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
        err = float(np.max(np.abs(value.astype(np.float64) - ref))) if ref.size else 0.0
        ratios[key] = err / (eps * scale)
    return ratios


DUMPED = ("codec-decode", "speaker", "say")


def dump_metadata(stage: str, inputs: dict) -> dict:
    """What refimpl's trace of the same case records about the run (``hook_dump.run_metadata``)."""
    if stage == "codec-decode":
        where, given = CHECKPOINTS / "tiny-speech-tokenizer", {"codes": inputs["codes"]}
    elif stage == "speaker":
        where, given = CHECKPOINTS / "tiny-base", {"audio": inputs["speaker_audio"]}
    else:
        where, given = (
            CHECKPOINTS / "tiny-customvoice",
            dict(text="Hi.", speaker="vivian", language="english", **GREEDY),
        )
    meta = run_metadata(stage, where, given)
    return dict(meta, dtype="float32", case="golden/oracle/record_trace_keys.py")


def write_official_dump(stage: str, named: list, inputs: dict) -> None:
    write_dump(str(OUT / f"official_{stage.replace('-', '_')}.safetensors"), named, dump_metadata(stage, inputs))


def main(argv=None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    OUT.mkdir(exist_ok=True)
    inputs = make_inputs()
    if argv == ["--dumps-only"]:
        for stage in DUMPED:
            write_official_dump(stage, named_calls(cases(inputs)[stage]("float32")), inputs)
            print("wrote", stage)
        return
    np.savez_compressed(OUT / "inputs.npz", **inputs)
    keys, noise = {}, {p: {} for p in EPS}
    for stage, run in cases(inputs).items():
        named = named_calls(run("float32"))
        keys[stage] = [[k, list(v.shape)] for k, v in named]
        if stage in DUMPED:
            write_official_dump(stage, named, inputs)
        named_64 = dict(named_calls(run("float64")))
        generation = stage in ("say", "design", "clone")
        for precision in EPS:
            named_p = named if precision == "float32" else named_calls(run(precision))
            ratios = noise_ratios(named_p, named_64, EPS[precision], generation)
            for key, ratio in ratios.items():
                family = key.split(".")[0].split(":")[0]
                worst = noise[precision].setdefault(family, {"max_ratio": 0.0, "at": None, "tensors": 0})
                worst["tensors"] += 1
                if ratio > worst["max_ratio"]:
                    worst.update(max_ratio=ratio, at=f"{stage}: {key}")
        print(stage, len(named))
    (OUT / "official_keys.json").write_text(json.dumps({"versions": versions(), "keys": keys}, indent=0) + "\n")
    summary = {p: {f: v["max_ratio"] for f, v in noise[p].items()} for p in EPS}
    (OUT / "precision_noise.json").write_text(
        json.dumps({"versions": versions(), "eps": EPS, "max_ratio": summary, "where": noise}, indent=1) + "\n"
    )
    print("max noise / (eps * scale):", json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
