"""Sampling and re-arranging ops: GridSample, AffineGrid, Col2Im, CenterCropPad, MaxUnpool.

GridSample computes, for every output point, the flat input positions of its taps and their
weights with elementwise builtins, then fetches all taps with one GATHER from the flattened
channel-last input and sums them (MUL, SUM): no TF image op, no transpose. The arithmetic
follows onnxruntime's kernel (padding applies to each tap's index; nearest rounds half to
even). Col2Im and MaxUnpool move values with index tables: Col2Im sums gathered columns, and
MaxUnpool scatters into a zero tensor (SCATTER_ND) at indices rewritten to channel-last.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from onnx2tf_alt.layout.policies import channel_last, same_as_input
from onnx2tf_alt.translate.context import reshape
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

from ._shapes import scalar, shape_tensor, to_inferred_shape

_CUBIC_A = -0.75


def _static_dims(ctx, dims, what: str) -> list[int]:
    if any(d is None for d in dims):
        raise NotImplementedError(f"{ctx.node.op_type} needs static {what}; set them with -ois")
    return [int(d) for d in dims]


# --- GridSample ------------------------------------------------------------------------------
def _keys_cubic(a: float) -> np.ndarray:
    """Keys' cubic weights of the taps at floor(x) - 1 .. floor(x) + 2 as polynomials in the
    fraction t = x - floor(x): row p holds the coefficients of t**p, one column per tap."""
    return np.array([
        [0, 1, 0, 0],
        [a, 0, -a, 0],
        [-2 * a, -(a + 3), 2 * a + 3, a],
        [a, a + 2, -(a + 2), -a],
    ])


# per mode: offsets of the taps from round(x) (nearest) or floor(x), and their weights'
# polynomial coefficients in the fraction (rows: powers of t)
_TAPS = {
    "nearest": ([0], None),
    "linear": ([0, 1], np.array([[1, 0], [-1, 1]])),
    "cubic": ([-1, 0, 1, 2], _keys_cubic(_CUBIC_A)),
}


def _reflect(v, lo: np.ndarray, hi: np.ndarray):
    """Fold v into [lo, hi] by reflecting at the borders (onnxruntime's GsReflect)."""
    span = hi - lo
    return lo + span - tf.abs(tf.math.floormod(v - lo, 2 * span) - span)


def _padded_index(index, size: np.ndarray, padding: str, align: bool):
    """(int32 index inside [0, size), validity or None) of taps per padding_mode; `size`
    holds one length per coordinate (the last axis of index)."""
    if padding == "reflection":  # the borders: pixel centers, or the image's outer edges
        edge = np.float32(0 if align else 0.5)
        index = _reflect(index, np.full_like(size, -edge), size - 1 + edge)
    clipped = tf.clip_by_value(index, 0, size - 1)
    valid = tf.equal(index, clipped) if padding == "zeros" else None
    return tf.cast(clipped, tf.int32), valid


def _tap_weights(fraction, offsets, coeffs: np.ndarray, combos: np.ndarray):
    """(..., taps, r) weight of each tap on each axis: the mode's polynomials of the
    fraction, as one matmul (plus constant terms) that also picks each tap's polynomial."""
    rank, degree = combos.shape[1], len(coeffs) - 1
    powers = [fraction]
    while len(powers) < degree:
        powers.append(powers[-1] * fraction)
    # pick[axis, p, tap, axis] = coefficient of t**p in the weight of that tap on that axis
    pick = np.zeros((rank, degree + 1, len(combos), rank), np.float32)
    for t, combo in enumerate(combos):
        for axis, offset in enumerate(combo):
            pick[axis, :, t, axis] = coeffs[:, offsets.index(offset)]
    powers = tf.reshape(tf.stack(powers, -1), [-1, rank * degree])
    weights = tf.matmul(powers, pick[:, 1:].reshape(rank * degree, -1))
    weights = weights + pick[:, 0].sum(0).reshape(-1)
    return reshape(weights, [*fraction.shape[:-1], len(combos), rank])


def _batch_offsets(ctx, index, spatial: int):
    """Offset of each batch item in the flattened input, shaped to broadcast over index."""
    rank = index.shape.rank
    batch = ctx.shape(1)[0]
    if batch is not None:
        return np.arange(batch, dtype=np.int32).reshape((-1,) + (1,) * (rank - 1)) * spatial
    offsets = tf.range(tf.shape(index)[0]) * spatial
    return tf.reshape(offsets, [-1] + [1] * (rank - 1))


def _grid_taps(grid, sizes: list[int], mode: str, padding: str, align: bool):
    """Flat spatial index (int32) and weight (or None) of every tap: (N, out..., taps).

    The grid's last axis lists coordinates innermost spatial axis first (x, y, z); all axes
    and all taps are computed at once, broadcasting per-coordinate constants.
    """
    size = np.array(sizes[::-1], np.float32)
    if align:
        coords = (grid + 1) / 2 * (size - 1)
    else:
        coords = ((grid + 1) * size - 1) / 2
    offsets, coeffs = _TAPS[mode]
    combos = np.array(list(itertools.product(offsets, repeat=len(sizes))))
    base = tf.round(coords) if mode == "nearest" else tf.floor(coords)  # round: half to even
    index, valid = _padded_index(tf.expand_dims(base, -2) + combos.astype(np.float32), size,
                                 padding, align)
    weight = None if coeffs is None else _tap_weights(coords - base, offsets, coeffs, combos)
    if valid is not None:
        valid = tf.cast(valid, coords.dtype)
        weight = valid if weight is None else weight * valid
    strides = np.array([math.prod(sizes[len(sizes) - j:]) for j in range(len(sizes))], np.int32)
    flat = tf.reduce_sum(index * strides, -1)
    return flat, None if weight is None else tf.reduce_prod(weight, -1)


_GRID_MODES = {"bilinear": "linear", "bicubic": "cubic"}


@handler("GridSample", since=16, layout=channel_last(0),
         limits="static spatial dims and channel count")
@handler("GridSample", since=20, layout=channel_last(0),
         limits="4-D and 5-D input only (cubic: 4-D, as in onnxruntime)")
def grid_sample(ctx):
    """Opset 16 names the modes bilinear/bicubic and is 2-D; opset 20 says linear/cubic, N-D."""
    mode = ctx.attr("mode", "bilinear")
    mode = _GRID_MODES.get(mode, mode)
    sizes = _static_dims(ctx, ctx.shape(0)[2:], "input spatial dims")
    if len(sizes) not in (2, 3) or (mode == "cubic" and len(sizes) != 2):
        raise NotImplementedError(f"GridSample {mode} on {len(sizes)}-D data")
    index, weight = _grid_taps(tf.cast(ctx.x(1), tf.float32), sizes, mode,
                               ctx.attr("padding_mode", "zeros"),
                               bool(ctx.attr("align_corners", 0)))
    index = index + _batch_offsets(ctx, index, math.prod(sizes))
    channels = _static_dims(ctx, ctx.shape(0)[1:2], "channel count")[0]
    flat = tf.reshape(tf.cast(ctx.x(0), tf.float32), [-1, channels])
    taps = tf.gather(flat, index)  # (N, out..., T, C)
    if weight is None:
        return tf.squeeze(taps, -2)
    return tf.reduce_sum(taps * tf.expand_dims(weight, -1), -2)


# --- AffineGrid ------------------------------------------------------------------------------
def _base_coords(size: int, align: bool) -> np.ndarray:
    """Normalized positions of the `size` samples of one axis (the spec's base grid; a
    single aligned sample sits at 1, as in onnxruntime)."""
    if align:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.array([1.0])
    return (2 * np.arange(size) + 1) / size - 1


def _runtime_base_coords(size, align: bool):
    """_base_coords of a run-time int32 size, in float32."""
    n, d = tf.cast(tf.range(size), tf.float32), tf.cast(size, tf.float32)
    if align:
        return tf.where(size > 1, n * 2 / tf.maximum(d - 1, 1) - 1, 1.0)
    return (2 * n + 1) / d - 1


def _runtime_base_grid(sizes: list, align: bool):
    """(points, r + 1) rows (x, y[, z], 1) of the base grid for run-time spatial sizes."""
    ones = tf.ones(tf.stack(sizes))
    rank = len(sizes)
    axes = [tf.reshape(_runtime_base_coords(d, align), [-1 if j == i else 1 for j in range(rank)])
            * ones for i, d in enumerate(sizes)]
    return tf.reshape(tf.stack([*reversed(axes), ones], -1), [-1, rank + 1])


@handler("AffineGrid", since=20, limits="run-time size: float32 base grid")
def affine_grid(ctx):
    size, out = ctx.const(1), ctx.out_shape(0)
    align = bool(ctx.attr("align_corners", 0))
    theta = ctx.x(0)
    if size is not None or (out is not None and None not in out[1:-1]):
        spatial = [int(d) for d in (size[2:] if size is not None else out[1:-1])]
        axes = np.meshgrid(*[_base_coords(d, align) for d in spatial], indexing="ij")
        # one row (x, y[, z], 1) per output point, innermost spatial axis first
        base = np.stack([*reversed([a.ravel() for a in axes]), np.ones(math.prod(spatial))], -1)
        base = ctx.const_tensor(base.astype(theta.dtype.as_numpy_dtype))
    else:
        spatial = tf.unstack(tf.cast(tf.reshape(ctx.x(1), [-1]), tf.int32)[2:],
                             num=ctx.shape(1)[0] - 2)
        base = tf.cast(_runtime_base_grid(spatial, align), theta.dtype)
    points = tf.matmul(base[tf.newaxis], theta, transpose_b=True)  # (N, points, r)
    if isinstance(spatial[0], int):
        return tf.reshape(points, [-1, *spatial, len(spatial)])
    return tf.reshape(points, tf.stack([-1, *spatial, len(spatial)]))


# --- Col2Im ----------------------------------------------------------------------------------
def col2im_table(image, block, dilations, pads, strides) -> np.ndarray:
    """For each image position, the (block element * blocks + block) columns summed into it,
    padded with the index of an extra zero column: shape (positions, most contributions)."""
    n = len(image)
    counts = [(image[i] + pads[i] + pads[n + i] - dilations[i] * (block[i] - 1) - 1)
              // strides[i] + 1 for i in range(n)]
    blocks = math.prod(counts)
    sources: list[list[int]] = [[] for _ in range(math.prod(image))]
    for k, offset in enumerate(itertools.product(*[range(b) for b in block])):
        for b, where in enumerate(itertools.product(*[range(c) for c in counts])):
            pos = [where[i] * strides[i] + offset[i] * dilations[i] - pads[i] for i in range(n)]
            if all(0 <= p < size for p, size in zip(pos, image)):
                sources[int(np.ravel_multi_index(pos, image))].append(k * blocks + b)
    zero = math.prod(block) * blocks
    width = max(1, max(len(s) for s in sources))
    return np.array([s + [zero] * (width - len(s)) for s in sources], np.int32)


def _unravel(index, dims: list) -> list:
    """Row-major coordinates of a flat index over run-time `dims`."""
    return [(index // math.prod(dims[i + 1:])) % d for i, d in enumerate(dims)]


def _runtime_col2im(ctx, dilations, pads, strides):
    """Col2Im with run-time shapes: each column's image position (or -1 when it falls in
    the padding) becomes a one-hot row, and one matmul sums the columns into the image."""
    n = ctx.shape(1)[0]
    image, block = (tf.unstack(tf.cast(tf.reshape(scalar(ctx, i), [-1]), tf.int32), num=n)
                    for i in (1, 2))
    counts = [(image[i] + pads[i] + pads[n + i] - dilations[i] * (block[i] - 1) - 1)
              // strides[i] + 1 for i in range(n)]
    x = ctx.x(0)
    shape, size = tf.shape(x), math.prod(block)
    offset = _unravel(tf.range(size)[:, None], block)  # (block element, 1) per axis
    where = _unravel(tf.range(shape[2])[None, :], counts)  # (1, block) per axis
    pos = [w * s + o * d - p for w, s, o, d, p in zip(where, strides, offset, dilations, pads)]
    inside = tf.reduce_all(tf.stack([(p >= 0) & (p < d) for p, d in zip(pos, image)]), 0)
    flat = tf.add_n([p * math.prod(image[i + 1:]) for i, p in enumerate(pos)])
    onehot = tf.one_hot(tf.reshape(tf.where(inside, flat, -1), [-1]), math.prod(image),
                        dtype=x.dtype)
    y = tf.matmul(tf.reshape(x, [-1, size * shape[2]]), onehot)
    return to_inferred_shape(ctx, tf.reshape(y, tf.stack([shape[0], shape[1] // size, *image])))


@handler("Col2Im", since=18, limits="run-time image_shape or block_shape: one-hot matmul")
def col2im(ctx):
    image, block = ctx.const(1), ctx.const(2)
    n = ctx.shape(1)[0]
    dilations, pads, strides = (list(ctx.attr(name, [default] * k * n)) for name, default, k in
                                (("dilations", 1, 1), ("pads", 0, 2), ("strides", 1, 1)))
    if image is None or block is None:
        return _runtime_col2im(ctx, dilations, pads, strides)
    image, block = [int(d) for d in image], [int(d) for d in block]
    table = col2im_table(image, block, dilations, pads, strides)
    depth, blocks = _static_dims(ctx, ctx.shape(0)[1:], "channel and block counts")
    channels = depth // math.prod(block)
    x = tf.reshape(ctx.x(0), [-1, channels, depth * blocks // channels])
    x = tf.pad(x, [[0, 0], [0, 0], [0, 1]])  # the zero column the table pads with
    summed = tf.gather(x, ctx.const_tensor(table.ravel()), axis=2)
    summed = tf.reshape(summed, [-1, channels, *table.shape])
    return tf.reshape(tf.reduce_sum(summed, -1), [-1, channels, *image])


# --- CenterCropPad ---------------------------------------------------------------------------
@handler("CenterCropPad", since=18, layout=same_as_input(0))
def center_crop_pad(ctx):
    target = ctx.const(1)
    rank = ctx.rank(0)
    axes = [a % rank for a in ctx.attr("axes", range(rank))]
    if target is None or any(ctx.shape(0)[a] is None for a in axes):
        return _runtime_center_crop_pad(ctx, axes)
    dims = [int(ctx.shape(0)[a]) for a in axes]
    x = ctx.x(0)
    begin, size, pads = [0] * rank, [-1] * rank, [[0, 0] for _ in range(rank)]
    for axis, dim, want in zip(axes, dims, (int(t) for t in target)):
        phys = ctx.axis(axis)
        if want < dim:
            begin[phys], size[phys] = (dim - want) // 2, want
        elif want > dim:
            pads[phys] = [(want - dim) // 2, want - dim - (want - dim) // 2]
    if any(s != -1 for s in size):
        x = tf.slice(x, begin, size)
    if any(p != [0, 0] for p in pads):
        x = tf.pad(x, pads)
    return x


def _runtime_center_crop_pad(ctx, axes: list[int]):
    """The same crop (SLICE) and pad (PAD) with sizes computed at run time."""
    dims = shape_tensor(ctx)
    target = tf.cast(tf.reshape(scalar(ctx, 1), [-1]), tf.int32)
    want = tf.stack([target[axes.index(a)] if a in axes else dims[a] for a in range(ctx.rank(0))])
    want, dims = tf.gather(want, ctx.perm(0)), tf.gather(dims, ctx.perm(0))  # physical order
    grow = tf.maximum(want - dims, 0)
    x = tf.slice(ctx.x(0), tf.maximum(dims - want, 0) // 2, tf.minimum(dims, want))
    x = tf.pad(x, tf.stack([grow // 2, grow - grow // 2], axis=1))
    return to_inferred_shape(ctx, x)


# --- MaxUnpool -------------------------------------------------------------------------------
def _unpool_sizes(ctx) -> list:
    """Output spatial sizes: the output_shape input (ints, or int32 scalars at run time when
    neither it nor the inferred output shape is known), else from kernel, strides, pads."""
    output_shape, out = ctx.const(2), ctx.out_shape(0)
    if ctx.has(2):
        if output_shape is None and out is not None and None not in out[2:]:
            output_shape = out
        if output_shape is None:
            sizes = tf.cast(tf.reshape(ctx.x(2), [-1]), tf.int32)[2:]
            return tf.unstack(sizes, num=ctx.shape(2)[0] - 2)
        return [int(d) for d in output_shape[2:]]
    kernel = list(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides = list(ctx.attr("strides", [1] * n))
    pads = list(ctx.attr("pads", [0] * 2 * n))
    sizes = _static_dims(ctx, ctx.shape(0)[2:], "input spatial dims")
    return [(d - 1) * s - pads[i] - pads[n + i] + k
            for i, (d, s, k) in enumerate(zip(sizes, strides, kernel))]


@handler("MaxUnpool", since=9, layout=channel_last(0, 1),
         limits="static channel count; indices below 2^31; a repeated index must carry equal "
                "values (MaxPool's do)")
def max_unpool(ctx):
    sizes = _unpool_sizes(ctx)
    channels = _static_dims(ctx, [ctx.shape(0)[1]], "channel count")[0]
    spatial = math.prod(sizes)
    # ONNX indices run over (N, C, spatial...); rewrite them for (N, spatial..., C)
    index = tf.cast(tf.reshape(ctx.x(1), [-1, 1]), tf.int32)
    item, where = tf.math.floordiv(index, spatial), tf.math.floormod(index, spatial)
    batch, channel = tf.math.floordiv(item, channels), tf.math.floormod(item, channels)
    index = (batch * spatial + where) * channels + channel
    x = ctx.x(0)
    batch_size = ctx.shape(0)[0]
    count = (batch_size if batch_size is not None else tf.shape(x)[0]) * spatial * channels
    shape = [count] if isinstance(count, int) else tf.reshape(count, [1])
    y = tf.scatter_nd(index, tf.reshape(x, [-1]), shape)
    kernel, strides = ctx.attr("kernel_shape"), ctx.attr("strides", [1] * len(sizes))
    if any(k > s for k, s in zip(kernel, strides)):
        # overlapping windows may pick one input twice; MaxPool's duplicates hold one value
        hits = tf.scatter_nd(index, tf.ones_like(tf.reshape(x, [-1])), shape)
        y = y / tf.maximum(hits, 1)
    if isinstance(spatial, int):
        return tf.reshape(y, [-1, *sizes, channels])
    return tf.reshape(y, tf.stack([-1, *sizes, channels]))
