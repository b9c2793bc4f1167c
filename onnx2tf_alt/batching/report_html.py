"""batch_summary.html: one self-contained page, a sortable table and three bar charts."""

from __future__ import annotations

import html
import os

from onnx2tf_alt.batching.results import SUMMARY_HTML, outcome_counts, row

_COLORS = {"ok": "#3a3", "expected-failure": "#8a8", "failed": "#d33", "timeout": "#e90",
           "memory": "#a4c", "crashed": "#555"}
# Click a header to sort by it; numbers sort as numbers, a second click reverses.
_SORT_JS = """
document.querySelectorAll('th').forEach((th, i) => th.onclick = () => {
  const body = th.closest('table').tBodies[0], up = th.dataset.up !== '1';
  th.dataset.up = up ? '1' : '0';
  const key = r => { const t = r.cells[i].textContent, n = parseFloat(t);
                     return isNaN(n) ? t : n; };
  [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
    return (x > y ? 1 : x < y ? -1 : 0) * (up ? 1 : -1); }).forEach(r => body.append(r));
});
"""
_STYLE = """
body { font-family: sans-serif; margin: 2em; } table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #eee; cursor: pointer; } .charts { display: flex; gap: 3em; flex-wrap: wrap; }
"""


def write_summary_html(folder: str, records: list[dict], regressions: list[dict],
                       wall_s: float) -> str:
    """Write batch_summary.html into `folder`; returns its path."""
    counts = outcome_counts(records)
    slowest = sorted((r for r in records if isinstance(r.get("wall_s"), (int, float))),
                     key=lambda r: -r["wall_s"])[:10]
    checked = [r for r in records if (r.get("check") or {}).get("max_abs_err") is not None]
    worst = sorted(checked, key=lambda r: -r["check"]["max_abs_err"])[:10]
    charts = [
        _bars("Outcomes", [(k, v, _COLORS.get(k, "#888")) for k, v in counts.items()], "{:.0f}"),
        _bars("Slowest conversions (s)",
              [(r["name"], r["wall_s"], _COLORS.get(r["outcome"], "#888")) for r in slowest],
              "{:.1f}"),
    ]
    if worst:
        charts.append(_bars("Worst accuracy (max abs error)",
                            [(r["name"], r["check"]["max_abs_err"], "#36c") for r in worst],
                            "{:.2g}"))
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    parts = [
        ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Batch conversion summary"
         f"</title><style>{_STYLE}</style></head><body>"),
        "<h1>Batch conversion summary</h1>",
        f"<p>{len(records)} models in {wall_s:.1f} s: {html.escape(text)}.</p>",
        _regressions(regressions),
        f"<div class='charts'>{''.join(charts)}</div>",
        _table(records),
        f"<script>{_SORT_JS}</script></body></html>",
    ]
    path = os.path.join(folder, SUMMARY_HTML)
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
    return path


def _regressions(regressions: list[dict]) -> str:
    if not regressions:
        return ""
    items = "".join(f"<li><b>{html.escape(r['name'])}</b>: {html.escape(r['why'])}</li>"
                    for r in regressions)
    return f"<h2>Regressions</h2><ul>{items}</ul>"


def _table(records: list[dict]) -> str:
    rows = [row(r) for r in records]
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bars(title: str, items: list[tuple[str, float, str]], fmt: str) -> str:
    """A horizontal bar chart as inline SVG."""
    label_w, bar_w, row_h = 180, 260, 22
    top = max((v for _, v, _ in items), default=0) or 1
    height = row_h * len(items) + 30
    out = [f"<svg width='{label_w + bar_w + 70}' height='{height}' role='img'>",
           f"<text x='0' y='16' font-weight='bold'>{html.escape(title)}</text>"]
    for i, (label, value, color) in enumerate(items):
        y = 28 + i * row_h
        width = max(1.0, bar_w * value / top)
        out += [
            (f"<text x='{label_w - 6}' y='{y + 14}' text-anchor='end' font-size='12'>"
             f"{html.escape(label[:28])}</text>"),
            (f"<rect x='{label_w}' y='{y}' width='{width:.1f}' height='{row_h - 6}' "
             f"fill='{color}'/>"),
            (f"<text x='{label_w + width + 4:.1f}' y='{y + 14}' font-size='12'>"
             f"{fmt.format(value)}</text>"),
        ]
    out.append("</svg>")
    return "".join(out)
