"""The module paths of release 0.1 (a flat ``refimpl/``), kept importing for one release.

``import refimpl.tracing`` or ``from refimpl.speech_tokenizer import SpeechTokenizer`` still work: the
old name becomes an alias of the module's new home and says so once with a ``DeprecationWarning``.
The table is the whole map from the old tree to the new one (CHANGELOG.md, 0.2.0); it goes with the
next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module (under refimpl.) -> its new home
OLD_PATHS = {
    "trace": "recorder",
    "kernels": "backends",
    "kernels.numba_cpu": "backends.numba_cpu",
    "kernels.cupy_cuda": "backends.cupy_cuda",
    "kernels.strict_device": "backends.strict_device",
    "checkpoint": "io.checkpoint",
    "config": "io.config",
    "audio": "io.audio",
    "hub": "io.hub",
    "files": "io.files",
    "validate": "io.validate",
    "model_info": "io.model_info",
    "codec_decoder": "codec.decoder",
    "codec_encoder": "codec.encoder",
    "speech_tokenizer": "codec.speech_tokenizer",
    "text": "tts.text_tokenizer",
    "prompt": "tts.prompt",
    "talker": "tts.talker",
    "code_predictor": "tts.code_predictor",
    "generate": "tts.generate",
    "speaker": "tts.speaker_encoder",
    "compare": "porting.compare",
    "tracing": "porting.trace_files",
    "trace_commands": "porting.commands",
    "synthetic": "porting.synthetic",
    "presets": "porting.presets",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module of its new name (the same object: one module, two names)."""

    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        old = spec.name[len("refimpl.") :]
        warnings.warn(
            f"refimpl.{old} moved to {self.new}; the old path goes with the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system stamped the old name's spec on it: give it back


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds ``refimpl.<old>`` for the names of OLD_PATHS, and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("refimpl.") or fullname[len("refimpl.") :] not in OLD_PATHS:
            return None
        new = "refimpl." + OLD_PATHS[fullname[len("refimpl.") :]]
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, OldPathFinder) for f in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
