"""batch_summary.html: one self-contained page, a sortable table and bar charts."""

from __future__ import annotations

import html
import os

from onnx2tf_alt.batching.results import SUMMARY_HTML, outcome_counts, row

_COLORS = {"ok": "#3a3", "expected-failure": "#8a8", "failed": "#d33", "timeout": "#e90",
           "memory": "#a4c", "crashed": "#555"}
# Click a header to sort by it, a second click reverses. Cells that are numbers sort as
# numbers, before text; empty cells stay last either way.
_SORT_JS = """
const heads = document.querySelectorAll('th');
heads.forEach((th, i) => th.onclick = () => {
  const body = th.closest('table').tBodies[0], dir = th.dataset.up === '1' ? -1 : 1;
  heads.forEach(h => delete h.dataset.up);
  th.dataset.up = dir === 1 ? '1' : '0';
  const key = r => { const t = r.cells[i].textContent.trim(), n = Number(t);
                     return t === '' ? null : isNaN(n) ? t : n; };
  const order = (x, y) => {
    if (x === null || y === null) return (x === null) - (y === null);
    if (typeof x !== typeof y) return (typeof x === 'number' ? -1 : 1) * dir;
    return (x > y ? 1 : x < y ? -1 : 0) * dir;
  };
  [...body.rows].sort((a, b) => order(key(a), key(b))).forEach(r => body.append(r));
});
"""
_STYLE = """
body { font-family: sans-serif; margin: 2em; } table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; white-space: nowrap; }
td.wrap { white-space: normal; min-width: 14em; } h2.bad { color: #d33; }
th { background: #eee; cursor: pointer; }
th[data-up='1']::after { content: ' \\25B2'; } th[data-up='0']::after { content: ' \\25BC'; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: flex; gap: 1em 3em; flex-wrap: wrap; margin-bottom: 1.5em; }
.hint { color: #666; font-size: 90%; }
""" + "".join(f"td.o-{k} {{ color: {c}; font-weight: bold; }}\n" for k, c in _COLORS.items()
              if k not in ("ok", "expected-failure"))

# The class of a table column's cells: outcomes coloured, the error text may wrap.
_CELL_CSS = {"outcome": "o-{outcome}", "error": "wrap"}


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
    timed = [r for r in records if isinstance(r.get("latency_ratio"), (int, float))]
    if timed:
        charts.append(_bars("Slowest to run (TFLite / onnxruntime)",
                            [(r["name"], r["latency_ratio"], "#c63")
                             for r in sorted(timed, key=lambda r: -r["latency_ratio"])[:10]],
                            "{:.2f}x"))
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
    return f"<h2 class='bad'>Regressions</h2><ul>{items}</ul>"


def _table(records: list[dict]) -> str:
    rows = [row(r) for r in records]
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(_cell(v, _CELL_CSS.get(k, "").format(**record))
                         for k, v in r.items()) + "</tr>"
        for record, r in zip(records, rows)
    )
    return ("<p class='hint'>Click a column header to sort by it.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _cell(value, css: str) -> str:
    text = str(value)
    try:
        float(text)
        css = "n"  # numbers align right
    except ValueError:
        pass
    attribute = f" class='{css}'" if css else ""
    return f"<td{attribute}>{html.escape(text)}</td>"


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
