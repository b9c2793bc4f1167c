"""Conv and ConvTranspose on channel-last tensors (1-D, 2-D, 3-D; groups; depthwise)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from onnx2tf_alt.layout import channel_last
from onnx2tf_alt.registry import handler
from onnx2tf_alt.ops._spatial import kernel_attrs, tf_padding


def _conv_kernel_nd(x, kernel, strides, dilations, padding):
    """tf.nn.convolution, with 1-D lifted to 2-D (TFLite has no 1-D conv)."""
    if len(strides) == 1:
        y = tf.nn.convolution(
            tf.expand_dims(x, 1),
            kernel[np.newaxis] if isinstance(kernel, np.ndarray) else tf.expand_dims(kernel, 0),
            strides=[1, strides[0]],
            dilations=[1, dilations[0]],
            padding=padding,
        )
        return tf.squeeze(y, 1)
    return tf.nn.convolution(x, kernel, strides=strides, dilations=dilations, padding=padding)


def _depthwise(ctx, x, w, strides, dilations, padding):
    """groups == in channels: one depthwise conv (kernel kh, kw, C, multiplier)."""
    out_ch, _, *k = w.shape
    channels = ctx.shape(0)[1]
    mult = out_ch // channels
    one_d = len(k) == 1
    if one_d:
        x = tf.expand_dims(x, 1)
        w = w[:, :, np.newaxis, :]
        strides, dilations = [1, strides[0]], [1, dilations[0]]
    kernel = w.reshape(channels, mult, *w.shape[2:]).transpose(2, 3, 0, 1)
    y = tf.nn.depthwise_conv2d(
        x, ctx.const_tensor(kernel), strides=[1, *strides, 1], padding=padding,
        dilations=dilations,
    )
    return tf.squeeze(y, 1) if one_d else y


@handler("Conv", layout=channel_last(0), limits="weights must be constant")
def conv(ctx):
    w = ctx.const(1)
    if w is None:
        raise NotImplementedError("Conv with run-time weights is not supported")
    w = w.astype(ctx.out_dtype().name if ctx.out_dtype() is not None else w.dtype)
    kernel_shape = list(ctx.attr("kernel_shape", w.shape[2:]))
    strides, dilations, pads = kernel_attrs(ctx, kernel_shape)
    spatial = ctx.shape(0)[2:]
    x, padding = tf_padding(ctx.x(0), pads, kernel_shape, strides, dilations, spatial)
    groups = ctx.attr("group", 1)
    channels = ctx.shape(0)[1]
    if groups == 1:
        kernel = ctx.const_tensor(np.moveaxis(w, [0, 1], [-1, -2]))
        y = _conv_kernel_nd(x, kernel, strides, dilations, padding)
    elif groups == channels and len(kernel_shape) <= 2:
        y = _depthwise(ctx, x, w, strides, dilations, padding)
    else:
        xs = tf.split(x, groups, axis=-1)
        ws = np.split(w, groups, axis=0)
        y = tf.concat(
            [
                _conv_kernel_nd(xi, ctx.const_tensor(np.moveaxis(wi, [0, 1], [-1, -2])),
                                strides, dilations, padding)
                for xi, wi in zip(xs, ws)
            ],
            axis=-1,
        )
    if ctx.has(2):
        y = tf.nn.bias_add(y, ctx.x(2))
    return y
