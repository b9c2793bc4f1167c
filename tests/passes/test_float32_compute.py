"""float64 models: the TF model computes in float64; the .tflite files compute in float32 with
float64 inputs and outputs, using TFLite builtins only (no Flex delegate)."""

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.passes.float32_compute import compute_in_float32, needs_float32_compute
from onnx2tf_alt.tflite.lowering import tflite_bytes

from harness import (
    assert_close,
    check_model,
    convert,
    count_tflite_ops,
    make_model,
    ort_run,
    tf_run,
)

rng = np.random.default_rng(11)


def float64_model(batch: int):
    """Mul by a float64 constant, CumSum, LogSumExp reduction, and a Cast int -> float64."""
    inits = {
        "scale": rng.uniform(0.5, 1.5, (1, 5)).astype(np.float64),
        "axis": np.array(1, np.int64),
        "red_axes": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["m"]),
        helper.make_node("CumSum", ["m", "axis"], ["c"], reverse=1),
        helper.make_node("ReduceLogSumExp", ["c", "red_axes"], ["r"], keepdims=1),
        helper.make_node("Cast", ["k"], ["kf"], to=onnx.TensorProto.DOUBLE),
        helper.make_node("Add", ["r", "kf"], ["y"]),
    ]
    feeds = {
        "x": rng.standard_normal((batch, 5)).astype(np.float64),
        "k": rng.integers(-3, 4, (batch, 1)).astype(np.int32),
    }
    return make_model(nodes, feeds, ["y", "c"], inits), feeds


@pytest.mark.parametrize("batch", [1, 3])
def test_float64_model_converts_without_flex(batch):
    model, feeds = float64_model(batch)
    converted = check_model(model, feeds)
    census = count_tflite_ops(converted.tflite)
    assert "DELEGATE" not in census and not any(op.startswith("Flex") for op in census), census
    # the TF model itself keeps float64 precision
    for got, want in zip(tf_run(converted, feeds), ort_run(model, feeds)):
        assert got.dtype == np.float64
        assert_close(got, want, 1e-12)


def test_the_tflite_signature_keeps_float64():
    from ai_edge_litert.interpreter import Interpreter

    model, _ = float64_model(2)
    content = tflite_bytes(convert(model).tflite_result())
    runner = Interpreter(model_content=content).get_signature_runner("serving_default")
    details = [*runner.get_input_details().values(), *runner.get_output_details().values()]
    assert {np.dtype(d["dtype"]) for d in details} == {np.dtype(np.float64), np.dtype(np.int32)}


def test_demotion_rewrites_constants_and_casts_only():
    model, _ = float64_model(2)
    demoted = compute_in_float32(model)
    assert needs_float32_compute(model) and not any(
        t.data_type == onnx.TensorProto.DOUBLE for t in demoted.graph.initializer
    )
    ops = [n.op_type for n in demoted.graph.node]
    assert ops == ["Cast", "Mul", "CumSum", "ReduceLogSumExp", "Cast", "Add", "Cast", "Cast"]
    onnx.checker.check_model(demoted, full_check=True)


def test_float16_model_converts_without_flex():
    """A half-precision Conv -> Softmax -> Concat: TF computes in float16, the .tflite in
    float32 behind float16 I/O. Tolerance: 4 float16 ulps at 1.0 (float16 rounding)."""
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float16)
    inits = {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float16)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["c"], ["s"], axis=1),
        helper.make_node("Concat", ["s", "c"], ["y"], axis=1),
    ]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    converted = check_model(model, {"x": x}, tol=4 * 2.0**-10)
    census = count_tflite_ops(converted.tflite)
    assert not any(op.startswith("Flex") or op == "DELEGATE" for op in census), census
    assert census.get("TRANSPOSE", 0) == 0, census


def test_beside_a_saved_model_the_direct_writer_writes_the_float32_computing_files(
        tmp_path, monkeypatch):
    """-osm on a float64 model: the saved_model computes in float64, the .tflite
    files are the default run's (the direct writer's of the rewrite computing in float32), not
    TF's converter's, and -coto checks them."""
    import tensorflow as tf

    from onnx2tf_alt.api import convert as convert_files

    class Refused:
        def __getattr__(self, name):
            raise AssertionError(f"TF's TFLite converter used ({name})")

    model, _ = float64_model(2)
    path = str(tmp_path / "f64.onnx")
    onnx.save(model, path)
    convert_files(input_onnx_file_path=path, output_folder_path=str(tmp_path / "dms"),
                  non_verbose=True, disable_model_save=True)
    monkeypatch.setattr(tf.lite, "TFLiteConverter", Refused())
    keras = convert_files(input_onnx_file_path=path, output_folder_path=str(tmp_path / "beside"),
                          non_verbose=True, check_onnx_tf_outputs_elementwise_close=True,
                          output_saved_model=True)
    assert keras.onnx2tf_alt_report.passed
    assert (tmp_path / "beside" / "saved_model.pb").exists()
    for name in ("f64_float32.tflite", "f64_float16.tflite"):
        assert (tmp_path / "beside" / name).read_bytes() == (tmp_path / "dms" / name).read_bytes()
