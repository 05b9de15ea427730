"""Record the official 12 Hz encoder's outputs on the tiny checkpoint -> golden/codec_encoder.npz.

For each input waveform, in float32 (the official precision) and float64:
- the codes [T, 16], the latent before quantisation [T, hidden] and, per code, the distance margin
  (distance to the second-nearest codebook row minus distance to the chosen row), computed with the
  same ``torch.cdist`` the official quantiser uses, on the residuals the official quantiser saw;
- for short inputs, every stage (each SEANet layer, each transformer layer, the downsample, the
  quantisers' input projections), in the official layouts without the batch axis.

Attention modes.  "full" is the official model as it runs on a CPU (SDPA, causal over the whole
past).  "sliding" is the official modules with the window of the config enforced: the encoder
transformer is given an explicit 4-D boolean mask built from transformers' own
``sliding_window_causal_mask_function(config.sliding_window)`` (a key is visible iff
q - window < k <= q), which is the window the flash-attention path applies (window_size =
(window - 1, window - 1) with causal masking).  The script checks that an explicit plain causal
mask reproduces the default path exactly, so the mask argument is honoured.

float64 run.  The model is made float64 with ``common.make_float64_oracle`` (``.double()`` plus float64
RoPE angles, which the official code otherwise computes in float32), and the quantiser's
``torch.cdist``, which the official code also runs in float32 whatever the model dtype, is lifted to
float64 (a per-instance replacement below), so that float64 is a real high-precision reference.
The float32 run is the untouched official model.

    .oracle-venv/bin/python golden/oracle/record_codec_encoder.py              # -> golden/codec_encoder.npz
    .oracle-venv/bin/python golden/oracle/record_codec_encoder.py --released   # full size, not committed

(``.oracle-venv`` is the environment ``bash golden/oracle/setup_oracle.sh`` creates, see golden/README.md.)
"""

from __future__ import annotations

import types
from pathlib import Path

from common import CHECKPOINTS, REPO, make_float64_oracle, np, save_golden, to_numpy, torch, versions  # noqa: I001
from qwen_tts import Qwen3TTSTokenizer
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.mimi import modeling_mimi

SR = 24000
SPF = 1920
# inputs whose per-stage intermediates are stored (short ones: the SEANet stages run at 24 kHz)
STAGE_INPUTS = ("noise", "silence", "short", "one")
PARTS = ("semantic_residual_vector_quantizer", "acoustic_residual_vector_quantizer")


def make_inputs() -> dict:
    rng = np.random.default_rng(20260130)
    t = lambda n: np.arange(n) / SR  # noqa: E731
    n_chirp = 7 * SPF  # a multiple of 1920
    tc = t(n_chirp)
    sweep = 80 * tc + 0.5 * (6000 - 80) / tc[-1] * tc**2  # 80 Hz -> 6 kHz
    n_long = 20 * SPF + 333  # 41 frames at 25 Hz: longer than the tiny window (16)
    tl = t(n_long)
    vibrato = 220 * tl + 3.0 * np.sin(2 * np.pi * 5 * tl)
    tone = sum(np.sin(2 * np.pi * h * vibrato) / h for h in (1, 2, 3, 5))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * tl)
    inputs = {
        "chirp": 0.6 * np.sin(2 * np.pi * sweep),
        "noise": 0.3 * rng.standard_normal(2 * SPF + 777),
        "silence": np.zeros(2 * SPF + 1),
        "short": 0.5 * rng.standard_normal(100),
        "one": np.array([0.25]),
        "long": 0.3 * envelope * tone + 0.02 * rng.standard_normal(n_long),
    }
    return {k: v.astype(np.float32) for k, v in inputs.items()}


# ----------------------------------------------------------------------------- float64 lifts


def quantize_in_model_dtype(self, hidden_states):
    """Nearest codebook row with the distances in the model dtype (the official casts to float32)."""
    return torch.cdist(hidden_states[None], self.embed[None], p=2)[0].argmin(dim=-1)


def lift_cdist_to_model_dtype(model) -> int:
    patched = 0
    for module in model.modules():
        if isinstance(module, modeling_mimi.MimiEuclideanCodebook):
            module.quantize = types.MethodType(quantize_in_model_dtype, module)
            patched += 1
    return patched


# ----------------------------------------------------------------------------- running the official modules


def attention_mask_4d(mask_function, T: int):
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    return mask_function(0, 0, q, k)[None, None]  # [1, 1, T, T] boolean, True = may attend


def record_residuals(quantizer) -> list:
    """Make every VQ layer of the quantiser remember the residual it is given: [(part, layer, [B, T, D])]."""
    seen = []
    for part in PARTS:
        for j, layer in enumerate(getattr(quantizer, part).layers):

            def encode(self, hidden_states, _part=part, _j=j, _orig=layer.encode):
                seen.append((_part, _j, hidden_states.permute(0, 2, 1).clone()))
                return _orig(hidden_states)

            layer.encode = types.MethodType(encode, layer)
    return seen


def run_encoder(model, audio_bn, attention: str):
    """The official encoder, module by module (mirrors ``MimiModel._encode_frame``).  Returns the stages,
    the codes [B, 16, T] and the margins [B, 16, T]."""
    enc = model.encoder
    out = {}
    h = audio_bn[:, None, :]
    for i, layer in enumerate(enc.encoder.layers):
        h = layer(h)
        out[f"encoder.layers.{i}"] = h
    out["encoder"] = h
    T25 = h.shape[-1]
    window = enc.config.sliding_window
    mask = attention_mask_4d(sliding_window_causal_mask_function(window), T25) if attention == "sliding" else None
    tr = enc.encoder_transformer(h.transpose(1, 2), attention_mask=mask, output_hidden_states=True, return_dict=True)
    for i, hs in enumerate(tr.hidden_states[1:]):
        out[f"encoder_transformer.layers.{i}"] = hs
    out["encoder_transformer"] = tr.last_hidden_state
    latent = enc.downsample(tr.last_hidden_state.transpose(1, 2))
    out["downsample"] = latent
    for part in PARTS:
        out[f"quantizer.{part}.input_proj"] = getattr(enc.quantizer, part).input_proj(latent)
    residuals = record_residuals(enc.quantizer)
    codes = enc.quantizer.encode(latent, model.encoder_valid_num_quantizers).transpose(0, 1)  # [B, 16, T]
    margins = []
    for part, j, r_btd in residuals:
        cb = getattr(enc.quantizer, part).layers[j].codebook
        lifted = getattr(cb.quantize, "__func__", None) is quantize_in_model_dtype
        cdist_dtype = r_btd.dtype if lifted else torch.float32  # float32 is what the official quantiser uses
        B, T, D = r_btd.shape
        d = torch.cdist(r_btd.reshape(1, B * T, D).to(cdist_dtype), cb.embed[None].to(cdist_dtype), p=2)[0]
        two = torch.topk(d, 2, dim=-1, largest=False).values
        margins.append((two[:, 1] - two[:, 0]).reshape(B, T))
        expected = codes[:, len(margins) - 1]
        assert torch.equal(d.argmin(dim=-1).reshape(B, T), expected), "margin distances disagree with the codes"
    return out, codes, torch.stack(margins, dim=1)


def load_models(path):
    tok32 = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)
    tok64 = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)
    patched = make_float64_oracle(tok64.model)
    patched["cdist"] = lift_cdist_to_model_dtype(tok64.model)
    assert patched["rope"] > 0 and patched["cdist"] > 0, patched
    print("float64 oracle patches:", patched)
    return tok32, {"f32": (tok32.model, torch.float32), "f64": (tok64.model, torch.float64)}


def record_inputs(tok32, models, inputs: dict, stage_inputs=()) -> dict:
    golden = {"sliding_window": np.array(tok32.model.encoder.config.sliding_window)}
    for name, audio in inputs.items():
        golden[f"{name}/audio"] = audio
        T = -(-len(audio) // SPF)
        for prec, (model, dtype) in models.items():
            x = torch.from_numpy(audio)[None].to(dtype)
            for attention in ("full", "sliding"):
                with torch.inference_mode():
                    stages, codes, margins = run_encoder(model, x, attention)
                assert codes.shape[-1] == T
                key = f"{name}/{prec}/{attention}"
                golden[f"{key}/codes"] = to_numpy(codes[0].T).astype(np.int64)
                golden[f"{key}/latent"] = to_numpy(stages["downsample"][0].T)
                golden[f"{key}/margins"] = to_numpy(margins[0].T)
                if name in stage_inputs and attention == "full":
                    for stage, value in stages.items():
                        golden[f"{key}/stage/{stage}"] = to_numpy(value[0])
            if prec == "f32":
                with torch.inference_mode():
                    # the public wrapper (feature extractor, padding mask, cut to ceil(N / 1920)) gives the same codes
                    wrapped = tok32.encode(audio, sr=SR).audio_codes[0].numpy()
                    assert np.array_equal(wrapped, golden[f"{name}/f32/full/codes"]), name
                    # an explicit plain causal mask reproduces the default (mask-less) path bit for bit,
                    # so the explicit sliding mask above is honoured by the same code path
                    h = model.encoder.encoder(x[:, None])
                    plain = model.encoder.encoder_transformer(h.transpose(1, 2)).last_hidden_state
                    explicit = model.encoder.encoder_transformer(
                        h.transpose(1, 2), attention_mask=attention_mask_4d(causal_mask_function, h.shape[-1])
                    ).last_hidden_state
                    assert torch.equal(plain, explicit), "explicit causal mask differs from the default path"
        full, sliding = golden[f"{name}/f64/full/latent"], golden[f"{name}/f64/sliding/latent"]
        print(
            f"{name:8s} N={len(audio):6d} T={T:3d}  |sliding - full| latent max {np.abs(sliding - full).max():.3g}"
            f"  codes differ: {int((golden[f'{name}/f64/sliding/codes'] != golden[f'{name}/f64/full/codes']).sum())}"
            f"  min margin f32 {golden[f'{name}/f32/full/margins'].min():.3g}"
            f"  f32 vs f64 codes differ: "
            f"{int((golden[f'{name}/f32/full/codes'] != golden[f'{name}/f64/full/codes']).sum())}"
        )
    return golden


def record_tiny() -> None:
    tok32, models = load_models(CHECKPOINTS / "tiny-speech-tokenizer")
    inputs = make_inputs()
    golden = record_inputs(tok32, models, inputs, STAGE_INPUTS)
    # a batch of two lengths through the public wrapper: zero-padded to the longest, each cut to its own length
    a, b = inputs["noise"], inputs["chirp"]
    with torch.inference_mode():
        enc = tok32.encode([a, b], sr=SR).audio_codes
    golden["batch/names"] = np.array(["noise", "chirp"])
    golden["batch/f32/codes0"], golden["batch/f32/codes1"] = enc[0].numpy(), enc[1].numpy()
    save_golden("codec_encoder", golden)


def record_released() -> None:
    """The released config with seeded random weights (written on demand, ~680 MB, not committed) on 12 s
    of audio (300 frames at 25 Hz > the 250-frame window, so "full" and "sliding" differ).  Written to
    the benchmark checkpoint directory, next to the checkpoint; tests/codec/test_codec_encoder.py uses it when
    present."""
    import os

    from refimpl.porting import presets, synthetic

    bench = Path(os.environ.get("REFIMPL_BENCH_DIR", REPO / "bench-checkpoints"))
    path = bench / "released-speech-tokenizer"  # the same checkpoint as benchmarks/common.py (seed 0)
    if not (path / "model.safetensors").is_file():
        print(f"writing a full-size synthetic speech tokenizer to {path} ...", flush=True)
        synthetic.write_speech_tokenizer(path, presets.preset(presets.RELEASED_SPEECH_TOKENIZER), seed=0)
    tok32, models = load_models(path)
    rng = np.random.default_rng(20260131)
    t = np.arange(12 * SR) / SR
    tone = sum(np.sin(2 * np.pi * h * (150 * t + 3 * np.sin(2 * np.pi * 3 * t))) / h for h in (1, 2, 3, 5))
    audio = 0.3 * (0.5 + 0.5 * np.sin(2 * np.pi * 0.4 * t)) * tone + 0.01 * rng.standard_normal(len(t))
    golden = record_inputs(tok32, models, {"released12s": audio.astype(np.float32)})
    golden["versions"] = np.array(versions())
    golden["config_json"] = np.array((path / "config.json").read_text())  # the test skips if the checkpoint changed
    out = bench / "codec_encoder_released.npz"
    np.savez_compressed(out, **golden)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    import sys

    record_released() if "--released" in sys.argv[1:] else record_tiny()
