"""Reading the report: tolerant accessors (a missing or malformed field reads as empty) and the
formatting and escaping of its values.  A number that is missing, null or not finite prints as "—"
(NaN / ±inf as such); every string is escaped with ``html.escape``."""

from __future__ import annotations

import html
import math

MAX_TEXT = 400  # characters shown of one string of the report


def _dict(d: dict, key: str) -> dict:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    return v if isinstance(v, list) else []


def _number(v) -> float | None:
    """A finite int or float as float; None for anything else (missing, null, NaN, inf, a string, a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:  # an int past the range of a float
        return None
    return v if math.isfinite(v) else None


def _text(v) -> str:
    if v is None:
        return ""
    s = v if isinstance(v, str) else str(v)
    # lone surrogates cannot be written as UTF-8: keep them visible as escapes
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _labelled(template: str, v) -> str:
    """template with the escaped value in its {}, or "" where the value is missing or empty."""
    return template.format(_e(v)) if _text(v) else ""


def _short(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _e(v, limit: int = MAX_TEXT) -> str:
    """A report value as escaped text for HTML (element content and quoted attributes alike)."""
    return html.escape(_short(_text(v), limit), quote=True)


def _num(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isinf(v):
        return "∞" if v > 0 else "−∞"
    f = _number(v)
    return "—" if f is None else f"{f:.3g}"


def _int(v) -> str:
    f = _number(v)
    return "—" if f is None else f"{int(f):,}" if f == int(f) else f"{f:g}"


def _ratio_text(ratio: float | None, raw=None) -> str:
    if ratio is None:
        return _num(raw) if raw is not None else "—"
    if math.isinf(ratio):
        return "∞×"
    return f"{ratio:.2g}×" if ratio < 100 else f"{ratio:.3g}×"


def _shape_text(shape) -> str:
    """A shape as text, "[1, 64, 40]" (not escaped)."""
    if not isinstance(shape, list):
        return "—" if shape is None else _short(_text(shape), 60)
    return "[" + ", ".join(_short(_text(s), 20) for s in shape[:16]) + (", …]" if len(shape) > 16 else "]")


def _pair(value, i: int):
    return value[i] if isinstance(value, list) and len(value) > i else None
