"""Independent pieces of work side by side on the BLAS threads (``run_pieces``): while they run, BLAS is held
to one thread per call and its threads are lent to the pieces."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from concurrent import futures

import threadpoolctl


def _blas_controller():
    """threadpoolctl's handle on the BLAS libraries loaded in this process: NumPy's, and SciPy's own once
    ``scipy.linalg`` has loaded it (its BLAS extension imported), whenever that happens."""
    return _blas_controller_of("scipy.linalg._fblas" in sys.modules)


@functools.cache
def _blas_controller_of(scipy_blas_loaded: bool):
    """``_blas_controller``, looked up once with SciPy's BLAS and once without (a lookup scans the process's
    libraries)."""
    return threadpoolctl.ThreadpoolController().select(user_api="blas")


@functools.cache
def _piece_workers(n: int, pid: int) -> futures.ThreadPoolExecutor:
    """The pool of ``n`` piece threads of process ``pid`` (``run_pieces``'s caller is one more): a process
    forked from this one has none of its threads, so it makes its own pool (the parent's would take work and
    never run it)."""
    return futures.ThreadPoolExecutor(n, thread_name_prefix="refimpl-piece")


def _piece_threads() -> int:
    """How many threads ``run_pieces`` runs pieces on: as many as BLAS has."""
    return min([lib.num_threads for lib in _blas_controller().lib_controllers] or [1])


def run_pieces(piece, pieces: list) -> None:
    """``piece(*p)`` for every ``p`` in ``pieces`` (independent pieces of work writing disjoint outputs), on as
    many threads as BLAS has, BLAS running one thread per call meanwhile: its threads are lent to the pieces,
    so that each piece is one core's from its input to its output (the Numba kernels release the GIL), the
    elementwise work between the matrix products runs on every core too, and no thread spins waiting for
    another (Numba's parallel loops between BLAS calls did, and slowed the whole decode).  The caller is one
    of those threads: it takes pieces in turn with the others (``_Turns``), so it works instead of waking as
    each piece ends and a call wakes one thread fewer, and a piece that takes its thread's scratch
    (``host_memory.thread_words``) may take the caller's: words the caller holds across the call must come
    from elsewhere.  Each piece computes the same bits whichever thread runs it."""
    controllers, n_threads = _blas_controller(), _piece_threads()
    if n_threads <= 1 or len(pieces) < 2 or threading.current_thread().name.startswith("refimpl-piece"):
        for p in pieces:
            piece(*p)
        return
    with _blas_lent(controllers):
        turns = _Turns(piece, pieces)
        workers = _piece_workers(n_threads - 1, os.getpid())
        helpers = [workers.submit(turns.take) for _ in range(min(n_threads, len(pieces)) - 1)]
        try:
            turns.take()
        finally:
            futures.wait(helpers)  # (no piece still running once this call has returned or raised)
        for f in helpers:
            f.result()  # (a helper's error)


class _Turns:
    """The pieces of one ``run_pieces`` call, each run by whichever of its threads asks next (``take``);
    after an error, no new piece starts."""

    def __init__(self, piece, pieces: list) -> None:
        self.piece, self.left, self.lock, self.failed = piece, iter(pieces), threading.Lock(), False

    def take(self) -> None:
        """Run the next piece not yet taken, until none is left."""
        while True:
            with self.lock:
                p = None if self.failed else next(self.left, None)
            if p is None:
                return
            try:
                self.piece(*p)
            except BaseException:
                self.failed = True
                raise


def time_pieces(T: int, most: int, step: int) -> list:
    """(t0, n) of the pieces of T time steps that ``run_pieces`` shares out: pieces of at most ``most`` steps,
    each a whole number of ``step`` steps but the last, as even between the threads as whole steps allow
    (at most ``rounds`` a thread, the fewest rounds that pieces of ``most`` steps need).  A short push (a
    streamed chunk: 128 steps at the decoder's first block) is split between the threads instead of left
    to one."""
    if T <= 0:
        return []
    threads = _piece_threads()
    rounds = -(-T // (threads * most))  # pieces per thread
    n = min(most, -(-T // (threads * rounds * step)) * step)
    return [(t0, min(n, T - t0)) for t0 in range(0, T, n)]


_LENDING = threading.Lock()
_lending = {"runs": 0, "limiter": None}  # how many run_pieces hold BLAS at one thread now, and the limit's handle


@contextlib.contextmanager
def _blas_lent(controllers):
    """BLAS at one thread per call while any caller's pieces run: the first caller in sets the limit, the
    last one out restores the thread count from before (two threads decoding at once must not leave BLAS
    on one thread, as nested set-and-restore in the wrong order would)."""
    with _LENDING:
        if _lending["runs"] == 0:
            _lending["limiter"] = controllers.limit(limits=1)
        _lending["runs"] += 1
    try:
        yield
    finally:
        with _LENDING:
            _lending["runs"] -= 1
            if _lending["runs"] == 0:
                _lending["limiter"].restore_original_limits()
