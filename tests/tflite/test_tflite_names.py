"""-coion: every written .tflite carries the ONNX input and output names, in ONNX order, as
tensor names and signature keys, and still computes what onnxruntime does."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper

from harness import assert_close, make_model, ort_run

INPUTS = ["image.in", "other:0"]  # names TF has to sanitize
OUTPUTS = ["conv/out", "sum.1", "gap"]  # TF's output order (sorted keys) is not ONNX's
FILES = ("float32", "float16", "dynamic_range_quant", "integer_quant", "full_integer_quant")


def two_in_three_out() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["image.in", "w"], ["conv/out"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["image.in", "other:0"], ["sum.1"]),
        helper.make_node("GlobalAveragePool", ["other:0"], ["gap"]),
    ]
    feeds = {n: np.zeros((2, 3, 16, 16), np.float32) for n in INPUTS}
    return make_model(nodes, feeds, OUTPUTS, {"w": weights})


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from onnx2tf_alt.api import convert

    folder = tmp_path_factory.mktemp("coion")
    path = str(folder / "m.onnx")
    model = two_in_three_out()
    onnx.save(model, path)
    out = folder / "out"
    convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
            output_integer_quantized_tflite=True, copy_onnx_input_output_names_to_tflite=True)
    with open(out / "m_io_layout.json") as f:
        layout = json.load(f)
    rng = np.random.default_rng(1)
    feeds = {n: rng.uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32) for n in INPUTS}
    return {"out": out, "layout": layout, "feeds": feeds, "expected": ort_run(model, feeds),
            "path": path}


def _interpreter(out, suffix: str):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_path=os.path.join(str(out), f"m_{suffix}.tflite"))


@pytest.mark.parametrize("suffix", FILES)
def test_tensor_names_and_signature_keys_are_the_onnx_names(converted, suffix):
    interpreter = _interpreter(converted["out"], suffix)
    assert [d["name"] for d in interpreter.get_input_details()] == INPUTS
    assert [d["name"] for d in interpreter.get_output_details()] == OUTPUTS
    runner = interpreter.get_signature_runner("serving_default")
    assert list(runner.get_input_details()) == INPUTS
    assert sorted(runner.get_output_details()) == sorted(OUTPUTS)


def test_io_layout_records_the_tflite_names(converted):
    layout = converted["layout"]
    assert [e["tflite_name"] for e in layout["inputs"]] == INPUTS
    assert [e["tflite_name"] for e in layout["outputs"]] == OUTPUTS
    assert [e["tf_name"] for e in layout["inputs"]] == ["image_in", "other_0"]  # saved_model


def test_checker_reads_a_coion_conversion(converted):
    """onnx2tf_alt.check on the folder: the float32 file's ONNX names are mapped back."""
    import onnx2tf_alt

    report = onnx2tf_alt.check(converted["path"], str(converted["out"]), full=False)
    assert report.passed and not report.backends["tflite"].error, report.to_dict()
    assert {c.status for c in report.backends["tflite"].checks} == {"pass"}


def _run(converted, suffix: str) -> list[np.ndarray]:
    """The file run through its signature with ONNX-named, physically laid out inputs;
    integer inputs and outputs (de)quantized with the file's parameters."""
    runner = _interpreter(converted["out"], suffix).get_signature_runner("serving_default")
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    feeds = {}
    for entry in converted["layout"]["inputs"]:
        x, detail = np.transpose(converted["feeds"][entry["onnx_name"]], entry["perm"]), inputs[
            entry["tflite_name"]]
        if detail["dtype"] != np.float32:
            scale, zero = detail["quantization"]
            x = np.clip(np.round(x / scale + zero), -128, 127)
        feeds[entry["tflite_name"]] = x.astype(detail["dtype"])
    raw = runner(**feeds)
    results = []
    for entry in converted["layout"]["outputs"]:
        y, detail = raw[entry["tflite_name"]], outputs[entry["tflite_name"]]
        if detail["dtype"] != np.float32:
            scale, zero = detail["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        results.append(np.transpose(y, np.argsort(entry["perm"])))
    return results


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("suffix", ["float32", "float16"])
def test_float_files_compute_the_onnx_outputs(converted, suffix):
    tol = 1e-4 if suffix == "float32" else 1e-2  # float16 weights
    for name, actual, expected in zip(OUTPUTS, _run(converted, suffix), converted["expected"]):
        assert_close(actual, expected, tol, f"{suffix} {name}")


@pytest.mark.parametrize("suffix", ["dynamic_range_quant", "integer_quant", "full_integer_quant"])
def test_quantized_files_compute_the_onnx_outputs(converted, suffix):
    for name, actual, expected in zip(OUTPUTS, _run(converted, suffix), converted["expected"]):
        assert actual.shape == expected.shape, (suffix, name)
        assert _cosine(actual, expected) >= 0.98, (suffix, name)


def test_without_coion_the_tflite_keeps_tf_names():
    """The default .tflite keeps TF's names; copy_onnx_names on its bytes renames and
    reorders exactly the I/O (tensor count and op count unchanged)."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.pipeline import build
    from onnx2tf_alt.tflite.lowering import tflite_bytes
    from onnx2tf_alt.tflite.names import copy_onnx_names

    converted = build(onnx_graph=two_in_three_out())
    content = tflite_bytes(converted.tflite_result())
    plain = Interpreter(model_content=content)
    assert sorted(d["name"] for d in plain.get_input_details()) == [
        "serving_default_image_in:0", "serving_default_other_0:0"]  # in TF's order
    renamed = Interpreter(model_content=copy_onnx_names(content, converted.result,
                                                        converted.graph))
    assert [d["name"] for d in renamed.get_input_details()] == INPUTS
    assert [d["name"] for d in renamed.get_output_details()] == OUTPUTS
    assert len(renamed.get_tensor_details()) == len(plain.get_tensor_details())
    assert len(renamed._get_ops_details()) == len(plain._get_ops_details())
