"""The console of an -oiqt conversion, as a person reads it: lines that fit 120 columns,
nothing said twice, the quantization choices once in the report's table, and a closing
summary of every written file with its size (the manifest too)."""

from __future__ import annotations

import json
import os
import re

import pytest

from onnx2tf_alt.export.summary import summary

from cli_runner import run_cli

MODEL = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")
STEM = "mobilenet_block"
SIZE = r"\d+(\.\d)? (B|KB|MB|GB)"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[str, list[str]]:
    """(output folder, console lines) of one -oiqt conversion (about 20 s)."""
    folder = str(tmp_path_factory.mktemp("console") / "out")
    code, output = run_cli("-i", MODEL, "-o", folder, "-oiqt", "-osm")
    assert code == 0, output
    return folder, output.splitlines()


def test_every_line_fits_120_columns(run):
    _, lines = run
    assert [line for line in lines if len(line) > 120] == []


def test_no_line_is_printed_twice(run):
    _, lines = run
    seen = [line.strip() for line in lines if line.strip()]
    assert [line for line in set(seen) if seen.count(line) > 1] == []


def test_the_choices_are_said_once_in_short_lines(run):
    _, lines = run
    text = "\n".join(lines)
    assert "held-out: 6 samples, none used for choices" in text
    assert re.search(r"INT8 ranges: \w+ \(auto: ", text)
    assert "bias correction: 1 conv (" in text
    assert "no choice used" not in text
    assert [line for line in lines if "held-out pooled cosine" in line] == []


def test_the_summary_lists_each_file_with_its_size(run):
    folder, lines = run
    start = next(i for i, line in enumerate(lines) if line.startswith("INFO: wrote "))
    block = lines[start + 1:]
    with open(os.path.join(folder, f"{STEM}_manifest.json")) as f:
        listed = json.load(f)["files"]
    files = [n for n in listed if "/" not in n and n not in ("saved_model.pb", "fingerprint.pb")]
    for name in [*files, f"{STEM}_manifest.json"]:
        assert [line for line in block if re.fullmatch(rf"  {re.escape(name)} +{SIZE}",
                                                       line)], name
    assert any(re.match(rf"  saved_model\.pb, .*variables/ \(2 files, {SIZE}\) +{SIZE}$", line)
               for line in block)
    assert any("delegated to XNNPACK" in line for line in block)


def test_the_quant_report_keeps_the_full_notes(run):
    folder, _ = run
    with open(os.path.join(folder, f"{STEM}_quant_report.json")) as f:
        notes = json.load(f)["notes"]
    assert any(n.startswith("INT8 files: activation ranges by ") for n in notes)
    assert any(n.startswith("INT8 files: the biases of 1 convolution(s)") for n in notes)


def test_summary_counts_folders_and_adds_the_manifest(tmp_path):
    (tmp_path / "m_float32.tflite").write_bytes(b"x" * 2048)
    (tmp_path / "m_manifest.json").write_text("{}")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "a.bin").write_bytes(b"y" * 10)
    text = summary(str(tmp_path), "m", ["m_float32.tflite", "extra"], ["a closing line"])
    assert text.splitlines() == [
        f"wrote 3 outputs (2.0 KB) to {tmp_path}:",
        "  m_float32.tflite         2.0 KB",
        "  extra/ (1 file, 10 B)      10 B",
        "  m_manifest.json             2 B",
        "  a closing line",
    ]


def test_int8_files_leave_the_float32_file_as_it_is(run, tmp_path):
    """-oiqt once made TF's converter write the float32 file (mobilenet_block: 9 ops, not
    8); the quantizer reads it only as its reference, so it is the file default flags write."""
    folder, _ = run
    code, output = run_cli("-i", MODEL, "-o", tmp_path / "plain", "-n")
    assert code == 0, output
    for suffix in ("float32", "float16"):
        name = f"{STEM}_{suffix}.tflite"
        with open(os.path.join(folder, name), "rb") as a, open(tmp_path / "plain" / name,
                                                               "rb") as b:
            assert a.read() == b.read(), name
