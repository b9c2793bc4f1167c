"""Channel shuffles folded into the weights of an adjacent convolution.

ShuffleNet-style models interleave channel groups with Reshape -> Transpose -> Reshape:
(N, C, H, W) -> (N, g, C/g, H, W) -> swap the two group axes -> (N, C, H, W). Its net effect
only reorders the channel axis, y[:, j] = x[:, indices[j]], so where every reader of y is a
dense (group 1) Conv with constant weights, they read x instead, with their weights' input
channels reordered; where such a Conv produces x for the shuffle alone, its output channels
and bias are reordered instead. Either way the shuffle costs nothing at run time.

Shuffles that touch no such convolution (ShuffleNet v1 and v2: grouped convs, Concat and
Slice around them) are left as they are: the layout plan runs them channel-last as RESHAPE +
TRANSPOSE + RESHAPE, which XNNPACK runs about twice as fast as the equivalent GATHER it does
not delegate (shufflenet_v2_x0_5, 1 thread: 4.1 ms against 6.1 ms).

A chain is recognized numerically: it is applied to an index tensor of x's shape, and folded
only when the result moves elements along the channel axis alone.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx2tf_alt.ir.index import GraphIndex
from onnx2tf_alt.ir.weights import add_spilled, to_array

MAX_ELEMENTS = 1 << 24  # index tensors above this size are not evaluated


def absorb_channel_shuffles(model: onnx.ModelProto) -> bool:
    """Fold every channel shuffle of the main graph that feeds, or is fed by, a dense Conv
    with constant weights into those weights; True if anything changed."""
    graph = model.graph
    index = GraphIndex(graph)
    inits = index.initializers
    dropped: set[int] = set()
    replaced: set[str] = set()  # initializers the folded weights replace
    for node in list(graph.node):
        chain = _chain_ending_at(node, index)
        if chain is None or any(id(n) in dropped for n in chain):
            continue
        first, transpose, last = chain
        source, shuffled = first.input[0], last.output[0]
        found = _single_axis_permutation(
            index.static_shape(source), index.static_shape(first.output[0]), _perm(transpose),
        )
        if found is None or found[0] != 1:
            continue
        if index.static_shape(shuffled) != index.static_shape(source):
            continue
        indices = found[1]
        readers = index.consumer_nodes(shuffled)
        producer = index.producer_node(source)
        if shuffled not in index.outputs and readers and all(_dense_conv(n, inits) for n in readers):
            for reader in readers:  # conv(y, w) == conv(x, w[:, argsort(indices)])
                replaced.add(_reorder(graph, inits, reader, 1, np.argsort(indices), axis=1))
                reader.input[0] = source
        elif index.single_use(source) and producer is not None and _dense_conv(producer, inits):
            for i in range(1, len(producer.input)):  # weights (O, I, k...) and bias (O,)
                replaced.add(_reorder(graph, inits, producer, i, indices, axis=0))
            producer.output[0] = shuffled
        else:
            continue
        dropped.update(id(n) for n in chain)
    if not dropped:
        return False
    nodes = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_stale(graph, replaced)
    return True


def _drop_stale(graph, replaced: set[str]) -> None:
    """Remove the replaced initializers nothing reads any more, and the value infos of values
    nothing produces any more (the shuffles' intermediates)."""
    inputs = {i.name for i in graph.input}
    read = {name for n in graph.node for name in n.input} | inputs  # a graph input stays
    produced = {o for n in graph.node for o in n.output} | inputs
    produced |= {i.name for i in graph.initializer}
    inits = [i for i in graph.initializer if i.name in read or i.name not in replaced]
    infos = [v for v in graph.value_info if v.name in produced]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _dense_conv(node: onnx.NodeProto, inits) -> bool:
    """A Conv with group 1 whose weights (and bias) are initializers."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    return group == 1 and all(name in inits for name in node.input[1:] if name)


def _reorder(graph, inits, node: onnx.NodeProto, index: int, order, axis: int) -> str:
    """Replace input `index` of node by a new initializer, the old one taken in `order` along
    `axis`; return the old name."""
    name = node.input[index]
    if not name:
        return name
    new_name = f"{name}_{node.name or node.output[0]}_shuffled"
    array = np.take(to_array(inits[name]), order, axis=axis)
    inits[new_name] = add_spilled(graph.initializer, new_name, array)
    node.input[index] = new_name
    return name


def _chain_ending_at(node, index: GraphIndex):
    """(Reshape, Transpose, Reshape) ending at `node`, intermediates used once, or None."""
    if node.op_type != "Reshape":
        return None
    transpose = index.producer_node(node.input[0])
    if transpose is None or transpose.op_type != "Transpose" or not index.single_use(
            transpose.output[0]):
        return None
    first = index.producer_node(transpose.input[0])
    if first is None or first.op_type != "Reshape" or not index.single_use(first.output[0]):
        return None
    return first, transpose, node


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
