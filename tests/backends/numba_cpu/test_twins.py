"""The numba backend's table of twins: every twin has the name and the signature of its reference."""

from __future__ import annotations

from refimpl import nn, transformer
from refimpl.backends import numba_cpu
from refimpl.codec import decoder as codec_decoder
from refimpl.codec import encoder as codec_encoder
from refimpl.codec import quantization
from refimpl.tts import speaker_encoder


def test_every_twin_has_a_reference_of_the_same_name_and_signature():
    import inspect

    assert set(numba_cpu.TWINS) == {
        *("conv1d", "conv_transpose1d", "snake_beta", "elu", "gelu_erf", "linear"),
        *("decoder_layer_step", "decoder_stack_step", "residual_unit_push", "resnet_block_offline"),
        *("elu_causal_conv_offline",),
        *("snake_causal_conv_push", "softmax", "tdnn_offline", "res2net_offline", "mean_and_std", "nearest_rows"),
        *("softmax_mean_and_std", "gated_residual", "spectral_magnitude", "attention", "rms_norm"),
    }
    for name, twin in numba_cpu.TWINS.items():
        # decoder_layer_step is a transformer primitive, residual_unit_push and snake_causal_conv_push the
        # codec decoder's, resnet_block_offline and elu_causal_conv_offline the codec encoder's,
        # tdnn_offline, res2net_offline, mean_and_std, softmax_mean_and_std, gated_residual and
        # spectral_magnitude the speaker encoder's, nearest_rows the codec's quantizer's
        stages = (nn, transformer, codec_decoder, codec_encoder, speaker_encoder, quantization)
        reference = next(getattr(m, name) for m in stages if hasattr(m, name))
        reference = reference.reference
        assert inspect.signature(twin) == inspect.signature(reference), name
