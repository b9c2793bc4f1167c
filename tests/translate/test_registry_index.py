"""ops/_index.py, the generated map from (domain, op_type) to the ops modules that register
it, is current, and a conversion imports only the modules of its model's ops."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _fresh(code: str) -> str:
    """stdout of `code` in a fresh interpreter (the registry this process filled with every
    ops module cannot show what one import registers)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=300).stdout


def test_the_index_is_current():
    generated = _fresh("from onnx2tf_alt.translate import registry\n"
                       "print(registry.index_source(), end='')")
    with open(os.path.join(ROOT, "ops", "_index.py")) as f:
        assert f.read() == generated, (
            "ops/_index.py is stale: run `python -m onnx2tf_alt.translate.registry > "
            "ops/_index.py`")


def test_finding_a_handler_imports_its_modules_only_and_an_unknown_op_all():
    loaded = _fresh(
        "import sys\n"
        "from onnx2tf_alt.translate.registry import find_handler, ops_modules\n"
        "def ops(): return sorted(m.rpartition('.')[2] for m in sys.modules\n"
        "                         if m.startswith('onnx2tf_alt.ops.') and '._' not in m)\n"
        "assert find_handler('Conv', '', 17).op_type == 'Conv'\n"
        "assert find_handler('Relu', 'ai.onnx', 17).op_type == 'Relu'\n"
        "print(ops())\n"
        "assert find_handler('NoSuchOp', '', 17) is None\n"
        "print(ops() == sorted(ops_modules()))\n")
    first, everything = loaded.splitlines()
    assert "'conv'" in first and "'activation'" in first and "'rnn'" not in first, first
    assert everything == "True"
