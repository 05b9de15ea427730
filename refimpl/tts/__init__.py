"""Text -> codes: the text-to-speech model.

- ``text_tokenizer``: the Qwen2 byte-level BPE and the chat templates
- ``prompt``: the prompt layouts (text + codec ids, speaker and language slots) and their embeddings
- ``talker``: the Talker decoder LM (codebook 0 of each frame); ``code_predictor``: codebooks 1..15
- ``generate``: the frame loop (sampling, EOS, streaming); ``speaker_encoder``: ECAPA-TDNN x-vectors
- ``model``: ``Qwen3TTS``, the whole model with the official ``generate_*`` methods
"""

from .model import Qwen3TTS, VoiceClonePromptItem

__all__ = ["Qwen3TTS", "VoiceClonePromptItem"]


def __getattr__(name: str):
    """``refimpl.tts`` was the module ``tts/model.py`` until 0.1: its other names still resolve, once with a
    DeprecationWarning."""
    from . import model

    if name.startswith("__") or not hasattr(model, name):
        raise AttributeError(f"module 'refimpl.tts' has no attribute {name!r}")
    import warnings

    warnings.warn(f"refimpl.tts.{name} moved to refimpl.tts.model.{name}", DeprecationWarning, stacklevel=2)
    return getattr(model, name)
