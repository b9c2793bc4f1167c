"""Shape ops (ops/shape.py) against onnxruntime, through TF and the float32 TFLite.

Attribute variants of one op share a model (one conversion); check_both_layouts runs each
on a value in ONNX order and on one kept channel-last.
"""

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.ir.graph import Node
from onnx2tf_alt.tflite.lowering import tflite_bytes
from onnx2tf_alt.translate.context import NodeContext
from onnx2tf_alt.translate.registry import find_handler

from harness import (
    Rng,
    check_both_layouts,
    check_model,
    check_nodes,
    count_tflite_ops,
    ints,
    make_model,
    node,
    ort_run,
)

rng = Rng(0)


def call_handler(op_type, attrs, opset=18, constants=None):
    """Run a handler whose result is known at conversion time (no TF tensors involved)."""

    class Consts:
        def constant_value(self, name):
            return (constants or {}).get(name)

    names = list(constants or {})
    ctx = NodeContext(Consts(), Node("n", op_type, "", names, ["y"], attrs), None,
                      [None] * len(names), [()], opset)
    return find_handler(op_type, "", opset).fn(ctx)


def ort_single(op_type, attrs, inputs=None):
    inputs = inputs or {}
    model = make_model([helper.make_node(op_type, list(inputs), ["y"], **attrs)], inputs, ["y"])
    return ort_run(model, inputs)[0]


def no_transpose(census):
    return census.get("TRANSPOSE", 0) == 0


# --- Reshape and Flatten -------------------------------------------------------------------
RESHAPES = [[0, -1, 7], [2, -1], [-1], [6, 5, 7], [2, 3, 35], [0, 0, 0, 0], [7, 1, 15, 2],
            [2, 15, 7]]


def test_reshape():
    inits = {f"s{k}": ints(*s) for k, s in enumerate(RESHAPES)}
    check_both_layouts(
        lambda src: [node("Reshape", [src, f"s{k}"], f"{src}_{k}") for k in range(len(RESHAPES))],
        rng.randn(2, 3, 5, 7), inits)


def test_reshape_dynamic_batch():
    targets = [[0, -1], [0, 3, 35], [-1, 5, 7], [0, 15, 7]]
    inits = {f"s{k}": ints(*s) for k, s in enumerate(targets)}
    check_both_layouts(
        lambda src: [node("Reshape", [src, f"s{k}"], f"{src}_{k}") for k in range(len(targets))],
        rng.randn(2, 3, 5, 7), inits, input_shape=["N", 3, 5, 7])


def test_reshape_allowzero():
    check_both_layouts(lambda src: [node("Reshape", [src, "s"], f"{src}_0", allowzero=1)],
                       rng.randn(2, 3, 5, 7), {"s": ints(3, 2, 35)}, opset=14)


def test_reshape_runtime_shape_two_unknown_dims():
    """(N, 3, S, 4) -> (N, -1, 4): the target comes from Shape at run time."""
    def variants(src):
        return [
            node("Shape", [src], f"{src}_n", start=0, end=1),
            node("Concat", [f"{src}_n", "tail"], f"{src}_s", axis=0),
            node("Reshape", [src, f"{src}_s"], f"{src}_0"),
        ]

    check_both_layouts(variants, rng.randn(2, 3, 6, 4), {"tail": ints(-1, 4)},
                       input_shape=["N", 3, "S", 4])


def test_flatten():
    axes = [0, 1, 2, 3, 4, -1, -3]
    check_both_layouts(
        lambda src: [node("Flatten", [src], f"{src}_{k}", axis=a) for k, a in enumerate(axes)],
        rng.randn(2, 3, 5, 7))


def test_flatten_dynamic():
    check_both_layouts(
        lambda src: [node("Flatten", [src], f"{src}_{a}", axis=a) for a in (1, 2)],
        rng.randn(2, 3, 5, 7), input_shape=["N", 3, "S", 7])


# --- Transpose, Squeeze, Unsqueeze ---------------------------------------------------------
def test_transpose():
    perms = [None, [0, 2, 3, 1], [2, 0, 3, 1], [1, 0, 2, 3], [0, 3, 1, 2]]
    check_both_layouts(
        lambda src: [node("Transpose", [src], f"{src}_{k}", **({"perm": p} if p else {}))
                     for k, p in enumerate(perms)],
        rng.randn(2, 3, 5, 7))


def test_transpose_3d_dynamic():
    check_both_layouts(lambda src: [node("Transpose", [src], f"{src}_0", perm=[2, 0, 1])],
                       rng.randn(2, 3, 7), input_shape=["N", 3, 7])


SQUEEZES = [None, [1], [-1, 1], [3]]


def test_squeeze_opset11():
    check_both_layouts(
        lambda src: [node("Squeeze", [src], f"{src}_{k}", **({"axes": a} if a else {}))
                     for k, a in enumerate(SQUEEZES)],
        rng.randn(2, 1, 5, 1), opset=11)


def test_squeeze_opset13():
    inits = {f"a{k}": ints(*a) for k, a in enumerate(SQUEEZES) if a}
    check_both_layouts(
        lambda src: [node("Squeeze", [src, f"a{k}"] if a else [src], f"{src}_{k}")
                     for k, a in enumerate(SQUEEZES)],
        rng.randn(2, 1, 5, 1), inits, opset=13)


def test_squeeze_dynamic():
    check_both_layouts(lambda src: [node("Squeeze", [src, "a"], f"{src}_0")],
                       rng.randn(2, 1, 5, 1), {"a": ints(3)}, input_shape=["N", 1, "S", 1])


UNSQUEEZES = [[0], [1, 2], [-1], [0, 4]]


def test_unsqueeze_opset11():
    check_both_layouts(
        lambda src: [node("Unsqueeze", [src], f"{src}_{k}", axes=a)
                     for k, a in enumerate(UNSQUEEZES)],
        rng.randn(2, 3, 5), opset=11)


def test_unsqueeze_opset13():
    inits = {f"a{k}": ints(*a) for k, a in enumerate(UNSQUEEZES)}
    check_both_layouts(
        lambda src: [node("Unsqueeze", [src, f"a{k}"], f"{src}_{k}")
                     for k in range(len(UNSQUEEZES))],
        rng.randn(2, 3, 5), inits, opset=13)


def test_unsqueeze_dynamic():
    check_both_layouts(lambda src: [node("Unsqueeze", [src, "a"], f"{src}_0")],
                       rng.randn(2, 3, 5), {"a": ints(1, 3)}, input_shape=["N", 3, "S"])


def test_squeeze_unsqueeze_runtime_axes():
    """Axes fed at run time: the inferred output shapes say where the axes go."""
    feeds = {"x": rng.randn(1, 3, 1, 5), "sq": ints(-2, 0), "un": ints(4, 0, -1)}
    nodes = [node("Squeeze", ["x", "sq"], "s"), node("Unsqueeze", ["x", "un"], "u")]
    check_nodes(nodes, feeds)


def test_squeeze_no_axes_unknown_output_shape():
    """Squeeze without axes feeding another op, so its output shape is not inferred."""
    nodes = [node("Squeeze", ["x"], "s"), node("Neg", ["s"], "y")]
    model = make_model(nodes, {"x": rng.randn(2, 1, 3)}, ["y"], opset=13,
                       input_shapes={"x": ["N", 1, 3]})
    check_model(model, {"x": rng.randn(2, 1, 3)})


# --- Shape and Size ------------------------------------------------------------------------
def test_shape_and_size_dynamic():
    """Logical shapes of a value in ONNX order and of one kept channel-last."""
    bounds = [{}, {"start": 1}, {"start": -2, "end": -1}, {"end": 10}]
    check_both_layouts(
        lambda src: [*(node("Shape", [src], f"{src}_{k}", **b) for k, b in enumerate(bounds)),
                     node("Size", [src], f"{src}_size")],
        rng.randn(2, 3, 5, 7), input_shape=["N", 3, "H", 7])


def test_shape_of_channel_last_value_adds_no_transpose():
    x = rng.randn(2, 3, 9, 7)
    nodes = [
        node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]),
        node("Shape", ["c"], "s"),
        node("Relu", ["c"], "y"),
    ]
    _, census = check_nodes(nodes, {"x": x}, {"w": rng.conv_weights(4, 3)}, outputs=["y", "s"])
    assert no_transpose(census)


# --- Constants -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {"value": helper.make_tensor("v", onnx.TensorProto.FLOAT, [2, 3], np.arange(6.0))},
        {"value_float": 2.5},
        {"value_floats": [1.0, -2.0]},
        {"value_int": 7},
        {"value_ints": [3, -4, 5]},
    ],
)
def test_constant(attrs):
    expected = ort_single("Constant", attrs)
    decoded = {k: (onnx.numpy_helper.to_array(v) if k == "value" else v) for k, v in attrs.items()}
    actual = call_handler("Constant", decoded)
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("value", [None, np.array([3], np.int64), np.array([1.5], np.float32)])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    shape = ints(2, 3, 4)
    expected = ort_single("ConstantOfShape", attrs, {"shape": shape})
    decoded = {} if value is None else {"value": value}
    actual = call_handler("ConstantOfShape", decoded, constants={"shape": shape})
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    "start, limit, delta, dtype",
    [(0, 10, 3, np.int64), (10, 1, -2, np.int32), (0.5, 3.0, 0.7, np.float32), (5, 1, 1, np.int64)],
)
def test_range(start, limit, delta, dtype):
    feeds = {n: np.array(v, dtype) for n, v in zip(("start", "limit", "delta"), (start, limit, delta))}
    expected = ort_single("Range", {}, feeds)
    actual = call_handler("Range", {}, constants=feeds)
    assert actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_constants_at_run_time():
    """Constant in a graph; ConstantOfShape(Shape(x)) and Range(0, S) of a symbolic dim;
    Range of run-time scalars."""
    x = rng.randn(2, 3, 5)
    value = helper.make_tensor("v", onnx.TensorProto.FLOAT, [5], [1.0, 2.0, 3.0, 4.0, 5.0])
    two = onnx.numpy_helper.from_array(np.array([2.0], np.float32))
    nodes = [
        node("Constant", [], "c", value=value),
        node("Add", ["x", "c"], "y_const"),
        node("Shape", ["x"], "s"),
        node("ConstantOfShape", ["s"], "twos", value=two),
        node("Mul", ["x", "twos"], "y_fill"),
        node("Shape", ["x"], "s2", start=2),
        node("Squeeze", ["s2"], "n"),
        node("Range", ["zero", "n", "one"], "y_range"),
        node("Range", ["r0", "r1", "r2"], "y_scalars"),
    ]
    feeds = {"x": x, "r0": np.array(1, np.int32), "r1": np.array(11, np.int32),
             "r2": np.array(3, np.int32)}
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    model = make_model(nodes, feeds, ["y_const", "y_fill", "y_range", "y_scalars"], inits,
                       input_shapes={"x": ["N", 3, "S"]})
    check_model(model, feeds)


# --- Expand and Tile -----------------------------------------------------------------------
def test_expand():
    cases = [((2, 3, 1, 5), [2, 3, 4, 5]), ((2, 3, 1, 1), [3, 1, 1]), ((2, 1, 5), [2, 4, 1]),
             ((1, 3, 5), [2, 2, 3, 5])]
    nodes, feeds, inits = [], {}, {}
    for k, (shape, target) in enumerate(cases):
        feeds[f"x{k}"], inits[f"s{k}"] = rng.randn(*shape), ints(*target)
        nodes.append(node("Expand", [f"x{k}", f"s{k}"], f"y{k}"))
    check_nodes(nodes, feeds, inits)


def test_expand_layouts_dynamic():
    check_both_layouts(lambda src: [node("Expand", [src, "s"], f"{src}_0")],
                       rng.randn(2, 3, 1), {"s": ints(1, 3, 4)}, input_shape=["N", 3, 1])


def test_expand_runtime_shape_two_unknowns():
    x, z = rng.randn(2, 1, 4), rng.randn(2, 3, 4)
    nodes = [node("Shape", ["z"], "s"), node("Expand", ["x", "s"], "y")]
    model = make_model(nodes, {"x": x, "z": z}, ["y"],
                       input_shapes={"x": ["N", 1, 4], "z": ["N", "S", 4]})
    check_model(model, {"x": x, "z": z})


def test_tile():
    repeats = [[1, 2, 3, 1], [2, 1, 1, 2]]
    inits = {f"r{k}": ints(*r) for k, r in enumerate(repeats)}
    check_both_layouts(
        lambda src: [node("Tile", [src, f"r{k}"], f"{src}_{k}") for k in range(len(repeats))],
        rng.randn(2, 3, 4, 5), inits)


def test_tile_dynamic_runtime_repeats():
    feeds = {"x": rng.randn(2, 3, 5, 7), "r": ints(1, 2, 1, 2)}
    model = make_model([node("Tile", ["x", "r"], "y")], feeds, ["y"],
                       input_shapes={"x": ["N", 3, 5, 7]})
    check_model(model, feeds)


# --- Layout: channel-last values through shape ops, with no TRANSPOSE ----------------------
def test_vit_patch_embedding_has_no_transpose():
    """Conv(stride=patch) -> Reshape(N, E, h*w) -> Transpose(0, 2, 1): tokens (N, hw, E)."""
    nodes = [
        node("Conv", ["x", "w", "b"], "c", strides=[8, 8]),
        node("Reshape", ["c", "s"], "r"),
        node("Transpose", ["r"], "y", perm=[0, 2, 1]),
    ]
    inits = {"w": rng.conv_weights(16, 3, 8), "b": rng.randn(16), "s": ints(2, 16, 16)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 32, 32)}, inits, outputs=["y"])
    assert no_transpose(census)


def test_vit_patch_embedding_dynamic_batch_has_no_transpose():
    x = rng.randn(2, 3, 32, 32)
    nodes = [
        node("Conv", ["x", "w"], "c", strides=[8, 8]),
        node("Shape", ["c"], "n", end=2),
        node("Concat", ["n", "minus1"], "s", axis=0),
        node("Reshape", ["c", "s"], "r"),
        node("Transpose", ["r"], "y", perm=[0, 2, 1]),
    ]
    inits = {"w": rng.conv_weights(16, 3, 8), "minus1": ints(-1)}
    model = make_model(nodes, {"x": x}, ["y"], inits, input_shapes={"x": ["N", 3, 32, 32]})
    converted = check_model(model, {"x": x})
    assert no_transpose(count_tflite_ops(tflite_bytes(converted.result)))


def test_conv_transpose_pair_conv_has_no_transpose():
    """Transpose(0,2,3,1) then Transpose(0,3,1,2) between convs: no op at all."""
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        node("Transpose", ["a"], "t", perm=[0, 2, 3, 1]),
        node("Relu", ["t"], "r"),
        node("Transpose", ["r"], "u", perm=[0, 3, 1, 2]),
        node("Conv", ["u", "w2"], "y"),
    ]
    inits = {"w1": rng.conv_weights(4, 3), "w2": rng.conv_weights(5, 4)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits, outputs=["y", "t"])
    assert no_transpose(census)


def test_conv_pool_flatten_dense_has_no_transpose():
    """Conv -> GlobalAveragePool -> Flatten -> Gemm (or MatMul + Add), NHWC all the way."""
    nodes = [node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1])]
    inits = {"w": rng.conv_weights(6, 3)}
    if find_handler("GlobalAveragePool", "", 18):
        nodes.append(node("GlobalAveragePool", ["c"], "p"))
    else:  # a full-size kernel makes the same (N, C, 1, 1) channel-last value
        nodes.append(node("Conv", ["c", "wp"], "p"))
        inits["wp"] = rng.conv_weights(6, 6, 8)
    nodes.append(node("Flatten", ["p"], "f"))
    inits.update(dw=rng.randn(6, 4), db=rng.randn(4))
    if find_handler("Gemm", "", 18):
        nodes.append(node("Gemm", ["f", "dw", "db"], "y"))
    elif find_handler("MatMul", "", 18):
        nodes += [node("MatMul", ["f", "dw"], "m"), node("Add", ["m", "db"], "y")]
    else:
        inits.update(dw=rng.randn(6), db=rng.randn(6))
        nodes += [node("Mul", ["f", "dw"], "m"), node("Add", ["m", "db"], "y")]
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 8)}, inits, outputs=["y"])
    assert no_transpose(census)


def test_conv1d_unsqueeze_conv2d_squeeze_has_no_transpose():
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1]),
        node("Unsqueeze", ["a", "ax"], "u"),
        node("Conv", ["u", "w2"], "c", pads=[0, 1, 0, 1]),
        node("Squeeze", ["c", "ax"], "s"),
        node("Conv", ["s", "w3"], "y"),
    ]
    inits = {"w1": rng.randn(4, 3, 3), "w2": rng.randn(5, 4, 1, 3), "w3": rng.randn(2, 5, 1),
             "ax": ints(2)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 10)}, inits, outputs=["y"])
    assert no_transpose(census)


def test_conv_expand_tile_reshape_keep_channel_last():
    nodes = [
        node("Conv", ["x", "w"], "a", pads=[1, 1, 1, 1]),
        node("Tile", ["a", "r"], "t"),
        node("Expand", ["t", "s"], "e"),
        node("Reshape", ["e", "back"], "b"),
        node("Conv", ["b", "w2"], "y"),
    ]
    inits = {"w": rng.conv_weights(4, 3), "w2": rng.conv_weights(2, 4), "r": ints(1, 1, 2, 1),
             "s": ints(1, 4, 1, 1), "back": ints(0, 0, 8, 5)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 4, 5)}, inits, outputs=["y"])
    assert no_transpose(census)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_range_of_one_element_tensors_at_run_time(dtype):
    """Run-time start/limit/delta of shape [1] (onnxruntime and the spec's function bodies
    pass them): TFLite's RANGE wants scalars."""
    feeds = {"r0": np.array([1], dtype), "r1": np.array([11], dtype),
             "r2": np.array([3], dtype)}
    check_nodes([node("Range", ["r0", "r1", "r2"], "y")], feeds)


def test_model_without_inputs_is_refused_clearly():
    from onnx2tf_alt.errors import InputError
    from onnx2tf_alt.pipeline import build

    value = helper.make_tensor("v", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph(
        [node("Constant", [], "c", value=value)], "constant_only", [],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(InputError, match=r"has no runtime inputs: its outputs \('c'\) are "
                                         "constants"):
        build(onnx_graph=model)
