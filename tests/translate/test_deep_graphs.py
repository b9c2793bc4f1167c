"""Graphs deeper than Python's default recursion limit (1,000 frames): tf_keras walks a
functional model one frame per layer on its longest path, and an unrolled recurrence or a
deep transformer has thousands of ops in a row (onnx2tf_alt/translate/recursion.py)."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2tf_alt
from onnx2tf_alt.translate.recursion import deep_graphs

from harness import assert_close, ort_run

DEPTH = 1200  # ONNX nodes in a row, each one TF op


def _chain(depth: int) -> onnx.ModelProto:
    ops = ["Sin", "Tanh", "Cos"]
    names = ["x", *[f"v{i}" for i in range(depth - 1)], "y"]
    nodes = [helper.make_node(ops[i % 3], [names[i]], [names[i + 1]]) for i in range(depth)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _only(outputs) -> np.ndarray:
    """The single output of a Keras model, which returns a dict keyed by output name."""
    (value,) = outputs.values()
    return value.numpy()


@pytest.fixture
def default_recursion_limit():
    """Python's default limit for the test: other libraries loaded in the same worker may
    have raised it (coremltools' TF frontend sets 5,000), which hid what is tested here."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(previous)


def test_a_chain_deeper_than_the_recursion_limit_converts_and_reloads(
        tmp_path, default_recursion_limit):
    model = _chain(DEPTH)
    assert sys.getrecursionlimit() < DEPTH  # the point of the test
    limit = sys.getrecursionlimit()
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    out = tmp_path / "out"
    keras_model = onnx2tf_alt.convert(str(path), output_folder_path=str(out), output_h5=True,
                                      output_keras_v3=True, non_verbose=True)
    assert sys.getrecursionlimit() == limit  # put back after the conversion
    assert_close(_only(keras_model(x)), expected, what="TF")

    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(out / "chain_float32.tflite")).get_signature_runner()
    (got,) = runner(**{runner.get_input_details().popitem()[0]: x}).values()
    assert_close(got, expected, what="TFLite")

    import tf_keras

    with deep_graphs():  # what docs/outputs.md tells users who reload a deep model
        for suffix in ("h5", "keras"):
            reloaded = tf_keras.models.load_model(
                out / f"chain.{suffix}", custom_objects=onnx2tf_alt.custom_objects())
            assert_close(_only(reloaded(x)), expected, what=suffix)
