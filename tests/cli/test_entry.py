"""The console entry point (cli/entry.py): what it sets up before the CLI's modules load."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest

from cli_runner import cli_env
from models import tiny_cnn

# Runs the console entry with an import hook that records every submodule of keras (Keras 3;
# tf_keras is another package) as it is imported, one name a line. `keras` alone is looked
# up without being loaded (whether it is installed).
_RECORDING_KERAS = """
import importlib.abc, sys

record = open(sys.argv[1], "w")

class Record(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("keras."):
            record.write(name + "\\n")
            record.flush()
        return None

sys.meta_path.insert(0, Record())
sys.argv = ["onnx2tf-alt", *sys.argv[2:]]
from onnx2tf_alt.cli.entry import run_and_exit
run_and_exit()
"""


@pytest.mark.parametrize("user_value", [None, "0"])
def test_a_conversion_loads_keras_3_only_when_the_user_asks(tmp_path, user_value):
    """TensorFlow imports Keras 3's optimizers at load unless TF_USE_LEGACY_KERAS is set;
    the converter uses tf_keras, so the CLI sets it (0.25 s of a small model's run). A value
    the user set is kept: with TF_USE_LEGACY_KERAS=0, Keras 3 loads as before."""
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn()[0], source)
    record, out = tmp_path / "keras.txt", tmp_path / "out"
    env = cli_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    if user_value is not None:
        env["TF_USE_LEGACY_KERAS"] = user_value
    proc = subprocess.run(
        [sys.executable, "-c", _RECORDING_KERAS, str(record), "-i", str(source), "-o",
         str(out), "-dms"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cnn_float32.tflite" in os.listdir(out)
    loaded = record.read_text().split()
    if user_value is None:
        assert loaded == []
    else:
        assert "keras.src.optimizers" in loaded, loaded
