"""One behaviour from the CLI and Python: `convert()`'s defaults are the CLI's, and its
console is as quiet (TensorFlow's native logging goes aside while it runs, and comes back
for the caller's own TensorFlow use)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

from cli_runner import cli_env, run_cli

MODEL = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")


def test_convert_defaults_are_the_clis():
    from onnx2tf_alt import convert
    from onnx2tf_alt.cli.args import parser

    cli = {a.dest: a.default for a in parser()._actions}
    api = inspect.signature(convert).parameters
    differing = {name: (cli[name], p.default) for name, p in api.items()
                 if name in cli and cli[name] != p.default}
    assert differing == {}


def test_convert_writes_the_clis_files_and_keeps_native_logs_aside(tmp_path):
    code, output = run_cli("-i", MODEL, "-o", tmp_path / "cli", "-n", "-osm")
    assert code == 0, output
    script = (  # with the saved_model: TensorFlow is imported by the conversion
        "import sys, onnx2tf_alt\n"
        f"onnx2tf_alt.convert(input_onnx_file_path={os.path.abspath(MODEL)!r}, "
        f"output_folder_path={str(tmp_path / 'api')!r}, non_verbose=True, "
        "output_saved_model=True)\n"
        "import tensorflow as tf\n"
        "tf.print('the caller prints again')\n")
    env = cli_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # as a user's process has it: TF's logging on
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["the caller prints again"], proc.stderr
    for name in ("mobilenet_block_float32.tflite", "mobilenet_block_float16.tflite"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
