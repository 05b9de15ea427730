"""Record the official 12 Hz decoder's outputs on the tiny checkpoint -> golden/codec_decoder.npz.

For each code sequence: every stage of the decoder (one causal pass), the whole single-pass output
and the official ``Qwen3TTSTokenizer.decode`` output (300-frame chunks with 25 frames of left context),
each in float32 (the official precision) and float64 (the same modules cast to double), so that the
tests can measure the official float32 rounding noise and set tolerances from it.
"""

from __future__ import annotations

from common import CHECKPOINTS, make_float64_oracle, np, save_golden, to_numpy, torch  # noqa: I001
from qwen_tts import Qwen3TTSTokenizer

# lengths: a single frame, an odd length, longer than the sliding window (8), longer than a chunk (300)
LENGTHS = {"t1": 1, "t7": 7, "t23": 23, "t311": 311}
# per-stage intermediates: every stage for short sequences; for longer ones (size!) the stages up to
# the waveform stack, which include the sliding-window transformer
ALL_STAGES_UP_TO = 10
EARLY_STAGES_UP_TO = 100
EARLY_STAGES = ("quantizer", "pre_conv", "pre_transformer", "upsample.0", "upsample.1", "decoder.0")


def decoder_stages(dec, codes_bqt):
    """Run the official decoder module by module, returning each stage's output (mirrors its forward)."""
    out = {}
    h = dec.quantizer.decode(codes_bqt)
    out["quantizer"] = h
    h = dec.pre_conv(h)
    out["pre_conv"] = h
    h = dec.pre_transformer(inputs_embeds=h.transpose(1, 2)).last_hidden_state
    out["pre_transformer"] = h
    h = h.permute(0, 2, 1)
    for i, blocks in enumerate(dec.upsample):
        for block in blocks:
            h = block(h)
        out[f"upsample.{i}"] = h
    for i, block in enumerate(dec.decoder):
        h = block(h)
        out[f"decoder.{i}"] = h
    out["wav"] = h.clamp(min=-1, max=1)[:, 0]
    return out


def main() -> None:
    path = CHECKPOINTS / "tiny-speech-tokenizer"
    tok32 = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)
    tok64 = Qwen3TTSTokenizer.from_pretrained(str(path), dtype=torch.float32)
    patched = make_float64_oracle(tok64.model.decoder)
    assert patched["rope"] == 1 and patched["rms_norm"] > 0, patched
    K = tok32.model.config.decoder_config.codebook_size
    rng = np.random.default_rng(20260129)
    golden = {}
    for key, T in LENGTHS.items():
        codes = rng.integers(0, K, size=(T, 16)).astype(np.int64)
        golden[f"{key}/codes"] = codes
        codes_bqt = torch.from_numpy(codes.T[None].copy())
        for prec, tok in (("f32", tok32), ("f64", tok64)):
            with torch.inference_mode():
                stages = decoder_stages(tok.model.decoder, codes_bqt)
                direct = tok.model.decoder(codes_bqt)[:, 0]
                assert torch.equal(direct, stages["wav"]), "stage-by-stage run differs from the module's forward"
                # the model's decode (the wrapper's float32 cast would hide the float64 digits)
                official = to_numpy(tok.model.decode(torch.from_numpy(codes[None])).audio_values[0])
                if prec == "f32":  # and the public wrapper, which must give the same numbers
                    wavs, sr = tok.decode([{"audio_codes": codes}])
                    assert sr == 24000 and np.array_equal(wavs[0], official)
            full = to_numpy(stages["wav"][0])
            golden[f"{key}/{prec}/full"] = full
            if T <= 300:  # a single chunk: the official decode is exactly the single pass
                assert np.array_equal(official, full)
            else:  # store only what chunking changes: the samples of the frames after the first chunk
                golden[f"{key}/{prec}/decode_after_300"] = official[300 * 1920 :]
            for name, value in stages.items():
                if name != "wav" and (T <= ALL_STAGES_UP_TO or (T <= EARLY_STAGES_UP_TO and name in EARLY_STAGES)):
                    golden[f"{key}/{prec}/stage/{name}"] = to_numpy(value[0])
    # -1 padding, as the official wrapper pads a batch of different lengths: decode a list
    a = rng.integers(0, K, size=(5, 16)).astype(np.int64)
    b = rng.integers(0, K, size=(9, 16)).astype(np.int64)
    golden["batch/a"], golden["batch/b"] = a, b
    with torch.inference_mode():
        wavs, _ = tok32.decode([{"audio_codes": a}, {"audio_codes": b}])
    golden["batch/f32/a"], golden["batch/f32/b"] = wavs[0], wavs[1]
    save_golden("codec_decoder", golden)


if __name__ == "__main__":
    main()
