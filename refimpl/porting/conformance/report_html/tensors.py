"""A case's tensors along the execution order: log10(max_abs / tol) over the tensor index (where the
error jumps is the bug), the findings above the plot and the table of tensors below it."""

from __future__ import annotations

import dataclasses
import itertools
import math

from .svg import MAX_MARKERS, Frame, _decade_step, _nice_ticks, _pow10_label
from .text import _e, _num, _number, _pair, _ratio_text, _shape_text, _short, _text

# a case's tensor table: every tensor up to ALL_LISTED of them; past it the failing tensors and two neighbours
# on each side (at most MAX_LISTED rows), or where none fails the CLOSEST_LISTED closest to their tolerance
ALL_LISTED, MAX_LISTED, CLOSEST_LISTED = 40, 60, 12
JUMP = 1.5  # decades: a rise of the error from one tensor to the next that the page points out


@dataclasses.dataclass
class TensorPoint:
    index: int
    key: str
    kind: str  # ok / over (out of tolerance) / exact (max_abs 0) / mismatch (shapes differ) / nonfinite
    y: float | None  # log10(max_abs / tol); None for exact, mismatch, nonfinite
    tensor: dict

    def severity(self) -> tuple:
        rank = {"exact": 0, "ok": 1, "over": 2, "mismatch": 3, "nonfinite": 3}[self.kind]
        return rank, self.y if self.y is not None else 0.0

    def ratio(self) -> float:
        """max_abs / tol (infinite past the range of a float)."""
        return 10**self.y if self.y is not None and self.y < 300 else math.inf


def tensor_point(index: int, t: dict) -> TensorPoint:
    key = _text(t.get("key"))
    max_abs, tol = _number(t.get("max_abs")), _number(t.get("tol"))
    if t.get("shape_mismatch"):
        return TensorPoint(index, key, "mismatch", None, t)
    if max_abs is None:
        return TensorPoint(index, key, "nonfinite", None, t)
    if max_abs == 0:
        return TensorPoint(index, key, "exact", None, t)
    y = math.log10(max_abs / tol) if tol and tol > 0 else math.inf
    ok = t.get("ok") if isinstance(t.get("ok"), bool) else y <= 0
    return TensorPoint(index, key, "ok" if ok else "over", y, t)


def tensor_panel(tensors: list, first_failure) -> str:
    points = [tensor_point(i, t) for i, t in enumerate(tensors)]
    first = _first_failure_index(points, _text(first_failure))
    over = sum(p.kind in ("over", "mismatch", "nonfinite") for p in points)
    findings = [
        f'<p class="finding">{len(points)} tensors compared, '
        f"{'<b>' + str(over) + ' failing</b>' if over else 'all within tolerance'}.</p>"
    ]
    if first is not None:
        findings.append(first_failure_line(points[first], len(points)))
        jump = largest_jump(points[: first + 1])
        if jump is not None and jump.index != first:
            findings.append(
                f'<p class="finding">Before it, the error jumps at <code>{_e(jump.key)}</code> '
                f"(tensor {jump.index + 1}: {_ratio_text(jump.ratio())} its tolerance).</p>"
            )
    return (
        "<h3>Tensors along the execution order</h3>\n"
        + "\n".join(findings)
        + "\n"
        + tensor_legend()
        + tensor_error_plot(points, first)
        + tensor_list(points)
    )


def first_failure_line(p: TensorPoint, n: int) -> str:
    t = p.tensor
    if p.kind == "mismatch":
        pair = t.get("shape_mismatch")
        reference, candidate = _e(_shape_text(_pair(pair, 0))), _e(_shape_text(_pair(pair, 1)))
        what = f"shapes differ: reference {reference}, candidate {candidate}"
    elif p.kind == "nonfinite":
        what = "its error is not finite (NaN or infinity in the candidate)"
    else:
        what = (
            f"max |error| {_num(t.get('max_abs'))} against tolerance {_num(t.get('tol'))}, "
            f"{_ratio_text(p.ratio())} its tolerance"
        )
    return (
        f'<p class="finding"><b>First failure:</b> <code>{_e(p.key)}</code> (tensor {p.index + 1} of {n}): {what}.</p>'
    )


def largest_jump(points: list) -> TensorPoint | None:
    """The tensor whose error rises the most decades (at least JUMP) over the previous tensor's, up to
    within a decade of its tolerance: where the error grows before it fails."""
    best, best_step = None, JUMP
    for a, b in itertools.pairwise(points):
        if a.y is None or b.y is None or not (math.isfinite(a.y) and math.isfinite(b.y)):
            continue
        if b.y >= -1 and b.y - a.y >= best_step:
            best, best_step = b, b.y - a.y
    return best


def _first_failure_index(points: list, first_failure: str) -> int | None:
    if first_failure:
        for p in points:
            if p.key == first_failure:
                return p.index
    for p in points:
        if p.kind in ("over", "mismatch", "nonfinite"):
            return p.index
    return None


def tensor_legend() -> str:
    return (
        '<p class="legend"><i class="ok"></i>within tolerance<i class="over"></i>over tolerance'
        '<i class="exact"></i>exactly equal<i class="mismatch"></i>shape mismatch'
        '<i class="nonfinite">✕</i>not finite · hover a point for its tensor</p>'
    )


def tensor_error_plot(points: list, first: int | None) -> str:
    """log10(max_abs / tol) over the tensor index, the tolerance at 0; the worst of each run of
    neighbours when there are more points than MAX_MARKERS."""
    ys = [p.y for p in points if p.y is not None and math.isfinite(p.y)]
    lo = max(-12, min(-1, math.floor(min(ys, default=-1))))
    hi = min(12, max(1, math.ceil(max(ys, default=1))))
    n = len(points)
    f = Frame(-0.5, n - 0.5, lo, hi, height=240, top=30)
    out = [f.open(f"tensor errors against tolerance, {n} tensors")]
    out += module_bands(f, points)
    out += f.y_grid(range(lo, hi + 1, _decade_step(hi - lo)), _pow10_label)
    out.append(f.x_axis(_nice_ticks(0, n - 1), lambda v: str(int(v) + 1), "tensor (execution order)"))
    out.append(f.axis_title_y("error / tolerance"))
    out.append(f.hline(0, "tol"))
    out.append(f.text(f.right_edge() - 4, f.py(0) - 4, "tolerance", "label", anchor="end"))
    shown = worst_per_run(points, MAX_MARKERS)
    # the trend through the errors that have a ratio, broken at exact, mismatched and non-finite tensors
    out.append(f.polyline([(p.index, _plot_y(p, lo, hi)) if p.y is not None else None for p in shown], "trend"))
    out += [tensor_marker(f, p, lo, hi) for p in shown]
    if first is not None:
        out.append(f.vmarker(first, f"first failure: {_short(points[first].key, 60)}"))
    if len(shown) < n:
        out.append(f.text(f.left + 4, f.top - 8, f"worst of every {math.ceil(n / MAX_MARKERS)} neighbours shown", ""))
    out.append("</svg>")
    return "\n".join(out)


def _plot_y(p: TensorPoint, lo: float, hi: float) -> float:
    if p.kind in ("mismatch", "nonfinite"):
        return hi
    if p.kind == "exact":
        return lo
    return min(max(p.y, lo), hi)


def tensor_marker(f: Frame, p: TensorPoint, lo: float, hi: float) -> str:
    x, y = round(f.px(p.index)), round(f.py(_plot_y(p, lo, hi)))  # whole pixels: the page stays small
    title = f"<title>{_e(tensor_hover(p))}</title>"
    if p.kind == "mismatch":
        return f'<path class="mismatch" d="M{x} {y - 5}l5 5l-5 5l-5 -5z">{title}</path>'
    if p.kind == "nonfinite":
        return f'<path class="nonfinite" d="M{x - 4} {y - 4}l8 8m0 -8l-8 8">{title}</path>'
    return f'<circle class="{p.kind}" cx="{x}" cy="{y}" r="3">{title}</circle>'


def tensor_hover(p: TensorPoint) -> str:
    t = p.tensor
    head = f"#{p.index + 1} {p.key} {_shape_text(t.get('shape'))}"
    if p.kind == "mismatch":
        pair = t.get("shape_mismatch")
        reference, candidate = _shape_text(_pair(pair, 0)), _shape_text(_pair(pair, 1))
        return f"{head}\nshape mismatch: reference {reference}, candidate {candidate}"
    if p.kind == "nonfinite":
        return f"{head}\nerror not finite, tol {_num(t.get('tol'))}"
    if p.kind == "exact":
        return f"{head}\nexactly equal, tol {_num(t.get('tol'))}"
    return f"{head}\n{_num(t.get('max_abs'))} / tol {_num(t.get('tol'))} = {_ratio_text(p.ratio())}"


def worst_per_run(points: list, limit: int) -> list:
    """Every point, or, past limit points, the most severe of each run of ceil(n / limit) neighbours."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / limit)
    return [max(points[i : i + size], key=TensorPoint.severity) for i in range(0, len(points), size)]


def module_bands(f: Frame, points: list) -> list:
    """Shaded bands under the plot, one per run of tensors of the same module (the first two parts of the
    key: decoder.pre_transformer, talker.code_predictor), labelled where there is room."""
    out, start = [], 0
    runs = []
    for i in range(1, len(points) + 1):
        if i == len(points) or _module_of(points[i].key) != _module_of(points[start].key):
            runs.append((start, i, _module_of(points[start].key)))
            start = i
    for n, (a, b, name) in enumerate(runs):
        x0, x1 = f.px(a - 0.5), f.px(b - 0.5)
        out.append(
            f'<rect class="band{" odd" if n % 2 else ""}" x="{x0:.1f}" y="{f.top}" width="{x1 - x0:.1f}" '
            f'height="{f.plot_height()}"><title>{_e(name)}: tensors {a + 1}–{b}</title></rect>'
        )
        if x1 - x0 > 7 * len(name) + 8:
            out.append(f.text((x0 + x1) / 2, f.top + 12, _short(name, 40), "band-label", anchor="middle"))
    return out


def _module_of(key: str) -> str:
    parts = key.split(":")[0].split(".")
    if len(parts) > 1 and not parts[1].isdigit():
        return ".".join(parts[:2])
    return parts[0]


def tensor_list(points: list) -> str:
    """The tensors as a table under <details> (see ALL_LISTED), with a line for each gap."""
    listed, what = _listed_indices(points)
    rows, previous = [], -1
    for i in listed:
        if i > previous + 1:
            rows.append(f'<tr class="gap"><td colspan="6">… {i - previous - 1} tensors not listed</td></tr>')
        rows.append(tensor_row(points[i]))
        previous = i
    if previous < len(points) - 1:
        rows.append(f'<tr class="gap"><td colspan="6">… {len(points) - 1 - previous} tensors not listed</td></tr>')
    return (
        f"<details><summary>{what} ({len(listed)} of {len(points)})</summary>\n"
        '<table class="tensors"><thead><tr><th class="num">#</th><th>key</th><th>shape</th>'
        '<th class="num">max |error|</th><th class="num">tolerance</th><th class="num">error / tol</th></tr>'
        f"</thead><tbody>\n{chr(10).join(rows)}\n</tbody></table></details>"
    )


def tensor_row(p: TensorPoint) -> str:
    t = p.tensor
    bad = p.kind in ("over", "mismatch", "nonfinite")
    if p.kind == "mismatch":
        pair = t.get("shape_mismatch")
        shape = f"<b>{_e(_shape_text(_pair(pair, 0)))} ≠ {_e(_shape_text(_pair(pair, 1)))}</b>"
        ratio = "shapes differ"
    else:
        shape = _e(_shape_text(t.get("shape")))
        ratio = {"exact": "0", "nonfinite": "not finite"}.get(p.kind) or _ratio_text(p.ratio())
    return (
        f'<tr{" class=over" if bad else ""}><td class="num">{p.index + 1}</td><td><code>{_e(p.key)}</code></td>'
        f'<td class="mono">{shape}</td><td class="num">{_num(t.get("max_abs"))}</td>'
        f'<td class="num">{_num(t.get("tol"))}</td><td class="num">{ratio}</td></tr>'
    )


def _listed_indices(points: list) -> tuple:
    """The indices the tensor table lists, in execution order, and what they are."""
    if len(points) <= ALL_LISTED:
        return list(range(len(points))), "The tensors"
    chosen = set()
    for p in points:
        if p.kind in ("over", "mismatch", "nonfinite"):
            chosen.update(range(max(0, p.index - 2), min(len(points), p.index + 3)))
            if len(chosen) >= MAX_LISTED:
                break
    if chosen:
        return sorted(chosen)[:MAX_LISTED], "The failing tensors and their neighbours"
    closest = sorted(points, key=TensorPoint.severity, reverse=True)[:CLOSEST_LISTED]
    return sorted(p.index for p in closest), "The tensors closest to their tolerance"
