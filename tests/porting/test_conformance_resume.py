"""``refimpl conformance make`` finishes what it can and is resumable: a case that fails does not stop the
others (the error names it, ``making.json`` lists it, no manifest is written), and the same command again
on that folder keeps every case whose ``case.json`` matches and whose files have their recorded SHA-256,
and makes the rest (docs/limits.md, the port author's tools)."""

import json

import pytest

from refimpl.cli import main
from refimpl.porting.conformance import suite

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.soxr_optional]


def test_a_failed_or_damaged_case_is_made_again_and_the_rest_kept(tmp_path, monkeypatch, capsys):
    out = tmp_path / "suite"
    start_case = suite.start_case

    def failing(case, models, directory):
        if case.name == "say-batch":
            raise MemoryError()
        return start_case(case, models, directory)

    monkeypatch.setattr(suite, "start_case", failing)
    with pytest.raises(suite.SuiteIncomplete, match=r"1 case\(s\) failed: say-batch: MemoryError.* the same command"):
        suite.make_suite(out)
    making = json.loads((out / suite.MAKING).read_text())
    assert making["failed"] == [{"name": "say-batch", "error": "MemoryError", "internal": False}]
    assert not (out / "manifest.json").exists() and not (out / "cases" / "say-batch").exists()
    made = {p.parent.name: json.loads(p.read_text()) for p in out.glob("cases/*/case.json")}
    assert len(made) == len(suite.CASES) - 1

    reference = out / "cases" / "codec-decode" / suite.REFERENCE_FILES["float32"]
    reference.write_bytes(reference.read_bytes()[:-1] + b"\0")  # damaged
    (out / "cases" / "speaker" / "case.json").unlink()  # stopped before its case.json was written
    ran = []
    monkeypatch.setattr(suite, "start_case", lambda case, *a: ran.append(case.name) or start_case(case, *a))
    capsys.readouterr()
    assert main(["conformance", "make", "-o", str(out), "-q"]) == 0
    assert sorted(ran) == ["codec-decode", "say-batch", "speaker"]
    manifest = suite.read_manifest(out)
    assert [c["name"] for c in manifest["cases"]] == [c.name for c in suite.CASES]
    assert not (out / suite.MAKING).exists() and (out / "README.md").is_file()
    for case in manifest["cases"]:
        if case["name"] in made:  # made again, the same bytes (the references are deterministic)
            assert case["sha256"] == made[case["name"]]["sha256"]
    assert main(["conformance", "make", "-o", str(out), "-q"]) == 1  # a finished suite is not made over
    assert "not an empty directory" in capsys.readouterr().err


def test_a_stopped_suite_resumes_only_from_what_it_was_begun_with(tmp_path, monkeypatch, capsys):
    out = tmp_path / "suite"

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "start_case", stopped)
    with pytest.raises(KeyboardInterrupt):
        suite.make_suite(out)
    assert (out / suite.MAKING).is_file() and not (out / "manifest.json").exists()
    making = json.loads((out / suite.MAKING).read_text())
    (out / suite.MAKING).write_text(json.dumps({**making, "refimpl": "0.0.1"}))
    assert main(["conformance", "make", "-o", str(out), "-q"]) == 1
    assert "cannot resume the suite" in capsys.readouterr().err
    (out / suite.MAKING).write_text("[")
    assert main(["conformance", "make", "-o", str(out), "-q"]) == 1
    assert "making.json" in capsys.readouterr().err


def test_a_case_that_hits_a_bug_is_an_internal_error_after_the_others(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "CASES", suite.CASES[:2])
    start_case = suite.start_case

    def buggy(case, models, directory):
        if case.name == "codec-decode":
            raise KeyError("oops")
        return start_case(case, models, directory)

    monkeypatch.setattr(suite, "start_case", buggy)
    assert main(["conformance", "make", "-o", str(tmp_path / "suite"), "-q"]) == 3
    err = capsys.readouterr().err
    assert "1 case(s) hit a bug: codec-decode: KeyError: 'oops'" in err
    assert (tmp_path / "suite" / "cases" / "codec-decode-chunked" / "case.json").is_file()
