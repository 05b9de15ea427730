"""The conformance report card (refimpl/porting/conformance/report_html/): a report of 14 realistic cases
(keys and shapes of the committed trace, golden/trace/official_keys.json) rendered and checked for its
structure and its escaping, then opened in headless Chromium: no console message, every plot in the DOM,
and a screenshot that shows the report (many colours, the verdict's red, the plots' green).

Chromium is the Debian package ``chromium``; .ci/run installs it.  Without it the browser test skips,
except under CI (the environment variable CI set), where it fails."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import time
import zlib

import numpy as np
import pytest
from conftest import GOLDEN

from refimpl.porting.conformance import report_html
from refimpl.porting.conformance.report_html import render_html

HOSTILE = "<script>alert(1)</script>"
HOSTILE_ATTR = '"><img src=x onerror=alert(1)>'
KEYS = json.loads((GOLDEN / "trace" / "official_keys.json").read_text())["keys"]


# ---------------------------------------------------------------------------------------------------------
# a realistic report


def tensors(keys, rng, bug_at=None, mismatch_at=None, exact=()):
    """One entry per (key, shape): errors a decade or three under the tolerance, and from bug_at on one to
    two decades over it (where a port's bug would start)."""
    out = []
    for i, (key, shape) in enumerate(keys):
        tol = float(10 ** rng.uniform(-6, -4.5))
        ratio = 10 ** rng.uniform(-3, -1) if bug_at is None or i < bug_at else 10 ** rng.uniform(0.3, 2)
        t = {"key": key, "shape": shape, "max_abs": tol * ratio, "tol": tol, "ok": ratio <= 1, "shape_mismatch": None}
        if i in exact:
            t.update(max_abs=0.0, ok=True)
        if i == mismatch_at:
            t.update(max_abs=None, ok=False, shape_mismatch=[shape, shape[:-1] + [shape[-1] + 1]])
        out.append(t)
    return out


def waveform(rng, frames, divergent_frame=None, tol=1e-5):
    samples = frames * 1920
    errors = 10 ** rng.uniform(-7.5, -6.5, frames)
    if divergent_frame is not None:
        errors[divergent_frame:] = 10 ** rng.uniform(-3.5, -2.5, frames - divergent_frame)
    hops = samples // 480
    t = np.arange(hops)[None, :]
    bins = np.arange(64)[:, None]
    f0 = 6 + 3 * np.sin(t / 17)
    reference_db = -70 + 60 * np.exp(-(((bins % f0) - 0.5) ** 2)) * np.exp(-bins / 40) + rng.normal(0, 2, (64, hops))
    diff_db = rng.normal(0, 0.05, (64, hops))
    if divergent_frame is not None:
        start = divergent_frame * 4
        diff_db[:, start:] = rng.normal(0, 4, (64, hops - start)) + 3 * np.sin(bins / 5)
    first_sample = None if divergent_frame is None else divergent_frame * 1920 + 128
    return {
        "key": "decoder",
        "samples": samples,
        "sample_rate": 24000,
        "snr_db": 38.5 if divergent_frame is not None else 109.2,
        "max_abs": float(errors.max()),
        "tol": tol,
        "frame_errors": errors.tolist(),
        "first_divergent_frame": divergent_frame,
        "first_divergent_sample": first_sample,
        "spectrogram": {
            "hop": 480,
            "bins": 64,
            "frames": hops,
            "reference_db": reference_db.round(2).tolist(),
            "diff_db": diff_db.round(3).tolist(),
        },
    }


def check(name, status, compared, failed=0, worst_key=None, worst_ratio=None, detail=""):
    return dict(
        name=name,
        status=status,
        compared=compared,
        failed=failed,
        worst_key=worst_key,
        worst_ratio=worst_ratio,
        detail=detail,
    )


def case(name, stage, title, status, message="", ts=(), checks=(), codes=None, wave=None, reference=None):
    failing = [t for t in ts if not t["ok"]]
    return {
        "name": name,
        "stage": stage,
        "title": title,
        "status": status,
        "message": message,
        "coverage": {"reference": reference or len(ts), "dumped": len(ts), "compared": len(ts), "missing_groups": ""},
        "checks": list(checks),
        "tensors": list(ts),
        "first_failure": failing[0]["key"] if failing else None,
        "codes": codes,
        "waveform": wave,
    }


def failed(ts):
    return sum(not t["ok"] for t in ts)


def codes(frames, divergence=None, frames_candidate=None):
    equal = frames if divergence is None else divergence["frame"]
    return {
        "key": "refimpl.codes.0",
        "frames_reference": frames,
        "frames_candidate": frames if frames_candidate is None else frames_candidate,
        "frames_equal": equal,
        "first_divergence": divergence,
    }


def make_report():
    rng = np.random.default_rng(20240501)
    decode, encode, speaker, say = KEYS["codec-decode"], KEYS["codec-encode"], KEYS["speaker"], KEYS["say"]
    bug = next(i for i, (k, _) in enumerate(decode) if k.startswith("decoder.decoder.3"))
    stream = tensors(decode, rng, bug_at=bug)
    shape_bug = tensors(encode, rng, mismatch_at=40)
    greedy = tensors(say, rng, bug_at=700)
    cases = [
        case(
            "codec-decode",
            "codec-decode",
            "Codec decode, whole utterance",
            "pass",
            ts=tensors(decode, rng, exact=(0, 1, 2)),
            checks=[check("decoder", "pass", 217, worst_ratio=0.08), check("waveform", "pass", 1, worst_ratio=0.3)],
            wave=waveform(rng, 40),
        ),
        case(
            "codec-decode-stream",
            "codec-decode",
            "Codec decode, exact stream in 1/2/4-frame pushes",
            "fail",
            message="decoder.decoder.3 is out of tolerance; the waveform diverges from frame 28",
            ts=stream,
            checks=[
                check("decoder", "fail", 217, failed(stream), stream[bug]["key"], 25.1, "out of tolerance"),
                check("waveform", "fail", 1, 1, "decoder", 210.0, "diverges from frame 28"),
            ],
            wave=waveform(rng, 40, divergent_frame=28),
        ),
        case(
            "codec-encode",
            "codec-encode",
            "Codec encode",
            "pass",
            ts=tensors(encode, rng),
            checks=[check("encoder", "pass", 85, worst_ratio=0.05), check("codes", "pass", 1)],
            codes=codes(11),
        ),
        case(
            "codec-encode-odd-length",
            "codec-encode",
            "Codec encode, a length that is not a whole frame",
            "fail",
            message="encoder.encoder.layers: shape mismatch (the port pads one sample too many)",
            ts=shape_bug,
            checks=[check("encoder", "fail", 85, 1, shape_bug[40]["key"], None, "shape mismatch")],
        ),
        case(
            "speaker",
            "speaker",
            "Speaker encoder x-vector",
            "pass",
            ts=tensors(speaker, rng),
            checks=[check("speaker_encoder", "pass", 116, worst_ratio=0.07), check("x_vector", "pass", 1)],
        ),
        case(
            "say-greedy",
            "say",
            "Generation, greedy",
            "fail",
            message="codes diverge at frame 6, codebook 3 (numeric): talker.model.layers.1 out of tolerance",
            ts=greedy,
            checks=[
                check(
                    "talker", "fail", 1270, failed(greedy), greedy[700]["key"], 12.0, "first at " + greedy[700]["key"]
                ),
                check("codes", "fail", 1, 1, "refimpl.codes.0", None, "frame 6, codebook 3"),
            ],
            codes=codes(
                10,
                dict(frame=6, codebook=3, reference_id=51, candidate_id=63, verdict="numeric", processor=None),
            ),
        ),
        case(
            "say-sampled",
            "say",
            "Generation, sampled (top-k 50, top-p 0.8)",
            "pass",
            message="",
            ts=tensors(say, rng),
            checks=[check("talker", "pass", 800), check("code_predictor", "pass", 470), check("codes", "pass", 1)],
            codes=codes(
                10,
                dict(
                    frame=8,
                    codebook=0,
                    reference_id=1201,
                    candidate_id=877,
                    verdict="near_tie",
                    processor=None,
                    margin=3.1e-6,
                    tolerance=1.2e-5,
                ),
            ),
        ),
        case(
            "say-repetition",
            "say",
            "Generation with repetition penalty 1.05",
            "fail",
            message="codes diverge at frame 2 (rule: repetition_penalty)",
            ts=tensors(say[:300], rng),
            checks=[check("talker", "pass", 300), check("codes", "fail", 1, 1, "refimpl.codes.0", None, "rule")],
            codes=codes(
                12,
                dict(
                    frame=2,
                    codebook=0,
                    reference_id=51,
                    candidate_id=63,
                    verdict="rule",
                    processor="repetition_penalty",
                    margin=0.035,
                    tolerance=1.2e-5,
                ),
                frames_candidate=9,
            ),
        ),
        case(
            "design",
            "design",
            "Voice design",
            "pass",
            ts=tensors(KEYS["design"], rng),
            checks=[check("talker", "pass", 1274), check("codes", "pass", 1), check("waveform", "pass", 1)],
            codes=codes(10),
            wave=waveform(rng, 10),
        ),
        case("clone", "clone", "Voice clone", "not_run", message="the results hold no clone/ folder"),
        case(
            HOSTILE,
            HOSTILE,
            HOSTILE_ATTR,
            "unusable",
            message=f"metadata.json is not JSON: {HOSTILE} {HOSTILE_ATTR}",
            ts=tensors([[f"decoder.{HOSTILE}", [1, 2]], [f"decoder.x{HOSTILE_ATTR}", [3]]], rng, bug_at=1),
            checks=[check(HOSTILE, "fail", 2, 1, HOSTILE_ATTR, 4.0, HOSTILE)],
        ),
        case(
            "codec-decode-waveform-only",
            "codec-decode",
            "Codec decode, a port that dumps only its waveform",
            "pass",
            checks=[check("decoder", "not_dumped", 0), check("waveform", "pass", 1, worst_ratio=0.2)],
            wave=waveform(rng, 60),
            reference=217,
        ),
        case(
            "speaker-long",
            "speaker",
            "Speaker encoder, 9 s of audio",
            "pass",
            ts=tensors(speaker, rng),
            checks=[check("speaker_encoder", "pass", 116), check("x_vector", "pass", 1)],
        ),
        case(
            "codec-encode-short",
            "codec-encode",
            "Codec encode, one frame",
            "pass",
            ts=tensors(encode, rng),
            checks=[check("encoder", "pass", 85), check("codes", "pass", 1)],
            codes=codes(1),
        ),
    ]
    counts = {s: sum(c["status"] == s for c in cases) for s in ("pass", "fail", "not_run", "unusable")}
    return {
        "format": "refimpl-conformance-report",
        "format_version": 1,
        "suite": {
            "name": "qwen3-tts-conformance",
            "version": 1,
            "refimpl_version": "0.9.0",
            "official": {"qwen-tts": "0.1.1"},
            "checkpoints": {"default-customvoice": {"weights_sha256": "ab" * 32}},
        },
        "results": "port-results",
        "precision": "float32",
        "behaviours": {"length": "official", "decode": "official"},
        "passed": False,
        "counts": {
            "cases": len(cases),
            "passed": counts["pass"],
            "failed": counts["fail"],
            "not_run": counts["not_run"],
            "unusable": counts["unusable"],
        },
        "cases": cases,
    }


@pytest.fixture(scope="module")
def report():
    return make_report()


@pytest.fixture(scope="module")
def page(report):
    return render_html(json.loads(json.dumps(report)))  # as the grader's JSON file holds it


# ---------------------------------------------------------------------------------------------------------
# the page's structure


def test_the_page_shows_the_verdict_and_every_case(report, page):
    assert page.startswith("<!DOCTYPE html>")
    assert '<div class="big fail">FAIL</div>' in page
    assert "8 of 14 cases passed" in page
    for i, c in enumerate(report["cases"]):
        assert f'id="case-{i}"' in page and f'href="#case-{i}"' in page
        if c["name"] != HOSTILE:
            assert f"<code>{c['name']}</code>" in page
    assert "qwen3-tts-conformance" in page and "port-results" in page and "float32" in page
    assert "length: <b>official</b>" in page


def test_the_plots_are_drawn(report, page):
    with_tensors = sum(bool(c["tensors"]) for c in report["cases"])
    with_codes = sum(bool(c["codes"]) for c in report["cases"])
    waves = sum(bool(c["waveform"]) for c in report["cases"])
    assert page.count('<svg class="plot"') == with_tensors + with_codes + 2 * waves
    # each spectrogram: two images and two colour bars, all PNG files inside the page
    assert page.count('href="data:image/png;base64,') == 4 * waves
    assert page.count('class="mismatch"') >= 1 and page.count('class="exact"') >= 3
    assert "first failure: decoder.decoder.3" in page
    assert "first divergent frame 28" in page
    assert "First divergence:</b> frame 6, codebook 3" in page
    assert "near_tie" in page and "repetition_penalty" in page


def test_the_page_fetches_nothing(page):
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    for value in re.findall(r'(?:href|src)="([^"]*)"', page):
        assert value.startswith(("#case-", "data:image/png;base64,")), value
    assert "default-src 'none'" in page


def test_strings_from_the_port_are_escaped(page):
    assert HOSTILE not in page and HOSTILE_ATTR not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<img" not in page


def test_the_page_stays_small(page):
    # 14 cases, 5 of them with 1,270 tensors or more: markers are bounded per plot, tables per case
    assert len(page.encode()) < 600_000


def test_optional_fields_may_be_missing_null_or_not_finite():
    bare = {
        "format": "refimpl-conformance-report",
        "format_version": 1,
        "cases": [
            {"name": "a", "status": "pass"},
            {"name": "b", "status": "fail", "tensors": "not a list", "codes": None, "waveform": None},
            {
                "name": "c",
                "status": "fail",
                "tensors": [
                    {"key": "x", "max_abs": math.nan, "tol": 1e-5, "ok": False},
                    {"key": "y", "max_abs": math.inf, "tol": 0.0},
                    {"key": "z", "max_abs": 1e-3, "tol": None, "shape": "odd"},
                    {},
                ],
                "codes": {"first_divergence": {"frame": 99}},
                "waveform": {
                    "frame_errors": [1e-7, None, math.inf, 0.0],
                    "tol": math.nan,
                    "spectrogram": {"hop": 480, "reference_db": [[1.0, 2.0]], "diff_db": [[1.0], [2.0, 3.0]]},
                },
            },
            {"name": "d", "waveform": {"spectrogram": {"hop": 0, "diff_db": [[math.nan, None], [1e9, -1e9]]}}},
            "not a case",
        ],
    }
    page = render_html(bare)
    assert "NO VERDICT" in page and "1 of 4 cases passed" in page
    assert "missing or malformed" in page  # the ragged spectrogram
    assert page.count('<section class="case') == 4


def test_a_report_of_another_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        render_html({"format": "something-else", "format_version": 1})
    with pytest.raises(ValueError, match="format_version"):
        render_html({"format": "refimpl-conformance-report", "format_version": 2})
    with pytest.raises(ValueError, match="dict"):
        render_html([])


def test_the_png_writer_round_trips():
    rng = np.random.default_rng(1)
    index = rng.integers(0, len(report_html.DIVERGING), (7, 13), dtype=np.uint8)
    pixels = read_png(report_html.png_indexed(index, report_html.DIVERGING))
    assert np.array_equal(pixels, report_html.DIVERGING[index])


def test_write_html_writes_the_page(tmp_path, report):
    target = tmp_path / "report.html"
    report_html.write_html(report, target)
    assert target.read_text(encoding="utf-8") == render_html(report)


# ---------------------------------------------------------------------------------------------------------
# in a browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing could be fetched even if asked
    "--enable-logging=stderr",
    "--v=0",
]
BROWSER_TIMEOUT = 120  # seconds for one Chromium run; each takes about a second here


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip("needs Chromium for the browser test: apt-get update && apt-get install -y chromium")
    return path


def open_in_chromium(tmp_path, html_text: str, *args: str) -> subprocess.CompletedProcess:
    page_file = tmp_path / "page.html"
    page_file.write_text(html_text, encoding="utf-8")
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    command = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, page_file.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=BROWSER_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def console_messages(stderr: str) -> list:
    """Every console message Chromium logged (with --enable-logging=stderr): a page without scripts has
    none unless something failed (a refused resource, a policy violation, an error)."""
    return [line for line in stderr.splitlines() if re.search(r":CONSOLE[(:]", line)]


def test_the_console_check_sees_an_error(tmp_path):
    broken = "<!DOCTYPE html><p>x</p><script>console.error('seen'); notDefined();</script>"
    messages = console_messages(open_in_chromium(tmp_path, broken, "--dump-dom").stderr)
    assert any("seen" in m for m in messages) and any("notDefined" in m for m in messages), messages


def test_chromium_renders_the_report(tmp_path, page):
    shot = tmp_path / "report.png"
    done = open_in_chromium(tmp_path, page, "--dump-dom", "--window-size=1280,2200", f"--screenshot={shot}")
    assert console_messages(done.stderr) == []
    dom = done.stdout
    assert dom.count('<svg class="plot"') == page.count('<svg class="plot"') > 10
    assert dom.count("<image ") == page.count("<image ") > 0
    assert dom.count("<circle ") == page.count("<circle ") > 100
    assert '<div class="big fail">FAIL</div>' in dom
    assert "<script" not in dom and "<img" not in dom  # the hostile strings stayed text

    pixels = read_png(shot.read_bytes())
    assert pixels.shape[:2] == (2200, 1280)
    rgb = pixels[..., :3].astype(np.int32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert len(colours) > 500, f"the screenshot holds {len(colours)} colours: is it blank?"
    # ink: pixels neither the page's grey nor the cards' white (text, plots, badges)
    paper = (rgb.min(-1) >= 0xF0) & (rgb.max(-1) - rgb.min(-1) <= 6)
    assert 1 - paper.mean() > 0.08, f"only {1 - paper.mean():.1%} of the screenshot is drawn on"
    # the style sheet applied: the FAIL badge's red and the passing markers' green are on screen
    assert colour_count(pixels, "#cf222e") > 2000
    assert colour_count(pixels, "#2da44e") > 200


def colour_count(pixels: np.ndarray, colour: str) -> int:
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels[..., :3].astype(int) - rgb).sum(-1) <= 6).sum())


# ---------------------------------------------------------------------------------------------------------
# a PNG reader (8-bit grey, RGB, RGBA or palette; not interlaced): zlib, struct and the five row filters


def read_png(data: bytes) -> np.ndarray:
    """The pixels [H, W, channels] (palette images as their RGB colours) of a PNG file."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    chunks, pos = {}, 8
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0]
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    w, h, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and interlace == 0, (depth, interlace)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour_type]
    rows = unfilter(zlib.decompress(chunks[b"IDAT"]), w * channels, h, channels)
    pixels = rows.reshape(h, w, channels)
    if colour_type == 3:
        palette = np.frombuffer(chunks[b"PLTE"], np.uint8).reshape(-1, 3)
        pixels = palette[pixels[..., 0]]
    return pixels


def unfilter(raw: bytes, stride: int, h: int, bpp: int) -> np.ndarray:
    data = np.frombuffer(raw, np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), np.uint8)
    prior = np.zeros(stride, np.uint8)
    for y in range(h):
        kind, line = data[y, 0], data[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:  # Sub: a running sum along each channel
            row = (np.cumsum(line.reshape(-1, bpp), axis=0, dtype=np.uint64) % 256).astype(np.uint8).ravel()
        elif kind == 2:  # Up
            row = line + prior
        else:  # Average and Paeth depend on the reconstructed left byte: one byte at a time
            row = bytearray(line.tobytes())
            up = prior.tolist()
            for x in range(stride):
                a = row[x - bpp] if x >= bpp else 0
                b = up[x]
                if kind == 3:
                    row[x] = (row[x] + (a + b) // 2) & 0xFF
                else:
                    c = up[x - bpp] if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            row = np.frombuffer(bytes(row), np.uint8)
        out[y] = row
        prior = row
    return out
