"""Shared benchmark helpers: full-size synthetic checkpoints made on demand, timing, the official side."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "golden" / "oracle" / "stubs"))  # for the official package, if importable

# refimpl before NumPy, as a program that imports refimpl first: refimpl/__init__.py sets OpenBLAS's short idle
# spin, read when OpenBLAS loads (with the default spin short decodes are slower: docs/performance.md,
# "Threads"), so every benchmark importing this module first measures that program
import refimpl  # noqa: E402, F401

CACHE = Path(os.environ.get("REFIMPL_BENCH_DIR", REPO / "bench-checkpoints"))


def written_once(path: Path, write, what: str) -> Path:
    """The checkpoint directory ``path``, written by ``write(directory)`` when it is not there yet.

    It is written into ``<path>.partial`` and renamed to ``path`` only when complete, so that a write stopped
    half way (a time limit, a full disk) never leaves a directory under the final name: a directory there is
    a whole checkpoint, and the next run writes a stopped one again from the start."""
    if (path / "model.safetensors").is_file():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():  # a directory without its weights: not ours to trust
        shutil.rmtree(path)
    print(f"writing {what} to {path} ...", flush=True)
    write(partial)
    os.replace(partial, path)
    return path


def released_speech_tokenizer(seed: int = 0) -> Path:
    """The released speech-tokenizer config with seeded random weights (written once, ~680 MB)."""
    from refimpl.porting import presets, synthetic

    return written_once(
        CACHE / "released-speech-tokenizer",
        lambda d: synthetic.write_speech_tokenizer(d, presets.preset(presets.RELEASED_SPEECH_TOKENIZER), seed=seed),
        "a full-size synthetic speech tokenizer",
    )


def _in_child(fn, *args) -> None:
    """Run ``fn(*args)`` in a forked process, so that writing a checkpoint (several GB of random
    tensors) does not count in this process's peak memory (resource.getrusage ru_maxrss)."""
    import multiprocessing

    p = multiprocessing.get_context("fork").Process(target=fn, args=args)
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"writing a benchmark checkpoint failed (exit code {p.exitcode})")


def _write_released_tts(path: Path, seed: int, tts_model_type: str) -> None:
    """Like ``synthetic.write_tts_model`` with the released text tokenizer (``_write_released_text_tokenizer``:
    the real vocabulary, its added tokens at their released ids), and the text embedding
    of the released size (151936 x 2048), bf16 on disk like the release (speech_tokenizer/ is linked by the
    caller). ``tts_model_type`` "custom_voice" has the
    released speakers; "base" has none and the 0.6B-Base speaker encoder (enc_dim 1024)."""
    from refimpl.porting import presets, synthetic

    path.mkdir(parents=True, exist_ok=True)
    added = _write_released_text_tokenizer(path)
    base = tts_model_type == "base"
    talker = presets.RELEASED_TALKER_0_6B if base else presets.RELEASED_TALKER_0_6B_CUSTOMVOICE
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "0b6",
        "tts_model_type": tts_model_type,
        "im_start_token_id": added["<|im_start|>"],
        "im_end_token_id": added["<|im_end|>"],
        "tts_pad_token_id": added["<tts_pad>"],
        "tts_bos_token_id": added["<tts_text_bos>"],
        "tts_eos_token_id": added["<tts_text_eod>"],
        "talker_config": presets.preset(talker),
    }
    if base:
        config["speaker_encoder_config"] = presets.preset(presets.RELEASED_SPEAKER_ENCODER)
    assert max(added.values()) < config["talker_config"]["text_vocab_size"]
    weights = synthetic.random_weights(synthetic.tts_model_weight_spec(config), seed)
    synthetic.write_checkpoint(path, config, weights, "bfloat16")
    (path / "generation_config.json").write_text(json.dumps(presets.RELEASED_GENERATION_CONFIG, indent=2) + "\n")


def _write_released_text_tokenizer(path: Path) -> dict:
    """The released text tokenizer: the real Qwen vocabulary (its 151,387 merges, committed under golden/)
    with the Qwen3-TTS added tokens at their released ids, so that loading it costs what loading the
    released one does (a cold start's largest part of the load); returns {added token: id}."""
    from golden.text_layouts import read_real_merges
    from refimpl.porting import synthetic

    return synthetic.write_text_tokenizer(path, read_real_merges(), synthetic.QWEN3_TTS_ADDED_TOKENS)


def _has_released_text_tokenizer(path: Path) -> bool:
    """Whether ``path``'s merges.txt is the real one (its first merge, "Ġ Ġ"; the tiny one's is "a s")."""
    with open(path / "merges.txt", encoding="utf-8") as f:
        return f.readline().startswith("#version") and f.readline() == "Ġ Ġ\n"


def _released_tts(name: str, tts_model_type: str, what: str, seed: int) -> Path:
    """A full-size 0.6B model directory ``CACHE/name`` (written once) whose speech_tokenizer/ links to
    ``released_speech_tokenizer()``."""
    tokenizer = released_speech_tokenizer()
    path = written_once(CACHE / name, lambda d: _in_child(_write_released_tts, d, seed, tts_model_type), what)
    if not _has_released_text_tokenizer(path):  # (written when its tokenizer was the tiny one: the same added ids)
        _write_released_text_tokenizer(path)
    link = path / "speech_tokenizer"
    if not link.exists():
        link.symlink_to(os.path.relpath(tokenizer, path), target_is_directory=True)
    return path


def released_custom_voice_0_6b(seed: int = 0) -> Path:
    """A full-size Qwen3-TTS-12Hz-0.6B-CustomVoice directory with seeded random weights (bf16, 1.8 GB,
    written once) whose speech_tokenizer/ is ``released_speech_tokenizer()``."""
    return _released_tts(
        "released-0.6b-customvoice", "custom_voice", "a full-size synthetic 0.6B CustomVoice model", seed
    )


def released_base_0_6b(seed: int = 0) -> Path:
    """A full-size Qwen3-TTS-12Hz-0.6B-Base directory with seeded random weights (bf16, 1.83 GB, written once): the
    Talker without speakers, the released speaker encoder (enc_dim 1024), ``released_speech_tokenizer()``
    linked as speech_tokenizer/. The port graders' full-size voice-clone, codec-encode and speaker cases."""
    return _released_tts("released-0.6b-base", "base", "a full-size synthetic 0.6B Base model", seed)


def released_speaker_encoder(seed: int = 0) -> Path:
    """The 0.6B-Base speaker encoder (enc_dim 1024) alone, seeded random weights, bf16 (written once)."""
    from refimpl.porting import presets, synthetic

    preset = presets.preset(presets.RELEASED_SPEAKER_ENCODER)
    return written_once(
        CACHE / "released-speaker-encoder",
        lambda d: synthetic.write_speaker_encoder(d, preset, seed, "bfloat16"),
        "a full-size synthetic speaker encoder",
    )


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def best_time(fn, repeats: int = 3):
    """Best wall time of ``repeats`` calls (the least disturbed by the noisy 2-core machine), and the result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def alternate(ours, official, repeats: int):
    """Best time of each side over ``repeats`` timed runs, the two sides taking turns by blocks (ours, then
    the official's, then ours again, ...: the drift of a shared machine falls on both alike; official None:
    ours only), and each side's last result.

    Each block starts with a call that is not timed: the side's warm-up (compilation, caches), and the time
    for the other side's idle threads to stop, so that no timed call runs beside them.  PyTorch's OpenMP
    workers spin for a while after each parallel region before they sleep (as ours do, OpenBLAS's), and on two
    cores a call right after the other side's would pay for that spin, a share that grows as the call
    shortens (``OMP_WAIT_POLICY=ACTIVE``, the spin without end, shows it whole).  So each timed call follows a
    call of its own side, as in a program that calls one of them again and again."""
    blocks = 2 if repeats > 1 and official is not None else 1
    per_block = -(-repeats // blocks)  # (two blocks a side: together at least ``repeats`` timed runs)
    best = {"ours": float("inf"), "official": float("inf")}
    results = {}
    for _ in range(blocks):
        for side, fn in (("ours", ours), ("official", official)):
            if fn is None:
                continue
            results[side] = fn()  # (untimed)
            for _ in range(per_block):
                t0 = time.perf_counter()
                results[side] = fn()
                best[side] = min(best[side], time.perf_counter() - t0)
    return best["ours"], (best["official"] if official is not None else None), results


_OWN_NUMBA_CACHE: list = []  # the directory of own_numba_cache, once made


def own_numba_cache(package_cache: bool = False) -> dict:
    """The environment of a benchmark's fresh refimpl processes for Numba's on-disk cache: a directory of
    their own (``NUMBA_CACHE_DIR``, made once per benchmark and removed at its exit; its first, uncounted run
    compiles into it), so that a process loads what a user's first run put in the cache.  The package's own
    cache also holds every overload the test suite compiled (the tiny models' layer counts, other dtypes),
    and a fresh process loads every overload the cache holds of each kernel of its first audio.  Nothing
    (the package's cache, or the user's ``NUMBA_CACHE_DIR``) with ``package_cache``."""
    if package_cache:
        return {}
    if not _OWN_NUMBA_CACHE:
        import atexit
        import tempfile

        _OWN_NUMBA_CACHE.append(tempfile.mkdtemp(prefix="refimpl-bench-numba-"))
        atexit.register(shutil.rmtree, _OWN_NUMBA_CACHE[0], True)
    return {"NUMBA_CACHE_DIR": _OWN_NUMBA_CACHE[0]}


def official_available() -> bool:
    try:
        import qwen_tts  # noqa: F401
        import torch  # noqa: F401

        return True
    except Exception:
        return False
