"""float64 and float16 models computed in float32, for TFLite.

TFLite has float64 and float16 tensor types but almost no kernels for them: such a graph
converts only with Select TF ops (the Flex delegate). For the .tflite files the model is
therefore rewritten to compute in float32: float64/float16 constants, initializers, Cast
targets and dtype attributes become float32, such model inputs are cast to float32 on entry
and outputs cast back on exit, so the file's signature keeps the ONNX dtypes. The saved_model
and Keras files keep the ONNX dtypes throughout. (The `_float16.tflite` file is another
thing: float32 compute with float16-stored weights.)
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.weights import to_array

FLOAT = onnx.TensorProto.FLOAT
DEMOTED = {onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
DTYPE_ATTRS = ("to", "dtype", "output_dtype")
BIT_LEVEL_OPS = {"BitCast"}  # their results depend on the bits: never demoted


def needs_float32_compute(model: onnx.ModelProto) -> bool:
    """True when the main graph holds float64 or float16 tensors and no op reads their bits."""
    graph = model.graph
    if any(node.op_type in BIT_LEVEL_OPS for node in graph.node):
        return False
    infos = [*graph.input, *graph.output, *graph.value_info]
    return any(v.type.tensor_type.elem_type in DEMOTED for v in infos) or any(
        t.data_type in DEMOTED for t in graph.initializer
    )


def compute_in_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float32 with its float64/float16 inputs and outputs
    kept at its boundary (shape information is dropped: run shape inference on the result)."""
    model = copy.deepcopy(model)
    graph = model.graph
    entry = [_retype_boundary(v, "_as_float32") for v in graph.input]
    exits = [_retype_boundary(v, "_float32") for v in graph.output]
    _demote_graph(graph, keep_boundary=True)
    renames = {old: new for old, new in entry if new}
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
    out_renames = {old: new for old, new in exits if new}
    for node in graph.node:
        node.output[:] = [out_renames.get(name, name) for name in node.output]
        node.input[:] = [out_renames.get(name, name) for name in node.input]
    casts_in = [helper.make_node("Cast", [old], [new], to=FLOAT, name=new) for old, new in entry if new]
    types = {v.name: v.type.tensor_type.elem_type for v in graph.output}
    casts_out = [
        helper.make_node("Cast", [new], [old], to=types[old], name=f"{old}_restored")
        for old, new in exits if new
    ]
    nodes = [*casts_in, *graph.node, *casts_out]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _retype_boundary(info: onnx.ValueInfoProto, suffix: str) -> tuple[str, str | None]:
    """(name, the float32 name inside the graph) for a float64/float16 input or output."""
    if info.type.tensor_type.elem_type not in DEMOTED:
        return info.name, None
    return info.name, info.name + suffix


def _demote_graph(graph: onnx.GraphProto, keep_boundary: bool) -> None:
    """float64/float16 -> float32 in initializers, constants, dtype attributes and value
    infos (recursively in subgraphs); the main graph's inputs and outputs keep their dtype."""
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type in DEMOTED:
            graph.initializer[i].CopyFrom(_demoted(tensor))
    infos = [*graph.value_info] if keep_boundary else [*graph.input, *graph.output, *graph.value_info]
    for info in infos:
        if info.type.tensor_type.elem_type in DEMOTED:
            info.type.tensor_type.elem_type = FLOAT
    if keep_boundary:
        del graph.value_info[:]
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in DTYPE_ATTRS and attr.type == attr.INT and attr.i in DEMOTED:
                attr.i = FLOAT
            elif attr.type == attr.TENSOR and attr.t.data_type in DEMOTED:
                attr.t.CopyFrom(_demoted(attr.t))
            elif attr.type == attr.GRAPH:
                _demote_graph(attr.g, keep_boundary=False)
            elif attr.type == attr.GRAPHS:
                for sub in attr.graphs:
                    _demote_graph(sub, keep_boundary=False)


def _demoted(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(to_array(tensor).astype(np.float32), tensor.name)
