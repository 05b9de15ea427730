"""refimpl: a numerical reference implementation of Qwen3-TTS in plain NumPy.

Public entry points:

- ``SpeechTokenizer``: the 12 Hz codec (decode, streaming decode, encode).
- ``Qwen3TTS``: a full model (talker + code predictor + codec), the official generate_* API.
- ``use_backend("numpy" | "numba" | "cupy")``: which implementation of the primitives runs, and (cupy) on
  which device (``refimpl.kernels``, docs/backends.md).
"""

from .checkpoint import CheckpointError
from .kernels import active_backend, use_backend
from .speech_tokenizer import SpeechTokenizer
from .tts import Qwen3TTS, VoiceClonePromptItem

__all__ = ["SpeechTokenizer", "CheckpointError", "Qwen3TTS", "VoiceClonePromptItem", "use_backend", "active_backend"]
__version__ = "0.1.0"
