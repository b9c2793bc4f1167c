"""docs/supported_ops.md is generated from the registry and must not drift from it."""

import os

from onnx2tf_alt.cli.docs import supported_ops_markdown

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "supported_ops.md")


def test_supported_ops_doc_is_current():
    with open(DOC) as f:
        assert f.read() == supported_ops_markdown(), (
            "docs/supported_ops.md is stale: run `python -m onnx2tf_alt.cli.docs > docs/supported_ops.md`"
        )


def test_cli_flags_doc_is_current():
    from onnx2tf_alt.cli.args import own_flags
    from onnx2tf_alt.cli.compat_flags import cli_flags_markdown

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli_flags.md")) as f:
        assert f.read() == cli_flags_markdown(own_flags()), (
            "docs/cli_flags.md is stale: run "
            "`python -m onnx2tf_alt.cli.args > docs/cli_flags.md`"
        )
