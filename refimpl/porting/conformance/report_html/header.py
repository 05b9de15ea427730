"""The report's header (suite, results, precision, behaviours, versions, checkpoints, the verdict with
its counts) and the page's footer."""

from __future__ import annotations

from .text import _dict, _e, _int, _labelled, _number, _text


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


def page_footer(suite: dict) -> str:
    return (
        f"<footer>refimpl conformance report · suite {_e(suite.get('name'))} v{_e(suite.get('version'))} · "
        f"refimpl {_e(suite.get('refimpl_version'))}</footer>"
    )


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
