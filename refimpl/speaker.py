"""The speaker encoder of the Base models: 24 kHz audio -> log-mel spectrogram -> ECAPA-TDNN -> x-vector.

Voice cloning conditions the Talker on this x-vector (``enc_dim`` floats: 1024 on 0.6B-Base, 2048 on
1.7B-Base).  Shapes below are for the released config (B batch, N samples, T mel frames):

    audio [N] at 24 kHz
    1. log-mel spectrogram (n_fft 1024, hop 256, Hann 1024, 128 Slaney mels, 0..12 kHz)
                                          -> [T, 128]      T = 1 + (N - 256) // 256
    2. blocks.0  TDNN k5                  -> [B, 512, T]
    3. blocks.1..3  SE-Res2Net, k3, dilations 2, 3, 4 (each adds its input back)
                                          -> [B, 512, T] each
    4. mfa: concat(blocks.1..3) + TDNN k1 -> [B, 1536, T]
    5. asp: attentive statistics pooling  -> [B, 3072, 1]  (weighted mean ++ weighted std)
    6. fc: 1x1 conv                       -> [B, enc_dim]

Every "TDNN" is conv1d (with "same" padding made by *reflecting* the input) followed by ReLU.

Weights are a flat dict keyed by the checkpoint names with the ``speaker_encoder.`` prefix removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import WeightSpec
from .config import config_from_dict

__all__ = ["SpeakerEncoderConfig", "speaker_encoder_weight_spec"]


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
    def from_dict(cls, data) -> "SpeakerEncoderConfig":
        cfg = config_from_dict(cls, data)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse configs the network cannot be built from (each message names the rule)."""
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations must have "
                             f"the same length (at least 3); got {n}, {len(self.enc_kernel_sizes)}, "
                             f"{len(self.enc_dilations)}")
        C = self.enc_channels
        if any(c != C[0] for c in C[1:-1]):
            raise ValueError(f"speaker_encoder_config: the SE-Res2Net blocks add their input back, so "
                             f"enc_channels[:-1] must all be equal; got {list(C)}")
        if C[-1] != sum(C[1:-1]):
            raise ValueError(f"speaker_encoder_config: enc_channels[-1] ({C[-1]}) must equal the sum of the "
                             f"SE-Res2Net block channels ({sum(C[1:-1])}), which the aggregation concatenates")
        if C[0] % self.enc_res2net_scale:
            raise ValueError(f"speaker_encoder_config: channels {C[0]} are not divisible by enc_res2net_scale "
                             f"{self.enc_res2net_scale}")
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
