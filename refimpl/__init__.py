"""refimpl: a numerical reference implementation of Qwen3-TTS in plain NumPy.

Public entry points:

- ``SpeechTokenizer``: the 12 Hz codec (decode, streaming decode, encode).
"""

from .checkpoint import CheckpointError
from .speech_tokenizer import SpeechTokenizer

__all__ = ["SpeechTokenizer", "CheckpointError"]
__version__ = "0.1.0"
