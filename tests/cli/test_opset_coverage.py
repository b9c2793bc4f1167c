"""Every ONNX schema version of a supported op is either served by a handler of its own or
reviewed in onnx2tf_alt/cli/schema_review.py (why the older handler is still right, or a known
gap), checked against the schemas of the installed onnx package. No conversion runs here;
loading the registry imports the ops modules (and TensorFlow) once.
"""

import onnx
import pytest

from onnx2tf_alt.cli import schema_review
from onnx2tf_alt.cli.docs import FOREIGN_DOMAINS, op_coverage, schema_versions
from onnx2tf_alt.translate.registry import all_handlers

HINT = (
    "compare onnx.defs.get_schema({op!r}, {v}, {domain!r}) with version {prev} (attributes, "
    "inputs, outputs, type constraints, doc); if the since={since} handler still converts it, "
    "add a REVIEWED entry to onnx2tf_alt/cli/schema_review.py saying why (or GAP with what "
    "changed), else register a handler with since={v}"
)


@pytest.fixture(scope="module")
def handlers():
    return {key: hs for key, hs in all_handlers().items() if key[0] not in FOREIGN_DOMAINS}


@pytest.fixture(scope="module")
def versions():
    return schema_versions()


def _serving_since(hs, v: int) -> int:
    return max(h.since for h in hs if h.since <= v)


def test_every_served_schema_version_has_a_handler_or_a_review(handlers, versions):
    missing = []
    for (domain, op), hs in sorted(handlers.items()):
        cov = op_coverage(hs, versions.get((domain, op), []))
        for v in cov.older:
            if schema_review.review(domain, op, v) is None:
                prev = cov.versions[cov.versions.index(v) - 1]
                missing.append(f"{op}-{v} ({domain or 'ai.onnx'}): " + HINT.format(
                    op=op, v=v, domain=domain, prev=prev, since=_serving_since(hs, v)))
    assert not missing, (
        f"onnx {onnx.__version__} defines schema versions no handler of their own serves and "
        "schema_review.py does not cover:\n" + "\n".join(missing)
    )


def test_review_entries_are_not_stale(handlers, versions):
    stale = []
    for (domain, op, v), review in sorted(schema_review.REVIEWED.items()):
        where = f"REVIEWED[{(domain, op, v)!r}]"
        if review.kind not in schema_review.KINDS:
            stale.append(f"{where}: unknown kind {review.kind!r}")
        if (domain, op) not in handlers:
            stale.append(f"{where}: no handler for {op} in domain {domain!r}; remove the entry")
            continue
        cov = op_coverage(handlers[(domain, op)], versions.get((domain, op), []))
        if v not in cov.versions:
            stale.append(f"{where}: onnx {onnx.__version__} has no {op}-{v}; remove the entry")
        elif v in cov.own:
            stale.append(f"{where}: a handler with since={v} now serves it; remove the entry")
        elif v in cov.unsupported:
            stale.append(f"{where}: older than the first handler (not converted at all); remove the entry")
    assert not stale, "stale entries in onnx2tf_alt/cli/schema_review.py:\n" + "\n".join(stale)


def test_legacy_gaps_name_served_schema_versions(handlers, versions):
    wrong = []
    for domain, op, v in sorted(schema_review.LEGACY_GAPS):
        hs = handlers.get((domain, op))
        cov = op_coverage(hs or [], versions.get((domain, op), []))
        if hs is None or v not in cov.versions or v in cov.unsupported:
            wrong.append(f"LEGACY_GAPS[{(domain, op, v)!r}]: not a schema version a handler serves")
    assert not wrong, "\n".join(wrong)


def test_handler_sinces_are_schema_versions(handlers, versions):
    """A since between two schema versions would split one schema over two handlers."""
    odd = []
    for (domain, op), hs in sorted(handlers.items()):
        known = versions.get((domain, op))
        for h in hs:
            if known and h.since > known[0] and h.since not in known:
                odd.append(f"{op} ({domain or 'ai.onnx'}) since={h.since}: schemas are {known}")
    assert not odd, "handlers registered at opsets where the schema did not change:\n" + "\n".join(
        odd)


def test_types_reviews_change_only_types(versions):
    """A TYPES review claims the schema changed only its types: inputs and outputs keep their
    names and optionality, and attributes added or dropped (those only the new types read)
    are named in the note."""
    wrong = []
    for (domain, op, v), review in sorted(schema_review.REVIEWED.items()):
        known = versions.get((domain, op), [])
        if review.kind != schema_review.TYPES or v not in known or v == known[0]:
            continue
        old = onnx.defs.get_schema(op, known[known.index(v) - 1], domain)
        new = onnx.defs.get_schema(op, v, domain)
        for what in ("inputs", "outputs"):
            a = [(p.name, p.option) for p in getattr(old, what)]
            b = [(p.name, p.option) for p in getattr(new, what)]
            if a != b:
                wrong.append(f"{op}-{v}: {what} changed {a} -> {b}")
        for name in set(old.attributes) ^ set(new.attributes):
            if name not in review.note:
                wrong.append(f"{op}-{v}: attribute {name!r} added or dropped, not in the note")
    assert not wrong, "TYPES reviews that are not only type changes:\n" + "\n".join(wrong)
