"""A case's codes: equal frames, the first divergence with its verdict, and the strip of frames."""

from __future__ import annotations

from .svg import Frame, _nice_ticks
from .text import _e, _int, _labelled, _num, _number, _text

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
