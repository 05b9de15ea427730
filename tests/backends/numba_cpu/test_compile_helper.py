"""A first run's compile helper (``refimpl/backends/numba_cpu/compile_helper.py``, its work
``refimpl/tts/warm_up.py``): started by a model's load where the cache lacks the model's code predictor's
first kernel for this machine, and only there (not with the kernels cached, nor on one core, nor turned off),
stopped when the process that started it exits, and compiling only kernels a generation calls, with the
argument types it calls them with (so that the generation loads them from the cache instead of compiling
them).  Each run is a fresh process with a Numba cache of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

pytest.importorskip("numba")

from refimpl.porting import presets, synthetic  # noqa: E402

# The start of a script: every later first call of a kernel of the backend that goes through Numba's
# dispatcher in Python (not a kernel called from compiled code), as (module, name, argument types), printed as
# JSON at the script's exit.
FIRST_CALLS = r"""
import atexit, json, sys
import numba.core.dispatcher as dispatcher
first_calls = []
compile_for_args = dispatcher.Dispatcher._compile_for_args
def recorded(self, *a, **k):
    module = self.py_func.__module__
    if module.startswith("refimpl.backends.numba_cpu."):
        types = [str(self.typeof_pyval(v)) for v in a]
        first_calls.append([module.rsplit(".", 1)[1], self.py_func.__name__, types])
    return compile_for_args(self, *a, **k)
dispatcher.Dispatcher._compile_for_args = recorded
atexit.register(lambda: print(json.dumps(first_calls)))
"""

# A model's load (argv: its directory; then "one core" to run on one core, or "wait" to wait for the helper), the
# load's thread waited for; prints the helper it started (its pid, its arguments and, waited for, its exit
# status; or None), then exits.
LOAD = r"""
import json, os, sys
if sys.argv[2:] == ["one core"]:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
from refimpl import Qwen3TTS, use_backend
from refimpl.backends.numba_cpu import cached_kernels, compile_helper
with use_backend("numba"):
    Qwen3TTS.from_pretrained(sys.argv[1])
cached_kernels.wait_for_loading()
helper = compile_helper._HELPER[0] if compile_helper._HELPER else None
status = helper.wait() if helper is not None and sys.argv[2:] == ["wait"] else None
print(json.dumps(None if helper is None else {"pid": helper.pid, "args": helper.args, "status": status}))
"""

# A user's first generations (argv: the model's directory): streamed to the end (pushes of 1, 2 and 4 frames),
# then generated whole (its decode at once)
GENERATIONS = r"""
import sys
from refimpl import Qwen3TTS, use_backend
with use_backend("numba"):
    tts = Qwen3TTS.from_pretrained(sys.argv[1])
    said = dict(speaker="eric", language="english", max_new_tokens=8, do_sample=False, subtalker_dosample=False)
    pushed = [len(chunk) for chunk in tts.stream_custom_voice("Hello there.", **said)]
    assert pushed == [1920, 3840, 7680], pushed
    tts.generate_custom_voice("Hello there.", **said)
"""

# the decoder's kernels compiled, the code predictor's not: a codec decode alone
DECODE = r"""
import sys, numpy as np
from refimpl import SpeechTokenizer, use_backend
with use_backend("numba"):
    SpeechTokenizer.from_pretrained(sys.argv[1] + "/speech_tokenizer").decode(np.zeros((3, 16), np.int64))
"""

DEFAULT = REPO / "refimpl" / "data" / "default-customvoice"  # float32 weights: the code predictor runs the primitives


def run(script: str, *args, cache=None, helper: bool = False) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python with ``args``, Numba's cache ``cache`` (None: the package's), the helper
    on or off."""
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_NUM_THREADS="2", REFIMPL_COMPILE_HELPER="1" if helper else "0")
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache)
    command = [sys.executable, "-c", script, *map(str, args)]
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def last_json(r: subprocess.CompletedProcess):
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """The tiny CustomVoice model stored in bfloat16, as the released checkpoints are (its code predictor runs
    the fused stack)."""
    directory = tmp_path_factory.mktemp("bf16-customvoice")
    synthetic.write_tts_model(directory, "custom_voice", "0b6", presets.TINY_TALKER_CUSTOMVOICE, dtype="bfloat16")
    return directory


NO_LOADING_AHEAD = """
import sys
from refimpl.backends.numba_cpu import cached_kernels
cached_kernels.load_ahead = lambda *a: None
"""


def first_calls(script: str, model) -> set:
    """The first calls of ``script`` run on ``model`` in the package's cache, the kernels' loading ahead off (a
    kernel loaded from the cache goes through the dispatcher at its first call as a compiled one does; but a
    kernel compiled in the process, as another's callee, is then called from Python without it: the script is
    run once before, so that the recorded run compiles nothing that script calls)."""
    script = NO_LOADING_AHEAD + script
    run(script, model)
    return {(m, n, tuple(t)) for m, n, t in last_json(run(FIRST_CALLS + script, model))}


@pytest.fixture(scope="module")
def generated(bf16_model) -> set:
    """A user's first generations of the bfloat16 model, in the package's cache (which holds their kernels
    afterwards): their first calls."""
    return first_calls(GENERATIONS, bf16_model)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_first_run_starts_the_helper_and_stops_it_at_its_exit(tmp_path):
    started = last_json(run(LOAD, DEFAULT, cache=tmp_path, helper=True))
    assert started is not None, "a load into an empty cache started no helper"
    assert started["args"] == [sys.executable, "-m", "refimpl.tts.warm_up", str(DEFAULT)]
    assert not alive(started["pid"]), "the helper outlived the process that started it"


def test_the_helper_runs_to_its_end(tmp_path):
    """Waited for, the helper a load started (its command line, in an empty cache) does its work and exits
    with status 0."""
    started = last_json(run(LOAD, DEFAULT, "wait", cache=tmp_path, helper=True))
    assert started is not None and started["status"] == 0, started


def test_a_helper_where_the_models_code_predictor_kernels_are_not_cached(tmp_path, bf16_model):
    """After a codec decode alone (its kernels cached), a float32 model's load starts no helper, a bfloat16
    one's does: its code predictor's fused stack is still to be compiled."""
    run(DECODE, DEFAULT, cache=tmp_path)
    assert last_json(run(LOAD, DEFAULT, cache=tmp_path, helper=True)) is None
    assert last_json(run(LOAD, bf16_model, cache=tmp_path, helper=True)) is not None


def test_no_helper_with_the_kernels_cached_on_one_core_or_turned_off(tmp_path, generated, bf16_model):
    assert last_json(run(LOAD, bf16_model, helper=True)) is None, "a helper with its kernels cached"
    assert last_json(run(LOAD, DEFAULT, "one core", cache=tmp_path / "a", helper=True)) is None, "one on one core"
    assert last_json(run(LOAD, DEFAULT, cache=tmp_path / "b", helper=False)) is None, "a helper turned off"


def test_the_helper_calls_what_a_generation_calls_and_nothing_else(generated, bf16_model):
    """The helper's first calls of kernels, with their argument types, are among those of a user's first
    generations of the same model (its code predictor's frames, its streamed pushes and its whole decode): on
    a first run it compiles nothing for nothing, and a generation finds in the cache what it compiled.  Among
    them the code predictor's stack and the decoder's fused units."""
    helper = first_calls("from refimpl.tts import warm_up\nwarm_up.main(sys.argv[1:])\n", bf16_model)
    names = {(m, n) for m, n, _ in helper}
    for kernel in [
        ("transformer", "_decoder_steps_bf16"),
        ("codec_decoder", "_snake_conv_few_into"),
        ("codec_decoder", "_unit_convs_direct"),
    ]:
        assert kernel in names, f"the helper did not call {kernel}"
    assert helper - generated == set(), f"called by the helper, by no generation: {sorted(helper - generated)}"
