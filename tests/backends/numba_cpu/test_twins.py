"""The numba backend's table of twins: every twin has the name and the signature of its reference."""

from __future__ import annotations

from refimpl import nn, transformer
from refimpl.backends import numba_cpu
from refimpl.codec import decoder as codec_decoder
from refimpl.codec import encoder as codec_encoder
from refimpl.codec import quantization
from refimpl.tts import mel, speaker_encoder


def test_every_twin_has_a_reference_of_the_same_name_and_signature():
    import inspect

    assert set(numba_cpu.TWINS) == {
        *("conv1d", "conv_transpose1d", "snake_beta", "silu", "elu", "gelu_erf", "linear"),
        *("transformer_stack", "residual_unit", "resnet_block"),
        *("elu_causal_conv",),
        *("snake_causal_conv", "softmax", "tdnn", "res2net", "mean_and_std", "nearest_rows"),
        *("softmax_mean_and_std", "gated_residual", "spectral_magnitude", "attention", "rms_norm"),
        *("real_fft", "mel_bands", "attentive_statistics_pooling"),
    }
    for name, twin in numba_cpu.TWINS.items():
        # transformer_stack is the transformer's stage, residual_unit and snake_causal_conv the
        # codec decoder's, resnet_block and elu_causal_conv the codec encoder's,
        # tdnn, res2net, mean_and_std, softmax_mean_and_std, attentive_statistics_pooling, gated_residual and
        # spectral_magnitude the speaker encoder's, real_fft and mel_bands its front end's, nearest_rows the
        # codec's quantizer's
        stages = (nn, transformer, codec_decoder, codec_encoder, speaker_encoder, mel, quantization)
        reference = next(getattr(m, name) for m in stages if hasattr(m, name))
        expected, got = inspect.signature(reference.reference), inspect.signature(twin)
        if "record" in expected.parameters:  # a stage's twin: record defaults to None (it never records), and
            expected, got = _plain(expected, record=None), _plain(got)  # its module cannot name the stage's types
        assert got == expected, name


def _plain(signature, **defaults):
    """``signature`` without annotations, with the given parameters' defaults replaced."""
    import inspect

    return signature.replace(
        parameters=[
            p.replace(annotation=inspect.Parameter.empty, default=defaults.get(p.name, p.default))
            for p in signature.parameters.values()
        ],
        return_annotation=inspect.Signature.empty,
    )
