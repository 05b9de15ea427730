"""The text tokenizer: Qwen2 byte-level BPE, giving the same ids as the official processor.

Qwen3-TTS turns its input text into ids with the Qwen2 tokenizer (``Qwen2TokenizerFast`` of
transformers 4.57.3, which the official package pins).  The released checkpoints ship
``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json`` (no ``tokenizer.json``).  Encoding a
string is five steps:

1. **Added tokens** (``added_tokens_decoder`` of ``tokenizer_config.json``: ``<|im_start|>``,
   ``<|im_end|>``, ``<tts_pad>``, ...) are cut out of the raw text first and map to their own ids;
   they are never split, and the text between them is encoded on its own.
2. **NFC normalisation** of each remaining piece (composed characters: "e" + U+0301 -> "é").
3. **Pre-tokenisation** by a regular expression into words (letters, single digits, punctuation
   runs, whitespace runs, newline runs; see the two patterns below), each word then written as
   **bytes**, every byte shown as one printable character (``byte_to_unicode``: space -> "Ġ",
   newline -> "Ċ").
4. **BPE** inside each word: starting from single bytes, repeatedly merge the adjacent pair that
   comes first in ``merges.txt`` until no listed pair is left.
5. Each final symbol is looked up in ``vocab.json``.  No BOS/EOS is added.

Which regular expression?  transformers 4.57.3 swaps the Qwen2 pattern for a case-aware one when the
official loader passes ``fix_mistral_regex=True`` (``Qwen3TTSModel.from_pretrained`` does) AND the
base vocabulary has more than 100000 entries AND the model directory's ``config.json`` does not say
it was written by transformers <= 4.57.2 for a non-Mistral model or by transformers >= 5.  The
released Qwen3-TTS checkpoints meet all three, so the real models are tokenized with the
case-aware pattern; small (synthetic) vocabularies keep the Qwen2 pattern.  ``uses_case_aware_split``
encodes that rule.  The difference shows on camel case, all-caps words, apostrophes and combining
marks (Devanagari, Thai, ...).

``load_text_tokenizer`` builds the whole pipeline with the ``tokenizers`` library (fast, exact), its BPE
model (most of a load's time) at its first need on the released layout: until then ``WordMerges`` lets the
library do steps 1-3 and does steps 4-5 in Python.  ``bpe_encode_explicit`` is the same algorithm in plain
Python (slow, for reading and for tests).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

from ..io import vocabulary_verdicts
from ..io.checkpoint import CheckpointError, read_json_object
from ..io.files import MAX_JSON_BYTES, read_limited
from ..io.finite_verdicts import FileVersion

__all__ = [
    "QWEN2_SPLIT_PATTERN",
    "CASE_AWARE_SPLIT_PATTERN",
    "TextTokenizer",
    "load_text_tokenizer",
    "uses_case_aware_split",
    "byte_to_unicode",
    "assistant_prompt",
    "reference_prompt",
    "instruct_prompt",
    "bpe_encode_explicit",
    "check_unicode",
]

# A merges.txt body (after its "#version" line) whose every line is two symbols and one space between them
# (the last line's newline optional): its lines are already the pairs as ``read_vocabulary`` gives
# them.  Any other file (blank lines, tabs, a line of one symbol...) is read and checked line by line.
MERGE_LINES = re.compile(r"(?:\S+ \S+\n)*(?:\S+ \S+)?")

# Qwen2's pre-tokenisation pattern: English contractions (any case), an optional non-letter then a
# letter run, ONE digit, an optional space then a punctuation run (with trailing newlines), newline
# runs with their leading spaces, spaces not followed by a non-space, other whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The pattern transformers 4.57.3 substitutes under fix_mistral_regex=True: words split at case
# changes (upper-case run then lower-case run), combining marks count as letters, no contraction
# rule, and a punctuation run may carry trailing "/" as well as newlines.
CASE_AWARE_SPLIT_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# transformers 4.57.3 (_patch_mistral_regex): these model types always get the case-aware pattern
_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")
_CASE_AWARE_MIN_VOCAB = 100000  # strictly more base-vocabulary entries than this


# ---------------------------------------------------------------------------------------------
# chat-template strings (the official model wraps every text before tokenizing it)
# ---------------------------------------------------------------------------------------------


def assistant_prompt(text: str) -> str:
    """The text to speak: role prefix (3 ids), the text, then ``<|im_end|>\\n<|im_start|>assistant\\n`` (5 ids)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def reference_prompt(text: str) -> str:
    """The transcript of the reference audio (voice clone, ICL mode)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_prompt(instruct: str) -> str:
    """A voice / style instruction (voice design, custom voice with instruct)."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


# ---------------------------------------------------------------------------------------------
# byte-level alphabet
# ---------------------------------------------------------------------------------------------


@cache
def byte_to_unicode() -> dict:
    """Byte value -> one printable character (GPT-2's byte-level alphabet).

    Printable Latin-1 bytes (33..126, 161..172, 174..255) stand for themselves; the other 68 bytes
    (controls, space, 127..160, 173) take the characters U+0100, U+0101, ... in byte order, so that
    space (0x20) is "Ġ" (U+0120) and newline (0x0A) is "Ċ" (U+010A).
    """
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_alphabet_in_vocab_order() -> list:
    """The 256 byte symbols in the order the Qwen2 vocabulary numbers them (ids 0..255): by code point."""
    return sorted(byte_to_unicode().values())


# ---------------------------------------------------------------------------------------------
# which pre-tokenisation pattern the official loader ends up with
# ---------------------------------------------------------------------------------------------


def _version_key(text: str):
    """A comparable version (packaging's rules when installed, else the leading integers)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in str(text).split(".")[:3])
    try:
        return Version(str(text))
    except InvalidVersion:
        raise CheckpointError(f"config.json: transformers_version {text!r} is not a version number") from None


def uses_case_aware_split(model_config: Mapping | None, base_vocab_size: int) -> bool:
    """True when transformers 4.57.3, loading this directory with ``fix_mistral_regex=True`` as the
    official ``Qwen3TTSModel.from_pretrained`` does, replaces the Qwen2 pattern by the case-aware one.

    ``model_config`` is the directory's ``config.json`` (None when there is none);
    ``base_vocab_size`` is the BPE vocabulary without the added tokens.
    """
    if base_vocab_size <= _CASE_AWARE_MIN_VOCAB or model_config is None:
        return False
    written_by = model_config.get("transformers_version")
    model_type = model_config.get("model_type")
    if written_by:
        version = _version_key(written_by)
        if version <= _version_key("4.57.2"):
            return model_type is None or model_type in _MISTRAL_MODEL_TYPES
        if version >= _version_key("5.0.0"):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# the tokenizer
# ---------------------------------------------------------------------------------------------


def _split_pre_tokenizer_json(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level_bpe_json(vocab: Mapping[str, int], merges: Sequence[tuple], pattern: str) -> dict:
    """A ``tokenizers`` definition of the Qwen2 pipeline (the fields of a ``tokenizer.json``)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [_split_pre_tokenizer_json(pattern), byte_level]},
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": dict(vocab),
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def check_unicode(text, what: str = "text") -> None:
    """A str of valid Unicode: a lone surrogate (U+D800..U+DFFF, e.g. from undecodable bytes in a command
    line) cannot be written as UTF-8 and so has no byte-level tokens."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid Unicode: lone surrogate U+{ord(text[e.start]):04X} at character "
            f"{e.start} (undecodable bytes in the input?)"
        ) from None


def read_vocab_and_merges(model_dir: Path) -> tuple:
    """``vocab.json`` (token -> id) and ``merges.txt`` (ranked pairs, first line may be ``#version``)."""
    vocab, lines, _ = read_vocabulary(model_dir)
    return as_dict(vocab), merge_pairs(lines)


def merge_pairs(merge_lines: Iterable[str]) -> list:
    """The pairs ``(a, b)`` of merge lines ``"a b"``."""
    return [tuple(line.split(" ")) for line in merge_lines]


def read_vocabulary(model_dir: Path) -> tuple:
    """``(vocab, merge_lines, numbered)``: ``read_vocab_and_merges`` with each pair as the line ``"a b"`` (its
    two symbols, one space between: strings, not a tuple per pair, which the cyclic garbage collector would
    scan again and again while a load makes some 150,000 of them), and whether ``vocab`` is the Qwen2
    numbering of the merges (``follows_the_qwen2_numbering``).  Where the store of vocabulary verdicts
    (``refimpl.io.vocabulary_verdicts``) holds that verdict for the two files as they are now, ``vocab``
    is that numbering of ``merges.txt`` (a ``Qwen2Numbering``): ``vocab.json`` is not parsed."""
    vocab_version, merges_version = FileVersion.of(model_dir / "vocab.json"), FileVersion.of(model_dir / "merges.txt")
    if merges_version is not None and vocabulary_verdicts.remembered(vocab_version, merges_version):
        lines, _ = _read_merge_lines(model_dir, well_formed=True)
        if merges_version.unchanged():  # (what was read is the file of the verdict)
            return Qwen2Numbering(lines), lines, True
    vocab = read_json_object(model_dir / "vocab.json")
    if not {int}.issuperset(map(type, vocab.values())):  # (one pass in C: bools and floats are not ids)
        raise CheckpointError(f"{model_dir / 'vocab.json'} must map token strings to integer ids")
    lines, well_formed = _read_merge_lines(model_dir)
    numbered = follows_the_qwen2_numbering(vocab, lines)
    if numbered and well_formed:  # (the verdict covers the file's form too: its lines are read as they are)
        vocabulary_verdicts.remember(vocab_version, merges_version)
    return vocab, lines, numbered


def _read_merge_lines(model_dir: Path, well_formed: bool = False) -> tuple:
    """The merge lines of ``merges.txt``, each ``"a b"`` (a first ``#version`` line skipped), and whether the
    file is the usual one, every line two symbols and one space between them (``MERGE_LINES``), its lines
    taken as they are.  ``well_formed``: the file is known to be so (not checked again)."""
    try:
        path = model_dir / "merges.txt"
        raw = read_limited(path, MAX_JSON_BYTES, str(path), CheckpointError, regular_only=True)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{model_dir / 'merges.txt'} is not valid UTF-8 text: {e}") from None
    first, newline, rest = text.partition("\n")
    skipped = 0  # lines before ``text``
    if first.strip().startswith("#version"):
        text, skipped = (rest if newline else ""), 1
    lines = text.split("\n")
    if well_formed or MERGE_LINES.fullmatch(text):  # the usual file: its lines are the pairs as written
        return (lines[:-1] if lines[-1] == "" else lines), True  # (a last newline: no pair after it)
    pairs = [line.split() for line in lines]  # (a blank line: no symbols, skipped)
    if not {0, 2}.issuperset(map(len, pairs)):
        line_no = next(i for i, pair in enumerate(pairs) if len(pair) not in (0, 2))
        line = lines[line_no].strip()
        raise CheckpointError(
            f"{model_dir / 'merges.txt'} line {skipped + line_no + 1}: expected two symbols, got {line!r}"
        )
    return [" ".join(pair) for pair in pairs if pair], False


def merged_symbols(merge_lines: list) -> list:
    """The symbol each merge ``"a b"`` makes, ``"ab"``, in the merges' order (one split in C)."""
    return "\n".join(merge_lines).replace(" ", "").split("\n") if merge_lines else []


def merge_symbols_in(vocab: Mapping[str, int], merge_lines: list) -> bool:
    """Whether both symbols of every merge are in ``vocab`` (one pass in C)."""
    return all(map(vocab.__contains__, "\n".join(merge_lines).split()))


def numbered_by_merges(merge_lines: list) -> dict:
    """The Qwen2 numbering of ``merge_lines`` (the released ``vocab.json``): the 256 byte symbols by code point
    (ids 0..255), then the symbol each merge makes (``merged_symbols``), id 256 + its rank (a symbol made
    twice keeps its last id)."""
    return dict(zip(itertools.chain(byte_alphabet_in_vocab_order(), merged_symbols(merge_lines)), itertools.count()))


class Qwen2Numbering(Mapping):
    """``numbered_by_merges(merge_lines)`` as a mapping, without making its entries (151,643 for the released
    merges): a byte's symbol is its place in the byte alphabet, a longer symbol 256 + the rank of the merge
    that makes it, found among the merges' ranks by each split of it into ``"a b"``.  For merges whose
    numbering holds every symbol once (``follows_the_qwen2_numbering``: one merge makes each), as the store
    of vocabulary verdicts says of the files it lets through; the whole dictionary is made at the first need
    of all of it (``full``: iterating, the library's model).  ``ranks``: each merge line's rank."""

    def __init__(self, merge_lines: list):
        self.merge_lines = merge_lines
        self.ranks = dict(zip(merge_lines, itertools.count()))  # "a b" -> its rank (the last, if listed twice)
        self._bytes = {symbol: i for i, symbol in enumerate(byte_alphabet_in_vocab_order())}
        self._full: dict | None = None

    def __getitem__(self, symbol):
        if symbol in self._bytes:
            return self._bytes[symbol]
        if isinstance(symbol, str):
            for k in range(1, len(symbol)):
                rank = self.ranks.get(f"{symbol[:k]} {symbol[k:]}")
                if rank is not None:
                    return 256 + rank
        raise KeyError(symbol)

    def __len__(self) -> int:
        return 256 + len(self.merge_lines)

    def __iter__(self):
        return iter(self.full())

    def __eq__(self, other):
        return isinstance(other, Mapping) and self.full() == as_dict(other)

    __hash__ = None  # type: ignore[assignment]  (a mapping: unhashable, as a dict)

    def full(self) -> dict:
        """Every entry: ``numbered_by_merges(merge_lines)``, made once."""
        if self._full is None:
            self._full = numbered_by_merges(self.merge_lines)
        return self._full


def as_dict(vocab: Mapping[str, int]) -> dict:
    """A vocabulary as a dict: a ``Qwen2Numbering``'s entries made (``full``), a dict as it is."""
    return vocab.full() if isinstance(vocab, Qwen2Numbering) else vocab


def follows_the_qwen2_numbering(vocab: Mapping[str, int], merge_lines: list) -> bool:
    """Whether ``vocab`` is ``numbered_by_merges(merge_lines)``, every symbol once (no merge makes a byte's
    symbol or another merge's), and every merge's two symbols are in it (the library takes the files)."""
    return (
        len(vocab) == 256 + len(merge_lines)
        and vocab == numbered_by_merges(merge_lines)
        and merge_symbols_in(vocab, merge_lines)
    )


def _read_json_if_present(path: Path):
    if not path.is_file():
        return None
    return read_json_object(path)


def _added_token_entries(tokenizer_config: Mapping) -> list:
    """``added_tokens_decoder`` as a list of dicts with an int ``id``, sorted by id."""
    entries = []
    for key, spec in (tokenizer_config.get("added_tokens_decoder") or {}).items():
        if isinstance(spec, str):
            spec = {"content": spec}
        if not isinstance(spec, Mapping) or "content" not in spec:
            raise CheckpointError(f"tokenizer_config.json: added token {key!r} has no 'content'")
        try:
            token_id = int(key)
        except ValueError:
            raise CheckpointError(f"tokenizer_config.json: added token id {key!r} is not an integer") from None
        special = bool(spec.get("special", False))
        entries.append(
            {
                "id": token_id,
                "content": spec["content"],
                "special": special,
                "normalized": bool(spec.get("normalized", not special)),
                "lstrip": bool(spec.get("lstrip", False)),
                "rstrip": bool(spec.get("rstrip", False)),
                "single_word": bool(spec.get("single_word", False)),
            }
        )
    return sorted(entries, key=lambda e: e["id"])


class TextTokenizer:
    """Text -> ids exactly as the official Qwen3-TTS processor (``processor(text=...)["input_ids"]``).

    ``split_pattern`` is the pre-tokenisation regex in use; ``added_tokens`` maps each added token
    (special or not) to its id; ``base_vocab_size`` counts the BPE vocabulary without them.  ``backend`` is
    the ``tokenizers`` pipeline: given, or made at its first need by a function given in its place (then
    ``words``, a ``WordMerges``, encodes the short texts until it is made).
    """

    def __init__(
        self,
        backend,
        split_pattern: str,
        added_tokens: Mapping[str, int],
        base_vocab_size: int,
        source: str,
        words: WordMerges | None = None,
    ):
        self._backend = None if callable(backend) else backend  # a tokenizers.Tokenizer
        self._make_backend = backend if callable(backend) else None
        self._making = threading.Lock()
        self.words = words
        self.split_pattern = split_pattern
        self.added_tokens = dict(added_tokens)
        self.base_vocab_size = int(base_vocab_size)
        self.source = source  # "tokenizer.json" or "vocab.json+merges.txt"

    def __getstate__(self) -> dict:
        """A copy or a pickle holds the library's model (made now if it was not), not the way to make it."""
        state = dict(self.__dict__, _backend=self.backend, _make_backend=None, words=None)
        del state["_making"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._making = threading.Lock()

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` of the whole pipeline (made now if it was left for its first need)."""
        with self._making:
            if self._backend is None:
                self._backend = self._make_backend()
                self._make_backend = self.words = None  # (the library's model from now on, for every text)
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the official ``len(tokenizer)``)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list:
        """Ids of ``text`` (no BOS/EOS added; added tokens inside the text map to their own ids)."""
        check_unicode(text)
        words = self.words
        ids = words.encode(text) if words is not None else None
        return ids if ids is not None else list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Iterable[str]) -> list:
        texts = list(texts)
        for i, t in enumerate(texts):
            check_unicode(t, f"text[{i}]")
        return [list(e.ids) for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (bytes that do not form valid UTF-8 become U+FFFD, as the official)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"unknown token {token!r}")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        token = self.backend.id_to_token(int(token_id))
        if token is None:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
        return token

    def __repr__(self) -> str:
        which = "case-aware" if self.split_pattern == CASE_AWARE_SPLIT_PATTERN else "qwen2"
        return (
            f"TextTokenizer(base_vocab={self.base_vocab_size}, added={len(self.added_tokens)}, "
            f"split={which}, from={self.source})"
        )


def load_text_tokenizer(model_dir: str | os.PathLike) -> TextTokenizer:
    """The text tokenizer of a model directory, ids equal to the official processor's.

    Reads ``tokenizer.json`` when present, otherwise ``vocab.json`` + ``merges.txt``; the added
    tokens come from ``tokenizer_config.json`` (and ``tokenizer.json``'s own list); ``config.json``
    decides the pre-tokenisation pattern (``uses_case_aware_split``).  The released layout (vocab.json +
    merges.txt, the added tokens numbered on from the vocabulary) makes the library's BPE model at its
    first need only (``TextTokenizer.backend``): a short text is encoded by ``WordMerges`` before.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"text tokenizer: {model_dir} is not a directory")
    tokenizer_config = _read_json_if_present(model_dir / "tokenizer_config.json")
    model_config = _read_json_if_present(model_dir / "config.json")
    has_json = (model_dir / "tokenizer.json").is_file()
    has_bpe_files = (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file()

    vocab: Mapping[str, int] | None = None  # (read apart from the definition: vocab.json + merges.txt)
    merge_lines: list | None = None
    numbered = False  # (vocab the Qwen2 numbering of the merges: ``read_vocabulary``)
    if has_json:
        source = "tokenizer.json"
        definition = read_json_object(model_dir / "tokenizer.json")
        model = definition.get("model") or {}
        if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
            raise CheckpointError(f"{model_dir / 'tokenizer.json'}: expected a BPE model with a vocab")
        base_vocab_size = len(model["vocab"])
    elif has_bpe_files:
        source = "vocab.json+merges.txt"
        if tokenizer_config is None:
            raise CheckpointError(
                f"text tokenizer: {model_dir} has vocab.json and merges.txt but no "
                "tokenizer_config.json (it lists the special tokens such as <|im_start|>)"
            )
        vocab, merge_lines, numbered = read_vocabulary(model_dir)
        definition = _byte_level_bpe_json({}, [], QWEN2_SPLIT_PATTERN)  # (the model's entries given to it apart)
        base_vocab_size = len(vocab)
    else:
        present = sorted(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else []
        raise CheckpointError(
            f"text tokenizer: {model_dir} has neither tokenizer.json nor vocab.json + merges.txt (found: {present})"
        )

    split_pattern = QWEN2_SPLIT_PATTERN
    if uses_case_aware_split(model_config, base_vocab_size):
        pre = definition.get("pre_tokenizer")
        if not (isinstance(pre, dict) and pre.get("type") == "Sequence" and pre.get("pretokenizers")):
            raise CheckpointError(
                f"{model_dir}: the official loader would replace the first step of a "
                f"Sequence pre-tokenizer, but this one is {pre!r}"
            )
        pre["pretokenizers"][0] = _split_pre_tokenizer_json(CASE_AWARE_SPLIT_PATTERN)
        split_pattern = CASE_AWARE_SPLIT_PATTERN
    elif has_json:
        first = (definition.get("pre_tokenizer") or {}).get("pretokenizers", [{}])[0]
        split_pattern = (first.get("pattern") or {}).get("Regex", QWEN2_SPLIT_PATTERN)

    entries = _added_token_entries(tokenizer_config or {})

    def library_tokenizer():
        return _library_tokenizer(model_dir, definition, vocab, merge_lines, entries, base_vocab_size)

    if vocab is not None and merge_lines is not None and _numbered_on_from_the_vocabulary(entries, vocab):
        added = {e["content"]: e["id"] for e in entries}
        words = WordMerges.made(_splitter(model_dir, definition, entries), vocab, merge_lines, added, numbered)
        if words is not None:
            return TextTokenizer(library_tokenizer, split_pattern, added, base_vocab_size, source, words)
    backend = library_tokenizer()
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
    return TextTokenizer(backend, split_pattern, added, base_vocab_size, source)


def _library_tokenizer(
    model_dir: Path,
    definition: dict,
    vocab: Mapping[str, int] | None,
    merge_lines: list | None,
    entries: list,
    base_vocab_size: int,
):
    """The ``tokenizers`` pipeline of ``definition`` (with the BPE model of ``vocab`` and ``merge_lines`` where they
    were read apart) and the added tokens of ``entries``, each given the id the official loader gives it."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    try:
        backend = Tokenizer.from_str(json.dumps(definition))
        if vocab is not None:  # vocab.json + merges.txt: the BPE model made from them as they were read, the same
            # model as from its definition with the entries in it, without writing and parsing them again
            options = {k: v for k, v in definition["model"].items() if k not in ("type", "vocab", "merges")}
            backend.model = BPE(vocab=as_dict(vocab), merges=merge_pairs(merge_lines or ()), **options)
    except Exception as e:  # the tokenizers library reports its own parse errors
        raise CheckpointError(f"text tokenizer in {model_dir}: cannot build it ({e})") from None
    # Added tokens, in id order, each taking the next free id unless it is already in the vocabulary
    # (what the official loader does); the ids must come out as tokenizer_config.json lists them.
    for entry in entries:
        existing = backend.token_to_id(entry["content"])
        _add_token(backend, entry)
        got = backend.token_to_id(entry["content"])
        if got != entry["id"]:
            raise CheckpointError(
                f"tokenizer_config.json: added token {entry['content']!r} is listed with id {entry['id']} but "
                f"the loader gives it id {got} (added tokens must follow the {base_vocab_size}-entry vocabulary "
                f"without gaps{'' if existing is None else ', or equal its vocabulary id'})"
            )
    return backend


def _add_token(backend, entry: dict) -> None:
    """Add the added token ``entry`` (``_added_token_entries``) to a ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken

    options = ("single_word", "lstrip", "rstrip", "normalized", "special")
    token = AddedToken(entry["content"], **{k: entry[k] for k in options})
    if entry["special"]:
        backend.add_special_tokens([token])
    else:
        backend.add_tokens([token])


def _numbered_on_from_the_vocabulary(entries: list, vocab: Mapping[str, int]) -> bool:
    """Whether the added tokens are new words (none in the vocabulary, none twice) listed with the ids after
    the vocabulary's, in order: the ids the official loader gives them there (the released files)."""
    contents = [e["content"] for e in entries]
    return (
        [e["id"] for e in entries] == list(range(len(vocab), len(vocab) + len(entries)))
        and len(set(contents)) == len(contents)
        and vocab.keys().isdisjoint(contents)
    )


def _splitter(model_dir: Path, definition: dict, entries: list):
    """The ``tokenizers`` pipeline of ``definition`` over a BPE model of the 256 byte symbols and no merge, with
    the added tokens of ``entries``: its encoding of a text is the text's words, each as its byte symbols,
    and its added tokens (ids 256 on, in the order of ``entries``)."""
    from tokenizers import Tokenizer

    symbols = _byte_level_bpe_json({s: i for i, s in enumerate(byte_alphabet_in_vocab_order())}, [], "")
    try:
        splitter = Tokenizer.from_str(json.dumps(dict(definition, model=symbols["model"])))
    except Exception as e:  # the tokenizers library reports its own parse errors
        raise CheckpointError(f"text tokenizer in {model_dir}: cannot build it ({e})") from None
    for entry in entries:
        _add_token(splitter, entry)
    return splitter


class WordMerges:
    """A text's ids without the library's BPE model (making it from the vocabulary's 151,643 entries is
    most of a load's time): the library's splitter (``_splitter``: normalization, pre-tokenisation and
    added tokens as in the whole pipeline) cuts the text into words and added tokens, and each word's
    symbols merge by rank as in step 4 (``_bpe_word``), each symbol then looked up in the vocabulary.
    Merging a word of n symbols in Python takes up to about n * n steps: a text whose words would take more
    than ``PYTHON_MERGE_STEPS`` in all is left to the library (``encode`` returns None)."""

    PYTHON_MERGE_STEPS = 200_000  # (past it the library's model, made then, is the quicker way)

    def __init__(self, splitter, vocab: Mapping[str, int], ranks: dict, added_ids: dict):
        self.splitter, self.vocab = splitter, vocab
        self.ranks = ranks  # "a b" (a merges.txt line) -> rank
        self.added_ids = added_ids  # the splitter's id of an added token -> its id

    @classmethod
    def made(
        cls, splitter, vocab: Mapping[str, int], merge_lines: list, added: Mapping[str, int], numbered: bool = False
    ) -> WordMerges | None:
        """``WordMerges`` of the files' ``vocab`` and ``merge_lines`` (``read_vocabulary``), or None
        where the library's model is needed to say what they mean: a merge of symbols (or making one) not in
        the vocabulary (the library refuses the files), two words of one id, an added token that is a byte's
        symbol.  (A pair merged twice takes its last rank, as in the library.)  ``numbered``: ``vocab`` is
        known to be the Qwen2 numbering of the merges (``follows_the_qwen2_numbering``), which has none of
        the first three."""
        if not numbered and not (
            merge_symbols_in(vocab, merge_lines)
            and all(map(vocab.__contains__, merged_symbols(merge_lines)))
            and len(set(vocab.values())) == len(vocab)
        ):
            return None
        added_ids = {splitter.token_to_id(content): token_id for content, token_id in added.items()}
        if min(added_ids, default=256) < 256:
            return None
        ranks = vocab.ranks if isinstance(vocab, Qwen2Numbering) else dict(zip(merge_lines, itertools.count()))
        return cls(splitter, vocab, ranks, added_ids)

    def encode(self, text: str) -> list | None:
        """The ids of ``text``, or None where the library's model is to encode it."""
        encoding = self.splitter.encode(text, add_special_tokens=False)
        pieces = []  # (a word's symbols, its index) or (None, an added token's id)
        for token_id, token, word in zip(encoding.ids, encoding.tokens, encoding.word_ids, strict=True):
            if token_id in self.added_ids:
                pieces.append((None, self.added_ids[token_id]))
            elif word is None:  # (a symbol of no word: not what the splitter makes)
                return None
            elif pieces and pieces[-1][0] is not None and pieces[-1][1] == word:
                pieces[-1][0].append(token)
            else:
                pieces.append(([token], word))
        if sum(len(symbols) ** 2 for symbols, _ in pieces if symbols is not None) > self.PYTHON_MERGE_STEPS:
            return None
        ids = []
        for symbols, word_or_id in pieces:
            if symbols is None:
                ids.append(word_or_id)
                continue
            for symbol in _bpe_word(symbols, self.ranks):
                token_id = self.vocab.get(symbol)
                if token_id is None:  # (a vocabulary without some byte: what the library does with it)
                    return None
                ids.append(token_id)
        return ids


# ---------------------------------------------------------------------------------------------
# the same algorithm in plain Python (reading aid and independent check)
# ---------------------------------------------------------------------------------------------


def _bpe_word(symbols: list, ranks: Mapping[str, int]) -> list:
    """Merge the best-ranked adjacent pair (every occurrence, left to right) until none is ranked; ``ranks``
    maps a pair written as in merges.txt, ``"a b"``, to its rank."""
    while len(symbols) > 1:
        pairs = [(ranks.get(f"{a} {b}"), i) for i, (a, b) in enumerate(itertools.pairwise(symbols))]
        ranked = [p for p in pairs if p[0] is not None]
        if not ranked:
            break
        best = min(ranked)[0]
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and ranks.get(f"{symbols[i]} {symbols[i + 1]}") == best:
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def bpe_encode_explicit(
    text: str,
    vocab: Mapping[str, int],
    merges: Sequence[tuple],
    added_tokens: Mapping[str, int],
    split_pattern: str = QWEN2_SPLIT_PATTERN,
) -> list:
    """Byte-level BPE written out step by step (needs the ``regex`` module for ``\\p{...}`` classes).

    Only for added tokens with the Qwen defaults (no lstrip/rstrip/single_word, not normalized).
    The fast path (``load_text_tokenizer``) does not need ``regex``; this teaching version does.
    """
    try:
        import regex
    except ImportError:
        raise ImportError(
            "bpe_encode_explicit needs the 'regex' package (pip install "
            "'qwen3-tts-refimpl[explicit]'); load_text_tokenizer does not"
        ) from None

    ranks = {f"{a} {b}": r for r, (a, b) in enumerate(merges)}
    to_char = byte_to_unicode()
    word_re = regex.compile(split_pattern)
    # 1. cut out the added tokens (longest first where two start at the same place)
    if added_tokens:
        special_re = regex.compile("|".join(regex.escape(t) for t in sorted(added_tokens, key=len, reverse=True)))
        pieces, start = [], 0
        for m in special_re.finditer(text):
            pieces.append((text[start : m.start()], False))
            pieces.append((m.group(0), True))
            start = m.end()
        pieces.append((text[start:], False))
    else:
        pieces = [(text, False)]
    ids = []
    for piece, is_added in pieces:
        if is_added:
            ids.append(added_tokens[piece])
            continue
        piece = unicodedata.normalize("NFC", piece)  # 2. NFC
        for word in word_re.findall(piece):  # 3. pre-tokenise
            symbols = [to_char[b] for b in word.encode("utf-8")]  #    bytes -> symbols
            ids.extend(vocab[s] for s in _bpe_word(symbols, ranks))  # 4-5. BPE, look up
    return ids
