"""The tests of ``refimpl/backends/numba_cpu/``: a test module for each of its modules, helpers in ``cases.py``."""
