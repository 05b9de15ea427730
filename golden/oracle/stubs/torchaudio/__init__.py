"""Stub: the official package imports `torchaudio.compliance.kaldi` only for its 25 Hz tokenizer."""
