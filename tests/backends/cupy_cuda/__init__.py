"""The tests of ``refimpl/backends/cupy_cuda/`` without a GPU: a test module for each of its rooms, the CUDA
kernels replayed in NumPy in ``replays.py``, the plugin ``twins_on_strict.py``.  On a GPU:
tests/backends/test_cuda.py."""
