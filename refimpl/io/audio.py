"""Audio I/O and resampling: WAV files in and out (PCM 8/16/24/32-bit or 32/64-bit float), audio arrays of
any sample type brought to floats, and the resampler used wherever audio at another rate comes in (codec
encoder, speaker encoder).

Reading returns float samples in [-1, 1] and the file's sample rate; channels are kept
(``[N]`` mono or ``[N, C]``), since each consumer decides how to mix down.  Everything that comes from
outside is checked here, with one ``ValueError`` naming the file and the problem: a header that lies
about the data's size, a malformed format chunk, a sample rate outside ``[MIN_SAMPLE_RATE,
MAX_SAMPLE_RATE]``, NaN or infinite samples.  Writing refuses non-finite samples and never leaves a
half-written file in place of a good one (``refimpl.io.files.write_atomically``).
"""

from __future__ import annotations

import io
import math
import os
import struct
import warnings
from fractions import Fraction

import numpy as np

from .files import write_atomically

try:  # the official resampler; the polyphase filter below is the readable fallback and cross-check
    import soxr
except ImportError:  # pragma: no cover - soxr is a declared dependency
    soxr = None

__all__ = [
    "read_wav",
    "read_wav_bytes",
    "write_wav",
    "wav_bytes",
    "StreamedWav",
    "ClippingWarning",
    "resample",
    "resample_polyphase",
    "resampling_filter",
    "check_sample_rate",
    "audio_as_float",
    "check_amplitude",
    "MIN_SAMPLE_RATE",
    "MAX_SAMPLE_RATE",
    "MAX_AMPLITUDE",
]

# Sample rates accepted anywhere (files and arrays).  1 kHz is below any rate speech is recorded at; 1 MHz
# is above every audio rate in use (768 kHz is the highest).  Outside them the resampled audio's length or
# the resampler's cost would be out of proportion with the input.
MIN_SAMPLE_RATE = 1_000
MAX_SAMPLE_RATE = 1_000_000


def check_sample_rate(sr, what: str = "sample rate") -> int:
    """A whole number of Hz in [MIN_SAMPLE_RATE, MAX_SAMPLE_RATE] (an int, or a float such as 16000.0),
    returned as int; anything else (bool, string, 22050.5, 0, NaN, 4e9) is a ValueError."""
    number = isinstance(sr, (int, float, np.integer, np.floating)) and not isinstance(sr, (bool, np.bool_))
    if not number or not np.isfinite(sr):
        raise ValueError(f"{what} must be a positive whole number of Hz, got {sr!r}")
    if sr <= 0:
        raise ValueError(f"{what} must be positive, got {sr}")
    if float(sr) != int(sr):
        raise ValueError(f"{what} must be a whole number of Hz, got {sr}")
    sr = int(sr)
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise ValueError(f"{what} {sr} Hz is outside the supported range [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz")
    return sr


# integer sample types, scaled to [-1, 1) the way soundfile / librosa read PCM files
_PCM_SCALE = {
    np.dtype("int16"): (0.0, 32768.0),
    np.dtype("int32"): (0.0, 2147483648.0),
    np.dtype("uint8"): (128.0, 128.0),
}


def audio_as_float(arr: np.ndarray, what: str = "audio") -> np.ndarray:
    """Samples as float64: floats unchanged; int16, int32 and uint8 PCM scaled to [-1, 1) as a WAV reader
    would (x / 32768, x / 2^31, (x - 128) / 128); every other type refused, naming it."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "f":
        return arr.astype(np.float64)
    if arr.dtype in _PCM_SCALE:
        offset, scale = _PCM_SCALE[arr.dtype]
        return (arr.astype(np.float64) - offset) / scale
    if arr.dtype.kind in "iu":
        raise ValueError(
            f"{what} has integer samples of type {arr.dtype}, which have no standard scale; pass "
            "float samples in [-1, 1] or int16 / int32 / uint8 PCM"
        )
    raise ValueError(f"{what} must hold real numbers (a numeric dtype), got dtype {arr.dtype}")


# Audio lives in [-1, 1]; a little above (an unclipped mix) is processed as it is.  A sample above
# MAX_AMPLITUDE (60 dB over full scale) is almost certainly integer PCM passed as floats, and values of that
# size overflow float32 inside the networks (the encoders' normalisations square them).
MAX_AMPLITUDE = 1000.0


def check_amplitude(arr: np.ndarray, what: str = "audio") -> None:
    """Refuse samples larger than MAX_AMPLITUDE in magnitude (``arr`` is finite floats)."""
    peak = float(np.max(np.abs(arr))) if arr.size else 0.0
    if peak > MAX_AMPLITUDE:
        raise ValueError(
            f"{what} has samples of magnitude up to {peak:.4g}, above the limit of {MAX_AMPLITUDE:g} "
            "(audio is expected in [-1, 1]; integer PCM stored as floats? divide by 32768)"
        )


# ----------------------------------------------------------------------------- reading WAV
#
# A WAV file is a RIFF container: "RIFF" size "WAVE", then chunks of [4-byte id][u32 size][size bytes,
# padded to even].  We need "fmt " (encoding, channels, rate, sample size) and "data" (the samples);
# other chunks (LIST, fact, ...) are skipped.  Every size is checked against the file's real size.

WAVE_FORMAT_PCM, WAVE_FORMAT_FLOAT, WAVE_FORMAT_EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# The data size of a WAV written before its length was known (to a pipe): "to the end of the stream".
# 0xFFFFFFFF is FFmpeg's (and ours, ``StreamedWav``); 0x7FFFF000 is SoX's (``MS_UNSPEC`` in its wav.c).
STREAMED_DATA_SIZE = 0xFFFFFFFF
SOX_STREAMED_DATA_SIZE = 0x7FFFF000
MAX_CHANNELS = 64


class _Format:
    def __init__(self, tag: int, channels: int, rate: int, bits: int):
        self.tag, self.channels, self.rate, self.bits = tag, channels, rate, bits

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8


def read_wav(path) -> tuple[np.ndarray, int]:
    """Read a WAV file -> (float32 samples [N] or [N, C] in [-1, 1], sample rate)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"audio file {path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"audio file {path!r} is a directory")
    try:
        with open(path, "rb") as f:
            return _read_wav_from(f, path)
    except OSError as e:
        raise ValueError(f"cannot read audio file {path!r}: {e.strerror or e}") from None


def read_wav_bytes(data: bytes, name: str = "<bytes>") -> tuple[np.ndarray, int]:
    """``read_wav`` of a whole WAV file held in memory (standard input); ``name`` is used in errors."""
    return _read_wav_from(io.BytesIO(data), name)


def _read_wav_from(f, path: str) -> tuple[np.ndarray, int]:
    fmt, raw = _read_wav_chunks(f, path)
    audio = _decode_samples(raw, fmt)
    if fmt.channels > 1:
        audio = audio.reshape(-1, fmt.channels)
    bad = ~np.isfinite(audio)
    if bad.any():
        raise ValueError(f"audio file {path!r} has {int(bad.sum())} NaN or infinite samples")
    return audio, fmt.rate


def _read_wav_chunks(f, path: str) -> tuple[_Format, bytes]:
    """Walk the RIFF chunks up to the data chunk: (format, raw sample bytes)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    riff = f.read(12)
    if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
        kind = "an RF64 file (not supported)" if riff[:4] == b"RF64" else "not a RIFF/WAVE file"
        raise ValueError(f"cannot read audio file {path!r} as WAV: {kind}")
    fmt = None
    while True:
        head = f.read(8)
        if len(head) < 8:
            missing = "fmt" if fmt is None else "data"
            raise ValueError(f"cannot read audio file {path!r} as WAV: no {missing} chunk")
        chunk_id, chunk_size = struct.unpack("<4sI", head)
        start = f.tell()
        left = size - start
        if chunk_id == b"data":
            if fmt is None:
                raise ValueError(f"cannot read audio file {path!r} as WAV: the data chunk comes before the fmt chunk")
            return fmt, _read_data_chunk(f, path, fmt, chunk_size, left)
        if chunk_size > left:
            raise ValueError(
                f"cannot read audio file {path!r} as WAV: chunk {chunk_id!r} claims {chunk_size} "
                f"bytes but only {left} remain (truncated file?)"
            )
        if chunk_id == b"fmt ":
            fmt = _parse_fmt_chunk(f.read(chunk_size), path)
            f.seek(chunk_size & 1, os.SEEK_CUR)  # an odd-sized chunk (a 17-byte fmt) is followed by a pad byte
        else:
            f.seek(chunk_size + (chunk_size & 1), os.SEEK_CUR)


def _read_data_chunk(f, path: str, fmt: _Format, chunk_size: int, left: int) -> bytes:
    if chunk_size == STREAMED_DATA_SIZE or (chunk_size == SOX_STREAMED_DATA_SIZE and chunk_size > left):
        chunk_size = left - left % fmt.frame_bytes
    if chunk_size > left:
        raise ValueError(
            f"audio file {path!r}: the data chunk claims {chunk_size} bytes but the file holds only "
            f"{left} after its header (truncated file?)"
        )
    if chunk_size % fmt.frame_bytes:
        raise ValueError(
            f"audio file {path!r}: the data chunk's {chunk_size} bytes are not a whole number of "
            f"{fmt.frame_bytes}-byte frames ({fmt.channels} channels x {fmt.bits} bits)"
        )
    return f.read(chunk_size)


def _parse_fmt_chunk(raw: bytes, path: str) -> _Format:
    where = f"audio file {path!r}: malformed fmt chunk"
    if len(raw) < 16:
        raise ValueError(f"{where}: {len(raw)} bytes, at least 16 needed")
    tag, channels, rate, _byte_rate, block_align, bits = struct.unpack("<HHIIHH", raw[:16])
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if len(raw) < 26:
            raise ValueError(f"{where}: WAVE_FORMAT_EXTENSIBLE needs 40 bytes, the chunk has {len(raw)}")
        tag = struct.unpack("<H", raw[24:26])[0]  # the first two bytes of the sub-format GUID
    supported = {WAVE_FORMAT_PCM: (8, 16, 24, 32), WAVE_FORMAT_FLOAT: (32, 64)}
    if tag not in supported:
        raise ValueError(
            f"audio file {path!r}: unsupported WAV encoding (format tag {tag:#06x}); only PCM and IEEE float are read"
        )
    if bits not in supported[tag]:
        kind = "PCM" if tag == WAVE_FORMAT_PCM else "float"
        raise ValueError(f"{where}: {bits}-bit {kind} samples are not supported (only {supported[tag]} bits)")
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"{where}: {channels} channels (supported: 1 to {MAX_CHANNELS})")
    if block_align != channels * bits // 8:
        raise ValueError(f"{where}: block_align {block_align} does not match {channels} channels x {bits} bits")
    rate = check_sample_rate(rate, f"audio file {path!r}: sample rate")
    return _Format(tag, channels, rate, bits)


def _decode_samples(raw: bytes, fmt: _Format) -> np.ndarray:
    """Raw little-endian sample bytes -> float32 in [-1, 1]."""
    if fmt.tag == WAVE_FORMAT_FLOAT:
        return np.frombuffer(raw, dtype="<f4" if fmt.bits == 32 else "<f8").astype(np.float32)
    if fmt.bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)  # sign-extend
        return (value / float(1 << 23)).astype(np.float32)
    stored = {8: np.dtype("u1"), 16: np.dtype("<i2"), 32: np.dtype("<i4")}[fmt.bits]
    return audio_as_float(np.frombuffer(raw, dtype=stored).astype(stored.newbyteorder("="))).astype(np.float32)


# ----------------------------------------------------------------------------- writing WAV


class ClippingWarning(UserWarning):
    """Samples outside [-1, 1] were clipped to full scale when written as 16-bit PCM."""


def wav_samples(audio, sample_format: str = "pcm16") -> tuple[np.ndarray, int]:
    """Mono float audio as a WAV stores it: ``sample_format`` ``"pcm16"`` (int16, round(clip(x, -1, 1) *
    32767)) or ``"float"`` (float32, unclipped), and the number of samples clipped.  NaN or infinite
    samples are refused: they would silently become noise or a broken float WAV."""
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"write_wav expects mono audio [N], got shape {audio.shape}")
    if audio.dtype.kind not in "fiu":
        raise ValueError(f"write_wav expects real samples, got dtype {audio.dtype}")
    bad = ~np.isfinite(audio)
    if bad.any():
        raise ValueError(
            f"refusing to write audio with {int(bad.sum())} NaN or infinite samples (first at "
            f"sample {int(np.argmax(bad))})"
        )
    if sample_format == "pcm16":
        clipped = int(np.count_nonzero(np.abs(audio) > 1.0))
        return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16), clipped
    if sample_format == "float":
        if audio.size and np.max(np.abs(audio)) > np.finfo(np.float32).max:
            raise ValueError("refusing to write samples beyond the float32 range to a float WAV")
        return audio.astype(np.float32), 0
    raise ValueError(f"unknown sample format {sample_format!r}: use 'pcm16' or 'float'")


def warn_clipping(clipped: int, total: int, peak: float) -> None:
    """The ``ClippingWarning`` of ``clipped`` samples out of ``total`` (largest magnitude ``peak``)."""
    warnings.warn(
        f"{clipped} of {total} samples were outside [-1, 1] and clipped to 16-bit full "
        f"scale (largest |sample| {peak:.3g}; a float WAV keeps them)",
        ClippingWarning,
        stacklevel=3,
    )


def wav_bytes(audio, sample_rate: int, sample_format: str = "pcm16") -> bytes:
    """A whole WAV file for mono float audio: ``sample_format`` is ``"pcm16"`` (clipped to [-1, 1],
    rounded) or ``"float"`` (32-bit IEEE float, unclipped), see ``wav_samples``.  Clipping is reported,
    not hidden: a ``ClippingWarning`` says how many samples were outside [-1, 1] (``--float-wav`` keeps
    them)."""
    data, clipped = wav_samples(audio, sample_format)
    if clipped:
        warn_clipping(clipped, data.size, float(np.max(np.abs(audio))))
    from scipy.io import wavfile  # (here: importing SciPy's modules costs a fresh process its first audio)

    buffer = io.BytesIO()
    wavfile.write(buffer, check_sample_rate(sample_rate, "output sample rate"), data)
    return buffer.getvalue()


class StreamedWav:
    """A mono WAV written as its samples come, to an output that cannot seek back (a pipe): ``header``
    first, then ``samples(chunk)`` for each chunk, then ``finish()``.

    The header is ``wav_bytes``' with the RIFF and data sizes STREAMED_DATA_SIZE (0xFFFFFFFF), FFmpeg's
    convention on such an output: a reader takes the data to run to the end of the stream (ours, Python's
    ``wave``, libsndfile; players such as ``aplay`` play until the pipe ends).  The float header has no
    ``fact`` chunk (its sample count is not known yet), as FFmpeg's.  The samples are ``wav_samples``'
    (the whole file's, chunk by chunk: the rule is per sample), and clipping is reported once, by
    ``finish``, for the whole stream."""

    def __init__(self, sample_rate: int, sample_format: str = "pcm16"):
        rate = check_sample_rate(sample_rate, "output sample rate")
        if sample_format not in ("pcm16", "float"):
            raise ValueError(f"unknown sample format {sample_format!r}: use 'pcm16' or 'float'")
        tag, bits, extension = (
            (WAVE_FORMAT_PCM, 16, b"") if sample_format == "pcm16" else (WAVE_FORMAT_FLOAT, 32, b"\0\0")
        )
        fmt = struct.pack("<HHIIHH", tag, 1, rate, rate * bits // 8, bits // 8, bits) + extension
        self.header = (
            b"RIFF" + struct.pack("<I", STREAMED_DATA_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", STREAMED_DATA_SIZE)
        )  # fmt: skip
        self.sample_format = sample_format
        self.count, self.clipped, self.peak = 0, 0, 0.0

    def samples(self, chunk) -> bytes:
        """One chunk's sample bytes (little-endian, as in the file)."""
        data, clipped = wav_samples(chunk, self.sample_format)
        self.count += data.size
        if clipped:
            self.clipped += clipped
            self.peak = max(self.peak, float(np.max(np.abs(chunk))))
        return data.astype(data.dtype.newbyteorder("<")).tobytes()

    def finish(self) -> None:
        """The stream's ``ClippingWarning``, if any sample was clipped."""
        if self.clipped:
            warn_clipping(self.clipped, self.count, self.peak)


def write_wav(path, audio, sample_rate: int, sample_format: str = "pcm16") -> None:
    """Write mono float audio as a WAV file (see ``wav_bytes``), atomically: a failed write leaves any
    previous file at ``path`` as it was."""
    write_atomically(path, wav_bytes(audio, sample_rate, sample_format))


# ----------------------------------------------------------------------------- resampling
#
# The official wrappers resample other rates with librosa.resample (soxr "HQ") on float32 audio, to
# ceil(N * target / sr) samples.  We call soxr the same way, so resampled audio (and everything computed
# from it: codes, x-vectors) equals the official's.
#
# The readable fallback and cross-check is a polyphase FIR (scipy.signal.resample_poly) with a filter
# designed to soxr HQ's specification: flat to 91.3% of the lower rate's Nyquist frequency, stopped from the
# Nyquist frequency on, 130 dB Kaiser design.  It is not soxr's filter, so the samples differ slightly
# (about 0.2% rms on white noise).  Its cost grows with max(up, down) of the reduced ratio up / down
# (999983 Hz -> 24 kHz would need a filter of ~195 M taps), so the ratio is first replaced by the nearest
# fraction with both terms at most MAX_POLYPHASE_FACTOR (an output-rate error of at most 5e-4
# relative over the accepted rates; every standard rate, 8 kHz to 768 kHz, stays exact).

RESAMPLE_PASSBAND = 0.913  # passband end, fraction of the lower rate's Nyquist frequency
RESAMPLE_ATTENUATION_DB = 130.0
MAX_POLYPHASE_FACTOR = 1000


def resampling_filter(up: int, down: int):
    """Low-pass FIR at the rate up * input rate: Kaiser-windowed sinc, cut-off half way through the
    transition band [passband, 1] x the lower Nyquist frequency, taps from Kaiser's formula."""
    m = max(up, down)
    transition = (1.0 - RESAMPLE_PASSBAND) / m  # as a fraction of the upsampled Nyquist
    a = RESAMPLE_ATTENUATION_DB
    n_taps = int(np.ceil((a - 7.95) / (2.285 * np.pi * transition))) | 1
    beta = 0.1102 * (a - 8.7)
    from scipy import signal  # (here: scipy.signal alone takes longer to import than a generated frame)

    return signal.firwin(n_taps, (1.0 + RESAMPLE_PASSBAND) / 2.0 / m, window=("kaiser", beta))


def polyphase_factors(sr: int, target_sr: int) -> tuple[int, int]:
    """(up, down) with up / down = target_sr / sr, or the nearest fraction with both at most
    MAX_POLYPHASE_FACTOR when the exact one is larger."""
    ratio = Fraction(target_sr, sr)
    if max(ratio.numerator, ratio.denominator) > MAX_POLYPHASE_FACTOR:
        if ratio >= 1:  # limit the larger term through the inverse
            ratio = 1 / (1 / ratio).limit_denominator(MAX_POLYPHASE_FACTOR)
        else:
            ratio = ratio.limit_denominator(MAX_POLYPHASE_FACTOR)
    return ratio.numerator, ratio.denominator


def output_length(n: int, sr: int, target_sr: int) -> int:
    """librosa's rule, floating point included: ceil(n * (target_sr / sr)) (44100 samples at 44.1 kHz
    give 24001 at 24 kHz)."""
    return int(math.ceil(n * (float(target_sr) / sr)))


def resample_polyphase(audio, sr: int, target_sr: int):
    """The fallback resampler: 1-D audio from ``sr`` to ``target_sr`` Hz with the polyphase filter above,
    ``output_length`` samples (zero-padded or trimmed), in the input's float dtype."""
    sr, target_sr = check_sample_rate(sr), check_sample_rate(target_sr, "target sample rate")
    if sr == target_sr:
        return audio
    up, down = polyphase_factors(sr, target_sr)
    from scipy import signal

    out = signal.resample_poly(audio.astype(np.float64), up, down, window=resampling_filter(up, down))
    n_out = output_length(audio.shape[-1], sr, target_sr)
    out = np.pad(out, (0, max(0, n_out - out.shape[-1])))[:n_out]
    return out.astype(audio.dtype)


def resample(audio, sr: int, target_sr: int, method: str = "soxr"):
    """Resample 1-D float audio from ``sr`` to ``target_sr`` Hz like the official wrapper (librosa with
    soxr HQ): ``output_length`` samples, the input's float dtype.  ``method="polyphase"`` (or soxr not
    installed) uses ``resample_polyphase`` instead."""
    if method not in ("soxr", "polyphase"):
        raise ValueError(f"resampling method must be 'soxr' or 'polyphase', not {method!r}")
    if method == "polyphase" or soxr is None:
        return resample_polyphase(audio, sr, target_sr)
    sr, target_sr = check_sample_rate(sr), check_sample_rate(target_sr, "target sample rate")
    if sr == target_sr:
        return audio
    out = soxr.resample(np.ascontiguousarray(audio), sr, target_sr, quality="HQ")
    n_out = output_length(audio.shape[-1], sr, target_sr)
    out = np.pad(out, (0, max(0, n_out - out.shape[-1])))[:n_out]
    return out.astype(audio.dtype)
