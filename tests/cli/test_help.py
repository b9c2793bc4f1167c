"""`onnx2tf-alt -h` is a page a person can scan: one line per flag in named groups, within
100 columns, naming the other entry points; the detail is docs/cli.md's."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from onnx2tf_alt.cli.args import parser

from cli_runner import run_cli

# 76 lines when written (212 before the groups); a few spare for a new flag, not a new
# group: past this, move detail to docs/cli.md rather than raise the number.
MAX_LINES = 82
WIDTH = 100
GROUPS = ("input and output", "shapes and layout", "accuracy check against onnxruntime",
          "quantization", "generative models", "deployment targets and lowering",
          "onnx2tf compatibility", "messages")
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")


def _shown() -> list[argparse.Action]:
    """The flags -h lists (the onnx2tf flags we only note or refuse are hidden)."""
    return [a for a in parser()._actions if a.help != argparse.SUPPRESS]


def test_help_is_short_narrow_and_grouped():
    lines = parser().format_help().splitlines()
    assert len(lines) <= MAX_LINES, len(lines)
    assert max(map(len, lines)) <= WIDTH, max(lines, key=len)
    assert lines[0] == "usage: onnx2tf-alt -i MODEL.onnx [-o DIR] [options]"
    titles = [line[:-1] for line in lines if line and not line[0].isspace() and
              line.endswith(":")]
    assert [t.split(" (")[0] for t in titles] == list(GROUPS)
    text = "\n".join(lines)
    for entry in ("onnx2tf-alt batch SOURCE -o OUT_ROOT", "onnx2tf-alt batch -h",
                  "python -m onnx2tf_alt", "onnx2tf_alt.convert(", "docs/cli.md",
                  "docs/cli_flags.md"):
        assert entry in text, entry


def test_every_flag_has_one_line():
    """Each flag's line holds its name and help; no help wraps onto a second line."""
    lines = parser().format_help().splitlines()
    for action in _shown():
        name = next((s for s in action.option_strings if not s.startswith("--")),
                    action.option_strings[0])
        [line] = [line for line in lines if re.match(rf"  {re.escape(name)}(\s|$)", line)]
        assert action.help.split("\n")[0] in line, (name, line)
    assert not [line for line in lines if re.match(r" {30}\S", line)]  # wrapped help


def test_every_shown_flag_is_detailed_in_the_docs():
    """-h keeps one line per flag because docs/cli.md explains each, by both names."""
    with open(DOC) as f:
        doc = f.read()
    for action in _shown():
        assert f"`{', '.join(action.option_strings)}" in doc, action.option_strings


def test_the_real_cli_prints_it_and_a_bad_flag_prints_one_usage_line():
    code, output = run_cli("-h")
    assert code == 0 and output == parser().format_help()
    code, output = run_cli("-i", "m.onnx", "--no_such_flag")
    assert code == 2
    assert output.splitlines() == ["usage: onnx2tf-alt -i MODEL.onnx [-o DIR] [options]",
                                   "onnx2tf-alt: error: unrecognized arguments: --no_such_flag"]


@pytest.mark.parametrize("flag", ["-V", "-h"])
def test_version_and_help_still_exit_0(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args([flag])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out
