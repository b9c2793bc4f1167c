"""NonMaxSuppression whose selection is cut to its first K rows selects at most K per class.

torchvision's detectors keep `keep[:K]` of a batched NMS (RPN proposals, the final
detections), and export the NMS with max_output_boxes_per_class = INT64_MAX: the NMS then
runs its greedy selection over every box (13,500 RPN anchors in Faster R-CNN) to have most
of it thrown away. NMS lists its selections by batch, then class, then selection order,
and a greedy selection limited to K per class selects exactly the first K of its unlimited
one. So the first K rows of the whole list are the same with the limit: the limit of a
NonMaxSuppression whose selected_indices reach only a Slice [0:K] along axis 0, through
ops that keep its rows (Gather along another axis, Squeeze/Unsqueeze off axis 0, Cast,
Identity) and the branches of an If, becomes min(limit, K).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset

ROW_KEEPING = {"Cast", "Identity"}


def bound_nms_by_slices(model: onnx.ModelProto) -> int:
    """Lower the limits of the NonMaxSuppression nodes (main graph and subgraphs) whose
    rows only a leading Slice reads; returns how many were lowered."""
    return _bound_in(model.graph, [], default_opset(model, 0))


def _bound_in(graph: onnx.GraphProto, scopes: list[GraphIndex], opset: int) -> int:
    """`scopes`: the indexes of the enclosing graphs, innermost first (for constants)."""
    index = GraphIndex(graph)
    scopes = [index, *scopes]
    uses = _uses(graph)
    lowered = 0
    for node in list(graph.node):
        rows = _leading_rows(node, scopes, opset) if node.op_type == "Slice" else None
        if rows is not None:
            lowered += _bound_source(index, node.input[0], rows, uses, scopes, opset)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                lowered += _bound_in(sub, scopes, opset)
    return lowered


def _bound_source(index: GraphIndex, name: str, rows: int, uses, scopes, opset: int) -> int:
    """Follow `name` back through row-keeping ops to NonMaxSuppression nodes (into If
    branches) and limit them to `rows`; every value on the way has this one reader."""
    while uses.get(name, 0) == 1 and (node := index.producer_node(name)) is not None:
        if node.op_type == "NonMaxSuppression" and name == node.output[0]:
            return _limit(index.graph, node, rows, scopes)
        if node.op_type == "If":
            return _bound_branches(node, list(node.output).index(name), rows, scopes, opset)
        if not _keeps_rows(node, scopes, opset):
            return 0
        name = node.input[0]
    return 0


def _bound_branches(node, position: int, rows: int, scopes, opset: int) -> int:
    lowered = 0
    for attr in node.attribute:
        if attr.type != onnx.AttributeProto.GRAPH:
            continue
        branch = GraphIndex(attr.g)
        uses = _uses(attr.g)  # its output counts once: the If's reader
        lowered += _bound_source(branch, attr.g.output[position].name, rows, uses,
                                 [branch, *scopes], opset)
    return lowered


def _keeps_rows(node, scopes, opset: int) -> bool:
    """Whether `node` maps row i of its first input to row i of its output, for any row
    count."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ROW_KEEPING:
        return True
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    # positive axes only: a negative one may count back to axis 0
    if node.op_type == "Gather":
        return attrs.get("axis", 0) > 0
    if node.op_type in ("Squeeze", "Unsqueeze"):
        axes = attrs.get("axes") if opset < 13 else (
            _constant(node.input[1], scopes) if len(node.input) > 1 and node.input[1] else None)
        return axes is not None and min(np.asarray(axes).reshape(-1).tolist(), default=0) > 0
    return False


def _leading_rows(node, scopes, opset: int) -> int | None:
    """K when `node` is a Slice taking rows [0, K) of axis 0 (step 1) and nothing else."""
    if opset < 10 or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    starts, ends = (_constant(node.input[i], scopes) for i in (1, 2))
    axes = _constant(node.input[3], scopes) if len(node.input) > 3 and node.input[3] else (
        np.arange(0 if starts is None else starts.size))
    steps = _constant(node.input[4], scopes) if len(node.input) > 4 and node.input[4] else (
        None if starts is None else np.ones(starts.size, np.int64))
    if any(v is None for v in (starts, ends, axes, steps)):
        return None
    starts, ends, axes, steps = (np.asarray(v).reshape(-1).tolist()
                                 for v in (starts, ends, axes, steps))
    if axes != [0] or starts != [0] or steps != [1] or ends[0] < 0:
        return None  # a negative end counts from the run-time length
    return int(ends[0])


def _limit(graph, node, rows: int, scopes) -> int:
    """Give `node` the limit min(its limit, rows); 0 when its limit is computed at run
    time or already no larger."""
    current = _constant(node.input[2], scopes) if len(node.input) > 2 and node.input[2] else (
        np.zeros(1, np.int64))  # absent: 0, select nothing
    if current is None or int(np.asarray(current).reshape(-1)[0]) <= rows:
        return 0
    name = f"{node.name or node.output[0]}_rows_read"
    graph.node.insert(0, helper.make_node(
        "Constant", [], [name], name=f"{name}_constant",
        value=numpy_helper.from_array(np.array([rows], np.int64))))
    inputs = list(node.input) + [""] * (3 - len(node.input))
    inputs[2] = name
    del node.input[:]
    node.input.extend(inputs)
    return 1


def _constant(name: str, scopes: list[GraphIndex]) -> np.ndarray | None:
    """The value of constant `name` in the innermost scope that has one, or None."""
    return next((scope.value(name) for scope in scopes if name in scope.constants), None)


def _uses(graph: onnx.GraphProto) -> dict[str, int]:
    """Per value: its readers in `graph` and the subgraphs of its nodes, plus one if it is
    a graph output."""
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                for name in _read_inside(sub):
                    uses[name] = uses.get(name, 0) + 1
    for output in graph.output:
        uses[output.name] = uses.get(output.name, 0) + 1
    return uses


def _read_inside(graph: onnx.GraphProto) -> set[str]:
    names = {i for n in graph.node for i in n.input}
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                names |= _read_inside(sub)
    return names
