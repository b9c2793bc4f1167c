"""Shared helpers for ops with kernels and spatial axes (conv, pool): attributes and padding.

Spatial tensors here are channel-last, (N, spatial..., C); kernels and pads are per spatial
axis in ONNX order.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2tf_alt.translate.lazy import tf


def kernel_attrs(ctx, kernel_shape):
    """(strides, dilations, pads as [(begin, end)] per spatial axis) with ONNX defaults."""
    n = len(kernel_shape)
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    spatial = ctx.shape(0)[2:]
    pads = onnx_pads(ctx.attr("auto_pad", "NOTSET"), ctx.attr("pads"), spatial, kernel_shape,
                     strides, dilations)
    return strides, dilations, pads


def onnx_pads(auto_pad, pads, spatial, kernel, strides, dilations):
    """Explicit (begin, end) pads per spatial axis; None entries mean 'TF SAME at run time'."""
    n = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        result = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            if size is None:
                if auto_pad == "SAME_LOWER":
                    raise ValueError("auto_pad SAME_LOWER needs static spatial dims; use -ois")
                result.append(None)
                continue
            small, big = same_pads(size, k, s, d)
            result.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return result
    if auto_pad == "VALID" or not pads:
        return [(0, 0)] * n
    return list(zip(pads[:n], pads[n:]))


def same_pad_total(size: int, k: int, s: int, d: int) -> int:
    out = math.ceil(size / s)
    return max((out - 1) * s + (k - 1) * d + 1 - size, 0)


def same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    """TF SAME's (begin, end) pads: the odd one goes at the end (ONNX SAME_UPPER)."""
    total = same_pad_total(size, k, s, d)
    return total // 2, total - total // 2


def is_tf_same(pads, kernel, strides, dilations, spatial) -> bool:
    """Do these pads equal what TF's SAME padding adds (None: SAME at run time)? On a size
    known only at run time, at stride 1, where SAME adds (k - 1) d whatever the size."""
    return all(
        p is None or (size is not None and tuple(p) == same_pads(size, k, s, d))
        or (size is None and s == 1 and tuple(p) == same_pads(1, k, s, d))
        for p, size, k, s, d in zip(pads, spatial, kernel, strides, dilations)
    )


def pad_spatial(x, pads, pad_value=0.0):
    """tf.pad of the spatial axes of a channel-last tensor by [(begin, end)]."""
    if all(tuple(p) == (0, 0) for p in pads):
        return x
    paddings = [[0, 0]] + [list(p) for p in pads] + [[0, 0]]
    return tf.pad(x, paddings, constant_values=pad_value)


def replicate_edges(x, pads):
    """Pad the spatial axes of a channel-last tensor by [(begin, end)] copies of their edges,
    from slices and a concatenation per axis (TFLite STRIDED_SLICE and CONCATENATION, which
    XNNPACK runs; MIRROR_PAD it does not). Spatial sizes may be unknown; where every size is
    known the slices have explicit sizes (XNNPACK leaves a SLICE "to the end", size -1, to
    TFLite's reference kernel, splitting the partition)."""
    for axis, (begin, end) in enumerate(pads, start=1):
        parts = [*([_edge(x, axis, 0)] * begin if begin else []), x,
                 *([_edge(x, axis, -1)] * end if end else [])]
        x = tf.concat(parts, axis) if len(parts) > 1 else x
    return x


def _edge(x, axis: int, index: int):
    """The row `index` (0 or -1) of `x` along `axis`, keeping the axis."""
    shape = x.shape.as_list()
    if None in shape:
        return x[(*(slice(None),) * axis, slice(index, index + 1 or None))]
    return tf.slice(x, [index % shape[axis] if a == axis else 0 for a in range(len(shape))],
                    [1 if a == axis else d for a, d in enumerate(shape)])


def padding_plan(pads, kernel, strides, dilations, spatial):
    """('SAME'|'VALID', the pads to add explicitly first, or None): explicit pads only
    when TF's SAME does not match."""
    if all(p == (0, 0) for p in pads):
        return "VALID", None
    if is_tf_same(pads, kernel, strides, dilations, spatial):
        return "SAME", None
    return "VALID", pads


def tf_padding(x, pads, kernel, strides, dilations, spatial, pad_value=0.0):
    """Return (x, 'SAME'|'VALID'): x padded explicitly only when TF's SAME does not match."""
    padding, explicit = padding_plan(pads, kernel, strides, dilations, spatial)
    return (x if explicit is None else pad_spatial(x, explicit, pad_value)), padding


def dilate_kernel(w, dilations):
    """ONNX-layout kernel (O, I, k...) with (d - 1) zeros between taps: exact, no dilation.

    A numpy kernel is dilated at conversion time; a run-time one (static shape) with PAD and
    RESHAPE: each tap followed by d - 1 zeros, the trailing zeros cut off.
    """
    if all(d == 1 for d in dilations):
        return w
    if not isinstance(w, np.ndarray):
        return _dilate_tensor_kernel(w, dilations)
    taps = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilations)]
    out = np.zeros(w.shape[:2] + tuple(taps), dtype=w.dtype)
    out[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = w
    return out


def _dilate_tensor_kernel(w, dilations):
    """Each axis as (before, k, after): PAD a unit axis after the taps to d, merge, cut the
    trailing zeros (rank <= 4, which TFLite's PAD takes)."""
    shape = w.shape.as_list()
    if any(size is None for size in shape):
        raise NotImplementedError("dilated run-time kernels need a static shape")
    for axis, d in enumerate(dilations, start=2):
        if d == 1:
            continue
        before, k, after = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        w = tf.reshape(w, [before, k, 1, after])
        w = tf.pad(w, [[0, 0], [0, 0], [0, d - 1], [0, 0]])
        w = tf.slice(tf.reshape(w, [before, k * d, after]), [0, 0, 0], [-1, (k - 1) * d + 1, -1])
        shape[axis] = (k - 1) * d + 1
        w = tf.reshape(w, shape)
    return w


def pool_output_size(size: int, k: int, s: int, d: int, pads, ceil_mode: bool) -> int:
    """Pooled length along one axis, as onnxruntime computes it.

    With ceil_mode a last window that would start inside the end padding is dropped.
    """
    span = size + pads[0] + pads[1] - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + pads[0]:
        out -= 1
    return out


def taps_inside(out: int, k: int, s: int, d: int, begin: int, lo: int, hi: int) -> np.ndarray:
    """For each of `out` windows, how many of its k taps fall in [lo, hi) of the input axis."""
    pos = np.arange(out)[:, None] * s - begin + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def outer(per_axis, ufunc=np.multiply) -> np.ndarray:
    """Outer product (or sum, ...) of per-axis vectors: one value per output position."""
    result = np.asarray(ufunc.identity)
    for v in per_axis:
        result = ufunc.outer(result, v)
    return result
