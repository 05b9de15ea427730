"""Hostile audio: WAV files with damaged or lying headers, arrays of every sample type, awkward and absurd
sample rates, non-finite samples, and writes that fail half way.  Each bad input gives one ValueError
naming the file or argument and the problem."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
import warnings
import wave

import numpy as np
import pytest
from conftest import CHECKPOINTS, REPO, read_or_named_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.io import wavfile

from refimpl.codec.speech_tokenizer import prepare_audio
from refimpl.io import audio as audio_mod
from refimpl.io.audio import (
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    check_sample_rate,
    polyphase_factors,
    read_wav,
    read_wav_bytes,
    resample,
    write_wav,
)


def riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def chunk(chunk_id: bytes, payload: bytes, claimed: int | None = None) -> bytes:
    size = len(payload) if claimed is None else claimed
    return chunk_id + struct.pack("<I", size) + payload + (b"\0" if len(payload) % 2 else b"")


def fmt_chunk(tag=1, channels=1, rate=24000, bits=16, block_align=None, extra=b"") -> bytes:
    block_align = channels * bits // 8 if block_align is None else block_align
    return chunk(
        b"fmt ", struct.pack("<HHIIHH", tag, channels, rate, (rate * block_align) % 2**32, block_align, bits) + extra
    )


def pcm16(n=100, seed=0) -> bytes:
    return (np.random.default_rng(seed).standard_normal(n) * 3000).astype("<i2").tobytes()


def write(tmp_path, data: bytes, name="x.wav"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_wav_error(path, *fragments):
    with pytest.raises(ValueError) as info:
        read_wav(path)
    message = str(info.value)
    assert str(path.name) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ----------------------------------------------------------------------------- reading: good files


@pytest.mark.parametrize("dtype, scale", [("int16", 32768.0), ("int32", 2**31), ("float32", 1.0), ("float64", 1.0)])
@pytest.mark.parametrize("channels", [1, 2])
def test_reads_what_scipy_writes(tmp_path, dtype, scale, channels):
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.9, 0.9, (500, channels))
    data = (x * scale).astype(dtype) if scale != 1.0 else x.astype(dtype)
    wavfile.write(tmp_path / "a.wav", 16000, data[:, 0] if channels == 1 else data)
    audio, sr = read_wav(tmp_path / "a.wav")
    assert sr == 16000 and audio.dtype == np.float32
    assert audio.shape == ((500,) if channels == 1 else (500, channels))
    expected = data.astype(np.float64) / scale
    np.testing.assert_array_equal(audio, (expected[:, 0] if channels == 1 else expected).astype(np.float32))


def test_reads_8_and_24_bit_pcm(tmp_path):
    u8 = np.array([0, 128, 255], np.uint8)
    audio, _ = read_wav(write(tmp_path, riff(fmt_chunk(bits=8), chunk(b"data", u8.tobytes()))))
    np.testing.assert_array_equal(audio, np.array([-1.0, 0.0, 127 / 128], np.float32))
    values = np.array([-(2**23), -1, 0, 1, 2**23 - 1])
    raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in values)
    audio, _ = read_wav(write(tmp_path, riff(fmt_chunk(bits=24), chunk(b"data", raw)), "b.wav"))
    np.testing.assert_array_equal(audio, (values / 2**23).astype(np.float32))


def test_skips_other_chunks_and_reads_extensible_format(tmp_path):
    guid_pcm = struct.pack("<H", 1) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    extensible = struct.pack("<HHI", 22, 16, 0x4) + guid_pcm
    data = pcm16(50)
    path = write(
        tmp_path, riff(chunk(b"LIST", b"INFOabc"), fmt_chunk(tag=0xFFFE, extra=extensible), chunk(b"data", data))
    )
    audio, sr = read_wav(path)
    np.testing.assert_array_equal(audio, np.frombuffer(data, "<i2") / np.float32(32768))


def test_odd_sized_fmt_chunk_and_its_pad_byte(tmp_path):
    """A 17-byte fmt chunk (16 bytes and one of extension) is legal; RIFF pads it to 18 with one byte
    that belongs to no chunk, and the next chunk starts after it."""
    fmt = fmt_chunk(extra=b"\x00")  # chunk() adds the pad byte of an odd payload
    assert struct.unpack("<I", fmt[4:8])[0] == 17 and len(fmt) == 8 + 18
    data = pcm16(40)
    audio, sr = read_wav(write(tmp_path, riff(fmt, chunk(b"data", data))))
    assert sr == 24000
    np.testing.assert_array_equal(audio, np.frombuffer(data, "<i2") / np.float32(32768))


def test_streamed_data_size_reads_to_the_end(tmp_path):
    """0xFFFFFFFF is what tools that stream a WAV before knowing its length write: "up to the end"."""
    data = pcm16(60)
    audio, _ = read_wav(write(tmp_path, riff(fmt_chunk(), b"data" + struct.pack("<I", 0xFFFFFFFF) + data)))
    assert audio.shape == (60,)


def test_soxs_streamed_data_size_reads_to_the_end(tmp_path):
    """SoX writes 0x7FFFF000 (its MS_UNSPEC) on a pipe: "to the end" when the file is shorter than that."""
    data = pcm16(60)
    audio, _ = read_wav(write(tmp_path, riff(fmt_chunk(), b"data" + struct.pack("<I", 0x7FFFF000) + data)))
    np.testing.assert_array_equal(audio, np.frombuffer(data, "<i2") / np.float32(32768))


# ----------------------------------------------------------------------------- reading: damaged files


def test_data_chunk_claims_more_than_the_file_holds(tmp_path):
    path = write(tmp_path, riff(fmt_chunk(), chunk(b"data", pcm16(100), claimed=48000 * 2)))
    assert_wav_error(path, "data chunk claims 96000 bytes", "holds only 200", "truncated")


def test_truncated_file(tmp_path):
    good = riff(fmt_chunk(), chunk(b"data", pcm16(100)))
    assert_wav_error(write(tmp_path, good[:-51]), "data chunk claims 200 bytes", "holds only 149")


def test_odd_byte_count_is_not_whole_frames(tmp_path):
    path = write(tmp_path, riff(fmt_chunk(channels=2), chunk(b"data", pcm16(3))))
    assert_wav_error(path, "not a whole number of 4-byte frames")


@pytest.mark.parametrize(
    "fmt, fragment",
    [
        (chunk(b"fmt ", b"\x01\x00\x01\x00" + b"\0" * 8), "malformed fmt chunk: 12 bytes, at least 16 needed"),
        (fmt_chunk(block_align=7), "block_align 7 does not match 1 channels x 16 bits"),
        (fmt_chunk(channels=0, block_align=0), "0 channels"),
        (fmt_chunk(bits=12), "12-bit PCM samples are not supported"),
        (fmt_chunk(tag=3, bits=16), "16-bit float samples are not supported"),
        (fmt_chunk(tag=0x55), "unsupported WAV encoding (format tag 0x0055)"),
        (fmt_chunk(tag=0xFFFE), "WAVE_FORMAT_EXTENSIBLE needs 40 bytes"),
        (fmt_chunk(rate=0), "sample rate must be positive"),
        (fmt_chunk(rate=4_000_000_000), "4000000000 Hz is outside the supported range"),
        (fmt_chunk(rate=500), "500 Hz is outside the supported range"),
    ],
)
def test_malformed_fmt_chunk(tmp_path, fmt, fragment):
    assert_wav_error(write(tmp_path, riff(fmt, chunk(b"data", pcm16(10)))), fragment)


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"", "not a RIFF/WAVE file"),
        (b"RIFF\0\0\0\0WAVX", "not a RIFF/WAVE file"),
        (b"RF64\xff\xff\xff\xffWAVE", "RF64"),
        (riff(), "no fmt chunk"),
        (riff(fmt_chunk()), "no data chunk"),
        (riff(chunk(b"data", pcm16(4)), fmt_chunk()), "data chunk comes before the fmt chunk"),
        (riff(fmt_chunk(), chunk(b"LIST", b"abcd", claimed=10**6)), "chunk b'LIST' claims 1000000 bytes"),
    ],
)
def test_not_a_wav(tmp_path, data, fragment):
    assert_wav_error(write(tmp_path, data), "as WAV" if "chunk b'" not in fragment else "", fragment)


def test_non_finite_float_samples(tmp_path):
    x = np.array([0.0, np.nan, np.inf, 0.5], "<f4")
    path = write(tmp_path, riff(fmt_chunk(tag=3, bits=32), chunk(b"data", x.tobytes())))
    assert_wav_error(path, "2 NaN or infinite samples")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_wav(tmp_path / "nope.wav")
    with pytest.raises(ValueError, match="is a directory"):
        read_wav(tmp_path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_reader(tmp_path, blob):
    path = tmp_path / "fuzz.wav"
    path.write_bytes(blob)
    read_or_named_error(read_wav, path)


GOOD = riff(fmt_chunk(channels=2), chunk(b"LIST", b"INFO"), chunk(b"data", pcm16(40)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, len(GOOD)),
)
def test_mutated_headers_never_crash_the_reader(tmp_path, edits, cut):
    """Bytes of a valid file changed (and the file cut short): a clean result or one ValueError, and never
    more samples than the file holds."""
    data = bytearray(GOOD)
    for position, value in edits:
        data[position] = value
    path = tmp_path / "mutant.wav"
    path.write_bytes(bytes(data[:cut]))
    result = read_or_named_error(read_wav, path)
    if result is None:
        return
    audio, sr = result
    assert audio.size <= cut and MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE


# ----------------------------------------------------------------------------- writing


def test_write_refuses_non_finite_samples_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.wav"
    write_wav(path, np.zeros(100, np.float32), 24000)
    before = path.read_bytes()
    for fmt in ("pcm16", "float"):
        with pytest.raises(ValueError, match="NaN or infinite samples .first at sample 3"):
            write_wav(path, np.array([0, 0, 0, np.inf, np.nan], np.float32), 24000, fmt)
    with pytest.raises(ValueError, match="beyond the float32 range"):
        write_wav(path, np.array([1e300]), 24000, "float")
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.wav"]


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.wav"
    write_wav(path, np.zeros(100, np.float32), 24000)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_wav(path, np.ones(1000, np.float32) * 0.5, 24000)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.wav"]  # no temporary file left behind


def test_file_size_limit_keeps_the_old_file(tmp_path):
    """A real failed write: RLIMIT_FSIZE (as a full quota would) stops the write half way."""
    path = tmp_path / "out.wav"
    write_wav(path, np.zeros(100, np.float32), 24000)
    before = path.read_bytes()
    script = (
        "import resource, signal, sys, numpy as np\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "from refimpl.io.audio import write_wav\n"
        "try:\n"
        f"    write_wav({str(path)!r}, np.zeros(480_000, np.float32), 24000)\n"
        "except OSError as e:\n"
        "    print('failed', e.errno)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.stdout.startswith("failed"), r.stdout + r.stderr
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.wav"]


def test_write_keeps_permissions_and_writes_to_devices(tmp_path):
    path = tmp_path / "out.wav"
    write_wav(path, np.zeros(10, np.float32), 24000)
    os.chmod(path, 0o640)
    write_wav(path, np.zeros(20, np.float32), 24000)
    assert os.stat(path).st_mode & 0o777 == 0o640
    write_wav(os.devnull, np.zeros(10, np.float32), 24000)  # not replaced by a rename
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)


def test_write_through_a_symbolic_link_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real" / "target.wav", tmp_path / "link.wav")
    write_wav(tmp_path / "link.wav", np.zeros(10, np.float32), 24000)
    assert os.path.islink(tmp_path / "link.wav") and read_wav(tmp_path / "real" / "target.wav")[0].shape == (10,)
    long_name = tmp_path / ("x" * 250 + ".wav")
    write_wav(long_name, np.zeros(10, np.float32), 24000)
    assert long_name.is_file()


def test_written_wav_reads_back(tmp_path):
    x = np.linspace(-1, 1, 101).astype(np.float32)
    write_wav(tmp_path / "a.wav", x, 24000, "float")
    audio, sr = read_wav(tmp_path / "a.wav")
    assert sr == 24000 and np.array_equal(audio, x)
    sr2, data = wavfile.read(io.BytesIO(audio_mod.wav_bytes(x, 24000)))
    assert sr2 == 24000 and data.dtype == np.int16 and data[-1] == 32767


# ----------------------------------------------------------------------------- a WAV streamed to a pipe


@pytest.mark.parametrize("sample_format", ["pcm16", "float"])
def test_streamed_wav_is_the_files_samples_under_a_header_of_unknown_length(tmp_path, sample_format):
    """``StreamedWav``: the header of ``wav_bytes`` with the RIFF and data sizes 0xFFFFFFFF (and no fact
    chunk), then the samples chunk by chunk; ours and Python's ``wave`` (16-bit PCM; it reads no float)
    read it back, saved as a file or held in memory, to the samples of the whole file."""
    audio = np.random.default_rng(3).uniform(-1.2, 1.2, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", audio_mod.ClippingWarning)
        whole = audio_mod.wav_bytes(audio, 24000, sample_format)
    streamed = audio_mod.StreamedWav(24000, sample_format)
    data = streamed.header + b"".join(streamed.samples(audio[i : i + 300]) for i in range(0, 1000, 300))
    unknown = struct.pack("<I", 0xFFFFFFFF)
    if sample_format == "pcm16":
        assert data == whole[:4] + unknown + whole[8:40] + unknown + whole[44:]
    else:  # fmt of 18 bytes (cbSize 0), then no fact chunk
        assert data[:38] == whole[:4] + unknown + whole[8:38] and whole[38:42] == b"fact"
        assert data[38:] == b"data" + unknown + whole[58:]
    expected = read_wav_bytes(whole)[0]
    np.testing.assert_array_equal(read_wav_bytes(data)[0], expected)
    np.testing.assert_array_equal(read_wav(write(tmp_path, data))[0], expected)
    if sample_format == "pcm16":
        with wave.open(str(tmp_path / "x.wav")) as w:
            assert w.getframerate() == 24000 and w.getnframes() == 0xFFFFFFFF // 2  # wave trusts the size
            assert w.readframes(1 << 20) == data[44:]  # and reads to the end


def test_streamed_wav_reports_clipping_once_and_refuses_what_wav_bytes_refuses():
    streamed = audio_mod.StreamedWav(24000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for chunk in ([0.5, 1.5], [0.0], [-3.0, 0.1]):
            streamed.samples(np.array(chunk))
        assert caught == []
        streamed.finish()
    assert [str(w.message) for w in caught] == [
        "2 of 5 samples were outside [-1, 1] and clipped to 16-bit full scale (largest |sample| 3; a float WAV "
        "keeps them)"
    ]
    with pytest.raises(ValueError, match="NaN or infinite samples .first at sample 1"):
        streamed.samples(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="unknown sample format 'pcm24'"):
        audio_mod.StreamedWav(24000, "pcm24")
    with pytest.raises(ValueError, match="output sample rate 5 Hz is outside"):
        audio_mod.StreamedWav(5)


# ----------------------------------------------------------------------------- arrays and rates


@pytest.mark.parametrize(
    "sr, fragment",
    [
        (22050.5, "whole number"),
        (0, "positive"),
        (-1, "positive"),
        (float("nan"), "whole number of Hz"),
        ("24000", "whole number of Hz"),
        (True, "whole number of Hz"),
        (None, "whole number of Hz"),
        (4e9, "outside the supported range [1000, 1000000] Hz"),
        (999, "outside the supported range"),
    ],
)
def test_sample_rate_checks(sr, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        check_sample_rate(sr)


def test_fractional_rate_rejected_the_same_way_everywhere(speech_tokenizers):
    """The codec encoder, the speaker encoder and the voice-clone path all refuse 22050.5 Hz alike."""
    from refimpl import Qwen3TTS
    from refimpl.tts.speaker_encoder import SpeakerEncoder

    x = np.zeros(4000, np.float32)
    messages = []
    for call in (
        lambda: speech_tokenizers["f32"].encode(x, sr=22050.5),
        lambda: SpeakerEncoder.from_pretrained(CHECKPOINTS / "tiny-base").embed(x, sr=22050.5),
        lambda: Qwen3TTS.from_pretrained(CHECKPOINTS / "tiny-base").create_voice_clone_prompt(
            (x, 22050.5), x_vector_only_mode=True
        ),
    ):
        with pytest.raises(ValueError) as info:
            call()
        messages.append(str(info.value))
    assert all("must be a whole number of Hz, got 22050.5" in m for m in messages), messages


def test_encode_of_an_array_needs_the_rate(speech_tokenizers):
    with pytest.raises(ValueError, match="sample rate of audio arrays is required: pass sr="):
        speech_tokenizers["f32"].encode(np.zeros(1920, np.float32))


@pytest.mark.parametrize(
    "dtype, scale, offset", [("int16", 32768.0, 0.0), ("int32", 2.0**31, 0.0), ("uint8", 128.0, 128.0)]
)
def test_integer_pcm_arrays_are_scaled(speech_tokenizers, dtype, scale, offset):
    tok = speech_tokenizers["f64"]
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    pcm = rng.integers(info.min, info.max, 3840, endpoint=True).astype(dtype)
    as_float = (pcm.astype(np.float64) - offset) / scale
    assert np.array_equal(prepare_audio(pcm, 24000, dtype=np.float64), as_float)
    assert np.array_equal(tok.encode(pcm, sr=24000), tok.encode(as_float, sr=24000))


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint16", "uint32", "uint64", "bool"])
def test_integer_arrays_without_a_standard_scale_are_refused(speech_tokenizers, dtype):
    with pytest.raises(ValueError, match=f"{dtype}|real numbers"):
        speech_tokenizers["f32"].encode(np.zeros(1920, dtype), sr=24000)


def test_python_lists_of_numbers_are_sample_values():
    assert np.array_equal(prepare_audio([0, 1, -1], 24000, dtype=np.float64), [0.0, 1.0, -1.0])


@pytest.mark.parametrize("amplitude", [1e30, 32767.0])
def test_huge_amplitudes_are_refused_before_any_work(speech_tokenizers, amplitude):
    """1e30 would overflow float32 inside the encoders' normalisations (finite but meaningless codes); 32767
    is int16 PCM stored as floats.  Both are one error naming the limit."""
    from refimpl.tts.speaker_encoder import SpeakerEncoder

    x = np.full(4000, amplitude)
    x[::2] *= -1
    with pytest.raises(ValueError, match=r"magnitude up to .* above the limit of 1000 .*divide by 32768"):
        speech_tokenizers["f32"].encode(x, sr=24000)
    with pytest.raises(ValueError, match="above the limit of 1000"):
        SpeakerEncoder.from_pretrained(CHECKPOINTS / "tiny-base").embed(x, sr=24000)


def test_amplitude_a_little_above_full_scale_is_processed(speech_tokenizers):
    x = 2.0 * np.sin(np.arange(3840) / 10.0)
    assert speech_tokenizers["f32"].encode(x, sr=24000).shape == (2, 16)


@pytest.mark.soxr_optional  # without soxr, method "soxr" falls back to the polyphase filter: bounded too
@pytest.mark.parametrize("sr", [999983, 44117, 1_000_000, 1000])
def test_awkward_rates_resample_in_bounded_time(sr):
    up, down = polyphase_factors(sr, 24000)
    assert max(up, down) <= audio_mod.MAX_POLYPHASE_FACTOR
    assert abs(up / down - 24000 / sr) <= 5e-4 * 24000 / sr
    x = np.random.default_rng(0).standard_normal(sr // 2)
    for method in ("soxr", "polyphase"):
        t0 = time.perf_counter()
        y = resample(x, sr, 24000, method=method)
        assert y.shape == (int(np.ceil(len(x) * (24000 / sr))),)
        assert time.perf_counter() - t0 < 20, f"{method} at {sr} Hz took too long"


def test_polyphase_factors_are_exact_for_usual_rates():
    for sr in (8000, 11025, 12000, 16000, 22050, 32000, 44100, 48000, 88200, 96000, 176400, 192000, 384000, 768000):
        up, down = polyphase_factors(sr, 24000)
        assert up * sr == down * 24000, sr

    def rate_error(sr):
        up, down = polyphase_factors(sr, 24000)
        return abs(up / down * sr / 24000 - 1)

    assert max(rate_error(sr) for sr in range(MIN_SAMPLE_RATE, MAX_SAMPLE_RATE + 1, 997)) <= 5e-4  # docs/limits.md


def test_bad_resampling_method():
    with pytest.raises(ValueError, match="resampling method"):
        resample(np.zeros(10), 16000, 24000, method="sinc")
