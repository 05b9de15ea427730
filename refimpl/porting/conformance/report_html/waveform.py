"""A case's waveform: its facts, the error of each 1920-sample frame against the tolerance, and the
spectrogram."""

from __future__ import annotations

import math

from ...compare import SAMPLES_PER_FRAME
from .spectrogram import spectrogram_panel
from .svg import MAX_MARKERS, Frame, _decade_step, _nice_ticks, _pow10_label
from .text import _int, _labelled, _num, _number


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
