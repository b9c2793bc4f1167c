"""A light, TensorFlow-free view of a prepared ONNX graph.

The layout plan and the builder both walk this view rather than the protobuf, so that
attributes are decoded once and shapes, dtypes and constants are looked up by value name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.weights import to_array

Shape = tuple  # of int | None (None: unknown or symbolic dimension)


@dataclass
class Node:
    name: str
    op_type: str
    domain: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict
    proto: onnx.NodeProto = field(repr=False, default=None)


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    shapes: dict[str, Shape | None]
    dtypes: dict[str, np.dtype]
    opsets: dict[str, int]
    symbols: dict[str, dict[int, str]] = field(default_factory=dict)

    def opset_of(self, domain: str) -> int:
        key = "" if domain in ("", "ai.onnx") else domain
        return self.opsets.get(key, 1)

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def is_const(self, name: str) -> bool:
        return name in self.constants


def decode_attribute(attr: onnx.AttributeProto):
    """Attribute value as a plain Python / numpy object (tensors become arrays)."""
    value = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == onnx.AttributeProto.STRING:
        return value.decode("utf-8")
    if attr.type == onnx.AttributeProto.STRINGS:
        return [v.decode("utf-8") for v in value]
    if attr.type == onnx.AttributeProto.TENSORS:
        return [numpy_helper.to_array(v) for v in value]
    if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    return value


def _shape_of(type_proto: onnx.TypeProto) -> tuple[Shape | None, dict[int, str]]:
    if not type_proto.HasField("tensor_type"):
        return None, {}
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return None, {}
    dims, symbols = [], {}
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(None)
            if dim.HasField("dim_param"):
                symbols[i] = dim.dim_param
    return tuple(dims), symbols


def _dtype_of(type_proto: onnx.TypeProto) -> np.dtype | None:
    if not type_proto.HasField("tensor_type"):
        return None
    elem = type_proto.tensor_type.elem_type
    if elem == onnx.TensorProto.UNDEFINED:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def graph_from_model(model: onnx.ModelProto) -> Graph:
    """Build the view of an already prepared (inferred, folded, named) model."""
    g = model.graph
    constants = {init.name: to_array(init) for init in g.initializer}
    shapes: dict[str, Shape | None] = {}
    dtypes: dict[str, np.dtype] = {}
    symbols: dict[str, dict[int, str]] = {}
    for info in list(g.input) + list(g.value_info) + list(g.output):
        shape, syms = _shape_of(info.type)
        if shape is not None or info.name not in shapes:
            shapes[info.name] = shape
        dtype = _dtype_of(info.type)
        if dtype is not None:
            dtypes[info.name] = dtype
        if syms:
            symbols[info.name] = syms
    for name, array in constants.items():
        shapes[name] = tuple(array.shape)
        dtypes[name] = array.dtype
    nodes = [
        Node(
            name=n.name,
            op_type=n.op_type,
            domain=n.domain,
            inputs=list(n.input),
            outputs=list(n.output),
            attrs={a.name: decode_attribute(a) for a in n.attribute},
            proto=n,
        )
        for n in g.node
    ]
    opsets = {op.domain if op.domain != "ai.onnx" else "": op.version for op in model.opset_import}
    inputs = [i.name for i in g.input if i.name not in constants]
    return Graph(
        nodes=nodes,
        inputs=inputs,
        outputs=[o.name for o in g.output],
        constants=constants,
        shapes=shapes,
        dtypes=dtypes,
        opsets=opsets,
        symbols=symbols,
    )


def is_read(graph: Graph, name: str) -> bool:
    """Whether a graph output or any node (also inside control-flow bodies) reads name."""
    def reads(nodes) -> bool:
        for node in nodes:
            if name in node.input:
                return True
            if any(a.type == a.GRAPH and reads(a.g.node) for a in node.attribute):
                return True
        return False

    return name in graph.outputs or reads(n.proto for n in graph.nodes if n.proto is not None)
