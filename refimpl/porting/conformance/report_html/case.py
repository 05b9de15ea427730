"""One case: its header, message and coverage, the checks, then the panels of its tensors, codes and
waveform."""

from __future__ import annotations

from .codes import codes_panel
from .summary import STATUSES, status_pill
from .tensors import tensor_panel
from .text import MAX_TEXT, _dict, _e, _int, _labelled, _list, _number, _ratio_text, _text
from .waveform import waveform_panel


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
