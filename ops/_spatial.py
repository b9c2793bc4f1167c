"""Shared helpers for ops with kernels and spatial axes (conv, pool): attributes and padding."""

from __future__ import annotations

import math

import tensorflow as tf


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
            total = same_pad_total(size, k, s, d)
            small, big = total // 2, total - total // 2
            result.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return result
    if auto_pad == "VALID" or not pads:
        return [(0, 0)] * n
    return list(zip(pads[:n], pads[n:]))


def same_pad_total(size: int, k: int, s: int, d: int) -> int:
    out = math.ceil(size / s)
    return max((out - 1) * s + (k - 1) * d + 1 - size, 0)


def tf_padding(x, pads, kernel, strides, dilations, spatial, pad_value=0.0):
    """Return (x, 'SAME'|'VALID'): x padded explicitly only when TF's SAME does not match.

    x is channel-last (N, spatial..., C).
    """
    if all(p is None for p in pads):
        return x, "SAME"
    if all(p == (0, 0) for p in pads):
        return x, "VALID"
    if all(
        size is not None
        and p == (same_pad_total(size, k, s, d) // 2,
                  same_pad_total(size, k, s, d) - same_pad_total(size, k, s, d) // 2)
        for p, size, k, s, d in zip(pads, spatial, kernel, strides, dilations)
    ):
        return x, "SAME"
    paddings = [[0, 0]] + [list(p) for p in pads] + [[0, 0]]
    return tf.pad(x, paddings, constant_values=pad_value), "VALID"
