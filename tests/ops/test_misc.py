"""Swish, CumProd, BitCast, EyeLike, the classification losses and the random generators."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from harness import assert_close, check_model, check_node, convert, make_model, tf_run, tflite_run

rng = np.random.default_rng(0)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("alpha", [None, 0.5])
def test_swish(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check_node("Swish", {"x": 3 * normal(2, 3, 5)}, attrs, opset=24)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod_constant_axis(exclusive, reverse, axis):
    check_node("CumProd", {"x": normal(3, 4, 5)}, {"exclusive": exclusive, "reverse": reverse},
               initializers={"axis": np.array(axis, np.int64)}, opset=26)


@pytest.mark.parametrize("axis", [1, -2])
def test_cumprod_runtime_axis(axis):
    check_node("CumProd", {"x": normal(2, 4, 3), "axis": np.array(axis, np.int32)},
               {"reverse": 1}, opset=26)


@pytest.mark.parametrize(
    "x, to",
    [(normal(2, 3), TensorProto.INT32), (rng.integers(-9, 9, (4,)).astype(np.int32),
                                         TensorProto.FLOAT),
     (rng.integers(0, 255, (2, 3)).astype(np.uint8), TensorProto.INT8)],
)
def test_bitcast(x, to):
    check_node("BitCast", {"x": x}, {"to": to}, opset=26)


@pytest.mark.parametrize(
    "x, to",
    [(np.array([True, False, True]), TensorProto.UINT8),
     (np.array([[0, 1, 1]], np.uint8), TensorProto.BOOL)],
)
def test_bitcast_bool(x, to):
    """onnxruntime has no bool BitCast kernel: compared with onnx.reference instead."""
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=to)], {"x": x}, ["y"],
                       opset=26)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    converted = convert(model)
    for run in (tf_run, tflite_run):
        assert_close(run(converted, {"x": x})[0], expected)


@pytest.mark.parametrize(
    "shape, attrs", [((3, 3), {}), ((3, 5), {"k": 2}), ((4, 2), {"k": -1, "dtype": 6})],
)
def test_eye_like(shape, attrs):
    check_node("EyeLike", {"x": normal(*shape)}, attrs, opset=22)


LOSS_CASES = [
    ((3, 5), "mean", None, False), ((3, 5), "sum", None, True), ((3, 5), "none", None, True),
    ((2, 4, 3, 2), "mean", 1, True), ((2, 4, 3, 2), "none", 2, False),
    ((2, 4, 3), "mean", -1, False), ((2, 4, 3), "sum", 0, True),
]


def _loss_inputs(shape, ignore_index):
    target = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    if ignore_index is not None:
        target.flat[::3] = ignore_index
    return target


@pytest.mark.parametrize("shape, reduction, ignore_index, weighted", LOSS_CASES)
def test_negative_log_likelihood_loss(shape, reduction, ignore_index, weighted):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = {"x": normal(*shape), "target": _loss_inputs(shape, ignore_index)}
    if weighted:
        inputs["weight"] = rng.random(shape[1]).astype(np.float32)
    check_node("NegativeLogLikelihoodLoss", inputs, attrs, opset=22)


@pytest.mark.parametrize("shape, reduction, ignore_index, weighted", LOSS_CASES)
def test_softmax_cross_entropy_loss(shape, reduction, ignore_index, weighted):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = {"x": 2 * normal(*shape), "target": _loss_inputs(shape, ignore_index)}
    if weighted:
        inputs["weight"] = rng.random(shape[1]).astype(np.float32)
    check_node("SoftmaxCrossEntropyLoss", inputs, attrs, num_outputs=2, opset=13)


@pytest.mark.parametrize(
    "op, attrs, feeds",
    [("RandomUniformLike", {"low": -2.0, "high": 3.0}, {"x": normal(2, 3, 4)}),
     ("RandomNormalLike", {"mean": 1.0, "scale": 2.0, "dtype": TensorProto.FLOAT},
      {"x": normal(3, 5)}),
     ("Bernoulli", {}, {"x": rng.random((4, 6)).astype(np.float32)}),
     ("Bernoulli", {"dtype": TensorProto.INT32}, {"x": rng.random((4, 6)).astype(np.float32)}),
     ("RandomUniform", {"shape": [2, 5]}, {"x": normal(2, 5)}),
     ("RandomNormal", {"shape": [3, 1, 4], "seed": 3.0}, {"x": normal(3, 2, 4)})],
)
def test_random_ops_shape_and_dtype(op, attrs, feeds):
    """onnxruntime has no opset-22 kernels for most of these: the expected shapes and dtypes
    come from onnx.reference.ReferenceEvaluator (values are random, so only those compare).
    Generators without inputs feed an Add with the model input."""
    if op in ("RandomUniform", "RandomNormal"):
        nodes = [helper.make_node(op, [], ["r"], **attrs), helper.make_node("Add", ["x", "r"], ["y"])]
    else:
        nodes = [helper.make_node(op, list(feeds), ["y"], **attrs)]
    model = make_model(nodes, feeds, ["y"], opset=22)
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    converted = convert(model)
    for run in (tf_run, tflite_run):
        (actual,) = run(converted, feeds)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype


def test_optional_ops_on_tensors():
    """A plain tensor is a present optional: HasElement is true, GetElement returns it."""
    x = normal(2, 3, 4)
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("OptionalGetElement", ["x"], ["got"]),
             helper.make_node("Relu", ["got"], ["y"])]
    model = make_model(nodes, {"x": x}, ["has", "y"], opset=18)
    check_model(model, {"x": x})
