"""Generate docs/supported_ops.md from the handler registry:
`python -m onnx2tf_alt.cli.docs > docs/supported_ops.md`.

Beside each op's handlers it lists the ONNX schema versions the installed onnx defines,
and for each version without a handler of its own the review (onnx2tf_alt.cli.schema_review)
that says why the older handler still converts it, or that it is a known gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnx2tf_alt.cli import schema_review
from onnx2tf_alt.translate.registry import Handler, all_handlers, has_direct

# Domains whose ops are not in onnx's schemas, and what they are instead.
FOREIGN_DOMAINS = {
    "com.microsoft": "not in onnx (onnxruntime contrib op)",
    "onnx2tf_alt": "internal (made by this converter)",
}


def schema_versions() -> dict[tuple[str, str], list[int]]:
    """(domain, op) -> the sorted `since_version`s of every schema the installed onnx has."""
    versions: dict[tuple[str, str], list[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        versions.setdefault((schema.domain, schema.name), []).append(schema.since_version)
    return {key: sorted(set(v)) for key, v in versions.items()}


@dataclass
class OpCoverage:
    """How an op's schema versions are served: by a handler of their own, by an older
    handler (reviewed or not), or not at all (older than the first handler)."""

    versions: list[int]
    own: list[int]
    older: list[int]
    unsupported: list[int]


def op_coverage(handlers: list[Handler], versions: list[int]) -> OpCoverage:
    """Split `versions` by the handlers that serve them; a handler `since` older than the
    first schema (e.g. the default since=1) starts at that first schema."""
    if not versions:
        return OpCoverage([], [], [], [])
    starts = {max(h.since, versions[0]) for h in handlers}
    first = min(starts)
    return OpCoverage(
        versions=versions,
        own=[v for v in versions if v in starts],
        older=[v for v in versions if v > first and v not in starts],
        unsupported=[v for v in versions if v < first],
    )


def _other_versions(domain: str, op_type: str, cov: OpCoverage) -> str:
    parts = []
    for v in cov.older:
        review = schema_review.review(domain, op_type, v)
        kind = "**not reviewed**" if review is None else review.kind
        parts.append(f"{v} {'**gap**' if kind == schema_review.GAP else kind}")
    if cov.unsupported:
        parts.append("unsupported: " + ", ".join(map(str, cov.unsupported)))
    return "; ".join(parts)


def _table(handlers: dict, versions: dict) -> list[str]:
    lines = [
        "| op | domain | schema versions | handlers (since) | other schema versions (why an "
        + "older handler serves them) | layout | direct writer (since) | limits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (domain, op_type), hs in sorted(handlers.items(), key=lambda kv: kv[0][::-1]):
        since = ", ".join(str(h.since) for h in hs)
        layout = hs[-1].layout.name
        limits = "; ".join(h.limits for h in hs if h.limits)
        cov = op_coverage(hs, versions.get((domain, op_type), []))
        if domain in FOREIGN_DOMAINS:
            schemas = FOREIGN_DOMAINS[domain]
        else:
            schemas = ", ".join(map(str, cov.versions)) or "not in onnx's schemas"
        other = _other_versions(domain, op_type, cov)
        direct = ", ".join(str(h.since) for h in hs if has_direct(h)) or "-"
        lines.append(f"| {op_type} | {domain or 'ai.onnx'} | {schemas} | {since} | {other} "
                     f"| {layout} | {direct} | {limits} |")
    return lines


def _gaps() -> list[str]:
    lines = ["## Known gaps", "",
             "Schema versions whose changed behaviour the handler serving them does not follow.",
             ""]
    for (domain, op_type, v), review in sorted(schema_review.REVIEWED.items()):
        if review.kind == schema_review.GAP:
            lines.append(f"- {op_type}-{v} ({domain or 'ai.onnx'}): {review.note}")
    for (domain, op_type, v), note in sorted(schema_review.LEGACY_GAPS.items()):
        lines.append(f"- {op_type}-{v} ({domain or 'ai.onnx'}): {note}")
    return lines


def _review_notes() -> list[str]:
    lines = ["## Schema versions served by an older handler", "",
             "What changed against the previous schema version, and why the handler still "
             + "converts it (onnx2tf_alt/cli/schema_review.py).", ""]
    by_op: dict[tuple[str, str], list[str]] = {}
    for (domain, op_type, v), review in sorted(schema_review.REVIEWED.items()):
        by_op.setdefault((domain, op_type), []).append(f"{v} {review.kind}: {review.note}")
    for (domain, op_type), notes in sorted(by_op.items(), key=lambda kv: kv[0][::-1]):
        lines.append(f"- **{op_type}** ({domain or 'ai.onnx'}): " + "; ".join(notes))
    return lines


def supported_ops_markdown() -> str:
    newest = onnx.defs.onnx_opset_version()
    lines = [
        "# Supported ONNX ops",
        "",
        "Generated from the handler registry by `python -m onnx2tf_alt.cli.docs`; do not edit.",
        f"Opsets are checked up to {newest}, the newest the installed onnx package defines.",
        "A handler registered `since` N serves opsets from N until the op's next handler; "
        + "the schema versions are those of the installed onnx.",
        "",
        *_table(all_handlers(), schema_versions()),
        "",
        *_gaps(),
        "",
        *_review_notes(),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
