"""GroupNorm of one group, written back as reductions over the tensor itself.

PyTorch exports GroupNorm as Reshape (N, C, ...) -> (N, G, -1), InstanceNormalization,
Reshape back. With one group (PoolFormer's norm, ConvNeXt-style blocks) the statistics run
over every non-batch element, in any order: the Reshape that flattens channel-first order
forces the layout plan to transpose the channel-last tensor before it and after it (two
TRANSPOSE per norm, 48 in PoolFormer-S12). Written as ReduceMean over axes 1.. of the
original tensor the norm runs in whatever layout that tensor has:

    mean = ReduceMean(x); d = x - mean; inv = 1 / Sqrt(ReduceMean(d * d) + eps)
    y = d * inv * scale + bias          (scale and bias: the instance norm's one value each)

The reductions keep the batch axis, the rest are elementwise; onnxruntime runs the result.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset


def rewrite_one_group_norms(model: onnx.ModelProto) -> int:
    """Rewrite every Reshape -> InstanceNormalization -> Reshape of one group in the main
    graph; returns how many."""
    graph = model.graph
    index = GraphIndex(graph)
    opset = default_opset(model)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # position of the last Reshape -> nodes
    dropped: set[int] = set()
    for position, node in enumerate(index.nodes):
        match = _match(node, index)
        if match is None:
            continue
        last, x, scale, bias = match
        dropped.update(index.producer[name] for name in (node.input[0], node.output[0]))
        dropped.add(position)
        replaced[index.producer[last.output[0]]] = _expanded(
            index, node, x, last.output[0], scale, bias, opset)
    if replaced:
        index.replace_nodes(replaced, dropped)
    return len(replaced)


def _match(node: onnx.NodeProto, index: GraphIndex):
    """(last Reshape, x, scale, bias) when `node` is the InstanceNormalization
    of a one-group GroupNorm; else None."""
    if node.op_type != "InstanceNormalization" or node.domain not in ("", "ai.onnx"):
        return None
    first = index.producer_node(node.input[0])
    last = index.only_user(node.output[0])
    if first is None or last is None or first.op_type != "Reshape" or last.op_type != "Reshape":
        return None
    if not index.single_use(node.input[0]) or node.input[0] in index.outputs:
        return None
    x = first.input[0]
    shape, grouped = index.static_shape(x), index.static_shape(node.input[0])
    if shape is None or len(shape) < 3 or grouped is None or len(grouped) != 3:
        return None
    if grouped[:2] != [shape[0], 1] or index.static_shape(last.output[0]) != shape:
        return None
    scale, bias = (index.value(name) for name in node.input[1:3])
    if scale is None or bias is None or scale.size != 1 or bias.size != 1:
        return None
    if node.output[0] in index.outputs:
        return None
    return last, x, scale.reshape(()), bias.reshape(())


def _expanded(index: GraphIndex, norm: onnx.NodeProto, x: str, out: str, scale: np.ndarray,
              bias: np.ndarray, opset: int) -> list[onnx.NodeProto]:
    """The nodes computing the norm of `x` into `out` (see the module's docstring)."""
    base = norm.name or norm.output[0]
    axes = list(range(1, len(index.static_shape(x))))
    epsilon = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
    nodes: list[onnx.NodeProto] = []

    def emit(op: str, inputs: list[str], suffix: str, output: str | None = None,
             **attrs) -> str:
        output = output or index.unique(f"{base}/{suffix}")
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def mean(value: str, suffix: str) -> str:
        if opset >= 18:
            axes_name = index.add_constant(f"{base}/axes", np.array(axes, np.int64))
            return emit("ReduceMean", [value, axes_name], suffix, keepdims=1)
        return emit("ReduceMean", [value], suffix, axes=axes, keepdims=1)

    centered = emit("Sub", [x, mean(x, "mean")], "centered")
    variance = mean(emit("Mul", [centered, centered], "squared"), "variance")
    shifted = emit("Add", [variance, index.add_constant(f"{base}/epsilon",
                                                       np.array(epsilon, scale.dtype))],
                   "shifted")
    steps = [("Mul", emit("Reciprocal", [emit("Sqrt", [shifted], "deviation")], "inv_std"),
              "normalized")]
    if scale != 1:
        steps.append(("Mul", index.add_constant(f"{base}/scale", scale), "scaled"))
    if bias != 0:
        steps.append(("Add", index.add_constant(f"{base}/bias", bias), "biased"))
    value = centered
    for k, (op, operand, suffix) in enumerate(steps):
        value = emit(op, [value, operand], suffix, out if k == len(steps) - 1 else None)
    return nodes
