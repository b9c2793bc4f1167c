import numpy as np
import pytest
from onnx import helper

from harness import check_node, check_nodes

rng = np.random.default_rng(0)

REDUCE_OPS = [
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
    "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
]


def _data(op, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    if op == "ReduceLogSum":
        return np.abs(x) + 0.1
    if op == "ReduceProd":
        return (0.5 + rng.random(shape)).astype(np.float32)
    if op == "ReduceLogSumExp":
        return x * 30  # large values: only a max-shifted LogSumExp stays finite in float32
    return x


def check_each(ops, inputs, attrs, axes=None, opset=18, channel_last=False):
    """One model with a node per op (each on its own input), checked in one conversion."""
    nodes, feeds = [], {}
    for op in ops:
        feeds[f"x_{op}"] = inputs(op)
        axes_input = ["axes"] if axes is not None else []
        nodes.append(helper.make_node(op, [f"x_{op}", *axes_input], [f"y_{op}"], **attrs))
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    layout = {"keep_nwc_or_nhwc_or_ndhwc_input_names": list(feeds)} if channel_last else {}
    check_nodes(nodes, feeds, inits, opset, **layout)


@pytest.mark.parametrize(
    "axes, keepdims, channel_last",
    [([1], 1, False), ([0, 2], 0, True), ([-1, 1], 0, False), ([1, -1], 1, True),
     (None, 0, False), (None, 1, True), ([3, 2], 0, True)],
)
def test_reduce_axes_input(axes, keepdims, channel_last):
    check_each(REDUCE_OPS, lambda op: _data(op, (2, 3, 5, 4)), {"keepdims": keepdims}, axes,
               channel_last=channel_last)


@pytest.mark.parametrize("axes, keepdims", [([2], 0), ([-3, 3], 1), (None, 0)])
def test_reduce_axes_attribute(axes, keepdims):
    attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": axes})}
    ops = [op for op in REDUCE_OPS if op != "ReduceSum"]  # ReduceSum took axes as input at 13
    check_each(ops, lambda op: _data(op, (3, 2, 5, 7)), attrs, opset=13, channel_last=True)


@pytest.mark.parametrize("axes, keepdims", [([1, 2], 0), (None, 1)])
def test_reduce_sum_axes_attribute_before_13(axes, keepdims):
    attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": axes})}
    check_each(["ReduceSum"], lambda op: _data(op, (3, 2, 5, 7)), attrs, opset=11,
               channel_last=True)


def test_reduce_noop_with_empty_axes():
    check_each(REDUCE_OPS, lambda op: _data(op, (2, 5, 3)),
               {"noop_with_empty_axes": 1, "keepdims": 0}, axes=[])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integer(dtype):
    check_each(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"],
               lambda op: rng.integers(-4, 5, (2, 3, 4)).astype(dtype), {"keepdims": 0}, [1])


@pytest.mark.parametrize("axes", [[0, -1], []])
def test_reduce_runtime_axes(axes):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    check_node("ReduceSum", {"x": x, "axes": np.array(axes, np.int64)}, {"keepdims": 1})


def test_reduce_log_sum_exp_all_minus_inf():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[1] = -np.inf
    check_node("ReduceLogSumExp", {"x": x}, {"keepdims": 0}, {"axes": np.array([1, 2])})


def test_conv_reduce_mean_gemm_has_no_transpose():
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((5, 8)).astype(np.float32)
    bias = rng.standard_normal((5,)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c", "axes"], ["m"], keepdims=0),
        helper.make_node("Gemm", ["m", "fc", "bias"], ["y"], transB=1),
    ]
    inits = {"w": w, "axes": np.array([2, 3], np.int64), "fc": fc, "bias": bias}
    _, ops = check_nodes(nodes, {"x": x}, inits, outputs=["y"])
    assert "TRANSPOSE" not in ops and ops.get("FULLY_CONNECTED") == 1, ops


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceL2"])
def test_conv_reduce_channels_conv_has_no_transpose(op):
    x = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w1 = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((3, 1, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"]),
        helper.make_node(op, ["c", "axes"], ["r"], keepdims=1),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    inits = {"w1": w1, "w2": w2, "axes": np.array([1], np.int64)}
    _, ops = check_nodes(nodes, {"x": x}, inits, outputs=["y"])
    assert "TRANSPOSE" not in ops, ops


def _many_ties(op):
    return rng.integers(0, 3, (2, 3, 5, 4)).astype(np.float32)


@pytest.mark.parametrize(
    "axis, keepdims, last, channel_last",
    [(1, 1, 0, True), (1, 0, 1, True), (-1, 0, 0, False), (0, 1, 1, False),
     (2, 0, 1, True), (3, 1, 0, True)],
)
def test_arg_reduce(axis, keepdims, last, channel_last):
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    check_each(["ArgMax", "ArgMin"], _many_ties, attrs, opset=13, channel_last=channel_last)


def test_arg_reduce_integer_default_attrs():
    check_each(["ArgMax", "ArgMin"], lambda op: rng.integers(-3, 3, (3, 4)).astype(np.int32),
               {}, opset=11)


def check_runtime_axes(ops, shape, attrs, axes):
    """One model with a node per op, `axes` a graph input fed at run time."""
    nodes, feeds = [], {"axes": np.array(axes, np.int64)}
    for op in ops:
        feeds[f"x_{op}"] = _data(op, shape)
        nodes.append(helper.make_node(op, [f"x_{op}", "axes"], [f"y_{op}"], **attrs))
    check_nodes(nodes, feeds)


@pytest.mark.parametrize("axes", [[1], [-1, 0], [2, 0, 1]])
def test_reduce_runtime_axes_no_keepdims(axes):
    check_runtime_axes(REDUCE_OPS, (2, 3, 4), {"keepdims": 0}, axes)


@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([0, 2], 0), ([], 0)])
def test_reduce_runtime_axes_noop_with_empty_axes(axes, keepdims):
    check_runtime_axes(["ReduceSum", "ReduceL2", "ReduceLogSumExp"], (3, 2, 4),
                       {"keepdims": keepdims, "noop_with_empty_axes": 1}, axes)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_runtime_axes_unknown_output_shape(keepdims):
    """Run-time axes feeding another op: no inferred output shape, only its rank."""
    feeds = {"x": _data("ReduceSum", (3, 2, 4)), "axes": np.array([-1, 0], np.int64)}
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=keepdims),
             helper.make_node("Neg", ["r"], ["y"])]
    check_nodes(nodes, feeds, outputs=["y"])
