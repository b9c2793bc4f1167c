"""Flatten-before-dense without a transpose.

CNN classifiers without global pooling (AlexNet, VGG, ZFNet, LeNet) flatten a channel-first
feature map into a fully connected layer. Kept channel-last, that flatten would need a
transpose back to C-H-W order. Instead, this pass flattens in H-W-C order and permutes the
rows of the dense layer's constant weights to match, which computes exactly the same thing:

    Flatten(x) @ B  ==  Flatten(Transpose(x, (0, 2, 3, 1))) @ B[perm]

The inserted Transpose is free in the layout plan (x is already channel-last), so the TFLite
file keeps no TRANSPOSE.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex
from onnx2tf_alt.ir.weights import add_spilled, to_array

# Producers whose output the plan keeps channel-last, and ops that pass that layout along.
CHANNEL_LAST_PRODUCERS = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "BatchNormalization",
    "InstanceNormalization", "GroupNormalization", "LRN", "Resize", "Upsample",
    "DepthToSpace", "SpaceToDepth",
}
LAYOUT_KEEPING = {
    "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu",
    "Selu", "Celu", "Mish", "Softplus", "Dropout", "Identity", "Add", "Sub", "Mul", "Div",
}


def _comes_channel_last(name: str, index: GraphIndex, depth: int = 6) -> bool:
    node = index.producer_node(name)
    if node is None or depth == 0:
        return False
    if node.op_type in CHANNEL_LAST_PRODUCERS:
        return True
    return node.op_type in LAYOUT_KEEPING and _comes_channel_last(
        node.input[0], index, depth - 1
    )


def _dense_consumers(name: str, index: GraphIndex):
    """[(node, B initializer name, rows axis)] when every consumer is a dense layer."""
    inits = index.initializers
    found = []
    for node in index.consumer_nodes(name):
        if node.op_type == "MatMul" and node.input[0] == name:
            axis = 0
        elif node.op_type == "Gemm" and node.input[0] == name:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("transA", 0):
                return None
            axis = 1 if attrs.get("transB", 0) else 0
        else:
            return None
        if node.input[1] not in inits or len(inits[node.input[1]].dims) != 2:
            return None
        found.append((node, node.input[1], axis))
    return found or None


def flatten_channel_last(model: onnx.ModelProto) -> bool:
    """Apply the rewrite wherever it holds; True if anything changed."""
    graph = model.graph
    index = GraphIndex(graph)
    inits = index.initializers  # read as arrays only where permuted
    changed = False
    rewritten = []
    for node in graph.node:
        rewritten.append(node)
        if node.op_type not in ("Flatten", "Reshape") or node.output[0] in index.outputs:
            continue
        x = node.input[0]
        shape, out_shape = index.shape(x), index.shape(node.output[0])
        if not shape or not out_shape or not 3 <= len(shape) <= 5 or len(out_shape) != 2:
            continue
        channels, spatial = shape[1], shape[2:]
        if channels is None or None in spatial or out_shape[1] != channels * int(np.prod(spatial)):
            continue
        if node.op_type == "Flatten" and any(
            a.name == "axis" and a.i != 1 for a in node.attribute
        ):
            continue
        dense = _dense_consumers(node.output[0], index)
        if dense is None or not _comes_channel_last(x, index):
            continue
        order = np.arange(channels * int(np.prod(spatial))).reshape(channels, -1).T.reshape(-1)
        for consumer, weights, axis in dense:
            permuted = np.take(to_array(inits[weights]), order, axis=axis)
            new_name = f"{weights}__rows_for_{node.output[0]}"
            # a 400 MB FC weight: into a temporary file, not the proto (add_spilled)
            inits[new_name] = add_spilled(graph.initializer, new_name, permuted,
                                          inits[weights].data_type)
            del permuted
            consumer.input[1] = new_name
        moved = f"{x}__channel_last_for_{node.name or node.output[0]}"
        perm = [0, *range(2, len(shape)), 1]
        transpose = helper.make_node("Transpose", [x], [moved], perm=perm, name=f"{moved}_t")
        rewritten.insert(len(rewritten) - 1, transpose)
        node.input[0] = moved
        changed = True
    if changed:
        nodes = [onnx.NodeProto() for _ in rewritten]
        for copy, original in zip(nodes, rewritten):
            copy.CopyFrom(original)
        del graph.node[:]
        graph.node.extend(nodes)
        used = {i for n in graph.node for i in n.input}
        for k in reversed(range(len(graph.initializer))):  # in place: no copy of the others
            if graph.initializer[k].name not in used:
                del graph.initializer[k]
    return changed
