"""The backtest report as one self-contained HTML page, for people who would rather look than
read.

The page is drawn from the report's JSON (`BacktestReport.to_json()`), so the page and the saved
JSON can never disagree. Everything is inline (CSS, SVG drawn here): the page opens from a
mail attachment or an air-gapped disk, and loads nothing from anywhere. Every string that came
from the data goes through `html.escape`: request ids and error messages are whatever callers
sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["SUMMARY_KEYS", "render"]

SUMMARY_KEYS = (
    "task",
    "baseline_versions",
    "requests",
    "requests_compared",
    "rows_compared",
    "missing_served",
    "candidate_errors",
    "agreement",
    "mean_cosine",
    "max_abs_diff",
)

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#1d2330;max-width:1100px}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em;border-bottom:1px solid #dde}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:3px 8px;border:1px solid #dde;
text-align:right}th{background:#f3f4f8}td.l,th.l{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:1.5em}.bad{color:#b3261e}svg text{font-size:11px}
"""
_W, _H, _PAD = 420, 200, 34
_SERVED, _CANDIDATE = "#5470c6", "#ee6666"


def render(data: Mapping[str, Any]) -> str:
    title = f"backtest {data['model']} {data['candidate']}"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _summary(data),
        "<h2>Absolute differences per output</h2>",
        "<p>Per compared row, the largest absolute difference of the output's values.</p>",
        _outputs(data["outputs"]),
        "<h2>Latency</h2>",
        _latency(data["latency"]),
    ]
    if data.get("confusion"):
        parts += ["<h2>Confusion (served class &times; candidate class)</h2>"]
        parts.append(_confusion(data["confusion"]))
    parts += ["<h2>Rows that disagree most</h2>", _top(data["top"])]
    if data["errors"]:
        rows = [[e["error"], e["count"]] for e in data["errors"]]
        parts += ["<h2>Candidate errors</h2>", _table(["error", "requests"], rows)]
    parts.append("</body></html>")
    return "\n".join(parts)


def _fmt(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return escape(f"{value:.6g}")
    if isinstance(value, list):
        return escape(", ".join(str(v) for v in value))
    return escape(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        cls = " class='l'" if i < left else ""
        return f"<{tag}{cls}>{_fmt(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(data: Mapping[str, Any]) -> str:
    return _table(["", "value"], [[k.replace("_", " "), data[k]] for k in SUMMARY_KEYS])


def _outputs(outputs: Mapping[str, Any]) -> str:
    rows = [[n, o["values"], o["mean_abs_diff"], o["max_abs_diff"]] for n, o in outputs.items()]
    table = _table(["output", "values", "mean abs diff", "max abs diff"], rows)
    plots = [_histogram(name, o["histogram"]) for name, o in outputs.items()]
    return table + "<div class='plots'>" + "".join(plots) + "</div>"


def _histogram(name: str, hist: Mapping[str, list[Any]]) -> str:
    counts, edges = hist["counts"], hist["edges"]
    most = max(counts, default=0) or 1
    width = (_W - 2 * _PAD) / max(len(counts), 1)
    bars = []
    for i, n in enumerate(counts):
        h = (_H - 2 * _PAD) * n / most
        x, y = _PAD + i * width, _H - _PAD - h
        tip = f"{edges[i]:.3g} to {edges[i + 1]:.3g}: {n} rows"
        bars.append(
            f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(width - 1, 1):.1f}' height='{h:.1f}' "
            f"fill='{_SERVED}'><title>{escape(tip)}</title></rect>"
        )
    axis = (
        f"<text x='{_PAD}' y='{_H - 12}'>0</text>"
        f"<text x='{_W - _PAD}' y='{_H - 12}' text-anchor='end'>{escape(f'{edges[-1]:.3g}')}</text>"
        f"<text x='{_PAD}' y='{_PAD - 8}'>{escape(name)}: rows by abs diff (max {most})</text>"
    )
    return _svg(axis + "".join(bars), f"histogram of absolute differences of {name}")


def _latency(latency: Mapping[str, Mapping[str, Any]]) -> str:
    keys = ("mean_ms", "p50_ms", "p95_ms", "p99_ms")
    rows = [[side, s["count"], *(s[k] for k in keys)] for side, s in latency.items()]
    table = _table(["side", "requests", "mean ms", "p50 ms", "p95 ms", "p99 ms"], rows)
    served, cand = latency["served"], latency["candidate"]
    top = max((s[k] or 0.0 for s in (served, cand) for k in keys), default=0.0) or 1.0
    group = (_W - 2 * _PAD) / len(keys)
    shapes = []
    for i, key in enumerate(keys):
        for j, (side, colour) in enumerate(((served, _SERVED), (cand, _CANDIDATE))):
            value = side[key] or 0.0
            h = (_H - 2 * _PAD) * value / top
            x = _PAD + i * group + 4 + j * (group - 8) / 2
            shapes.append(
                f"<rect x='{x:.1f}' y='{_H - _PAD - h:.1f}' width='{(group - 8) / 2 - 1:.1f}' "
                f"height='{h:.1f}' fill='{colour}'>"
                f"<title>{escape(f'{value:.4g} ms')}</title></rect>"
            )
        label = key.removesuffix("_ms")
        x = _PAD + (i + 0.5) * group
        shapes.append(f"<text x='{x:.1f}' y='{_H - 12}' text-anchor='middle'>{label}</text>")
    shapes.append(
        f"<text x='{_PAD}' y='{_PAD - 8}'><tspan fill='{_SERVED}'>&#9632; served</tspan> "
        f"<tspan fill='{_CANDIDATE}'>&#9632; candidate</tspan> (max {escape(f'{top:.4g}')} ms)"
        "</text>"
    )
    return table + _svg("".join(shapes), "latency, served and candidate")


def _confusion(confusion: Mapping[str, Any]) -> str:
    matrix = confusion.get("matrix")
    if matrix is None:
        rows = [list(p) for p in confusion["pairs"]]
        note = f"<p>{confusion['classes']} classes: the most frequent pairs.</p>"
        return note + _table(["served", "candidate", "rows"], rows, left=0)
    most = max((n for row in matrix for n in row), default=0) or 1
    head = "<tr><th>served \\ candidate</th>" + "".join(f"<th>{c}</th>" for c in range(len(matrix)))
    body = []
    for s, row in enumerate(matrix):
        cells = []
        for c, n in enumerate(row):
            alpha = 0.08 + 0.8 * n / most if n else 0.0
            hue = "40,120,70" if s == c else "190,40,30"
            cells.append(f"<td style='background:rgba({hue},{alpha:.2f})'>{n}</td>")
        body.append(f"<tr><th>{s}</th>{''.join(cells)}</tr>")
    return f"<table>{head}</tr>{''.join(body)}</table>"


def _top(top: Sequence[Mapping[str, Any]]) -> str:
    keys = ("request_id", "row", "output", "max_abs_diff", "served_class", "candidate_class")
    header = ["request", "row", "output", "max abs diff", "served class", "candidate class"]
    return _table(header, [[t[k] for k in keys] for t in top], left=1)


def _svg(body: str, label: str) -> str:
    frame = f"<line x1='{_PAD}' y1='{_H - _PAD}' x2='{_W - _PAD}' y2='{_H - _PAD}' stroke='#889'/>"
    return (
        f"<svg width='{_W}' height='{_H}' role='img' "
        f"aria-label='{escape(label)}'>{frame}{body}</svg>"
    )
