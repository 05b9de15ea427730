"""Pieces of work side by side on the BLAS threads (``pieces.run_pieces``): BLAS lent and given back, a forked
child's own pool, errors reaching the caller, and OpenBLAS's idle threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from refimpl.backends import numba_cpu


def test_two_callers_lending_blas_at_once_leave_it_its_threads():
    """Two threads decoding at once: the first in sets BLAS to one thread, the one that leaves first must
    not restore it while the other's pieces still run, and the last out restores the count from before."""
    import threadpoolctl

    def threads():
        return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]

    before = threads()
    if min(before, default=1) < 2:
        pytest.skip("BLAS runs one thread here: nothing is lent")
    controllers = numba_cpu.pieces._blas_controller()
    first, second = numba_cpu.pieces._blas_lent(controllers), numba_cpu.pieces._blas_lent(controllers)
    first.__enter__()
    second.__enter__()
    assert max(threads()) == 1
    first.__exit__(None, None, None)  # the first out, while the other's pieces still run
    assert max(threads()) == 1
    second.__exit__(None, None, None)
    assert threads() == before


def test_pieces_run_in_a_forked_child_after_the_parent_used_its_pool():
    """A forked process has none of the parent's threads: its pieces get a pool of their own (the parent's
    would accept them and never run them: a hang)."""
    import multiprocessing

    numba_cpu.pieces.run_pieces(lambda i: None, [(i,) for i in range(4)])  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_sum_in_pieces, (10,))
        assert result.get(timeout=60) == sum(range(10))


def _sum_in_pieces(n):
    seen = []
    numba_cpu.pieces.run_pieces(lambda i: seen.append(i), [(i,) for i in range(n)])
    return sum(seen)


def test_importing_refimpl_first_lets_idle_openblas_threads_sleep_unless_the_user_says_otherwise():
    code = "import os, refimpl, numpy; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    for preset, expected in ((None, "4"), ("12", "12")):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        env.update({"PYTHONPATH": str(REPO)} | ({"OPENBLAS_THREAD_TIMEOUT": preset} if preset else {}))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.split() == [expected], r.stderr


def test_pieces_run_side_by_side_and_their_errors_reach_the_caller():
    seen = set()

    def piece(i):
        seen.add(i)
        if i == 7:
            raise ValueError("piece 7")

    with pytest.raises(ValueError, match="piece 7"):
        numba_cpu.pieces.run_pieces(piece, [(i,) for i in range(10)])
    assert 7 in seen
    seen.clear()
    numba_cpu.pieces.run_pieces(lambda i: seen.add(i), [(i,) for i in range(10)])
    assert seen == set(range(10))


@pytest.mark.parametrize("threads", (1, 2, 3, 8))
@pytest.mark.parametrize("T", (1, 31, 32, 64, 100, 128, 640, 1000, 2560, 7680, 240000))
@pytest.mark.parametrize("most", (64, 1024, 1000))
def test_time_pieces_tile_the_steps_in_even_shares(monkeypatch, threads, T, most):
    """The pieces of a push cover its steps once, in order, none over ``most``, all but the last a whole
    number of blocks where ``most`` is; and as even as blocks allow: no piece over an even share of the
    threads' rounds (a short push split between the threads, not left to one) by more than a block."""
    monkeypatch.setattr(numba_cpu.pieces, "_piece_threads", lambda: threads)
    pieces = numba_cpu.pieces.time_pieces(T, most, 64)
    assert [t0 for t0, _ in pieces] == list(range(0, T, pieces[0][1]))
    assert sum(n for _, n in pieces) == T and all(0 < n <= most for _, n in pieces)
    if most % 64 == 0:
        assert all(n % 64 == 0 for _, n in pieces[:-1])
    rounds = -(-T // (threads * most))  # pieces per thread, the fewest that pieces of ``most`` allow
    assert len(pieces) <= threads * rounds
    assert pieces[0][1] < T / (threads * rounds) + 64


def test_the_caller_takes_pieces_in_turn_and_each_piece_runs_once(monkeypatch):
    """The calling thread is one of the piece threads (a call wakes one pool thread fewer): the pieces are
    shared between it and the pool's threads, each run once."""
    import threading
    import time

    monkeypatch.setattr(numba_cpu.pieces, "_piece_threads", lambda: 2)
    runs, lock = [], threading.Lock()

    def piece(i):
        time.sleep(0.005)
        with lock:
            runs.append((i, threading.current_thread().name))

    numba_cpu.pieces.run_pieces(piece, [(i,) for i in range(12)])
    assert sorted(i for i, _ in runs) == list(range(12))
    names = {name for _, name in runs}
    assert threading.current_thread().name in names
    assert any(name.startswith("refimpl-piece") for name in names)


def test_after_a_piece_fails_no_piece_starts_and_none_still_runs_when_the_error_arrives(monkeypatch):
    """A failed piece ends the call once the pieces already started have ended: none of them writes into
    the caller's outputs after it has the error, and the pieces not yet started never start."""
    import threading
    import time

    monkeypatch.setattr(numba_cpu.pieces, "_piece_threads", lambda: 2)
    started, ended, lock = set(), set(), threading.Lock()

    def piece(i):
        with lock:
            started.add(i)
        if i == 1:
            raise ValueError("piece 1")
        time.sleep(0.05)
        with lock:
            ended.add(i)

    with pytest.raises(ValueError, match="piece 1"):
        numba_cpu.pieces.run_pieces(piece, [(i,) for i in range(10)])
    with lock:
        at_the_error = (set(started), set(ended))
    assert at_the_error[1] == at_the_error[0] - {1}  # every piece started had ended
    assert len(at_the_error[0]) < 10
    time.sleep(0.2)
    assert (started, ended) == at_the_error  # and nothing started after


def test_blas_loaded_by_scipy_after_the_first_pieces_is_lent_too():
    """SciPy's BLAS library, loaded with ``scipy.linalg`` after the pieces first ran, is held to one thread
    with NumPy's while pieces run (the handle on the libraries was once kept from the first call)."""
    code = (
        "import refimpl, threadpoolctl\n"
        "from refimpl.backends.numba_cpu import pieces\n"
        "pieces.run_pieces(lambda i: None, [(0,), (1,)])\n"
        "import scipy.linalg\n"
        "blas = [i for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
        "with pieces._blas_lent(pieces._blas_controller()):\n"
        "    lent = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
        "print(len(blas), min(i['num_threads'] for i in blas), max(lent))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    libraries, threads_before, threads_lent = map(int, r.stdout.split())
    if libraries < 2 or threads_before < 2:
        pytest.skip("SciPy shares NumPy's BLAS here, or BLAS runs one thread")
    assert threads_lent == 1
