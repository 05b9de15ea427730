"""The spectrogram of the reference beside the candidate's difference from it, in dB, as PNG images
inside an SVG plot."""

from __future__ import annotations

import math

import numpy as np

from .png import DIVERGING, LEVELS, MAGMA, _png_uri
from .svg import Frame, _nice_ticks
from .text import _number

MAX_IMAGE_FRAMES = 1000  # spectrogram columns drawn (more are pooled)
MAX_IMAGE_BINS = 256


def spectrogram_panel(spec: dict, first_sample, rate) -> str:
    """The reference's log magnitude and the candidate's difference from it (dB, a diverging scale), one
    above the other on the same time axis, the first divergent sample marked on both."""
    ref, diff = _matrix(spec.get("reference_db")), _matrix(spec.get("diff_db"))
    if diff is None:
        return '<p class="muted">The spectrogram difference is missing or malformed.</p>'
    hop = _number(spec.get("hop"))
    frames = diff.shape[1]
    diff_px = _pool(diff, "absmax")
    scale = _diff_scale(diff)
    panels = []
    if ref is not None and ref.shape == diff.shape:
        top = float(np.nanmax(ref)) if np.isfinite(ref).any() else 0.0
        labels = (f"{top - 80:.0f}", f"{top:.0f}")
        panels.append(("reference (dB)", _pool(ref, "max"), top - 80.0, top, MAGMA, labels))
    labels = (f"−{scale:g}", "0", f"+{scale:g}")
    panels.append(("candidate − reference (dB)", diff_px, -scale, scale, DIVERGING, labels))
    height = 26 + PANEL_PITCH * (len(panels) - 1) + PANEL_HEIGHT + 34
    f = Frame(0, frames, 0, 1, height=height, right=96, top=26, bottom=34)
    out = [f.open("spectrogram of the reference and the difference of the candidate", frame=False)]
    marker_x = None
    if first_sample is not None and hop:
        marker_x = first_sample / hop
    for k, (name, image, lo, hi, colours, labels) in enumerate(panels):
        y = 26 + PANEL_PITCH * k
        out.append(spectrogram_image(f, image, lo, hi, colours, y, PANEL_HEIGHT))
        out.append(f.text(f.left + 4, y - 4, name, "label"))
        out.append(colour_bar(f, colours, y, PANEL_HEIGHT, labels))
        out.append(f.text(f.left - 6, y + 10, f"{diff.shape[0] - 1}", "", anchor="end"))
        out.append(f.text(f.left - 6, y + PANEL_HEIGHT, "0", "", anchor="end"))
        if marker_x is not None and 0 <= marker_x <= frames:
            x = f.px(marker_x)
            out.append(f'<line class="marker" x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + PANEL_HEIGHT}"/>')
    out.append(f.axis_title_y("bin"))
    seconds = (lambda v: f"{v * hop / rate:.2f} s") if hop and rate else (lambda v: str(int(v)))
    out.append(f.x_axis(_nice_ticks(0, frames), seconds, "time" if hop and rate else "spectrogram frame"))
    out.append("</svg>")
    return "\n".join(out)


PANEL_HEIGHT, PANEL_PITCH = 138, 162  # pixels: a spectrogram panel's height, from one panel to the next


def spectrogram_image(f: Frame, image: np.ndarray, lo: float, hi: float, colours, y: float, height: float) -> str:
    """An image of [bins, frames] values (low bins at the bottom) through a colour map, as a PNG."""
    with np.errstate(all="ignore"):  # values far out of the scale only clip
        index = np.clip(np.rint((image[::-1] - lo) / ((hi - lo) or 1.0) * (LEVELS - 1)), 0, LEVELS - 1)
    index = np.where(np.isfinite(image[::-1]), index, LEVELS).astype(np.uint8)
    uri = _png_uri(index, colours)
    return (
        f'<image x="{f.left}" y="{y}" width="{f.plot_width():.1f}" height="{height}" '
        f'preserveAspectRatio="none" href="{uri}"/>'
        f'<rect class="frame" x="{f.left}" y="{y}" width="{f.plot_width():.1f}" height="{height}"/>'
    )


def colour_bar(f: Frame, colours, y: float, height: float, labels: tuple) -> str:
    """The colour map upright right of the plot, labels spread from its bottom to its top."""
    x = f.right_edge() + 14
    uri = _png_uri(np.arange(LEVELS - 1, -1, -1, dtype=np.uint8)[:, None], colours)
    bar = f'<image x="{x}" y="{y}" width="12" height="{height}" preserveAspectRatio="none" href="{uri}"/>'
    step = (height - 10) / (len(labels) - 1)
    return bar + "".join(f.text(x + 16, y + height - k * step, t, "") for k, t in enumerate(labels))


def _diff_scale(diff: np.ndarray) -> float:
    """The colour scale's end, ± dB: the 99th percentile of |difference|, at least 1 dB (differences
    under a decibel stay pale), rounded up to 1, 2, 3 or 5 times a power of ten."""
    finite = np.abs(diff[np.isfinite(diff)])
    p99 = float(np.percentile(finite, 99)) if finite.size else 0.0
    scale = max(1.0, p99)
    decade = 10 ** math.floor(math.log10(scale))
    return next(m * decade for m in (1, 2, 3, 5, 10) if m * decade >= scale)


def _matrix(value) -> np.ndarray | None:
    """A [bins, frames] list of lists as float64 (null -> NaN); None when it is not a non-empty rectangle."""
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        return None
    width = len(value[0])
    if width == 0 or any(len(r) != width for r in value):
        return None
    try:
        a = np.array([[np.nan if v is None else v for v in r] for r in value], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return a


def _pool(a: np.ndarray, how: str) -> np.ndarray:
    """At most MAX_IMAGE_BINS x MAX_IMAGE_FRAMES: blocks of neighbours pooled to their max ("max") or
    their value of largest magnitude ("absmax", keeping its sign)."""
    for axis, limit in ((0, MAX_IMAGE_BINS), (1, MAX_IMAGE_FRAMES)):
        n = a.shape[axis]
        if n <= limit:
            continue
        size = math.ceil(n / limit)
        pad = [(0, 0), (0, 0)]
        pad[axis] = (0, size * math.ceil(n / size) - n)
        p = np.pad(a, pad, constant_values=np.nan)
        p = np.moveaxis(p, axis, -1).reshape(*np.moveaxis(p, axis, -1).shape[:-1], -1, size)
        filled = np.where(np.isnan(p), -np.inf, np.abs(p) if how == "absmax" else p)
        pick = np.take_along_axis(p, np.argmax(filled, axis=-1)[..., None], axis=-1)[..., 0]
        a = np.moveaxis(pick, -1, axis)
    return a
