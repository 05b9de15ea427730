"""The speaker encoder's front end: audio -> log-mel spectrogram [128, T], as the official computes it.

    audio [N] at 24 kHz -> reflect-pad 384 samples each side (no n_fft / 2 centring)
        -> Hann-windowed frames of 1024 samples every 256 (the periodic Hann window of torch)
        -> real FFT, magnitude sqrt(re^2 + im^2 + 1e-9)                      [1 + n_fft // 2, T]
        -> 128 Slaney mel bands 0..12 kHz (librosa's filterbank, float32)   [128, T]
        -> natural log of max(mel, 1e-5)                                     T = 1 + (N - 256) // 256

``mel_spectrogram`` is the whole front end (its defaults are the official settings); the speaker
encoder (``refimpl.tts.speaker_encoder``) feeds its output, transposed, to the ECAPA-TDNN.  It runs on the
host, like resampling: input preprocessing, whatever the backend of the network.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from ..backends import primitive

__all__ = [
    "hz_to_mel",
    "mel_to_hz",
    "mel_filterbank",
    "hann_window",
    "stft_magnitude",
    "real_fft",
    "spectral_magnitude",
    "mel_bands",
    "mel_frame_count",
    "mel_spectrogram",
]

# ----------------------------------------------------------------------------- the mel scale and its filterbank
#
# The Slaney mel scale (librosa's default, htk=False): linear below 1 kHz (200/3 Hz per mel), then
# logarithmic, 27 mels per factor 6.4 in frequency.  The filterbank has one triangle per mel band,
# from the centre of the band below to the centre of the band above, scaled by 2 / (its width in Hz)
# so that every band has about the same area ("slaney" normalisation).

_F_SP = 200.0 / 3.0  # Hz per mel in the linear part
_MIN_LOG_HZ = 1000.0  # where the log part starts
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(f_hz):
    """Slaney mel of a frequency in Hz (float64)."""
    f = np.asarray(f_hz, dtype=np.float64)
    linear = f / _F_SP
    log_part = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return np.where(f >= _MIN_LOG_HZ, log_part, linear)


def mel_to_hz(m_mel):
    """The inverse of ``hz_to_mel`` (float64)."""
    m = np.asarray(m_mel, dtype=np.float64)
    linear = _F_SP * m
    log_part = _MIN_LOG_HZ * np.exp(_LOG_STEP * (np.maximum(m, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log_part, linear)


def mel_filterbank(
    sampling_rate: float, n_fft: int, num_mels: int, fmin: float = 0.0, fmax: float | None = None, dtype=np.float32
):
    """The Slaney-normalised triangular mel filterbank [num_mels, 1 + n_fft // 2], equal to
    ``librosa.filters.mel(sr=..., n_fft=..., n_mels=..., fmin=..., fmax=...)``.

    Like librosa, with ``dtype=float32`` (its default, and what the official model uses) the unscaled
    triangles are rounded to float32 first and the scaled product rounded again; ``dtype=float64``
    gives the unrounded values."""
    fmax = sampling_rate / 2.0 if fmax is None else fmax
    bin_hz = np.linspace(0.0, sampling_rate / 2.0, 1 + n_fft // 2)  # [F]
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), num_mels + 2))  # [M + 2]
    widths_hz = np.diff(edges_hz)  # [M + 1]
    offsets_mf = edges_hz[:, None] - bin_hz[None, :]  # [M + 2, F]
    rising_mf = -offsets_mf[:-2] / widths_hz[:-1, None]  # 0 at the lower edge, 1 at the centre
    falling_mf = offsets_mf[2:] / widths_hz[1:, None]  # 1 at the centre, 0 at the upper edge
    triangles_mf = np.maximum(0.0, np.minimum(rising_mf, falling_mf)).astype(dtype)
    area_scale_m = 2.0 / (edges_hz[2:] - edges_hz[:-2])
    return (triangles_mf * area_scale_m[:, None]).astype(dtype)


@functools.lru_cache(maxsize=8)
def _mel_basis(sampling_rate, n_fft: int, num_mels: int, fmin, fmax, dtype):
    """``mel_filterbank``'s float32 values in the compute dtype, made once per setting (0.5 ms each time
    otherwise), read-only."""
    basis_mf = mel_filterbank(sampling_rate, n_fft, num_mels, fmin, fmax, np.float32).astype(dtype)
    basis_mf.flags.writeable = False
    return basis_mf


# ----------------------------------------------------------------------------- frames and their spectrum


def hann_window(n: int, dtype=np.float32):
    """The periodic Hann window (torch.hann_window's default): 0.5 - 0.5 cos(2 pi i / n), i < n."""
    i = np.arange(n, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * i / n)).astype(dtype)


def stft_magnitude(audio_bn, n_fft: int, hop_size: int, win_size: int):
    """|STFT| of already padded audio, frames taken without centring: frame t covers samples
    [t * hop, t * hop + n_fft).  A window shorter than n_fft is zero-padded on both sides (centred).
    The magnitude is sqrt(re^2 + im^2 + 1e-9) (``spectral_magnitude``).  [B, N] -> [B, 1 + n_fft // 2, T]."""
    dtype = audio_bn.dtype.type
    window = np.zeros(n_fft, dtype=dtype)
    left = (n_fft - win_size) // 2
    window[left : left + win_size] = hann_window(win_size, dtype)
    frames_btn = np.lib.stride_tricks.sliding_window_view(audio_bn, n_fft, axis=-1)[:, ::hop_size]
    return np.swapaxes(spectral_magnitude(real_fft(frames_btn * window)), 1, 2)


@primitive
def real_fft(frames_btn):
    """The real FFT of every frame (the last axis): [B, T, N] -> [B, T, 1 + N // 2], float32 in complex64 out.
    SciPy's, on the host (imported here: the stage modules keep SciPy out of their compute paths), on its
    default thread; a backend may split the frames over more (each frame's transform the same)."""
    import scipy.fft

    return scipy.fft.rfft(frames_btn, axis=-1)


@primitive
def spectral_magnitude(spectrum_btf):
    """sqrt(re^2 + im^2 + 1e-9) of a complex spectrum, in its real dtype (complex64 -> float32), each step
    rounded in that order.  [B, T, F] -> [B, T, F]."""
    dtype = spectrum_btf.real.dtype.type
    magnitude_btf = np.square(spectrum_btf.real)  # re^2 + im^2 + 1e-9, then sqrt,
    magnitude_btf += np.square(spectrum_btf.imag)  # in place: two arrays, not seven
    magnitude_btf += dtype(1e-9)
    return np.sqrt(magnitude_btf, out=magnitude_btf)


@primitive
def mel_bands(basis_mf, magnitude_bft):
    """The filterbank's bands of every frame: basis [M, F] times magnitudes [B, F, T] -> [B, M, T], one
    product.  A band's row is zero outside the bins between its neighbours' centres, so a backend may sum
    those bins alone."""
    return np.matmul(basis_mf, magnitude_bft)


# ----------------------------------------------------------------------------- the log-mel spectrogram


def mel_frame_count(n_samples: int, n_fft: int = 1024, hop_size: int = 256) -> int:
    """Frames of ``mel_spectrogram`` (no centring): 1 + (N + 2 * pad - n_fft) // hop, pad = (n_fft - hop) // 2."""
    pad = (n_fft - hop_size) // 2
    return 1 + (n_samples + 2 * pad - n_fft) // hop_size


def mel_spectrogram(
    audio,
    n_fft: int = 1024,
    num_mels: int = 128,
    sampling_rate: int = 24000,
    hop_size: int = 256,
    win_size: int = 1024,
    fmin: float = 0,
    fmax: float | None = 12000,
    center: bool = False,
    dtype=None,
):
    """Log-mel spectrogram as the speaker encoder sees it (the defaults are the official settings).

    audio [N] or [B, N] (float32 or float64; ``dtype`` overrides the compute dtype) ->
    log mel [num_mels, T] or [B, num_mels, T], T = ``mel_frame_count(N)``:

    1. reflect-pad (n_fft - hop) // 2 samples on both sides (so frames are centred on multiples of hop
       without the usual n_fft // 2 centring pad); with ``center=True`` a further n_fft // 2 reflect pad;
    2. Hann-windowed frames of n_fft samples every hop samples, real FFT, magnitude sqrt(|X|^2 + 1e-9);
    3. the Slaney mel filterbank (float32 values, as the official model uses);
    4. natural log of max(mel, 1e-5).

    Samples outside [-1, 1] are accepted with a warning (the official prints one)."""
    audio = np.asarray(audio)
    if audio.dtype.kind not in "fiu" or audio.ndim not in (1, 2):
        raise ValueError(
            f"mel_spectrogram: audio must be a real array [N] or [B, N]; got dtype {audio.dtype}, shape {audio.shape}"
        )
    dtype = np.dtype(dtype or (audio.dtype if audio.dtype in (np.float32, np.float64) else np.float32)).type
    audio_bn = np.atleast_2d(audio).astype(dtype)
    if not np.all(np.isfinite(audio_bn)):
        raise ValueError("mel_spectrogram: audio contains NaN or infinite samples")
    pad = (n_fft - hop_size) // 2
    n = audio_bn.shape[-1]
    if n <= pad or n + 2 * pad < n_fft:
        raise ValueError(
            f"mel_spectrogram: audio of {n} samples is too short: the reflect padding of {pad} "
            f"samples needs more than {pad}, and one analysis window needs "
            f"{max(pad + 1, n_fft - 2 * pad)} samples"
        )
    low, high = float(audio_bn.min()), float(audio_bn.max())
    if low < -1.0 or high > 1.0:
        warnings.warn(
            f"mel_spectrogram: audio exceeds [-1, 1] (min {low:.4g}, max {high:.4g}); computing the spectrogram anyway",
            stacklevel=2,
        )
    padded_bn = np.pad(audio_bn, ((0, 0), (pad, pad)), mode="reflect")
    if center:
        if padded_bn.shape[-1] <= n_fft // 2:
            raise ValueError("mel_spectrogram: audio too short for center=True")
        padded_bn = np.pad(padded_bn, ((0, 0), (n_fft // 2, n_fft // 2)), mode="reflect")
    magnitude_bft = stft_magnitude(padded_bn, n_fft, hop_size, win_size)
    basis_mf = _mel_basis(sampling_rate, n_fft, num_mels, fmin, fmax, dtype)
    mel_bmt = mel_bands(basis_mf, magnitude_bft)
    log_mel_bmt = np.log(np.maximum(mel_bmt, dtype(1e-5)))
    return log_mel_bmt[0] if audio.ndim == 1 else log_mel_bmt
