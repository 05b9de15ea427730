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

Bounds (a map is input like any other: docs/limits.md).  Two placeholders must be separated by literal
text holding a character that is not a digit (``{a}{b}`` or ``{a}0{b}`` could split a number many ways),
so that a match never backtracks more than a few passes over the name.  Patterns, keys and prefixes are
at most ``MAX_KEY_CHARS`` characters, and so is every key a map makes (checked before it is built: a key
template of a million placeholders is refused, not expanded); at most ``MAX_ENTRIES`` entries, of which
at most ``MAX_PATTERNS`` have placeholders (``MAX_PLACEHOLDERS`` each).  Entries without placeholders are
looked up in a dict, and a name is tried only on the patterns of its skeleton (the name with each run of
digits, or of digits and placeholders, written ``#``), at most ``MAX_SAME_SKELETON`` of them: one lookup
and a match or two a key for a real map, at most 16 matches in any.  Every error names the map and the
entry.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from ..io.files import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_INT_DIGITS,
    InputError,
    json_depth_at_most,
    parse_json,
    read_limited,
)
from .trace_files import MAX_KEY_CHARS

__all__ = ["NameMap", "load_map", "parse_selector", "MAX_ENTRIES", "MAX_PATTERNS"]

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the runs of digits (and placeholders) that a name's skeleton replaces by '#': a name and a pattern that
# matches it have the same skeleton, so that a name is tried only on the patterns of its own skeleton
NAME_RUNS = re.compile(r"[0-9]+")
PATTERN_RUNS = re.compile(r"(?:[0-9]|\{[A-Za-z_][A-Za-z0-9_]*\})+")
INTEGER = re.compile(r"[+-]?[0-9]{1,19}")  # an index NumPy takes: |i| < 2^63 (ASCII digits only)
MAX_ENTRIES = 100_000  # entries of ``tensors`` (a full generation trace has about 40,000 keys)
MAX_PATTERNS = 1_000  # of them with placeholders
MAX_SAME_SKELETON = 16  # patterns of one skeleton (that differ only in digits): each is tried on its keys
MAX_PLACEHOLDERS = 8  # in one pattern
MAX_SELECTOR_CHARS = 200
MAX_DIMS = 64  # NumPy's limit of an array's dimensions: of a selector's items and of a reshape


def shown(text: str, n: int = 60) -> str:
    """``repr(text)``, cut to about ``n`` characters (an error message stays one short line)."""
    return repr(text) if len(text) <= n else repr(text[: n - 3]) + f"... ({len(text)} characters)"


def listed(names, n: int = 5) -> str:
    """A few names of a list, each ``shown``: "'a', 'b' and 7 more"."""
    names = list(names)
    text = ", ".join(shown(k, 40) for k in names[:n])
    return text + (f" and {len(names) - n} more" if len(names) > n else "")


def parse_selector(text: str) -> tuple:
    """``"0, -1"`` -> (0, -1); ``"..., 1:3"`` -> (Ellipsis, slice(1, 3)).  ValueError for anything else:
    items that are not integers (ASCII digits, |i| < 2^63), slices ``a:b[:c]`` with a step other than 0,
    ``:`` or ``...`` (at most one), at most 64 items."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a selector is a non-empty string like '0, -1', not {text!r}")
    if len(text) > MAX_SELECTOR_CHARS:
        raise ValueError(f"selector {shown(text)} is over {MAX_SELECTOR_CHARS} characters")
    parts = text.split(",")
    if len(parts) > MAX_DIMS:
        raise ValueError(f"selector {shown(text)} has {len(parts)} items; an array has at most {MAX_DIMS} axes")
    items = []
    for part in (p.strip() for p in parts):
        if part == "...":
            items.append(Ellipsis)
            continue
        bounds = part.split(":")
        if len(bounds) > 3 or not all(INTEGER.fullmatch(b.strip()) or not b.strip() for b in bounds):
            raise ValueError(
                f"selector {text!r}: {part!r} is not an integer (at most 19 digits), a slice a:b[:c], ':' or '...'"
            )
        numbers = [int(b) if b.strip() else None for b in bounds]
        if len(numbers) == 1 and numbers[0] is None:
            raise ValueError(f"selector {text!r}: an empty item (a ',' too many?)")
        if len(numbers) == 3 and numbers[2] == 0:
            raise ValueError(f"selector {text!r}: {part!r} has a step of 0")
        items.append(numbers[0] if len(numbers) == 1 else slice(*numbers))
    if items.count(Ellipsis) > 1:
        raise ValueError(f"selector {text!r}: at most one '...'")
    return tuple(items)


def split_template(text: str) -> tuple:
    """(literals, names) of a pattern or key: ``"a.{i}.b"`` -> (["a.", ".b"], ["i"])."""
    pieces = PLACEHOLDER.split(text)
    return pieces[0::2], pieces[1::2]


class Entry:
    """One pattern of ``tensors``: the candidate names it matches -> the official key, selector, reshape."""

    def __init__(self, pattern: str, target, where: str):
        self.where = where
        if isinstance(target, str):
            target = {"key": target}
        if not isinstance(target, dict) or not isinstance(target.get("key"), str):
            raise ValueError(f"{where}: the value is an official key or {{'key': ..., 'select': ..., 'reshape': ...}}")
        unknown = sorted(set(target) - {"key", "select", "reshape"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {listed(unknown)} (key, select, reshape)")
        self.key = target["key"]
        for what, text in (("the pattern", pattern), ("the key", self.key)):
            if len(text) > MAX_KEY_CHARS:
                raise ValueError(f"{where}: {what} is {len(text)} characters long, over the limit of {MAX_KEY_CHARS}")
        self.literals, self.names = split_template(pattern)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{where}: a placeholder repeats")
        if len(self.names) > MAX_PLACEHOLDERS:
            raise ValueError(f"{where}: {len(self.names)} placeholders, over the limit of {MAX_PLACEHOLDERS}")
        for between in self.literals[1:-1]:
            if not between.strip("0123456789"):
                raise ValueError(
                    f"{where}: placeholders must be separated by text that is not only digits ({{a}}.{{b}}, not "
                    "{a}{b}): a number could be split between them in many ways"
                )
        self.key_literals, self.key_names = split_template(self.key)
        missing = set(self.key_names) - set(self.names)
        if missing:
            raise ValueError(f"{where}: the key uses {sorted(missing)}, which the pattern does not define")
        # each placeholder a run of digits; with a non-digit between any two, a name splits one way only,
        # and a failed match costs at most a few passes over the name (no nested backtracking)
        groups = [f"(?P<{n}>[0-9]+)" for n in self.names] + [r"\Z"]
        self.regex = re.compile("".join(re.escape(lit) + g for lit, g in zip(self.literals, groups, strict=True)))
        self.skeleton = PATTERN_RUNS.sub("#", pattern)
        self.select_text = target.get("select")
        try:
            self.select = None if self.select_text is None else parse_selector(self.select_text)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        shape = target.get("reshape")
        if shape is not None and (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(isinstance(n, int) and not isinstance(n, bool) and (0 < n < 2**63 or n == -1) for n in shape)
            or shape.count(-1) > 1
        ):
            text = repr(shape) if len(repr(shape)) <= 60 else repr(shape)[:57] + "..."
            raise ValueError(
                f"{where}: reshape is a list of at most {MAX_DIMS} positive sizes with at most one -1, not {text}"
            )
        self.reshape = shape

    def match(self, name: str) -> dict | None:
        """{placeholder: digits} when ``name`` matches the pattern, else None."""
        m = self.regex.match(name)
        return None if m is None else m.groupdict()

    def official(self, name: str) -> str | None:
        """The official key of candidate ``name``, or None when the pattern does not match it.  ValueError
        (naming the entry) when that key would be longer than ``MAX_KEY_CHARS``, before it is built."""
        values = self.match(name)
        if values is None:
            return None
        numbers = {k: v.lstrip("0") or "0" for k, v in values.items()}  # 007 -> 7, as the official indices
        length = sum(map(len, self.key_literals)) + sum(len(numbers[k]) for k in self.key_names)
        if length > MAX_KEY_CHARS:
            raise ValueError(
                f"{self.where}: the key for {shown(name)} would be {length} characters long, over the limit "
                f"of {MAX_KEY_CHARS}"
            )
        out = [self.key_literals[0]]
        for k, literal in zip(self.key_names, self.key_literals[1:], strict=True):
            out += [numbers[k], literal]
        return "".join(out)


class NameMap:
    def __init__(self, data: dict, source: str = "the map"):
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a name map is an object with 'tensors' (and optional prefixes)")
        unknown = sorted(set(data) - {"strip_prefix", "add_prefix", "tensors"})
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {listed(unknown)} (strip_prefix, add_prefix, tensors)")
        for k in ("strip_prefix", "add_prefix"):
            if not isinstance(data.get(k, ""), str):
                raise ValueError(f"{source}: {k} must be a string")
            if len(data.get(k, "")) > MAX_KEY_CHARS:
                raise ValueError(f"{source}: {k} is over the limit of {MAX_KEY_CHARS} characters")
        self.source = source
        self.strip_prefix = data.get("strip_prefix", "")
        self.add_prefix = data.get("add_prefix", "")
        tensors = data.get("tensors", {})
        if not isinstance(tensors, dict):
            raise ValueError(f"{source}: 'tensors' is an object: port name (pattern) -> official key")
        if len(tensors) > MAX_ENTRIES:
            raise ValueError(f"{source}: 'tensors' has {len(tensors)} entries, over the limit of {MAX_ENTRIES}")
        self.entries = [Entry(p, t, f"{source}: tensors[{shown(p)}]") for p, t in tensors.items()]
        # a name's entry is the first of the map that matches it: the literal names in a dict, the patterns
        # by skeleton, in map order (only those before the literal's place can win over it)
        self.literal, self.patterns, count = {}, {}, 0
        for i, e in enumerate(self.entries):
            if not e.names:
                self.literal.setdefault(e.literals[0], i)
            else:
                same = self.patterns.setdefault(e.skeleton, [])
                if len(same) == MAX_SAME_SKELETON:
                    raise ValueError(
                        f"{e.where}: over {MAX_SAME_SKELETON} patterns differ from it only in their digits and "
                        f"placeholders (skeleton {shown(e.skeleton)}; each is tried on the same names): write them "
                        "as one pattern with a placeholder"
                    )
                same.append((i, e))
                count += 1
        if count > MAX_PATTERNS:
            raise ValueError(
                f"{source}: {count} patterns with placeholders, over the limit of {MAX_PATTERNS} (list the "
                "names one by one instead: those are looked up, not tried)"
            )

    def rename(self, name: str):
        """(official key, entry or None) of one candidate name."""
        if self.strip_prefix and name.startswith(self.strip_prefix):
            name = name[len(self.strip_prefix) :]
        first = self.literal.get(name, len(self.entries))
        for i, e in self.patterns.get(NAME_RUNS.sub("#", name), ()):
            if i > first:
                break
            key = e.official(name)
            if key is not None:
                return key, e
        if first < len(self.entries):
            e = self.entries[first]
            return e.official(name), e
        if len(self.add_prefix) + len(name) > MAX_KEY_CHARS:
            raise ValueError(
                f"{self.source}: add_prefix makes {shown(name)} {len(self.add_prefix) + len(name)} characters "
                f"long, over the limit of {MAX_KEY_CHARS}"
            )
        return self.add_prefix + name, None

    def apply(self, reference, candidate) -> tuple:
        """(reference, candidate, notes): the candidate under official names, and for every selected
        entry a reference tensor ``key[select]`` (a view) placed right after ``key``."""
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
                    raise ValueError(
                        f"{entry.where}: select {entry.select_text!r} does not fit {shown(key)} of shape "
                        f"{np.shape(ref[key])} ({e})"
                    ) from None
                base, key = key, f"{key}[{entry.select_text}]"
                derived.setdefault(base, []).append((key, selected))
            if entry is not None and entry.reshape is not None:
                try:
                    value = np.reshape(value, entry.reshape)
                except ValueError:
                    raise ValueError(
                        f"{entry.where}: {shown(name)} of shape {np.shape(value)} cannot be reshaped to {entry.reshape}"
                    ) from None
            if key in seen:
                raise ValueError(f"{self.source}: {shown(seen[key])} and {shown(name)} both map to {key}")
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
    """Read a name map from JSON, or TOML (``.toml``, Python >= 3.11); any problem of the file is one
    ``InputError`` naming it."""
    path = Path(path)
    raw = read_limited(path, MAX_JSON_BYTES, f"the map {path}")  # bounded: a pipe or device is cut off
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cannot read the map {path}: {e}") from None
    if path.suffix == ".toml":
        if sys.version_info < (3, 11):
            raise InputError(f"{path}: TOML maps need Python >= 3.11 (tomllib); write the map as JSON")
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"{path}: not TOML ({e})") from None
        except RecursionError:
            raise InputError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep") from None
        except ValueError:  # an integer past the interpreter's limit of digits
            raise InputError(f"{path}: an integer of more than {MAX_JSON_INT_DIGITS} digits") from None
        if not json_depth_at_most(data, MAX_JSON_DEPTH):
            raise InputError(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep")
    else:
        data = parse_json(text, str(path), unique_keys=True)
    return NameMap(data, str(path.name))
