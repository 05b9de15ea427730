"""The numba backend: CPU twins of the primitives of ``refimpl/nn.py`` and of the stages' fused steps, with
their names and signatures, faster.  A twin computes its reference's formula (only the order of float sums
may differ: ``tests/backends/numba_cpu/`` bounds it) and returns ``NotImplemented`` for a call it has no
kernel for (float64, another pad mode), where the reference runs.

Each module is named after the code it speeds up; the modules below them hold what they share:

    elementwise, conv, linear, attention    the primitives of refimpl/nn.py
    transformer                             refimpl/transformer.py: a generation step's stack
    codec_decoder, codec_encoder,           refimpl/codec/: the fused residual units and blocks, the
    codec_quantization                      quantizer's nearest rows
    speaker_encoder                         refimpl/tts/speaker_encoder.py
    runtime                                 Numba's settings, the kernels' cache, the CPU's features
    pieces                                  pieces of work side by side on the BLAS threads
    intrinsics                              bit casts, exp, prefetch, rows on cache lines
    amx, amx_conv                           the AMX tiles: their core, the convolutions on them
    kept, packed_words                      layouts kept per read-only weight; the 12-bit packed words
    cached_kernels                          the first audio's kernels loaded from the cache ahead
    compile_helper                          a first run's helper process, compiling beside this one
"""

from __future__ import annotations

import functools

from ..bf16 import BF16Matrix
from . import runtime

runtime.configure()  # before Numba is imported: it reads its settings then

from . import (  # noqa: E402
    attention,
    cached_kernels,
    codec_decoder,
    codec_encoder,
    codec_quantization,
    compile_helper,
    conv,
    elementwise,
    linear,
    packed_words,
    speaker_encoder,
    transformer,
)
from .runtime import available  # noqa: E402

__all__ = ["TWINS", "available", "prepare_kernels", "prepare_weights"]


def prepare_kernels(helper=None, matrices=()) -> None:
    """What this backend does at the start of a model's load (``helper``: the command of its first run's helper
    process; ``matrices``: its code predictor's read-packed ones): the kernels of the first audio loaded from
    the cache in a thread, beside the load (``cached_kernels.load_ahead``); on a first run on this machine, the
    helper started there to compile some of them beside this one (``compile_helper``)."""
    then = None
    if helper is not None and compile_helper.wanted():
        bf16 = any(isinstance(m, BF16Matrix) for m in matrices)
        then = functools.partial(compile_helper.start_on_a_first_run, helper, bf16)
    cached_kernels.load_ahead(then)


def prepare_weights(matrices) -> None:
    """What this backend makes of a model's read-only weights before their first use, started at the load:
    the code predictor's packed words, in a thread (``packed_words.pack_ahead``)."""
    packed_words.pack_ahead(matrices)


# primitive (or fused step) name -> its twin, the function of that name in the module of its reference
TWINS = {
    # refimpl/nn.py
    "silu": elementwise.silu,
    "elu": elementwise.elu,
    "gelu_erf": elementwise.gelu_erf,
    "snake_beta": elementwise.snake_beta,
    "softmax": elementwise.softmax,
    "rms_norm": elementwise.rms_norm,
    "conv1d": conv.conv1d,
    "conv_transpose1d": conv.conv_transpose1d,
    "linear": linear.linear,
    "attention": attention.attention,
    # refimpl/transformer.py
    "transformer_stack": transformer.transformer_stack,
    # refimpl/codec/
    "residual_unit": codec_decoder.residual_unit,
    "snake_causal_conv": codec_decoder.snake_causal_conv,
    "resnet_block": codec_encoder.resnet_block,
    "elu_causal_conv": codec_encoder.elu_causal_conv,
    "nearest_rows": codec_quantization.nearest_rows,
    # refimpl/tts/speaker_encoder.py
    "tdnn": speaker_encoder.tdnn,
    "res2net": speaker_encoder.res2net,
    "gated_residual": speaker_encoder.gated_residual,
    "mean_and_std": speaker_encoder.mean_and_std,
    "softmax_mean_and_std": speaker_encoder.softmax_mean_and_std,
    "attentive_statistics_pooling": speaker_encoder.attentive_statistics_pooling,
    # refimpl/tts/mel.py (the speaker encoder's front end)
    "real_fft": speaker_encoder.real_fft,
    "spectral_magnitude": speaker_encoder.spectral_magnitude,
    "mel_bands": speaker_encoder.mel_bands,
}
