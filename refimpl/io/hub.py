"""Model names -> model directories, offline: what ``from_pretrained`` and ``--model`` accept.

    resolve_model("path/to/Qwen3-TTS-12Hz-0.6B-Base")      # an existing directory, as it is
    resolve_model("default")                               # an embedded tiny model (random weights)
    resolve_model("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")  # a Hugging Face repo id, from the local cache

Resolution order: (1) an existing directory; (2) an embedded model name (``EMBEDDED``); (3) a Hugging
Face repo id ``Org/Name``, looked up in the local Hugging Face cache exactly where ``huggingface-cli
download`` / ``hf download`` puts it::

    <cache>/models--Org--Name/refs/main                 # a text file: the commit hash of the snapshot
    <cache>/models--Org--Name/snapshots/<hash>/...      # the files of that commit (links into blobs/)

``<cache>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (the rule of the ``huggingface_hub`` package).  Nothing is ever downloaded:
a name that resolves to nothing is a ``ModelNotFoundError`` saying where it looked and how to download.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .checkpoint import CheckpointError

__all__ = ["resolve_model", "hub_cache_dir", "ModelNotFoundError", "EMBEDDED", "DATA", "embedded_model"]

DATA = Path(__file__).resolve().parents[1] / "data"
EMBEDDED = {  # name -> directory under refimpl/data/ (tiny checkpoints in the released layout, random weights)
    "default-customvoice": "default-customvoice",
    "default-base": "default-base",
    "default-voicedesign": "default-voicedesign",
}
KIND_TO_EMBEDDED = {
    "custom_voice": "default-customvoice",
    "base": "default-base",
    "voice_design": "default-voicedesign",
}

# a Hugging Face repo id: two names of letters, digits, '-', '_', '.' (not starting with '.' or '-', no '..')
_REPO_PART = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95}"
_REPO_ID = re.compile(rf"^({_REPO_PART})/({_REPO_PART})$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a full git commit hash, as refs/<branch> holds
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")  # a branch or tag name (no '/', no '..')


class ModelNotFoundError(CheckpointError):
    """A model name that is no directory, no embedded model and no repo id in the local cache."""


def embedded_model(kind: str | None = None) -> Path:
    """The embedded tiny model of a model kind ("custom_voice", "base", "voice_design"; None: custom_voice)."""
    if kind is not None and kind not in KIND_TO_EMBEDDED:
        raise ValueError(f"kind must be one of {sorted(KIND_TO_EMBEDDED)} or None, not {kind!r}")
    return DATA / KIND_TO_EMBEDDED[kind or "custom_voice"]


def hub_cache_dir(cache_dir=None) -> tuple[Path, str]:
    """The Hugging Face hub cache directory and which rule chose it (for error messages)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser(), "cache_dir="
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser(), "$HF_HUB_CACHE"
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub", "$HF_HOME/hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(
            os.environ["XDG_CACHE_HOME"]
        ).expanduser() / "huggingface" / "hub", "$XDG_CACHE_HOME/huggingface/hub"
    return Path.home() / ".cache" / "huggingface" / "hub", "the default ~/.cache/huggingface/hub"


def resolve_model(name_or_path, kind: str | None = None, revision: str | None = None, cache_dir=None) -> Path:
    """A directory for ``name_or_path`` (see the module docstring for the order).

    ``kind`` ("custom_voice", "base", "voice_design") makes the name ``"default"`` mean the embedded model of
    that kind (without it, the custom-voice one).  ``revision``: for a repo id, a branch or tag name (its
    commit is read from ``refs/<revision>``) or a full 40-hex commit hash (default "main").  ``cache_dir``
    replaces the environment's cache directory.  Raises ``ModelNotFoundError`` (a ``CheckpointError``, so a
    ``ValueError``) naming every place it looked."""
    if kind is not None and kind not in KIND_TO_EMBEDDED:
        raise ValueError(f"kind must be one of {sorted(KIND_TO_EMBEDDED)} or None, not {kind!r}")
    if isinstance(name_or_path, Path):
        text = str(name_or_path)
    elif isinstance(name_or_path, str):
        text = name_or_path
    else:
        raise TypeError(f"a model is named by a path or a string, not {type(name_or_path).__name__}")
    if text.strip() == "" or "\x00" in text:
        raise ModelNotFoundError(f"model name {text!r} is empty or holds a NUL character")
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if text == "default":
        return embedded_model(kind)
    if text in EMBEDDED:
        return DATA / EMBEDDED[text]
    match = _REPO_ID.match(text)
    if match and ".." not in text and not path.exists() and not isinstance(name_or_path, Path):
        return _from_hub_cache(match.group(1), match.group(2), revision, cache_dir)
    raise _not_found(text, path)


def _not_found(text: str, path: Path) -> ModelNotFoundError:
    names = ", ".join(["default", *EMBEDDED])
    what = "is a file, not a model directory" if path.exists() else "does not exist as a directory"
    hint = ""
    if "/" not in text and text.startswith("Qwen3-TTS"):
        hint = f" (did you mean the repo id 'Qwen/{text}'?)"
    return ModelNotFoundError(
        f"model {text!r} {what}, not an embedded model ({names}) and not a Hugging Face repo id 'Org/Name'{hint}"
    )


def _from_hub_cache(org: str, name: str, revision: str | None, cache_dir) -> Path:
    """``<cache>/models--Org--Name/snapshots/<commit>/`` with the commit from refs/<revision> or given."""
    cache, rule = hub_cache_dir(cache_dir)
    revision = "main" if revision is None else revision
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise ValueError(f"revision must be a branch/tag name or a 40-hex commit hash, not {revision!r}")
    repo = cache / f"models--{org}--{name}"
    looked = [f"{repo} (from {rule})"]
    commit = revision if _COMMIT.match(revision) else None
    if commit is None:
        ref = repo / "refs" / revision
        looked.append(str(ref))
        if ref.is_file():
            commit = _read_ref(ref)
    if commit is not None:
        snapshot = repo / "snapshots" / commit
        looked.append(str(snapshot))
        if snapshot.is_dir():
            return snapshot
    where = "; ".join(looked)
    raise ModelNotFoundError(
        f"{org}/{name} (revision {revision!r}) is not in the local Hugging Face cache; looked at: {where}. "
        f"Nothing is downloaded here: run `huggingface-cli download {org}/{name}` (or `hf download "
        f"{org}/{name}`), or download it to a directory with `--local-dir DIR` and pass DIR; set HF_HUB_CACHE "
        f"or HF_HOME if your cache is elsewhere"
    )


def _read_ref(ref: Path) -> str:
    """The commit hash a refs/ file holds: exactly 40 lowercase hex digits (an optional final newline)."""
    try:
        with open(ref, "rb") as f:
            data = f.read(200)  # a hash is 41 bytes: never more is read (a ref that is /dev/zero ends here)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {ref}: {e.strerror or e}") from None
    text = data.decode("ascii", errors="replace").strip()
    if not _COMMIT.match(text):
        raise ModelNotFoundError(
            f"{ref} does not hold a commit hash (40 hex digits): {text[:60]!r}; "
            "the cache entry is damaged, download the model again"
        )
    return text
