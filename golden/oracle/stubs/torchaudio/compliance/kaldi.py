"""Stub (25 Hz tokenizer only)."""


def __getattr__(name):
    raise ImportError("torchaudio is stubbed in the refimpl oracle environment (25 Hz tokenizer only)")
