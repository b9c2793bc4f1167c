"""Every case of tests/hostile.py through the real CLI: its exit code, the first line of its
message, every pre-existing file (inside and beside the output folder) unchanged unless it is
the converted model's own earlier output, and no staging or temporary folder left."""

from __future__ import annotations

import pytest

from hostile import CASES, play


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(tmp_path, case):
    outcome = play(case, str(tmp_path))
    assert outcome.code == case.code, outcome.output
    assert "Traceback" not in outcome.output and "internal error" not in outcome.output, \
        outcome.output
    assert case.phrase in outcome.first_line, outcome.output
    if case.code:
        assert outcome.first_line.startswith(("error:", "WARNING:", "onnx2tf-alt: error:")), \
            outcome.output
    assert outcome.changed == [], (outcome.changed, outcome.output)
    assert outcome.left == [], outcome.left
