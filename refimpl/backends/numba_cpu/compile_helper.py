"""A first run's second core: a helper process that compiles the code predictor's and the codec decoder's
kernels while this one compiles the prompt's.

Numba compiles one kernel at a time in a process (its compiler lock), so a first run on a machine, its cache
empty, compiles for most of a minute on one core while the others wait.  When a model's load finds the cache
without its code predictor's first kernel for this machine (``first_run_here``), it starts the helper the
model's load names (``start``): a fresh Python process, ``python -m refimpl.tts.warm_up MODEL``, that loads
the same model and runs, on zeros, what a generation reaches last (a code predictor's frame, then the codec
decoder's streamed pushes and a whole decode).  Their kernels go into the same cache, keyed by their argument
types, so this process, compiling the prompt's kernels meanwhile, finds them there at their first calls and
loads them: the machine code its own compile would have made.  A kernel the helper has not finished when this
process needs it is compiled here as before.

The helper is not started with one core (nothing runs beside it), from a helper, nor with
``REFIMPL_COMPILE_HELPER=0``; it writes nothing but Numba's cache, and a process that exits first stops it
(``stop``).  Without the helper the run computes the same bits: only where each kernel was compiled changes."""

from __future__ import annotations

import atexit
import os
import subprocess
import threading

from ...environment import switch
from . import cached_kernels

SWITCH = "REFIMPL_COMPILE_HELPER"

_HELPER: list = []  # the helper process started in this process, if any (once a process)
_START = threading.Lock()


def wanted() -> bool:
    """Whether this process may start a helper: ``REFIMPL_COMPILE_HELPER`` on (its default; a value that is not
    1 or 0 is the switch's ValueError, raised here on the caller's thread) and a second core to run it on.
    A helper's environment turns the switch off, so that it starts none."""
    return switch(SWITCH) and _cores() >= 2


def _cores() -> int:
    """The cores this process may run on (its affinity, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def first_run_here(bf16: bool) -> bool:
    """Whether the kernels of a model's generation are still to be compiled on this machine: the kernel that
    its code predictor's frame compiles first neither in this process nor in Numba's cache for this machine (a
    first run, or the first after the package changed: its cache entries are keyed by the package's source).
    That kernel is the code predictor's stack for ``bf16`` weights (as released); for float32 ones, which run
    the primitives, the decoder's last conv, which every model's decode compiles."""
    from .codec_decoder import _snake_conv_few_into
    from .transformer import _decoder_steps_bf16

    kernel = _decoder_steps_bf16 if bf16 else _snake_conv_few_into
    return not kernel.overloads and cached_kernels.cached_overloads(kernel) == 0


def start_on_a_first_run(command: list, bf16: bool) -> None:
    """Start the helper ``command`` where the model's kernels are still to be compiled (``first_run_here``):
    called by the thread that loads the first audio's kernels (``cached_kernels.load_ahead``), after it has,
    beside the load.  Where the cache held the marker kernel, that thread loaded it, so the check reads no
    index again; on a first run the loads found nothing, and took next to no time."""
    if first_run_here(bf16):
        start(command)


def start(command: list) -> subprocess.Popen | None:
    """Start the helper ``command`` (once a process; None when one was started before), its output discarded,
    Numba's settings and the cache directory those of this process (its environment, the switch turned off),
    and waited for by a thread of its own (no process left behind unreaped); ``stop`` runs at this process's
    exit.  (A helper that finds another package on its path than this process's, or none, compiles nothing
    this process uses, or fails: either way this process compiles its kernels as it would alone.)"""
    with _START:
        if _HELPER:
            return None
        helper = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **{SWITCH: "0"}),
        )
        _HELPER.append(helper)
    threading.Thread(target=helper.wait, name="refimpl-compile-helper", daemon=True).start()
    atexit.register(stop)
    return helper


def stop() -> None:
    """Stop the helper if it is still running (what it has not put in the cache yet, the next first call
    compiles)."""
    for helper in _HELPER:
        if helper.poll() is None:
            helper.terminate()
            try:
                helper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
