"""refimpl: a numerical reference implementation of Qwen3-TTS in plain NumPy.

Public entry points:

- ``SpeechTokenizer``: the 12 Hz codec (decode, streaming decode, encode).
- ``Qwen3TTS``: a full model (talker + code predictor + codec), the official generate_* API.
- ``Qwen3TTSModel``, ``Qwen3TTSTokenizer``: drop-ins for the official ``qwen_tts`` classes of those names
  (``import refimpl as qwen_tts``; ``refimpl.official_api``).
- ``use_backend("numpy" | "numba" | "cupy")``: which implementation of the primitives runs, and (cupy) on
  which device (``refimpl.kernels``, docs/backends.md).
"""

from .checkpoint import CheckpointError
from .kernels import active_backend, use_backend
from .official_api import Qwen3TTSModel, Qwen3TTSTokenizer, Qwen3TTSTokenizerV2EncoderOutput
from .speech_tokenizer import SpeechTokenizer
from .tts import Qwen3TTS, VoiceClonePromptItem

__all__ = ["SpeechTokenizer", "CheckpointError", "Qwen3TTS", "VoiceClonePromptItem", "Qwen3TTSModel",
           "Qwen3TTSTokenizer", "Qwen3TTSTokenizerV2EncoderOutput", "use_backend", "active_backend"]
__version__ = "0.1.0"
