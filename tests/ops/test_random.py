"""RandomUniform(Like), RandomNormal(Like) and Bernoulli (ops/random.py): shapes and dtypes."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from harness import Rng, convert, make_model, tf_run, tflite_run

rng = Rng(0)


@pytest.mark.parametrize(
    "op, attrs, feeds",
    [("RandomUniformLike", {"low": -2.0, "high": 3.0}, {"x": rng.randn(2, 3, 4)}),
     ("RandomNormalLike", {"mean": 1.0, "scale": 2.0, "dtype": TensorProto.FLOAT},
      {"x": rng.randn(3, 5)}),
     ("Bernoulli", {}, {"x": rng.random((4, 6)).astype(np.float32)}),
     ("Bernoulli", {"dtype": TensorProto.INT32}, {"x": rng.random((4, 6)).astype(np.float32)}),
     ("RandomUniform", {"shape": [2, 5]}, {"x": rng.randn(2, 5)}),
     ("RandomNormal", {"shape": [3, 1, 4], "seed": 3.0}, {"x": rng.randn(3, 2, 4)})],
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
