"""The Talker's bf16 matrices in huge pages (refimpl/tts/model.py, refimpl/backends/host_memory.py): copied
on an idle core once the process's generations have made enough frames, and the same numbers whether a
generation reads the memory map, the copies, or the map and then the copies (a copy that lands between two
of its steps)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

from refimpl import Qwen3TTS
from refimpl.backends import host_memory
from refimpl.io.checkpoint import release_pages
from refimpl.porting import presets, synthetic
from refimpl.tts.model import matrices_for_huge_pages

pytestmark = pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")

TEXT = "Hello, world! This is a tiny text."
CALL = dict(
    chunk_frames=1, speaker="vivian", language="english", do_sample=False, subtalker_dosample=False, max_new_tokens=7
)


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """The tiny CustomVoice model stored in bfloat16, as the released checkpoints are."""
    directory = tmp_path_factory.mktemp("bf16-customvoice")
    synthetic.write_tts_model(directory, "custom_voice", "0b6", presets.TINY_TALKER_CUSTOMVOICE, dtype="bfloat16")
    return directory


def _in_the_map(a) -> bool:
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = getattr(a, "base", None)
    return False


def test_the_same_audio_from_the_map_the_copies_and_a_copy_made_between_two_steps(bf16_model, monkeypatch):
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "0")
    mapped = Qwen3TTS.from_pretrained(bf16_model)
    matrices = matrices_for_huge_pages(mapped.talker)
    assert len(matrices) > 10 and all(_in_the_map(m.bits) for m in matrices)
    from_map = np.concatenate(list(mapped.stream_custom_voice(TEXT, **CALL)))

    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    copied = Qwen3TTS.from_pretrained(bf16_model)
    assert host_memory.wait_for_huge_pages(timeout=120)
    assert not any(_in_the_map(m.bits) for m in matrices_for_huge_pages(copied.talker))
    from_copies = np.concatenate(list(copied.stream_custom_voice(TEXT, **CALL)))

    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "0")
    switching = Qwen3TTS.from_pretrained(bf16_model)
    stream = switching.stream_custom_voice(TEXT, **CALL)
    chunks = [next(stream), next(stream)]
    host_memory.copy_into_huge_pages(matrices_for_huge_pages(switching.talker), release=release_pages)
    chunks += list(stream)
    assert len(chunks) > 3
    np.testing.assert_array_equal(from_copies, from_map)
    np.testing.assert_array_equal(np.concatenate(chunks), from_map)


def test_a_generate_call_reads_the_same_numbers_while_the_copy_runs(bf16_model, monkeypatch):
    """The copy started by the load, racing a generation: the codes and the audio of a model whose copy is
    made first."""
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    host_memory.note_frames(host_memory.COPY_AFTER_FRAMES)  # (the copy starts at once, beside the generation)
    racing = Qwen3TTS.from_pretrained(bf16_model)
    call = {k: v for k, v in CALL.items() if k != "chunk_frames"}
    wav, _, codes = racing.generate_custom_voice(TEXT, return_codes=True, **call)
    assert host_memory.wait_for_huge_pages(timeout=120)
    again, _, codes_again = racing.generate_custom_voice(TEXT, return_codes=True, **call)
    np.testing.assert_array_equal(codes[0], codes_again[0])
    np.testing.assert_array_equal(wav[0], again[0])


WAITS_FOR_FRAMES = r"""
import sys
import numpy as np
from refimpl import Qwen3TTS
from refimpl.backends import host_memory
from refimpl.tts.model import matrices_for_huge_pages
def in_the_map(a):
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = getattr(a, "base", None)
    return False
tts = Qwen3TTS.from_pretrained(sys.argv[1])
call = dict(speaker="vivian", language="english", do_sample=False, subtalker_dosample=False, max_new_tokens=6)
made = sum(1 for _ in tts.stream_custom_voice("Hello, world!", chunk_frames=1, **call))  # a short generation
(copying,) = host_memory._COPYING
copying.join(timeout=2)
print(made, copying.is_alive(), all(in_the_map(m.bits) for m in matrices_for_huge_pages(tts.talker)))
host_memory.note_frames(host_memory.COPY_AFTER_FRAMES)  # as a long generation does
copying.join(timeout=120)
print(copying.is_alive(), any(in_the_map(m.bits) for m in matrices_for_huge_pages(tts.talker)))
"""


def test_the_copy_waits_for_a_generation_long_enough_to_pay_for_it(bf16_model):
    """In a fresh process: after a short generation the copy has not started (the matrices still in the
    map, its thread waiting); once the frames reach ``COPY_AFTER_FRAMES`` it is made."""
    env = {k: v for k, v in os.environ.items() if k != "REFIMPL_HUGE_PAGES"}
    r = subprocess.run(
        [sys.executable, "-c", WAITS_FOR_FRAMES, str(bf16_model)], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr
    short, long = (line.split() for line in r.stdout.strip().splitlines()[-2:])
    assert 0 < int(short[0]) < host_memory.COPY_AFTER_FRAMES and short[1:] == ["True", "True"]
    assert long == ["False", "False"]


def test_a_model_dropped_before_its_copy_is_let_go_and_not_copied(bf16_model, monkeypatch):
    """A model loaded and dropped before the process's generations made the frames (a notebook's model loaded
    again): its matrices die with it, not kept for the copy that waits, which then copies nothing."""
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    monkeypatch.setattr(host_memory, "_COPY_WANTED", threading.Event())  # (this process's frames not made yet)
    copied = []
    monkeypatch.setattr(host_memory, "copy_into_huge_pages", lambda matrices, release=None: copied.extend(matrices))
    before = list(host_memory._COPYING)
    tts = Qwen3TTS.from_pretrained(bf16_model)
    waiting = [t for t in host_memory._COPYING if t not in before]
    matrices = [weakref.ref(m) for m in matrices_for_huge_pages(tts.talker)]
    del tts
    gc.collect()
    assert len(matrices) > 10 and not any(ref() for ref in matrices)
    assert waiting and all(t.is_alive() for t in waiting)
    host_memory._COPY_WANTED.set()
    for t in waiting:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in waiting) and copied == []


def test_the_load_reads_a_page_of_each_matrix_beside_it_in_the_steps_order(bf16_model, monkeypatch):
    """A model's load starts one thread that maps the pages of the Talker's matrices (``read_every_page``: a
    byte of each page), those of ``matrices_for_huge_pages`` in their order, so that the prompt's parallel
    loops do not take the page faults; the words are unchanged."""
    import threading

    from refimpl.io import mapped_files

    read = []
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "0")
    monkeypatch.setattr(
        mapped_files, "read_every_page", lambda arrays: read.append((threading.current_thread().name, arrays))
    )
    loaded = Qwen3TTS.from_pretrained(bf16_model)
    matrices = matrices_for_huge_pages(loaded.talker)
    for _ in range(100):
        if read:
            break
        threading.Event().wait(0.01)
    assert [name for name, _ in read] == ["refimpl-talker-pages"]
    assert [a.ctypes.data for a in read[0][1]] == [m.bits.ctypes.data for m in matrices]
    words = [m.bits.copy() for m in matrices]
    monkeypatch.undo()
    mapped_files.read_every_page(read[0][1])
    assert all(np.array_equal(m.bits, w) for m, w in zip(matrices, words, strict=True))
