"""Gathers, scatters, TopK, CumSum, CumProd, NonZero, OneHot, Trilu, Compress, Unique,
ReverseSequence, TensorScatter (ops/indexing.py) against onnxruntime, through TF and the
float32 TFLite.

Variants of one op share a model where they can (one conversion each).
"""

import numpy as np
import pytest

from harness import (
    Rng,
    assert_keras_reloads,
    check_model,
    check_node,
    check_nodes,
    ints,
    make_model,
    node,
)

rng = Rng(0)


def check_between_convs(middle, inits=None, channels=4, out_channels=None, inputs=None):
    """x -> Conv 'a' -> `middle` nodes (ending in 'm') -> Conv: no TRANSPOSE in the TFLite."""
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        *middle,
        node("Conv", ["m", "w2"], "y", pads=[1, 1, 1, 1]),
    ]
    inits = {"w1": rng.conv_weights(channels, 3),
             "w2": rng.conv_weights(2, out_channels or channels), **(inits or {})}
    feeds = {"x": rng.randn(2, 3, 7, 5), **(inputs or {})}
    converted, census = check_nodes(nodes, feeds, inits, outputs=["y"])
    assert census.get("TRANSPOSE", 0) == 0, census
    return converted


def random_indices(shape, dim, negative=True):
    low = -dim if negative else 0
    return rng.integers(low, dim, shape).astype(np.int64)


# --- GatherElements ------------------------------------------------------------------------
def test_gather_elements():
    x = rng.randn(2, 3, 5)
    cases = {0: (2, 3, 5), 1: (2, 4, 5), -1: (2, 3, 7)}
    inputs, inits, nodes = {"x": x}, {}, []
    for axis, shape in cases.items():
        dim = x.shape[axis]
        inputs[f"i{axis}"] = random_indices(shape, dim)
        inits[f"c{axis}"] = random_indices(shape[:1] + (2,) + shape[2:], dim)
        nodes.append(node("GatherElements", ["x", f"i{axis}"], f"r{axis}", axis=axis))
        nodes.append(node("GatherElements", ["x", f"c{axis}"], f"k{axis}", axis=axis))
    check_nodes(nodes, inputs, inits)


def test_gather_elements_int_and_opset11():
    x = rng.integers(-50, 50, (3, 4)).astype(np.int64)
    check_nodes([node("GatherElements", ["x", "i"], "y", axis=1)],
                {"x": x, "i": random_indices((3, 6), 4)}, opset=11)


def test_gather_elements_channel_last():
    index = random_indices((2, 2, 7, 5), 4)
    check_between_convs([node("GatherElements", ["a", "i"], "m", axis=1)], {"i": index},
                        out_channels=2)


# --- GatherND ------------------------------------------------------------------------------
def test_gather_nd():
    x = rng.randn(2, 3, 4, 5)
    inputs = {
        "x": x,
        "i1": random_indices((4, 1), 2),
        "i2": np.stack([random_indices((3, 2), 2), random_indices((3, 2), 3)], -1),
        "i4": np.stack([random_indices((5,), d) for d in (2, 3, 4, 5)], -1),
        "b1": random_indices((2, 3, 1), 3),
        "b2": np.stack([random_indices((2, 3, 2), 3), random_indices((2, 3, 2), 4)], -1),
    }
    inits = {"c2": np.stack([random_indices((6,), 2), random_indices((6,), 3)], -1)}
    nodes = [
        node("GatherND", ["x", "i1"], "r1"),
        node("GatherND", ["x", "i2"], "r2"),
        node("GatherND", ["x", "i4"], "r4"),
        node("GatherND", ["x", "c2"], "k2"),
        node("GatherND", ["x", "b1"], "s1", batch_dims=1),
        node("GatherND", ["x", "b2"], "s2", batch_dims=1),
    ]
    check_nodes(nodes, inputs, inits)


def test_gather_nd_batch_dims_two_and_int_data():
    x = rng.integers(0, 100, (2, 3, 5, 4)).astype(np.int32)
    index = random_indices((2, 3, 4, 1), 5)
    check_nodes([node("GatherND", ["x", "i"], "y", batch_dims=2)], {"x": x, "i": index})


# --- ScatterND -----------------------------------------------------------------------------
def distinct_rows(count, dims):
    """`count` distinct index tuples into `dims`, some written as negative indices."""
    flat = rng.choice(int(np.prod(dims)), count, replace=False)
    index = np.stack(np.unravel_index(flat, dims), -1).astype(np.int64)
    return np.where(rng.random(index.shape) < 0.3, index - np.array(dims), index)


REDUCTIONS = ("none", "add", "mul", "max", "min")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd(reduction):
    """Duplicate targets except for "none"."""
    x = rng.randn(4, 3, 5)
    duplicate = reduction != "none"
    inputs = {
        "x": x,
        "i1": ints(1, -4, 1 if duplicate else 3)[:, None],
        "u1": rng.randn(3, 3, 5),
        "i2": distinct_rows(4, (4, 3)).reshape(2, 2, 2),
        "u2": rng.randn(2, 2, 5),
        "i3": distinct_rows(6, (4, 3, 5)),
        "u3": rng.randn(6),
    }
    if duplicate:
        inputs["i2"][1, 1] = inputs["i2"][0, 0]
    inits = {"c2": distinct_rows(3, (4, 3)), "v2": rng.randn(3, 5)}
    nodes = [node("ScatterND", ["x", f"i{r}", f"u{r}"], f"r{r}", reduction=reduction)
             for r in (1, 2, 3)]
    nodes.append(node("ScatterND", ["x", "c2", "v2"], "k2", reduction=reduction))
    check_nodes(nodes, inputs, inits)


def test_scatter_nd_opset11_and_int():
    x = rng.integers(-9, 9, (5, 4)).astype(np.int64)
    inputs = {"x": x, "i": distinct_rows(3, (5,)), "u": rng.integers(-9, 9, (3, 4))}
    check_nodes([node("ScatterND", ["x", "i", "u"], "y")], inputs, opset=11)


# --- ScatterElements / Scatter -------------------------------------------------------------
def distinct_along(shape, dim, axis):
    """Indices of `shape` whose targets along `axis` (of size dim) are distinct."""
    axis %= len(shape)
    order = np.argsort(rng.random((*shape[:axis], dim, *shape[axis + 1:])), axis=axis)
    index = np.take(order, range(shape[axis]), axis=axis)
    return (index - dim * (rng.random(shape) < 0.3)).astype(np.int64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements(reduction):
    """Duplicate targets except for "none"."""
    x = rng.randn(3, 4, 5)
    inputs, nodes = {"x": x}, []
    for axis, shape in {0: (2, 4, 5), 1: (3, 2, 5), -1: (3, 4, 2)}.items():
        dim, tag = x.shape[axis], f"{axis}".replace("-", "m")
        if reduction == "none":
            inputs[f"i{tag}"] = distinct_along(shape, dim, axis)
        else:
            inputs[f"i{tag}"] = random_indices(shape, dim)
        inputs[f"u{tag}"] = rng.randn(*shape)
        nodes.append(node("ScatterElements", ["x", f"i{tag}", f"u{tag}"], f"r{tag}",
                          axis=axis, reduction=reduction))
    check_nodes(nodes, inputs)


def test_scatter_elements_constant_indices_channel_last():
    index = np.zeros((2, 4, 7, 5), np.int64)
    index[:, 1] = 3
    index[:, 2] = -1
    index[:, 3] = 2
    middle = [node("ScatterElements", ["a", "i", "u"], "m", axis=1, reduction="add")]
    check_between_convs(middle, {"i": index, "u": rng.randn(2, 4, 7, 5)})


@pytest.mark.parametrize("rows", [0, 2])
def test_scatters_with_no_updates_at_run_time(rows):
    """torchvision's MultiScaleRoIAlign scatters each feature level's boxes into the result;
    a level that gets no box scatters an empty `updates`, which must leave data as it is
    (a gather into the empty updates failed in TF and in TFLite)."""
    x = rng.randn(3, 4)
    index = distinct_along((rows, 4), 3, 0)
    inputs = {"x": x, "i": index, "u": rng.randn(rows, 4), "j": distinct_rows(rows, (3,)),
              "v": rng.randn(rows, 4)}
    nodes = [node("ScatterElements", ["x", "i", "u"], "y", axis=0),
             node("ScatterND", ["x", "j", "v"], "z")]
    check_nodes(nodes, inputs, input_shapes={"i": ["n", 4], "u": ["n", 4], "j": ["n", 1],
                                             "v": ["n", 4]})


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_of_expanded_row_indices(reduction):
    """torchvision's MultiScaleRoIAlign: result.scatter(0, idx.view(-1, 1, 1, 1).expand(-1,
    C, H, W), level_result). Whole rows are scattered as rows (no per-element offsets: the
    Expand disappears from the file); 4-D, data channel-last after a conv, a run-time number of
    rows (3 and 0), duplicate rows for "add", negative indices."""
    nodes = [
        node("Conv", ["x", "w"], "data"),
        node("Relu", ["u"], "updates"),
        node("Shape", ["updates"], "shape"),
        node("Reshape", ["rows", "column"], "small"),
        node("Expand", ["small", "shape"], "index"),
        node("ScatterElements", ["data", "index", "updates"], "y", axis=0, reduction=reduction),
    ]
    inits = {"w": rng.randn(4, 3, 1, 1), "column": np.array([-1, 1, 1, 1], np.int64)}
    for count in (3, 0):
        rows = np.array([4, -1, 4] if reduction == "add" else [4, -1, 1], np.int64)[:count]
        feeds = {"x": rng.randn(6, 3, 5, 2), "u": rng.randn(count, 4, 5, 2), "rows": rows}
        _, census = check_nodes(nodes, feeds, inits, outputs=["y"],
                                input_shapes={"u": ["n", 4, 5, 2], "rows": ["n"]})
        assert "BROADCAST_TO" not in census, census


def test_scatter_opset9():
    x = rng.randn(3, 5)
    index = np.stack([rng.permutation(5)[:3] for _ in range(3)]).astype(np.int64)
    check_nodes([node("Scatter", ["x", "i", "u"], "y", axis=1)],
                {"x": x, "i": index, "u": rng.randn(3, 3)}, opset=9)


# --- TopK ----------------------------------------------------------------------------------
def test_top_k():
    x = rng.randn(2, 5, 7)
    x[0, 1, :4] = x[1, 2, 3:] = 0.5  # ties: lower index first
    inputs = {"x": x}
    nodes = []
    for axis, k, largest in [(-1, 3, 1), (1, 5, 1), (0, 1, 0), (1, 2, 0), (2, 7, 0)]:
        tag = f"{axis}_{k}_{largest}".replace("-", "m")
        inits = f"k{tag}"
        inputs[inits] = ints(k)
        nodes.append(node("TopK", ["x", inits], [f"v{tag}", f"i{tag}"], axis=axis,
                          largest=largest))
    check_nodes(nodes, inputs)


def test_top_k_int_ties_and_constant_k():
    x = rng.integers(0, 4, (3, 11)).astype(np.int32)
    nodes = [node("TopK", ["x", "k"], ["v", "i"]), node("TopK", ["x", "k"], ["w", "j"], largest=0)]
    check_nodes(nodes, {"x": x}, {"k": ints(6)}, opset=11)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_top_k_integer_extremes(dtype):
    """The dtype's whole range, largest and smallest, through TFLite builtins only (-x would
    overflow at the minimum). onnxruntime has no uint64 TopK: the node suite's
    test_top_k_uint64 covers that."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (3, 9), dtype=dtype, endpoint=True)
    x[:, :4] = [info.min, info.max, info.min, 0]
    nodes = [node("TopK", ["x", "k"], ["v", "i"]), node("TopK", ["x", "k"], ["w", "j"], largest=0),
             node("TopK", ["x", "k0"], ["u", "h"], axis=0, largest=0)]
    _, census = check_nodes(nodes, {"x": x}, {"k": ints(5), "k0": ints(2)})
    assert not any(name.startswith("Flex") for name in census), census


def test_top_k_opset1():
    check_nodes([node("TopK", ["x"], ["v", "i"], k=2, axis=0)], {"x": rng.randn(4, 3)}, opset=7)


def test_top_k_channel_last():
    middle = [node("TopK", ["a", "k"], ["m", "idx"], axis=1)]
    check_between_convs(middle, {"k": ints(3)}, out_channels=3)


# --- CumSum --------------------------------------------------------------------------------
def test_cumsum():
    x = rng.randn(2, 3, 5)
    nodes, inits = [], {}
    for axis in (0, 1, -1):
        inits[f"a{axis}"] = np.array(axis, np.int64)
        for exclusive in (0, 1):
            for reverse in (0, 1):
                nodes.append(node("CumSum", ["x", f"a{axis}"], f"y{axis}{exclusive}{reverse}",
                                  exclusive=exclusive, reverse=reverse))
    check_nodes(nodes, {"x": x}, inits)


def test_cumsum_runtime_axis_and_int():
    x = rng.integers(-5, 5, (3, 4, 2)).astype(np.int64)
    y = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    nodes = [node("CumSum", ["x", "a"], "r", reverse=1),
             node("CumSum", ["y", "b"], "s", exclusive=1)]
    check_nodes(nodes, {"x": x, "a": np.array(-2, np.int32), "y": y},
                {"b": np.array([1], np.int64)}, opset=14)


def test_cumsum_channel_last():
    check_between_convs([node("CumSum", ["a", "axis"], "m", exclusive=1)],
                        {"axis": np.array(1, np.int64)})


# --- NonZero -------------------------------------------------------------------------------
def test_non_zero():
    x = rng.randn(2, 3, 4)
    x[rng.random(x.shape) < 0.5] = 0
    b = rng.random((3, 5)) < 0.3
    n = rng.integers(-1, 2, (7,)).astype(np.int32)
    nodes = [node("NonZero", ["x"], "r"), node("NonZero", ["b"], "s"), node("NonZero", ["n"], "t")]
    check_nodes(nodes, {"x": x, "b": b, "n": n})


def test_non_zero_then_transpose_moves_nothing():
    """Detectors gather with Transpose(NonZero(mask)): WHERE's [N, rank] is that already."""
    x = rng.randn(3, 4, 5)
    x[rng.random(x.shape) < 0.6] = 0
    nodes = [node("NonZero", ["x"], "nz"), node("Transpose", ["nz"], "at", perm=[1, 0]),
             node("GatherND", ["x", "at"], "y")]
    _, census = check_nodes(nodes, {"x": x}, outputs=["y"])
    assert "TRANSPOSE" not in census


# --- OneHot --------------------------------------------------------------------------------
def test_one_hot():
    index = rng.integers(-5, 5, (2, 3)).astype(np.int64)
    inits = {"d": np.array([5], np.int64), "v": np.array([-1.0, 2.0], np.float32),
             "d2": np.array(4.0, np.float32), "w": np.array([0, 7], np.int64)}
    nodes = [
        node("OneHot", ["i", "d", "v"], "r"),
        node("OneHot", ["i", "d", "v"], "s", axis=0),
        node("OneHot", ["i", "d", "v"], "t", axis=-2),
        node("OneHot", ["f", "d2", "v"], "u", axis=1),
        node("OneHot", ["i", "d", "w"], "z", axis=2),
    ]
    floats = rng.integers(-4, 4, (3, 2)).astype(np.float32)
    check_nodes(nodes, {"i": index, "f": floats}, inits, opset=11)


def test_one_hot_runtime_depth_opset9():
    index = rng.integers(0, 6, (4,)).astype(np.int32)
    check_nodes([node("OneHot", ["i", "d", "v"], "y")],
                {"i": index, "d": np.array([6], np.int32), "v": np.array([0.5, 3.0], np.float32)},
                opset=9)


# --- Trilu ---------------------------------------------------------------------------------
def test_trilu():
    x = rng.randn(2, 5, 7)
    inits = {f"k{k}".replace("-", "m"): np.array(k, np.int64) for k in (-2, 1, 3)}
    nodes = [node("Trilu", ["x"], "u"), node("Trilu", ["x"], "l", upper=0)]
    for k in (-2, 1, 3):
        name = f"k{k}".replace("-", "m")
        nodes.append(node("Trilu", ["x", name], f"u{name}"))
        nodes.append(node("Trilu", ["x", name], f"l{name}", upper=0))
    nodes.append(node("Trilu", ["x", "kr"], "r", upper=0))
    check_nodes(nodes, {"x": x, "kr": np.array(-1, np.int64)}, inits)


def test_trilu_channel_last():
    check_between_convs([node("Trilu", ["a", "k"], "m")], {"k": np.array(1, np.int64)})


# --- Compress ------------------------------------------------------------------------------
def test_compress():
    x = rng.randn(3, 4, 5)
    cond = np.array([1, 0, 1, 1, 0], bool)
    inputs = {"x": x, "c": cond}
    inits = {"k": np.array([0, 1, 1], bool), "short": np.array([1, 0, 1], bool)}
    nodes = [
        node("Compress", ["x", "c"], "r", axis=-1),
        node("Compress", ["x", "k"], "s", axis=0),
        node("Compress", ["x", "short"], "t", axis=1),
        node("Compress", ["x", "c"], "u"),
        node("Compress", ["x", "short"], "v"),
    ]
    check_nodes(nodes, inputs, inits)


def test_compress_channel_last():
    cond = np.array([1, 0, 1, 1], bool)
    check_between_convs([node("Compress", ["a", "c"], "m", axis=1)], {"c": cond}, out_channels=3)


# --- Unique --------------------------------------------------------------------------------
def test_unique():
    x = rng.integers(-3, 4, (3, 5)).astype(np.float32) * 0.5
    n = rng.integers(0, 5, (9,)).astype(np.int64)
    nodes = [
        node("Unique", ["x"], ["y", "i", "inv", "c"]),
        node("Unique", ["x"], ["y0", "i0", "inv0", "c0"], sorted=0),
        node("Unique", ["n"], ["z", "", "zinv", ""]),
    ]
    check_nodes(nodes, {"x": x, "n": n}, outputs=["y", "i", "inv", "c", "y0", "i0", "inv0", "c0",
                                                  "z", "zinv"])


def test_unique_axis():
    """Unique slices: rows of a matrix (sorted and in first-occurrence order), columns of a
    3-D tensor, a negative axis and int64 data; ties broken at a later column."""
    rows = np.array([[1, 0, 2], [0, 3, 1], [1, 0, 2], [0, 3, -1], [1, -2, 5], [0, 3, 1]],
                    np.float32)
    cube = rng.integers(0, 2, (2, 5, 3)).astype(np.float32)
    cube[:, 3] = cube[:, 1]
    n = rng.integers(-2, 2, (4, 6)).astype(np.int64)
    n[:, 4] = n[:, 0]
    nodes = [
        node("Unique", ["r"], ["y", "i", "inv", "c"], axis=0),
        node("Unique", ["r"], ["y0", "i0", "inv0", "c0"], axis=0, sorted=0),
        node("Unique", ["x"], ["z", "zi", "zinv", "zc"], axis=1),
        node("Unique", ["n"], ["w", "wi", "winv", "wc"], axis=-1),
    ]
    outputs = [o for nd in nodes for o in nd.output]
    check_nodes(nodes, {"r": rows, "x": cube, "n": n}, outputs=outputs, opset=11)


# --- ReverseSequence -----------------------------------------------------------------------
def test_reverse_sequence():
    x = rng.randn(5, 3, 2)
    y = rng.randn(3, 6, 4, 2)
    nodes = [
        node("ReverseSequence", ["x", "lx"], "r"),
        node("ReverseSequence", ["y", "ly"], "s", batch_axis=0, time_axis=1),
    ]
    inputs = {"x": x, "lx": ints(5, 1, 3), "y": y, "ly": ints(2, 6, 4)}
    check_nodes(nodes, inputs)


def test_reverse_sequence_channel_last():
    middle = [node("ReverseSequence", ["a", "lens"], "m", batch_axis=0, time_axis=1)]
    check_between_convs(middle, {"lens": ints(4, 3)})


# --- unknown dims --------------------------------------------------------------------------
def test_gathers_and_scatters_with_symbolic_batch():
    x = rng.randn(3, 4, 5)
    inputs = {
        "x": x,
        "ie": random_indices((3, 2, 5), 4),
        "ind": np.stack([random_indices((3, 2), 3), random_indices((3, 2), 4)], -1),
        "u": rng.randn(3, 2, 5),
    }
    inits = {"ce": random_indices((2, 4, 5), 3), "cn": distinct_rows(3, (3, 4))}
    nodes = [
        node("GatherElements", ["x", "ie"], "ge", axis=1),
        node("GatherElements", ["x", "ce"], "gc", axis=0),
        node("GatherND", ["x", "ind"], "gn"),
        node("GatherND", ["x", "cn"], "gk"),
        node("ScatterElements", ["x", "ie", "u"], "se", axis=1, reduction="add"),
        node("ScatterND", ["x", "cn", "v"], "sn", reduction="mul"),
        node("Trilu", ["x"], "tr", upper=0),
    ]
    inits["v"] = rng.randn(3, 5)
    shapes = {"x": ["N", 4, 5], "ie": ["N", 2, 5], "ind": ["N", 2, 2], "u": ["N", 2, 5]}
    outputs = [n.output[0] for n in nodes]
    model = make_model(nodes, inputs, outputs, inits, input_shapes=shapes)
    check_model(model, inputs)


# --- CumProd -----------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod_constant_axis(exclusive, reverse, axis):
    check_node("CumProd", {"x": rng.randn(3, 4, 5)}, {"exclusive": exclusive, "reverse": reverse},
               initializers={"axis": np.array(axis, np.int64)}, opset=26)


@pytest.mark.parametrize("axis", [1, -2])
def test_cumprod_runtime_axis(axis):
    check_node("CumProd", {"x": rng.randn(2, 4, 3), "axis": np.array(axis, np.int32)},
               {"reverse": 1}, opset=26)


# --- TensorScatter -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "cache, update, axis, mode, write",
    [
        ((2, 3, 6, 4), (2, 3, 2, 4), -2, "linear", [0, 3]),
        ((2, 3, 6, 4), (2, 3, 3, 4), -2, "circular", [5, 2]),
        ((3, 7, 5), (3, 7, 5), 1, "circular", [4, 0, 6]),
        ((3, 8, 2), (3, 1, 2), 1, "linear", [7, 0, 3]),
        ((2, 5, 3, 4), (2, 2, 3, 4), 1, "linear", None),
        ((2, 4, 6), (2, 4, 3), 2, "circular", [5, 1]),
    ],
)
def test_tensor_scatter(cache, update, axis, mode, write):
    inputs = {"past_cache": rng.randn(*cache), "update": rng.randn(*update)}
    if write is not None:
        inputs["write_indices"] = np.array(write, np.int64)
    check_node("TensorScatter", inputs, {"axis": axis, "mode": mode}, opset=24)


def test_tensor_scatter_dynamic_batch_int(tmp_path):
    inputs = {"past_cache": rng.integers(-9, 9, (3, 2, 6, 4)).astype(np.int32),
              "update": rng.integers(-9, 9, (3, 2, 2, 4)).astype(np.int32),
              "write_indices": np.array([0, 5, 3], np.int64)}
    shapes = {"past_cache": ["N", 2, 6, 4], "update": ["N", 2, 2, 4], "write_indices": ["N"]}
    converted = check_node("TensorScatter", inputs, {"mode": "circular"}, opset=24,
                           input_shapes=shapes)
    assert_keras_reloads(converted, inputs, tmp_path)
