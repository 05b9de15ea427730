"""The package version (one place: setup.cfg reads it, trace files record it)."""

__version__ = "0.2.0"
