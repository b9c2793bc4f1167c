"""Shared convolution helpers (Conv, ConvTranspose, ConvInteger, QLinearConv,
DeformConv): ONNX-layout kernels moved to TF's layout, 1-D lifted to 2-D, groups.

Data is channel-last. A kernel is a numpy array when constant (its steps are folded at
conversion time) or a tensor of static shape when computed at run time (the same steps as
TF ops, picked by `array_module`).
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.translate.lazy import tf

from ._dtypes import rounded_conv
from ._shapes import phase_slice
from ._spatial import dilate_kernel, pad_spatial, same_pads


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
    return rounded_conv(op, x, tf_kernel(ctx, w), strides=[1, *strides, 1], padding=padding,
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
    # TF may have lost x's channels through a reshape to a computed shape (a channel
    # shuffle of run-time size); the graph keeps them
    xp, channels = array_module(w), x.shape[-1] or ctx.shape(0)[1]
    kernel = xp.transpose(xp.reshape(w, [channels, -1, *w.shape[2:]]), [2, 3, 0, 1])
    kh, kw = kernel.shape[:2]
    if kh * kw > MAX_DEPTHWISE_TAPS and all(d is not None for d in x.shape[1:3]):
        return _tiled_depthwise(ctx, x, kernel, strides, dilations, padding)
    return depthwise_conv2d(ctx, x, kernel, strides, dilations, padding)


def depthwise_conv2d(ctx, x, kernel, strides, dilations, padding):
    """tf.nn.depthwise_conv2d of channel-last x with a kernel in TF's layout (an array or
    a tensor). Row and column strides that differ are rejected by TF's CPU kernel where it
    runs without oneDNN (e.g. on AMD CPUs: "Current implementation only supports equal
    length strides"). An axis of size 1 under a 1-tap kernel (a lifted 1-D conv) has one
    output whatever its stride, so it takes the other's; otherwise the conv runs at the
    smaller stride, with SAME's pads made explicit, and the other axis is subsampled."""
    spatial, taps = list(x.shape[1:3]), kernel.shape[:2]
    strides = list(strides)
    for axis in (0, 1):
        if spatial[axis] == 1 and taps[axis] == 1:
            strides[axis] = strides[1 - axis]
    if strides[0] == strides[1]:
        return rounded_conv(tf.nn.depthwise_conv2d, x, kernel_tensor(ctx, kernel),
                            strides=[1, *strides, 1], padding=padding, dilations=dilations)
    if padding == "SAME":
        if any(size is None for size in spatial):
            raise NotImplementedError("a depthwise conv with unequal strides and SAME padding "
                                      "needs static spatial sizes")
        x = pad_spatial(x, [same_pads(size, k, s, d) for size, k, s, d in
                            zip(spatial, taps, strides, dilations)])
    low = min(strides) if all(s % min(strides) == 0 for s in strides) else 1
    y = rounded_conv(tf.nn.depthwise_conv2d, x, kernel_tensor(ctx, kernel),
                     strides=[1, low, low, 1], padding="VALID", dilations=dilations)
    steps = [1, strides[0] // low, strides[1] // low, 1]
    # subsampled by a slice XNNPACK takes where it can (a strided STRIDED_SLICE it does not)
    full = (1 << 4) - 1
    phased = phase_slice(y, [0] * 4, [0] * 4, steps, full, full)
    if phased is not None:
        return phased
    return tf.strided_slice(y, [0] * 4, [0] * 4, steps, begin_mask=full, end_mask=full)


# XNNPACK's depthwise convolution is fast up to 25 taps and falls off a cliff above: a 7x7
# one on 1x56x56x96 took 10-26 ms at 1 thread (5x5: 0.49 ms, 3x7: 0.51 ms, 4x7: 19 ms;
# onnxruntime 0.47 ms for the 7x7), so ConvNeXt spent half its time in them.
MAX_DEPTHWISE_TAPS = 25


def _tiled_depthwise(ctx, x, kernel, strides, dilations, padding):
    """A depthwise conv with more than MAX_DEPTHWISE_TAPS taps as a sum of depthwise convs
    over bands of kernel rows (each at most that many taps), each reading the slice of the
    padded input its rows reach: exact up to the order of the sums. 7x7 becomes 3x7 + 3x7 +
    1x7, measured 4-6x faster than the one conv (1x56x56x96: 1.9-6.3 ms against 10-26 ms)."""
    pads, bands = depthwise_bands(x.shape[1:3], kernel.shape[:2], strides, dilations, padding)
    if pads is not None:
        x = pad_spatial(x, pads)
    total = None
    for (r0, r1, c0, c1), begin, extent in bands:
        part = tf.nn.depthwise_conv2d(
            x[:, begin[0]:begin[0] + extent[0], begin[1]:begin[1] + extent[1]],
            kernel_tensor(ctx, kernel[r0:r1, c0:c1]), strides=[1, *strides, 1],
            padding="VALID", dilations=dilations)
        total = part if total is None else total + part
    return total


def depthwise_bands(spatial, taps, strides, dilations, padding: str):
    """_tiled_depthwise's plan: (SAME's explicit pads or None, [((r0, r1, c0, c1) kernel
    rows and columns, begin, extent) of the padded input, per band])."""
    (kh, kw), pads = taps, None
    if padding == "SAME":
        pads = [same_pads(size, k, s, d) for size, k, s, d in
                zip(spatial, (kh, kw), strides, dilations)]
        spatial = [size + b + e for size, (b, e) in zip(spatial, pads)]
    out_sizes = [(size - (k - 1) * d - 1) // s + 1
                 for size, k, s, d in zip(spatial, (kh, kw), strides, dilations)]
    rows = max(1, MAX_DEPTHWISE_TAPS // kw)
    cols = min(kw, MAX_DEPTHWISE_TAPS)
    bands = []
    for r0 in range(0, kh, rows):
        for c0 in range(0, kw, cols):
            r1, c1 = min(r0 + rows, kh), min(c0 + cols, kw)
            begin = [r0 * dilations[0], c0 * dilations[1]]
            extent = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in
                      zip(out_sizes, strides, (r1 - r0, c1 - c0), dilations)]
            bands.append(((r0, r1, c0, c1), begin, extent))
    return pads, bands
