"""Model names (refimpl.io.hub): embedded names, Hugging Face repo ids in a local cache laid out as
``huggingface-cli download`` leaves it (blobs/, refs/, snapshots/ with file links), and the errors."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path

import pytest
from conftest import CHECKPOINTS

import refimpl
from refimpl import cli
from refimpl.io.hub import DATA, ModelNotFoundError, hub_cache_dir, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def fake_download(cache: Path, repo_id: str, source: Path, commit: str = COMMIT, branch: str = "main") -> Path:
    """Lay ``source`` out in ``cache`` as the hub client does: each file's bytes in blobs/<sha256>, the
    snapshot a tree of relative links to them, refs/<branch> the commit hash."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache chosen by HF_HUB_CACHE (HF_HOME points elsewhere: HF_HUB_CACHE wins)."""
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    return path


def test_embedded_names():
    assert resolve_model("default") == DATA / "default-customvoice"
    assert resolve_model("default", kind="base") == DATA / "default-base"
    for name in ("default-customvoice", "default-base", "default-voicedesign"):
        assert resolve_model(name) == DATA / name
    assert resolve_model(CHECKPOINTS / "tiny-base") == CHECKPOINTS / "tiny-base"  # a directory, as it is


def test_cache_directory_rule(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert hub_cache_dir()[0] == Path.home() / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir()[0] == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir()[0] == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir()[0] == tmp_path / "cache"
    assert hub_cache_dir(tmp_path / "given")[0] == tmp_path / "given"


def test_repo_id_from_the_cache_loads(cache):
    snapshot = fake_download(cache, "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", CHECKPOINTS / "tiny-customvoice")
    assert resolve_model("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") == snapshot
    tts = refimpl.Qwen3TTS.from_pretrained("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    assert tts.directory == snapshot and tts.get_supported_speakers() == ["dylan", "eric", "serena", "vivian"]
    tok = refimpl.Qwen3TTSTokenizer.from_pretrained("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    assert tok.tokenizer.directory == snapshot / "speech_tokenizer"


def test_revisions(cache):
    fake_download(cache, "Org/Name", CHECKPOINTS / "tiny-speech-tokenizer")
    other = fake_download(cache, "Org/Name", CHECKPOINTS / "tiny-speech-tokenizer", commit=OTHER, branch="v2")
    assert resolve_model("Org/Name", revision="v2") == other
    assert resolve_model("Org/Name", revision=OTHER) == other
    with pytest.raises(ModelNotFoundError, match="refs/v3"):
        resolve_model("Org/Name", revision="v3")
    for bad in ("../../etc", "a/b", "", "x" * 200):
        with pytest.raises(ValueError, match="revision must be"):
            resolve_model("Org/Name", revision=bad)


def test_missing_repo_says_where_it_looked_and_how_to_download(cache):
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("Qwen/Qwen3-TTS-Tokenizer-12Hz")
    msg = str(e.value)
    assert str(cache / "models--Qwen--Qwen3-TTS-Tokenizer-12Hz") in msg and "$HF_HUB_CACHE" in msg
    assert "huggingface-cli download Qwen/Qwen3-TTS-Tokenizer-12Hz" in msg and "hf download" in msg


def test_damaged_ref_is_an_error(cache):
    fake_download(cache, "Org/Name", CHECKPOINTS / "tiny-speech-tokenizer")
    (cache / "models--Org--Name" / "refs" / "main").write_text("../../../../etc")
    with pytest.raises(ModelNotFoundError, match="does not hold a commit hash"):
        resolve_model("Org/Name")


@pytest.mark.parametrize(
    "name",
    [
        "../Name",
        "Org/..",
        "Org/../../x",
        ".hidden/Name",
        "Org/Name/extra",
        "-o/Name",
        "Org/Na me",
        "/abs/path",
        "no-such-model",
        "Org\\Name",
    ],
)
def test_names_that_are_no_repo_id(cache, name):
    (cache / "models--Org--Name").mkdir()  # present, but none of these names may reach it
    with pytest.raises(ModelNotFoundError, match="does not exist as a directory"):
        resolve_model(name)


def test_bad_name_types():
    with pytest.raises(TypeError, match="path or a string"):
        resolve_model(3)
    with pytest.raises(ModelNotFoundError, match="empty"):
        resolve_model("  ")
    with pytest.raises(ValueError, match="kind must be one of"):
        resolve_model("default-base", kind="tts")


def test_cli_model_takes_the_same_names(cache):
    fake_download(cache, "Qwen/Qwen3-TTS-12Hz-0.6B-Base", CHECKPOINTS / "tiny-base")
    for name, shown in (("Qwen/Qwen3-TTS-12Hz-0.6B-Base", COMMIT), ("default-voicedesign", "default-voicedesign")):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert cli.main(["info", "--model", name]) == 0
        assert shown in out.getvalue()
        assert ("embedded default model" in err.getvalue()) == name.startswith("default")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["info", "--model", "Qwen/Missing"]) == 1
    assert "huggingface-cli download Qwen/Missing" in err.getvalue()
