"""Conv, ConvTranspose and CausalConvWithState on channel-last tensors (1-D, 2-D, 3-D;
groups; depthwise).

1-D runs as 2-D with a unit height (TFLite has no 1-D conv); 3-D Conv as 2-D convs over
frames (ops/_conv3d.py: XNNPACK takes no CONV_3D). Constant kernels are moved to
TF's layout at conversion time, so the TFLite model holds no TRANSPOSE. Run-time kernels (a
graph input, or computed) take the same path with the same numpy-style steps done by TF ops
(ops/_conv_common.py): only the kernel is transposed, the data stays channel-last.
"""

from __future__ import annotations

import numpy as np
from onnx2tf_alt.ops._conv3d import conv3d_by_frames, lowers_to_2d
from onnx2tf_alt.ops._conv_common import (
    MAX_DEPTHWISE_TAPS,
    depthwise_bands,
    depthwise_conv,
    grouped_conv,
    lift_1d,
    per_group,
    tf_kernel,
)
from onnx2tf_alt.ops._dtypes import compute_dtype
from onnx2tf_alt.ops._spatial import (
    dilate_kernel,
    kernel_attrs,
    pad_spatial,
    padding_plan,
    tf_padding,
)

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import Decision, channel_last, custom_policy
from onnx2tf_alt.tflite import direct as direct_writer
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.tflite.direct_tensors import DirectOps
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler


def _weights(ctx):
    """Input 1, the ONNX-layout kernel, in the output dtype: a numpy array when constant,
    else a tensor (whose shape must be static)."""
    w, dtype = ctx.const(1), ctx.out_dtype()
    if w is not None:
        return w if dtype is None else w.astype(dtype)
    w = ctx.x(1)
    if any(d is None for d in w.shape):
        raise NotImplementedError(f"{ctx.node.op_type} with run-time weights needs their "
                                  "static shape")
    return w if dtype is None or w.dtype == dtype else tf.cast(w, dtype)


def _bias(ctx, y):
    return tf.nn.bias_add(y, ctx.x(2)) if ctx.has(2) else y


_CHANNEL_LAST = channel_last(0)


def _pointwise(node: Node, graph: Graph) -> bool:
    """A 1x1 (any rank) conv with stride 1 and no pads: a dense layer over the channel axis,
    indifferent to the order of the other axes."""
    weights = graph.shapes.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if weights is None or any(k != 1 for k in weights[2:]):
        return False
    attrs = node.attrs
    spatial = len(weights) - 2
    return (all(s == 1 for s in attrs.get("strides", [1] * spatial))
            and not any(attrs.get("pads", [0] * 2 * spatial))
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", b"NOTSET", b"VALID"))


@custom_policy(channel_last_if=lambda node, graph: True)
def conv_layout(node: Node, graph: Graph, in_perms):
    """Channel-last; a pointwise conv also takes its data input in any perm that has the
    channel axis last (e.g. a DFL head's softmax over bins laid out (N, A, 4, bins)) and
    gives its output the same perm, instead of asking for a transpose."""
    arrived = in_perms[0]
    if arrived is not None and len(arrived) > 2 and arrived[-1] == 1 and _pointwise(node, graph):
        rest = [None if p is None else P.identity(len(p)) for p in in_perms[1:]]
        return Decision([arrived, *rest], [arrived])
    return _CHANNEL_LAST.decide(node, graph, in_perms)


@handler("Conv", layout=conv_layout,
         limits="run-time weights need a static shape; SAME_LOWER needs static spatial dims")
def conv(ctx):
    w = _weights(ctx)
    kernel = list(w.shape[2:])
    strides, dilations, pads = kernel_attrs(ctx, kernel)
    spatial = ctx.shape(0)[2:]
    groups = ctx.attr("group", 1)
    if lowers_to_2d(ctx.x(0), pads):  # CONV_3D is not on XNNPACK
        bias = ctx.x(2) if ctx.has(2) else None
        return conv3d_by_frames(ctx, ctx.x(0), w, bias, groups, strides, dilations, pads)
    x, padding = tf_padding(ctx.x(0), pads, kernel, strides, dilations, spatial)
    if groups > 1 and groups == ctx.shape(0)[1] and len(kernel) <= 2:
        return _bias(ctx, depthwise_conv(ctx, x, w, strides, dilations, padding))
    pieces = _cache_pieces(ctx, w, groups, len(kernel))
    if pieces > 1:
        biases = np.split(ctx.const(2), pieces) if ctx.has(2) else [None] * pieces
        parts = [grouped_conv(ctx, x, wi, 1, strides, dilations, padding)
                 for wi in np.split(w, pieces)]
        return _channel_concat([y if b is None else tf.nn.bias_add(y, ctx.const_tensor(b))
                                for y, b in zip(parts, biases)])
    return _bias(ctx, grouped_conv(ctx, x, w, groups, strides, dilations, padding))


@direct("Conv")
def conv_direct(ctx):
    """The 1-D and 2-D Conv of `conv` with constant weights: one CONV_2D (groups in its
    filter) or DEPTHWISE_CONV_2D, after a PAD where TF's SAME does not match the pads; 1-D
    as lift_1d lifts it, between RESHAPEs to and from unit height."""
    w, bias = ctx.const(1), ctx.const(2) if ctx.has(2) else None
    if w is None or (ctx.has(2) and bias is None):
        raise NotCovered("run-time weights")
    if w.ndim not in (3, 4):
        raise NotCovered("3-D convolutions")
    w = w.astype(np.float32, copy=False)
    kernel, groups = list(w.shape[2:]), ctx.attr("group", 1)
    strides, dilations, pads = kernel_attrs(ctx, kernel)
    padding, explicit = padding_plan(pads, kernel, strides, dilations, ctx.shape(0)[2:])
    if any(p is None for p in explicit or ()):
        raise NotCovered("SAME_LOWER pads known at run time")
    x = ctx.x(0)
    if explicit is not None:
        x = direct_writer.pad_spatial(ctx, x, explicit)
    bias = np.zeros(w.shape[0], np.float32) if bias is None else bias.astype(np.float32)
    if w.ndim == 4:
        return _conv2d_direct(ctx, x, w, bias, strides, dilations, padding, groups)
    if groups > 1 and groups == ctx.shape(0)[1] and kernel[0] > MAX_DEPTHWISE_TAPS:
        raise NotCovered("a 1-D depthwise convolution in bands of taps")
    shape, out_shape = ctx.flat.shape(x), ctx.out_phys_shape()
    lifted = ctx.temp((shape[0], 1, *shape[1:]), "lifted")
    ctx.reshape(x, (shape[0], 1, *shape[1:]), lifted)
    y = ctx.temp((out_shape[0], 1, *out_shape[1:]), "conv")
    _conv2d_direct(ctx, lifted, w[:, :, None], bias, [1, *strides], [1, *dilations], padding,
                   groups, y)
    out = ctx.output()
    ctx.reshape(y, out_shape, out)
    return out


def _conv2d_direct(ctx, x, w, bias, strides, dilations, padding, groups,
                   lifted_out: int | None = None) -> int:
    """conv_direct's 2-D convolution of (padded) x into the node's output, or into
    `lifted_out` for a 1-D one lifted to unit height."""
    kernel, out_channels = list(w.shape[2:]), w.shape[0]
    common = {"padding": direct_writer.PADDING[padding], "strideH": strides[0],
              "strideW": strides[1], "dilationHFactor": dilations[0],
              "dilationWFactor": dilations[1], "fusedActivationFunction": 0}
    if groups > 1 and groups == ctx.flat.shape(x)[3]:
        if lifted_out is not None and kernel[0] == 1:  # as depthwise_conv2d: height 1
            strides = [strides[1], strides[1]]
            common["strideH"] = strides[1]
        if max(strides) > 1 and max(dilations) > 1:
            raise NotCovered("a strided, dilated depthwise convolution")
        # unequal strides too: TFLite's kernel and XNNPACK's take them (TF's CPU kernel, which
        # the handler's code serves, does not: it runs at stride 1 and subsamples, twice the
        # work; the PP-OCRv4 classifier's four (2, 1) ones)
        # ONNX (C * m, 1, kh, kw) -> TFLite (1, kh, kw, C * m): output channel c * m + k
        filt = np.transpose(w.reshape(out_channels, *kernel), [1, 2, 0])[None]
        common["depthMultiplier"] = out_channels // groups
        if kernel[0] * kernel[1] > MAX_DEPTHWISE_TAPS:
            return _tiled_depthwise_direct(ctx, x, filt, bias, strides, dilations, padding,
                                           common)
        out = ctx.output() if lifted_out is None else lifted_out
        ctx.op("DEPTHWISE_CONV_2D", [x, ctx.weight(filt), ctx.weight(bias, "bias")], out,
               options("DepthwiseConv2DOptions", **common))
        return out
    if groups > 1 and ctx.options.disable_group_convolution:
        raise NotCovered("-dgc: convolutions per group")
    filt = np.transpose(w, [0, 2, 3, 1])  # ONNX (O, I / g, kh, kw) -> TFLite (O, kh, kw, I / g)
    conv_options = options("Conv2DOptions", **common)
    pieces = 1 if lifted_out is not None else _cache_pieces(ctx, w, groups, 2)
    if pieces > 1:  # as conv: slices of the output channels, concatenated in a tree
        ops = DirectOps(ctx)
        shape = (*ctx.out_phys_shape()[:-1], out_channels // pieces)
        parts = []
        for k, (f, b) in enumerate(zip(np.split(filt, pieces), np.split(bias, pieces))):
            part = ctx.temp(shape, f"piece{k}")
            ctx.op("CONV_2D", [x, ctx.weight(f), ctx.weight(b, "bias")], part, conv_options)
            parts.append(ops.node_value(part))
        return ops.outputs([_channel_concat(parts, ops.concat)])[0]
    out = ctx.output() if lifted_out is None else lifted_out
    ctx.op("CONV_2D", [x, ctx.weight(filt), ctx.weight(bias, "bias")], out, conv_options)
    return out


def _tiled_depthwise_direct(ctx, x, filt, bias, strides, dilations, padding, common) -> int:
    """_tiled_depthwise in the direct writer: a DEPTHWISE_CONV_2D per band of kernel rows on
    a SLICE of the (padded) input, ADDed in order; the bias goes into the last band's conv
    (where TF's converter puts it)."""
    spatial = ctx.flat.shape(x)[1:3]
    if any(size is None for size in spatial):
        raise NotCovered("a tiled depthwise convolution of spatial sizes known at run time")
    pads, bands = depthwise_bands(spatial, filt.shape[1:3], strides, dilations, padding)
    if pads is not None:
        x = direct_writer.pad_spatial(ctx, x, pads)
    out_shape, channels = ctx.out_phys_shape(), filt.shape[-1]
    valid = {**common, "padding": direct_writer.PADDING["VALID"]}
    total = None
    for k, ((r0, r1, c0, c1), begin, extent) in enumerate(bands):
        last = k == len(bands) - 1
        band = ctx.temp((ctx.flat.shape(x)[0], *extent, ctx.flat.shape(x)[3]), f"band{k}")
        ctx.op("SLICE", [x, ctx.ints([0, *begin, 0], "begin"), ctx.ints([-1, *extent, -1],
                                                                        "size")], band)
        part = ctx.temp(out_shape, f"part{k}")
        shift = bias if last else np.zeros(channels, np.float32)
        ctx.op("DEPTHWISE_CONV_2D", [band, ctx.weight(filt[:, r0:r1, c0:c1], f"weight{k}"),
                                     ctx.weight(shift, f"bias{k}")],
               part, options("DepthwiseConv2DOptions", **valid))
        if total is not None:
            summed = ctx.output() if last else ctx.temp(out_shape, f"sum{k}")
            ctx.op("ADD", [total, part], summed,
                   options("AddOptions", fusedActivationFunction=0))
            part = summed
        total = part
    return total


# A 2-D conv whose weights exceed SPLIT_ABOVE runs as convolutions over slices of its
# output channels of at most CACHE_BYTES each, concatenated: XNNPACK streams a conv's whole
# packed weights for every tile of output pixels, and weights that stay in the CPU's caches
# run faster. Measured at 1 thread (AMD EPYC, 32 MiB L3): 3x3 2048->512 at 28x28 (37.7 MB,
# FCN-ResNet50's head) 235 ms as one CONV_2D, 123-132 ms as 16 slices of 2.4 MB, and the
# whole FCN-ResNet50 1.96 -> 1.14x onnxruntime. Smaller weights are left alone: 3x3
# 512->512 (9.4 MB) was faster split alone at 7x7 (4.9 -> 1.8 ms), the same at 14x14, and
# ResNet-50 with its layer4 split measured no faster. Each output channel is computed as
# before, so the values are the same.
SPLIT_ABOVE = 16 * 2**20
CACHE_BYTES = 4 * 2**20


def _channel_concat(parts: list, concat=None, fan_in: int = 4):
    """Concatenate on the channel axis in a tree of at most `fan_in` inputs a node: the
    XNNPACK delegate leaves a CONCATENATION of more inputs (16 measured) to the builtin
    kernel, which cuts the graph into two partitions. `concat`: tf.concat, or the direct
    writer's (tflite/direct_tensors.DirectOps)."""
    concat = tf.concat if concat is None else concat
    while len(parts) > 1:
        parts = [concat(parts[i:i + fan_in], axis=-1) if len(parts[i:i + fan_in]) > 1
                 else parts[i] for i in range(0, len(parts), fan_in)]
    return parts[0]


def _cache_pieces(ctx, w, groups: int, rank: int) -> int:
    """How many output-channel slices a plain 2-D conv with constant weights (and bias)
    runs as: 1 up to SPLIT_ABOVE, else the fewest power of two that brings each slice
    under CACHE_BYTES, keeping at least 32 channels a slice."""
    if groups != 1 or rank != 2 or not isinstance(w, np.ndarray) or (
            ctx.has(2) and ctx.const(2) is None) or w.nbytes <= SPLIT_ABOVE:
        return 1
    pieces = 1
    while (w.nbytes / pieces > CACHE_BYTES and w.shape[0] % (2 * pieces) == 0
           and w.shape[0] // (2 * pieces) >= 32):
        pieces *= 2
    return pieces


def _transpose_crop(ctx, sizes, kernel, strides, output_padding):
    """(begin, length) of the ONNX output within the full transposed-conv output, per axis.

    `kernel` is the dilated extent; the full length is s * (in - 1) + k + output_padding.
    output_shape or SAME auto_pad fix the length and imply the pads (odd one at the start
    except for SAME_UPPER, as the spec and onnxruntime do). SAME asks for in * s, but pads
    never go below zero, so where the kernel is shorter than the stride the output keeps
    the full length instead (as onnxruntime).
    """
    n = len(kernel)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    natural = [s * (size - 1) + k + extra
               for size, k, s, extra in zip(sizes, kernel, strides, output_padding)]
    output_shape = ctx.attr("output_shape")
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = ctx.attr("pads") if auto_pad == "NOTSET" else None
        pads = list(zip(pads[:n], pads[n:])) if pads else [(0, 0)] * n
        return [(b, full - b - e) for full, (b, e) in zip(natural, pads)]
    if output_shape is not None:
        wanted = list(output_shape)[-n:]
    else:
        wanted = [min(size * s, full) for size, s, full in zip(sizes, strides, natural)]
    result = []
    for full, out in zip(natural, wanted):
        total = max(full - out, 0)
        result.append((total // 2 if auto_pad == "SAME_UPPER" else total - total // 2, out))
    return result


def _conv_transpose(ctx, x, w, strides, lengths, padding):
    """TF transposed conv (no dilation) of channel-last x to spatial `lengths`."""
    if len(strides) == 1:
        x, w, strides, lengths = lift_1d(x, w, strides, lengths)
        return tf.squeeze(_conv_transpose(ctx, x, w, strides, lengths, padding), 1)
    dims = [*lengths, w.shape[1]]
    if x.shape[0] is not None and not any(tf.is_tensor(d) for d in dims):
        shape = [x.shape[0], *dims]
    else:
        shape = tf.stack([x.shape[0] or tf.shape(x)[0], *dims])
    op = tf.nn.conv2d_transpose if len(strides) == 2 else tf.nn.conv3d_transpose
    return op(x, tf_kernel(ctx, w), shape, strides=[1, *strides, 1], padding=padding)


@handler("ConvTranspose", layout=channel_last(0),
         limits="static spatial dims; run-time weights need a static shape")
def conv_transpose(ctx):
    w = _weights(ctx)
    n = len(w.shape) - 2
    strides = list(ctx.attr("strides", [1] * n))
    w = dilate_kernel(w, ctx.attr("dilations", [1] * n))  # TF and TFLite lack the dilation
    kernel = list(w.shape[2:])
    output_padding = list(ctx.attr("output_padding", [0] * n))
    sizes = ctx.shape(0)[2:]
    if any(size is None for size in sizes):
        padding, lengths = _run_time_lengths(ctx, kernel, strides, output_padding)
        y = per_group(ctx.x(0), w, ctx.attr("group", 1), lambda xi, wi: _conv_transpose(
            ctx, xi, wi, strides, lengths, padding))
        return _bias(ctx, y)
    crop = _transpose_crop(ctx, sizes, kernel, strides, output_padding)
    if all(_is_tf_same_crop(*axis) for axis in zip(sizes, kernel, strides, crop)):
        padding, lengths = "SAME", [m for _, m in crop]
    else:
        padding, lengths = "VALID", _valid_lengths(sizes, kernel, strides, crop)
    y = per_group(ctx.x(0), w, ctx.attr("group", 1), lambda xi, wi: _conv_transpose(
        ctx, xi, wi, strides, lengths, padding))
    return _bias(ctx, y if padding == "SAME" else _crop(y, crop, lengths))


@direct("ConvTranspose")
def conv_transpose_direct(ctx):
    """conv_transpose's 2-D case of constant weights and one group: one TRANSPOSE_CONV with
    the bias where TF's SAME padding crops as ONNX does, else a VALID one, cropped (_crop's
    PAD and SLICE), and an ADD of the bias."""
    w, bias = ctx.const(1), ctx.const(2) if ctx.has(2) else None
    if w is None or (ctx.has(2) and bias is None):
        raise NotCovered("run-time weights")
    if w.ndim != 4 or ctx.attr("group", 1) != 1:
        raise NotCovered("1-D, 3-D or grouped transposed convolutions")
    strides = list(ctx.attr("strides", [1, 1]))
    w = dilate_kernel(w.astype(np.float32, copy=False), ctx.attr("dilations", [1, 1]))
    kernel, sizes = list(w.shape[2:]), ctx.shape(0)[2:]
    batch = ctx.flat.shape(ctx.x(0))[0]
    if batch is None or None in sizes:
        raise NotCovered("a transposed convolution of a batch or spatial dims known at run time")
    crop = _transpose_crop(ctx, sizes, kernel, strides, list(ctx.attr("output_padding", [0, 0])))
    same = all(_is_tf_same_crop(*axis) for axis in zip(sizes, kernel, strides, crop))
    lengths = [m for _, m in crop] if same else _valid_lengths(sizes, kernel, strides, crop)
    out_channels = w.shape[1]
    bias = np.zeros(out_channels, np.float32) if bias is None else bias.astype(np.float32)
    out = ctx.output()
    full = out if same else ctx.temp((batch, *lengths, out_channels), "full")
    # ONNX (I, O, kh, kw) -> TFLite (O, kh, kw, I); the bias goes in after a crop
    ctx.op("TRANSPOSE_CONV", [ctx.ints([batch, *lengths, out_channels], "shape"),
                              ctx.weight(np.transpose(w, [1, 2, 3, 0])), ctx.x(0),
                              ctx.weight(bias if same else np.zeros_like(bias), "bias")], full,
           options("TransposeConvOptions", padding=direct_writer.PADDING["SAME" if same else "VALID"],
                   strideH=strides[0], strideW=strides[1], fusedActivationFunction=0))
    if same:
        return out
    pads, sliced = _crop_plan(crop, lengths)
    y = direct_writer.pad_spatial(ctx, full, pads) if any(e for _, e in pads) else full
    if sliced:
        cropped = ctx.temp((batch, *(m for _, m in crop), out_channels), "crop")
        ctx.op("SLICE", [y, ctx.ints([0, *(b for b, _ in crop), 0], "begin"),
                         ctx.ints([batch, *(m for _, m in crop), out_channels], "size")], cropped)
        y = cropped
    ctx.op("ADD", [y, ctx.weight(bias, "bias")], out,
           options("AddOptions", fusedActivationFunction=0))
    return out


def _run_time_lengths(ctx, kernel, strides, output_padding) -> tuple[str, list]:
    """TF's padding and the output's spatial lengths (tensors: in * s + c) for spatial
    dims known only at run time. Without output_shape, the ONNX output starts at a
    begin and has a length in * s + c whatever the input's length (_transpose_crop's
    arithmetic, read at two lengths): where TF's SAME output or its VALID one (uncropped)
    is that output, it is written so; else NotImplementedError (a crop of run-time
    length)."""
    if ctx.attr("output_shape") is not None:
        raise NotImplementedError("ConvTranspose with output_shape on spatial dims known at "
                                  "run time; set them with -ois")
    probes = [_transpose_crop(ctx, [size] * len(kernel), kernel, strides, output_padding)
              for size in (16, 17)]
    same = valid = True
    offsets = []
    for axis, (k, s) in enumerate(zip(kernel, strides)):
        (b16, m16), (b17, m17) = probes[0][axis], probes[1][axis]
        if b16 != b17 or m17 - m16 != s:
            raise NotImplementedError("ConvTranspose whose output does not grow with its "
                                      "input's run-time length; set it with -ois")
        same = same and _is_tf_same_crop(16, k, s, (b16, m16))
        valid = valid and b16 == 0 and m16 == s * 15 + k
        offsets.append(m16 - 16 * s)
    if not (same or valid):
        raise NotImplementedError("ConvTranspose with pads TF's SAME and VALID outputs do "
                                  "not take on spatial dims known at run time; set them "
                                  "with -ois")
    dims = tf.shape(ctx.x(0))[1:-1]
    return ("SAME" if same else "VALID",
            [dims[a] * s + c for a, (s, c) in enumerate(zip(strides, offsets))])


def _is_tf_same_crop(size, k, s, crop) -> bool:
    """Does TF's SAME transposed conv to this length start where the ONNX output does?"""
    begin, length = crop
    total = max((size - 1) * s + k - length, 0)
    return (size - 1) * s < length <= size * s and begin == total // 2


def _valid_lengths(sizes, kernel, strides, crop) -> list[int]:
    """Lengths to ask of a VALID TF transposed conv: it allows full .. full + s - 1, where
    full = s * (in - 1) + k (taps reach only the first `full`)."""
    lengths = []
    for size, k, s, (begin, length) in zip(sizes, kernel, strides, crop):
        full = s * (size - 1) + k
        lengths.append(min(max(begin + length, full), full + s - 1))
    return lengths


def _crop(y, crop, lengths):
    """The ONNX output (begin, length per axis) out of a TF output of spatial `lengths`."""
    pads, sliced = _crop_plan(crop, lengths)
    y = pad_spatial(y, pads)
    if not sliced:
        return y
    return tf.slice(y, [0, *(b for b, _ in crop), 0], [-1, *(m for _, m in crop), -1])


def _crop_plan(crop, lengths) -> tuple[list, bool]:
    """_crop's zeros after each spatial axis (where the ONNX output reaches past the TF
    one), and whether a SLICE then takes the ONNX output out."""
    pads = [(0, max(b + m - t, 0)) for (b, m), t in zip(crop, lengths)]
    return pads, any(b != 0 or m != t for (b, m), t in zip(crop, lengths))


# --- CausalConvWithState -----------------------------------------------------------------
@handler("CausalConvWithState", since=27, layout=channel_last(0, 3),
         limits="static kernel size; half precision computed in float32")
def causal_conv_with_state(ctx):
    """Depthwise causal conv along the length of channel-last (B, L, C) data, the carried
    state prepended (zeros without one)."""
    x = ctx.x(0)
    dtype = compute_dtype(x)
    taps = ctx.shape(1)[2]
    if ctx.has(3):
        padded = tf.concat([tf.cast(ctx.x(3), dtype), tf.cast(x, dtype)], axis=1)
    else:
        padded = tf.pad(tf.cast(x, dtype), [[0, 0], [taps - 1, 0], [0, 0]])
    weight = ctx.const(1)
    if weight is not None:
        kernel = weight[:, 0, :].T.reshape(1, taps, -1, 1).astype(dtype.as_numpy_dtype)
        y = tf.nn.depthwise_conv2d(tf.expand_dims(padded, 1), ctx.const_tensor(kernel),
                                   strides=[1, 1, 1, 1], padding="VALID")
        y = tf.squeeze(y, 1)
    else:
        y = _runtime_taps(padded, tf.cast(ctx.x(1), dtype), taps)
    if ctx.has(2):
        y = y + tf.cast(ctx.x(2), dtype)
    if ctx.attr("activation", "none") in ("silu", "swish"):
        y = y * tf.sigmoid(y)
    state = padded[:, -(taps - 1):, :] if taps > 1 else padded[:, :0, :]
    return [y, state]


def _runtime_taps(padded, weight, taps: int):
    """Sum over taps i of the window starting at i times weight[:, 0, i], per channel."""
    total = None
    for i in range(taps):
        end = i - (taps - 1)
        window = padded[:, i : end if end else None, :]
        term = window * weight[:, 0, i]
        total = term if total is None else total + term
    return total
