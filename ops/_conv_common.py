"""Shared convolution helpers (Conv, ConvTranspose, ConvInteger, QLinearConv,
DeformConv): ONNX-layout kernels moved to TF's layout, 1-D lifted to 2-D, groups.

Data is channel-last. A kernel is a numpy array when constant (its steps are folded at
conversion time) or a tensor of static shape when computed at run time (the same steps as
TF ops, picked by `array_module`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ._spatial import dilate_kernel


def array_module(w):
    """numpy for a constant kernel (folded at conversion time), tf for a run-time one."""
    return np if isinstance(w, np.ndarray) else tf


def kernel_tensor(ctx, kernel):
    """A kernel in TF's layout as a tensor: constants become model weights."""
    return ctx.const_tensor(kernel) if isinstance(kernel, np.ndarray) else kernel


def tf_kernel(ctx, w):
    """ONNX (A, B, k...) -> TF (k..., B, A): Conv's (O, I) and ConvTranspose's (I, O) alike."""
    rank = len(w.shape)
    return kernel_tensor(ctx, array_module(w).transpose(w, [*range(2, rank), 1, 0]))


def lift_1d(x, w, *per_axis):
    """1-D as 2-D: unit height on x and the kernel, and 1 prepended to per-axis lists."""
    return (tf.expand_dims(x, 1), array_module(w).expand_dims(w, 2),
            *([1, *v] for v in per_axis))


def per_group(x, w, groups: int, fn):
    """fn(x_part, w_part) for each channel group, concatenated on the channel axis."""
    if groups == 1:
        return fn(x, w)
    parts = zip(tf.split(x, groups, axis=-1), array_module(w).split(w, groups, axis=0))
    return tf.concat([fn(xi, wi) for xi, wi in parts], axis=-1)


def _conv(ctx, x, w, strides, dilations, padding):
    """Conv of channel-last x with an ONNX-layout kernel; grouped when the kernel's in
    channels are a fraction of x's (1-D and 2-D only: TF's CPU Conv3D is not grouped)."""
    if len(strides) == 1:
        x, w, strides, dilations = lift_1d(x, w, strides, dilations)
        return tf.squeeze(_conv(ctx, x, w, strides, dilations, padding), 1)
    if len(strides) == 3:  # the TFLite converter mis-infers dilated Conv3D shapes
        w, dilations = dilate_kernel(w, dilations), [1, 1, 1]
    op = tf.nn.conv2d if len(strides) == 2 else tf.nn.conv3d
    return op(x, tf_kernel(ctx, w), strides=[1, *strides, 1], padding=padding,
              dilations=[1, *dilations, 1])


def grouped_conv(ctx, x, w, groups: int, strides, dilations, padding):
    """Conv with groups: one CONV_2D with grouped filters (O, I / groups) in 1-D and 2-D,
    which XNNPACK runs faster than SPLIT + a CONV_2D per group + CONCATENATION; per group
    in 3-D (TF's CPU Conv3D is not grouped) and with -dgc (for runtimes without grouped
    convolution, e.g. TF.js)."""
    if len(strides) <= 2 and not ctx.options.disable_group_convolution:
        return _conv(ctx, x, w, strides, dilations, padding)
    return per_group(x, w, groups, lambda xi, wi: _conv(ctx, xi, wi, strides, dilations,
                                                       padding))


def depthwise_conv(ctx, x, w, strides, dilations, padding):
    """groups == in channels (1-D or 2-D): one depthwise conv with a channel multiplier."""
    if len(strides) == 1:
        x, w, strides, dilations = lift_1d(x, w, strides, dilations)
        return tf.squeeze(depthwise_conv(ctx, x, w, strides, dilations, padding), 1)
    if max(strides) > 1 and max(dilations) > 1:  # TF allows dilation only with stride 1
        w, dilations = dilate_kernel(w, dilations), [1, 1]
    xp, channels = array_module(w), x.shape[-1]
    kernel = xp.transpose(xp.reshape(w, [channels, -1, *w.shape[2:]]), [2, 3, 0, 1])
    return tf.nn.depthwise_conv2d(x, kernel_tensor(ctx, kernel), strides=[1, *strides, 1],
                                  padding=padding, dilations=dilations)
