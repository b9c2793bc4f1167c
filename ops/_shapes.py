"""Shared shape and axis helpers: dims that may be known only at run time, logical shapes of
inputs in any layout, and the physical axes that hold logical ones."""

from __future__ import annotations

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.translate.lazy import tf


def shape_tensor(ctx, i: int = 0, dtype="int32"):
    """Logical (ONNX-order) shape of input i at run time, whatever its physical perm."""
    return tf.gather(tf.shape(ctx.x(i), out_type=dtype), P.inverse(ctx.perm(i)))


def scalar(ctx, i: int):
    """Input i as a tensor (a constant one is made here, keeping its rank, even 0)."""
    value = ctx.const(i)
    return ctx.x(i) if value is None else ctx.const_tensor(value)


def to_inferred_shape(ctx, y):
    """y reshaped to output 0's inferred physical shape when at most one dim is unknown, so
    that later ops see the static dims a run-time computation loses."""
    out = ctx.out_phys_shape(0) if ctx.out_shape(0) is not None else None
    if out is None or sum(d is None for d in out) > 1:
        return y
    return tf.reshape(y, [-1 if d is None else int(d) for d in out])


def with_rank(y, rank: int):
    """y with a static rank where TF lost it (strided_slice with run-time strides, a reshape
    to a computed shape): a RESHAPE to its own dims, read one by one."""
    if y.shape.rank is not None:
        return y
    dims = tf.shape(y)
    return tf.reshape(y, tf.stack([dims[k] for k in range(rank)]))


def dims_of(x) -> list:
    """Dims of tensor x: ints where static, run-time scalars elsewhere."""
    static = x.shape.as_list()
    if None not in static:
        return static
    dynamic = tf.shape(x)
    return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def reshape_to_dims(x, dims: list):
    """tf.reshape to `dims` as `dims_of` gives them (ints or run-time scalars)."""
    if all(isinstance(d, int) for d in dims):
        return tf.reshape(x, dims)
    return tf.reshape(x, tf.stack([tf.cast(d, tf.int32) for d in dims]))


def physical_axes(ctx, logical_axes: list[int]) -> list[int]:
    """Physical axes of input 0's logical ones, size-1 axes dropped (they change nothing)."""
    shape = ctx.shape(0)
    wide = [a for a in logical_axes if shape is None or shape[a] != 1]
    return ctx.axes(wide or logical_axes[-1:])


def delegated_split(x, sizes, axis: int) -> list:
    """tf.split of x along physical `axis` into `sizes` (a list of ints) in ops the XNNPACK
    delegate takes: equal chunks as one SPLIT, unequal ones as one SLICE each (with explicit
    sizes: it takes no -1), SPLIT_V (reference kernels) only when a dim is unknown. A
    SPLIT_V in every step of an unrolled GRU cut it into 102 delegate partitions. Other
    dtypes than float32 (which XNNPACK does not take anyway) keep SPLIT_V: TFLite's SPLIT
    has no int64 kernel."""
    if x.dtype != tf.float32:
        return tf.split(x, sizes, axis=axis)
    if len(set(sizes)) == 1:
        return tf.split(x, len(sizes), axis=axis)
    dims = x.shape.as_list()
    if any(d is None for d in dims):
        return tf.split(x, sizes, axis=axis)
    axis %= len(dims)
    parts, start = [], 0
    for size in sizes:
        parts.append(tf.slice(x, [start if a == axis else 0 for a in range(len(dims))],
                              [size if a == axis else d for a, d in enumerate(dims)]))
        start += size
    return parts


XNNPACK_MAX_RANK = 6


def phase_slice(x, begin: list, end: list, strides: list, begin_mask: int, end_mask: int,
                ops=None):
    """A slice with steps > 1 on static dims as ops the XNNPACK delegate takes (it takes no
    strided STRIDED_SLICE): a SLICE of the whole blocks the steps run over, a RESHAPE of
    each stepped axis into (count, step), a SLICE of the phase the steps pick and a RESHAPE
    to the result, e.g. Swin's patch merging x[:, 1::2, 0::2]. None where that does not
    apply (negative or run-time steps and bounds, unknown dims, a rank above XNNPACK's 6).
    A last block shorter than the step is padded (PAD). `ops`: the tf namespace it computes
    with (tflite/direct_tensors.DirectOps for the direct writer)."""
    ops = tf if ops is None else ops
    dims = x.shape.as_list()
    stepped = [a for a, step in enumerate(strides) if step != 1]
    if (not stepped or x.dtype != ops.float32  # XNNPACK takes float32 only
            or any(d is None for d in dims) or any(s < 1 for s in strides)
            or len(dims) + len(stepped) > XNNPACK_MAX_RANK
            or not all(isinstance(v, int) for v in [*begin, *end])):
        return None
    first, size, overrun, split, phase, out = [], [], [], [], [], []
    for a, (n, step) in enumerate(zip(dims, strides)):
        b = 0 if begin_mask >> a & 1 else begin[a]
        e = n if end_mask >> a & 1 else end[a]
        count = max(0, -(-(e - b) // step))
        start = b - b % step
        if count == 0:
            return None
        first.append(start)
        size.append(min(count * step, n - start))
        overrun.append(start + count * step - n if step != 1 else 0)
        split += [count, step] if step != 1 else [count]
        phase += [(0, count), (b % step, 1)] if step != 1 else [(0, count)]
        out.append(count)
    blocks = ops.slice(x, first, size) if first != [0] * len(dims) or size != dims else x
    if any(v > 0 for v in overrun):  # the last block is short: zeros the phase never picks
        blocks = ops.pad(blocks, [[0, max(v, 0)] for v in overrun])
    picked = ops.slice(ops.reshape(blocks, split), [p for p, _ in phase], [n for _, n in phase])
    return ops.reshape(picked, out)
