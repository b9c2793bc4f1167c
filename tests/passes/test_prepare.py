"""Loading and preparation, without TensorFlow: names, input shapes, constant folding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.ir.loader import load_model
from onnx2tf_alt.passes.prepare import (
    fold_constants,
    infer_shapes,
    parse_shape_overrides,
    prepare_model,
)


def shape_subgraph_model(batch="N"):
    """x -> Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape(x): a flatten."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 3, 4, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, 60])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unnamed_nodes_get_unique_names():
    model = prepare_model(shape_subgraph_model(), batch_size=None)
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)


def test_shape_subgraph_folds_when_batch_is_fixed():
    model = prepare_model(shape_subgraph_model(), batch_size=2)
    assert [n.op_type for n in model.graph.node] == ["Reshape"]
    target = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}["target"]
    assert target.tolist() == [2, -1]


def test_shape_subgraph_stays_when_batch_is_symbolic():
    model = prepare_model(shape_subgraph_model(), batch_size=None)
    assert "Shape" in [n.op_type for n in model.graph.node]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N"


def test_overwrite_input_shape_sets_dims_and_symbols():
    model = prepare_model(shape_subgraph_model(), overwrite_input_shape=["x:4,3,4,5"])
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [4, 3, 4, 5]
    out = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert out == [4, 60]


@pytest.mark.parametrize("spec", ["x", "x:", "x:1,a", "x:0,3", ":1,2"])
def test_bad_shape_specs(spec):
    with pytest.raises(InputError):
        parse_shape_overrides([spec])


def test_overwrite_unknown_input():
    with pytest.raises(InputError, match="ghost"):
        prepare_model(shape_subgraph_model(), overwrite_input_shape=["ghost:1,2"])


def test_overwrite_wrong_rank():
    with pytest.raises(InputError, match="rank"):
        prepare_model(shape_subgraph_model(), overwrite_input_shape=["x:1,2"])


def test_caller_proto_is_not_modified():
    original = shape_subgraph_model()
    before = original.SerializeToString()
    load_and_prepare = prepare_model(load_model(proto=original), batch_size=1)
    assert load_and_prepare.graph.node[0].op_type == "Reshape"
    assert original.SerializeToString() == before


def test_external_data_loads_from_model_folder(tmp_path):
    weights = np.arange(4096, dtype=np.float32).reshape(64, 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(model, folder / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    assert (folder / "m.bin").exists()
    loaded = load_model(str(folder / "m.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), weights)


def test_invalid_model_is_an_input_error():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match="not a valid ONNX model"):
        load_model(proto=model)


def shape_chain_model(levels: int):
    """`levels` Reshapes in a row, each to a shape computed from the previous one's output
    through an op ONNX's data propagation does not follow (Abs)."""
    nodes, inits, value = [], [], "x"
    for i in range(levels):
        nodes += [
            helper.make_node("Relu", [value], [f"r{i}"]),
            helper.make_node("Shape", [f"r{i}"], [f"s{i}"]),
            helper.make_node("Abs", [f"s{i}"], [f"t{i}"]),
            helper.make_node("Reshape", [f"r{i}", f"t{i}"], [f"y{i}"]),
        ]
        value = f"y{i}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info(value, onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_deep_shape_chains_fold_completely():
    """20 levels fold to Relu + Reshape with constant shapes and every value's shape
    known."""
    model = prepare_model(shape_chain_model(20))
    assert {n.op_type for n in model.graph.node} == {"Relu", "Reshape"}
    infos = [*model.graph.value_info, *model.graph.output]
    assert all(d.HasField("dim_value") for v in infos for d in v.type.tensor_type.shape.dim)


@pytest.mark.parametrize("levels", [1, 20])
def test_shape_chain_folds_in_one_pass(levels):
    """One pass of folding infers each unfolded node's output shape as it goes, so the
    Shape below a Reshape whose target it just folded folds too (whole-graph inference
    between passes reached one Reshape further per pass: swin_t took 17 passes)."""
    model = infer_shapes(shape_chain_model(levels))
    assert fold_constants(model)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Reshape"] * levels
    reshape_targets = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(values[t].tolist() == [2, 3, 4] for t in reshape_targets)
    assert not fold_constants(infer_shapes(model))


@pytest.mark.parametrize("attr, value", [
    ("value", numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3))),
    ("value_float", 2.5), ("value_floats", [1.5, -2.0]), ("value_int", 7),
    ("value_ints", [3, 4, 5]),
])
def test_constants_fold_to_what_the_reference_evaluator_computes(attr, value):
    """Constant nodes are read from their attribute (not run through the reference
    evaluator, 0.6 ms each): the same value and dtype."""
    from onnx.reference import ReferenceEvaluator

    from onnx2tf_alt.passes.prepare import _constant_value

    node = helper.make_node("Constant", [], ["c"], **{attr: value})
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(
        "c", onnx.TensorProto.UNDEFINED, None)])
    (expected,) = ReferenceEvaluator(graph, opsets={"": 17}).run(None, {})
    got = _constant_value(node)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
