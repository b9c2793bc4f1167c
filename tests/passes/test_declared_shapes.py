"""Declared value_info / output shapes are hints: where they contradict the computation, the
conversion follows the computation (as onnxruntime does), warns once naming the value, and
<stem>_io_layout.json records the computed shape."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.translate.io_layout import io_layout, save_io_layout

from harness import assert_close, check_model, ort_run, tflite_run

RNG = np.random.default_rng(15)


def _model(nodes, x: np.ndarray, outputs, value_info=(), initializers=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "declared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
        value_info=list(value_info),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def crnn_head(batch: int) -> tuple[onnx.ModelProto, dict]:
    """A CRNN text recogniser's head: features [N, C, 1, W] -> [W, N, C] -> per-step class
    scores [W, N, K]; the graph declares the output as [1, seqlen]."""
    x = RNG.standard_normal((batch, 4, 1, 9)).astype(np.float32)
    weight = RNG.standard_normal((4, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Squeeze", ["x", "axis2"], ["squeezed"]),
        helper.make_node("Transpose", ["squeezed"], ["steps"], perm=[2, 0, 1]),
        helper.make_node("MatMul", ["steps", "weight"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=2),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])]
    inits = {"axis2": np.array([2], np.int64), "weight": weight}
    return _model(nodes, x, outputs, initializers=inits), {"x": x}


def wrong_intermediate() -> tuple[onnx.ModelProto, dict]:
    """`t` is declared [5, 7] but computes [3, 5, 2]; a Shape of it feeds an Expand, so a
    trusted declaration would also fold into a wrong constant."""
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]),
        helper.make_node("Shape", ["t"], ["t_shape"]),
        helper.make_node("Expand", ["scale", "t_shape"], ["scales"]),
        helper.make_node("Mul", ["t", "scales"], ["y"]),
    ]
    value_info = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [5, 7])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1", "d2"])]
    inits = {"scale": np.array([1.5], np.float32)}
    return _model(nodes, x, outputs, value_info, inits), {"x": x}


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _warnings():
    """The converter's warnings, whatever a CLI test run before in this worker did to its
    logger (level ERROR, no propagation to pytest's capture)."""
    handler = _Messages()
    logger = logging.getLogger("onnx2tf_alt")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _convert_checked(model: onnx.ModelProto, feeds: dict):
    """check_model (values vs onnxruntime through TF and float32 TFLite) and the warnings."""
    with _warnings() as messages:
        converted = check_model(model, feeds)
    return converted, messages


@pytest.fixture(scope="module", params=[1, 3], ids=["batch1", "batch3"])
def crnn(request):
    model, feeds = crnn_head(request.param)
    return model, feeds, *_convert_checked(model, feeds)


@pytest.fixture(scope="module")
def intermediate():
    model, feeds = wrong_intermediate()
    return model, feeds, *_convert_checked(model, feeds)


def test_output_follows_the_computation(crnn):
    model, feeds, converted, _ = crnn
    (expected,) = ort_run(model, feeds)
    assert expected.shape == (9, feeds["x"].shape[0], 6)
    assert converted.graph.shapes["y"] == expected.shape
    (tflite_value,) = tflite_run(converted, feeds, converted.tflite)
    assert_close(tflite_value, expected, what="TFLite y")  # shape included


def test_output_warning_names_the_value_once(crnn):
    _, feeds, _, messages = crnn
    computed = f"[9, {feeds['x'].shape[0]}, 6]"
    wanted = (f"declared shape [1, seqlen] of output 'y' contradicts the computed {computed}; "
              "using the computed one")
    assert messages.count(wanted) == 1, messages


def test_io_layout_records_the_computed_shape(crnn, tmp_path):
    _, feeds, converted, _ = crnn
    path = tmp_path / "model_io_layout.json"
    save_io_layout(converted.result, converted.graph, str(path))
    (entry,) = json.loads(path.read_text())["outputs"]
    batch = feeds["x"].shape[0]
    assert entry["onnx_shape"] == [9, batch, 6]
    perm = entry["perm"]
    assert entry["shape"] == [[9, batch, 6][a] for a in perm]


def test_wrong_intermediate_value_info(intermediate):
    model, feeds, converted, messages = intermediate
    (expected,) = ort_run(model, feeds)
    assert expected.shape == (3, 5, 2)
    assert converted.graph.shapes["t"] == (3, 5, 2)
    assert converted.graph.shapes["y"] == (3, 5, 2)
    wanted = ("declared shape [5, 7] of value 't' contradicts the computed [3, 5, 2]; using "
              "the computed one")
    assert messages.count(wanted) == 1, messages
    (entry,) = io_layout(converted.result, converted.graph)["outputs"]
    assert entry["onnx_shape"] == [3, 5, 2]


def test_consistent_declarations_fill_what_inference_leaves_unknown():
    """A declaration inference agrees with is not reported, and names a dim that inference
    leaves unknown (NonZero's count)."""
    from onnx2tf_alt.passes.prepare import infer_shapes

    x = np.zeros((2, 3), np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"])]
    outputs = [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, "width"]),
               helper.make_tensor_value_info("nz", TensorProto.INT64, [2, "count"])]
    with _warnings() as messages:
        model = infer_shapes(_model(nodes, x, outputs))
    relu, nonzero = (o.type.tensor_type.shape.dim for o in model.graph.output)
    assert [d.dim_value for d in relu] == [2, 3]
    assert nonzero[0].dim_value == 2 and nonzero[1].dim_param == "count"
    assert not [m for m in messages if "contradicts" in m], messages


def test_io_layout_takes_unknown_dims_from_the_tf_model(crnn):
    """Where inference leaves an output's dims unknown, the json records the static shape
    the TF model computes for it."""
    _, feeds, converted, _ = crnn
    batch = feeds["x"].shape[0]
    for unknown in (None, (9, None, None)):
        graph = dataclasses.replace(converted.graph, shapes={**converted.graph.shapes,
                                                             "y": unknown})
        (entry,) = io_layout(converted.result, graph)["outputs"]
        assert entry["onnx_shape"] == [9, batch, 6]


def test_declared_constants_keep_their_shapes():
    """torch's dynamo exporter declares value infos for its constants; a Slice whose `axes`
    is such a constant (a rotary embedding's half) is inferred, converted and run right."""
    from onnx2tf_alt.passes.prepare import infer_shapes

    x = RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)
    constants = {"starts": np.array([4], np.int64), "ends": np.array([2**63 - 1], np.int64),
                 "axes": np.array([3], np.int64)}
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    declared = [helper.make_tensor_value_info(k, TensorProto.INT64, [1]) for k in constants]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])]
    model = _model(nodes, x, outputs, declared, constants)
    (output,) = infer_shapes(model).graph.output
    assert [d.dim_value for d in output.type.tensor_type.shape.dim] == [2, 3, 5, 4]
    converted, messages = _convert_checked(model, {"x": x})
    assert converted.graph.shapes["y"] == (2, 3, 5, 4)
    assert not [m for m in messages if "contradicts" in m], messages
