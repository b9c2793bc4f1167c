"""The graph index the rewrite passes share (ir/index.py), on small hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.ir.index import LIGHT_ELEMENTS, GraphIndex, dims_of

FLOAT = TensorProto.FLOAT


def graph(nodes, inputs=(), outputs=("y",), initializers=(), value_info=()) -> onnx.GraphProto:
    def typed(spec):
        name, dims = spec if isinstance(spec, tuple) else (spec, None)
        return helper.make_tensor_value_info(name, FLOAT, dims)

    return helper.make_graph(nodes, "g", [typed(i) for i in inputs],
                             [typed(o) for o in outputs], list(initializers),
                             value_info=[typed(v) for v in value_info])


def square_then_relu() -> onnx.GraphProto:
    """x -> Mul(x, x) = s -> Relu = y, and s -> Neg = n; y and s are graph outputs."""
    return graph([helper.make_node("Mul", ["x", "x"], ["s"]),
                  helper.make_node("Relu", ["s"], ["y"]),
                  helper.make_node("Neg", ["s"], ["n"])],
                 inputs=["x"], outputs=["y", "n"])


def test_producers_by_position_and_node():
    index = GraphIndex(square_then_relu())
    assert index.producer == {"s": 0, "y": 1, "n": 2}
    assert index.producer_node("y").op_type == "Relu"
    assert index.producer_node("x") is None  # a graph input: no node makes it


def test_an_omitted_optional_output_has_no_producer():
    g = graph([helper.make_node("Dropout", ["x"], ["y", ""])], inputs=["x"])
    assert "" not in GraphIndex(g).producer


def test_a_node_reading_a_value_twice_is_one_consumer():
    index = GraphIndex(square_then_relu())
    assert index.consumers["x"] == [0]
    assert index.consumers["s"] == [1, 2]
    assert [n.op_type for n in index.consumer_nodes("s")] == ["Relu", "Neg"]
    assert index.consumer_nodes("y") == []


def test_single_use_and_only_user_exclude_graph_outputs():
    g = graph([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("Neg", ["r"], ["y"]),
               helper.make_node("Abs", ["y"], ["z"])],
              inputs=["x"], outputs=["y", "z"])
    index = GraphIndex(g)
    assert index.single_use("r") and index.only_user("r").op_type == "Neg"
    assert not index.single_use("y") and index.only_user("y") is None  # read, and an output
    assert not index.single_use("z")  # an output nothing reads
    assert GraphIndex(square_then_relu()).only_user("s") is None  # two readers


def test_shapes_report_symbolic_and_unknown_dims():
    unknown = helper.make_tensor_value_info("u", FLOAT, [2, None, 3])
    g = graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["u"], ["v"])],
              inputs=[("x", ["batch", 3, 4])], outputs=[("y", [2, 3, 4]), "v"],
              initializers=[numpy_helper.from_array(np.zeros((5, 6), np.float32), "w")])
    g.input.append(unknown)
    index = GraphIndex(g)
    assert index.dims("x") == ["batch", 3, 4]
    assert index.shape("x") == [None, 3, 4]
    assert index.static_shape("x") is None
    assert index.rank("x") == 3
    assert index.dims("u") == [2, None, 3] and index.static_shape("u") is None
    assert index.static_shape("y") == [2, 3, 4]
    assert index.shape("v") is None and index.rank("v") is None  # declared without a shape
    assert index.shape("nothing") is None and index.info("nothing") is None
    assert index.static_shape("w") == [5, 6]  # an initializer: typed from its tensor
    assert "w" not in index.infos


def test_the_last_declaration_wins():
    g = graph([helper.make_node("Relu", ["x"], ["y"])], inputs=[("x", [1, 2])],
              outputs=[("y", [2, 3])], value_info=[("y", [7])])
    assert GraphIndex(g).static_shape("y") == [2, 3]


def test_dims_of_a_non_tensor_or_missing_info():
    assert dims_of(None) is None
    assert dims_of(helper.make_empty_tensor_value_info("e")) is None
    sequence = helper.make_tensor_sequence_value_info("q", FLOAT, [2])
    assert dims_of(sequence) is None


def test_constants_from_initializers_and_constant_nodes():
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [
        helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(small, "t")),
        helper.make_node("Constant", [], ["ints"], value_ints=[1, 2]),
        helper.make_node("Constant", [], ["f"], value_float=0.5),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    g = graph(nodes, inputs=["x"], initializers=[numpy_helper.from_array(small, "c")])
    index = GraphIndex(g)
    np.testing.assert_array_equal(index.constants["t"], small)
    np.testing.assert_array_equal(index.constants["c"], small)
    assert index.constants["ints"].dtype == np.int64 and index.constants["ints"].tolist() == [1, 2]
    assert index.constants["f"].dtype == np.float32 and index.constants["f"].item() == 0.5
    assert "x" not in index.constants and index.value("x") is None
    np.testing.assert_array_equal(index.value("t"), small)


def test_a_large_initializer_is_not_copied_until_its_value_is_asked_for():
    weights = np.arange(LIGHT_ELEMENTS + 4, dtype=np.float32).reshape(4, -1)
    g = graph([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs=["x"],
              initializers=[numpy_helper.from_array(weights, "w")])
    index = GraphIndex(g)
    light = index.constants["w"]
    assert light.shape == weights.shape and light.dtype == weights.dtype
    assert light.strides == (0, 0)  # one zero, broadcast: no element was read or copied
    np.testing.assert_array_equal(index.value("w"), weights)
    assert index.value("w") is index.value("w")  # read once


def test_unique_names_avoid_outputs_initializers_and_inputs():
    g = graph([helper.make_node("Relu", ["x"], ["y"])], inputs=["x"],
              initializers=[numpy_helper.from_array(np.ones(1, np.float32), "y_1")])
    index = GraphIndex(g)
    assert index.unique("z") == "z"
    assert index.unique("x") == "x_1"
    assert index.unique("y") == "y_2"


def test_added_constants_are_initializers_and_constants():
    g = graph([helper.make_node("Relu", ["x"], ["y"])], inputs=["x"])
    index = GraphIndex(g)
    value = np.full((2, 3), 4.0, np.float32)
    name = index.add_constant("y", value)
    assert name == "y_1"
    assert [t.name for t in g.initializer] == ["y_1"]
    np.testing.assert_array_equal(numpy_helper.to_array(g.initializer[0]), value)
    assert index.value(name) is value and name in index.constants
    assert index.static_shape(name) == [2, 3]
    assert index.add_constant("y", value) == "y_2"


def test_reindex_reads_the_changed_node_list():
    g = graph([helper.make_node("Relu", ["x"], ["y"])], inputs=["x"])
    index = GraphIndex(g)
    g.node.insert(0, helper.make_node("Neg", ["x"], ["n"]))
    g.node[1].input[0] = "n"
    assert index.producer == {"y": 0}  # until told
    index.reindex()
    assert index.producer == {"n": 0, "y": 1}
    assert index.consumers == {"x": [0], "n": [1]}
    assert index.only_user("n").op_type == "Relu"


def test_reads_inside_subgraphs_are_not_consumers():
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", FLOAT, None)])
    g = graph([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
              inputs=["x", "cond"])
    assert "x" not in GraphIndex(g).consumers
    inner = GraphIndex(branch)
    assert inner.consumers == {"x": [0]} and inner.outputs == {"b"}
