"""NonMaxSuppression limited to the rows a leading Slice reads (onnx2tf_alt/passes/nms_limits.py):
the pattern of torchvision's `keep = batched_nms(...)[:K]`, inside and outside an If; the
converted model still matches onnxruntime, which runs the unlimited NMS."""

import copy

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.passes.nms_limits import bound_nms_by_slices

from harness import check_model, make_model

rng = np.random.default_rng(3)
UNBOUNDED = np.array([2**63 - 1], np.int64)


def _inputs(batches: int, classes: int, count: int):
    """Boxes in a few overlapping clusters, so NMS keeps many but not all of them."""
    centre = rng.random((batches, count, 2)) * 12
    size = rng.uniform(1.0, 3.0, (batches, count, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], -1).astype(np.float32)
    scores = rng.permutation(batches * classes * count).reshape(batches, classes, count)
    return boxes, (scores / scores.size).astype(np.float32)


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _selection_rows(prefix: str, limit: str = "unbounded") -> list[onnx.NodeProto]:
    """NMS -> the box column (Gather along axis 1) -> Squeeze, as torchvision exports."""
    return [
        _const(f"{prefix}column", np.array([2], np.int64)),
        _const(f"{prefix}axis", np.array([1], np.int64)),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", limit, "iou"],
                         [f"{prefix}selected"]),
        helper.make_node("Gather", [f"{prefix}selected", f"{prefix}column"],
                         [f"{prefix}picked"], axis=1),
        helper.make_node("Squeeze", [f"{prefix}picked", f"{prefix}axis"], [f"{prefix}keep"]),
    ]


def _leading_slice(source: str, rows: int, output: str = "y", start: int = 0):
    return [_const("starts", np.array([start], np.int64)),
            _const("ends", np.array([rows], np.int64)),
            _const("axes", np.array([0], np.int64)),
            helper.make_node("Slice", [source, "starts", "ends", "axes"], [output])]


def _limits(model: onnx.ModelProto) -> list[int]:
    """The max_output_boxes_per_class of every NMS of the model, after the rewrite."""
    found = []

    def visit(graph, scopes):
        scope = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        scope.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                      for n in graph.node if n.op_type == "Constant"})
        scopes = [scope, *scopes]
        for node in graph.node:
            if node.op_type == "NonMaxSuppression":
                found.append(int(next(s[node.input[2]] for s in scopes if node.input[2] in s
                                      ).reshape(-1)[0]))
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g, scopes)

    rewritten = copy.deepcopy(model)
    bound_nms_by_slices(rewritten)
    visit(rewritten.graph, [])
    return found


INITS = {"unbounded": UNBOUNDED, "iou": np.array([0.3], np.float32)}


@pytest.mark.parametrize("batches, classes, rows", [(1, 1, 6), (2, 3, 9), (1, 2, 400)])
def test_selection_cut_to_its_first_rows(batches, classes, rows):
    """Across batches and classes the first K rows of the limited NMS are the first K of
    the unlimited one (onnxruntime runs the original)."""
    boxes, scores = _inputs(batches, classes, 40)
    nodes = _selection_rows("") + _leading_slice("keep", rows)
    feeds = {"boxes": boxes, "scores": scores}
    model = make_model(nodes, feeds, ["y"], INITS, opset=13)
    assert _limits(model) == [min(rows, 2**63 - 1)]
    check_model(model, feeds)


@pytest.mark.parametrize("empty", [False, True])
def test_selection_inside_an_if_branch(empty):
    """torchvision's batched_nms: If(no boxes, an empty constant, NMS ...)[:K]."""
    boxes, scores = _inputs(1, 1, 50)
    then_branch = helper.make_graph(
        [_const("nothing", np.zeros([0], np.int64))], "then", [],
        [helper.make_tensor_value_info("nothing", onnx.TensorProto.INT64, [0])])
    else_branch = helper.make_graph(
        _selection_rows("e_"), "else", [],
        [helper.make_tensor_value_info("e_keep", onnx.TensorProto.INT64, ["n"])])
    nodes = [helper.make_node("If", ["empty"], ["keep"], then_branch=then_branch,
                              else_branch=else_branch)] + _leading_slice("keep", 5)
    feeds = {"boxes": boxes, "scores": scores, "empty": np.array(empty)}
    model = make_model(nodes, feeds, ["y"], INITS, opset=13)
    assert _limits(model) == [5]
    check_model(model, feeds)


def _unchanged(nodes, outputs=("y",)) -> list[int]:
    boxes, scores = _inputs(1, 1, 10)
    model = make_model(nodes, {"boxes": boxes, "scores": scores}, list(outputs), INITS,
                       opset=13)
    return _limits(model)


def test_a_slice_not_from_the_first_row_keeps_the_limit():
    assert _unchanged(_selection_rows("") + _leading_slice("keep", 5, start=1)) == [2**63 - 1]


def test_a_selection_read_elsewhere_keeps_the_limit():
    nodes = _selection_rows("") + _leading_slice("keep", 5)
    assert _unchanged(nodes, ("y", "keep")) == [2**63 - 1]


def test_rows_reordered_on_the_way_keep_the_limit():
    """A Gather along axis 0 picks rows in any order: the first K rows after it need not be
    among the first K selections."""
    nodes = _selection_rows("") + [
        _const("order", np.array([3, 0, 1], np.int64)),
        helper.make_node("Gather", ["keep", "order"], ["shuffled"], axis=0),
    ] + _leading_slice("shuffled", 2)
    assert _unchanged(nodes) == [2**63 - 1]
