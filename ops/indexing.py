"""Indexing ops: element and N-d gathers and scatters, TopK, CumSum, CumProd, NonZero, OneHot,
Trilu, Compress, Unique, ReverseSequence, TensorScatter.

Gathers and scatters work on a flattened view of the data: each index becomes a linear
offset into the data's leading axes (negative indices normalized first), so one GATHER, or
one SCATTER_ND / UNSORTED_SEGMENT_* builtin, does the work in TFLite. Offsets are int32 and
computed at conversion time when the indices are constant.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import Decision, custom_policy, derived, same_as_input
from onnx2tf_alt.translate.lazy import call, tf
from onnx2tf_alt.translate.registry import handler

from ._dtypes import from_ordered, ordered, widen


# --- index arithmetic (numpy while everything is known, tensors otherwise) -----------------
def _static(*values) -> bool:
    return all(isinstance(v, (int, np.integer, np.ndarray)) for v in values)


def _dims(ctx, i: int) -> list:
    """Physical dims of input i: ints where static, int32 scalar tensors where not."""
    shape = ctx.phys_shape(i)
    if all(d is not None for d in shape):
        return [int(d) for d in shape]
    runtime = tf.shape(ctx.x(i), out_type=tf.int32)
    return [runtime[p] if d is None else int(d) for p, d in enumerate(shape)]


def _vector(dims: list):
    return np.array(dims, np.int32) if _static(*dims) else tf.stack(dims)


def _strides(dims: list) -> list:
    """Row-major strides (ints, or tensors past an unknown dim)."""
    strides = [1]
    for d in reversed(dims[1:]):
        strides.insert(0, d * strides[0])
    return strides


def _indices(ctx, i: int, data_dims: list):
    """Index input i in its physical perm, as int32: numpy when it and the data dims are
    known at conversion time, else a tensor."""
    value = ctx.const(i, physical=True)
    if value is None:
        return tf.cast(ctx.x(i), tf.int32)
    value = value.astype(np.int32)
    return value if _static(*data_dims) else ctx.const_tensor(value)


def _normalize(index, size):
    """Negative indices counted from the end of an axis of `size` (broadcasting)."""
    if _static(index, size):
        return np.where(index < 0, index + size, index)
    size = np.asarray(size, np.int32) if _static(size) else size
    return tf.where(index < 0, index + size, index)


def _iota(size, axis: int, rank: int):
    """0..size-1 along `axis` of a rank-`rank` broadcastable shape."""
    shape = [1] * rank
    shape[axis] = -1
    if _static(size):
        return np.arange(size, dtype=np.int32).reshape(shape)
    return tf.reshape(tf.range(size), shape)


def _sum_offsets(ctx, terms: list):
    """Sum of offset terms as an int32 tensor; the numpy terms are folded here."""
    known = [t for t in terms if _static(t)]
    runtime = [t for t in terms if not _static(t)]
    if known:
        runtime.append(ctx.const_tensor(np.asarray(sum(known), np.int32)))
    total = runtime[0]
    for t in runtime[1:]:
        total = total + t
    return total


def _element_offsets(ctx, axis: int):
    """Linear offsets into input 0 of the element indices in input 1 along physical `axis`."""
    data_dims, index_dims = _dims(ctx, 0), _dims(ctx, 1)
    strides, rank = _strides(data_dims), len(data_dims)
    index = _normalize(_indices(ctx, 1, data_dims), data_dims[axis])
    terms = [index * strides[axis]]
    terms += [strides[d] * _iota(index_dims[d], d, rank) for d in range(rank) if d != axis]
    return _sum_offsets(ctx, terms)


def _nd_offsets(ctx, batch_dims: int):
    """Row offsets of the N-d indices in input 1 (coordinates on the last axis) into the
    leading axes of input 0, the first `batch_dims` of which data and indices share.
    Returns the offsets and the number of leading data axes they index."""
    data_dims, index_dims = _dims(ctx, 0), _dims(ctx, 1)
    depth = ctx.shape(1)[-1]
    if depth is None:
        raise NotImplementedError("the index depth (last dim of indices) must be static")
    lead = batch_dims + depth
    strides = _strides(data_dims[:lead])
    index = _normalize(_indices(ctx, 1, data_dims), _vector(data_dims[batch_dims:lead]))
    coords = _vector(strides[batch_dims:])
    if _static(index, coords):
        terms = [np.sum(index * coords, axis=-1)]
    else:
        terms = [tf.reduce_sum(index * coords, axis=-1)]
    rank = len(index_dims) - 1
    terms += [strides[d] * _iota(index_dims[d], d, rank) for d in range(batch_dims)]
    return _sum_offsets(ctx, terms), lead


def _rows(x, dims: list, lead: int):
    """x reshaped to (rows of its `lead` leading axes, *rest)."""
    rest = dims[lead:]
    if _static(*rest):
        return tf.reshape(x, [-1, *rest])
    return tf.reshape(x, tf.concat([[-1], tf.stack(rest)], axis=0))


def _shaped(x, dims: list):
    return tf.reshape(x, dims if _static(*dims) else tf.stack(dims))


_SEGMENT_COMBINE = {
    "mul": (call("math.unsorted_segment_prod"), call("multiply")),
    "max": (call("math.unsorted_segment_max"), call("maximum")),
    "min": (call("math.unsorted_segment_min"), call("minimum")),
}


def _scatter(data, offsets, updates, reduction: str):
    """Rows `offsets` (U,) of data (G, ...) combined with updates (U, ...).

    "none": the last update of a row wins, as onnxruntime applies them in order. Each row
    is gathered from [data; updates] (updates' rows follow data's), so that no index points
    into an empty `updates` (e.g. a feature level that receives no box in a detector).
    """
    data, updates = widen(data), widen(updates)
    rows = tf.shape(data, out_type=tf.int32)[0] if data.shape[0] is None else data.shape[0]
    if reduction == "add":
        return data + tf.scatter_nd(offsets[:, None], updates, tf.shape(data))
    if reduction == "none":
        order = tf.range(tf.shape(offsets)[0])
        last = tf.math.unsorted_segment_max(order, offsets, rows)
        source = tf.where(last >= 0, last + rows, tf.range(rows))
        return tf.gather(tf.concat([data, updates], axis=0), source)
    if reduction not in _SEGMENT_COMBINE:
        raise NotImplementedError(f"reduction '{reduction}' is not supported")
    segment, combine = _SEGMENT_COMBINE[reduction]
    return combine(data, segment(updates, offsets, rows))


# --- gathers and scatters ----------------------------------------------------------------------
@handler("GatherElements", since=11, layout=same_as_input(0))
def gather_elements(ctx):
    offsets = _element_offsets(ctx, ctx.axis(ctx.attr("axis", 0)))
    return tf.gather(tf.reshape(ctx.x(0), [-1]), offsets)


@handler("ScatterElements", since=11, layout=same_as_input(0),
         limits="mul/max/min reductions on int64 data need Flex ops in TFLite")
def scatter_elements(ctx):
    reduction = ctx.attr("reduction", "none")
    rows = _expanded_rows(ctx, ctx.attr("axis", 0) % ctx.rank(0))
    if rows is not None:  # whole rows: scattered as rows, not element by element
        data_rows = _dims(ctx, 0)[0]
        offsets = _normalize(tf.cast(tf.reshape(rows, [-1]), tf.int32), data_rows)
        return _scatter(ctx.x(0), offsets, ctx.x(2), reduction)
    offsets = _element_offsets(ctx, ctx.axis(ctx.attr("axis", 0)))
    flat = [tf.reshape(ctx.x(i), [-1]) for i in (0, 2)]
    out = _scatter(flat[0], tf.reshape(offsets, [-1]), flat[1], reduction)
    return _shaped(out, _dims(ctx, 0))


def _expanded_rows(ctx, axis: int):
    """The row index vector when ScatterElements writes whole rows of the first physical
    axis: its indices are an Expand of a tensor of size 1 on every other axis, to the data's
    full extent there, as updates are (torchvision's MultiScaleRoIAlign scatters each
    level's rois with idx.view(-1, 1, 1, 1).expand(-1, C, H, W)). Per element, the offsets,
    a segment max and a gather over C*H*W times more values took 57 ms of Faster R-CNN's
    220. None when the pattern does not hold."""
    name = ctx.node.inputs[1]
    source = next((n for n in ctx.graph.nodes if name in n.outputs), None)
    if source is None or source.op_type != "Expand" or ctx.axis(axis) != 0:
        return None
    # (ONNX: indices have the shape of updates, whatever inference says of the Expand)
    small, data, updates = (ctx.graph.shapes.get(n) for n in (
        source.inputs[0], ctx.node.inputs[0], ctx.node.inputs[2]))
    if None in (small, data, updates) or not len(small) == len(data) == len(updates):
        return None
    for a in range(len(data)):
        if a != axis and not (small[a] == 1 and data[a] is not None
                              and updates[a] == data[a]):
            return None
    return ctx.value(source.inputs[0])


handler("Scatter", since=9, layout=same_as_input(0))(scatter_elements)


@handler("GatherND", since=11, limits="static index depth")
def gather_nd(ctx):
    offsets, lead = _nd_offsets(ctx, ctx.attr("batch_dims", 0))
    return tf.gather(_rows(ctx.x(0), _dims(ctx, 0), lead), offsets)


@handler("ScatterND", since=11,
         limits="static index depth; mul/max/min reductions on int64 need Flex ops in TFLite")
def scatter_nd(ctx):
    offsets, lead = _nd_offsets(ctx, 0)
    dims = _dims(ctx, 0)
    data, updates = _rows(ctx.x(0), dims, lead), _rows(ctx.x(2), dims, lead)
    out = _scatter(data, tf.reshape(offsets, [-1]), updates, ctx.attr("reduction", "none"))
    return _shaped(out, dims)


# --- TopK ---------------------------------------------------------------------------------------
def _top_k(ctx, k):
    """Values and indices of the k largest (or smallest) along `axis`, ties by lower index.

    Integers are ranked on their order-preserving signed form (uint64 included: TFLite has
    no uint64 TOPK_V2) and the smallest found as the largest of ~x = -x - 1, which unlike
    -x does not overflow."""
    dtype, rank = ctx.x(0).dtype, ctx.rank(0)
    x = ordered(ctx.x(0))
    axis = ctx.axis(ctx.attr("axis", -1))
    swap = list(range(rank))
    swap[axis], swap[-1] = swap[-1], swap[axis]
    if axis != rank - 1:
        x = tf.transpose(x, swap)
    largest = ctx.attr("largest", 1)
    flip = tf.negative if x.dtype.is_floating else (lambda v: -v - 1)
    values, indices = tf.math.top_k(x if largest else flip(x), k=k, sorted=True)
    values = from_ordered(values if largest else flip(values), dtype)
    if axis != rank - 1:
        values, indices = tf.transpose(values, swap), tf.transpose(indices, swap)
    return [values, indices]


@handler("TopK", layout=same_as_input(0))
def top_k_v1(ctx):
    return _top_k(ctx, int(ctx.attr("k")))


@handler("TopK", since=10, layout=same_as_input(0), limits="sorted=0 returns sorted output")
def top_k(ctx):
    k = ctx.const(1)
    k = int(k.reshape(-1)[0]) if k is not None else tf.cast(tf.reshape(ctx.x(1), []), tf.int32)
    return _top_k(ctx, k)


# --- CumSum, CumProd ----------------------------------------------------------------------------
def _axis_const_perm(node: Node, graph: Graph, in_perm):
    """Keep the data's perm when the axis input is constant (it can be remapped)."""
    return tuple(in_perm) if graph.is_const(node.inputs[1]) else None


@handler("CumSum", since=11, layout=derived(_axis_const_perm))
def cumsum(ctx):
    axis = ctx.const(1)
    if axis is not None:
        axis = ctx.axis(int(axis.reshape(-1)[0]))
    else:
        axis = tf.cast(tf.reshape(ctx.x(1), []), tf.int32)
    exclusive, reverse = bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))
    return tf.math.cumsum(widen(ctx.x(0)), axis, exclusive=exclusive, reverse=reverse)


# Longest axis for which CumProd is unrolled into TFLite builtins (MUL, CONCATENATION);
# longer ones use tf.math.cumprod (a Select TF op in TFLite).
_UNROLL_LIMIT = 64


def _cumprod(x, axis: int, exclusive: bool, reverse: bool):
    """Running product along `axis`, unrolled when the axis is short and static."""
    length = x.shape[axis]
    if length is None or length > _UNROLL_LIMIT:
        return tf.math.cumprod(x, axis=axis, exclusive=exclusive, reverse=reverse)
    parts = tf.split(x, length, axis=axis)
    if reverse:
        parts = parts[::-1]
    if exclusive:
        parts = [tf.ones_like(parts[0]), *parts[:-1]]
    running = [parts[0]]
    for part in parts[1:]:
        running.append(running[-1] * part)
    if reverse:
        running = running[::-1]
    return tf.concat(running, axis=axis)


@handler("CumProd", since=26)
def cumprod(ctx):
    x, axis, rank = ctx.x(0), ctx.const(1), ctx.rank(0)
    exclusive, reverse = bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))
    if axis is not None or rank == 1:
        return _cumprod(x, 0 if axis is None else int(axis) % rank, exclusive, reverse)
    # A runtime axis: the running product along every axis, picked by the axis value.
    every = tf.stack([_cumprod(x, a, exclusive, reverse) for a in range(rank)])
    index = tf.math.floormod(tf.reshape(tf.cast(ctx.x(1), tf.int32), [1]), rank)
    return tf.squeeze(tf.gather(every, index), 0)


# --- NonZero, OneHot, Trilu, Compress -----------------------------------------------------------
@custom_policy
def _coordinates_last(node, graph, in_perms) -> Decision:
    """NonZero: the input in ONNX order; the output [rank, N] laid out [N, rank] (perm
    (1, 0)), as TF's WHERE gives it, so the Transpose(1, 0) that usually follows is free."""
    return Decision([None if p is None else P.identity(len(p)) for p in in_perms], [(1, 0)])


@handler("NonZero", since=9, layout=_coordinates_last)
def non_zero(ctx):
    x = ctx.x(0)
    return tf.where(x if x.dtype == tf.bool else tf.not_equal(x, 0))


@handler("OneHot", since=9)
def one_hot(ctx):
    depth = ctx.const(1)
    if depth is not None:
        depth = int(depth.reshape(-1)[0])
    else:
        depth = tf.cast(tf.reshape(ctx.x(1), []), tf.int32)
    indices = _normalize(tf.cast(ctx.x(0), tf.int32), depth)
    values = widen(ctx.x(2))
    axis = ctx.attr("axis", -1) % (ctx.rank(0) + 1)
    return tf.one_hot(indices, depth, on_value=values[1], off_value=values[0], axis=axis)


@handler("Trilu", since=14, layout=same_as_input(0))
def trilu(ctx):
    """Keep elements with col - row >= k (upper) or <= k (lower) on the last two axes."""
    x, rank = ctx.x(0), ctx.rank(0)
    shape = tf.shape(x, out_type=tf.int32)
    rows, cols = ctx.axis(-2), ctx.axis(-1)
    offset = _iota(shape[cols], cols, rank) - _iota(shape[rows], rows, rank)
    k = 0 if not ctx.has(1) else ctx.const(1)
    k = tf.cast(tf.reshape(ctx.x(1), []), tf.int32) if k is None else int(np.reshape(k, -1)[0])
    keep = offset >= k if ctx.attr("upper", 1) else offset <= k
    return tf.where(keep, x, tf.zeros_like(x))


def _compress_perm(node: Node, graph: Graph, in_perm):
    return tuple(in_perm) if "axis" in node.attrs else None


@handler("Compress", since=9, layout=derived(_compress_perm))
def compress(ctx):
    axis, x = ctx.attr("axis"), ctx.x(0)
    if axis is None:
        x, axis = tf.reshape(x, [-1]), 0
    else:
        axis = ctx.axis(axis)
    condition = ctx.const(1)
    if condition is not None:
        positions = ctx.const_tensor(np.flatnonzero(condition).astype(np.int32))
    else:
        positions = tf.reshape(tf.where(tf.cast(ctx.x(1), tf.bool)), [-1])
    return tf.gather(x, positions, axis=axis)


# --- Unique -------------------------------------------------------------------------------------
@handler("Unique", since=11, limits="with an axis: O(n^2) slice comparisons")
def unique(ctx):
    """Unique values (first-occurrence order, or ascending with sorted=1), first index of
    each, inverse indices and counts; the sort is a TopK over the unique values."""
    if ctx.attr("axis") is not None:
        return _unique_slices(ctx, ctx.attr("axis") % ctx.rank(0))
    x = widen(tf.reshape(ctx.x(0), [-1]))
    values, inverse = tf.unique(x, out_idx=tf.int32)
    count = tf.shape(values)[0]
    positions = tf.range(tf.shape(x)[0])
    first = tf.math.unsorted_segment_min(positions, inverse, count)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(inverse), inverse, count)
    if not ctx.attr("sorted", 1):
        return [values, first, inverse, counts]
    order = tf.math.top_k(-values, k=count).indices
    return _in_order(order, values, first, inverse, counts)


def _in_order(order, values, first, inverse, counts):
    """Unique's outputs with the unique entries rearranged into `order` (a permutation)."""
    count = tf.shape(order)[:1]
    rank = tf.scatter_nd(tf.expand_dims(order, 1), tf.range(count[0]), count)
    return [tf.gather(values, order), tf.gather(first, order), tf.gather(rank, inverse),
            tf.gather(counts, order)]


def _unique_slices(ctx, axis: int):
    """Unique slices along `axis`: each slice (a row once the axis is moved first and the
    rest flattened) is labelled by the first row equal to it, and a 1-D UNIQUE of the labels
    does the rest. Sorting ranks each unique row by how many rows are lexicographically
    smaller (decided at the first column where two rows differ)."""
    rank = ctx.rank(0)
    moved = [axis, *(a for a in range(rank) if a != axis)]
    x = ctx.x(0) if axis == 0 else tf.transpose(ctx.x(0), moved)
    rows = widen(tf.reshape(x, tf.stack([tf.shape(x)[0], tf.reduce_prod(tf.shape(x)[1:])])))
    n, width = tf.shape(rows)[0], tf.shape(rows)[1]
    differs = tf.reduce_any(tf.not_equal(tf.expand_dims(rows, 1), rows), -1)
    label = tf.reduce_min(tf.where(differs, n, tf.range(n)), 1)
    first, inverse = tf.unique(label, out_idx=tf.int32)
    count = tf.shape(first)[0]
    counts = tf.math.unsorted_segment_sum(tf.ones_like(inverse), inverse, count)
    values = tf.gather(rows, first)
    if ctx.attr("sorted", 1):
        column, lhs = tf.range(width), tf.expand_dims(values, 1)
        first_difference = tf.reduce_min(tf.where(tf.not_equal(lhs, values), column, width), -1)
        decisive = tf.equal(column, tf.expand_dims(first_difference, -1))
        smaller = tf.reduce_any(decisive & (lhs < values), -1)  # [i, j]: row i < row j
        position = tf.reduce_sum(tf.cast(smaller, tf.int32), 0)
        order = tf.scatter_nd(tf.expand_dims(position, 1), tf.range(count), tf.shape(position))
        values, first, inverse, counts = _in_order(order, values, first, inverse, counts)
    values = tf.reshape(values, tf.concat([[count], tf.shape(x)[1:]], 0))
    if axis:
        values = tf.transpose(values, P.inverse(moved))
    return [values, first, inverse, counts]


# --- ReverseSequence ----------------------------------------------------------------------------
@handler("ReverseSequence", since=10, layout=same_as_input(0))
def reverse_sequence(ctx):
    return tf.reverse_sequence(
        ctx.x(0),
        ctx.x(1),
        seq_axis=ctx.axis(ctx.attr("time_axis", 0)),
        batch_axis=ctx.axis(ctx.attr("batch_axis", 1)),
    )


# --- TensorScatter -----------------------------------------------------------------------
@handler("TensorScatter", since=24, limits="static sequence lengths; axis is not the batch axis")
def tensor_scatter(ctx):
    """Cache position p takes update row p - write_index (mod the cache length when
    circular) where that row exists, else keeps the past value: a gather and a select."""
    rank = len(ctx.shape(0))
    axis = ctx.attr("axis", -2) % rank
    max_len, length = ctx.shape(0)[axis], ctx.shape(1)[axis]
    if axis == 0 or max_len is None or length is None:
        raise NotImplementedError("TensorScatter needs static sequence lengths and axis >= 1")
    rows = np.arange(max_len, dtype=np.int32)
    if ctx.has(2):  # per batch entry: [B, max_len]
        rows = ctx.const_tensor(rows[np.newaxis]) - tf.reshape(tf.cast(ctx.x(2), tf.int32),
                                                               [-1, 1])
    if ctx.attr("mode", "linear") == "circular":
        rows = rows % max_len
    written = (rows >= 0) & (rows < length)
    # Rows outside the update are not used; `% length` only keeps their indices valid.
    picked = tf.gather(ctx.x(1), rows % length, axis=axis, batch_dims=1 if ctx.has(2) else 0)
    where = [1] * rank
    where[axis] = max_len
    if ctx.has(2):
        where[0] = -1
    return tf.where(tf.reshape(written, where), picked, ctx.x(0))
