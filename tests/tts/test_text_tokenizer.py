"""Text tokenizer: ids equal to the official Qwen3-TTS processor's (golden/text_tokenizer.json).

The golden file holds, for 238 texts (plain strings, the three chat templates, seeded random
unicode), the ids that the official loader (``AutoProcessor.from_pretrained(dir,
fix_mistral_regex=True)``, transformers 4.57.3) gives on six model-directory layouts: the tiny
vocabulary and the real Qwen BPE, with and without tokenizer.json, and with the config.json variants
that decide the pre-tokenisation pattern.  Here each layout is rebuilt the same way and read by
``refimpl.tts.text_tokenizer.load_text_tokenizer``.
"""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# the same layouts, built by the same code, as golden/oracle/record_text_tokenizer.py
from golden.text_layouts import LAYOUTS, RELEASED_CONFIG, TINY_DIR, read_real_merges, write_layout
from refimpl.io import finite_verdicts, vocabulary_verdicts
from refimpl.io.checkpoint import CheckpointError
from refimpl.porting import synthetic
from refimpl.tts import text_tokenizer
from refimpl.tts.text_tokenizer import (
    CASE_AWARE_SPLIT_PATTERN,
    QWEN2_SPLIT_PATTERN,
    Qwen2Numbering,
    _byte_level_bpe_json,
    assistant_prompt,
    bpe_encode_explicit,
    follows_the_qwen2_numbering,
    instruct_prompt,
    load_text_tokenizer,
    numbered_by_merges,
    read_vocab_and_merges,
    reference_prompt,
    uses_case_aware_split,
)

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN / "text_tokenizer.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def real_merges():
    return read_real_merges()


@pytest.fixture(scope="module")
def layout_dirs(tmp_path_factory, real_merges):
    root = tmp_path_factory.mktemp("text_layouts")
    dirs = {}
    for name in LAYOUTS:
        dirs[name] = root / name
        write_layout(dirs[name], name, real_merges)
    return dirs


@pytest.fixture(scope="module")
def tokenizers_by_layout(layout_dirs):
    return {name: load_text_tokenizer(d) for name, d in layout_dirs.items()}


# ------------------------------------------------------------------------------------------------
# parity with the official processor
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ids_equal_official(layout, golden, tokenizers_by_layout):
    tok = tokenizers_by_layout[layout]
    expected = golden["layouts"][layout]["ids"]
    ours = [tok.encode(t) for t in golden["texts"]]
    mismatches = [(t, o, e) for t, o, e in zip(golden["texts"], ours, expected, strict=True) if o != e]
    assert not mismatches, f"{len(mismatches)} of {len(expected)} texts differ, first: {mismatches[0]!r}"
    assert tok.encode_batch(golden["texts"][:20]) == expected[:20]


@pytest.mark.parametrize("layout", ["tiny", "real_released", "real_config_4_57_1", "real_no_config"])
def test_words_merged_before_the_librarys_model_give_the_official_ids(layout, golden, layout_dirs):
    """The released layout (vocab.json + merges.txt) leaves the library's BPE model to its first need: until
    then a text's words merge in Python (``WordMerges``), to the official ids, and the model is not made."""
    tok = load_text_tokenizer(layout_dirs[layout])
    assert tok.words is not None and tok._backend is None
    ours = [tok.words.encode(t) for t in golden["texts"]]
    assert [tok.encode(t) for t in golden["texts"][:5]] == ours[:5] and tok._backend is None
    expected = golden["layouts"][layout]["ids"]
    mismatches = [(t, o, e) for t, o, e in zip(golden["texts"], ours, expected, strict=True) if o != e]
    assert not mismatches, f"{len(mismatches)} of {len(expected)} texts differ, first: {mismatches[0]!r}"
    assert tok.vocab_size == golden["layouts"][layout]["len"]  # (its first need: made now, for every text)
    assert tok._backend is not None and tok.words is None


def test_a_text_too_long_to_merge_in_python_goes_to_the_library(golden, layout_dirs, tokenizers_by_layout):
    """A word of n symbols takes up to n * n steps in Python: past ``PYTHON_MERGE_STEPS`` in all, the
    library's model is made and encodes the text (the same ids)."""
    tok = load_text_tokenizer(layout_dirs["real_released"])
    long_word = "supercalifragilistic" * 30  # (one word of 600 symbols)
    assert tok.words.encode(long_word) is None and tok._backend is None
    assert tok.encode(long_word) == tokenizers_by_layout["real_released"].backend.encode(long_word).ids
    assert tok._backend is not None


def test_a_copy_or_a_pickle_holds_the_librarys_model(golden, layout_dirs):
    import copy
    import pickle

    tok = load_text_tokenizer(layout_dirs["real_released"])
    for other in (copy.deepcopy(tok), pickle.loads(pickle.dumps(tok))):
        assert other.words is None and other._backend is not None
        assert [other.encode(t) for t in golden["texts"][:20]] == golden["layouts"]["real_released"]["ids"][:20]
        assert other.added_tokens == tok.added_tokens and other.split_pattern == tok.split_pattern


def test_the_load_makes_no_object_a_merge_for_the_garbage_collector(layout_dirs, real_merges):
    """The released layout's load keeps its 151,387 merges as strings (their lines), which the cyclic
    garbage collector does not track: a tracked object made a merge (a tuple) would set off a collection
    of the youngest objects every ``threshold`` of them; the load sets off fewer than a tenth of those."""
    import gc

    gc.collect()
    before = gc.get_stats()[0]["collections"]
    tok = load_text_tokenizer(layout_dirs["real_released"])
    collections = gc.get_stats()[0]["collections"] - before
    assert tok.words is not None and len(tok.words.ranks) == len(real_merges)
    assert collections < len(real_merges) // gc.get_threshold()[0] // 10


def test_tokenizer_json_makes_the_librarys_model_at_the_load(layout_dirs):
    tok = load_text_tokenizer(layout_dirs["real_tokenizer_json"])
    assert tok.words is None and tok._backend is not None


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_official_loader(layout, golden, tokenizers_by_layout):
    tok, rec = tokenizers_by_layout[layout], golden["layouts"][layout]
    assert tok.split_pattern == rec["split_pattern"]
    assert tok.base_vocab_size == rec["vocab_size"]
    assert tok.vocab_size == rec["len"]
    assert tok.added_tokens == rec["added_tokens"]
    assert tok.source == ("tokenizer.json" if LAYOUTS[layout][1] else "vocab.json+merges.txt")


@pytest.mark.parametrize("layout", ["tiny", "real_released"])
def test_decode_equals_official(layout, golden, tokenizers_by_layout):
    tok, rec = tokenizers_by_layout[layout], golden["layouts"][layout]
    assert [tok.decode(ids) for ids in rec["ids"]] == rec["decoded"]


def test_released_layout_uses_the_case_aware_pattern(golden):
    """The real checkpoints get the case-aware pattern, and it changes ids on some texts."""
    layouts = golden["layouts"]
    assert layouts["real_released"]["split_pattern"] == CASE_AWARE_SPLIT_PATTERN
    assert layouts["real_config_4_57_1"]["split_pattern"] == QWEN2_SPLIT_PATTERN
    assert layouts["tiny"]["split_pattern"] == QWEN2_SPLIT_PATTERN  # vocabulary too small for the swap
    differ = [
        t
        for t, a, b in zip(
            golden["texts"], layouts["real_released"]["ids"], layouts["real_config_4_57_1"]["ids"], strict=True
        )
        if a != b
    ]
    assert "JavaScript and TypeScript, McDonald's, OpenAI's GPT-4o, XMLHttpRequest" in differ


@pytest.mark.parametrize("layout", ["tiny", "real_released", "real_no_config"])
def test_the_bpe_model_made_apart_is_the_one_its_definition_makes(layout, layout_dirs, tokenizers_by_layout):
    """From vocab.json + merges.txt the loader gives the BPE model its entries as read, apart from the rest of
    the definition: the model is the one the whole definition (entries included) would make."""
    from tokenizers import Tokenizer

    vocab, merges = read_vocab_and_merges(layout_dirs[layout])
    tok = tokenizers_by_layout[layout]
    assert tok.source == "vocab.json+merges.txt"
    whole = Tokenizer.from_str(json.dumps(_byte_level_bpe_json(vocab, merges, tok.split_pattern)))
    assert json.loads(tok.backend.to_str())["model"] == json.loads(whole.to_str())["model"]


@pytest.mark.parametrize("layout", ["tiny", "real_released", "real_no_config"])
def test_explicit_bpe_equals_official(layout, golden, layout_dirs, tokenizers_by_layout):
    """The plain-Python algorithm (regex + merge loop) gives the official ids too."""
    pytest.importorskip("regex")
    vocab, merges = read_vocab_and_merges(layout_dirs[layout])
    tok = tokenizers_by_layout[layout]
    expected = golden["layouts"][layout]["ids"]
    step = 1 if layout == "tiny" else 3  # the pure-Python merge loop is slow on the full vocabulary
    for text, ids in list(zip(golden["texts"], expected, strict=True))[::step]:
        assert bpe_encode_explicit(text, vocab, merges, tok.added_tokens, tok.split_pattern) == ids, text


@pytest.mark.parametrize("layout", ["tiny", "real_released"])
def test_chat_templates_keep_the_official_slices(layout, golden, tokenizers_by_layout):
    """The official prompt code takes ids[:3] as the role and ids[-5:] as the closing part."""
    tok = tokenizers_by_layout[layout]
    im_start, im_end, nl = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>"), tok.encode("\n")
    assistant, user = tok.encode("assistant"), tok.encode("user")
    assert len(nl) == len(assistant) == len(user) == 1
    kinds, texts, ids = golden["kinds"], golden["texts"], golden["layouts"][layout]["ids"]
    n = 0
    for kind, text, official in zip(kinds, texts, ids, strict=True):
        if kind == "assistant":
            body = text[len("<|im_start|>assistant\n") : -len("<|im_end|>\n<|im_start|>assistant\n")]
            assert assistant_prompt(body) == text and tok.encode(assistant_prompt(body)) == official
            assert official[-5:] == [im_end] + nl + [im_start] + assistant + nl
            if body.startswith("\n") and official[2] != nl[0]:
                # the role's newline merges with the text's ("\n\n" is one token): the 3-id slice
                # then holds part of the text, in the official code as well
                assert official[:2] == [im_start] + assistant
            else:
                assert official[:3] == [im_start] + assistant + nl
            n += 1
        elif kind == "reference":
            body = text[len("<|im_start|>assistant\n") : -len("<|im_end|>\n")]
            assert reference_prompt(body) == text and official[-2:] == [im_end] + nl
        elif kind == "instruct":
            body = text[len("<|im_start|>user\n") : -len("<|im_end|>\n")]
            assert instruct_prompt(body) == text and official[:2] == [im_start] + user
            assert official[2] == nl[0] or body.startswith("\n")
    assert n == 13


# ------------------------------------------------------------------------------------------------
# the tiny vocabulary
# ------------------------------------------------------------------------------------------------


def test_tiny_vocabulary_committed_files_are_reproducible(tmp_path):
    ids = synthetic.write_tiny_text_tokenizer(tmp_path)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (TINY_DIR / name).read_bytes(), name
    tok = load_text_tokenizer(TINY_DIR)
    assert tok.added_tokens == ids
    assert set(ids) == {t for t, _ in synthetic.TINY_TEXT_ADDED_TOKENS}
    assert tok.vocab_size == max(ids.values()) + 1 <= 1024  # one text-embedding row per id


def test_tiny_special_ids_equal_official(golden):
    assert load_text_tokenizer(TINY_DIR).added_tokens == golden["layouts"]["tiny"]["added_tokens"]


def test_real_vocabulary_follows_from_its_merges(real_merges):
    vocab = synthetic.byte_level_vocab(real_merges)
    assert len(vocab) == 151643
    assert vocab["assistant"] == 77091 and vocab["Ċ"] == 198  # ids the released config/prompts rely on


# ------------------------------------------------------------------------------------------------
# the store of vocabulary verdicts (refimpl/io/vocabulary_verdicts.py)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    """A store of this test's own (files written a moment ago count as old enough to remember: the racy rule
    has its own test) and the ``vocab.json`` files the loads parse (a list of their folders)."""
    monkeypatch.setenv("REFIMPL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(finite_verdicts, "RACY_NS", 0)
    parsed = []
    real = text_tokenizer.read_json_object

    def spy(path, *args, **kwargs):
        if Path(path).name == "vocab.json":
            parsed.append(Path(path).parent)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(text_tokenizer, "read_json_object", spy)
    return parsed


def _copy_layout(layout_dirs, layout, target):
    shutil.copytree(layout_dirs[layout], target)
    return target


def _store_files(tmp_path) -> list:
    folder = tmp_path / "cache" / "vocabulary"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_second_load_numbers_the_vocabulary_from_the_merges(tmp_path, verdicts, layout_dirs, golden):
    """The released files: the first load parses vocab.json, finds it the Qwen2 numbering of merges.txt and
    keeps that verdict; the next load of the same files numbers the vocabulary from merges.txt alone (its ids
    read off the merges' ranks, no dictionary made: the same vocabulary, the official ids), and so does a
    third."""
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    first = load_text_tokenizer(d)
    assert verdicts == [d] and len(_store_files(tmp_path)) == 1
    expected = golden["layouts"]["real_released"]["ids"]
    for _ in range(2):
        again = load_text_tokenizer(d)
        assert verdicts == [d] and again.words is not None
        assert [again.words.encode(t) for t in golden["texts"]] == expected
        assert again.words.vocab._full is None  # (the ids read off the merges' ranks, no dictionary made)
        assert again.words.vocab == first.words.vocab and again.words.ranks == first.words.ranks
    assert [again.encode(t) for t in golden["texts"]] == expected
    assert again.vocab_size == golden["layouts"]["real_released"]["len"]  # (the library's model, from it)
    assert [again.encode(t) for t in golden["texts"][:40]] == expected[:40]


def test_a_vocabulary_numbered_otherwise_is_parsed_at_every_load(tmp_path, verdicts, layout_dirs):
    """Two ids swapped in vocab.json: not the numbering of the merges, no verdict, parsed every time (and
    tokenized as the library tokenizes those files)."""
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
    vocab["Ġthe"], vocab["in"] = vocab["in"], vocab["Ġthe"]
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    for _ in range(2):
        tok = load_text_tokenizer(d)
        assert verdicts.count(d) == _ + 1 and _store_files(tmp_path) == []
    text = "in the beginning the words were in the vocabulary"
    assert tok.encode(text) == tok.backend.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) != load_text_tokenizer(layout_dirs["real_released"]).encode(text)


@pytest.mark.parametrize("changed", ["vocab.json", "merges.txt"])
def test_a_file_changed_since_its_verdict_is_read_again(tmp_path, verdicts, layout_dirs, changed):
    """A rewritten file has another stamp: vocab.json is parsed again.  merges.txt rewritten with its last
    merge dropped (vocab.json then numbers one merge more than it has): parsed at every load, the merges
    read as they are now."""
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    lines = len(load_text_tokenizer(d).words.ranks)
    path = d / changed
    data = path.read_bytes()
    path.unlink()  # (a new inode: the stamp moves however coarse the clock)
    path.write_bytes(data)
    load_text_tokenizer(d)
    assert verdicts == [d, d]
    if changed == "merges.txt":
        path.unlink()
        path.write_bytes(data[: data.rstrip(b"\n").rindex(b"\n") + 1])
        for _ in range(2):
            assert len(load_text_tokenizer(d).words.ranks) == lines - 1
        assert verdicts == [d] * 4


def test_merges_changed_while_read_under_a_verdict_are_read_again(tmp_path, verdicts, layout_dirs, monkeypatch):
    """merges.txt replaced while the load reads it under the verdict: what was read may not be the file of the
    verdict, so the load reads both files again and checks them."""
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    load_text_tokenizer(d)
    real = text_tokenizer._read_merge_lines

    def replaced_while_read(model_dir, well_formed=False):
        lines = real(model_dir, well_formed)
        if well_formed:
            data = (d / "merges.txt").read_bytes()
            (d / "merges.txt").unlink()
            (d / "merges.txt").write_bytes(data)
        return lines

    monkeypatch.setattr(text_tokenizer, "_read_merge_lines", replaced_while_read)
    assert load_text_tokenizer(d).words is not None and verdicts == [d, d]


def test_merges_read_line_by_line_are_not_remembered(tmp_path, verdicts, layout_dirs):
    """The released merges with CRLF line ends and a blank line: read line by line, the same vocabulary and
    ranks, and no verdict (one would have the next load take the file's lines as they are)."""
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    expected = load_text_tokenizer(layout_dirs["real_released"]).words
    shutil.rmtree(tmp_path / "cache")  # (that load's verdict)
    text = (d / "merges.txt").read_text(encoding="utf-8")
    (d / "merges.txt").write_text(text.replace("\n", "\r\n\n"), encoding="utf-8", newline="")
    for _ in range(2):
        words = load_text_tokenizer(d).words
        assert words.ranks == expected.ranks and words.vocab == expected.vocab
    assert verdicts == [layout_dirs["real_released"], d, d] and _store_files(tmp_path) == []


def test_files_changed_just_before_the_load_are_not_remembered(tmp_path, verdicts, layout_dirs, monkeypatch):
    monkeypatch.setattr(finite_verdicts, "RACY_NS", 10**15)
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    for _ in range(2):
        load_text_tokenizer(d)
    assert verdicts == [d, d] and _store_files(tmp_path) == []


BAD_VOCABULARY_STORE_FILES = {
    "not JSON": lambda data: "\x00not json",
    "not an object": lambda data: json.dumps([data]),
    "another format": lambda data: json.dumps(dict(data, format=2)),
    "another vocab.json": lambda data: json.dumps(dict(data, vocab=["/elsewhere/vocab.json", data["vocab"][1]])),
    "another merges.txt stamp": lambda data: json.dumps(
        dict(data, merges=[data["merges"][0], [data["merges"][1][0] + 1, *data["merges"][1][1:]]])
    ),
    "a stamp of booleans": lambda data: json.dumps(dict(data, vocab=[data["vocab"][0], [True] * 5])),
    "no merges entry": lambda data: json.dumps({k: v for k, v in data.items() if k != "merges"}),
    "too large": lambda data: json.dumps(dict(data, padding="x" * finite_verdicts.MAX_STORE_BYTES)),
}


@pytest.mark.parametrize("damage", sorted(BAD_VOCABULARY_STORE_FILES))
def test_a_damaged_or_foreign_vocabulary_verdict_is_ignored(tmp_path, verdicts, layout_dirs, damage):
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    load_text_tokenizer(d)
    [store] = _store_files(tmp_path)
    store.write_text(BAD_VOCABULARY_STORE_FILES[damage](json.loads(store.read_text())))
    load_text_tokenizer(d)
    assert verdicts == [d, d]


def test_no_vocabulary_verdict_when_the_store_is_off(tmp_path, verdicts, layout_dirs, monkeypatch):
    monkeypatch.setenv("REFIMPL_CACHE_DIR", "off")
    d = _copy_layout(layout_dirs, "real_released", tmp_path / "model")
    for _ in range(2):
        load_text_tokenizer(d)
    assert verdicts == [d, d] and vocabulary_verdicts.directory() is None
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_the_qwen2_numbering(real_merges):
    """``numbered_by_merges`` is the numbering the synthetic writer gives the real merges (ids the released
    prompts rely on); a merge making a symbol twice or of a symbol not in the vocabulary, a vocabulary of
    one id more or of two ids swapped, does not follow it."""
    lines = [f"{a} {b}" for a, b in real_merges]
    vocab = synthetic.byte_level_vocab(real_merges)
    assert numbered_by_merges(lines) == vocab and follows_the_qwen2_numbering(vocab, lines)
    assert numbered_by_merges([]) == synthetic.byte_level_vocab([])
    for bad in (lines + ["Ġ Ġ"], lines + ["! xyzzyxyzzy"]):  # ("ĠĠ" made twice; a symbol no merge makes)
        assert not follows_the_qwen2_numbering(numbered_by_merges(bad), bad)
    assert not follows_the_qwen2_numbering(vocab, lines[:-1])  # (one id too many)
    swapped = dict(vocab, **{"Ġthe": vocab["in"], "in": vocab["Ġthe"]})
    assert not follows_the_qwen2_numbering(swapped, lines)


def test_the_qwen2_numbering_read_off_the_merges(real_merges):
    """``Qwen2Numbering`` gives every entry of ``numbered_by_merges`` from the merges' ranks (a byte's symbol
    its place, a longer one 256 + the rank of the merge that makes it) without making the dictionary, and
    holds nothing else: a string no merge makes, one with a space, an added token's, a character outside the
    byte alphabet, a non-string."""
    lines = [f"{a} {b}" for a, b in real_merges]
    numbering, vocab = Qwen2Numbering(lines), numbered_by_merges(lines)
    assert len(numbering) == len(vocab) and all(numbering[symbol] == i for symbol, i in vocab.items())
    assert numbering._full is None  # (looked up, not made)
    for absent in ("xyzzyxyzzyq", "Ġthe Ġcat", "<|im_start|>", " ", "€", "", 7, None):
        assert absent not in numbering and numbering.get(absent) is None
        with pytest.raises(KeyError):
            numbering[absent]
    assert numbering == vocab and vocab == numbering and dict(numbering.items()) == vocab
    assert list(numbering) == list(vocab) and numbering.full() is numbering.full()
    short = Qwen2Numbering(lines[:-1])
    assert numbering != short and lines[-1].replace(" ", "") not in short


# ------------------------------------------------------------------------------------------------
# the pattern rule, property tests
# ------------------------------------------------------------------------------------------------


def test_case_aware_rule():
    big, small = 151643, 682
    assert uses_case_aware_split(RELEASED_CONFIG, big)
    assert uses_case_aware_split({"model_type": "qwen3_tts"}, big)  # no version recorded
    assert not uses_case_aware_split(RELEASED_CONFIG, small)
    assert not uses_case_aware_split(None, big)
    assert not uses_case_aware_split({"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, big)
    assert uses_case_aware_split({"transformers_version": "4.57.2"}, big)  # no model_type
    assert uses_case_aware_split({"model_type": "mistral", "transformers_version": "4.40.0"}, big)
    assert not uses_case_aware_split({"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, big)
    with pytest.raises(CheckpointError, match="transformers_version"):
        uses_case_aware_split({"transformers_version": "not-a-version"}, big)


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cn", "Co")), max_size=40)
_SPECIALS = st.sampled_from(["<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", ""])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(_TEXT, _SPECIALS), max_size=4))
def test_property_tiny_paths_agree_and_round_trip(parts, layout_dirs, tokenizers_by_layout):
    """tokenizer.json path == vocab+merges path == explicit Python BPE; decode(encode(t)) == NFC pieces."""
    text = "".join(a + b for a, b in parts)
    tok = tokenizers_by_layout["tiny"]
    ids = tok.encode(text)
    assert tokenizers_by_layout["tiny_tokenizer_json"].encode(text) == ids
    assert tok.decode(ids) == "".join(unicodedata.normalize("NFC", a) + b for a, b in parts)
    try:
        import regex  # noqa: F401
    except ImportError:
        return
    vocab, merges = _tiny_vocab_merges()
    assert bpe_encode_explicit(text, vocab, merges, tok.added_tokens, tok.split_pattern) == ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXT)
def test_property_real_paths_agree(text, tokenizers_by_layout):
    assert tokenizers_by_layout["real_released"].encode(text) == tokenizers_by_layout["real_tokenizer_json"].encode(
        text
    )
    assert tokenizers_by_layout["real_released"].decode(
        tokenizers_by_layout["real_released"].encode(text)
    ) == unicodedata.normalize("NFC", text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(_TEXT, _SPECIALS), max_size=4))
def test_property_words_merged_in_python_equal_the_library(parts, tokenizers_by_layout, words_by_layout):
    """Random text and added tokens: the words merged in Python, the library's ids (or left to it)."""
    text = "".join(a + b for a, b in parts)
    for layout in ("tiny", "real_released"):
        library = tokenizers_by_layout[layout].backend.encode(text, add_special_tokens=False).ids
        assert words_by_layout[layout].encode(text) in (library, None), text


@pytest.fixture(scope="module")
def words_by_layout(layout_dirs):
    return {name: load_text_tokenizer(layout_dirs[name]).words for name in ("tiny", "real_released")}


_TINY_CACHE = {}


def _tiny_vocab_merges():
    if not _TINY_CACHE:
        _TINY_CACHE["vm"] = read_vocab_and_merges(TINY_DIR)
    return _TINY_CACHE["vm"]


# ------------------------------------------------------------------------------------------------
# bad inputs
# ------------------------------------------------------------------------------------------------


def _copy_tiny(tmp_path, names=("vocab.json", "merges.txt", "tokenizer_config.json")):
    for name in names:
        (tmp_path / name).write_bytes((TINY_DIR / name).read_bytes())
    return tmp_path


def test_vocab_and_merges_read_as_written(tmp_path):
    """merges.txt: a "#version" first line, blank lines and CRLF line ends skipped, each line two symbols
    (the line named otherwise); vocab.json: integer ids only (not true / 1.0)."""
    vocab, merges = read_vocab_and_merges(TINY_DIR)
    d = _copy_tiny(tmp_path)
    text = "#version: 0.2\r\n\n" + "".join(f"{a} {b}\r\n\n" for a, b in merges) + "  \n"
    (d / "merges.txt").write_text(text, encoding="utf-8", newline="")
    assert read_vocab_and_merges(d) == (vocab, merges)
    (d / "merges.txt").write_text(f"{merges[0][0]} {merges[0][1]}\n\n a b c \n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="merges.txt line 3: expected two symbols, got 'a b c'"):
        read_vocab_and_merges(d)
    for bad in ("true", "1.0", '"1"', "null"):
        _copy_tiny(d)
        (d / "vocab.json").write_text('{"a": 0, "b": ' + bad + "}")
        with pytest.raises(CheckpointError, match="must map token strings to integer ids"):
            read_vocab_and_merges(d)


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_text_tokenizer(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="neither tokenizer.json nor vocab.json"):
        load_text_tokenizer(tmp_path)
    _copy_tiny(tmp_path, ("vocab.json",))
    with pytest.raises(CheckpointError, match="neither tokenizer.json nor vocab.json"):
        load_text_tokenizer(tmp_path)
    _copy_tiny(tmp_path, ("merges.txt",))
    with pytest.raises(CheckpointError, match="no tokenizer_config.json"):
        load_text_tokenizer(tmp_path)


def test_malformed_files(tmp_path):
    d = _copy_tiny(tmp_path)
    (d / "vocab.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="vocab.json is not valid JSON"):
        load_text_tokenizer(d)
    _copy_tiny(d)
    (d / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(CheckpointError, match="expected two symbols"):
        load_text_tokenizer(d)
    _copy_tiny(d)
    (d / "merges.txt").write_text("#version: 0.2\nzz qq\n")
    with pytest.raises(CheckpointError, match="cannot build it"):
        load_text_tokenizer(d)
    _copy_tiny(d)
    (d / "vocab.json").write_text("{}")  # (an empty vocabulary is read too: its merges have no symbols)
    with pytest.raises(CheckpointError, match="cannot build it"):
        load_text_tokenizer(d)
    _copy_tiny(d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    first = min(config["added_tokens_decoder"], key=int)
    config["added_tokens_decoder"][str(int(first) + 100)] = config["added_tokens_decoder"].pop(first)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="without gaps"):
        load_text_tokenizer(d)
    (d / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x": {"content": "<a>"}}}')
    with pytest.raises(CheckpointError, match="not an integer"):
        load_text_tokenizer(d)


def test_bad_text_and_ids():
    tok = load_text_tokenizer(TINY_DIR)
    for bad in (None, b"bytes", 3, ["a"]):
        with pytest.raises(ValueError, match="must be a str"):
            tok.encode(bad)
    with pytest.raises(ValueError, match="must be a str"):
        tok.encode_batch(["ok", 5])
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([0, tok.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="unknown token"):
        tok.token_to_id("<|not_a_token|>")
    assert tok.encode("") == []
