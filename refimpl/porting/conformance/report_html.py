"""The conformance report card as one HTML page: ``render_html(report)`` draws the grader's report dict.

The page is a single self-contained file that opens offline: the style sheet is inline, the plots are
inline SVG drawn here, the spectrogram images are PNG files written here (zlib + struct) and embedded as
``data:`` URIs, and there is no script at all (the tensor lists fold with ``<details>``).  A Content
Security Policy in the page (``default-src 'none'``) makes the browser refuse anything else, so even a
string that slipped through unescaped could neither run nor load.  Every string of the report is escaped
(``html.escape``): case names, keys and messages come from files a port wrote.

What it draws, from the top:

- the header: suite, results, precision, the behaviours the port chose, the verdict with its counts;
- the summary: one row per case, its status and one cell per check, linking to the case;
- per case: its message and coverage, the checks, the tensors' errors against their tolerances along the
  execution order (log10(max_abs / tol) over the tensor index: where the error jumps is the bug), the
  codes (equal frames, the first divergence and its verdict), the waveform's error per 1920-sample frame
  against its tolerance and the spectrogram of the reference beside the candidate's difference in dB.

The input is the report dict of the grader (``format`` "refimpl-conformance-report", ``format_version``
1; anything else is a ``ValueError``).  Every other field is optional: a missing or malformed field (a
string where a list belongs, a ragged spectrogram) leaves out what it would have drawn, a number that is
missing, null or not finite prints as "—" (NaN / ±inf as such), and the page still renders.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import itertools
import math
import struct
import zlib

import numpy as np

from ...io.files import write_atomically
from ..compare import SAMPLES_PER_FRAME
from .grade import CHECK_ORDER  # the report's parts of the network in one order, the grader's

__all__ = ["render_html", "write_html", "FORMAT", "FORMAT_VERSION"]

FORMAT = "refimpl-conformance-report"
FORMAT_VERSION = 1

STATUSES = ("pass", "fail", "not_run", "unusable")
# the summary's check columns, in the order of the pipeline; checks of other names follow in report order
MAX_MARKERS = 250  # markers of one plot: more points are drawn as the worst of each run of neighbours
# a case's tensor table: every tensor up to ALL_LISTED of them; past it the failing tensors and two neighbours
# on each side (at most MAX_LISTED rows), or where none fails the CLOSEST_LISTED closest to their tolerance
ALL_LISTED, MAX_LISTED, CLOSEST_LISTED = 40, 60, 12
JUMP = 1.5  # decades: a rise of the error from one tensor to the next that the page points out
MAX_TEXT = 400  # characters shown of one string of the report
MAX_IMAGE_FRAMES = 1000  # spectrogram columns drawn (more are pooled)
MAX_IMAGE_BINS = 256
# colours of a colour map (its PNG palette holds one more, grey, for a missing value): odd, so that 0 dB of the
# difference is the white in the middle; 1.25 dB a step over the 80 dB of the reference
LEVELS = 65

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# ---------------------------------------------------------------------------------------------------------
# the page


def render_html(report: dict) -> str:
    """The report card of a conformance report dict, as one self-contained HTML document."""
    _check_format(report)
    cases = [c for c in _list(report, "cases") if isinstance(c, dict)]
    suite = _dict(report, "suite")
    title = f"{_text(suite.get('name')) or 'conformance'} · {_text(report.get('results')) or 'results'}"
    body = [
        report_header(report, cases),
        summary_table(cases),
        *(case_section(i, case) for i, case in enumerate(cases)),
        page_footer(suite),
    ]
    return page(title, "\n".join(body))


def write_html(report: dict, path) -> None:
    """Render the report and write it to path; a failed write leaves a previous file as it was."""
    write_atomically(path, render_html(report).encode("utf-8"))


def _check_format(report) -> None:
    if not isinstance(report, dict):
        raise ValueError(f"a conformance report is a dict, not {type(report).__name__}")
    if report.get("format") != FORMAT:
        raise ValueError(f"not a conformance report: format is {report.get('format')!r}, expected {FORMAT!r}")
    if report.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"conformance report format_version {report.get('format_version')!r}: this renderer reads "
            f"version {FORMAT_VERSION}"
        )


def page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


STYLE = """
:root { --pass: #1a7f37; --fail: #cf222e; --not_run: #6e7781; --unusable: #9a6700; --ink: #1f2328;
  --muted: #59636e; --line: #d1d9e0; --paper: #ffffff; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Liberation Sans", "DejaVu Sans", Arial, sans-serif; }
main { max-width: 1160px; margin: 0 auto; padding: 20px 24px 40px; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace;
  font-size: 12.5px; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0; } h3 { font-size: 14px; margin: 18px 0 6px; }
.muted { color: var(--muted); }
.card { background: var(--paper); border: 1px solid var(--line); border-radius: 10px; padding: 18px 22px;
  margin: 0 0 18px; }
header.report { display: flex; gap: 28px; align-items: center; }
header.report .facts { flex: 1; min-width: 0; }
.facts dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 0; }
.facts dt { color: var(--muted); } .facts dd { margin: 0; overflow-wrap: anywhere; }
.verdict { text-align: center; min-width: 210px; }
.verdict .big { font-size: 44px; font-weight: 800; letter-spacing: .06em; color: #fff; border-radius: 10px;
  padding: 6px 20px; display: inline-block; }
.verdict .big.pass { background: var(--pass); } .verdict .big.fail { background: var(--fail); }
.verdict .big.none { background: var(--not_run); font-size: 28px; }
.verdict .counts { margin-top: 8px; font-size: 13px; }
.countbar { display: flex; height: 10px; border-radius: 5px; overflow: hidden; margin: 8px auto 0;
  width: 200px; background: #eaeef2; }
.countbar span { display: block; }
.countbar .pass, .swatch.pass { background: var(--pass); } .countbar .fail, .swatch.fail { background: var(--fail); }
.countbar .not_run, .swatch.not_run { background: var(--not_run); }
.countbar .unusable, .swatch.unusable { background: var(--unusable); }
.swatch { display: inline-block; width: 9px; height: 9px; border-radius: 2px; margin: 0 3px 0 8px; }
.chip { display: inline-block; border: 1px solid var(--line); border-radius: 12px; padding: 0 8px;
  margin: 1px 4px 1px 0; font-size: 12.5px; background: #f6f8fa; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e6eaef; vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12.5px; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.scroll { overflow-x: auto; }
table.summary td.check { text-align: center; white-space: nowrap; font-size: 12.5px; font-weight: 600;
  vertical-align: middle; min-width: 58px; }
table.summary th.check { text-align: center; white-space: normal; width: 64px; max-width: 90px;
  vertical-align: bottom; }
table.summary td.case { overflow-wrap: anywhere; min-width: 320px; }
table.summary td:first-child, table.summary th:first-child { width: 1%; }
table.summary div.message { color: var(--muted); font-size: 12.5px; }
td.check.pass { color: var(--pass); background: #e6f6ea; } td.check.fail { color: var(--fail); background: #ffebe9; }
td.check.not_dumped { color: var(--muted); background: #f3f5f7; }
.pill { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 700;
  letter-spacing: .03em; white-space: nowrap; }
.pill.pass { color: var(--pass); background: #dafbe1; } .pill.fail { color: #fff; background: var(--fail); }
.pill.not_run { color: #fff; background: var(--not_run); } .pill.unusable { color: #fff; background: var(--unusable); }
.pill.not_dumped, .pill.unknown { color: var(--muted); background: #eaeef2; }
section.case { border-left: 6px solid var(--line); scroll-margin-top: 12px; }
section.case.pass { border-left-color: var(--pass); } section.case.fail { border-left-color: var(--fail); }
section.case.not_run { border-left-color: var(--not_run); }
section.case.unusable { border-left-color: var(--unusable); }
section.case header { display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
section.case header .title { color: var(--muted); }
p.message { margin: 10px 0 4px; padding: 8px 12px; background: #fff8c5; border-radius: 6px; overflow-wrap: anywhere; }
section.case.pass p.message { background: #f6f8fa; }
p.finding { margin: 6px 0; overflow-wrap: anywhere; }
p.finding b { color: var(--fail); }
details { margin: 6px 0; } summary { cursor: pointer; color: #0969da; }
tr.over td { background: #fff5f5; } tr.gap td { color: var(--muted); font-style: italic; text-align: center; }
svg.plot { display: block; width: 100%; height: auto; max-width: 1000px; margin: 4px 0; }
svg.plot text { font-size: 11px; fill: #59636e; }
svg.plot text.label, svg.plot text.alarm, svg.plot text.band-label { paint-order: stroke;
  stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg.plot text.label { fill: var(--ink); font-weight: 600; }
svg.plot text.band-label { fill: #8c959f; font-size: 10px; }
svg.plot text.alarm { fill: var(--fail); font-weight: 600; }
svg.plot .frame { fill: none; stroke: #d1d9e0; }
svg.plot .grid { stroke: #eef1f4; }
svg.plot .band { fill: #f6f8fa; } svg.plot .band.odd { fill: #eef2f6; }
svg.plot .tol { stroke: var(--fail); stroke-width: 1.2; stroke-dasharray: 6 4; }
svg.plot .trend { fill: none; stroke: #8c959f; stroke-width: 1; opacity: .7; }
svg.plot .ok { fill: #2da44e; } svg.plot .over { fill: var(--fail); }
svg.plot .exact { fill: #fff; stroke: #2da44e; stroke-width: 1.3; }
svg.plot .mismatch { fill: #bf8700; stroke: #7d4e00; }
svg.plot .nonfinite { fill: none; stroke: #82071e; stroke-width: 2.2; }
svg.plot .marker { stroke: var(--fail); stroke-width: 1.5; stroke-dasharray: 3 3; }
svg.plot .equal { fill: #2da44e; } svg.plot .diverged { fill: var(--fail); }
svg.plot .after { fill: #d0d7de; } svg.plot .extra { fill: #eac54f; } svg.plot .tie { fill: #bf8700; }
svg.plot image { image-rendering: pixelated; }
.legend { font-size: 12px; color: var(--muted); margin: 0 0 4px; }
.legend i { display: inline-block; width: 9px; height: 9px; border-radius: 50%; margin: 0 4px 0 10px; }
.legend i.ok { background: #2da44e; } .legend i.over { background: var(--fail); }
.legend i.exact { border: 1.5px solid #2da44e; } .legend i.mismatch { background: #bf8700; border-radius: 1px;
  transform: rotate(45deg); }
.legend i.nonfinite { border-radius: 0; background: none; color: #82071e; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 24px; }
"""


# ---------------------------------------------------------------------------------------------------------
# the header and the summary


def report_header(report: dict, cases: list) -> str:
    suite = _dict(report, "suite")
    facts = [
        ("suite", _e(suite.get("name")) + _labelled(" <span class='muted'>v{}</span>", suite.get("version"))),
        ("results", _labelled("<code>{}</code>", report.get("results"))),
        ("precision", _labelled("<code>{}</code>", report.get("precision"))),
        ("behaviours", _chips(_dict(report, "behaviours"))),
        ("reference", _reference_versions(suite)),
        ("checkpoints", _checkpoint_chips(_dict(suite, "checkpoints"))),
    ]
    rows = "".join(f"<dt>{name}</dt><dd>{value or '—'}</dd>" for name, value in facts)
    return (
        '<header class="report card">\n'
        f'<div class="facts"><h1>Conformance report</h1><dl>{rows}</dl></div>\n'
        f"{verdict_badge(report.get('passed'), _counts(report, cases))}\n"
        "</header>"
    )


def verdict_badge(passed, counts: dict) -> str:
    if passed is True or passed is False:
        word, kind = ("PASS", "pass") if passed else ("FAIL", "fail")
    else:
        word, kind = "NO VERDICT", "none"
    total = counts.get("cases")
    summary = f"{_int(counts.get('passed'))} of {_int(total)} cases passed"
    others = [
        f'<span class="swatch {s}"></span>{_int(counts.get(k))} {s.replace("_", " ")}'
        for s, k in (("fail", "failed"), ("not_run", "not_run"), ("unusable", "unusable"))
        if _number(counts.get(k))
    ]
    return (
        f'<div class="verdict"><div class="big {kind}">{word}</div>'
        f'<div class="counts"><b>{summary}</b><br>{" ".join(others)}</div>{count_bar(counts)}</div>'
    )


def count_bar(counts: dict) -> str:
    parts = [
        (s, _number(counts.get(k)) or 0)
        for s, k in (("pass", "passed"), ("fail", "failed"), ("not_run", "not_run"), ("unusable", "unusable"))
    ]
    if not sum(n for _, n in parts):
        return ""
    spans = "".join(f'<span class="{s}" style="flex: {n:g}"></span>' for s, n in parts if n > 0)
    return f'<div class="countbar">{spans}</div>'


def summary_table(cases: list) -> str:
    if not cases:
        return '<section class="card"><p class="muted">The report holds no cases.</p></section>'
    checks = _check_columns(cases)
    head = "".join(f'<th class="check">{_e(name.replace("_", " "), 24)}</th>' for name in checks)
    rows = []
    for i, case in enumerate(cases):
        by_name = {_text(c.get("name")): c for c in _list(case, "checks") if isinstance(c, dict)}
        cells = "".join(summary_check_cell(by_name.get(name)) for name in checks)
        message = _text(case.get("message"))
        below = f'<div class="message" title="{_e(message)}">{_e(message, 160)}</div>' if message else ""
        rows.append(
            f"<tr><td>{status_pill(case.get('status'))}</td>"
            f'<td class="case"><a href="#case-{i}"><code>{_e(case.get("name"), 80)}</code></a> '
            f'<span class="muted">{_e(case.get("title"), 100)}</span>{below}</td>{cells}</tr>'
        )
    return (
        '<section class="card"><h2>Cases</h2>\n<div class="scroll"><table class="summary">\n'
        f"<thead><tr><th>status</th><th>case</th>{head}</tr></thead>\n"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody></table></div></section>"
    )


def summary_check_cell(check) -> str:
    if check is None:
        return '<td class="check"></td>'
    status = _text(check.get("status"))
    detail = _e(check.get("detail"))
    if status == "pass":
        return f'<td class="check pass" title="{detail}">✓</td>'
    if status == "fail":
        ratio = _number(check.get("worst_ratio"))
        text = f"✗ {_ratio_text(ratio)}" if ratio is not None else "✗"
        return f'<td class="check fail" title="{detail}">{text}</td>'
    if status == "not_dumped":
        return f'<td class="check not_dumped" title="{detail or "not dumped"}">–</td>'
    return f'<td class="check" title="{detail}">{_e(status)}</td>'


def status_pill(status) -> str:
    status = _text(status)
    kind = status if status in STATUSES or status == "not_dumped" else "unknown"
    return f'<span class="pill {kind}">{_e(status.replace("_", " ").upper() or "?")}</span>'


def page_footer(suite: dict) -> str:
    return (
        f"<footer>refimpl conformance report · suite {_e(suite.get('name'))} v{_e(suite.get('version'))} · "
        f"refimpl {_e(suite.get('refimpl_version'))}</footer>"
    )


# ---------------------------------------------------------------------------------------------------------
# one case


def case_section(index: int, case: dict) -> str:
    status = _text(case.get("status"))
    kind = status if status in STATUSES else "unknown"
    parts = [
        f'<section class="case card {kind}" id="case-{index}">',
        f"<header>{status_pill(status)}<h2><code>{_e(case.get('name'))}</code></h2>"
        f'<span class="title">{_e(case.get("title"))}</span>'
        f"{_labelled('<span class=chip>{}</span>', case.get('stage'))}</header>",
    ]
    if _text(case.get("message")):
        parts.append(f'<p class="message">{_e(case.get("message"), 2 * MAX_TEXT)}</p>')
    parts.append(coverage_line(_dict(case, "coverage")))
    parts.append(checks_table([c for c in _list(case, "checks") if isinstance(c, dict)]))
    tensors = [t for t in _list(case, "tensors") if isinstance(t, dict)]
    if tensors:
        parts.append(tensor_panel(tensors, case.get("first_failure")))
    if isinstance(case.get("codes"), dict):
        parts.append(codes_panel(case["codes"]))
    if isinstance(case.get("waveform"), dict):
        parts.append(waveform_panel(case["waveform"]))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def coverage_line(coverage: dict) -> str:
    if not coverage:
        return ""
    text = (
        f"Compared {_int(coverage.get('compared'))} of the reference's {_int(coverage.get('reference'))} tensors "
        f"(the port dumped {_int(coverage.get('dumped'))})."
    )
    missing = _text(coverage.get("missing_groups"))
    if missing:
        text += f" Not dumped: <span class='mono'>{_e(missing)}</span>"
    return f'<p class="muted">{text}</p>'


def checks_table(checks: list) -> str:
    if not checks:
        return ""
    rows = []
    for c in checks:
        rows.append(
            f"<tr><td><b>{_e(c.get('name'))}</b></td><td>{status_pill(c.get('status'))}</td>"
            f'<td class="num">{_int(c.get("compared"))}</td><td class="num">{_int(c.get("failed"))}</td>'
            f"<td><code>{_e(c.get('worst_key'))}</code></td>"
            f'<td class="num">{_ratio_text(_number(c.get("worst_ratio")), c.get("worst_ratio"))}</td>'
            f"<td>{_e(c.get('detail'))}</td></tr>"
        )
    return (
        '<table class="checks"><thead><tr><th>check</th><th>status</th><th class="num">compared</th>'
        '<th class="num">failed</th><th>worst tensor</th><th class="num">worst / tol</th><th>detail</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


# ---------------------------------------------------------------------------------------------------------
# the tensors along the execution order


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


# ---------------------------------------------------------------------------------------------------------
# the codes


VERDICTS = {
    "rule": "a rule differs: the candidate's code is what the reference's scores give with one "
    "sampling processor applied differently",
    "near_tie": "a near tie: the two codes' scores lie within the tolerance of each other, so either "
    "choice is right at this precision",
    "numeric": "numeric: the scores themselves differ beyond tolerance; fix the first failing tensor upstream",
}


def codes_panel(codes: dict) -> str:
    n_ref, n_cand = _number(codes.get("frames_reference")), _number(codes.get("frames_candidate"))
    equal = _number(codes.get("frames_equal"))
    d = codes.get("first_divergence") if isinstance(codes.get("first_divergence"), dict) else None
    head = (
        f'<p class="finding">{_labelled("<code>{}</code>: ", codes.get("key"))}'
        f"{_int(equal)} of {_int(n_ref)} reference frames equal (candidate: {_int(n_cand)} frames).</p>"
    )
    return "<h3>Codes</h3>\n" + head + divergence_line(d) + codes_strip(n_ref, n_cand, d)


def divergence_line(d: dict | None) -> str:
    if d is None:
        return '<p class="finding">No divergent code.</p>'
    verdict = _text(d.get("verdict"))
    explanation = VERDICTS.get(verdict, "no verdict (the reference holds no scores for this step)")
    processor = _text(d.get("processor"))
    if verdict == "rule" and processor:
        explanation += f" (<code>{_e(processor)}</code>)"
    margin = ""
    if d.get("margin") is not None or d.get("tolerance") is not None:
        margin = f" Margin {_num(d.get('margin'))}, tolerance {_num(d.get('tolerance'))}."
    return (
        f'<p class="finding"><b>First divergence:</b> frame {_int(d.get("frame"))}, codebook '
        f"{_int(d.get('codebook'))}: reference <code>{_int(d.get('reference_id'))}</code>, candidate "
        f"<code>{_int(d.get('candidate_id'))}</code>.</p>"
        f'<p class="finding">Verdict <span class="chip">{_e(verdict or "none")}</span> {explanation}.{margin}</p>'
    )


def codes_strip(n_ref, n_cand, d: dict | None) -> str:
    """Two bars of frames, reference and candidate: equal up to the first divergence, the divergent frame,
    (red, amber for a near tie), then frames that follow another history (grey) or that only one side has
    (yellow)."""
    n_ref, n_cand = int(n_ref or 0), int(n_cand or 0)
    n = max(n_ref, n_cand)
    if n <= 0:
        return ""
    div = _number(d.get("frame")) if d else None
    div = int(div) if div is not None and 0 <= div < n else None
    f = Frame(0, n, 0, 2, height=92, left=84, top=22, bottom=30)
    out = [f.open(f"codes: {n_ref} reference frames, {n_cand} candidate frames")]
    for row, (name, length) in enumerate((("reference", n_ref), ("candidate", n_cand))):
        lo, hi = 1 - row + 0.15, 2 - row - 0.15
        same = min(n_ref, n_cand) if div is None else div
        segments = [(0, min(same, length), "equal", "equal frames")]
        if div is not None and div < length:
            tie = _text(d.get("verdict")) == "near_tie"  # either code is right: amber, not red
            segments.append((div, div + 1, "tie" if tie else "diverged", f"frame {div}: first divergence"))
            segments.append((div + 1, length, "after", "after the divergence (another history)"))
        elif div is None and length > same:
            segments.append((same, length, "extra", f"frames only the {name} has"))
        for a, b, cls, title in segments:
            if b > a:
                out.append(f.rect(a, b, lo, hi, cls, f"{title} ({a}–{b - 1})"))
        out.append(f.text(f.left - 8, (f.py(lo) + f.py(hi)) / 2 + 4, name, "label", anchor="end"))
    out.append(f.x_axis(_nice_ticks(0, n - 1), lambda v: str(int(v)), "frame", at_centres=True))
    if div is not None:
        out.append(f.vmarker(div + 0.5, f"frame {div}"))
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# the waveform


def waveform_panel(w: dict) -> str:
    samples, rate = _number(w.get("samples")), _number(w.get("sample_rate"))
    seconds = f" ({samples / rate:.2f} s)" if samples is not None and rate else ""
    snr = _number(w.get("snr_db"))
    if snr is not None:
        snr_text = f"SNR {snr:.1f} dB"
    elif w.get("max_abs") == 0:
        snr_text = "identical"
    else:
        snr_text = "SNR —"
    facts = (
        f'<p class="finding">{_labelled("<code>{}</code>: ", w.get("key"))}'
        f"{_int(samples)} samples at {_int(rate)} Hz{seconds} · "
        f"{snr_text} · max |error| {_num(w.get('max_abs'))} against tolerance {_num(w.get('tol'))}.</p>"
    )
    frame, sample = _number(w.get("first_divergent_frame")), _number(w.get("first_divergent_sample"))
    if frame is not None:
        at = f", sample {int(sample):,}" if sample is not None else ""
        when = f" ({sample / rate:.3f} s)" if sample is not None and rate else ""
        facts += f'<p class="finding"><b>First divergent frame:</b> {int(frame)}{at}{when}.</p>'
    errors = w.get("frame_errors") if isinstance(w.get("frame_errors"), list) else []
    out = ["<h3>Waveform</h3>", facts]
    if errors:
        out.append(frame_error_plot(errors, _number(w.get("tol")), frame))
    spec = w.get("spectrogram")
    if isinstance(spec, dict):
        out.append(spectrogram_panel(spec, sample, rate))
    return "\n".join(out)


def frame_error_plot(errors: list, tol: float | None, first_frame) -> str:
    """The largest |error| of each 1920-sample frame on a log axis, bars over the tolerance in red (past
    MAX_MARKERS frames, one bar for the worst of each run of neighbours)."""
    values = [_number(v) for v in errors]  # None: not finite
    logs = [math.log10(v) for v in values if v is not None and v > 0]
    if tol is not None and tol > 0:
        logs.append(math.log10(tol))
    lo = max(-40, math.floor(min(logs, default=-8) - 0.5))
    hi = min(40, math.ceil(max(logs, default=0) + 0.5))
    n = len(values)
    run = math.ceil(n / MAX_MARKERS)
    f = Frame(-0.5, n - 0.5, lo, hi, height=200, top=26)
    out = [f.open(f"largest error of each of {n} frames")]
    out += f.y_grid(range(lo, hi + 1, _decade_step(hi - lo)), _pow10_label)
    out.append(f.x_axis(_nice_ticks(0, n - 1), lambda v: str(int(v)), f"frame ({SAMPLES_PER_FRAME} samples)"))
    out.append(f.axis_title_y("max |error|"))
    for a in range(0, n, run):
        block = values[a : a + run]
        worst = None if None in block else max(block)
        if worst is not None and worst <= 0:
            continue
        frames = f"frame {a}" if run == 1 else f"frames {a}–{a + len(block) - 1}"
        if worst is None:
            top, cls, title = hi, "over", f"{frames}: max |error| not finite"
        else:
            top, title = math.log10(worst), f"{frames}: max |error| {_num(worst)}"
            cls = "over" if tol is not None and worst > tol else "ok"
        out.append(f.rect(a - 0.5 + 0.1 * run, a + len(block) - 0.5 - 0.1 * run, lo, top, cls, title))
    if tol is not None and tol > 0:
        out.append(f.hline(math.log10(tol), "tol"))
        out.append(
            f.text(f.right_edge() - 4, f.py(math.log10(tol)) - 4, f"tolerance {_num(tol)}", "label", anchor="end")
        )
    if first_frame is not None and 0 <= first_frame < n:
        out.append(f.vmarker(first_frame, f"first divergent frame {int(first_frame)}"))
    out.append("</svg>")
    return "\n".join(out)


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


# ---------------------------------------------------------------------------------------------------------
# colour maps and PNG files


def _ramp(anchors: list, n: int = LEVELS) -> np.ndarray:
    """n colours interpolated linearly through evenly spaced anchor colours ("#rrggbb"), plus the colour of
    a missing value (grey) at index n: a [n + 1, 3] uint8 palette."""
    rgb = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in anchors], dtype=np.float64)
    at = np.linspace(0, len(anchors) - 1, n)
    colours = np.stack([np.interp(at, np.arange(len(anchors)), rgb[:, k]) for k in range(3)], axis=1)
    return np.vstack([np.rint(colours), [[150, 150, 150]]]).astype(np.uint8)


# a magma-like sequential map for levels, a red-blue diverging one (white at 0) for differences
MAGMA = _ramp(["#000004", "#2c115f", "#721f81", "#b73779", "#f1605d", "#feb078", "#fcfdbf"])
DIVERGING = _ramp(["#053061", "#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b", "#67001f"])


def _png_uri(index_hw: np.ndarray, palette: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_indexed(index_hw, palette)).decode("ascii")


def png_indexed(index_hw: np.ndarray, palette: np.ndarray) -> bytes:
    """A PNG file of 8-bit palette indices [H, W] and their [N <= 256, 3] colours (no filtering)."""
    h, w = index_hw.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = np.hstack([np.zeros((h, 1), np.uint8), index_hw.astype(np.uint8)])  # filter byte 0 on each row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
        + chunk(b"PLTE", palette.astype(np.uint8).tobytes())
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------------------
# drawing: a plot's frame in SVG


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


# ---------------------------------------------------------------------------------------------------------
# reading the report: tolerant accessors and formatting


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


def _chips(d: dict) -> str:
    return "".join(f'<span class="chip">{_e(k)}: <b>{_e(v)}</b></span>' for k, v in d.items())


def _reference_versions(suite: dict) -> str:
    official = _dict(suite, "official")
    parts = [f"refimpl {_e(suite.get('refimpl_version'))}"] if suite.get("refimpl_version") is not None else []
    parts += [f"{_e(k)} {_e(v)}" for k, v in official.items()]
    return " · ".join(parts)


def _checkpoint_chips(checkpoints: dict) -> str:
    out = []
    for name, info in checkpoints.items():
        sha = _text(info.get("weights_sha256")) if isinstance(info, dict) else ""
        short = f" <span class='mono muted'>{_e(sha[:12])}</span>" if sha else ""
        out.append(f'<span class="chip" title="weights sha256 {_e(sha)}">{_e(name)}{short}</span>')
    return "".join(out)


def _counts(report: dict, cases: list) -> dict:
    """The report's counts, or counted from the cases' statuses where the report has none."""
    counts = _dict(report, "counts")
    if counts:
        return counts
    statuses = [_text(c.get("status")) for c in cases]
    return {
        "cases": len(cases),
        "passed": statuses.count("pass"),
        "failed": statuses.count("fail"),
        "not_run": statuses.count("not_run"),
        "unusable": statuses.count("unusable"),
    }


def _check_columns(cases: list) -> list:
    names = []
    for case in cases:
        for c in _list(case, "checks"):
            if isinstance(c, dict) and _text(c.get("name")) not in names:
                names.append(_text(c.get("name")))
    known = [n for n in CHECK_ORDER if n in names]
    return known + [n for n in names if n not in CHECK_ORDER]
