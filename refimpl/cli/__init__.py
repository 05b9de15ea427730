"""The ``refimpl`` command line (also ``python -m refimpl``).

Every command runs without ``--model`` on the small checkpoints embedded in the package (random
weights: they show the pipeline working, they do not speak).  Point ``--model`` at a released
Qwen3-TTS checkpoint directory for real speech.

``main`` (here) runs one command and turns its errors into the exit statuses of ``refimpl --help``.  The
rest, by responsibility: ``parser`` (every command and option), ``commands`` (what say, design, clone,
codec and info do; the port author's commands are ``refimpl/porting/``'s), ``output`` (stderr: notes,
warnings, progress bars, the one-line error), ``files`` (inputs and outputs, "-" included) and
``streams`` (the standard streams themselves).
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import numpy as np

from ..backends import use_backend
from ..environment import check_switches, switch
from ..io.mapped_files import handle_bus_errors
from ..io.memory import is_out_of_memory, memory_message
from .commands import DEFAULT_MODELS
from .files import check_output_path
from .output import EMBEDDED_NOTE, NOTE_MARKER, CliError, Reporter, library_notes, one_line
from .parser import build_parser
from .streams import end_standard_output, quiet_after_closed_pipe, settle_standard_streams

__all__ = ["main", "run", "build_parser", "CliError", "Reporter", "DEFAULT_MODELS", "EMBEDDED_NOTE", "NOTE_MARKER"]


def debug_requested() -> bool:
    """REFIMPL_DEBUG=1: an internal error shows its traceback (a value that is not a switch was refused at
    the start)."""
    try:
        return switch("REFIMPL_DEBUG")
    except ValueError:
        return False


def main(argv=None) -> int:
    settle_standard_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    say = Reporter(getattr(args, "quiet", False))
    args.dtype_np = np.float64 if getattr(args, "dtype", "float32") == "float64" else np.float32
    handle_bus_errors()  # a mapped checkpoint truncated under the run: one line, status 1 (docs/limits.md)
    try:
        check_switches()  # a REFIMPL_ switch that is not 1 or 0: one error before any work
        # golden's and conformance make's -o name a directory
        if getattr(args, "output", None) is not None and args.command not in ("golden", "conformance"):
            check_output_path(args.output)
        with (
            warnings.catch_warnings(),
            library_notes(say),
            use_backend(args.backend, "--backend") if getattr(args, "backend", None) else contextlib.nullcontext(),
        ):
            if say.quiet:
                warnings.simplefilter("ignore")
            else:
                warnings.showwarning = say.warning
            status = args.func(args, say)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        return quiet_after_closed_pipe()
    except (MemoryError, OSError, ImportError) as e:
        if not is_out_of_memory(e):
            if isinstance(e, ImportError):
                return internal_error(e)
            print(f"refimpl: error: {one_line(e)}", file=sys.stderr)
            return 1
        # memory ran out (io/memory.py): an OutOfMemory names the file, the need and the limit
        print(f"refimpl: error: {memory_message(e)}", file=sys.stderr)
        return 1
    except (CliError, ValueError) as e:  # CheckpointError and NonFiniteError are ValueErrors
        print(f"refimpl: error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("refimpl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not a user error: still one line, unless REFIMPL_DEBUG asks for the traceback
        return internal_error(e)


def run() -> int:
    """The command line as a process (the ``refimpl`` script, ``python -m refimpl``): ``main``, then standard
    output ended (``end_standard_output``), so that a reader sees the end of the audio before the interpreter
    tears the model down.  (``main`` leaves standard output open: a caller in the same process goes on.)"""
    status = main()
    try:
        end_standard_output()
    except BrokenPipeError:
        return quiet_after_closed_pipe()
    return status


def internal_error(e: Exception) -> int:
    """A bug, not a user error: one line and status 3, unless REFIMPL_DEBUG asks for the traceback."""
    if debug_requested():
        raise e
    print(
        f"refimpl: internal error: {type(e).__name__}: {e} (set REFIMPL_DEBUG=1 for the traceback; please report it)",
        file=sys.stderr,
    )
    return 3
