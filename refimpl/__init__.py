"""refimpl: a numerical reference implementation of Qwen3-TTS in plain NumPy.

Public entry points:

- ``SpeechTokenizer``: the 12 Hz codec (decode, streaming decode, encode).
- ``Qwen3TTS``: a full model (talker + code predictor + codec), the official generate_* API.
- ``Qwen3TTSModel``, ``Qwen3TTSTokenizer``: drop-ins for the official ``qwen_tts`` classes of those names
  (``import refimpl as qwen_tts``; ``refimpl.official_api``).
- ``use_backend("numpy" | "numba" | "cupy")``: which implementation of the primitives runs, and (cupy) on
  which device (``refimpl.backends``, docs/backends.md).
"""

import os as _os

# OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) after each threaded product before they sleep,
# and on a machine with few cores they take the cores Numba's threads need next (measured: the 0.6B Talker's
# prompt 0.23 s right after a codec decode against 0.17 s).  2^4 cycles: they sleep at once.  Read when
# OpenBLAS loads, so only if NumPy is not imported yet (the command line; a script importing refimpl first);
# the user's own setting wins.  docs/performance.md, "Threads".
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import _old_paths
from ._version import __version__ as __version__
from .backends import active_backend, use_backend
from .codec.speech_tokenizer import SpeechTokenizer
from .io.checkpoint import CheckpointError
from .official_api import Qwen3TTSModel, Qwen3TTSTokenizer, Qwen3TTSTokenizerV2EncoderOutput
from .tts.model import Qwen3TTS, VoiceClonePromptItem

__all__ = [
    "SpeechTokenizer",
    "CheckpointError",
    "Qwen3TTS",
    "VoiceClonePromptItem",
    "Qwen3TTSModel",
    "Qwen3TTSTokenizer",
    "Qwen3TTSTokenizerV2EncoderOutput",
    "use_backend",
    "active_backend",
]

_old_paths.install()
