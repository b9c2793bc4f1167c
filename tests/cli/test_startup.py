"""Garbage collection in a console run (onnx2tf_alt/startup.py): off while the modules
load, back on with what was loaded frozen once the conversion has TensorFlow; a library
user's settings untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx

from cli_runner import cli_env
from models import tiny_cnn

_PAUSING = """
import gc
from onnx2tf_alt import startup

startup.resume()  # no pause before: a library's caller keeps its settings
print("library", gc.isenabled(), gc.get_freeze_count())
startup.pause()
import tensorflow
print("loading", gc.isenabled(), gc.get_count()[0] > 700)
startup.resume()
print("loaded", gc.isenabled(), gc.get_freeze_count() > 100000)
"""

# The console entry with a gc callback that writes each collection's generation to a file.
_RECORDING_COLLECTIONS = """
import gc, sys

record = open(sys.argv[1], "w")

def collected(phase, info):
    if phase == "stop":
        record.write(f"{info['generation']}\\n")
        record.flush()

gc.callbacks.append(collected)
sys.argv = ["onnx2tf-alt", *sys.argv[2:]]
from onnx2tf_alt.cli.entry import run_and_exit
run_and_exit()
"""


def test_collection_pauses_while_tensorflow_loads_and_resumes_frozen():
    proc = subprocess.run([sys.executable, "-c", _PAUSING], env=cli_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[:3] == ["library True 0", "loading False True", "loaded True True"], lines


def test_a_console_conversion_collects_without_walking_tensorflow(tmp_path):
    """A small model's -dms run: collections of the young generations go on during the
    conversion, and no full one happens (5 before, one each time TensorFlow's objects had
    grown by a quarter)."""
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn()[0], source)
    record, out = tmp_path / "collections.txt", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", _RECORDING_COLLECTIONS, str(record), "-i", str(source), "-o",
         str(out), "-dms", "--tflite_writer", "tf"],  # TF's route, which loads TensorFlow
        env=cli_env(), capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cnn_float32.tflite" in os.listdir(out)
    generations = record.read_text().split()
    assert "0" in generations and "2" not in generations, generations
