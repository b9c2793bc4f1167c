"""The accuracy report as a console table, a JSON file and an HTML page with a plot; the
page also summarizes `<stem>_delegates.json` (export/delegates.py) when it lies beside it."""

from __future__ import annotations

import html
import json
import math
import os
import sys

from onnx2tf_alt.check.compare import FAIL, PASS, UNOBSERVED, AccuracyReport, BackendReport

BACKEND_TITLES = {"tf": "TensorFlow / Keras", "tflite": "float32 TFLite"}
COLUMNS = ("#", "node", "op", "output", "shape", "max abs err", "rel err", "cosine", "status")
_ANSI = {PASS: "\033[32m", FAIL: "\033[31m", UNOBSERVED: "\033[33m", "first": "\033[1;41;97m"}
_RESET = "\033[0m"


def _number(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _cells(index: int, check) -> tuple[str, ...]:
    return (
        str(index), check.node_name, check.op_type, check.output_name,
        "x".join(str(d) for d in check.shape) or "scalar", _number(check.max_abs_err),
        _number(check.max_rel_err), "-" if check.cosine is None else f"{check.cosine:.6f}",
        check.status.upper() if check.status == FAIL else check.status,
    )


def _title(backend: BackendReport) -> str:
    if backend.backend.startswith("tflite:"):
        return f"{backend.backend[len('tflite:'):]} TFLite (dequantized)"
    return BACKEND_TITLES.get(backend.backend, backend.backend)


def _backend_summary(backend: BackendReport) -> str:
    title = _title(backend)
    if backend.error:
        return f"{title}: not checked ({backend.error})"
    counts = {s: sum(c.status == s for c in backend.checks) for s in (PASS, FAIL, UNOBSERVED)}
    text = f"{title}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[UNOBSERVED]} unobserved"
    if backend.criterion:
        text += f" ({backend.criterion})"
    first = backend.first_divergence
    if first is not None:
        text += f"; first divergence at node '{first.node_name}' ({first.op_type}) " \
                f"output '{first.output_name}'"
    return text


def console_table(report: AccuracyReport, color: bool | None = None) -> str:
    """The report as text tables, one per runtime; ANSI colours when `color` (default: when
    stdout is a terminal). The first diverging value is highlighted."""
    color = sys.stdout.isatty() if color is None else color
    title = (f"Accuracy check of {report.model} against onnxruntime "
             f"(atol={report.atol:g}, rtol={report.rtol:g})")
    lines = [title]
    if report.error:
        return "\n".join([*lines, f"not run: {report.error}"])
    for backend in report.backends.values():
        rows = [COLUMNS] + [_cells(i, c) for i, c in enumerate(backend.checks)]
        widths = [min(max(len(r[k]) for r in rows), 40) for k in range(len(COLUMNS))]
        lines += ["", _backend_summary(backend)]
        first = backend.first_divergence
        for i, row in enumerate(rows):
            text = "  ".join(cell[:40].ljust(w) for cell, w in zip(row, widths)).rstrip()
            check = backend.checks[i - 1] if i else None
            if color and check is not None:
                style = _ANSI["first"] if check is first else _ANSI[check.status]
                text = f"{style}{text}{_RESET}"
            elif check is not None and check is first:
                text += "   <-- first divergence"
            lines.append(text)
    lines += ["", "PASSED" if report.passed else "FAILED"]
    return "\n".join(lines)


def write_json(report: AccuracyReport, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.to_dict(), f, indent=2)


# --- HTML ----------------------------------------------------------------------------------
_SERIES = {"tf": "#1f77b4", "tflite": "#ff7f0e"}
_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 12px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f0f0f0; position: sticky; top: 0; }
td.num { text-align: right; font-family: monospace; }
tr.pass td.status { color: #2a7d2a; } tr.fail td.status { color: #c62828; font-weight: bold; }
tr.unobserved td.status { color: #b26a00; }
tr.first { background: #ffe0e0; outline: 2px solid #c62828; }
.verdict-pass { color: #2a7d2a; } .verdict-fail { color: #c62828; }
.note { color: #666; }
"""


def write_html(report: AccuracyReport, path: str, delegates: dict | None = None,
               quant: dict | None = None, micro: dict | None = None) -> None:
    """A self-contained page: summary, log-scale error plot (SVG), one table per runtime,
    and the sections of the delegate report, the quant report and the TFLite Micro report
    when `delegates` / `quant` / `micro` (their JSON) are given."""
    esc = html.escape
    verdict = "PASSED" if report.passed else "FAILED"
    inputs = ", ".join(
        f"{esc(n)} {esc(str(i['shape']))} {esc(i['dtype'])} ({esc(i['source'])})"
        for n, i in report.inputs.items()
    )
    heading = (f"<h1>Accuracy report: {esc(report.model)} "
               f"<span class='verdict-{verdict.lower()}'>{verdict}</span></h1>")
    rule = ("<p>Reference: onnxruntime. Rule: |converted &minus; onnx| &le; "
            f"atol + rtol&middot;|onnx| elementwise (atol={report.atol:g}, "
            f"rtol={report.rtol:g}); shapes must match; integers and bools exact. "
            f"Inputs (seed {report.seed}): {inputs}.</p>")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Accuracy report: {esc(report.model)}</title><style>{_CSS}</style></head><body>",
        heading,
        rule,
    ]
    if report.error:
        parts.append(f"<p class='verdict-fail'>Not run: {esc(report.error)}</p>")
    else:
        parts += [f"<p>{esc(_backend_summary(b))}</p>" for b in report.backends.values()]
        parts.append(_svg_plot(report))
        for backend in report.backends.values():
            parts.append(_html_table(backend))
    if quant is not None:
        parts.append(_quant_section(quant))
    if micro is not None:
        parts.append(_micro_section(micro))
    if delegates is not None:
        parts.append(_delegate_section(delegates))
    parts.append("</body></html>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def _html_table(backend: BackendReport) -> str:
    esc = html.escape
    title = _title(backend)
    head = "".join(f"<th>{esc(c)}</th>" for c in (*COLUMNS, "note"))
    rows = []
    first = backend.first_divergence
    for i, check in enumerate(backend.checks):
        cells = _cells(i, check)
        classes = check.status + (" first" if check is first else "")
        tds = [f"<td class='num'>{esc(cells[0])}</td>"]
        tds += [f"<td>{esc(c)}</td>" for c in cells[1:5]]
        tds += [f"<td class='num'>{esc(c)}</td>" for c in cells[5:8]]
        tds.append(f"<td class='status'>{esc(cells[8])}</td>")
        tds.append(f"<td class='note'>{esc(check.note)}</td>")
        rows.append(f"<tr id='{backend.backend}-{i}' class='{classes}'>{''.join(tds)}</tr>")
    return (f"<h2>{esc(title)}</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _svg_plot(report: AccuracyReport) -> str:
    """Max abs error per value in topological order, log scale; atol line; first
    divergence of each runtime marked with a vertical line. Failures without a number
    (shape mismatch, non-finite values) sit on the top edge as crosses."""
    backends = [b for b in report.backends.values() if b.checks]
    count = max((len(b.checks) for b in backends), default=0)
    if count == 0:
        return ""
    errors = [c.max_abs_err for b in backends for c in b.checks if c.max_abs_err]
    reference = report.atol or 1.0
    lo = math.floor(math.log10(max(min(errors + [reference]), 1e-10)))
    hi = math.ceil(math.log10(max(errors + [reference]))) + 1
    lo = min(lo, hi - 2)
    width, height, left, right, top, bottom = 900, 320, 60, 20, 20, 40
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * (i + 0.5) / count)

    def y(err: float) -> float:
        return top + plot_h * (hi - math.log10(max(err, 10.0 ** lo))) / (hi - lo)

    svg = [
        (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
         "font-family='sans-serif' font-size='11'>"),
        (f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='#fafafa' "
         "stroke='#999'/>"),
    ]
    for e in range(lo, hi + 1):
        svg.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y(10.0 ** e):.1f}' "
                   f"y2='{y(10.0 ** e):.1f}' stroke='#e4e4e4'/>")
        svg.append(f"<text x='{left - 6}' y='{y(10.0 ** e) + 4:.1f}' text-anchor='end'>"
                   f"1e{e}</text>")
    if report.atol > 0:
        ya = y(report.atol)
        svg.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{ya:.1f}' y2='{ya:.1f}' "
                   "stroke='#c62828' stroke-dasharray='5,4'/>")
        svg.append(f"<text x='{left + 4}' y='{ya - 4:.1f}' fill='#c62828'>"
                   f"atol {report.atol:g}</text>")
    for k, backend in enumerate(backends):
        svg += _series(backend, k, x, y, top)
        first = backend.first_divergence
        if first is not None:
            fx = x(backend.checks.index(first))
            colour = _SERIES.get(backend.backend, "#555")
            # the label goes on the side of the line with room for it
            anchor, dx = ("end", -4) if fx > left + plot_w / 2 else ("start", 4)
            svg.append(f"<line x1='{fx:.1f}' x2='{fx:.1f}' y1='{top}' y2='{top + plot_h}' "
                       f"stroke='{colour}' stroke-width='2' opacity='0.8'/>")
            svg.append(f"<text x='{fx + dx:.1f}' y='{top + 14 + 14 * k}' fill='{colour}' "
                       f"text-anchor='{anchor}'>first divergence ({backend.backend}): "
                       f"{html.escape(first.node_name)}</text>")
        legend_x = left + 10 + 170 * k
        svg.append(f"<rect x='{legend_x}' y='{height - 14}' width='10' height='10' "
                   f"fill='{_SERIES.get(backend.backend, '#555')}'/>"
                   f"<text x='{legend_x + 14}' y='{height - 5}'>"
                   f"{_title(backend)}</text>")
    svg.append(f"<text x='{left + plot_w / 2:.1f}' y='{height - 22}' text-anchor='middle'>"
               f"values in topological order (max abs error; 0 drawn at 1e{lo}, "
               "failures without a number as crosses on top)</text>")
    svg.append("</svg>")
    return "<h2>Max abs error per value</h2>" + "".join(svg)


def _series(backend: BackendReport, k: int, x, y, top: float) -> list[str]:
    """One runtime's points (the k-th series: later ones are drawn as rings, so points of
    several runtimes that coincide stay visible) and the line through them."""
    colour = _SERIES.get(backend.backend, "#555")
    title = _title(backend)
    observed = [(i, c) for i, c in enumerate(backend.checks) if c.status != UNOBSERVED]
    numbered = [(x(i), y(c.max_abs_err or 0.0)) for i, c in observed if c.max_abs_err is not None]
    out = []
    if numbered:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in numbered)
        out.append(f"<polyline points='{path}' fill='none' stroke='{colour}' "
                   "stroke-width='1.2' opacity='0.7'/>")
    for i, check in observed:
        fill = colour if check.status == PASS else "#c62828"
        tip = html.escape(f"{title}: {check.node_name} ({check.op_type}) {check.output_name}: "
                          f"{_number(check.max_abs_err)} [{check.status}] {check.note}")
        if check.max_abs_err is None:
            cx, cy, r = x(i), top + 4, 4
            out.append(f"<path d='M{cx - r:.1f},{cy - r} L{cx + r:.1f},{cy + r} "
                       f"M{cx - r:.1f},{cy + r} L{cx + r:.1f},{cy - r}' stroke='{fill}' "
                       f"stroke-width='2'><title>{tip}</title></path>")
            continue
        style = f"fill='{fill}'" if k == 0 else f"fill='none' stroke='{fill}' stroke-width='1.5'"
        out.append(f"<circle cx='{x(i):.1f}' cy='{y(check.max_abs_err):.1f}' "
                   f"r='{2.5 + 2 * k}' {style}><title>{tip}</title></circle>")
    return out


DELEGATE_ROWS = 50  # ops listed individually; the rest are counted


def _micro_section(micro: dict) -> str:
    """The TFLite Micro report: arena, flash, outputs against ai-edge-litert, the largest
    tensors and the ops with their resolver calls."""
    esc = html.escape

    def nodes(entry: dict) -> str:
        return esc(", ".join(f"{n['name']} ({n['op_type']})" for n in entry["onnx_nodes"]))

    agreement = "".join(
        f"<tr><td>{esc(name)}</td><td class='num'>{o['max_abs_diff']:g} {esc(o['unit'])}</td>"
        f"<td class='num'>{o['differing_values']}/{o['values']}</td>"
        f"<td class='num'>{r['max_abs_diff']:g} {esc(r['unit'])}</td></tr>"
        for (name, o), r in zip(micro["outputs"].items(),
                                micro["outputs_reference_kernels"].values()))
    tensors = "".join(
        f"<tr><td>{esc(t['op'] or 'input')}</td><td>{esc('x'.join(map(str, t['shape'])))}</td>"
        f"<td>{esc(t['dtype'])}</td><td class='num'>{t['bytes']}</td><td>{nodes(t)}</td></tr>"
        for t in micro["largest_tensors"])
    ops = "".join(
        f"<tr><td class='num'>{o['index']}</td><td>{esc(o['op'])}</td>"
        f"<td class='num'>{o['version']}</td><td>{esc(o['resolver_call'] or '')}</td>"
        f"<td>{nodes(o)}</td></tr>" for o in micro["ops"])
    return (f"<h2>TensorFlow Lite for Microcontrollers ({esc(micro['file'])})</h2>"
            f"<p>{esc(micro['summary'])}. Tensor arena: {micro['arena_bytes']} bytes "
            f"(smallest that allocates, by bisection); flatbuffer (flash): "
            f"{micro['flatbuffer_bytes']} bytes; tflite-micro {esc(micro['tflite_micro'])}."
            "</p><table><thead><tr><th>output</th><th>max difference vs ai-edge-litert</th>"
            "<th>differing values</th><th>vs its reference kernels</th></tr></thead>"
            f"<tbody>{agreement}</tbody></table><h3>Largest tensors</h3><table><thead><tr>"
            "<th>made by</th><th>shape</th><th>type</th><th>bytes</th><th>ONNX nodes</th>"
            f"</tr></thead><tbody>{tensors}</tbody></table><h3>Ops</h3><table><thead><tr>"
            "<th>#</th><th>op</th><th>version</th><th>resolver call</th><th>ONNX nodes</th>"
            f"</tr></thead><tbody>{ops}</tbody></table><pre>"
            f"{esc(chr(10).join(micro['resolver']))}</pre>")


def _delegate_section(delegates: dict) -> str:
    """The summary line, ops per type (XNNPACK / GPU) and the ops off either delegate with
    their ONNX nodes."""
    esc = html.escape
    ops = delegates["ops"]
    counts: dict[str, list[int]] = {}
    for o in ops:
        row = counts.setdefault(o["op"], [0, 0, 0])
        row[0] += 1
        row[1] += o["delegated"] is True
        row[2] += bool(o["gpu_issue"])
    per_type = "".join(f"<tr><td>{esc(op)}</td><td class='num'>{n}</td><td class='num'>{x}</td>"
                       f"<td class='num'>{g}</td></tr>" for op, (n, x, g) in sorted(counts.items()))
    off = [o for o in ops if o["delegated"] is False or o["gpu_issue"]]
    rows = []
    for o in off[:DELEGATE_ROWS]:
        nodes = ", ".join(f"{n['name']} ({n['op_type']})" for n in o["onnx_nodes"])
        xnnpack = "yes" if o["delegated"] else "no"
        rows.append(f"<tr><td class='num'>{o['index']}</td><td>{esc(o['op'])}</td>"
                    f"<td>{xnnpack}</td><td>{esc(o['gpu_issue'] or '')}</td>"
                    f"<td>{esc(nodes)}</td></tr>")
    more = (f"<p class='note'>... {len(off) - DELEGATE_ROWS} more in the JSON file</p>"
            if len(off) > DELEGATE_ROWS else "")
    listing = ""
    if off:
        listing = (f"<table><thead><tr><th>#</th><th>op</th><th>XNNPACK</th><th>GPU issue"
                   f"</th><th>ONNX nodes</th></tr></thead><tbody>{''.join(rows)}</tbody>"
                   f"</table>{more}")
    return (f"<h2>Delegates (float32 .tflite)</h2><p>{esc(delegates['summary'])}</p>"
            "<table><thead><tr><th>op</th><th>count</th><th>on XNNPACK</th>"
            f"<th>GPU-incompatible</th></tr></thead><tbody>{per_type}</tbody></table>"
            f"{listing}")


def write_reports(report: AccuracyReport, folder: str, stem: str) -> tuple[str, str]:
    """`<stem>_accuracy_report.json` and `.html` in `folder`, the page with the sections of
    `<stem>_quant_report.json`, `<stem>_micro.json` and `<stem>_delegates.json` when those
    files are in `folder`; returns both paths."""
    json_path = os.path.join(folder, f"{stem}_accuracy_report.json")
    html_path = os.path.join(folder, f"{stem}_accuracy_report.html")
    write_json(report, json_path)
    found = {}
    for kind in ("delegates", "quant_report", "micro"):
        path = os.path.join(folder, f"{stem}_{kind}.json")
        if os.path.isfile(path):
            with open(path) as f:
                found[kind] = json.load(f)
    write_html(report, html_path, found.get("delegates"), found.get("quant_report"),
               found.get("micro"))
    return json_path, html_path


def _cosine(x: float | None) -> str:
    return "-" if x is None else f"{x:.5f}"


def _quant_section(quant: dict) -> str:
    """The quant report's held-out comparison per file and output, and with a sensitivity
    ranking its most sensitive INT8 nodes and the nodes kept in float."""
    esc = html.escape
    rows = []
    for entry in quant.get("files", []):
        if entry.get("error"):
            rows.append(f"<tr><td>{esc(entry['variant'])}</td><td colspan='5' "
                        f"class='verdict-fail'>{esc(entry['error'])}</td></tr>")
        for output, m in entry.get("outputs", {}).items():
            top1 = m.get("top1_agreement")
            rows.append(f"<tr><td>{esc(entry['variant'])}</td><td>{esc(output)}</td>"
                        f"<td class='num'>{_cosine(m['cosine'])}</td>"
                        f"<td class='num'>{_cosine(m['cosine_min'])}</td>"
                        f"<td class='num'>{_number(m.get('max_abs_error'))}</td>"
                        f"<td class='num'>{'' if top1 is None else f'{top1:.3f}'}</td></tr>")
    held_out = quant.get("held_out_samples")
    parts = [(f"<h2>Quantized files against the float32 TFLite ({held_out} held-out "
              f"samples)</h2><table><thead><tr><th>file</th><th>output</th><th>cosine</th>"
              "<th>lowest sample</th><th>max abs error</th><th>top-1 agreement</th></tr>"
              f"</thead><tbody>{''.join(rows)}</tbody></table>")]
    sensitivity = quant.get("sensitivity")
    if sensitivity:
        kept = ", ".join(sensitivity["kept_float_nodes"]) or "none"
        ranked = "".join(
            f"<tr><td class='num'>{k}</td><td>{esc(', '.join(r['nodes']))}</td>"
            f"<td>{esc(r['op'])}</td><td class='num'>{r['float_ops']}</td>"
            f"<td class='num'>{r['estimated_gain']:+.5f}</td></tr>"
            for k, r in enumerate(sensitivity["top_offenders"], 1))
        parts.append(
            f"<h2>Most sensitive INT8 nodes</h2><p>Ranking: {esc(sensitivity['method'])}. "
            f"INT8 output cosine {_cosine(sensitivity['cosine_int8'])}; kept in float: "
            f"{esc(kept)} ({sensitivity['float_ops']} TFLite ops).</p><table><thead><tr>"
            "<th>#</th><th>ONNX nodes</th><th>op</th><th>float ops</th><th>estimated gain"
            f"</th></tr></thead><tbody>{ranked}</tbody></table>")
    return "".join(parts)
