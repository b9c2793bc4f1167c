"""DeformConv (opset 19): a convolution whose taps sample the input at learned offsets.

Channel-last throughout: X, offset and mask arrive (N, spatial..., C). Every tap of every
output point reads the input bilinearly at its shifted position (zero outside the image, as
onnxruntime): its 2**r corners are fetched with one GATHER from the flattened input, weighted
(MUL, SUM) and scaled by the mask. The sampled columns then meet the kernel in one matrix
product, the kernel laid out (and grouped) to match the columns' order, so that neither the
data nor the columns are ever transposed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from onnx2tf_alt.ops._conv_common import array_module, kernel_tensor

from onnx2tf_alt.layout.policies import channel_last
from onnx2tf_alt.translate.context import reshape
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


def _static(ctx, dims, what: str) -> list[int]:
    if dims is None or any(d is None for d in dims):
        raise NotImplementedError(f"DeformConv needs static {what}; set them with -ois")
    return [int(d) for d in dims]


def _grid(steps) -> np.ndarray:
    """(points, r): every combination of the per-axis positions, last axis fastest."""
    return np.stack(np.meshgrid(*steps, indexing="ij"), -1).reshape(-1, len(steps))


def _tap_positions(out, kernel, strides, dilations, pads_begin, offset_groups: int):
    """(points * G * taps, r): the unshifted input position of every tap of every output
    point, for each offset group (the order of the offset's channels)."""
    starts = _grid([np.arange(o) * s - p for o, s, p in zip(out, strides, pads_begin)])
    taps = _grid([np.arange(k) * d for k, d in zip(kernel, dilations)])
    positions = starts[:, None, None] + taps[None, None]  # (points, 1, taps, r)
    positions = np.broadcast_to(positions, (len(starts), offset_groups, *taps.shape))
    return positions.reshape(-1, len(out)).astype(np.float32)


def _corners(points, sizes: list[int]):
    """Bilinear corners of `points` (..., r): flat index (int32) and weight, (..., 2**r);
    corners outside the image weigh 0 (their index is clipped to stay valid)."""
    rank = len(sizes)
    combos = np.array(list(itertools.product([0, 1], repeat=rank)), np.float32)  # (2**r, r)
    base = tf.floor(points)
    fraction = tf.expand_dims(points - base, -2)
    index = tf.expand_dims(base, -2) + combos
    clipped = tf.clip_by_value(index, 0.0, np.array(sizes, np.float32) - 1)
    inside = tf.cast(tf.equal(index, clipped), tf.float32)
    weight = tf.reduce_prod((combos * fraction + (1 - combos) * (1 - fraction)) * inside, -1)
    strides = np.array([math.prod(sizes[a + 1:]) for a in range(rank)], np.int32)
    return tf.reduce_sum(tf.cast(clipped, tf.int32) * strides, -1), weight


def _column_weights(w, groups: int, offset_groups: int):
    """ONNX kernel (O, C/g, k...) -> (C * taps, O) rows ordered like the sampled columns:
    (offset group, tap, channel within it); zero where channel and output differ in group."""
    xp = array_module(w)
    out_ch, group_ch = w.shape[0], w.shape[1]
    taps = math.prod(w.shape[2:])
    w = xp.transpose(xp.reshape(w, [groups, out_ch // groups, group_ch, taps]), [0, 2, 3, 1])
    if groups > 1:  # block diagonal: (g, C/g, taps, g', O/g) nonzero only where g == g'
        eye = np.eye(groups, dtype=np.float32).reshape(groups, 1, 1, groups, 1)
        w = xp.expand_dims(w, 3) * eye
    channels = groups * group_ch
    w = xp.reshape(w, [offset_groups, channels // offset_groups, taps, out_ch])
    return xp.reshape(xp.transpose(w, [0, 2, 1, 3]), [channels * taps, out_ch])


def _kernel(ctx):
    """W (O, C/g, k...) as float32: a numpy array when constant, else a tensor."""
    w = ctx.const(1)
    if w is not None:
        return w.astype(np.float32)
    _static(ctx, ctx.shape(1), "weight dims")
    return tf.cast(ctx.x(1), tf.float32)


def _geometry(ctx, sizes, kernel):
    """(strides, dilations, begin pads, output sizes), with the ONNX defaults."""
    rank = len(sizes)
    strides = ctx.attr("strides", [1] * rank)
    dilations = ctx.attr("dilations", [1] * rank)
    pads = ctx.attr("pads", [0] * 2 * rank)
    out = [(n + pads[a] + pads[a + rank] - (k - 1) * d - 1) // s + 1
           for a, (n, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations))]
    return strides, dilations, pads[:rank], out


def _sample(ctx, sizes, channels: int, kernel):
    """(columns (N * points, G * taps * C/G), output sizes): every tap of every output point
    sampled bilinearly at its shifted position, times its mask; columns ordered (offset
    group, tap, channel)."""
    rank, offset_groups, taps = len(sizes), ctx.attr("offset_group", 1), math.prod(kernel)
    strides, dilations, begins, out = _geometry(ctx, sizes, kernel)
    # all M samples (point, offset group, tap) of an item in one axis: rank <= 4 for TFLite
    samples = math.prod(out) * offset_groups * taps
    offset = reshape(tf.cast(ctx.x(2), tf.float32), [None, samples, rank])
    points = offset + _tap_positions(out, kernel, strides, dilations, begins, offset_groups)
    index, weight = _corners(points, sizes)  # (N, M, 2**r)
    if ctx.has(4):
        weight = weight * reshape(tf.cast(ctx.x(4), tf.float32), [None, samples, 1])
    # rows of the flattened input: (batch item, position, offset group), C/G channels each
    group = np.tile(np.repeat(np.arange(offset_groups, dtype=np.int32), taps), math.prod(out))
    rows = index * offset_groups + group.reshape(-1, 1)
    rows = rows + _batch_rows(ctx, rows, math.prod(sizes) * offset_groups)
    flat = tf.reshape(tf.cast(ctx.x(0), tf.float32), [-1, channels // offset_groups])
    sampled = tf.reduce_sum(tf.gather(flat, rows) * tf.expand_dims(weight, -1), -2)
    return tf.reshape(sampled, [-1, channels * taps]), out


@handler("DeformConv", since=19, layout=channel_last(0, 2, 4),
         limits="2-D (as onnxruntime); static input spatial dims and channels; run-time "
                "weights need a static shape")
def deform_conv(ctx):
    sizes = _static(ctx, ctx.shape(0)[2:], "input spatial dims")
    if len(sizes) != 2:  # the sampling is N-D, but no reference checks other ranks
        raise NotImplementedError(f"DeformConv on {len(sizes)}-D data (2-D only)")
    channels = _static(ctx, ctx.shape(0)[1:2], "channels")[0]
    w = _kernel(ctx)
    columns, out = _sample(ctx, sizes, channels, [int(k) for k in w.shape[2:]])
    matrix = _column_weights(w, ctx.attr("group", 1), ctx.attr("offset_group", 1))
    y = tf.matmul(columns, kernel_tensor(ctx, matrix))
    if ctx.has(3):
        y = tf.nn.bias_add(y, tf.cast(ctx.x(3), tf.float32))
    return reshape(y, [None, *out, int(w.shape[0])])


def _batch_rows(ctx, rows, per_item: int):
    """First row of each batch item in the flattened input, shaped to broadcast over rows."""
    rank = rows.shape.rank
    batch = ctx.shape(0)[0]
    if batch is not None:
        return np.arange(batch, dtype=np.int32).reshape((-1,) + (1,) * (rank - 1)) * per_item
    starts = tf.range(tf.shape(rows)[0]) * per_item
    return tf.reshape(starts, [-1] + [1] * (rank - 1))
