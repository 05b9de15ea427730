"""The page around the sections: its head, the Content Security Policy and the inline style sheet."""

from __future__ import annotations

from .text import _e

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


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
