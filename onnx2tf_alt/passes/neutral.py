"""Arithmetic that changes nothing, removed: x * 1, x / 1, x + 0, x - 0.

Exporters write these where a module's parameter holds its initial value: PyTorch's
GroupNorm becomes an InstanceNormalization of scale 1 and bias 0 followed by the affine
Mul and Add, whose weights start as ones and zeros (PoolFormer, random or lightly trained:
48 full-size MUL and ADD ops). A node goes only where its constant operand is exactly the
neutral element everywhere and broadcasting it leaves the other operand's shape and type as
they are, so its output equals that operand bit for bit (x + 0 turns -0.0 into +0.0, which
no later op tells apart from -0.0 except a division by it).
"""

from __future__ import annotations

import onnx

from onnx2tf_alt.ir.index import GraphIndex

NEUTRAL = {"Mul": 1, "Div": 1, "Add": 0, "Sub": 0}
COMMUTATIVE = {"Mul", "Add"}
MAX_ELEMENTS = 1 << 16  # larger constants are weights, never all neutral in practice


def drop_neutral_arithmetic(model: onnx.ModelProto, kept: set[str] = frozenset()) -> int:
    """Remove the main graph's neutral Mul / Div / Add / Sub nodes, their readers reading
    the other operand instead; returns how many went. Outputs of the graph and the names in
    `kept` (read inside control-flow bodies) stay."""
    graph = model.graph
    index = GraphIndex(graph)
    source: dict[str, str] = {}  # dropped output -> what its readers read instead
    for node in index.nodes:
        operand = _neutral_operand(node, index)
        if operand is not None and node.output[0] not in index.outputs | kept:
            source[node.output[0]] = source.get(operand, operand)
    if not source:
        return 0
    kept_nodes = [n for n in graph.node if not (n.output and n.output[0] in source)]
    for node in kept_nodes:
        for k, name in enumerate(node.input):
            if name in source:
                node.input[k] = source[name]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    return len(source)


def _neutral_operand(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """The operand a neutral node passes through unchanged; None if it is not one."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in NEUTRAL:
        return None
    if len(node.input) != 2 or len(node.output) != 1:
        return None
    positions = (1, 0) if node.op_type in COMMUTATIVE else (1,)
    for k in positions:
        constant, data = node.input[k], node.input[1 - k]
        light = index.constants.get(constant)
        if light is None or light.size > MAX_ELEMENTS:
            continue
        shape, out_shape = index.static_shape(data), index.static_shape(node.output[0])
        if shape is None or shape != out_shape or index.info(data) is None:
            continue
        if (index.info(data).type.tensor_type.elem_type
                != index.info(node.output[0]).type.tensor_type.elem_type):
            continue
        value = index.value(constant)
        if value.size and (value == NEUTRAL[node.op_type]).all():
            return data
    return None
