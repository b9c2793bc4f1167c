"""The docs: generated pages match the registry and flags, every relative link and anchor
resolves, every example runs or is marked as needing what it needs."""

import os
import re
import shutil
import subprocess
import sys

import docs_examples
import pytest

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


# --- links, anchors and examples of README.md and docs/*.md (tests/docs_examples.py) -----
LINKS = [link for doc in docs_examples.doc_files() for link in docs_examples.relative_links(doc)]
EXAMPLES = [ex for doc in docs_examples.doc_files() for ex in docs_examples.examples(doc)]
RUN = [ex for ex in EXAMPLES if ex.needs is None]


def test_heading_anchors_follow_github():
    assert docs_examples.slug("Activation ranges: `--calibration_method`") == (
        "activation-ranges---calibration_method")
    assert docs_examples.slug("`generate.py`") == "generatepy"
    assert docs_examples.slug("io_layout.json") == "io_layoutjson"
    lines = ["# Setup", "## Setup", "```", "# Setup", "```", "### Setup", "## Notes"]
    assert docs_examples.heading_anchors(lines) == {"setup", "setup-1", "setup-2", "notes"}


def test_every_relative_link_and_anchor_resolves():
    broken = [f"{link}: {problem}" for link in LINKS
              if (problem := docs_examples.link_problem(link)) is not None]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_example_markers_are_well_formed():
    problems = [p for doc in docs_examples.doc_files() for p in docs_examples.marker_problems(doc)]
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="session")
def example_workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs_workspace")
    docs_examples.make_workspace(str(folder))
    return folder


@pytest.mark.parametrize("example", RUN, ids=[ex.id for ex in RUN])
def test_example_runs(example, example_workspace, tmp_path):
    """Every ```bash / ```python block without a `<!-- example: needs ... -->` marker runs,
    in a copy of the workspace, and writes nothing into the repository."""
    cwd = tmp_path / "work"
    shutil.copytree(example_workspace, cwd)
    before = set(os.listdir(docs_examples.REPO))
    code, output = docs_examples.run_example(example, str(cwd))
    written = {name for name in set(os.listdir(docs_examples.REPO)) - before
               if name in example.code}
    assert code == 0, (f"{example.id}: the example exits {code} (mark it "
                       f"`<!-- example: needs WHAT -->` if it cannot run here):\n"
                       f"{example.code}\n--- output (end) ---\n{output[-3000:]}")
    assert not written, f"{example.id} wrote {sorted(written)} into the repository"


def _contributing_example() -> tuple[str, str, str]:
    """docs/contributing.md's worked example: (op, domain, the handler and direct writer)."""
    blocks = [ex.code for ex in docs_examples.examples("docs/contributing.md")
              if ex.lang == "python" and ("@handler(" in ex.code or "@direct(" in ex.code)]
    registered = re.search(r'@handler\("(\w+)"(?:, domain="([\w.]*)")?', "\n".join(blocks))
    assert registered, "docs/contributing.md has no @handler example"
    return registered.group(1), registered.group(2) or "", "\n\n".join(blocks)


def test_contributing_example_op_is_not_registered_yet():
    """Copying the example into ops/ must add an op, not register one a second time."""
    from onnx2tf_alt.translate.registry import find_handler

    op, domain, _code = _contributing_example()
    assert find_handler(op, domain, 10_000) is None, (
        f"docs/contributing.md's example op {domain or 'ai.onnx'}:{op} already has a handler: "
        "pick one the registry does not have")


_CONVERT_EXAMPLE_OP = '''
import json, sys
import numpy as np
import onnx2tf_alt
from ai_edge_litert.interpreter import Interpreter
from onnx import TensorProto, helper

exec(sys.argv[1])
op, domain = sys.argv[2], sys.argv[3]
node = helper.make_node(op, ["x"], ["y"], domain=domain)
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
model = helper.make_model(graph, opset_imports=opsets)
x = np.random.default_rng(0).normal(size=(1, 3, 8, 8)).astype(np.float32)
outputs = {}
for writer in ("direct", "tf"):
    onnx2tf_alt.convert(onnx_graph=model, output_folder_path=writer, disable_model_save=True,
                        tflite_writer=writer)
    layout = json.load(open(f"{writer}/model_io_layout.json"))
    entry = layout["inputs"][0]
    runner = Interpreter(f"{writer}/model_float32.tflite").get_signature_runner()
    result = runner(**{entry["tflite_name"]: np.transpose(x, entry["perm"])})
    outputs[writer] = next(iter(result.values()))
print("max |direct - tf|:", np.abs(outputs["direct"] - outputs["tf"]).max())
assert np.allclose(outputs["direct"], outputs["tf"], atol=1e-6)
'''


def test_contributing_example_converts(tmp_path):
    """The example's handler and direct writer, as written, convert a one-node model through
    both routes to the same outputs (in a subprocess: the registry here stays as it is)."""
    op, domain, code = _contributing_example()
    proc = subprocess.run([sys.executable, "-c", _CONVERT_EXAMPLE_OP, code, op, domain],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
