"""Generate docs/supported_ops.md from the handler registry:
`python -m onnx2tf_alt.docs > docs/supported_ops.md`."""

from __future__ import annotations

import onnx

from onnx2tf_alt.registry import all_handlers


def supported_ops_markdown() -> str:
    newest = onnx.defs.onnx_opset_version()
    lines = [
        "# Supported ONNX ops",
        "",
        "Generated from the handler registry by `python -m onnx2tf_alt.docs`; do not edit.",
        f"Opsets are checked up to {newest}, the newest the installed onnx package defines.",
        "",
        "| op | domain | opsets (handler versions) | layout | limits |",
        "|---|---|---|---|---|",
    ]
    for (domain, op_type), versions in sorted(all_handlers().items(), key=lambda kv: kv[0][::-1]):
        since = ", ".join(str(h.since) for h in versions)
        layout = getattr(versions[-1].layout, "__name__", "custom")
        limits = "; ".join(h.limits for h in versions if h.limits)
        lines.append(f"| {op_type} | {domain or 'ai.onnx'} | {since}+ | {layout} | {limits} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
