"""Memory limits while loading (docs/limits.md, lengths and memory): under an address-space limit
(``ulimit -v``, RLIMIT_AS) below what a load needs, the error says that memory ran out, while loading
which file, how much it needs and the limit, before anything is allocated; an allocation that fails
inside a load names the file too.  Each limit is set in a child process, computed from what that run
needs (the embedded tiny checkpoints)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from refimpl.io import checkpoint, memory

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
EMBEDDED = REPO / "refimpl" / "data" / "default-customvoice"

pytestmark = pytest.mark.skipif(memory.address_space_used() is None, reason="no /proc/self/status here")

UNDER_A_LIMIT = """
import resource, sys
import refimpl.cli
from refimpl.io import checkpoint
from refimpl.io.memory import address_space_used
room, target = int(sys.argv[1]), sys.argv[2]
read_header = checkpoint._read_header

def limited(path):  # the limit set when the load of TARGET begins: ROOM bytes more than in use then
    if str(path) == target:
        limit = address_space_used() + room
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return read_header(path)

checkpoint._read_header = limited
sys.exit(refimpl.cli.main(sys.argv[3:]))
"""


def under_a_limit(room: int, target, *args) -> subprocess.CompletedProcess:
    """``refimpl ARGS`` in a child whose address space may grow by ``room`` bytes once it starts to load
    the weight file ``target``."""
    script = textwrap.dedent(UNDER_A_LIMIT)
    command = [sys.executable, "-c", script, str(room), str(target), *map(str, args)]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)


def test_a_load_past_the_limit_is_refused_naming_the_file_and_the_need(tmp_path):
    weights = EMBEDDED / "model.safetensors"
    room = weights.stat().st_size // 2  # half of what mapping the file alone takes
    r = under_a_limit(room, weights, "say", "Hi.", "-o", tmp_path / "x.wav", "-q", "--max-new-tokens", "2")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"refimpl: error: out of memory loading {weights}: it needs at least "), lines
    assert "of its address-space limit of" in lines[0] and "(ulimit -v)" in lines[0] and "short" in lines[0]
    assert not (tmp_path / "x.wav").exists()


def test_a_failed_allocation_inside_a_load_names_the_file(monkeypatch):
    def no_memory(*args):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(checkpoint, "track", no_memory)  # called right after the file is mapped
    with pytest.raises(memory.OutOfMemory, match=r"out of memory loading .*model\.safetensors.*Cannot allocate"):
        checkpoint.read_safetensors_file(EMBEDDED / "model.safetensors")


def test_other_errors_inside_a_load_stay_what_they_are(monkeypatch):
    def denied(*args):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoint, "track", denied)
    with pytest.raises(PermissionError):
        checkpoint.read_safetensors_file(EMBEDDED / "model.safetensors")


def test_what_counts_as_running_out_of_memory():
    assert memory.is_out_of_memory(MemoryError())
    assert memory.is_out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert memory.is_out_of_memory(ImportError("x.so: failed to map segment from shared object"))
    assert not memory.is_out_of_memory(ImportError("No module named 'x'"))
    assert not memory.is_out_of_memory(OSError(errno.ENOENT, "No such file"))
    assert not memory.is_out_of_memory(ValueError("a text that says out of memory"))
    assert memory.memory_message(MemoryError()).startswith("out of memory (a shorter input needs less")


def test_the_need_is_a_lower_bound_of_what_a_load_holds():
    """The need checked before a load: the mapped file, plus every converted tensor (float64 doubles the
    float32 tensors of the tiny checkpoint)."""
    path = EMBEDDED / "model.safetensors"
    header, _ = checkpoint._read_header(path)
    size = path.stat().st_size
    assert checkpoint.load_bytes(path, header, list(header), [], [], "float32") == size
    data = sum(info["data_offsets"][1] - info["data_offsets"][0] for info in header.values())
    assert checkpoint.load_bytes(path, header, list(header), [], [], "float64") == size + 2 * data
