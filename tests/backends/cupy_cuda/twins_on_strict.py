"""A pytest plugin: the strict stand-in backend runs the cupy twins for a whole session (CUDA kernels replayed
in NumPy, see tests/backends/cupy_cuda/replays.py), so that the parity suite checks the twins on a machine
without a GPU:

    PYTHONPATH=tests/backends python -m pytest -p cupy_cuda.twins_on_strict --backend strict \\
        tests/codec/test_codec_decoder.py \\
        tests/codec/test_codec_encoder.py tests/codec/test_codec_streaming.py tests/tts/test_speaker_encoder.py \\
        tests/tts/test_talker.py tests/tts/test_end_to_end.py

The summary at the end counts the calls of each twin.  Not collected as a test module (no test_ prefix);
needs the backend layer's strict stand-in (refimpl/backends/strict_device.py).
"""

from __future__ import annotations

CALLS: dict = {}  # "calls": {twin name: number of calls}, filled as the twins run


def pytest_configure(config):
    from refimpl.backends import strict_device

    from .replays import put_these_twins_on_the_strict_stand_in

    CALLS["calls"] = put_these_twins_on_the_strict_stand_in(setattr, strict_device)


def pytest_terminal_summary(terminalreporter):
    calls = CALLS["calls"]
    counts = ", ".join(f"{name} {calls[name]}" for name in sorted(calls))
    terminalreporter.write_line(f"cupy twins called on the strict stand-in: {counts}")
