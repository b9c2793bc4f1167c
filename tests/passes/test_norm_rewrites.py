"""GroupNorm of one group written as reductions (passes/one_group_norm.py), neutral arithmetic
removed (passes/neutral.py) and reductions moved innermost (ops/reduce.innermost): each
rewritten graph computes what the original does in onnxruntime, and the converted models
match onnxruntime through TF, the float32 TFLite and the direct writer."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx2tf_alt.passes.neutral import drop_neutral_arithmetic
from onnx2tf_alt.passes.one_group_norm import rewrite_one_group_norms
from onnx2tf_alt.passes.prepare import infer_shapes
from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

from harness import both_routes, check_model, make_model


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def rewritten(model, rewrite):
    copy = infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    return rewrite(copy), copy


def ops_of(content: bytes) -> list[str]:
    model = unpack_model(content)
    return [op_name(model, op) for op in model.subgraphs[0].operators]


def group_norm(shape, groups, seed, opset=17, identity=False):
    """PyTorch's GroupNorm export: Reshape (N, G, -1), InstanceNormalization (scale 1, bias
    0 per group), Reshape back, the per-channel affine Mul and Add; then a Conv reading it."""
    rng = np.random.default_rng(seed)
    n, c, *spatial = shape
    affine = [1, c] + [1] * len(spatial)
    gamma = np.ones(affine, np.float32) if identity else rng.uniform(0.5, 1.5, affine)
    beta = np.zeros(affine, np.float32) if identity else rng.standard_normal(affine)
    inits = {"grouped": np.array([n, groups, -1], np.int64),
             "back": np.array(shape, np.int64),
             "s": np.ones(groups, np.float32), "b": np.zeros(groups, np.float32),
             "gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32),
             "w": rng.standard_normal([4, c] + [1] * len(spatial)).astype(np.float32)}
    nodes = [
        helper.make_node("Reshape", ["x", "grouped"], ["g"]),
        helper.make_node("InstanceNormalization", ["g", "s", "b"], ["n"], epsilon=1e-5),
        helper.make_node("Reshape", ["n", "back"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["a"]),
        helper.make_node("Conv", ["a", "w"], ["y"]),
    ]
    # a mean far from 0: the statistics must be a real mean, not an approximation
    feeds = {"x": (rng.standard_normal(shape) * 3 + 2).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits, opset=opset), feeds


CASES = [((2, 5, 3, 7), 17, False), ((1, 8, 6, 6), 18, False), ((3, 6, 11), 17, False),
         ((2, 4, 5, 5), 18, True)]


@pytest.mark.parametrize("shape, opset, identity", CASES,
                         ids=["nchw_opset17", "nchw_opset18", "ncw", "identity_affine"])
def test_one_group_norm_computes_the_same(shape, opset, identity):
    model, feeds = group_norm(shape, 1, seed=len(shape) + opset, opset=opset,
                              identity=identity)
    expected = run(model, feeds)
    count, after = rewritten(model, rewrite_one_group_norms)
    assert count == 1
    assert not any(n.op_type in ("InstanceNormalization", "Reshape") for n in after.graph.node)
    onnx.checker.check_model(after)
    np.testing.assert_allclose(run(after, feeds)[0], expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, opset, identity", CASES,
                         ids=["nchw_opset17", "nchw_opset18", "ncw", "identity_affine"])
def test_one_group_norm_converts_without_transposes(shape, opset, identity):
    model, feeds = group_norm(shape, 1, seed=len(shape) + opset, opset=opset,
                              identity=identity)
    converted = check_model(model, feeds)  # onnxruntime against TF and the float32 TFLite
    ops = ops_of(converted.tflite)
    assert "TRANSPOSE" not in ops, ops  # the norm runs channel-last, as the Conv does
    assert ops.count("MEAN") == 2
    if identity:  # the affine Mul by ones and Add of zeros are gone
        assert ops.count("MUL") == 2 and ops.count("ADD") == 1, ops  # ADD: the epsilon


def test_one_group_norm_through_the_direct_writer():
    model, feeds = group_norm((2, 5, 3, 7), 1, seed=3)
    result = both_routes(model, feeds, tol=1e-4)
    assert "TRANSPOSE" not in ops_of(result.content)


def test_groups_of_more_than_one_are_left_as_they_are():
    model, feeds = group_norm((2, 6, 3, 5), 3, seed=4)
    count, after = rewritten(model, rewrite_one_group_norms)
    assert count == 0
    assert any(n.op_type == "InstanceNormalization" for n in after.graph.node)
    check_model(model, feeds)


def arithmetic(op, constant, data_first=True, shape=(2, 3, 4, 5), output=False):
    """x op constant (or constant op x), then a Relu (so the result is not the output)."""
    rng = np.random.default_rng(abs(hash((op, data_first))) % 1000)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    inputs = ["x", "c"] if data_first else ["c", "x"]
    nodes = [helper.make_node(op, inputs, ["t"])]
    if not output:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    return make_model(nodes, feeds, ["t" if output else "y"],
                      {"c": np.asarray(constant, np.float32)}), feeds


NEUTRAL = [
    ("Mul", np.ones((3, 1, 1)), True, 1),
    ("Mul", np.ones((1,)), False, 1),  # 1 * x
    ("Div", np.ones(()), True, 1),
    ("Add", np.zeros((1, 3, 1, 1)), False, 1),
    ("Sub", np.zeros((5,)), True, 1),
    ("Sub", np.zeros(()), False, 0),  # 0 - x is -x
    ("Div", np.ones(()), False, 0),  # 1 / x
    ("Mul", np.ones((2, 3, 4, 5)) * [1, 1, 1, 1, 2.0], True, 0),  # not all ones
    ("Mul", np.ones((3, 2, 3, 4, 5)), True, 0),  # broadcasting makes the output larger
    ("Add", np.full((1,), -0.0), True, 1),
]


@pytest.mark.parametrize("op, constant, data_first, dropped", NEUTRAL)
def test_neutral_arithmetic(op, constant, data_first, dropped):
    model, feeds = arithmetic(op, constant, data_first)
    expected = run(model, feeds)
    count, after = rewritten(model, drop_neutral_arithmetic)
    assert count == dropped
    assert sum(n.op_type == op for n in after.graph.node) == 1 - dropped
    np.testing.assert_array_equal(run(after, feeds)[0], expected[0])
    check_model(model, feeds)


def test_a_neutral_node_making_a_graph_output_stays():
    model, feeds = arithmetic("Mul", np.ones(()), output=True)
    count, after = rewritten(model, drop_neutral_arithmetic)
    assert count == 0
    np.testing.assert_array_equal(run(after, feeds)[0], feeds["x"])


def test_neutral_chains_go_together():
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((2, 3, 5)).astype(np.float32)}
    nodes = [helper.make_node("Mul", ["x", "one"], ["a"]),
             helper.make_node("Add", ["a", "zero"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["y"]),
             helper.make_node("Div", ["a", "one"], ["c"]),
             helper.make_node("Tanh", ["c"], ["z"])]
    model = make_model(nodes, feeds, ["y", "z"], {"one": np.ones(5, np.float32),
                                                  "zero": np.zeros((3, 1), np.float32)})
    expected = run(model, feeds)
    count, after = rewritten(model, drop_neutral_arithmetic)
    assert count == 3
    assert [n.op_type for n in after.graph.node] == ["Sigmoid", "Tanh"]
    for got, want in zip(run(after, feeds), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_a_middle_axis_before_size_one_axes(op, keepdims):
    """NCHW with C = 1 runs channel-last as (N, H, W, 1): a reduction over H and W moves the
    1 ahead (a RESHAPE) so that it reduces the innermost axes."""
    rng = np.random.default_rng(11)
    feeds = {"x": rng.standard_normal((3, 1, 6, 7)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),  # makes the plan channel-last
             helper.make_node(op, ["c"], ["y"], axes=[2, 3], keepdims=keepdims)]
    model = make_model(nodes, feeds, ["y"], {"w": rng.standard_normal((1, 1, 1, 1))
                                             .astype(np.float32)}, opset=12)
    converted = check_model(model, feeds)
    reduce = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "REDUCE_MAX"}[op]
    flat = unpack_model(converted.tflite)
    graph = flat.subgraphs[0]
    (node,) = [o for o in graph.operators if op_name(flat, o) == reduce]
    assert list(graph.tensors[node.inputs[0]].shape)[-1] != 1


def test_instance_norm_of_one_channel():
    """(N, 1, L) runs channel-last as (N, L, 1): its statistics over L are innermost."""
    rng = np.random.default_rng(12)
    feeds = {"x": (rng.standard_normal((2, 1, 301)) * 2 - 1).astype(np.float32)}
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)]
    model = make_model(nodes, feeds, ["y"], {"s": np.array([1.3], np.float32),
                                             "b": np.array([0.2], np.float32)})
    converted = check_model(model, feeds)
    flat = unpack_model(converted.tflite)
    graph = flat.subgraphs[0]
    means = [o for o in graph.operators if op_name(flat, o) == "MEAN"]
    assert len(means) == 2
    assert all(list(graph.tensors[o.inputs[0]].shape)[-1] == 301 for o in means)
    both_routes(model, feeds, tol=1e-4)
