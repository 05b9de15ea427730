"""Adapters between our traces and the dump formats of ports' own checking tools, so that a port's verifier
reads our reference and our compare reads the port's dump (docs/ports.md). Each adapter is written from the
format's description, never from the port's code."""
