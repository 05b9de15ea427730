"""The speaker encoder of the Base models: 24 kHz audio -> log-mel spectrogram -> ECAPA-TDNN -> x-vector.

Voice cloning conditions the Talker on this x-vector (``enc_dim`` floats: 1024 on 0.6B-Base, 2048 on
1.7B-Base).  Shapes below are for the released config (B batch, N samples, T mel frames):

    audio [N] at sr Hz -> resampled to 24 kHz (other rates)
    1. log-mel spectrogram (n_fft 1024, hop 256, Hann 1024, 128 Slaney mels, 0..12 kHz)
                                          -> [128, T], fed as [B, T, 128]   T = 1 + (N - 256) // 256
    2. blocks.0  TDNN k5                  -> [B, 512, T]
    3. blocks.1..3  SE-Res2Net, k3, dilations 2, 3, 4 (each adds its input back)
                                          -> [B, 512, T] each
    4. mfa: concat(blocks.1..3) + TDNN k1 -> [B, 1536, T]
    5. asp: attentive statistics pooling  -> [B, 3072, 1]  (weighted mean ++ weighted std)
    6. fc: 1x1 conv                       -> [B, enc_dim]

Step 1 is ``refimpl.tts.mel`` (the host-side front end); this module is the network, steps 2-6.
Every "TDNN" is conv1d (with "same" padding made by *reflecting* the input) followed by ReLU.

Weights are a flat dict keyed by the checkpoint names with the ``speaker_encoder.`` prefix removed; each
function reads its module's through a ``WeightView`` of the module's prefix (``b["tdnn1.conv.weight"]`` in
``blocks.1.``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import nn
from ..backends import device_backend, on_model_backend, primitive
from ..backends.bf16 import upload_weights
from ..io.audio import audio_as_float, check_amplitude, check_sample_rate, resample
from ..io.checkpoint import (
    CheckpointError,
    WeightSpec,
    WeightView,
    check_weights,
    compute_dtype,
    read_checkpoint_weights,
    read_config,
)
from ..io.config import config_from_dict
from ..io.validate import check_speaker_encoder_config, raise_non_finite_stage
from ..recorder import NULL_RECORDER, Recorder, as_recorder
from .mel import (
    hann_window,
    hz_to_mel,
    mel_filterbank,
    mel_frame_count,
    mel_spectrogram,
    mel_to_hz,
    spectral_magnitude,
    stft_magnitude,
)

__all__ = [
    "SpeakerEncoderConfig",
    "speaker_encoder_weight_spec",
    "speaker_encoder_checkpoint_spec",
    "encode_mels",
    "resample",
    "SpeakerEncoder",
    "STAGES",
    # the mel front end, refimpl.tts.mel: importable from here as before
    "hz_to_mel",
    "mel_to_hz",
    "mel_filterbank",
    "hann_window",
    "stft_magnitude",
    "spectral_magnitude",
    "mel_spectrogram",
    "mel_frame_count",
]


@dataclass
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` of a Base model's config.json (official defaults; the released
    files set ``enc_dim`` and ``sample_rate`` and leave the rest at these defaults)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple = (5, 3, 3, 3, 1)
    enc_dilations: tuple = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data) -> SpeakerEncoderConfig:
        cfg = config_from_dict(cls, data)
        check_speaker_encoder_config(cfg)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse configs the network cannot be built from (each message names the rule)."""
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise ValueError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations must have "
                f"the same length (at least 3); got {n}, {len(self.enc_kernel_sizes)}, "
                f"{len(self.enc_dilations)}"
            )
        C = self.enc_channels
        if any(c != C[0] for c in C[1:-1]):
            raise ValueError(
                f"speaker_encoder_config: the SE-Res2Net blocks add their input back, so "
                f"enc_channels[:-1] must all be equal; got {list(C)}"
            )
        if C[-1] != sum(C[1:-1]):
            raise ValueError(
                f"speaker_encoder_config: enc_channels[-1] ({C[-1]}) must equal the sum of the "
                f"SE-Res2Net block channels ({sum(C[1:-1])}), which the aggregation concatenates"
            )
        if C[0] % self.enc_res2net_scale:
            raise ValueError(
                f"speaker_encoder_config: channels {C[0]} are not divisible by enc_res2net_scale "
                f"{self.enc_res2net_scale}"
            )
        if self.enc_res2net_scale < 2:
            raise ValueError("speaker_encoder_config: enc_res2net_scale must be at least 2")

    @property
    def n_res2net_blocks(self) -> int:
        return len(self.enc_channels) - 2


# ----------------------------------------------------------------------------- weights


def _conv(name: str, c_out: int, c_in: int, k: int) -> list:
    return [WeightSpec(f"{name}.weight", (c_out, c_in, k)), WeightSpec(f"{name}.bias", (c_out,), "bias")]


def speaker_encoder_weight_spec(cfg: SpeakerEncoderConfig) -> list:
    """Every tensor of the speaker encoder, named as in the checkpoint (without ``speaker_encoder.``).
    The network has no buffers (no BatchNorm): only conv weights [out, in, k] and biases."""
    C, K, s = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_res2net_scale
    spec = _conv("blocks.0.conv", C[0], cfg.mel_dim, K[0])
    for i in range(1, len(C) - 1):
        p = f"blocks.{i}"
        spec += _conv(f"{p}.tdnn1.conv", C[i], C[i - 1], 1)
        for j in range(s - 1):
            spec += _conv(f"{p}.res2net_block.blocks.{j}.conv", C[i] // s, C[i] // s, K[i])
        spec += _conv(f"{p}.tdnn2.conv", C[i], C[i], 1)
        spec += _conv(f"{p}.se_block.conv1", cfg.enc_se_channels, C[i], 1)
        spec += _conv(f"{p}.se_block.conv2", C[i], cfg.enc_se_channels, 1)
    spec += _conv("mfa.conv", C[-1], C[-1], K[-1])
    spec += _conv("asp.tdnn.conv", cfg.enc_attention_channels, 3 * C[-1], 1)
    spec += _conv("asp.conv", C[-1], cfg.enc_attention_channels, 1)
    spec += _conv("fc", cfg.enc_dim, 2 * C[-1], 1)
    return spec


CHECKPOINT_PREFIX = "speaker_encoder."


def speaker_encoder_checkpoint_spec(cfg: SpeakerEncoderConfig) -> list:
    """The same tensors with their full names in a Base model checkpoint (``speaker_encoder.`` prefix).
    Synthetic weights are seeded by these full names, so ``random_weights(this, seed)`` gives the same
    tensors in a standalone speaker-encoder directory and in a full Base-model checkpoint."""
    return [WeightSpec(CHECKPOINT_PREFIX + s.name, s.shape, s.init) for s in speaker_encoder_weight_spec(cfg)]


# ----------------------------------------------------------------------------- 2.-6. ECAPA-TDNN

# The stage names recorded by ``encode_mels(..., trace=...)`` (for the released config); the golden
# files use the same names (the official module names).
STAGES = (
    "blocks.0",
    *(f"blocks.{i}.{part}" for i in (1, 2, 3) for part in ("tdnn1", "res2net_block", "tdnn2", "se_block")),
    "blocks.1",
    "blocks.2",
    "blocks.3",
    "mfa",
    "asp.context",
    "asp.tdnn",
    "asp.conv",
    "asp.weights",
    "asp",
    "fc",
)


def same_padding(kernel_size: int, dilation: int) -> tuple:
    """(left, right) padding that keeps the length: the span minus one, the odd sample on the right."""
    total = dilation * (kernel_size - 1)
    return total // 2, total - total // 2


def reflect_same_conv1d(x_bct, w_oik, b_o, dilation: int = 1):
    """A stride-1 conv whose output has the input's length: the input is extended by mirroring
    (x[2], x[1] | x[0] ... x[T-1] | x[T-2], x[T-3]; the edge sample is not repeated)."""
    left, right = same_padding(w_oik.shape[-1], dilation)
    T = x_bct.shape[-1]
    if max(left, right) >= T:
        raise ValueError(
            f"speaker encoder: {T} mel frames are too few for a reflect padding of "
            f"{max(left, right)} (needs at least {max(left, right) + 1} frames)"
        )
    if left or right:
        x_bct = np.pad(x_bct, ((0, 0), (0, 0), (left, right)), mode="reflect")
    return nn.conv1d(x_bct, w_oik, b_o, dilation=dilation)


def relu(x):
    return np.maximum(x, 0)


@primitive
def tdnn(x_bct, w_oik, b_o, dilation: int, record: Recorder = NULL_RECORDER):
    """TDNN block: ReLU(reflect-"same" conv).  ``record`` scoped to the block (``blocks.0.``) receives ``conv``
    and the block's output (the official name of the same tensor, ``{p}.activation``, is added by
    ``refimpl.porting.names``).  A primitive: numba's twin reads the reflected taps in place and adds the bias
    and takes the ReLU in one pass."""
    h = reflect_same_conv1d(x_bct, w_oik, b_o, dilation)
    record("conv", h)
    h = relu(h)
    record.output(h)
    return h


def tdnn_block(b: WeightView, x_bct, dilation: int, record: Recorder):
    """A TDNN of the checkpoint (weights ``conv.weight``, ``conv.bias``); ``b`` and ``record`` scoped to it."""
    return tdnn(x_bct, b["conv.weight"], b["conv.bias"], dilation, record)


@primitive
def res2net(x_bct, w_joik, b_jo, dilation: int, record: Recorder = NULL_RECORDER):
    """Res2Net: split the channels into ``len(w_joik) + 1`` groups; group 0 passes through, group 1 goes
    through its TDNN, and each later group j goes through its TDNN after adding the output of group j - 1 (a
    cascade that widens the receptive field); the outputs are concatenated.  ``w_joik``, ``b_jo``: the
    weights and biases of the TDNNs of groups 1, 2, ... in order, recorded as ``blocks.{j - 1}``.  A
    primitive: numba's twin writes each TDNN's output in place in the concatenated output."""
    groups = np.split(x_bct, len(w_joik) + 1, axis=1)
    outputs = [groups[0]]
    for j, (w_oik, b_o) in enumerate(zip(w_joik, b_jo, strict=True), start=1):
        inp = groups[j] if j == 1 else groups[j] + outputs[-1]
        outputs.append(tdnn(inp, w_oik, b_o, dilation, record.scope(f"blocks.{j - 1}.")))
    return np.concatenate(outputs, axis=1)


def squeeze_excitation_gates(se: WeightView, x_bct, record: Recorder = NULL_RECORDER):
    """Channel gates from the time average, [B, C, 1]: sigmoid(W2 ReLU(W1 mean_t(x) + b1) + b2); the
    squeeze-excitation is x times them.  ``se`` and ``record`` scoped to the ``se_block``."""
    mean_bc1 = np.mean(x_bct, axis=2, keepdims=True)
    squeezed = nn.conv1d(mean_bc1, se["conv1.weight"], se["conv1.bias"])
    record("conv1", squeezed)
    squeezed = relu(squeezed)
    record("relu", squeezed)
    gates_bc1 = nn.conv1d(squeezed, se["conv2.weight"], se["conv2.bias"])
    record("conv2", gates_bc1)
    gates_bc1 = nn.sigmoid(gates_bc1)
    record("sigmoid", gates_bc1)
    return gates_bc1


@primitive
def gated_residual(h_bct, gates_bc1, x_bct, record: Recorder = NULL_RECORDER):
    """h * gates + x: the squeeze-excitation's output (recorded as ``se_block``) plus the block's input.  A
    primitive: numba's twin is one pass, rounding the product and the sum as these two steps do."""
    h_bct = h_bct * gates_bc1
    record("se_block", h_bct)
    return h_bct + x_bct


def se_res2net_block(b: WeightView, cfg: SpeakerEncoderConfig, dilation: int, x_bct, record: Recorder):
    """TDNN k1 -> Res2Net (kernel k_i, dilation d_i) -> TDNN k1 -> squeeze-excitation, + x; ``b`` and
    ``record`` scoped to the block (``blocks.{i}.``)."""
    h = tdnn_block(b.sub("tdnn1."), x_bct, 1, record.scope("tdnn1."))
    convs = [b.sub(f"res2net_block.blocks.{j}.conv.") for j in range(cfg.enc_res2net_scale - 1)]
    weights, biases = tuple(c["weight"] for c in convs), tuple(c["bias"] for c in convs)
    h = res2net(h, weights, biases, dilation, record.scope("res2net_block."))
    record("res2net_block", h)
    h = tdnn_block(b.sub("tdnn2."), h, 1, record.scope("tdnn2."))
    gates_bc1 = squeeze_excitation_gates(b.sub("se_block."), h, record.scope("se_block."))
    return gated_residual(h, gates_bc1, x_bct, record)


@primitive
def mean_and_std(x_bct, weights_bct, eps: float = 1e-12):
    """Weighted mean and standard deviation over time (weights sum to 1 over t); the variance is
    clamped to at least ``eps`` before the square root."""
    mean_bc = np.sum(weights_bct * x_bct, axis=2)
    variance_bc = np.sum(weights_bct * (x_bct - mean_bc[:, :, None]) ** 2, axis=2)
    return mean_bc, np.sqrt(np.maximum(variance_bc, x_bct.dtype.type(eps)))


@primitive
def softmax_mean_and_std(x_bct, logits_bct, eps: float = 1e-12, record: Recorder = NULL_RECORDER):
    """``mean_and_std`` of x with the weights softmax(logits) over time (recorded as ``weights``, in the scope
    ``asp.``): the attentive pooling's statistics from its logits.  A primitive: numba's twin never makes the
    weights."""
    weights_bct = nn.softmax(logits_bct, axis=2)
    record("weights", weights_bct)
    return mean_and_std(x_bct, weights_bct, eps)


def asp_context(x_bct, mean_bc, std_bc):
    """[x; mean; std] [B, 3C, T], the statistics repeated at every frame: the input of the official's TDNN."""
    T = x_bct.shape[-1]
    repeated = [np.repeat(mean_bc[:, :, None], T, axis=2), np.repeat(std_bc[:, :, None], T, axis=2)]
    return np.concatenate([x_bct, *repeated], axis=1)


@primitive
def attentive_statistics_pooling(a: WeightView, x_bct, record: Recorder = NULL_RECORDER):
    """[B, C, T] -> [B, 2C, 1]: attention weights over time per channel, from the frame itself and
    the utterance's plain mean and std (global context); then the attention-weighted mean and std.
    ``a`` and ``record`` scoped to the pooling (``asp.``).  A primitive: numba's twin adds the logits' bias
    inside the statistics' pass, and the TDNN's bias, ReLU and tanh in place."""
    B, C, T = x_bct.shape
    uniform_bct = nn.module_of(x_bct).full((B, 1, T), 1.0 / T, dtype=x_bct.dtype)
    mean_bc, std_bc = mean_and_std(x_bct, uniform_bct)
    record.lazy("context", lambda: asp_context(x_bct, mean_bc, std_bc))  # the TDNN's input as the official's
    # The TDNN's conv (k1) on that context, regrouped: W [x; m; s] + b = W_x x + (W_m m + W_s s + b).  The
    # statistics' share is a bias per row, so the 3C x T context (17 MB for 10 s) is never made.
    w_a3c = a["tdnn.conv.weight"][:, :, 0]
    bias_ba = a["tdnn.conv.bias"] + mean_bc @ w_a3c[:, C : 2 * C].T + std_bc @ w_a3c[:, 2 * C :].T
    h = nn.conv1d(x_bct, a["tdnn.conv.weight"][:, :C], None) + bias_ba[:, :, None]
    record("tdnn.conv", h)
    h = relu(h)
    record("tdnn", h)
    h = np.tanh(h)
    record("tanh", h)
    logits_bct = nn.conv1d(h, a["conv.weight"], a["conv.bias"])
    record("conv", logits_bct)
    mean_bc, std_bc = softmax_mean_and_std(x_bct, logits_bct, record=record)
    pooled = np.concatenate([mean_bc, std_bc], axis=1)[:, :, None]
    record.output(pooled)
    return pooled


def encode_mels(w, cfg: SpeakerEncoderConfig, mels_btm, trace=None):
    """ECAPA-TDNN: log mels [B, T, mel_dim] (the official input layout) -> x-vectors [B, enc_dim].

    If ``trace`` is a dict (or a ``Recorder``), the output of every stage (see ``STAGES``) is stored in it."""
    record, w = as_recorder(trace), WeightView(w)
    x_bct = np.swapaxes(mels_btm, 1, 2)
    x_bct = tdnn_block(w.sub("blocks.0."), x_bct, cfg.enc_dilations[0], record.scope("blocks.0."))
    block_outputs = []
    for i in range(1, len(cfg.enc_channels) - 1):
        p = f"blocks.{i}."
        x_bct = se_res2net_block(w.sub(p), cfg, cfg.enc_dilations[i], x_bct, record.scope(p))
        record(f"blocks.{i}", x_bct)
        block_outputs.append(x_bct)
    blocks_bct = np.concatenate(block_outputs, axis=1)
    x_bct = tdnn_block(w.sub("mfa."), blocks_bct, cfg.enc_dilations[-1], record.scope("mfa."))
    pooled_bc1 = attentive_statistics_pooling(w.sub("asp."), x_bct, record.scope("asp."))
    xvec_bd1 = nn.conv1d(pooled_bc1, w["fc.weight"], w["fc.bias"])
    record("fc", xvec_bd1)
    return xvec_bd1[:, :, 0]


def min_mel_frames(cfg: SpeakerEncoderConfig) -> int:
    """The fewest mel frames the network accepts: every reflect padding must be shorter than the input."""
    return 1 + max(max(same_padding(k, d)) for k, d in zip(cfg.enc_kernel_sizes, cfg.enc_dilations, strict=True))


# ----------------------------------------------------------------------------- the public object

# the official settings of the mel spectrogram fed to the speaker encoder
MEL_SETTINGS = dict(n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256, win_size=1024, fmin=0, fmax=12000)


class SpeakerEncoder:
    """The Base model's speaker encoder.  Arrays are NumPy; ``dtype`` is the compute dtype (float32
    like the official model in float32, or float64 as a higher-precision oracle).

        enc = SpeakerEncoder.from_pretrained("Qwen3-TTS-12Hz-0.6B-Base")
        xvec = enc.embed(audio, sr=16000)   # [enc_dim]

    The log-mel front end runs on the host (input preprocessing, like resampling); the network runs on
    the backend the encoder was built under (its weights uploaded once, ``backend``), NumPy in and out."""

    def __init__(self, config, weights: dict, dtype=np.float32, directory: Path | None = None):
        dtype = compute_dtype(dtype)
        self.config = config if isinstance(config, SpeakerEncoderConfig) else SpeakerEncoderConfig.from_dict(config)
        self.dtype = np.dtype(dtype).type
        self.directory = directory
        check_weights(weights, speaker_encoder_weight_spec(self.config), f"speaker encoder ({directory})")
        self.backend = device_backend()
        # Read-only copies of its own: a backend may keep what it derives from a weight (numba_cpu's tiles).
        weights = {name: np.array(arr, dtype=self.dtype) for name, arr in weights.items()}
        for arr in weights.values():
            arr.flags.writeable = False
        self.weights = upload_weights(weights)
        if self.config.mel_dim != MEL_SETTINGS["num_mels"]:
            raise ValueError(
                f"speaker_encoder_config.mel_dim is {self.config.mel_dim}, but the official mel "
                f"spectrogram has {MEL_SETTINGS['num_mels']} bands"
            )
        self.sample_rate = int(self.config.sample_rate)

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32) -> SpeakerEncoder:
        """Read ``speaker_encoder_config`` and the ``speaker_encoder.*`` tensors of a (Base) model directory."""
        directory = Path(path)
        if not directory.is_dir():
            raise CheckpointError(f"model directory {str(directory)!r} does not exist or is not a directory")
        config = read_config(directory)
        model_type = config.get("tts_model_type")
        if model_type is not None and model_type != "base":
            raise CheckpointError(
                f"{directory}: tts_model_type is {model_type!r}; only Base models carry a speaker encoder"
            )
        if "speaker_encoder_config" not in config:
            raise CheckpointError(f"{directory}/config.json has no speaker_encoder_config (not a Base model)")
        weights = read_checkpoint_weights(directory, dtype, prefix="speaker_encoder.")
        if not weights:
            raise CheckpointError(f"{directory}: no speaker_encoder.* tensors in the checkpoint")
        return cls(config["speaker_encoder_config"], weights, dtype, directory)

    @property
    def min_samples(self) -> int:
        """The shortest audio (at ``sample_rate``) the encoder accepts."""
        pad = (MEL_SETTINGS["n_fft"] - MEL_SETTINGS["hop_size"]) // 2
        need_frames = min_mel_frames(self.config)
        n = (need_frames - 1) * MEL_SETTINGS["hop_size"] + MEL_SETTINGS["n_fft"] - 2 * pad
        return max(n, pad + 1)

    def mels(self, audio):
        """Log mels [T, mel_dim] of 24 kHz audio [N] (the official settings)."""
        return mel_spectrogram(audio, dtype=self.dtype, **MEL_SETTINGS).T

    @on_model_backend
    def forward(self, mels_btm, trace=None):
        """x-vectors [B, enc_dim] of log mels [B, T, mel_dim] (host arrays in and out)."""
        mels_btm = np.asarray(mels_btm, dtype=self.dtype)
        if mels_btm.ndim != 3 or mels_btm.shape[-1] != self.config.mel_dim:
            raise ValueError(f"speaker encoder: mels must be [B, T, {self.config.mel_dim}], got {mels_btm.shape}")
        if mels_btm.shape[1] < min_mel_frames(self.config):
            raise ValueError(
                f"speaker encoder: {mels_btm.shape[1]} mel frames are too few; the network needs at "
                f"least {min_mel_frames(self.config)}"
            )
        return nn.to_host(encode_mels(self.weights, self.config, nn.to_device(mels_btm), trace))

    @on_model_backend
    def embed(self, audio, sr: int = 24000, trace=None):
        """The x-vector [enc_dim] of mono audio [N] sampled at ``sr`` Hz (resampled to 24 kHz first).

        Raises ValueError for a non-1-D or non-numeric array, NaN/inf samples, a non-positive rate, or
        audio shorter than ``min_samples`` (after resampling).  Samples outside [-1, 1] only warn."""
        audio = self.prepare_audio(audio, sr)
        mels_tm = self.mels(audio)
        record = as_recorder(trace)
        record("mel", mels_tm)
        xvec = self.forward(mels_tm[None], record)[0]
        if not np.isfinite(xvec).all():
            raise_non_finite_stage(
                "speaker encoder",
                lambda t: self.forward(t.setdefault("mel", mels_tm)[None], t),
                f"largest |sample| {np.max(np.abs(audio)):.3g}",
            )
        return xvec

    def prepare_audio(self, audio, sr: int = 24000):
        """Check the audio, convert it to the compute dtype and resample it to ``sample_rate`` (see
        ``resample``).  Multi-channel audio is refused: the official wrapper averages channels first."""
        audio = np.asarray(audio)
        if audio.ndim != 1:
            raise ValueError(f"audio must be mono, rank 1 [N]; got shape {audio.shape} (mix channels down first)")
        audio = audio_as_float(audio)  # int16 / int32 / uint8 PCM scaled to [-1, 1)
        sr = check_sample_rate(sr)
        audio = audio.astype(self.dtype)
        if not np.all(np.isfinite(audio)):
            raise ValueError(f"audio contains {int(np.sum(~np.isfinite(audio)))} NaN or infinite samples")
        check_amplitude(audio)
        if sr != self.sample_rate:
            if audio.size < 2:
                raise ValueError(f"audio of {audio.size} samples is too short to resample")
            audio = resample(audio, sr, self.sample_rate)
        if audio.size < self.min_samples:
            raise ValueError(
                f"audio is too short: {audio.size} samples at {self.sample_rate} Hz, the speaker encoder "
                f"needs at least {self.min_samples} ({self.min_samples / self.sample_rate * 1000:.1f} ms)"
            )
        return audio
