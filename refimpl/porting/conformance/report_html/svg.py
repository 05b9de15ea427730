"""A plot's frame in SVG: data coordinates onto pixels, axes, grid, markers and text; and the ticks."""

from __future__ import annotations

import dataclasses
import math

from .text import _e

MAX_MARKERS = 250  # markers of one plot: more points are drawn as the worst of each run of neighbours


@dataclasses.dataclass
class Frame:
    """A plot: data coordinates x0..x1, y0..y1 onto an SVG of width x height pixels less its margins."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 1000
    height: int = 220
    left: int = 64
    right: int = 20
    top: int = 24
    bottom: int = 34

    def plot_width(self) -> float:
        return self.width - self.left - self.right

    def plot_height(self) -> float:
        return self.height - self.top - self.bottom

    def right_edge(self) -> float:
        return self.width - self.right

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / ((self.x1 - self.x0) or 1) * self.plot_width()

    def py(self, y: float) -> float:
        y = min(max(y, self.y0), self.y1)
        return self.top + (self.y1 - y) / ((self.y1 - self.y0) or 1) * self.plot_height()

    def open(self, label: str, frame: bool = True) -> str:
        """The <svg> tag (a plot scales with the page's width) and the rectangle around the plot."""
        tag = f'<svg class="plot" viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{_e(label)}">'
        if not frame:
            return tag
        return tag + (
            f'<rect class="frame" x="{self.left}" y="{self.top}" width="{self.plot_width()}" '
            f'height="{self.plot_height()}"/>'
        )

    def text(self, x: float, y: float, text: str, cls: str, anchor: str = "start") -> str:
        cls_attr = f' class="{cls}"' if cls else ""
        return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{cls_attr}>{_e(text)}</text>'

    def hline(self, y: float, cls: str) -> str:
        y = self.py(y)
        return f'<line class="{cls}" x1="{self.left}" x2="{self.right_edge()}" y1="{y:.1f}" y2="{y:.1f}"/>'

    def rect(self, xa: float, xb: float, ya: float, yb: float, cls: str, title: str) -> str:
        x0, x1 = self.px(xa), self.px(xb)
        top, bottom = self.py(yb), self.py(ya)
        return (
            f'<rect class="{cls}" x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 0.8):.1f}" '
            f'height="{max(bottom - top, 0.8):.1f}"><title>{_e(title)}</title></rect>'
        )

    def polyline(self, xy: list, cls: str) -> str:
        """A line through the points (x, y), broken where a point is None."""
        d, pen_down = [], False
        for point in xy:
            if point is None:
                pen_down = False
                continue
            d.append(f"{'L' if pen_down else 'M'}{self.px(point[0]):.0f} {self.py(point[1]):.0f}")
            pen_down = True
        return f'<path class="{cls}" d="{"".join(d)}"/>'

    def vmarker(self, x: float, label: str) -> str:
        """A dashed vertical line at x, labelled above the plot (on whichever side has room)."""
        px = self.px(x)
        anchor = "end" if px > self.left + 0.6 * self.plot_width() else "start"
        shift = -4 if anchor == "end" else 4
        return (
            f'<line class="marker" x1="{px:.1f}" x2="{px:.1f}" y1="{self.top - 4}" '
            f'y2="{self.top + self.plot_height()}"/>'
            + self.text(px + shift, self.top - 8, label, "alarm", anchor=anchor)
        )

    def y_grid(self, ticks, label) -> list:
        out = []
        for v in ticks:
            y = self.py(v)
            out.append(f'<line class="grid" x1="{self.left}" x2="{self.right_edge()}" y1="{y:.1f}" y2="{y:.1f}"/>')
            out.append(self.text(self.left - 6, y + 4, label(v), "", anchor="end"))
        return out

    def x_axis(self, ticks, label, title: str, at_centres: bool = False) -> str:
        base = self.top + self.plot_height()
        out = []
        for v in ticks:
            x = self.px(v + 0.5 if at_centres else v)
            out.append(f'<line class="frame" x1="{x:.1f}" x2="{x:.1f}" y1="{base}" y2="{base + 4}"/>')
            out.append(self.text(x, base + 15, label(v), "", anchor="middle"))
        out.append(self.text(self.left + self.plot_width() / 2, self.height - 3, title, "", anchor="middle"))
        return "".join(out)

    def axis_title_y(self, title: str) -> str:
        x, y = 12, self.top + self.plot_height() / 2
        return f'<text x="{x}" y="{y:.1f}" text-anchor="middle" transform="rotate(-90 {x} {y:.1f})">{_e(title)}</text>'


def _nice_ticks(lo: float, hi: float, most: int = 10) -> list:
    """Integer ticks 1, 2 or 5 times a power of ten apart, at most `most` of them, from lo to hi."""
    step = next(s for s in _steps() if max(hi - lo, 1) / s <= most)
    return list(range(math.ceil(lo / step) * step, int(hi) + 1, step))


def _steps():
    k = 1
    while True:
        for m in (1, 2, 5):
            yield m * k
        k *= 10


def _decade_step(span: int) -> int:
    return 1 if span <= 8 else 2 if span <= 16 else 4


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _pow10_label(k: int) -> str:
    return "1" if k == 0 else "10" if k == 1 else "10" + str(int(k)).translate(SUPERSCRIPT)
