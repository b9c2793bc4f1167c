"""The layout plan's cost model and search (onnx2tf_alt/layout/cost.py).

The first tests use a few policies of layout/policies.py on hand-made graphs: no handler, no
TensorFlow. The property tests draw random graphs of real ops: the search is never worse
than the forward pass nor than the ONNX-order plan (by cost), and its plans convert to the
same values as onnxruntime's through the Keras model and the float32 TFLite.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.ir.graph import graph_from_model
from onnx2tf_alt.layout import cost as LC
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.cost import PER_TRANSPOSE, Cost, plan_cost
from onnx2tf_alt.layout.plan import plan_layouts
from onnx2tf_alt.layout.policies import agnostic, channel_last, derived, logical, same_as_input

from harness import check_model, make_model

POLICIES = {
    "Conv": channel_last(0),
    "Relu": agnostic,
    "Add": agnostic,
    "Split": same_as_input(0),
    "Transpose": derived(lambda node, graph, p: P.compose_transpose(p, node.attrs["perm"])),
    "MatMul": logical,
    "Identity": logical,
}


def _graph(nodes, inputs: dict[str, list], outputs: list[str], inits=None):
    model = make_model(nodes, {n: np.zeros(s, np.float32) for n, s in inputs.items()},
                       outputs, inits)
    return graph_from_model(onnx.shape_inference.infer_shapes(model))


def _plans(graph):
    """{search: (plan, cost)} for the three searches, with the policies above."""
    def policy_of(node):
        return POLICIES[node.op_type]

    found = {}
    for search in ("forward", "onnx_order", "refined"):
        plan = plan_layouts(graph, policy_of, search=search)
        found[search] = plan, plan_cost(graph, plan)
    return found


def _conv_weight(c_out: int, c_in: int) -> np.ndarray:
    return np.ones((c_out, c_in, 1, 1), np.float32)


def test_cost_counts_elements_and_transposes():
    # x feeds a channel-last op (so arrives channel-last) and a logical one: one transpose
    graph = _graph([helper.make_node("Conv", ["x", "w"], ["y"]),
                    helper.make_node("Identity", ["x"], ["z"])],
                   {"x": [2, 8, 4, 5]}, ["y", "z"], {"w": _conv_weight(8, 8)})
    plan, cost = _plans(graph)["forward"]
    assert plan.perms["x"] == (0, 2, 3, 1)
    # x to ONNX order for Identity; y (channel-last) stays so as a model output
    assert cost == Cost(elements=2 * 8 * 4 * 5, transposes=1)
    assert cost.total == 320 + PER_TRANSPOSE


def test_narrow_tiles_cost_more_per_element():
    # the same with 3 channels: NHWC -> NCHW swaps tiles 3 wide
    graph = _graph([helper.make_node("Conv", ["x", "w"], ["y"]),
                    helper.make_node("Identity", ["x"], ["z"])],
                   {"x": [2, 3, 4, 5]}, ["y", "z"], {"w": _conv_weight(3, 3)})
    _, cost = _plans(graph)["forward"]
    assert cost == Cost(elements=round(1.5 * 2 * 3 * 4 * 5), transposes=1)


@pytest.mark.parametrize("shape, have, want, factor", [
    # ShuffleNet V2's shuffle channel-last: [N, H, W, 2, C/2] -> [N, H, W, C/2, 2]
    ((1, 58, 2, 28, 28), (0, 3, 4, 2, 1), (0, 3, 4, 1, 2), 3.0),
    # the same channel-first moves whole 28 x 28 planes
    ((1, 58, 2, 28, 28), (0, 2, 1, 3, 4), (0, 1, 2, 3, 4), 1.0),
    # ShuffleNet V1's groups of 4 channel-last
    ((1, 28, 4, 56, 56), (0, 3, 4, 2, 1), (0, 3, 4, 1, 2), 1.5),
    # groups of 8: wide enough
    ((1, 14, 8, 28, 28), (0, 3, 4, 2, 1), (0, 3, 4, 1, 2), 1.0),
    # attention heads [B, S, H, D] -> [B, H, S, D]: rows of D stay whole
    ((1, 50, 4, 16), (0, 1, 2, 3), (0, 2, 1, 3), 1.0),
    # NHWC -> NCHW of 64 channels: wide tiles
    ((1, 64, 14, 14), (0, 2, 3, 1), (0, 1, 2, 3), 1.0),
    # size-1 axes do not count: [1, 1, 7, 2] -> [1, 2, 1, 7] swaps 7 x 2 tiles
    ((1, 2, 1, 7), (0, 2, 3, 1), (0, 1, 2, 3), 3.0),
])
def test_per_element_weight(shape, have, want, factor):
    assert LC._per_element(shape, have, want) == factor


def test_moving_size_one_axes_and_constants_is_free():
    graph = _graph([helper.make_node("Conv", ["x", "w"], ["y"]),
                    helper.make_node("Identity", ["x"], ["z"]),
                    helper.make_node("Add", ["y", "c"], ["s"])],
                   {"x": [2, 3, 1, 1]}, ["s", "z"],
                   {"w": _conv_weight(3, 3), "c": np.ones((1, 3, 1, 1), np.float32)})
    plan, cost = _plans(graph)["forward"]
    assert plan.transposes(graph), "the plan does move x, by a reshape"
    assert cost == Cost(0, 0)


def _split_heads(with_relu: bool, batch: bool = False):
    """qkv [N, 3, H, D] -> Transpose(1, 2, 0, 3) -> Split into q, k, v, each then read in
    ONNX order (MatMul): the forward pass keeps the Transpose a perm change and transposes
    each head; doing the Transpose itself costs one transpose instead of three. With
    `batch`, qkv is [B, N, 3, H, D] and the Transpose 5-D."""
    perm, shape = ([2, 0, 3, 1, 4], [2, 5, 3, 2, 4]) if batch else ([1, 2, 0, 3], [5, 3, 2, 4])
    nodes = [helper.make_node("Transpose", ["qkv"], ["t"], perm=perm),
             helper.make_node("Split", ["t"], ["q", "k", "v"], axis=0, num_outputs=3)]
    if with_relu:
        nodes.append(helper.make_node("Relu", ["q"], ["q2"]))
    heads = ["q2" if with_relu else "q", "k", "v"]
    for i, name in enumerate(heads):
        nodes.append(helper.make_node("MatMul", [name, "w"], [f"o{i}"]))
    return _graph(nodes, {"qkv": shape}, ["o0", "o1", "o2"], {"w": np.ones((4, 4), np.float32)})


@pytest.mark.parametrize("with_relu", [False, True])
def test_search_does_a_transpose_once_instead_of_per_head(with_relu):
    plans = _plans(_split_heads(with_relu))
    head = 2 * 5 * 4
    assert plans["forward"][1] == Cost(3 * head, 3)
    plan, cost = plans["refined"]
    assert cost == Cost(3 * head, 1)
    assert P.is_identity(plan.perms["q"]) and P.is_identity(plan.perms["v"])


def test_search_does_a_five_dim_transpose_once_too():
    """The 5-D form of the same (window attention with a batch axis): one 5-D transpose,
    measured as fast as the three 4-D ones it replaces, moving the same elements."""
    plans = _plans(_split_heads(False, batch=True))
    head = 2 * 2 * 5 * 4
    assert plans["forward"][1] == Cost(3 * head, 3)
    assert plans["refined"][1] == Cost(3 * head, 1)


def test_search_adds_no_transpose_tflite_cannot_run(monkeypatch):
    """Above MAX_ADDED_RANK dims the search leaves the forward pass's transposes alone."""
    monkeypatch.setattr(LC, "MAX_ADDED_RANK", 4)
    plans = _plans(_split_heads(False, batch=True))
    assert plans["refined"][1] == plans["forward"][1]


def test_search_keeps_a_cnn_free_of_transposes():
    graph = _graph([helper.make_node("Conv", ["x", "w"], ["y"]),
                    helper.make_node("Relu", ["y"], ["r"]),
                    helper.make_node("Conv", ["r", "w"], ["z"])],
                   {"x": [2, 3, 4, 5]}, ["z"], {"w": _conv_weight(3, 3)})
    plans = _plans(graph)
    assert plans["refined"][1] == plans["forward"][1] == Cost(0, 0)
    assert plans["onnx_order"][1].transposes > 0


# --- random graphs of real ops -------------------------------------------------------------
class _RandomGraph:
    """A random mix of Conv / Transpose / Reshape / MatMul / Softmax / Concat / Add / Relu on
    a [2, 4, 6, 5] input, every value's shape tracked so each op is valid."""

    def __init__(self, seed: int, steps: int = 9):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.shapes = [], {}, {"x": (2, 4, 6, 5)}
        for _ in range(steps):
            self._step()
        names = list(self.shapes)
        self.outputs = [names[-1]] + ([names[-3]] if len(names) > 3 else [])

    def _new(self, shape) -> str:
        name = f"v{len(self.shapes)}"
        self.shapes[name] = tuple(int(d) for d in shape)
        return name

    def _const(self, array, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits[name] = np.asarray(array).astype(dtype)
        return name

    def _step(self) -> None:
        names = list(self.shapes)
        x = names[-1] if self.rng.random() < 0.6 else names[self.rng.integers(len(names))]
        shape = self.shapes[x]
        op = self.rng.choice(["Conv", "Transpose", "Reshape", "MatMul", "Softmax", "Concat",
                              "Add", "Relu"])
        if op == "Conv" and len(shape) == 4:
            c_out = int(self.rng.integers(2, 5))
            w = self._const(self.rng.standard_normal((c_out, shape[1], 3, 3)) * 0.3)
            y = self._new((shape[0], c_out, shape[2], shape[3]))
            self.nodes.append(helper.make_node("Conv", [x, w], [y], pads=[1, 1, 1, 1]))
        elif op == "Transpose":
            perm = [int(a) for a in self.rng.permutation(len(shape))]
            y = self._new([shape[a] for a in perm])
            self.nodes.append(helper.make_node("Transpose", [x], [y], perm=perm))
        elif op == "Reshape" and len(shape) >= 3:
            a = int(self.rng.integers(len(shape) - 1))  # merge axes a and a + 1
            target = [*shape[:a], shape[a] * shape[a + 1], *shape[a + 2:]]
            y = self._new(target)
            dims = self._const(target, np.int64)
            self.nodes.append(helper.make_node("Reshape", [x, dims], [y]))
        elif op == "MatMul":
            n = int(self.rng.integers(2, 5))
            w = self._const(self.rng.standard_normal((shape[-1], n)) * 0.5)
            y = self._new([*shape[:-1], n])
            self.nodes.append(helper.make_node("MatMul", [x, w], [y]))
        elif op == "Softmax":
            y = self._new(shape)
            axis = int(self.rng.integers(-len(shape), len(shape)))
            self.nodes.append(helper.make_node("Softmax", [x], [y], axis=axis))
        elif op == "Concat":
            axis = int(self.rng.integers(len(shape)))
            r = self._new(shape)
            self.nodes.append(helper.make_node("Relu", [x], [r]))
            y = self._new([d * 2 if i == axis else d for i, d in enumerate(shape)])
            self.nodes.append(helper.make_node("Concat", [x, r], [y], axis=axis))
        elif op == "Add":
            other = [n for n in names if self.shapes[n] == shape]
            b = other[self.rng.integers(len(other))] if len(other) > 1 else self._const(
                self.rng.standard_normal(shape[-1:]))
            y = self._new(shape)
            self.nodes.append(helper.make_node("Add", [x, b], [y]))
        else:
            y = self._new(shape)
            self.nodes.append(helper.make_node("Relu", [x], [y]))

    def model(self) -> onnx.ModelProto:
        return make_model(self.nodes, {"x": np.zeros((2, 4, 6, 5), np.float32)},
                          self.outputs, self.inits)


def _real_plans(model):
    from onnx2tf_alt.passes.prepare import prepare_model
    from onnx2tf_alt.pipeline import policy_of

    graph = graph_from_model(prepare_model(model))
    plans = {s: plan_layouts(graph, policy_of(graph), search=s)
             for s in ("forward", "onnx_order", "refined")}
    return plans, {s: plan_cost(graph, plan) for s, plan in plans.items()}


GRAPHS = 120


def test_search_is_never_worse_on_random_graphs():
    improved = compared = 0
    for seed in range(GRAPHS):
        plans, costs = _real_plans(_RandomGraph(seed).model())
        refined = costs["refined"].total
        assert refined <= costs["forward"].total, (seed, costs)
        assert plans["refined"].output_perms == plans["forward"].output_perms, seed
        if plans["onnx_order"].output_perms == plans["forward"].output_perms:
            assert refined <= costs["onnx_order"].total, (seed, costs)
            compared += 1
        improved += refined < costs["forward"].total
    assert improved > 0, "no random graph gave the search anything to do"
    assert compared > GRAPHS // 2


NUMERIC_GRAPHS = 6


def test_searched_plans_convert_exactly():
    """The graphs where the search changed the plan, converted and run against onnxruntime."""
    checked = 0
    for seed in range(GRAPHS):
        model = _RandomGraph(seed).model()
        _, costs = _real_plans(model)
        if costs["refined"].total < costs["forward"].total:
            feeds = {"x": np.random.default_rng(seed).standard_normal((2, 4, 6, 5))}
            check_model(model, {"x": feeds["x"].astype(np.float32)})
            checked += 1
            if checked == NUMERIC_GRAPHS:
                break
    assert checked == NUMERIC_GRAPHS
