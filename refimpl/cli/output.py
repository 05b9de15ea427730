"""What the command line shows on stderr: notes, warnings, progress bars, and the one-line error.

Everything here goes to stderr and is silenced by ``-q`` (``Reporter``), except errors: a ``CliError`` (or
a ``ValueError`` / ``OSError`` of the library) is one line ``refimpl: error: ...`` with exit status 1
(``refimpl.cli.main``)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from ..io.files import user_cache_dir


class CliError(Exception):
    """An error reported as one line on stderr, with exit status 1."""


def one_line(e: BaseException) -> str:
    """An error's message on one line (its type's name if it has none)."""
    return " ".join(line.strip() for line in str(e).strip().splitlines()) or type(e).__name__


# progress bars: redrawn in place (at most 10 times a second) on a terminal; in a log (stderr is a file or
# a pipe) one plain line at the start, then at most one every LOG_INTERVAL_S seconds, and one at the end
LOG_INTERVAL_S = 10.0
UNITS = {
    "generating frames": " frames",
    "decoding 300-frame chunks": " chunks",
    "decoding": " frames",
    "streamed audio": " s",
    "tracing cases": " cases",
}


class LogLines:
    """A file for tqdm when stderr is not a terminal: each redraw becomes one line (no carriage return),
    so a log reads as a few plain lines instead of one line of overwritten updates."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def stderr_is_a_terminal() -> bool:
    """stderr is a terminal with a width (a pseudo-terminal of width 0 would show empty bars)."""
    try:
        return sys.stderr.isatty() and os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


class Reporter:
    """Notes, warnings and progress bars on stderr, all silenced by -q."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, message: str, end: str = "\n") -> None:
        if not self.quiet:
            print(message, file=sys.stderr, end=end, flush=True)

    def bar(self, iterable=None, desc: str = "", total=None):
        """A ``tqdm`` progress bar on stderr (None under -q): in place on a terminal, sparse lines in a log."""
        if self.quiet:
            return None
        from tqdm import tqdm

        terminal = stderr_is_a_terminal()
        return tqdm(
            iterable,
            desc=desc,
            total=total,
            unit=UNITS.get(desc, " steps"),
            leave=True,
            file=sys.stderr if terminal else LogLines(sys.stderr),
            dynamic_ncols=terminal,
            mininterval=0.1 if terminal else LOG_INTERVAL_S,
            maxinterval=LOG_INTERVAL_S,
        )

    def progress(self, iterable, desc: str, total=None):
        """The library's ``progress=`` hook (``progress(iterable, desc) -> iterable``): a bar, or the
        iterable itself under -q."""
        return iterable if self.quiet else self.bar(iterable, desc, total)

    def warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """``warnings.showwarning`` for the command line: one line "warning: ..." (NumPy's and ours)."""
        self(f"warning: {message}")

    def beside_bars(self, message: str) -> None:
        """One line on stderr that a progress bar drawn in place on the terminal does not overwrite (tqdm
        clears the bar, writes the line and draws the bar again below it); nothing under -q."""
        if self.quiet:
            return
        if "tqdm" in sys.modules:
            from tqdm import tqdm

            tqdm.write(message, file=sys.stderr)
            sys.stderr.flush()
        else:
            self(message)


class _NotesHandler(logging.Handler):
    """The library's log records of level INFO and above as "note: ..." lines, "warning: ..." from level
    WARNING (``Reporter.beside_bars``)."""

    def __init__(self, say: Reporter):
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kind = "warning" if record.levelno >= logging.WARNING else "note"
            self.say.beside_bars(f"{kind}: {record.getMessage()}")
        except Exception:  # (as logging's own handlers: a note that cannot be shown never fails the command)
            self.handleError(record)


@contextlib.contextmanager
def library_notes(say: Reporter):
    """For a command's length, what the library logs at INFO (logger "refimpl": the numba backend's note that
    it compiles its kernels) shown on stderr as notes; nothing under -q.  The logger's level and handlers
    are as before afterwards."""
    logger = logging.getLogger("refimpl")
    if say.quiet:
        yield
        return
    handler, level = _NotesHandler(say), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# The embedded models are for trying the pipeline; the note that they speak noise is shown once per user
# (a marker file in the user's cache directory), always by 'refimpl info', never under -q.
EMBEDDED_NOTE = "note: the embedded default model has random weights: noise, not speech (see 'refimpl info')"
NOTE_MARKER = "embedded-model-note-shown"


def first_time_for_this_user(marker: str) -> bool:
    """True unless the marker file exists in the user cache directory; creates it.  Never fails: when
    the cache cannot be written, every run is the first."""
    directory = user_cache_dir()
    if directory is None:
        return True
    try:
        if (directory / marker).exists():
            return False
        directory.mkdir(parents=True, exist_ok=True)
        (directory / marker).touch()
    except OSError:
        pass
    return True


def embedded_model_note(say: Reporter, always: bool = False) -> None:
    """EMBEDDED_NOTE on stderr: the first time for this user (``always``: every time); never under -q."""
    if not say.quiet and (always or first_time_for_this_user(NOTE_MARKER)):
        say(EMBEDDED_NOTE)
