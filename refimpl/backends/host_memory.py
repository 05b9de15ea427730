"""Where a model's big host arrays live: a workspace for what its calls make, huge pages for its weights.

A new NumPy array of tens of megabytes is fresh memory: the kernel maps and zeroes every page on its
first write, and here (a virtual machine, transparent huge pages) a fresh 92 MB array, the decoder's
96 x 240000 float32 residual-unit output for 10 s, took about 210 ms of page faults where memory just
given back took 22 ms.  Each call would pay that again: the arrays die, their pages go back to the
system, the next call maps new ones.  GGML keeps one compute buffer per graph for the same reason.

Every public method of a model runs inside ``recycled_outputs(workspace_of(model))``
(``on_model_backend``).  Within it, ``new_output(shape, dtype)`` (the Numba twins' big outputs,
``refimpl/backends/numba_cpu/``; the reference NumPy code allocates as NumPy does) hands out the
smallest buffer of the workspace that nothing refers to any more and holds the array, else a new one.
"Nothing refers to it" is read from the reference count: the workspace's list holds the buffer, and every
array or view made from it holds the buffer too (NumPy points a view at the array owning the memory), so a
buffer only the list holds cannot be seen by anyone.  When the outermost call on the workspace ends, it
keeps its largest free buffers up to ``RETAIN_BYTES`` (four 92 MB buffers for a 10 s decode) and lets
the others go; a model's workspace lives as long as the model.

The weights the kernels stream are placed too: a float32 model's bfloat16 matrices (all but the
embedding tables, read by rows) are read into anonymous memory backed by transparent 2 MB huge pages
(``huge_page_array``), not left in the file's memory map.  The matrix-vector products stream every weight
once per step, and in memory-mapped 4 KB pages the hardware prefetcher stops at every page end
(docs/performance.md: about 15% of a frame).  A model's matrices are copied there by a thread
that runs only on an idle core (``copy_into_huge_pages_later``), once the process's generations have made
``COPY_AFTER_FRAMES`` frames (``note_frames``): the copy (every matrix a step reads whole) is
neither on the way to the first audio nor paid by a short generation (a sentence from the command line),
and a long generation, or a server's next calls, read the copy.  The kernels read the memory map until a
matrix's copy is made, then the copy (the same words: no number changes).  The code predictor's packed
words, made at the load in 4 KB pages, are collapsed into huge pages in place by such a thread
(``weights_array``).  ``REFIMPL_HUGE_PAGES=0`` keeps the memory map and asks for no huge pages."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from ..environment import switch

RECYCLE_MIN_BYTES = 1 << 20  # smaller arrays come from malloc's heap, whose pages stay mapped
RETAIN_BYTES = 512 << 20  # free buffers a workspace keeps between calls, at most
ALIGNMENT = 64  # bytes: a cache line (np.empty gives 16)


class Workspace:
    """One model's buffers (uint8 arrays that own their memory, each ALIGNMENT bytes longer than the
    largest array it serves) and a lock: two threads calling one model must not take the same free one."""

    def __init__(self):
        self.buffers = []
        self.lock = threading.Lock()
        self.depth = 0  # calls on it in progress

    def __reduce__(self):
        """A pickled or deep-copied model starts with an empty workspace (buffers are scratch, a lock cannot
        be copied)."""
        return (Workspace, ())

    def free(self) -> list:
        """Indices of the buffers nothing refers to but this list."""
        return [i for i in range(len(self.buffers)) if _references(self.buffers, i) <= _ONLY_LISTED]

    def trim(self) -> None:
        """Keep the largest free buffers up to ``RETAIN_BYTES`` in all; let the other free ones go."""
        with self.lock:
            kept = 0
            for i in sorted(self.free(), key=lambda i: -self.buffers[i].nbytes):
                kept += self.buffers[i].nbytes
                if kept > RETAIN_BYTES:
                    self.buffers[i] = None
            self.buffers = [b for b in self.buffers if b is not None]


def _references(buffers: list, i: int) -> int:
    """The reference count of ``buffers[i]`` as this function sees it (compared with ``_ONLY_LISTED``,
    counted by this same function, so that the interpreter's own references cancel out)."""
    return sys.getrefcount(buffers[i])


_ONLY_LISTED = _references([np.empty(0, np.uint8)], 0)  # a buffer nothing but its list refers to
_active = threading.local()  # .stack: the workspaces of this thread's calls in progress, innermost last


def workspace_of(model) -> Workspace:
    """The model's workspace (made on its first call)."""
    return model.__dict__.setdefault("_workspace", Workspace())


@contextlib.contextmanager
def recycled_outputs(workspace: Workspace):
    """Within it, ``new_output`` takes from ``workspace``; when the outermost call on it ends, it is trimmed."""
    stack = _active.__dict__.setdefault("stack", [])
    stack.append(workspace)
    with workspace.lock:
        workspace.depth += 1
    try:
        yield
    finally:
        stack.pop()
        with workspace.lock:
            workspace.depth -= 1
            last = workspace.depth == 0
        if last:
            workspace.trim()


def new_output(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised array (like ``np.empty``), within ``recycled_outputs`` the smallest free buffer of
    the workspace that holds it.  When a new buffer is made, the free ones too small for it are let go
    (an earlier stage's: the decoder's stages grow from 12 to 92 MB)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    stack = getattr(_active, "stack", None)
    if not stack or nbytes < RECYCLE_MIN_BYTES:
        return np.empty(shape, dtype)
    workspace = stack[-1]
    with workspace.lock:  # (the view made inside: its reference counts before another thread looks)
        buffers = workspace.buffers
        free = workspace.free()
        fits = [i for i in free if buffers[i].nbytes >= nbytes + ALIGNMENT]
        if fits:
            return _aligned(buffers[min(fits, key=lambda i: buffers[i].nbytes)], nbytes).view(dtype).reshape(shape)
        for i in reversed(free):  # all of them are too small
            del buffers[i]
        buffers.append(np.empty(nbytes + ALIGNMENT, np.uint8))
        return _aligned(buffers[-1], nbytes).view(dtype).reshape(shape)


def _aligned(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """The ``nbytes`` of ``raw`` from its first ALIGNMENT-aligned byte: a view whose base is ``raw``."""
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes]


# ----------------------------------------------------------------------------- the bfloat16 matrices' pages

HUGE_PAGE_BYTES = 2 << 20  # the x86-64 transparent huge page
_HUGE_PAGES_ENV = "REFIMPL_HUGE_PAGES"


def huge_pages_enabled() -> bool:
    """Whether bfloat16 matrices are read into anonymous memory backed by 2 MB huge pages (Linux, where
    ``madvise(MADV_HUGEPAGE)`` exists; ``REFIMPL_HUGE_PAGES=0`` keeps them memory-mapped instead)."""
    return hasattr(mmap, "MADV_HUGEPAGE") and switch(_HUGE_PAGES_ENV)


def huge_page_array(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` (> 0) in one anonymous memory region backed by transparent 2 MB
    huge pages, starting on a 2 MB boundary (the region lives as long as the array and its views)."""
    return _anonymous_array(nbytes, huge=True)


def _anonymous_array(nbytes: int, huge: bool) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` (> 0) in an anonymous memory region of its own, from a 2 MB
    boundary; its pages asked for as transparent huge pages (``madvise(MADV_HUGEPAGE)``) where ``huge``."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    lead = -np.frombuffer(region, dtype=np.uint8, count=1).ctypes.data % HUGE_PAGE_BYTES  # to a 2 MB boundary
    if huge:
        region.madvise(mmap.MADV_HUGEPAGE, lead, nbytes)
    return np.frombuffer(region, dtype=np.uint8, count=nbytes, offset=lead)


def weights_array(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` on a cache line, for words made at the load that every step
    reads whole (the code predictor's packed words).  From ``nbytes`` of one huge page on, a region of its
    own on a 2 MB boundary, in 4 KB pages, collapsed into huge pages in place by an idle thread once
    generations have made ``COPY_AFTER_FRAMES`` frames (``collapse_into_huge_pages_later``; not with
    ``REFIMPL_HUGE_PAGES=0``): in 4 KB pages the hardware prefetcher stops at every page end, and fresh
    huge pages are slow to fault in on the way to a fresh process's first audio.  Smaller, from the heap."""
    if nbytes < HUGE_PAGE_BYTES:
        return _aligned(np.empty(nbytes + ALIGNMENT, np.uint8), nbytes)
    array = _anonymous_array(nbytes, huge=False)
    if huge_pages_enabled():
        collapse_into_huge_pages_later(array)
    return array


THREAD_WORDS_MIN_BYTES = 2 << 20  # a thread's first scratch words: a short push's stages all fit in them
_THREAD_SCRATCH = threading.local()  # .words: this thread's scratch words (thread_words)


def thread_words(n: int) -> np.ndarray:
    """At least ``n`` 32-bit words (uint32) of this thread's, kept from call to call: the scratch of the codecs'
    pieces of work (the tiles' units, the direct kernel's rows); when too few, made anew
    with room to spare (``THREAD_WORDS_MIN_BYTES`` at first, then at least twice as many).  Fresh memory
    faults page by page at its first touch, and a push's stages ask for more words at each wider stage: made
    just large enough, each stage's words were fresh pages, where these are the pages the stage before
    touched (a fresh process's first push; a long-running one has its words already)."""
    words = getattr(_THREAD_SCRATCH, "words", None)
    if words is None or words.shape[0] < n:
        least = THREAD_WORDS_MIN_BYTES // 4 if words is None else 2 * words.shape[0]
        words = _THREAD_SCRATCH.words = np.empty(max(n, least), np.uint32)  # (its pages touched as used)
    return words


def copy_into_huge_pages(matrices, release=None) -> None:
    """Copy the words of each ``BF16Matrix`` of ``matrices`` (host words) into one region of huge pages, each
    on a cache line, and point the matrix at its copy as soon as that is made: one assignment of
    ``matrix.bits``, so a call in progress keeps the words it was given and the next call reads the copy (the
    same bytes: no result changes).  The copies are read-only arrays over the region.  ``release(words)``, if
    given, is called with each matrix's former words after the switch (the loader gives the memory map's
    pages back)."""
    matrices = [m for m in matrices if isinstance(m.bits, np.ndarray) and m.bits.nbytes]
    places, total = [], 0
    for m in matrices:
        places.append(total)
        total += -(-m.bits.nbytes // ALIGNMENT) * ALIGNMENT
    if not total:
        return
    arena = huge_page_array(total)
    # the copies are views of a read-only view of the region, so that layouts kept per read-only weight
    # (``numba_cpu/kept.py``) are kept for them too: the writable ``arena`` is only written here
    readable = np.frombuffer(memoryview(arena).toreadonly(), dtype=np.uint8)
    for m, at in zip(matrices, places, strict=True):
        words = m.bits
        np.copyto(arena[at : at + words.nbytes].view(words.dtype).reshape(words.shape), words)
        m.bits = readable[at : at + words.nbytes].view(words.dtype).reshape(words.shape)
        if release is not None:
            release(words)


COPY_AFTER_FRAMES = 25  # frames (2 s of audio) the process's generations make before the copy starts


def copy_into_huge_pages_later(matrices, release=None) -> threading.Thread:
    """``copy_into_huge_pages`` in a daemon thread that waits until the process's generations have made
    ``COPY_AFTER_FRAMES`` frames (``note_frames``; or ``wait_for_huge_pages`` asks for the copy), then runs
    only on a core nothing else wants (Linux ``SCHED_IDLE``; elsewhere the lowest priority it grants):
    between a generation's parallel loops, and between calls.  The thread holds the matrices weakly: those of
    a model dropped while it waits are neither kept alive for it nor copied.  A copy that fails (no memory for
    the region) leaves the matrices on their memory map, with a warning.  Returns the thread (``join`` waits
    for the copy, once it is wanted)."""
    return _start_when_wanted(_copy, matrices, release)


def _start_when_wanted(work, objects, *args) -> threading.Thread:
    """Start a daemon thread that waits until the copies are wanted (``note_frames``, ``wait_for_huge_pages``),
    then runs ``work(live, *args)`` on an idle core (``_run_when_idle``), ``live`` the ones of ``objects`` still
    alive: it holds them weakly meanwhile, so that none is kept alive for it.  ``wait_for_huge_pages`` waits
    for it."""
    refs = [weakref.ref(obj) for obj in objects]
    thread = threading.Thread(target=_when_wanted, args=(work, refs, args), name="refimpl-huge-pages", daemon=True)
    thread.start()
    _COPYING.append(thread)
    return thread


def _when_wanted(work, refs: list, args: tuple) -> None:
    _COPY_WANTED.wait()
    _run_when_idle()
    work([obj for obj in (ref() for ref in refs) if obj is not None], *args)


_COPYING: list = []  # the threads _start_when_wanted started (the copies, the collapses)
_FRAMES = [0]  # frames the process's generations have made (note_frames)
_COPY_WANTED = threading.Event()  # set: the copies may start


def note_frames(n: int = 1) -> None:
    """Count ``n`` frames made by a generation; at ``COPY_AFTER_FRAMES`` the copies into huge pages start."""
    _FRAMES[0] += n
    if _FRAMES[0] >= COPY_AFTER_FRAMES and not _COPY_WANTED.is_set():
        _COPY_WANTED.set()


def wait_for_huge_pages(timeout: float | None = None) -> bool:
    """Start the copies into huge pages (and the collapses) made ready so far, if they wait for frames, and
    wait until they are made (a benchmark of the steady state waits, so as to time the frames as a
    long-running process has them); whether they all are."""
    _COPY_WANTED.set()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in list(_COPYING):
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    _COPYING[:] = [t for t in _COPYING if t.is_alive()]
    return not _COPYING


MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)  # Linux 6.1: collapse a range into huge pages now


def collapse_into_huge_pages_later(array: np.ndarray) -> threading.Thread:
    """In a daemon thread that waits as ``copy_into_huge_pages_later``'s does (the frames, then an idle core),
    collapse the pages of ``array`` (one from ``_anonymous_array``) into huge pages in place
    (``madvise(MADV_COLLAPSE)``): the same addresses and bytes, so nothing that holds the array notices.
    Where the kernel cannot (before Linux 6.1, or no huge page free), the range is marked for its
    background collapse instead (``MADV_HUGEPAGE``).  The thread holds a weak reference: an array dropped
    meanwhile is not kept alive for it.  Returns the thread (``wait_for_huge_pages`` waits for it too)."""
    return _start_when_wanted(_collapse, [array])


def _collapse(arrays: list) -> None:
    for array in arrays:  # (the array, or none where it was dropped)
        region = array.base.obj  # the anonymous map (np.frombuffer of it: a memoryview of the map)
        start = array.ctypes.data - np.frombuffer(region, dtype=np.uint8, count=1).ctypes.data
        try:
            region.madvise(MADV_COLLAPSE, start, array.nbytes)
        except OSError:
            with contextlib.suppress(OSError):
                region.madvise(mmap.MADV_HUGEPAGE, start, array.nbytes)


def _run_when_idle() -> None:
    """Have this thread run only on a core nothing else wants (Linux ``SCHED_IDLE``; elsewhere the lowest
    priority it grants)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # (Linux: this thread only)
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _copy(matrices: list, release) -> None:
    try:
        copy_into_huge_pages(matrices, release)
    except (OSError, MemoryError, ValueError) as e:
        warnings.warn(
            f"the weights stay memory-mapped: no huge pages for their copy ({e})", RuntimeWarning, stacklevel=1
        )
