"""A QDQ model's INT8 file made by the own quantizer on the model's own grids
(quant/qdq_grids.py), without TensorFlow: onnxruntime's integer execution of the QDQ graph
is the reference, in steps of the output's grid."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt import convert
from onnx2tf_alt.quant.qdq_grids import take_grids
from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

SIZE = 12


def _pair(name: str, scale: float, zero_point: int, dtype=np.uint8) -> tuple[list, list]:
    """Q -> DQ of value `name` onto (scale, zero_point): (nodes, initializers); the
    dequantized value is `name`_dq."""
    inits = [numpy_helper.from_array(np.float32(scale), f"{name}_s"),
             numpy_helper.from_array(np.array(zero_point, dtype), f"{name}_z")]
    nodes = [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                              [f"{name}_dq"])]
    return nodes, inits


def _weights(name: str, w: np.ndarray) -> tuple[list, list]:
    """Symmetric int8 per-output-channel weights as onnxruntime writes them: DQ of int8."""
    scale = np.abs(w).reshape(len(w), -1).max(1) / 127
    q = np.round(w / scale.reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8)
    inits = [numpy_helper.from_array(q, f"{name}_q"),
             numpy_helper.from_array(scale.astype(np.float32), f"{name}_s"),
             numpy_helper.from_array(np.zeros(len(w), np.int8), f"{name}_z")]
    return [helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                             [name], axis=0)], inits


def dropped_relu_model(batch: int) -> onnx.ModelProto:
    """x -> pair -> Sin -> pair whose grid starts at 0 (where onnxruntime's quantizer drops a
    ReLU) -> Softplus -> pair -> strided Conv -> pair -> y. Sin and Softplus have no integer
    kernels: they stay float, one writing and one reading the clamping pair's value."""
    rng = np.random.default_rng(3)
    parts = [
        _pair("x", 2 / 255, 128),
        ([helper.make_node("Sin", ["x_dq"], ["c1"])], []),
        _pair("c1", 0.004, 0),
        ([helper.make_node("Softplus", ["c1_dq"], ["sp"])], []),
        _pair("sp", 0.006, 0),
        _weights("w2", rng.standard_normal((5, 3, 3, 3)) * 0.3),
        ([helper.make_node("Conv", ["sp_dq", "w2"], ["y"], strides=[2, 2],
                           pads=[1, 0, 1, 0])], []),
        _pair("y", 0.01, 120),
    ]
    order = [n for nodes, _ in parts for n in nodes]
    inits = [i for _, initializers in parts for i in initializers]
    graph = helper.make_graph(
        order, "dropped_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, [batch, 5, SIZE // 2, SIZE // 2 - 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _int8_file(path: str, folder) -> bytes:
    """The -dms -oiqt INT8 file (float inputs and outputs) of the model at `path`."""
    out = str(folder / "out")
    convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
            disable_model_save=True, output_integer_quantized_tflite=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    with open(os.path.join(out, f"{stem}_integer_quant.tflite"), "rb") as f:
        return f.read()


@pytest.mark.parametrize("batch", [1, 2])
def test_a_pair_whose_grid_clamps_still_clamps_before_a_float_op(batch, tmp_path):
    """The pair after the Sin is the model's ReLU (onnxruntime's quantizer drops ReLUs and
    Clips whose range the grid covers): the Softplus, which stays float like the Sin, must
    read the value on that grid, not the Sin's negative values."""
    from ai_edge_litert.interpreter import Interpreter

    path = str(tmp_path / "m.onnx")
    onnx.save(dropped_relu_model(batch), path)
    content = _int8_file(path, tmp_path)
    model = unpack_model(content)
    ops = [op_name(model, op) for op in model.subgraphs[0].operators]
    assert ops.count("CONV_2D") == 1 and "FAKE_QUANT" not in ops, ops
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    (inp,), (outp,) = interpreter.get_input_details(), interpreter.get_output_details()
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(3):
        x = rng.uniform(-1, 1, (batch, 3, SIZE, SIZE)).astype(np.float32)
        expected = session.run(None, {"x": x})[0]
        interpreter.set_tensor(inp["index"], x.transpose(0, 2, 3, 1))
        interpreter.invoke()
        actual = interpreter.get_tensor(outp["index"]).transpose(0, 3, 1, 2)
        worst = max(worst, float(np.abs(actual - expected).max()) / 0.01)
    assert worst <= 1.0, worst  # within one step of y's grid (kernels round differently)


def test_take_grids_moves_each_pair_onto_the_value_it_reads():
    """The direct writer's file of the FakeQuantize model: every FAKE_QUANT goes, the value
    it read carries its grid exactly (a uint8 zero point 128 lower), and the output keeps
    its name."""
    from dataclasses import replace

    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded
    from onnx2tf_alt.quant.grids import given_grid
    from onnx2tf_alt.quant.quantize import fake_quant_model
    from onnx2tf_alt.tflite.direct import write_direct

    prepared = plan_loaded(load_model(None, dropped_relu_model(1))).model  # shapes known
    planned = plan_loaded(fake_quant_model(prepared))
    options = replace(planned.options, for_quantization=True)
    written = write_direct(planned.graph, planned.plan, options)
    model = unpack_model(written.content)
    assert [op_name(model, op) for op in model.subgraphs[0].operators].count(
        "FAKE_QUANT") == 4
    content, taken = take_grids(written.content)
    assert taken == 4
    model = unpack_model(content)
    graph = model.subgraphs[0]
    assert "FAKE_QUANT" not in [op_name(model, op) for op in graph.operators]
    grids = {t.name.decode(): given_grid(t) for t in graph.tensors if given_grid(t)}
    assert grids["c1"].scale == np.float32(0.004) and grids["c1"].zero_point == -128
    (pad,) = [op for op in graph.operators if op_name(model, op) == "PAD"]
    softplus = given_grid(graph.tensors[pad.inputs[0]])  # its last op's output, and the pad's
    assert softplus.scale == np.float32(0.006) and softplus.zero_point == -128
    assert given_grid(graph.tensors[pad.outputs[0]]) == softplus
    (output,) = graph.outputs
    assert graph.tensors[output].name == b"y_dq"
    assert grids["y_dq"].zero_point == 120 - 128


@pytest.mark.parametrize("method, bar", [("ort_minmax", 0.98), ("entropy", 0.95)])
def test_onnxruntime_calibrators_ranges_become_grids_without_tensorflow(method, bar, tmp_path):
    """--calibration_method ort_* / entropy with -dms: the calibrator's range of each value
    is that tensor's grid in the INT8 file, exactly as onnxruntime computes it, and the
    conversion imports no TensorFlow (a fresh process)."""
    import json
    import subprocess
    import sys

    from calibration.ort import int8_parameters, onnx_ranges
    from calibration.photos import image_samples
    from tests.quant.test_quantize import SIZE as CNN_SIZE
    from tests.quant.test_quantize import small_cnn

    path, out = str(tmp_path / "cnn.onnx"), str(tmp_path / "out")
    onnx.save(small_cnn(), path)
    script = (
        "import sys\n"
        "from onnx2tf_alt import convert\n"
        f"convert(input_onnx_file_path={path!r}, output_folder_path={out!r}, "
        f"non_verbose=True, disable_model_save=True, output_integer_quantized_tflite=True, "
        f"calibration_method={method!r})\n"
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(out, "cnn_quant_report.json")) as f:
        report = json.load(f)
    assert report["calibration_method"] == method
    for entry in report["files"][:2]:  # the INT8 files, against the float32 one; entropy
        # clips the logits' range (the TF route's files measure the same 0.963)
        assert entry["outputs"]["logits"]["cosine_min"] >= bar, entry
    with open(os.path.join(out, "cnn_integer_quant.tflite"), "rb") as f:
        graph = unpack_model(f.read()).subgraphs[0]
    grids = {t.name.decode(): t.quantization for t in graph.tensors if t.quantization}
    calibration, _ = image_samples(CNN_SIZE, CNN_SIZE, 3)  # the shipped photographs used
    ranges = onnx_ranges(small_cnn(), [{"x": np.transpose(c[np.newaxis], (0, 3, 1, 2))}
                                       for c in calibration], method)
    for name in ("sum", "pool"):  # the residual Add's and the pool's
        expected = int8_parameters(*ranges[name])
        assert grids[name].scale[0] == np.float32(expected["scale"]), name
        assert grids[name].zeroPoint[0] == expected["zero_point"], name


def qdq_block(path: str) -> None:
    """A transformer block as onnxruntime's quantize_static writes it (QDQ, per-channel
    int8 weights, uint8 activations): LayerNormalization, MatMul + bias, Gelu, MatMul, a
    residual Add, then a 1-D Conv whose ReLU the quantizer drops (its pair clamps)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(0)
    steps, width, hidden = 12, 32, 64
    init = {"g": np.ones(width, np.float32), "b": np.zeros(width, np.float32),
            "w1": rng.standard_normal((width, hidden)) * 0.2,
            "b1": rng.standard_normal(hidden) * 0.1,
            "w2": rng.standard_normal((hidden, width)) * 0.2,
            "cw": rng.standard_normal((width, width, 3)) * 0.1}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Gelu", ["hb"], ["ge"], domain="com.microsoft"),
             helper.make_node("MatMul", ["ge", "w2"], ["o"]),
             helper.make_node("Add", ["x", "o"], ["r"]),
             helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["rt", "cw"], ["c"], pads=[1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, steps, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width, steps])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    float_path = path.replace(".onnx", "_float.onnx")
    onnx.save(model, float_path)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": rng.standard_normal((2, steps, width)).astype(np.float32)}
                               for _ in range(16)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(float_path, path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def test_a_qdq_transformer_block_runs_on_the_model_grids_exactly(tmp_path):
    """The block's INT8 file: both MatMuls' first and the 1-D Conv in int8 (the Conv's
    result, reshaped back to 3-D before its pair, takes that pair's grid), LayerNorm and
    Gelu in float between the pairs as the graph has them; on held-out inputs it equals the
    QDQ graph computed as written (onnxruntime without graph optimizations) to 0 steps.
    onnxruntime's optimized run differs: it fuses the second MatMul, whose input has no
    pair, into a product that quantizes that input at run time."""
    from ai_edge_litert.interpreter import Interpreter

    path = str(tmp_path / "block.onnx")
    qdq_block(path)
    content = _int8_file(path, tmp_path)
    model = unpack_model(content)
    graph = model.subgraphs[0]
    kinds = {op_name(model, op): graph.tensors[op.inputs[1]].type for op in graph.operators
             if op_name(model, op) in ("CONV_2D",)}
    assert kinds == {"CONV_2D": 9}, kinds  # INT8 filter
    fully = [graph.tensors[op.inputs[1]].type for op in graph.operators
             if op_name(model, op) == "FULLY_CONNECTED"]
    assert sorted(fully) == [0, 9], fully  # the second reads Gelu's float output
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    scale = float(next(numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer
                       if i.name == "y_scale"))
    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    (inp,), (outp,) = interpreter.get_input_details(), interpreter.get_output_details()
    rng = np.random.default_rng(9)
    for _ in range(4):
        x = rng.standard_normal((2, 12, 32)).astype(np.float32)
        (expected,) = session.run(None, {"x": x})
        interpreter.set_tensor(inp["index"], x)
        interpreter.invoke()
        actual = interpreter.get_tensor(outp["index"]).transpose(0, 2, 1)
        assert np.abs(actual - expected).max() / scale < 0.5


def test_cotof_checks_a_qdq_model_at_every_pair_to_the_step(tmp_path):
    """-cotof on a QDQ model: onnxruntime runs the pairs the converter fused as the pairs
    they were (it has no QuantizeDequantize), and every pair's output of the Keras model and
    of the float32 TFLite (the direct writer's probe) equals onnxruntime's exactly, after
    LayerNormalization, MatMul, Gelu, the residual Add and the 1-D Conv."""
    path = str(tmp_path / "block.onnx")
    qdq_block(path)
    model = convert(input_onnx_file_path=path, output_folder_path=str(tmp_path / "out"),
                    non_verbose=True, check_onnx_tf_outputs_elementwise_close_full=True,
                    output_saved_model=True)  # a Keras model too, checked beside the file
    report = model.onnx2tf_alt_report
    assert not report.error and report.passed
    for backend in ("tf", "tflite"):
        pairs = [c for c in report.backends[backend].checks
                 if c.op_type == "QuantizeDequantize"]
        assert len(pairs) == 7, backend
        assert all(c.status == "pass" and c.max_abs_err == 0 for c in pairs), (backend, pairs)
