"""TensorFlow is an extra (onnx2tf_alt/version.py): without it a conversion writes the
same .tflite files and checks them; a flag that needs it is refused with exit 2 and a node
only TF's converter takes fails with exit 1, each naming the extra. Each run is a fresh interpreter in which `import tensorflow` fails, as where it is not
installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
from onnx import TensorProto, helper

from onnx2tf_alt.version import INSTALL

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
MODEL = os.path.join(DATA, "mobilenet_block.onnx")
# what `import tensorflow` meets where it is not installed: ImportError, and find_spec None
WITHOUT_TF = ("import sys; sys.modules['tensorflow'] = None; sys.modules['tf_keras'] = None; "
              "from onnx2tf_alt.cli.main import main; sys.exit(main(sys.argv[1:]))")


def run_without_tf(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TF, *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False)


def test_default_flags_write_the_same_tflite_files_as_with_tensorflow(tmp_path):
    out = tmp_path / "out"
    done = run_without_tf("-i", MODEL, "-o", out)
    assert done.returncode == 0, done.stderr
    assert "TensorFlow" not in done.stderr  # nothing of it is needed, so nothing is said
    assert sorted(os.listdir(out)) == [
        "mobilenet_block_delegates.json", "mobilenet_block_float16.tflite",
        "mobilenet_block_float32.tflite", "mobilenet_block_io_layout.json",
        "mobilenet_block_manifest.json"]
    same = tmp_path / "with_tf"  # the files are those of a run with TensorFlow installed
    subprocess.run([sys.executable, "-m", "onnx2tf_alt", "-i", MODEL, "-o", str(same), "-n"],
                   check=True, capture_output=True)
    for name in ("mobilenet_block_float32.tflite", "mobilenet_block_float16.tflite"):
        assert (out / name).read_bytes() == (same / name).read_bytes(), name


def test_quantized_and_checked_files_need_no_tensorflow(tmp_path):
    """-oiqt -cotof: the quantized files, and every value of each file against onnxruntime."""
    done = run_without_tf("-i", MODEL, "-o", tmp_path / "out", "-oiqt", "-cotof", "-n")
    assert done.returncode == 0, done.stderr
    written = os.listdir(tmp_path / "out")
    assert "mobilenet_block_full_integer_quant.tflite" in written
    assert "saved_model.pb" not in written
    with open(tmp_path / "out" / "mobilenet_block_accuracy_report.json") as f:
        backends = json.load(f)["backends"]
    assert "tf" not in backends and "tflite:full_integer_quant" in backends
    assert all(v["status"] == "pass" for v in backends["tflite"]["values"])


def test_flags_that_need_tensorflow_are_refused_naming_the_extra(tmp_path):
    out = tmp_path / "out"
    done = run_without_tf("-i", MODEL, "-o", out, "-osm", "-oh5", "-cotof")
    assert done.returncode == 2, done.stderr
    assert "-osm (the saved_model), -oh5: TensorFlow is needed and not installed" in done.stderr
    assert INSTALL in done.stderr
    assert not out.exists()


def test_a_node_only_tfs_converter_takes_fails_naming_it_and_the_extra(tmp_path):
    """float64 arithmetic whose bits a BitCast reads: the direct writer would compute it in
    float32 (other bits), TFLite's ADD has no float64 kernel; TF's converter takes it."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["s"], name="bits"),
         helper.make_node("BitCast", ["s"], ["y"], to=TensorProto.INT64, name="cast")], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    model.ir_version = 13
    path = tmp_path / "bitcast.onnx"
    onnx.save(model, path)
    done = run_without_tf("-i", path, "-o", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert "the direct TFLite writer (TensorFlow is not installed)" in done.stderr
    assert "'bits'" in done.stderr and INSTALL in done.stderr
    assert not list(tmp_path.rglob("*.tflite"))  # nothing half-written


def test_the_python_functions_that_need_tensorflow_say_so():
    code = ("import sys; sys.modules['tensorflow'] = None; sys.modules['tf_keras'] = None\n"
            "import onnx2tf_alt\n"
            "from onnx2tf_alt.errors import InputError\n"
            f"for call in (lambda: onnx2tf_alt.check({MODEL!r}, keras=True),\n"
            "             onnx2tf_alt.custom_objects):\n"
            "    try:\n"
            "        call()\n"
            "    except InputError as error:\n"
            "        print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["onnx2tf_alt.check(keras=True)",
                                                      "onnx2tf_alt.custom_objects()"]
    assert all(INSTALL in line for line in lines)


def test_the_version_says_what_the_install_writes():
    done = run_without_tf("-V")
    assert done.returncode == 0
    assert "TensorFlow not installed: the .tflite files" in done.stdout + done.stderr


def test_python_check_runs_on_the_direct_writers_file():
    """onnx2tf_alt.check() without TensorFlow: the float32 TFLite alone, every value and the
    outputs (keras=True is refused, above)."""
    code = ("import sys; sys.modules['tensorflow'] = None; sys.modules['tf_keras'] = None\n"
            "import onnx2tf_alt\n"
            f"full = onnx2tf_alt.check({MODEL!r})\n"
            f"outputs = onnx2tf_alt.check({MODEL!r}, full=False)\n"
            "print(full.passed, list(full.backends), len(full.backends['tflite'].checks))\n"
            "print(outputs.passed, len(outputs.backends['tflite'].checks))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.stdout.splitlines() == ["True ['tflite'] 11", "True 1"], done.stderr
