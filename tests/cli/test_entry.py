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
         str(out), "-dms", "--tflite_writer", "tf"],  # TF's route, which loads TensorFlow
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cnn_float32.tflite" in os.listdir(out)
    loaded = record.read_text().split()
    if user_value is None:
        assert loaded == []
    else:
        assert "keras.src.optimizers" in loaded, loaded


# Converts with the CLI's main in a fresh process, with or without the shared TFLite schema
# (cli/entry.py), and prints whether TensorFlow's schema module is ai_edge_litert's.
_CONVERTING = """
import sys
from onnx2tf_alt.cli import entry
if sys.argv[1] == "shared":
    entry.share_tflite_schema()
from onnx2tf_alt.cli.main import main
code = main(sys.argv[2:])
print("code", code, "shared", sys.modules[entry.TF_SCHEMA] is sys.modules[entry.LITERT_SCHEMA])
"""

# Imports both generated schema modules as they are and prints what TensorFlow's has that
# ai_edge_litert's lacks or holds otherwise: functions, classes, constants, object-API fields.
_COMPARING_SCHEMAS = """
import importlib, inspect
tf_schema = importlib.import_module("tensorflow.lite.python.schema_py_generated")
litert = importlib.import_module("ai_edge_litert.schema_py_generated")
problems = []
for name, value in vars(tf_schema).items():
    if inspect.isfunction(value) and not callable(getattr(litert, name, None)):
        problems.append(f"no function {name}")
    if not inspect.isclass(value) or value.__module__ != tf_schema.__name__:
        continue
    other = getattr(litert, name, None)
    if other is None:
        problems.append(f"no class {name}")
        continue
    for key, constant in vars(value).items():
        if isinstance(constant, int) and getattr(other, key, None) != constant:
            problems.append(f"{name}.{key}")
    if name.endswith("T"):
        missing = set(vars(value())) - set(vars(other()))
        problems += [f"{name}.{field}" for field in sorted(missing)]
    methods = {k for k, v in vars(value).items() if callable(v)}
    problems += [f"{name}.{k}()" for k in sorted(methods - set(vars(other)))]
print(len(problems), problems[:20])
"""


def test_ai_edge_litert_s_schema_holds_all_of_tensorflow_s():
    """The CLI gives TensorFlow ai_edge_litert's generated TFLite schema for its own: every
    function, class, enum value, object-API field and method of TensorFlow's is in it, the
    same."""
    proc = subprocess.run([sys.executable, "-c", _COMPARING_SCHEMAS], env=cli_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "0", proc.stdout


def test_the_shared_schema_gives_the_same_files(tmp_path):
    """A conversion with TensorFlow on ai_edge_litert's schema module (one import of the
    two, 0.18 s) writes the files it writes on its own, byte for byte."""
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn()[0], source)
    files = {}
    for mode in ("shared", "own"):
        out = tmp_path / mode
        proc = subprocess.run(
            [sys.executable, "-c", _CONVERTING, mode, "-i", str(source), "-o", str(out),
             "-dms", "--tflite_writer", "tf"],  # TF's route: the direct writer loads no TF
            env=cli_env(), capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"code 0 shared {mode == 'shared'}" in proc.stdout, proc.stdout
        files[mode] = {name: (out / name).read_bytes() for name in sorted(os.listdir(out))
                       if name.endswith((".tflite", ".json")) and "manifest" not in name}
    assert list(files["shared"]) == ["cnn_delegates.json", "cnn_float16.tflite",
                                     "cnn_float32.tflite", "cnn_io_layout.json"]
    assert files["shared"] == files["own"]
