"""Shapes learned while building, for values ONNX shape inference could not follow.

Inside Loop / Scan / If bodies (and after them) ONNX inference often loses a value: a
loop-carried value whose rank changes, an exporter's stale declared shape, an op it does not
know. The plan then has no layout for what follows and handlers see no rank. While building,
TF knows the shape of every tensor it made; the builder records it (`learn`), and a node
that reads such a value has its outputs inferred again, by ONNX on that one node with the
shapes now known (`infer_node`). Values ONNX did type are never changed, so models with
known shapes build exactly as before.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper, shape_inference

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm

IR_VERSION = 10


def learn(graph: Graph, name: str, tf_shape, dtype: np.dtype, perm: Perm) -> bool:
    """Record TF's static shape of `name` where ONNX left it without one or with another
    rank; returns whether it did."""
    known = graph.shapes.get(name)
    if tf_shape.rank is None or (known is not None and len(known) == tf_shape.rank):
        return False
    graph.shapes[name] = P.logical_shape(tuple(tf_shape.as_list()), perm)
    if graph.dtypes.get(name) is None:
        graph.dtypes[name] = np.dtype(dtype)
    return True


def infer_node(node: Node, graph: Graph, constant_value) -> dict[str, tuple]:
    """{output name: (shape, dtype)} from ONNX inference of `node` alone, on the shapes and
    dtypes `graph` now holds and the constants `constant_value(name)` gives; outputs it
    cannot infer are left out."""
    if node.proto is None:
        return {}
    inputs, initializers = [], []
    for name in dict.fromkeys(i for i in node.inputs if i):
        const = constant_value(name)
        if const is not None:
            initializers.append(numpy_helper.from_array(np.asarray(const), name))
            continue
        dtype = graph.dtypes.get(name)
        if dtype is None:
            return {}
        shape = graph.shapes.get(name)
        inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            None if shape is None else list(shape)))
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.outputs if o]
    one = helper.make_graph([node.proto], "node", inputs, outputs, initializers)
    model = helper.make_model(one, opset_imports=[helper.make_opsetid(d, v)
                                                  for d, v in graph.opsets.items()])
    model.ir_version = IR_VERSION
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - outer-scope names, unknown ops: nothing learned
        return {}
    found = {}
    for info in inferred.graph.output:
        tensor = info.type.tensor_type
        if not tensor.HasField("shape") or not tensor.elem_type:
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        found[info.name] = (dims, helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    return found
