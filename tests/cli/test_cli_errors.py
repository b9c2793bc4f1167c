"""Bad input through the real CLI: one clear message, the right exit code, no traceback,
and nothing left in the output folder."""

from __future__ import annotations

import os

import onnx
import pytest

from cli_runner import run_cli
from models import custom_op_model, tiny_cnn


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cnn") / "cnn.onnx"
    onnx.save(tiny_cnn()[0], path)
    return path


def assert_clean_failure(code, output, expected_code, *phrases, out_dir=None, allowed=()):
    """Exit code, message, no traceback, and no model files (only `allowed` entries) left."""
    assert code == expected_code, output
    assert "Traceback" not in output, output
    for phrase in phrases:
        assert phrase in output, output
    if out_dir is not None and os.path.exists(out_dir):
        assert set(os.listdir(out_dir)) <= set(allowed), os.listdir(out_dir)


def test_missing_file(tmp_path):
    out = tmp_path / "out"
    code, output = run_cli("-i", str(tmp_path / "nope.onnx"), "-o", str(out))
    assert_clean_failure(code, output, 2, "does not exist", out_dir=out)


def test_not_onnx_file(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_text("this is not a model\n" * 10)
    out = tmp_path / "out"
    code, output = run_cli("-i", str(path), "-o", str(out))
    assert_clean_failure(code, output, 2, "junk.onnx", out_dir=out)


def test_truncated_file(tmp_path, cnn_path):
    data = cnn_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    code, output = run_cli("-i", str(path), "-o", str(out))
    assert_clean_failure(code, output, 2, "truncated.onnx", out_dir=out)


@pytest.mark.parametrize(
    "spec, phrase",
    [("input:1,3,x,16", "Bad -ois"), ("input1,3,16,16", "Bad -ois"), ("nosuch:1,3,16,16", "nosuch")],
)
def test_bad_overwrite_input_shape(tmp_path, cnn_path, spec, phrase):
    out = tmp_path / "out"
    code, output = run_cli("-i", str(cnn_path), "-o", str(out), "-ois", spec)
    assert_clean_failure(code, output, 2, phrase, out_dir=out)


def test_unknown_keep_input_name(tmp_path, cnn_path):
    out = tmp_path / "out"
    code, output = run_cli("-i", str(cnn_path), "-o", str(out), "-k", "ghost")
    assert_clean_failure(code, output, 2, "ghost", out_dir=out)


def test_unsupported_ops_listed_together(tmp_path):
    path = tmp_path / "custom.onnx"
    onnx.save(custom_op_model()[0], path)
    out = tmp_path / "out"
    code, output = run_cli("-i", str(path), "-o", str(out))
    assert_clean_failure(
        code, output, 1, "fancy_1", "FancyOp", "other_2", "OtherOp", "com.example",
        out_dir=out, allowed={"reports"},
    )


def test_version_flag():
    code, output = run_cli("-V")
    assert code == 0 and "onnx2tf-alt" in output and "TensorFlow installed" in output
