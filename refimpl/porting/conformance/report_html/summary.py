"""The summary: one row per case, its status and one cell per check, linking to the case."""

from __future__ import annotations

from ..grade import CHECK_ORDER  # the report's parts of the network in one order, the grader's
from .text import _e, _list, _number, _ratio_text, _text

STATUSES = ("pass", "fail", "not_run", "unusable")


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


def _check_columns(cases: list) -> list:
    """The summary's check columns, in the order of the pipeline; checks of other names follow in report order."""
    names = []
    for case in cases:
        for c in _list(case, "checks"):
            if isinstance(c, dict) and _text(c.get("name")) not in names:
                names.append(_text(c.get("name")))
    known = [n for n in CHECK_ORDER if n in names]
    return known + [n for n in names if n not in CHECK_ORDER]
