"""A node that could not be converted, as the errors report it (errors.NodeFailure)."""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.errors import NodeFailure
from onnx2tf_alt.ir.graph import Graph, Node


def failure_for(node: Node, graph: Graph, reason: str) -> NodeFailure:
    return NodeFailure(
        node_name=node.name,
        op_type=node.op_type,
        domain=node.domain,
        opset=graph.opset_of(node.domain),
        reason=reason,
        input_shapes=[graph.shapes.get(n) if n else None for n in node.inputs],
        input_dtypes=[str(graph.dtypes.get(n)) if n else None for n in node.inputs],
        attributes={k: _printable(v) for k, v in node.attrs.items()},
    )


def _printable(value):
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 16 else f"array{list(value.shape)}"
    if isinstance(value, (list, tuple, int, float, str)):
        return value
    return type(value).__name__
