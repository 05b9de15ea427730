"""The environment variables refimpl reads, and how it reads them (the table: docs/limits.md#the-environment).

Switches (``REFIMPL_DEBUG``, ``REFIMPL_AMX``, ``REFIMPL_PACKED``, ``REFIMPL_HUGE_PAGES``,
``REFIMPL_COMPILE_HELPER``) take 1 or 0 (also true/false, yes/no, on/off, in any case); unset or empty is the
default.  Any other value is a ValueError naming the variable: a typo (``REFIMPL_AMX=flase``) must not
silently keep the default.  The command line checks every switch before it does any work (``check_switches``).

``REFIMPL_BACKEND`` names a backend (``refimpl/backends/__init__.py``, checked there when the first network
runs); the ``NUMBA_*`` variables that change what the numba backend does are checked by that backend before
Numba reads them (``refimpl/backends/numba_cpu/runtime.py``).

A leaf module: it imports nothing of the package, so that every layer may use it.
"""

from __future__ import annotations

import os

__all__ = ["SWITCHES", "switch", "check_switches"]

# name -> (default, what turning it on or off does)
SWITCHES = {
    "REFIMPL_DEBUG": (False, "1: an internal error (exit status 3) prints its traceback"),
    "REFIMPL_AMX": (True, "0: the numba backend does not use the AMX tile registers"),
    "REFIMPL_PACKED": (True, "0: the numba backend reads the code predictor's words as stored, not packed"),
    "REFIMPL_HUGE_PAGES": (True, "0: no huge pages (bfloat16 weights stay memory-mapped, packed words in 4 KB pages)"),
    "REFIMPL_COMPILE_HELPER": (True, "0: a first run compiles the numba backend's kernels in its own process alone"),
}
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def switch(name: str) -> bool:
    """The value of switch ``name`` (a key of ``SWITCHES``): its default when unset or empty, else 1 / 0;
    ValueError naming the variable for anything else."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return SWITCHES[name][0]
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw[:40]!r}: expected 1 or 0 (or true/false, yes/no, on/off)")


def check_switches() -> None:
    """ValueError for the first switch set to something that is not 1 or 0."""
    for name in SWITCHES:
        switch(name)
