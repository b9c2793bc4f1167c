"""Channel shuffles as one Gather.

ShuffleNet-style models interleave channel groups with Reshape -> Transpose -> Reshape:
(N, C, H, W) -> (N, g, C/g, H, W) -> swap the two group axes -> (N, C, H, W). Kept
channel-last that chain needs a real transpose of the regrouped tensor. Its net effect,
though, only reorders the channel axis, so it equals

    Gather(x, indices, axis=1)

with constant indices, which runs channel-last as a single GATHER (no TRANSPOSE, no
reshapes). The rewrite is decided numerically: the chain is applied to an index tensor of x's
shape, and it is replaced only when the result moves elements along one axis alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

MAX_ELEMENTS = 1 << 24  # index tensors above this size are not evaluated


def shuffles_to_gather(model: onnx.ModelProto) -> bool:
    """Rewrite every single-axis-permuting Reshape -> Transpose -> Reshape of the main graph;
    True if anything changed."""
    graph = model.graph
    infos = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    producers = {o: n for n in graph.node for o in n.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    replaced: dict[int, onnx.NodeProto] = {}  # id(final Reshape) -> Gather
    dropped: set[int] = set()
    for node in graph.node:
        chain = _chain_ending_at(node, producers, uses)
        if chain is None:
            continue
        first, transpose, last = chain
        found = _single_axis_permutation(
            _shape(infos.get(first.input[0])), _shape(infos.get(first.output[0])),
            _perm(transpose),
        )
        if found is None or _shape(infos.get(last.output[0])) != _shape(infos.get(first.input[0])):
            continue
        axis, indices = found
        name = f"{last.name or last.output[0]}_shuffle_indices"
        graph.initializer.append(numpy_helper.from_array(indices.astype(np.int64), name))
        replaced[id(last)] = helper.make_node(
            "Gather", [first.input[0], name], [last.output[0]], name=last.name, axis=axis,
        )
        dropped.update((id(first), id(transpose)))
    if not replaced:
        return False
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return True


def _chain_ending_at(node, producers, uses):
    """(Reshape, Transpose, Reshape) ending at `node`, intermediates used once, or None."""
    if node.op_type != "Reshape":
        return None
    transpose = producers.get(node.input[0])
    if transpose is None or transpose.op_type != "Transpose" or uses.get(transpose.output[0]) != 1:
        return None
    first = producers.get(transpose.input[0])
    if first is None or first.op_type != "Reshape" or uses.get(first.output[0]) != 1:
        return None
    return first, transpose, node


def _shape(info) -> tuple[int, ...] | None:
    if info is None or not info.type.tensor_type.HasField("shape"):
        return None
    dims = info.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _perm(transpose: onnx.NodeProto) -> list[int] | None:
    for attr in transpose.attribute:
        if attr.name == "perm":
            return list(attr.ints)
    return None


def _single_axis_permutation(shape, split_shape, perm):
    """(axis, indices) when reshaping an index tensor of `shape` to `split_shape`,
    transposing by `perm` and reshaping back only reorders one axis; else None."""
    if shape is None or split_shape is None or perm is None or len(perm) != len(split_shape):
        return None
    size = int(np.prod(shape))
    if size > MAX_ELEMENTS or size != int(np.prod(split_shape)) or not shape:
        return None
    moved = np.arange(size).reshape(split_shape).transpose(perm).reshape(shape)
    source = np.stack(np.unravel_index(moved, shape))  # source coordinate of every element
    target = np.indices(shape)
    changed = [a for a in range(len(shape)) if not np.array_equal(source[a], target[a])]
    if len(changed) != 1:
        return None
    axis = changed[0]
    indices = np.moveaxis(source[axis], axis, 0).reshape(shape[axis], -1)
    if not (indices == indices[:, :1]).all():
        return None
    return axis, indices[:, 0]
