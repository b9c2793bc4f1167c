"""Axis-remapping tensor ops: Concat, Split, Slice, Gather, Pad; and EyeLike.

The first run in whatever perm their data arrives in and map ONNX axes to physical ones, so
a channel-last tensor stays channel-last through them. EyeLike makes a constant of its
input's static shape, in the logical layout.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import derived, same_as_input
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.tflite.direct_tensors import DirectOps
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from ._shapes import (
    delegated_split,
    dims_of,
    phase_slice,
    scalar,
    shape_tensor,
    to_inferred_shape,
    with_rank,
)

INT32_MAX = 2**31 - 1


# The XNNPACK delegate takes a CONCATENATION of at most 5 inputs (measured: 6 and more run
# on the reference kernel, each such op a partition boundary; densenet121 had 42).
MAX_CONCAT_INPUTS = 5


@handler("Concat", layout=same_as_input(None))
def concat(ctx):
    """One CONCATENATION, or a tree of them of at most MAX_CONCAT_INPUTS inputs each."""
    axis = ctx.axis(ctx.attr("axis", 1))
    parts = [ctx.x(i) for i in range(ctx.num_inputs)]
    if parts[0].dtype == tf.float32:
        parts = _concat_tree(parts, lambda group: tf.concat(group, axis=axis))
    return tf.concat(parts, axis=axis)


def _concat_tree(parts: list, join) -> list:
    """At most MAX_CONCAT_INPUTS parts, each group of that many joined by `join`."""
    while len(parts) > MAX_CONCAT_INPUTS:
        groups = [parts[i:i + MAX_CONCAT_INPUTS] for i in range(0, len(parts), MAX_CONCAT_INPUTS)]
        parts = [join(g) if len(g) > 1 else g[0] for g in groups]
    return parts


@direct("Concat")
def concat_direct(ctx):
    axis = ctx.axis(ctx.attr("axis", 1))
    shape = list(ctx.out_phys_shape())

    def join(group: list, out: int | None = None) -> int:
        if out is None:  # a part several Concats share (DenseNet's growing inputs) once
            key = ("CONCATENATION", axis, tuple(group))
            if key in ctx.shared:
                return ctx.shared[key]
            sizes = [ctx.flat.shape(t)[axis] for t in group]
            shape[axis] = None if None in sizes else sum(sizes)
            out = ctx.shared[key] = ctx.temp(tuple(shape), "part")
        ctx.op("CONCATENATION", group, out,
               options("ConcatenationOptions", axis=axis, fusedActivationFunction=0))
        return out

    if ctx.num_inputs == 1:
        return ctx.x(0)
    parts = _concat_tree([ctx.x(i) for i in range(ctx.num_inputs)], join)
    return join(parts, ctx.output())


# --- Split -------------------------------------------------------------------------------
def _split_sizes(ctx, axis: int):
    """Chunk sizes (list), a chunk count (int, equal chunks) along the logical split axis,
    or None for sizes known only at run time (input 1, as it is)."""
    sizes = ctx.attr("split")
    if sizes is None and ctx.has(1):
        sizes = ctx.const(1)
        if sizes is None:
            return _runtime_split_sizes(ctx, axis)
    if sizes is not None:
        return [int(s) for s in sizes]
    count = ctx.attr("num_outputs", len(ctx.node.outputs))
    dim = None if ctx.shape(0) is None else ctx.shape(0)[axis]
    if dim is None:
        return count
    chunk = -(-dim // count)  # ceil: from opset 18 the last chunk may be smaller
    return [chunk] * (count - 1) + [dim - chunk * (count - 1)]


def _runtime_split_sizes(ctx, axis: int) -> list[int] | None:
    """Sizes given at run time: the inferred output dims when all are known, else None."""
    outs = [ctx.out_shape(j) for j in range(len(ctx.node.outputs))]
    if all(s is not None and s[axis] is not None for s in outs):
        return [int(s[axis]) for s in outs]
    return None


@handler("Split", layout=same_as_input(0),
         limits="uneven num_outputs needs a static dim")
def split(ctx):
    """Equal chunks are one SPLIT; unequal ones a SLICE each (XNNPACK takes SPLIT and
    SLICE, not SPLIT_V, which cut efficientformer_l1's attention out of the delegate)."""
    axis = ctx.attr("axis", 0) % ctx.rank(0)
    sizes = _split_sizes(ctx, axis)
    if isinstance(sizes, list):
        return delegated_split(ctx.x(0), sizes, ctx.axis(axis))
    if sizes is None:
        sizes = tf.cast(tf.reshape(ctx.x(1), [-1]), tf.int32)
    return tf.split(ctx.x(0), sizes, num=len(ctx.node.outputs), axis=ctx.axis(axis))


@direct("Split")
def split_direct(ctx):
    """split's cases with sizes known when converting, through the same delegated_split."""
    axis = ctx.attr("axis", 0) % ctx.rank(0)
    sizes = _split_sizes(ctx, axis)
    if not isinstance(sizes, list):
        raise NotCovered("split sizes, or the split dim, known at run time only")
    ops = DirectOps(ctx)
    return ops.outputs(ops.delegated_split(ops.node_input(0), sizes, ctx.axis(axis)))


# --- Slice -------------------------------------------------------------------------------
def _clamp(index: int, dim: int, step: int, is_end: bool) -> int:
    """ONNX Slice index normalization: negatives count from the end, then clamp."""
    index = index + dim if index < 0 else index
    if step > 0:
        return min(max(index, 0), dim)
    return min(max(index, -1 if is_end else 0), dim - 1)


def _int32(value):
    """A start or end (int or run-time scalar) clipped into int32, as TFLite needs."""
    if isinstance(value, int):
        return int(np.clip(value, -INT32_MAX, INT32_MAX))
    return tf.cast(tf.clip_by_value(value, -INT32_MAX, INT32_MAX), tf.int32)


def _steps_and_masks(ctx, axes, steps) -> tuple[list[int], int, int]:
    """Strides over input 0's physical axes, and begin / end masks with the bits of the
    sliced axes cleared (the others are taken whole)."""
    rank = ctx.rank(0)
    strides, begin_mask = [1] * rank, (1 << rank) - 1
    for axis, step in zip(axes, steps):
        p = ctx.axis(axis)
        strides[p] = step
        begin_mask &= ~(1 << p)
    return strides, begin_mask, begin_mask


def _slice(ctx, starts, ends, axes, steps):
    """Input 0 sliced on logical `axes`; starts/ends hold ints or run-time scalars.

    Static dims get ONNX's clamping in Python. Otherwise tf.strided_slice clamps like ONNX
    except for a start before the first element with a negative step (ONNX: the first
    element; TF: nothing), so such starts are raised to -dim.
    """
    x, rank = ctx.x(0), ctx.rank(0)
    axes = range(len(starts)) if axes is None else [int(a) % rank for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    begin, end = [0] * rank, [0] * rank
    strides, begin_mask, end_mask = _steps_and_masks(ctx, axes, steps)
    for start, stop, axis, step in zip(starts, ends, axes, steps):
        p, dim = ctx.axis(axis), ctx.shape(0)[axis]
        static = isinstance(start, int) and isinstance(stop, int)
        if static and dim is not None:
            start, stop = _clamp(start, dim, step, False), _clamp(stop, dim, step, True)
            if stop == -1:
                end_mask |= 1 << p  # through the first element, stepping backwards
        else:
            if isinstance(start, int) and abs(start) >= INT32_MAX and (start < 0) == (step > 0):
                begin_mask |= 1 << p  # from the first element in the stepping direction
            elif step < 0 and not (isinstance(start, int) and start >= 0):
                size = dim if dim is not None else tf.shape(x)[p]
                start = tf.maximum(_int32(start), -size)
            if isinstance(stop, int) and abs(stop) >= INT32_MAX and (stop > 0) == (step > 0):
                end_mask |= 1 << p  # through the last element in the stepping direction
            elif dim is None and step > 0:
                start, stop = (_clamped_to_dim(v, x, p) for v in (start, stop))
        begin[p], end[p] = _int32(start), _int32(stop)
    phased = phase_slice(x, begin, end, strides, begin_mask, end_mask)
    if phased is not None:
        return phased
    return _strided_slice(x, begin, end, strides, begin_mask, end_mask)


def _clamped_to_dim(value, x, p: int):
    """A static non-negative bound clamped to x's run-time dim p; others as they are. TF's
    converter lowers a strided_slice with static bounds to a SLICE of static size, which
    TFLite's kernel refuses when the dim turns out smaller (ONNX clamps: `keep[:1000]` of
    fewer boxes); with a run-time bound it stays a STRIDED_SLICE, which clamps."""
    if not isinstance(value, int) or value <= 0 or value >= INT32_MAX:
        return value
    return tf.minimum(value, tf.shape(x, out_type=tf.int32)[p])


TFLITE_SLICE_RANK = 5  # the most axes TFLite's STRIDED_SLICE takes


def _strided_slice(x, begin: list, end: list, strides: list, begin_mask: int, end_mask: int):
    """tf.strided_slice with begin/end lists of ints or run-time scalars.

    Above TFLite's rank limit, each run of adjacent axes taken whole is merged into one axis
    first (RESHAPE, STRIDED_SLICE, RESHAPE back) rather than leaving a Select TF op.
    """
    whole = [begin_mask >> a & end_mask >> a & 1 and step == 1 for a, step in enumerate(strides)]
    groups = []  # runs of physical axes: whole ones merged, sliced ones alone
    for a, take_all in enumerate(whole):
        if take_all and groups and whole[groups[-1][-1]]:
            groups[-1].append(a)
        else:
            groups.append([a])
    if len(strides) <= TFLITE_SLICE_RANK or len(groups) > TFLITE_SLICE_RANK:
        return tf.strided_slice(x, _stacked(begin), _stacked(end), strides, begin_mask, end_mask)
    dims = dims_of(x)
    merged = _reshaped(x, [_product([dims[a] for a in g]) for g in groups])
    firsts = [g[0] for g in groups]
    y = tf.strided_slice(
        merged, _stacked([begin[a] for a in firsts]), _stacked([end[a] for a in firsts]),
        [strides[a] for a in firsts],
        sum(1 << i for i, a in enumerate(firsts) if begin_mask >> a & 1),
        sum(1 << i for i, a in enumerate(firsts) if end_mask >> a & 1))
    sliced = dims_of(y)
    out = [d for i, g in enumerate(groups) for d in ([dims[a] for a in g] if whole[g[0]]
                                                    else [sliced[i]])]
    return _reshaped(y, out)


def _stacked(values: list):
    return values if all(isinstance(v, int) for v in values) else tf.stack(values)


def _product(dims: list):
    result = 1
    for d in dims:
        result = result * d if not isinstance(result, int) or isinstance(d, int) else d * result
    return result


def _reshaped(x, dims: list):
    return tf.reshape(x, dims if all(isinstance(d, int) for d in dims) else tf.stack(dims))


@handler("Slice", layout=same_as_input(0), limits="starts/ends/axes attributes")
def slice_v1(ctx):
    starts, ends = [int(v) for v in ctx.attr("starts")], [int(v) for v in ctx.attr("ends")]
    return _slice(ctx, starts, ends, ctx.attr("axes"), None)


@handler("Slice", since=10, layout=same_as_input(0))
def slice_(ctx):
    axes, steps = ctx.const(3), ctx.const(4)
    if (ctx.has(3) and axes is None) or (ctx.has(4) and steps is None):
        return _runtime_slice(ctx)
    bounds = []
    for i in (1, 2):
        value = ctx.const(i)
        if value is not None:
            bounds.append([int(v) for v in value])
        else:
            bounds.append([ctx.x(i)[j] for j in range(ctx.shape(i)[0])])
    return _slice(ctx, *bounds, axes, steps)


@direct("Slice", since=10)
def slice_direct(ctx):
    """_slice's static cases: one SLICE for unit steps, phase_slice's ops for others."""
    if any(ctx.has(i) and ctx.const(i) is None for i in (1, 2, 3, 4)):
        raise NotCovered("run-time starts, ends, axes or steps")
    starts, ends = ([int(v) for v in ctx.const(i)] for i in (1, 2))
    rank = ctx.rank(0)
    axes = range(len(starts)) if not ctx.has(3) else [int(a) % rank for a in ctx.const(3)]
    steps = [1] * len(starts) if not ctx.has(4) else [int(s) for s in ctx.const(4)]
    if any(ctx.shape(0)[axis] is None for axis in axes):
        raise NotCovered("a slice of a dim known at run time")
    if any(step != 1 for step in steps):
        return _strided_slice_direct(ctx, starts, ends, axes, steps)
    spans = {}
    for start, stop, axis in zip(starts, ends, axes):
        dim = ctx.shape(0)[axis]
        start, stop = _clamp(start, dim, 1, False), _clamp(stop, dim, 1, True)
        spans[ctx.axis(axis)] = (start, max(stop - start, 0))
    return _slice_direct(ctx, spans)


def _strided_slice_direct(ctx, starts, ends, axes, steps):
    """_slice's static case with steps: phase_slice's SLICEs and RESHAPEs."""
    begin, end = [0] * ctx.rank(0), [0] * ctx.rank(0)
    strides, begin_mask, end_mask = _steps_and_masks(ctx, axes, steps)
    for start, stop, axis, step in zip(starts, ends, axes, steps):
        p, dim = ctx.axis(axis), ctx.shape(0)[axis]
        begin[p], end[p] = _clamp(start, dim, step, False), _clamp(stop, dim, step, True)
        if end[p] == -1:
            end_mask |= 1 << p  # through the first element, stepping backwards
    ops = DirectOps(ctx)
    y = phase_slice(ops.node_input(0), begin, end, strides, begin_mask, end_mask, ops)
    if y is None:
        raise NotCovered("a strided slice of a value whose dims are not all known, or "
                         "with negative steps")
    return ops.outputs([y])


def _runtime_slice(ctx):
    """Slice whose axes or steps are known only at run time.

    Full logical begin/end/stride vectors are built at run time (a one-hot match of each
    logical axis against `axes`), clamped as ONNX does, permuted to the physical order and
    fed to one strided_slice. A backwards end before the first element (-1 after clamping)
    becomes -dim-1, which strided_slice reads as "before the first element" too.
    """
    x, rank = ctx.x(0), ctx.rank(0)
    dims = shape_tensor(ctx)  # logical dims
    starts, ends = (_int32(tf.reshape(scalar(ctx, i), [-1])) for i in (1, 2))
    count = tf.size(starts)
    axes = scalar(ctx, 3) if ctx.has(3) else tf.range(count)
    axes = tf.cast(tf.reshape(axes, [-1]), tf.int32)
    axes = tf.where(axes < 0, axes + rank, axes)
    steps = tf.ones_like(starts) if not ctx.has(4) else tf.cast(scalar(ctx, 4), tf.int32)
    steps = tf.reshape(steps, [-1])
    dim = tf.gather(dims, axes)
    forward = steps > 0
    starts = tf.where(starts < 0, starts + dim, starts)
    ends = tf.where(ends < 0, ends + dim, ends)
    starts = tf.clip_by_value(starts, 0, tf.where(forward, dim, dim - 1))
    ends = tf.clip_by_value(ends, tf.where(forward, 0, -1), tf.where(forward, dim, dim - 1))
    ends = tf.where(ends < 0, -dim - 1, ends)
    match = tf.cast(tf.equal(tf.range(rank)[:, None], axes[None, :]), tf.int32)  # rank x count
    sliced = tf.reduce_max(match, axis=1)

    def full(values, default):
        return tf.reduce_sum(match * values[None, :], axis=1) + (1 - sliced) * default

    order = list(ctx.perm(0))
    begin, end = tf.gather(full(starts, 0), order), tf.gather(full(ends, dims), order)
    strides = tf.gather(full(steps, 1), order)
    y = with_rank(tf.strided_slice(x, begin, end, strides), rank)
    out = ctx.out_phys_shape(0) if ctx.out_shape(0) is not None else None
    if out is not None and sum(d is None for d in out) <= 1:
        y = tf.reshape(y, [-1 if d is None else int(d) for d in out])  # restore static dims
    return y


# --- Gather ------------------------------------------------------------------------------
def _gather_perm(node: Node, graph: Graph, in_perm):
    """Scalar indices drop the axis, 1-D ones keep it in place; others run logically."""
    axis = node.attrs.get("axis", 0) % len(in_perm)
    rank = graph.rank(node.inputs[1])
    if rank == 0:
        return P.drop_axes(in_perm, [axis])
    return tuple(in_perm) if rank == 1 else None


def _is_run(indices: np.ndarray) -> bool:
    """A scalar, or a 1-D run of consecutive indices: a slice (which XNNPACK takes, unlike
    GATHER; e.g. attention's q, k, v = qkv[0], qkv[1], qkv[2])."""
    flat = indices.reshape(-1)
    return indices.ndim <= 1 and flat.size > 0 and bool(
        (np.diff(flat) == 1).all() and flat[0] >= 0)


def _slice_run(ctx, start: int, indices: np.ndarray, axis: int):
    x = ctx.x(0)
    begin = [0] * x.shape.rank
    size = [-1 if d is None else d for d in x.shape.as_list()]  # XNNPACK takes no -1 size
    begin[axis], size[axis] = start, indices.size
    y = tf.slice(x, begin, size)
    if indices.ndim == 1:
        return y
    out = ctx.out_phys_shape(0) if ctx.out_shape(0) is not None else None
    if out is not None and sum(d is None for d in out) <= 1:
        return tf.reshape(y, [-1 if d is None else int(d) for d in out])
    return tf.squeeze(y, axis)


@direct("Gather")
def gather_direct(ctx):
    """gather's slice case: constant indices that are one run on a known dim."""
    axis = ctx.attr("axis", 0) % ctx.rank(0)
    dim, indices = ctx.shape(0)[axis], ctx.const(1)
    if indices is None or dim is None:
        raise NotCovered("run-time indices, or a dim known at run time")
    indices = np.where(indices < 0, indices + dim, indices).astype(np.int32)
    if not _is_run(indices):
        raise NotCovered("indices that are not one run")
    return _slice_direct(ctx, {ctx.axis(axis): (int(indices.reshape(-1)[0]), indices.size)})


def _slice_direct(ctx, spans: dict[int, tuple[int, int]]) -> int:
    """SLICE of input 0 taking (begin, size) on the physical axes in `spans`, all of others,
    RESHAPEd to output 0's physical shape where that drops or adds axes."""
    x = ctx.x(0)
    shape = ctx.flat.shape(x)
    begin = [spans.get(a, (0, 0))[0] for a in range(len(shape))]
    size = [spans[a][1] if a in spans else d for a, d in enumerate(shape)]
    if any(d is None for a, d in enumerate(size) if a != 0):
        raise NotCovered("a slice of a dim known at run time")
    sliced_shape = tuple(size)
    out_shape = ctx.out_phys_shape()
    same = tuple(out_shape) == sliced_shape
    y = ctx.output() if same else ctx.temp(sliced_shape, "slice")
    ctx.op("SLICE", [x, ctx.ints(begin, "begin"), ctx.ints([-1 if d is None else d for d in size],
                                                           "size")], y)
    if same:
        return y
    out = ctx.output()
    ctx.reshape(y, out_shape, out)
    return out


@handler("Gather", layout=derived(_gather_perm))
def gather(ctx):
    axis = ctx.attr("axis", 0) % ctx.rank(0)
    dim, phys_axis = ctx.shape(0)[axis], ctx.axis(axis)
    indices = ctx.const(1)
    if indices is not None and (dim is not None or (indices >= 0).all()):
        indices = np.where(indices < 0, indices + (dim or 0), indices).astype(np.int32)
        if _is_run(indices):
            return _slice_run(ctx, int(indices.reshape(-1)[0]), indices, phys_axis)
        return tf.gather(ctx.x(0), ctx.const_tensor(indices), axis=phys_axis)
    indices = ctx.x(1)
    size = dim if dim is not None else tf.cast(tf.shape(ctx.x(0))[phys_axis], indices.dtype)
    indices = tf.where(indices < 0, indices + size, indices)
    return tf.gather(ctx.x(0), indices, axis=phys_axis)


# --- Pad ---------------------------------------------------------------------------------
def _gather_pad(x, axis: int, dim, before, after, mode: str):
    """Edge or wrap padding along one physical axis, as a gather; `before` and `after` are
    ints or run-time int32 scalars. Negative pads crop first (as the ONNX reference does),
    so wrap repeats the cropped extent."""
    static = dim is not None and isinstance(before, int) and isinstance(after, int)
    xp = np if static else tf.math
    size = dim if dim is not None else tf.shape(x)[axis]
    low = xp.maximum(-before, 0)
    span = size - xp.maximum(-after, 0) - low
    positions = (np.arange if static else tf.range)(-xp.maximum(before, 0),
                                                    span + xp.maximum(after, 0))
    if mode == "edge":
        index = low + (np.clip if static else tf.clip_by_value)(positions, 0, span - 1)
    else:
        index = low + positions % span
    return tf.gather(x, index.astype(np.int32) if static else index, axis=axis)


def _crop(x, pads):
    """Remove the negative parts of physical (before, after) pads."""
    if all(b >= 0 and a >= 0 for b, a in pads):
        return x
    return x[tuple(slice(max(-b, 0), a if a < 0 else None) for b, a in pads)]


def _physical_pads(ctx, pads, axes=None) -> list[tuple[int, int]]:
    """(begin, end) per physical axis of input 0 from logical `pads` ([begins..., ends...]
    over `axes`, default all)."""
    rank = ctx.rank(0)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    logical = {a: (int(pads[j]), int(pads[j + len(axes)])) for j, a in enumerate(axes)}
    return [logical.get(a, (0, 0)) for a in ctx.perm(0)]


def _pad(ctx, pads, value, mode: str, axes=None):
    """Pad input 0 by logical `pads` ([begins..., ends...] over `axes`, default all)."""
    phys = _physical_pads(ctx, pads, axes)
    x = ctx.x(0)
    if mode in ("edge", "wrap"):
        shape = ctx.phys_shape(0)
        for p, (b, a) in enumerate(phys):
            if b or a:
                x = _gather_pad(x, p, shape[p], b, a, mode)
        return x
    grow = [[max(b, 0), max(a, 0)] for b, a in phys]
    if mode == "reflect":
        x = tf.pad(x, grow, mode="REFLECT")
    else:
        x = _constant_padded(x, grow, value)
    return _crop(x, phys)


def _constant_padded(x, grow, value):
    """tf.pad of x by `grow` with `value`. A constant zero is left out, so that TFLite gets
    a PAD: a PADV2 runs on the reference kernels (XNNPACK takes PAD only), and TFLite's 16x8
    quantizer leaves its value in float, which breaks the INT16-activation files
    (basic-pitch's 15 zero pads). An expanded function may hand a one-element value
    rather than a scalar."""
    if not tf.is_tensor(value) and not np.any(np.asarray(value)):
        return _zero_padded(x, grow)
    return tf.pad(x, grow, constant_values=tf.cast(tf.reshape(value, []), x.dtype))


def _zero_padded(x, grow):
    """tf.pad of x by `grow` with zeros; trailing unpadded axes of size 1 are dropped around
    the PAD. XNNPACK's PAD of a tensor whose last axis is 1 copies element by element: 518
    µs for a 1x172x309x1 pad where the same pad on 1x172x309 takes 23 µs with its two
    RESHAPEs (basic-pitch's harmonic stacking pads 15 such tensors)."""
    shape = x.shape.as_list()
    kept = len(shape)
    while kept > 1 and shape[kept - 1] == 1 and not any(grow[kept - 1]):
        kept -= 1
    if kept == len(shape) or not any(any(g) for g in grow[:kept]):
        return tf.pad(x, grow)
    y = tf.pad(tf.squeeze(x, list(range(kept, len(shape)))), grow[:kept])
    for _ in range(len(shape) - kept):
        y = tf.expand_dims(y, -1)
    return y


@handler("Pad", layout=same_as_input(0), limits="pads attribute")
def pad_v1(ctx):
    pads = ctx.attr("pads", ctx.attr("paddings"))  # `paddings` in opset 1
    return _pad(ctx, pads, ctx.attr("value", 0.0), ctx.attr("mode", "constant"))


@handler("Pad", since=11, layout=same_as_input(0),
         limits="run-time pads or axes: no channel-last-free shortcut (one GATHER per axis for "
                "edge/wrap; a SLICE that removes negative pads)")
def pad(ctx):
    pads, axes = ctx.const(1), ctx.const(3)
    value = (ctx.const(2) if ctx.const(2) is not None else scalar(ctx, 2)) if ctx.has(2) else 0
    mode = ctx.attr("mode", "constant")
    if pads is not None and (axes is not None or not ctx.has(3)):
        return _pad(ctx, pads, value, mode, axes)
    return _runtime_pad(ctx, _runtime_paddings(ctx), value, mode)


@direct("Pad", since=11)
def pad_direct(ctx):
    """pad's constant mode with constant, non-negative pads: one PAD (PADV2 for a value
    other than zero), where _zero_padded would not drop a trailing unit axis around it."""
    pads, axes = ctx.const(1), ctx.const(3)
    value = ctx.const(2) if ctx.has(2) else np.zeros((), np.float32)
    if (pads is None or (ctx.has(3) and axes is None) or value is None
            or ctx.attr("mode", "constant") != "constant"):
        raise NotCovered("run-time pads or value, or a mode other than constant")
    phys = _physical_pads(ctx, pads, axes)
    shape = ctx.phys_shape(0)
    if any(b < 0 or e < 0 for b, e in phys):
        raise NotCovered("negative pads (a crop)")
    if not any(b or e for b, e in phys):
        return ctx.x(0)  # padding by nothing: TF's converter drops the PAD
    if len(shape) > 1 and shape[-1] == 1 and not any(phys[-1]):
        raise NotCovered("a pad around a trailing unit axis (written with RESHAPEs)")
    out, paddings = ctx.output(), ctx.ints(np.array(phys, np.int32), "paddings")
    if not np.any(value):
        ctx.op("PAD", [ctx.x(0), paddings], out)
    else:
        ctx.op("PADV2", [ctx.x(0), paddings,
                         ctx.weight(np.float32(np.reshape(value, ())), "value")], out)
    return out


def _runtime_paddings(ctx):
    """(rank, 2) int32 physical (begin, end) pads from pads (and axes) known at run time.

    With axes, each physical axis sums the pads of the listed axes it matches (one-hot).
    """
    rank = ctx.rank(0)
    pads = tf.cast(tf.reshape(scalar(ctx, 1), [-1]), tf.int32)
    if not ctx.has(3):
        return tf.gather(pads, [[a, a + rank] for a in ctx.perm(0)])
    axes = tf.cast(tf.reshape(scalar(ctx, 3), [-1]), tf.int32)
    axes = tf.where(axes < 0, axes + rank, axes)
    count = tf.size(axes)
    match = tf.cast(tf.equal(np.array(ctx.perm(0), np.int32)[:, None], axes[None, :]), tf.int32)
    begins, ends = (tf.reduce_sum(match * part[None, :], 1)
                    for part in (pads[:count], pads[count:]))
    return tf.stack([begins, ends], axis=1)


def _runtime_pad(ctx, paddings, value, mode: str):
    """Input 0 padded by physical run-time `paddings` (negative entries crop)."""
    x = ctx.x(0)
    if mode in ("edge", "wrap"):
        shape = ctx.phys_shape(0)
        for p in range(ctx.rank(0)):
            x = _gather_pad(x, p, shape[p], paddings[p, 0], paddings[p, 1], mode)
    else:
        grow = tf.maximum(paddings, 0)
        if mode == "reflect":
            x = tf.pad(x, grow, mode="REFLECT")
        else:
            x = _constant_padded(x, grow, value)
        crop = tf.maximum(-paddings, 0)
        x = tf.slice(x, crop[:, 0], tf.shape(x, out_type=tf.int32) - crop[:, 0] - crop[:, 1])
    return to_inferred_shape(ctx, x)


@handler("EyeLike", since=9, limits="static input shape")
def eye_like(ctx):
    rows, cols = ctx.shape(0)
    if rows is None or cols is None:
        raise NotImplementedError("EyeLike needs a static input shape")
    return np.eye(rows, cols, ctx.attr("k", 0), dtype=ctx.out_dtype(0))
