"""passes/shape_values.py: the shapes of Reshapes fed by shape computations that ONNX's
inference does not follow (before opset 17)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.ir.index import dims_of
from onnx2tf_alt.passes.prepare import infer_shapes
from onnx2tf_alt.passes.shape_values import fill_computed_shape_gaps, reshaped


@pytest.mark.parametrize(("data", "target", "dims"), [
    ([1, 120, 1, "W"], [1, 120, -1], [1, 120, "W"]),  # the symbol the -1 stands for
    (["N", 8, 2, "W"], [0, 0, -1], ["N", 8, None]),  # 2 * W: a new, unknown dim
    ([2, 6, 4], [-1, 8], [6, 8]),
    ([2, 6, None], [2, -1], [2, None]),
    (["N", 4, "H", "W"], ["N", -1, "W"], ["N", None, "W"]),  # 4 * H
    ([3, "W"], [0, "W"], [3, "W"]),
])
def test_reshaped_dims(data, target, dims):
    assert reshaped(data, target) == dims


def _flatten_model(opset: int, with_constants: bool) -> onnx.ModelProto:
    """x [N, 4, 1, W] -> Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1])) -> Transpose."""
    params = {"zero": [0], "two": [2], "rest": [-1]}
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    if with_constants:  # Paddle2ONNX writes them as Constant nodes
        nodes += [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(
            np.array(v, np.int64))) for k, v in params.items()]
    nodes += [helper.make_node("Slice", ["s", "zero", "two", "zero"], ["nc"]),
              helper.make_node("Concat", ["nc", "rest"], ["target"], axis=0),
              helper.make_node("Reshape", ["x", "target"], ["flat"]),
              helper.make_node("Transpose", ["flat"], ["y"], perm=[0, 2, 1])]
    inits = [] if with_constants else [numpy_helper.from_array(np.array(v, np.int64), k)
                                       for k, v in params.items()]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 1, "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("with_constants", [False, True])
def test_a_computed_flatten_gets_its_shape_and_what_follows_too(with_constants):
    model = _flatten_model(12, with_constants)
    plain = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert dims_of(next(v for v in plain.graph.value_info if v.name == "s")) == [4]
    assert not any(v.name == "flat" and dims_of(v) for v in plain.graph.value_info)
    inferred = infer_shapes(model)
    infos = {v.name: dims_of(v) for v in [*inferred.graph.value_info, *inferred.graph.output]}
    assert infos["flat"] == ["N", 4, "W"] and infos["y"] == ["N", "W", 4], infos


def test_a_shape_of_run_time_values_gives_the_rank_alone():
    """A target computed from another input's values: the rank is known, the dims not."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["n", "rest"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "rest")])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    assert fill_computed_shape_gaps(model) == 1
    assert dims_of(model.graph.output[0]) == [None, None]


def test_a_channel_split_by_a_computed_bound_gets_its_channels():
    """x[:, x.size(1) // 2:] of x [N, 8, H, W] (TorchScript's ShuffleNet split): the Slice's
    output [N, 4, H, W], which ONNX's inference leaves without its channels."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             {"one": 1, "two": 2, "axis": [1], "end": [2**62]}.items()]
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
         helper.make_node("Div", ["c", "two"], ["half"]),
         helper.make_node("Unsqueeze", ["half", "axis"], ["start"]),
         helper.make_node("Slice", ["x", "start", "end", "axis"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    inferred = infer_shapes(model)
    assert dims_of(inferred.graph.output[0]) == ["N", 4, "H", "W"]
