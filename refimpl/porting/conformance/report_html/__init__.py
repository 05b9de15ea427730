"""The conformance report card as one HTML page: ``render_html(report)`` draws the grader's report dict.

The page opens offline and runs nothing: inline style (``page``), inline SVG plots (``svg``), PNG images as
``data:`` URIs (``png``), a Content Security Policy of ``default-src 'none'``, every string escaped (``text``).
From the top: ``header``, ``summary``, then each ``case`` with its ``tensors``, ``codes``, ``waveform`` and
``spectrogram``.  A report of another ``format`` or ``format_version`` is a ``ValueError``; every other field
is optional, and what is missing or malformed is left out."""

from __future__ import annotations

from ....io.files import write_atomically
from .case import case_section
from .header import page_footer, report_header
from .page import page
from .png import DIVERGING as DIVERGING  # the colour maps and the PNG writer, as before the split
from .png import MAGMA as MAGMA
from .png import png_indexed as png_indexed
from .summary import summary_table
from .text import _dict, _list, _text

__all__ = ["render_html", "write_html", "FORMAT", "FORMAT_VERSION"]

FORMAT = "refimpl-conformance-report"
FORMAT_VERSION = 1


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
