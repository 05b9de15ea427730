"""The kernels a model's first audio calls, brought from Numba's on-disk cache ahead of their first call, in a
thread that a model's load starts (``load_ahead``), while the load goes on beside it (the weights' check and
the codec's load spend their time in NumPy loops that release the interpreter).

A kernel's first call in a fresh process loads its compiled code from the cache (``runtime``: without setting
up Numba's registries, which only compiling needs), each kernel's object code linked into memory. Done at the
first calls, all of that waits on the prompt's path; done here, it overlaps the load. Only what the cache holds
for this machine is loaded: a kernel never compiled (or whose entries the package's source no longer matches)
is left to its first call, which compiles it as before. The same machine code runs either way: a loaded
overload is the one the first call would have loaded."""

from __future__ import annotations

import contextlib
import importlib
import threading

from . import runtime

# The first audio's kernels (``Qwen3TTS.stream_*``: the code predictor's packing, the prompt, a frame, the
# first chunk's decode), module and name, in the order of their first calls.  A kernel missing here is
# loaded at its first call as before (tests/backends/numba_cpu/test_cached_kernels.py checks the list
# against a generation's first calls).  The AMX tiles' kernels are first called where the processor has
# them (the prompt's products, a step's, the decoder's long units); elsewhere their cache holds nothing
# to load.
FIRST_AUDIO = (
    ("packed_words", "_packings"),
    ("amx", "_tiles_take"),
    ("amx", "_tile_bf16_times"),
    ("amx", "_tile_few_rows_times"),
    ("linear", "_bf16_block_times"),
    ("elementwise", "_silu_into"),
    ("linear", "_matvec_bf16_into"),
    ("transformer", "_decoder_steps_bf16"),
    ("elementwise", "_rms_norm_rows"),
    ("packed_words", "_packed_products_into"),
    ("conv", "_stack_taps_into"),
    ("attention", "_masked_softmax_rows"),
    ("conv", "_few_frames_times"),
    ("conv", "_overlap_add_into"),
    ("intrinsics", "_rows_on_cache_lines"),
    ("linear", "_rows_times_f32"),
    ("elementwise", "_gelu_erf_into"),
    ("elementwise", "_snake_rows_into"),
    ("codec_decoder", "_snake_context_into"),
    ("amx_conv", "_unit_scratch_words"),
    ("amx_conv", "_split_weight_into_tiles"),
    ("codec_decoder", "_snake_taps_into"),
    ("codec_decoder", "_unit_piece_on_tiles"),
    ("codec_decoder", "_unit_convs_direct"),
    ("elementwise", "_add_bias_and_residual"),
    ("conv", "_direct_conv_into"),
    ("codec_decoder", "_snake_conv_few_into"),
)

_THREADS: list = []  # the thread of load_ahead, once started (once a process)
_START = threading.Lock()


def load_ahead(then=None) -> None:
    """Start loading ``FIRST_AUDIO``'s cached kernels in a thread (once a process; a later call does nothing);
    ``then``: what that thread does after, if anything (``then()``: a first run's helper process started,
    ``compile_helper``, which finds the loaded kernels in the process; its error, if any, only stops it)."""
    with _START:
        if not _THREADS:
            thread = threading.Thread(target=_load_first_audio, args=(then,), name="refimpl-kernels", daemon=True)
            _THREADS.append(thread)
            thread.start()


def wait_for_loading() -> None:
    """Return when ``load_ahead``'s thread has finished (at once if it never started)."""
    for thread in _THREADS:
        thread.join()


def _load_first_audio(then) -> None:
    try:
        for module, name in FIRST_AUDIO:
            load_cached(getattr(importlib.import_module(f"{__package__}.{module}"), name))
    except Exception:  # (a Numba without these internals): each kernel's first call loads it, as before
        pass
    if then is not None:
        with contextlib.suppress(Exception):
            then()


def _machine_index(kernel) -> tuple:
    """(the on-disk index of the Numba dispatcher ``kernel``'s cache: {(argument types, machine, source stamp):
    data file} (empty where there is none or it is damaged), this machine's target tuple); (None, None) for a
    kernel that is not cached."""
    cache = kernel._cache
    index_file = getattr(cache, "_cache_file", None)
    if index_file is None:  # not cached (cache=False)
        return None, None
    magic = kernel.targetctx.codegen().magic_tuple()  # this machine's target, CPU name and features
    return runtime.load_guarded(cache, index_file._load_index) or {}, magic


def cached_overloads(kernel) -> int:
    """How many overloads of the Numba dispatcher ``kernel`` its on-disk cache holds for this machine."""
    index, magic = _machine_index(kernel)
    return sum(key[1] == magic for key in index or ())


def load_cached(kernel) -> int:
    """Load every overload of the Numba dispatcher ``kernel`` that its on-disk cache holds for this machine
    and that it does not have yet, as its first call with those argument types would (no compilation);
    returns how many it loaded.  Holds Numba's compiler lock for this kernel only, so a first call of
    another kernel elsewhere waits for one load at most."""
    from numba.core.compiler_lock import global_compiler_lock

    cache, context = kernel._cache, kernel.targetctx
    loaded = 0
    with global_compiler_lock:
        index, magic = _machine_index(kernel)  # (a damaged one: discarded)
        for key in index or ():  # (argument types, machine, source stamp)
            signature = tuple(key[0])
            if key[1] != magic or signature in kernel.overloads:
                continue
            compiled = cache.load_overload(signature, context)
            if compiled is None:
                continue
            if not compiled.objectmode:  # (as Dispatcher.compile does with what it loads)
                context.insert_user_function(compiled.entry_point, compiled.fndesc, [compiled.library])
            kernel.add_overload(compiled)
            loaded += 1
    return loaded
