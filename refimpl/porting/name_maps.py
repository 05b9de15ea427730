"""Name maps: a port's own tensor names -> the official keys, written once, kept in the port's repository.

    refimpl compare ref.safetensors port.safetensors --map port_names.json

A map is a JSON object (or TOML, read with ``tomllib`` on Python >= 3.11):

    {
      "strip_prefix": "model.",                     optional: removed from every candidate key first
      "add_prefix": "decoder.",                     optional: then put before every candidate key
      "tensors": {
        "blk.{i}.attn_out": "talker.model.layers.{i}.self_attn.o_proj:0",
        "logits.{n}": {"key": "talker.codec_head:{n}", "select": "0, -1"},
        "embd": {"key": "refimpl.talker.prompt.embeds", "reshape": [1, -1, 1024]}
      }
    }

A pattern's ``{name}`` matches a whole number, substituted into ``key``.  ``select`` is an index
applied to the reference tensor before comparing (NumPy basic indexing written out: integers, ``a:b``,
``:`` and ``...``, separated by commas; ``"0, -1"`` = batch 0, last position), so a port that dumps
only the last position's logits [V] is compared with ``talker.codec_head:N`` [1, S, V]; the row is
named ``key[select]``.  ``reshape`` reshapes the candidate tensor (one -1 allowed).  Candidate keys
that match no pattern keep their names (after the prefix rules); two candidate keys that map to one
key are an error.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from ..io.files import MAX_JSON_BYTES, MAX_JSON_DEPTH, InputError, json_depth_at_most, read_limited

__all__ = ["NameMap", "load_map", "parse_selector"]

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_selector(text: str) -> tuple:
    """``"0, -1"`` -> (0, -1); ``"..., 1:3"`` -> (Ellipsis, slice(1, 3)).  ValueError for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a selector is a non-empty string like '0, -1', not {text!r}")
    items = []
    for part in text.split(","):
        part = part.strip()
        try:
            if part == "...":
                items.append(Ellipsis)
            elif ":" in part:
                bounds = [int(b) if b.strip() else None for b in part.split(":")]
                if len(bounds) > 3:
                    raise ValueError
                items.append(slice(*bounds))
            else:
                items.append(int(part))
        except ValueError:
            raise ValueError(f"selector {text!r}: {part!r} is not an integer, a slice a:b[:c], ':' or '...'") from None
    if items.count(Ellipsis) > 1:
        raise ValueError(f"selector {text!r}: at most one '...'")
    return tuple(items)


class Entry:
    """One pattern of ``tensors``: the candidate names it matches -> the official key, selector, reshape."""

    def __init__(self, pattern: str, target, where: str):
        if isinstance(target, str):
            target = {"key": target}
        if not isinstance(target, dict) or not isinstance(target.get("key"), str):
            raise ValueError(f"{where}: the value is an official key or {{'key': ..., 'select': ..., 'reshape': ...}}")
        unknown = sorted(set(target) - {"key", "select", "reshape"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown} (key, select, reshape)")
        names = PLACEHOLDER.findall(pattern)
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: a placeholder repeats")
        missing = set(PLACEHOLDER.findall(target["key"])) - set(names)
        if missing:
            raise ValueError(f"{where}: the key uses {sorted(missing)}, which the pattern does not define")
        pieces = PLACEHOLDER.split(pattern)  # literal, name, literal, name, ...
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[0-9]+)" for i, p in enumerate(pieces))
        self.regex = re.compile(regex + r"\Z")
        self.key = target["key"]
        self.select_text = target.get("select")
        self.select = None if self.select_text is None else parse_selector(self.select_text)
        shape = target.get("reshape")
        if shape is not None and (
            not isinstance(shape, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) and (n > 0 or n == -1) for n in shape)
            or shape.count(-1) > 1
        ):
            raise ValueError(f"{where}: reshape is a list of positive sizes with at most one -1, not {shape!r}")
        self.reshape = shape

    def official(self, name: str) -> str | None:
        m = self.regex.match(name)
        if m is None:
            return None
        return PLACEHOLDER.sub(lambda p: str(int(m.group(p.group(1)))), self.key)


class NameMap:
    def __init__(self, data: dict, source: str = "the map"):
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a name map is an object with 'tensors' (and optional prefixes)")
        unknown = sorted(set(data) - {"strip_prefix", "add_prefix", "tensors"})
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {unknown} (strip_prefix, add_prefix, tensors)")
        for k in ("strip_prefix", "add_prefix"):
            if not isinstance(data.get(k, ""), str):
                raise ValueError(f"{source}: {k} must be a string")
        self.strip_prefix = data.get("strip_prefix", "")
        self.add_prefix = data.get("add_prefix", "")
        tensors = data.get("tensors", {})
        if not isinstance(tensors, dict):
            raise ValueError(f"{source}: 'tensors' is an object: port name (pattern) -> official key")
        self.entries = [Entry(p, t, f"{source}: tensors[{p!r}]") for p, t in tensors.items()]

    def rename(self, name: str):
        """(official key, entry or None) of one candidate name."""
        if self.strip_prefix and name.startswith(self.strip_prefix):
            name = name[len(self.strip_prefix) :]
        for e in self.entries:
            key = e.official(name)
            if key is not None:
                return key, e
        return self.add_prefix + name, None

    def apply(self, reference, candidate) -> tuple:
        """(reference, candidate, notes): the candidate under official names, and for every selected
        entry a reference tensor ``key[select]`` placed right after ``key``."""
        from .trace_files import Trace

        ref = dict(reference.items)
        items, derived, seen, notes = [], {}, {}, []
        for name, value in candidate.items:
            key, entry = self.rename(name)
            if entry is not None and entry.select is not None:
                if key not in ref:
                    items.append((key, value))  # reported missing in the reference under its mapped name
                    continue
                try:
                    selected = np.asarray(ref[key])[entry.select]
                except IndexError as e:
                    raise ValueError(f"map: select {entry.select_text!r} does not fit {key} {np.shape(ref[key])}: {e}")
                key = f"{key}[{entry.select_text}]"
                derived.setdefault(key[: key.index("[")], []).append((key, np.ascontiguousarray(selected)))
            if entry is not None and entry.reshape is not None:
                try:
                    value = np.reshape(value, entry.reshape)
                except ValueError:
                    raise ValueError(f"map: {name} {np.shape(value)} cannot be reshaped to {entry.reshape}") from None
            if key in seen:
                raise ValueError(f"map: {seen[key]!r} and {name!r} both map to {key}")
            seen[key] = name
            items.append((key, value))
        renamed = sum(1 for k, n in seen.items() if k != n)
        if renamed:
            notes.append(f"{renamed} candidate tensors renamed by the map")
        ref_items = []
        for k, v in reference.items:
            ref_items.append((k, v))
            ref_items += derived.get(k, [])
        if derived:
            notes.append(f"{sum(map(len, derived.values()))} reference tensors selected by the map (key[select])")
        return Trace(ref_items, reference.metadata), Trace(items, candidate.metadata), notes


def load_map(path) -> NameMap:
    """Read a name map from JSON, or TOML (``.toml``, Python >= 3.11)."""
    path = Path(path)
    raw = read_limited(path, MAX_JSON_BYTES, f"the map {path}")  # bounded: a pipe or device is cut off
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cannot read the map {path}: {e}") from None
    if path.suffix == ".toml":
        if sys.version_info < (3, 11):
            raise ValueError(f"{path}: TOML maps need Python >= 3.11 (tomllib); write the map as JSON")
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not TOML ({e})") from None
        except RecursionError:
            raise InputError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
        except RecursionError:
            raise InputError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    if not json_depth_at_most(data, MAX_JSON_DEPTH):
        raise InputError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep")
    return NameMap(data, str(path.name))
