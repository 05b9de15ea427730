"""parse_json: the integers' C fast path and the Python hook give the same values and the same refusals,
whatever Python's own limit of int(str); the depth check walks only containers of containers."""

import json
import sys

import pytest

from refimpl.io import files
from refimpl.io.checkpoint import CheckpointError
from refimpl.io.files import MAX_JSON_INT_DIGITS, json_depth_at_most, parse_json

needs_limit = pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="Python without int limits")


@pytest.fixture
def python_int_limit():
    """Set Python's limit of int(str) for one test (0: none), restored after."""
    before = sys.get_int_max_str_digits()
    yield sys.set_int_max_str_digits
    sys.set_int_max_str_digits(before)


TEXT = '{"a": [1, -2, 3.5, {"b": 12345678901234567890}], "c": "9999", "d": -0, "e": true}'


@needs_limit
@pytest.mark.parametrize("limit", [0, 640, 4300, 10_000])
def test_integers_read_equal_under_every_python_limit(python_int_limit, limit):
    python_int_limit(limit)
    value = parse_json(TEXT, "t.json")
    assert value == json.loads(TEXT)
    assert type(value["a"][0]) is int and type(value["a"][3]["b"]) is int and type(value["e"]) is bool


@needs_limit
@pytest.mark.parametrize("limit", [0, 640, 4300, 10_000])
@pytest.mark.parametrize("digits", [MAX_JSON_INT_DIGITS + 1, 5000])
def test_a_long_integer_is_refused_with_its_digits_under_every_python_limit(python_int_limit, limit, digits):
    python_int_limit(limit)
    for text in ('{"x": ' + "9" * digits + "}", "[1, -" + "7" * digits + "]"):
        with pytest.raises(CheckpointError, match=f"t.json: a JSON integer of {digits} digits"):
            parse_json(text, "t.json", CheckpointError)


@needs_limit
def test_an_integer_within_our_limit_past_a_lower_python_limit_is_refused(python_int_limit):
    python_int_limit(640)
    with pytest.raises(CheckpointError, match="t.json: a JSON integer of 1000 digits"):
        parse_json('{"x": ' + "1" * 1000 + "}", "t.json", CheckpointError)


def test_the_fast_path_keeps_the_other_refusals():
    with pytest.raises(CheckpointError, match="t.json is not valid JSON"):
        parse_json('{"x": 1,}', "t.json", CheckpointError)
    with pytest.raises(CheckpointError, match="t.json is not valid UTF-8 text"):
        parse_json(b'{"x": "\xff"}', "t.json", CheckpointError)
    with pytest.raises(CheckpointError, match="the key 'x' appears twice"):
        parse_json('{"x": 1, "x": 2}', "t.json", CheckpointError, unique_keys=True)


def test_depth_is_counted_through_flat_and_nested_containers():
    flat = {str(i): i for i in range(1000)}
    assert json_depth_at_most(flat, 1) and not json_depth_at_most({"a": flat}, 1)
    deep = 0
    for _ in range(10):
        deep = [1, "x", {"k": deep, "n": None}]
    assert json_depth_at_most(deep, 20) and not json_depth_at_most(deep, 19)
    wide = {"k": [[]] * 3 + list(range(100))}
    assert json_depth_at_most(wide, 3) and not json_depth_at_most(wide, 2)
    assert json_depth_at_most(7, 0) and json_depth_at_most("s", 0) and not json_depth_at_most([], 0)


def test_the_hook_alone_reads_what_the_fast_path_reads(monkeypatch):
    fast = parse_json(TEXT, "t.json")
    monkeypatch.setattr(files.sys, "get_int_max_str_digits", lambda: 0)  # (as a Python without the limit)
    assert parse_json(TEXT, "t.json") == fast
