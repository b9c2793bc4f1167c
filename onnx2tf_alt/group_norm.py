"""GroupNorm as torch exports it below opset 18, rewritten so that it runs channel-last.

torch writes `GroupNorm(G, C)` on x (N, C, *spatial) as

    Reshape(x, [0, G, -1]) -> InstanceNormalization(scale 1, bias 0) -> Reshape(Shape(x))

followed by the affine Mul / Add. The (N, G, C/G * spatial) middle value mixes the channel
axis with the spatial ones, so a channel-last x needed a TRANSPOSE before the Reshape, one
around the InstanceNormalization and one after (FCOS's heads: 160 of its 161 TRANSPOSE).

The same statistics are taken here over (N, G, C/G, spatial flattened): in channel-last
memory that is a reshape only (N, spatial, G, C/G), so the layout plan keeps every value
channel-last. Standard ops (ReduceMean, Sub, Mul, Add, Sqrt, Div) compute it, so onnxruntime
still runs the prepared model for the accuracy check; the values are InstanceNormalization's
own formula, (x - mean) / sqrt(var + epsilon), over the same elements.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def unfold_group_norms(model: onnx.ModelProto) -> int:
    """Rewrite each torch-exported GroupNorm of the main graph in place; returns how many."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    consts = {i.name: i for i in graph.initializer}
    consts.update({n.output[0]: next(a.t for a in n.attribute if a.name == "value")
                   for n in graph.node if n.op_type == "Constant"
                   and any(a.name == "value" for a in n.attribute)})
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    outputs = {o.name for o in graph.output}
    shapes = _shapes(graph)

    def value(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(consts[name]) if name in consts else None

    def only_use(name: str, node) -> bool:
        return name not in outputs and [id(n) for n in consumers.get(name, [])] == [id(node)]

    count = 0
    for norm in [n for n in graph.node if n.op_type == "InstanceNormalization"]:
        first, second = producer.get(norm.input[0]), (consumers.get(norm.output[0]) or [None])[0]
        if first is None or first.op_type != "Reshape" or second is None or (
                second.op_type != "Reshape" or second.input[0] != norm.output[0]):
            continue
        x, shape = first.input[0], value(first.input[1])
        groups = None if shape is None or shape.size != 3 else int(shape[1])
        scale, bias = value(norm.input[1]), value(norm.input[2])
        dims = shapes.get(x)
        size = dims[1] if dims and len(dims) >= 3 and isinstance(dims[1], int) else None
        if (groups is None or groups <= 0 or size is None or size % groups or shape[2] != -1
                or scale is None or bias is None or not (scale == 1).all()
                or not (bias == 0).all() or not only_use(first.output[0], norm)
                or not only_use(norm.output[0], second)
                or not _restores(second.input[1], x, producer, value, dims)):
            continue
        epsilon = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
        tag = norm.name or norm.output[0]
        new, constants = _statistics(x, groups, size // groups, epsilon, f"{tag}_grouped",
                                     opset, tag)
        graph.initializer.extend(constants)
        second.input[0] = f"{tag}_grouped"  # (N, G, C/G, rest), not the old (N, G, rest)
        at = list(graph.node).index(first)  # after x's producer, before `second`
        for node in (first, norm):
            graph.node.remove(node)
        for k, node in enumerate(new):
            graph.node.insert(at + k, node)
        count += 1
    if count:
        for name in {n.name for n in graph.value_info} & _dropped_values(graph):
            _remove_value_info(graph, name)
    return count


def _statistics(x: str, groups: int, per_group: int, epsilon: float, out: str, opset: int,
                tag: str) -> tuple[list, list]:
    """Nodes computing `out` (N, G, C/G, rest) normalized per instance and group, and the
    initializers they read."""
    name = f"{tag}_group"

    def const(suffix: str, array) -> onnx.TensorProto:  # initializers: planned as constants
        return numpy_helper.from_array(np.asarray(array), f"{name}_{suffix}")

    def mean(source: str, target: str) -> onnx.NodeProto:
        if opset >= 18:
            return helper.make_node("ReduceMean", [source, f"{name}_axes"], [target],
                                    name=target, keepdims=1)
        return helper.make_node("ReduceMean", [source], [target], name=target, axes=[2, 3],
                                keepdims=1)

    constants = [const("shape", np.array([0, groups, per_group, -1], np.int64)),
                 const("eps", np.array(epsilon, np.float32))]
    if opset >= 18:
        constants.append(const("axes", np.array([2, 3], np.int64)))
    grouped, centred = f"{name}_x", f"{name}_centred"
    nodes = [
        helper.make_node("Reshape", [x, f"{name}_shape"], [grouped], name=grouped),
        mean(grouped, f"{name}_mean"),
        helper.make_node("Sub", [grouped, f"{name}_mean"], [centred], name=centred),
        helper.make_node("Mul", [centred, centred], [f"{name}_sq"], name=f"{name}_sq"),
        mean(f"{name}_sq", f"{name}_var"),
        helper.make_node("Add", [f"{name}_var", f"{name}_eps"], [f"{name}_vare"],
                         name=f"{name}_vare"),
        helper.make_node("Sqrt", [f"{name}_vare"], [f"{name}_std"], name=f"{name}_std"),
        helper.make_node("Div", [centred, f"{name}_std"], [out], name=out),
    ]
    return nodes, constants


def _restores(shape: str, x: str, producer: dict, value, dims: list) -> bool:
    """Whether `shape` is x's shape: Shape(x), or a constant equal to x's static shape (what
    constant folding leaves of Shape(x))."""
    node = producer.get(shape)
    if node is not None and node.op_type == "Shape":
        return node.input[0] == x and not any(a.name in ("start", "end")
                                               for a in node.attribute)
    known = value(shape)
    return known is not None and all(isinstance(d, int) for d in dims) and (
        known.tolist() == list(dims))


def _shapes(graph: onnx.GraphProto) -> dict[str, list]:
    """Dims (int, or None when unknown) of every value whose type is known."""
    shapes = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in info.type.tensor_type.shape.dim]
    return shapes


def _dropped_values(graph: onnx.GraphProto) -> set[str]:
    produced = {o for n in graph.node for o in n.output}
    return {v.name for v in graph.value_info} - produced


def _remove_value_info(graph: onnx.GraphProto, name: str) -> None:
    for i in reversed([i for i, v in enumerate(graph.value_info) if v.name == name]):
        del graph.value_info[i]
