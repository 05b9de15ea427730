"""Recording intermediate arrays: one small object that stage code calls without branching.

    record = as_recorder(trace)          # trace: a dict to fill, a Recorder, or None
    record("pre_conv", x_bct)            # stores trace["pre_conv"] = x_bct (does nothing for None)
    layer_record = record.scope("layers.3.")
    layer_record("mlp", m_btc)           # stores trace["layers.3.mlp"]

A stage records under its own names; the caller decides the prefix with ``scope``.
"""

from __future__ import annotations

__all__ = ["Recorder", "NULL_RECORDER", "as_recorder"]


class Recorder:
    """Stores ``name -> array`` into ``store`` (a dict) under ``prefix``; with no store it does nothing."""

    __slots__ = ("store", "prefix")

    def __init__(self, store: dict | None = None, prefix: str = ""):
        self.store = store
        self.prefix = prefix

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def __call__(self, name: str, value) -> None:
        if self.store is not None:
            self.store[self.prefix + name] = value

    def scope(self, prefix: str) -> "Recorder":
        """A recorder into the same store whose names start with ``prefix`` (after this one's)."""
        return Recorder(self.store, self.prefix + prefix)


NULL_RECORDER = Recorder(None)


def as_recorder(trace) -> Recorder:
    """``None`` -> the recorder that does nothing; a dict -> a recorder filling it; a Recorder as is."""
    if trace is None:
        return NULL_RECORDER
    if isinstance(trace, Recorder):
        return trace
    if isinstance(trace, dict):
        return Recorder(trace)
    raise TypeError(f"trace must be a dict, a Recorder or None, not {type(trace).__name__}")
