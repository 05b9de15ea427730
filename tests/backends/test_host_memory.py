"""A model's workspace (refimpl/backends/host_memory.py): a buffer is handed out again only when nothing
refers to it any more, and what a workspace keeps between calls is bounded; the weights' copy into huge
pages."""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np
import pytest

from refimpl.backends import host_memory, numba_cpu, on_model_backend

MB = 1 << 20


def test_outside_a_call_new_output_is_a_new_array():
    a, b = host_memory.new_output((2, MB)), host_memory.new_output((2, MB))
    assert a.base is None and not np.shares_memory(a, b)


def test_a_buffer_is_handed_out_again_only_once_nothing_refers_to_it():
    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws):
        a = host_memory.new_output((3, MB), np.float32)
        assert a.ctypes.data % host_memory.ALIGNMENT == 0 and a.flags.c_contiguous and a.dtype == np.float32
        a[...] = 1.0
        b = host_memory.new_output((3, MB))
        assert not np.shares_memory(a, b)  # a is alive
        piece = a[1:, ::2]  # a view of a keeps its buffer
        address = a.ctypes.data
        del a
        c = host_memory.new_output((3, MB))
        assert not np.shares_memory(c, piece) and np.all(piece == 1.0)
        del piece
        d = host_memory.new_output((1, MB), np.float64)  # smaller, another dtype: the freed buffer serves it
        assert d.ctypes.data == address
        assert len(ws.buffers) == 3


def test_a_new_buffer_lets_the_free_ones_too_small_for_it_go():
    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws):
        small = host_memory.new_output((2, MB))
        del small
        big = host_memory.new_output((8, MB))
        assert len(ws.buffers) == 1 and ws.buffers[0].nbytes >= big.nbytes


def test_between_calls_a_workspace_keeps_its_largest_free_buffers_up_to_the_bound(monkeypatch):
    monkeypatch.setattr(host_memory, "RETAIN_BYTES", 32 * MB)
    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws):
        arrays = [host_memory.new_output((n, MB), np.uint8) for n in (30, 20, 5)]
        held = arrays.pop(1)  # still referred to when the call ends: kept, not counted
        del arrays
    assert sorted(b.nbytes // MB for b in ws.buffers) == [20, 30]
    del held
    with host_memory.recycled_outputs(ws):
        assert host_memory.new_output((25, MB), np.uint8).nbytes == 25 * MB
    assert [b.nbytes // MB for b in ws.buffers] == [30]  # 30 + 20 > 32: the largest stays


def test_nested_calls_on_one_workspace_trim_it_when_the_outermost_ends(monkeypatch):
    monkeypatch.setattr(host_memory, "RETAIN_BYTES", 0)
    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws):
        with host_memory.recycled_outputs(ws):
            host_memory.new_output((2, MB))
        assert len(ws.buffers) == 1  # the outer call may still take it
    assert ws.buffers == []


def test_two_threads_on_one_workspace_never_hold_the_same_buffer():
    ws, errors = host_memory.Workspace(), []
    barrier = threading.Barrier(4)

    def work(k):
        with host_memory.recycled_outputs(ws):
            barrier.wait()
            for _ in range(50):
                a = host_memory.new_output((MB,), np.uint8)
                a[...] = k
                if not np.all(a == k):
                    errors.append(k)
                del a

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(ws.buffers) <= 4


def test_every_public_model_method_takes_from_its_own_workspace():
    class Model:
        backend = None

        @on_model_backend
        def run(self):
            return host_memory.new_output((2, MB))

    first, second = Model(), Model()
    a = first.run()
    assert len(host_memory.workspace_of(first).buffers) == 1 and host_memory.workspace_of(second).buffers == []
    address = a.ctypes.data
    del a
    assert first.run().ctypes.data == address  # the next call takes the buffer the last one made


def test_thread_words_are_kept_per_thread_and_grow_with_room_to_spare():
    first = host_memory.thread_words(10)
    assert first.dtype == np.uint32 and first.shape[0] * 4 >= host_memory.THREAD_WORDS_MIN_BYTES
    assert host_memory.thread_words(first.shape[0]) is first  # enough: the same words
    grown = host_memory.thread_words(first.shape[0] + 1)
    assert grown.shape[0] >= 2 * first.shape[0] and host_memory.thread_words(5) is grown
    others = []
    thread = threading.Thread(target=lambda: others.append(host_memory.thread_words(10)))
    thread.start()
    thread.join()
    assert not np.shares_memory(others[0], grown)  # another thread's own


def test_a_copied_or_pickled_workspace_starts_empty():
    import copy
    import pickle

    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws):
        kept = host_memory.new_output((2, MB))
    for other in (copy.deepcopy(ws), pickle.loads(pickle.dumps(ws))):
        assert isinstance(other, host_memory.Workspace) and other.buffers == [] and other.depth == 0
    assert len(ws.buffers) == 1 and kept.base is ws.buffers[0]


@pytest.mark.parametrize("in_workspace", [False, True])
def test_whole_rows_reads_a_trimmed_output_in_place_only_inside_its_memory(in_workspace):
    ws = host_memory.Workspace()
    with host_memory.recycled_outputs(ws) if in_workspace else contextlib.nullcontext():
        full = host_memory.new_output((2, 3, MB // 8))
        full[...] = 2.0
        rows, T = numba_cpu.codec_decoder._whole_rows(full[:, :, :100])
        assert T == 100 and rows.shape == full.shape and np.shares_memory(rows, full)
        rows, T = numba_cpu.codec_decoder._whole_rows(full[:, 1:, :100])  # rows that do not follow each other: a copy
        assert rows.shape == (2, 2, 100) and not np.shares_memory(rows, full)


# ----------------------------------------------------------------------------- the weights' huge pages


def _matrices(rng):
    from refimpl.backends.bf16 import BF16Matrix

    words = [rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) for shape in ((33, 70), (5, 3), (128, 64))]
    for w in words:
        w.flags.writeable = False
    return [BF16Matrix(w) for w in words], [w.copy() for w in words]


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_a_matrix_points_at_its_copy_in_huge_pages_the_same_words_read_only():
    """copy_into_huge_pages: each matrix's words copied unchanged into one region, each on a cache line,
    read-only down to the region (so that layouts kept per read-only weight are kept for them), and its
    former words handed to ``release``."""
    from refimpl.backends.numba_cpu.kept import _read_only

    matrices, expected = _matrices(np.random.default_rng(0))
    former = [m.bits for m in matrices]
    released = []
    host_memory.copy_into_huge_pages(matrices, release=released.append)
    assert [id(w) for w in released] == [id(w) for w in former]
    for m, words, old in zip(matrices, expected, former, strict=True):
        assert m.bits is not old and m.bits.shape == words.shape and m.bits.dtype == np.uint16
        np.testing.assert_array_equal(m.bits, words)
        assert not m.bits.flags.writeable and _read_only(m.bits)
        assert m.bits.ctypes.data % host_memory.ALIGNMENT == 0
    assert matrices[0].bits.ctypes.data % host_memory.HUGE_PAGE_BYTES == 0


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_the_copy_later_runs_in_a_thread_and_can_be_waited_for():
    matrices, expected = _matrices(np.random.default_rng(1))
    former = [m.bits for m in matrices]
    thread = host_memory.copy_into_huge_pages_later(matrices)
    assert thread.daemon
    assert host_memory.wait_for_huge_pages(timeout=60) and not thread.is_alive()
    for m, words, old in zip(matrices, expected, former, strict=True):
        assert m.bits is not old
        np.testing.assert_array_equal(m.bits, words)


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_a_copy_waiting_for_frames_does_not_keep_its_matrices_alive(monkeypatch):
    """While the copy waits for the frames, a matrix nothing else holds any more is let go (a model dropped
    meanwhile); once the copy is wanted, the matrices still held are copied."""
    monkeypatch.setattr(host_memory, "_COPY_WANTED", threading.Event())  # (this process's frames not made yet)
    matrices, expected = _matrices(np.random.default_rng(2))
    former = matrices[1].bits
    dropped, kept = weakref.ref(matrices[0]), matrices[1]
    thread = host_memory.copy_into_huge_pages_later(matrices)
    del matrices
    assert dropped() is None and thread.is_alive()
    host_memory._COPY_WANTED.set()  # (as the frames do; not wait_for_huge_pages: other tests' copies wait too)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert kept.bits is not former
    np.testing.assert_array_equal(kept.bits, expected[1])


def _region(array: np.ndarray) -> dict:
    """The fields of /proc/self/smaps for the memory region that holds ``array``'s first byte: its
    ``AnonHugePages`` (kB) and its ``VmFlags`` (``hg`` where huge pages were asked for with ``madvise``)."""
    address, fields, inside = array.ctypes.data, None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                begin, end = (int(a, 16) for a in head.split("-"))
                inside = begin <= address < end
                if inside:
                    fields = {}
            elif inside and head == "AnonHugePages:":
                fields["AnonHugePages"] = int(line.split()[1])
            elif inside and head == "VmFlags:":
                fields["VmFlags"] = line.split()[1:]
    assert fields is not None, "no region of /proc/self/smaps holds the array"
    return fields


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_weights_made_at_the_load_are_collapsed_into_huge_pages_once_wanted(monkeypatch):
    """weights_array: from one huge page on, a region of its own on a 2 MB boundary, which a thread collapses
    into huge pages in place once the copies are wanted (the same address and bytes; where the kernel cannot
    collapse it now, the region is marked for its background collapse); none with REFIMPL_HUGE_PAGES=0.
    Smaller, on a cache line."""
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    words = host_memory.weights_array(3 * host_memory.HUGE_PAGE_BYTES + 5)
    assert words.dtype == np.uint8 and words.size == 3 * host_memory.HUGE_PAGE_BYTES + 5
    assert words.flags.writeable and words.ctypes.data % host_memory.HUGE_PAGE_BYTES == 0
    address = words.ctypes.data
    words[...] = np.arange(words.size) % 251
    assert host_memory.wait_for_huge_pages(timeout=60)
    region = _region(words)
    assert region["AnonHugePages"] >= 2048 or "hg" in region["VmFlags"]
    assert words.ctypes.data == address and np.array_equal(words, np.arange(words.size) % 251)
    del words

    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "0")
    threads = len(host_memory._COPYING)
    words = host_memory.weights_array(host_memory.HUGE_PAGE_BYTES)
    assert len(host_memory._COPYING) == threads and "hg" not in _region(words)["VmFlags"]
    small = host_memory.weights_array(1000)
    assert small.size == 1000 and small.ctypes.data % host_memory.ALIGNMENT == 0


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_a_collapse_waiting_for_frames_does_not_keep_its_weights_alive(monkeypatch):
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    words = host_memory.weights_array(host_memory.HUGE_PAGE_BYTES)
    dropped = weakref.ref(words)
    del words
    assert dropped() is None
    assert host_memory.wait_for_huge_pages(timeout=60)


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="huge pages: Linux")
def test_where_the_kernel_cannot_collapse_now_the_weights_are_marked_for_its_background_collapse(monkeypatch):
    """A kernel without MADV_COLLAPSE (before Linux 6.1) refuses the advice: the region is then marked
    ``MADV_HUGEPAGE`` (its ``hg`` flag), and the bytes stay as they were."""
    monkeypatch.setenv("REFIMPL_HUGE_PAGES", "1")
    monkeypatch.setattr(host_memory, "MADV_COLLAPSE", 1 << 20)  # (advice no kernel knows: EINVAL)
    words = host_memory.weights_array(host_memory.HUGE_PAGE_BYTES + 7)
    words[...] = 5
    assert host_memory.wait_for_huge_pages(timeout=60)
    assert "hg" in _region(words)["VmFlags"] and np.all(words == 5)
