"""Typed views of the ``config.json`` files, with the official constructor defaults.

Unknown keys are tolerated (and kept in ``extra``), since released configs carry many keys that
the numerics never read.  Note that the official *defaults* are not the released *values*
(e.g. decoder ``hidden_size`` defaults to 1024, the release uses 512): always read the checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from .checkpoint import CheckpointError

T = TypeVar("T")


def config_from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build the dataclass ``cls`` from a dict: known keys become fields (lists become tuples where
    the default is a tuple), everything else lands in the ``extra`` dict field."""
    if data is not None and not isinstance(data, Mapping):
        raise CheckpointError(f"{cls.__name__}: this section of the config must be a JSON object, got {data!r}")
    data = dict(data or {})
    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs, extra = {}, {}
    for key, value in data.items():
        if key in names and key != "extra":
            default = names[key].default
            if isinstance(default, tuple) and isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        else:
            extra[key] = value
    if "extra" in names:
        kwargs["extra"] = extra
    return cls(**kwargs)
