"""Stub: the official package imports `onnxruntime` only for its 25 Hz tokenizer, which the 12 Hz oracle never runs."""


def __getattr__(name):
    raise ImportError("onnxruntime is stubbed in the refimpl oracle environment (25 Hz tokenizer only)")
