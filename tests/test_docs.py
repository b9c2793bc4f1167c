"""docs/supported_ops.md is generated from the registry and must not drift from it."""

import os

from onnx2tf_alt.docs import supported_ops_markdown

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "supported_ops.md")


def test_supported_ops_doc_is_current():
    with open(DOC) as f:
        assert f.read() == supported_ops_markdown(), (
            "docs/supported_ops.md is stale: run `python -m onnx2tf_alt.docs > docs/supported_ops.md`"
        )
