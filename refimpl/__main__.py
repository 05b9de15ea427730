"""``python -m refimpl`` runs the command line (see ``refimpl --help``)."""

import sys

from .cli import main

sys.exit(main())
