"""The layout plan on small graphs, with the real handlers' policies and no model built.

Each test builds an ONNX graph, prepares it, plans it, and asserts the perms and the
transposes the builder would have to insert (Plan.transposes).
"""

import numpy as np
from onnx import helper

from onnx2tf_alt.ir.graph import graph_from_model
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import reshape_perm
from onnx2tf_alt.passes.prepare import prepare_model
from onnx2tf_alt.pipeline import plan_graph

from harness import make_model

NHWC = (0, 2, 3, 1)
NCHW = (0, 1, 2, 3)


def plan(nodes, inputs, outputs, inits=None, input_shapes=None):
    """(graph, plan) of a model with float inputs of the given shapes."""
    feeds = {n: np.zeros(s, np.float32) for n, s in inputs.items()}
    model = make_model(nodes, feeds, outputs, inits, input_shapes=input_shapes)
    graph = graph_from_model(prepare_model(model))
    return graph, plan_graph(graph)


def conv(x, y, out_ch, in_ch, inits, k=1):
    """A k x k, stride k Conv (k=1: pointwise)."""
    inits[f"w_{y}"] = np.ones((out_ch, in_ch, k, k), np.float32)
    return helper.make_node("Conv", [x, f"w_{y}"], [y], strides=[k, k])


def test_inverse_transposes_cancel_between_convs():
    inits = {}
    nodes = [
        conv("x", "a", 4, 3, inits),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
        conv("u", "y", 2, 4, inits),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 6, 5)}, ["y"], inits)
    assert p.perms["a"] == NHWC
    assert p.perms["t"] == NCHW  # NHWC data is exactly the logical (N, H, W, C) tensor
    assert p.perms["u"] == NHWC
    assert p.transposes(graph) == set()


def test_inverse_transposes_cancel_on_model_input():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t"], ["y"], perm=[0, 3, 1, 2]),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 6, 5)}, ["y"])
    assert p.perms["y"] == NCHW
    assert p.transposes(graph) == set()


def test_transpose_composes_perms():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])]
    graph, p = plan(nodes, {"x": (2, 3, 4)}, ["y"])
    assert p.perms["y"] == P.inverse((2, 0, 1))
    # the output is returned in ONNX order: one transpose at the model output
    assert p.transposes(graph) == {("y", (0, 1, 2))}


def test_unit_axis_move_is_a_reshape():
    """A channel-last (N, C, 1, 1) value read logically needs a move of size-1 axes only."""
    inits = {"i": np.array([[0, 1], [1, 0]], np.int64)}
    nodes = [conv("x", "a", 4, 3, inits, k=5), helper.make_node("Gather", ["a", "i"], ["y"], axis=1)]
    graph, p = plan(nodes, {"x": (2, 3, 5, 5)}, ["y"], inits)
    assert p.transposes(graph) == {("a", NCHW)}
    phys = P.physical_shape(graph.shapes["a"], p.perms["a"])
    assert P.moves_only_unit_axes(phys, P.transpose_between(p.perms["a"], NCHW))


def test_vit_patch_embedding_plan():
    inits = {"s": np.array([1, 8, 16], np.int64)}
    nodes = [
        conv("x", "a", 8, 3, inits, k=4),
        helper.make_node("Reshape", ["a", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1]),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 16, 16)}, ["y"], inits)
    assert p.perms["r"] == (0, 2, 1)  # physically (N, h*w, E): the conv output as it lies
    assert p.perms["y"] == (0, 1, 2)
    assert p.transposes(graph) == set()


def test_vit_patch_embedding_plan_dynamic_batch():
    """The target comes from Shape of a symbolic-batch value; the plan still pairs N."""
    inits = {"m1": np.array([-1], np.int64)}
    nodes = [
        conv("x", "a", 8, 3, inits, k=4),
        helper.make_node("Shape", ["a"], ["n"], end=2),
        helper.make_node("Concat", ["n", "m1"], ["s"], axis=0),
        helper.make_node("Reshape", ["a", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1]),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 16, 16)}, ["y"], inits, {"x": ["N", 3, 16, 16]})
    assert p.perms["r"] == (0, 2, 1)
    assert p.transposes(graph) == set()


def test_reshape_of_unpaired_unknown_dims_runs_logically():
    """(N, C, H, W) with symbolic H, W reshaped by a run-time target: no safe pairing."""
    inits = {"m1": np.array([-1], np.int64)}
    nodes = [
        conv("x", "a", 8, 3, inits),
        helper.make_node("Shape", ["a"], ["n"], end=2),
        helper.make_node("Concat", ["n", "m1"], ["s"], axis=0),
        helper.make_node("Reshape", ["a", "s"], ["y"]),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 4)}, ["y"], inits, {"x": ["N", 3, "H", "W"]})
    assert p.perms["y"] == (0, 1, 2)
    assert p.transposes(graph) == {("a", NCHW)}


def test_reshape_keeping_adjacent_axes():
    """Channel split (N, 8, H, W) -> (N, 2, 4, H, W): 2 and 4 stay adjacent, last physically."""
    inits = {"s": np.array([1, 2, 4, 3, 5], np.int64)}
    nodes = [conv("x", "a", 8, 3, inits), helper.make_node("Reshape", ["a", "s"], ["y"])]
    graph, p = plan(nodes, {"x": (1, 3, 3, 5)}, ["y"], inits)
    assert p.perms["y"] == (0, 3, 4, 1, 2)
    # the model output is returned in ONNX order, so only that transpose remains
    assert p.transposes(graph) == {("y", (0, 1, 2, 3, 4))}


def test_reshape_merging_non_adjacent_axes_runs_logically():
    """(N, C, H, W) -> (N, C*H, W): C and H are not adjacent in NHWC."""
    inits = {"s": np.array([2, 24, 5], np.int64)}
    nodes = [conv("x", "a", 8, 3, inits), helper.make_node("Reshape", ["a", "s"], ["y"])]
    graph, p = plan(nodes, {"x": (2, 3, 3, 5)}, ["y"], inits)
    assert p.perms["y"] == (0, 1, 2)
    assert p.transposes(graph) == {("a", NCHW)}


def test_channel_shuffle_needs_no_transpose():
    """Prepared, a channel shuffle (Reshape -> Transpose -> Reshape reordering only C) between
    two Convs is folded into the second one's weights (onnx2tf_alt/passes/shuffle.py): no node, no
    transpose."""
    inits = {"s": np.array([1, 2, 4, 3, 5], np.int64), "back": np.array([1, 8, 3, 5], np.int64)}
    nodes = [
        conv("x", "a", 8, 3, inits),
        helper.make_node("Reshape", ["a", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "back"], ["b"]),
        conv("b", "y", 2, 8, inits),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 3, 5)}, ["y"], inits)
    assert [n.op_type for n in graph.nodes] == ["Conv", "Conv"]
    assert p.transposes(graph) == set()
    assert p.perms["y"] == NHWC


def test_unabsorbed_channel_shuffle_runs_channel_last():
    """A shuffle no Conv absorbs (Relu -> shuffle -> Relu -> Conv) stays Reshape -> Transpose
    -> Reshape; the plan runs it on the NHWC tensor (one transpose of the regrouped 5-D
    tensor, which XNNPACK runs faster than a Gather) and lands NHWC again."""
    inits = {"s": np.array([1, 2, 4, 3, 5], np.int64), "back": np.array([1, 8, 3, 5], np.int64)}
    nodes = [
        conv("x", "a", 8, 3, inits),
        helper.make_node("Relu", ["a"], ["a2"]),
        helper.make_node("Reshape", ["a2", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "back"], ["b"]),
        helper.make_node("Relu", ["b"], ["b2"]),
        conv("b2", "y", 2, 8, inits),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 3, 5)}, ["y"], inits)
    assert "Gather" not in [n.op_type for n in graph.nodes]
    assert p.perms["a2"] == NHWC and p.perms["b"] == NHWC
    assert {name for name, _ in p.transposes(graph)} == {"t"}


def test_flatten_after_pooling_is_free():
    inits = {}
    nodes = [conv("x", "a", 4, 3, inits, k=6), helper.make_node("Flatten", ["a"], ["y"])]
    graph, p = plan(nodes, {"x": (2, 3, 6, 6)}, ["y"], inits, {"x": ["N", 3, 6, 6]})
    assert p.perms["y"] == (0, 1)
    assert p.transposes(graph) == set()


def test_fan_out_reads_one_transpose():
    """Two logical consumers of one NHWC value share a single transpose."""
    inits = {"i": np.array([[0, 1]], np.int64)}
    nodes = [
        conv("x", "a", 4, 3, inits),
        helper.make_node("Gather", ["a", "i"], ["g1"], axis=2),
        helper.make_node("Gather", ["a", "i"], ["g2"], axis=3),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 4)}, ["g1", "g2"], inits)
    assert p.transposes(graph) == {("a", NCHW)}


def test_constants_are_not_counted():
    """A constant in a foreign perm is permuted at conversion time, for free."""
    inits = {"c": np.ones((1, 2, 4, 4), np.float32), "b": np.ones((1, 4, 4, 4), np.float32)}
    nodes = [
        conv("x", "a", 4, 3, inits),
        helper.make_node("Concat", ["c", "a"], ["k"], axis=1),
        helper.make_node("Add", ["a", "b"], ["d"]),
        helper.make_node("Concat", ["k", "d"], ["m"], axis=1),
        conv("m", "y", 2, 10, inits),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 4)}, ["y"], inits)
    assert p.perms["k"] == NHWC and p.perms["m"] == NHWC
    assert p.transposes(graph) == set()


def test_concat_follows_the_majority_perm():
    inits = {}
    nodes = [
        conv("x", "a", 4, 3, inits),
        conv("x", "b", 4, 3, inits),
        helper.make_node("Concat", ["z", "a", "b"], ["y"], axis=1),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 4), "z": (1, 2, 4, 4)}, ["y"], inits)
    assert p.perms["y"] == NHWC
    assert p.transposes(graph) == {("z", NHWC)}


def test_squeeze_unsqueeze_gather_perms():
    inits = {"ax": np.array([2], np.int64), "i": np.array(1, np.int64),
             "w1d": np.ones((2, 4, 1), np.float32)}
    nodes = [
        conv("x", "a", 4, 3, inits),
        helper.make_node("Gather", ["a", "i"], ["g"], axis=2),  # (N, C, W), kept (N, W, C)
        helper.make_node("Unsqueeze", ["g", "ax"], ["u"]),  # (N, C, 1, W)
        helper.make_node("Squeeze", ["u", "ax"], ["s"]),
        helper.make_node("Conv", ["s", "w1d"], ["y"]),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 5)}, ["y"], inits)
    assert p.perms["g"] == (0, 2, 1)
    assert p.perms["u"] == NHWC
    assert p.perms["s"] == (0, 2, 1)
    assert p.transposes(graph) == set()


def test_shape_reads_any_layout():
    inits = {}
    nodes = [conv("x", "a", 4, 3, inits), helper.make_node("Shape", ["a"], ["s"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph, p = plan(nodes, {"x": (1, 3, 4, 5)}, ["y", "s"], inits, {"x": ["N", 3, 4, 5]})
    assert p.transposes(graph) == set()


def test_slice_split_pad_keep_channel_last():
    inits = {"st": np.array([1], np.int64), "en": np.array([3], np.int64),
             "ax": np.array([1], np.int64), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    nodes = [
        conv("x", "a", 4, 3, inits),
        helper.make_node("Slice", ["a", "st", "en", "ax"], ["b"]),
        helper.make_node("Split", ["b"], ["c", "d"], axis=1, num_outputs=2),
        helper.make_node("Pad", ["c", "pads"], ["e"], mode="edge"),
        conv("e", "y", 2, 1, inits),
    ]
    graph, p = plan(nodes, {"x": (1, 3, 4, 5)}, ["y"], inits)
    assert all(p.perms[v] == NHWC for v in "bcde")
    assert p.transposes(graph) == set()


def test_reshape_perm_rules():
    """The reshape rule itself: merges and splits of physically adjacent axes only."""
    assert reshape_perm((2, 8, 4, 4), (2, 8, 16), NHWC) == (0, 2, 1)
    assert reshape_perm((2, 8, 1, 1), (2, 8), NHWC) == (0, 1)
    assert reshape_perm((2, 8, 4, 4), (2, 128), NHWC) is None  # C before H, W in ONNX order
    assert reshape_perm((2, 8, 4, 4), (2, 8, 4, 4), NCHW) == NCHW


def test_rank3_outputs_stay_channel_last_only_from_channel_last_ops():
    """A 1-D conv's output (through an activation) is delivered (N, L, C), as a 2-D conv's is
    NHWC; a (N, C, H*W) reshape of a conv map concatenated with another is delivered in ONNX
    layout (a detector head's (N, 84, anchors)), however the plan ran it inside."""
    inits = {"w1": np.ones((4, 3, 1), np.float32), "flat": np.array([1, 4, 30], np.int64)}
    nodes = [
        helper.make_node("Conv", ["s", "w1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["seq"]),
        conv("x", "a", 4, 3, inits),
        helper.make_node("Reshape", ["a", "flat"], ["r"]),
        conv("x", "b", 4, 3, inits),
        helper.make_node("Reshape", ["b", "flat"], ["q"]),
        helper.make_node("Sigmoid", ["q"], ["g"]),
        helper.make_node("Concat", ["r", "g"], ["head"], axis=1),
    ]
    _, p = plan(nodes, {"s": (2, 3, 7), "x": (1, 3, 5, 6)}, ["seq", "head"], inits)
    assert p.output_perms["seq"] == (0, 2, 1)
    assert p.perms["head"] == (0, 2, 1) and p.output_perms["head"] == (0, 1, 2)
