"""``python -m refimpl.cli``: the command line, as ``python -m refimpl`` and the ``refimpl`` script."""

import sys

from . import run

sys.exit(run())
