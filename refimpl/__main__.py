"""``python -m refimpl`` runs the command line (see ``refimpl --help``)."""

import sys

from .cli import run

sys.exit(run())
