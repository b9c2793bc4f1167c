"""Resize and Upsample.

Shapes are static in almost every model, so where each output element samples the input is
computed at conversion time (`_resize_math`, on numpy), in float32 exactly as onnxruntime
computes it: per resized axis, a few input indices and weights per output position. When TF's
own resize kernels (TFLite RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR) sample the same positions
with the same weights, the node becomes one of them; otherwise it becomes, per axis, gathers of
the taps and their weighted sum, which is exact for every mode. Run-time scales, sizes or roi
run the same sampling code on TF, in the graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx2tf_alt.ops._resize_math import (
    Axis,
    Sampling,
    SamplingAttrs,
    kernel_for_any_size,
    onnx_sampling,
    taps,
    tensorflow_ops,
    tf_kernel_for,
)

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import channel_last, custom_policy, logical
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from ._shapes import reshape_to_dims

F32 = np.float32
_EMPTY = np.zeros(0, np.float32)


class RuntimeParameters(NotImplementedError):
    """Scales, sizes or roi are computed at run time: the sampling must be computed in the graph."""


@dataclass(frozen=True)
class ResizeAttrs(SamplingAttrs):
    """The sampling attributes and extrapolation_value (tf_crop_and_resize's fill)."""

    extrapolation: float

    @staticmethod
    def of(node: Node, opset: int) -> ResizeAttrs:
        get = node.attrs.get
        mode = get("mode", "nearest")
        if node.op_type == "Upsample" or opset < 11:
            return ResizeAttrs(mode, "asymmetric", "simple", -0.75, False, False, 0.0)
        return ResizeAttrs(
            mode=mode,
            coord=get("coordinate_transformation_mode", "half_pixel"),
            nearest=get("nearest_mode", "round_prefer_floor"),
            cubic_a=float(get("cubic_coeff_a", -0.75)),
            exclude_outside=bool(get("exclude_outside", 0)),
            antialias=bool(get("antialias", 0)) and mode != "nearest",
            extrapolation=float(get("extrapolation_value", 0.0)),
        )


@dataclass
class Target:
    """Per logical axis: the scale onnxruntime uses (float32) and the output size."""

    scales: list
    sizes: list  # int, or None when the input size is unknown
    roi: np.ndarray  # starts then ends, one per axis


def resize_target(node: Node, opset: int, in_shape, const) -> Target:
    """Output sizes and scales of a Resize/Upsample node, as onnxruntime computes them.

    `const(i)` is input i's value: an empty array when omitted, None when computed at run
    time (then this raises NotImplementedError).
    """
    rank = len(in_shape)
    if node.op_type == "Upsample" and "scales" in node.attrs:
        roi, scales, sizes = _EMPTY, np.asarray(node.attrs["scales"], F32), _EMPTY
    elif node.op_type == "Upsample" or opset < 11:
        roi, scales, sizes = _EMPTY, const(1), _EMPTY
    else:
        roi, scales, sizes = const(1), const(2), const(3)
    if roi is None and not _uses_roi(node):
        roi = _EMPTY  # only tf_crop_and_resize reads it
    if scales is None or sizes is None or roi is None:
        raise RuntimeParameters(f"{node.op_type} with run-time scales, sizes or roi")
    axes = resize_axes(node, opset, rank)
    if scales.size:
        scale = np.ones(rank, F32)
        scale[axes] = scales.astype(F32)
        sizes_out = [
            d if s == 1 else None if d is None else int(F32(s) * F32(d))
            for s, d in zip(scale, in_shape)
        ]
    else:
        if any(in_shape[a] is None for a in axes):
            raise NotImplementedError("Resize by sizes needs static input dims; set them with -ois")
        sizes_out = list(in_shape)
        for a, n in zip(axes, sizes.astype(np.int64)):
            sizes_out[a] = int(n)
        scale = np.array([F32(n) / F32(d) for d, n in zip(in_shape, sizes_out)], F32)
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            common = (min if policy == "not_larger" else max)(scale[axes])
            for a in axes:
                scale[a] = common
                sizes_out[a] = math.floor(float(F32(common) * F32(in_shape[a])) + 0.5)
    full_roi = np.array([0.0] * rank + [1.0] * rank, F32)
    if roi.size:
        roi = roi.astype(F32)
        full_roi[axes] = roi[: len(axes)]
        full_roi[[rank + a for a in axes]] = roi[len(axes) :]
    return Target(list(scale), sizes_out, full_roi)


def resize_axes(node: Node, opset: int, rank: int) -> list[int]:
    """The axes that roi, scales and sizes refer to (the `axes` attribute of Resize-18+)."""
    axes = node.attrs.get("axes", range(rank)) if opset >= 18 else range(rank)
    return [a % rank for a in axes]


def _uses_roi(node: Node) -> bool:
    return node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"


def _graph_const(node: Node, graph: Graph):
    def const(i):
        if i >= len(node.inputs) or not node.inputs[i]:
            return _EMPTY
        return graph.constants.get(node.inputs[i])

    return const


# --- TF's resize kernels ---------------------------------------------------------------------


def _tf_resize(x, kernel, size, rank: int):
    """NHWC (or NWC) resize with TF's kernel; size may be a list or a run-time tensor."""
    name, align, half = kernel
    fn = tf.compat.v1.image.resize_nearest_neighbor
    if name == "bilinear":
        fn = tf.compat.v1.image.resize_bilinear
    if rank == 3:
        size = tf.concat([[1], size], 0) if tf.is_tensor(size) else [1, *size]
        y = fn(tf.expand_dims(x, 1), size, align_corners=align, half_pixel_centers=half)
        return tf.squeeze(y, 1)
    return fn(x, size, align_corners=align, half_pixel_centers=half)


# --- the handlers ----------------------------------------------------------------------------


def _resized_axes(target: Target) -> list[int]:
    return [a for a, s in enumerate(target.scales) if s != 1]


def _spatial_only(node: Node, graph: Graph) -> bool:
    shape = graph.shapes.get(node.inputs[0])
    if shape is None or not 3 <= len(shape) <= 5:
        return False
    opset = graph.opset_of(node.domain)
    try:
        target = resize_target(node, opset, shape, _graph_const(node, graph))
    except RuntimeParameters:
        return _likely_spatial(node, graph, opset, shape)
    except NotImplementedError:
        return False
    return all(a >= 2 for a in _resized_axes(target))


def _likely_spatial(node: Node, graph: Graph, opset: int, shape) -> bool:
    """With run-time parameters, which axes change is unknown: guess spatial unless the `axes`
    attribute or the inferred output shape says otherwise. The run-time path resizes any axis
    in any layout, so a wrong guess costs speed, never correctness."""
    if any(a < 2 for a in resize_axes(node, opset, len(shape))):
        if opset >= 18 and "axes" in node.attrs:
            return False
        out = graph.shapes.get(node.outputs[0])
        return out is None or not any(
            o is not None and d is not None and o != d for o, d in zip(out[:2], shape[:2])
        )
    return True


_CHANNEL_LAST = channel_last(0)


@custom_policy(channel_last_if=_spatial_only)
def resize_layout(node: Node, graph: Graph, in_perms):
    """Channel-last when only spatial axes are resized (the usual case), else logical."""
    policy = _CHANNEL_LAST if _spatial_only(node, graph) else logical
    return policy.decide(node, graph, in_perms)


def _ctx_const(ctx):
    def const(i):
        return ctx.const(i) if ctx.has(i) else _EMPTY

    return const


def _channel_last_spatial(ctx, resized) -> bool:
    rank = ctx.rank(0)
    return rank in (3, 4) and ctx.perm(0) == P.channel_last(rank) and min(resized) >= 2


_LIMITS = (
    "linear and cubic need float data; with constant scales and sizes, dynamic spatial dims "
    "only where TF's resize kernels match for every size (integer scales, align_corners "
    "linear); run-time scales, sizes or roi resize with gathers computed in the graph"
)


@handler("Upsample", since=7, layout=resize_layout, limits=_LIMITS)
@handler("Resize", since=10, layout=resize_layout, limits=_LIMITS)
def resize(ctx):
    """Resize-10 and Upsample differ from Resize-11+ only in their attributes (ResizeAttrs)."""
    at = ResizeAttrs.of(ctx.node, ctx.opset)
    shape = ctx.shape(0)
    try:
        target = resize_target(ctx.node, ctx.opset, shape, _ctx_const(ctx))
    except RuntimeParameters:
        return runtime_resize(ctx, at)
    x = ctx.x(0)
    resized = _resized_axes(target)
    if _unchanged(target, shape, resized):
        return x  # onnxruntime copies the input when no dimension changes
    if at.mode != "nearest" and ctx.dtype(0).kind != "f":
        raise NotImplementedError(f"Resize mode {at.mode!r} on {ctx.dtype(0)} data")
    if any(shape[a] is None for a in resized):
        return _dynamic_resize(ctx, at, target, x, resized)
    samplings = _samplings(at, target, shape, resized)
    if _channel_last_spatial(ctx, resized) and x.dtype == tf.float32 and None not in shape[2:]:
        kernel = _tf_kernel(samplings, target, shape)
        if kernel is not None:
            return _tf_resize(x, kernel, target.sizes[2:], len(shape))
    return _gather_resize(ctx, x, samplings, at.extrapolation)


def _unchanged(target: Target, shape, resized: list[int]) -> bool:
    return all(n == d and n is not None for n, d in zip(target.sizes, shape)) or not resized


def _samplings(at: ResizeAttrs, target: Target, shape, resized: list[int]) -> dict:
    """Where each output position of each resized axis samples the input (static dims)."""
    rank = len(shape)
    return {a: onnx_sampling(at, shape[a], target.sizes[a], target.scales[a], target.roi[a],
                             target.roi[rank + a])
            for a in resized}


def _tf_kernel(samplings: dict, target: Target, shape):
    """The TF kernel that samples the spatial axes as `samplings` do, or None."""
    spatial = [samplings.get(a) or Sampling.identity(shape[a]) for a in range(2, len(shape))]
    return tf_kernel_for(spatial, target.sizes[2:])


_TAPS = {"linear": 2, "cubic": 4}  # taps per output position of linear_taps / cubic_taps
_KERNEL_BUILTINS = {"nearest": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
                    "bilinear": ("RESIZE_BILINEAR", "ResizeBilinearOptions")}


@direct("Upsample", since=7)
@direct("Resize", since=10)
def resize_direct(ctx):
    """resize's static cases that TF's kernels sample alike, on channel-last 4-D float32:
    one RESIZE_NEAREST_NEIGHBOR or RESIZE_BILINEAR (or the input itself when no dim
    changes), from the same resize_target and samplings."""
    at, shape = ResizeAttrs.of(ctx.node, ctx.opset), ctx.shape(0)
    try:
        target = resize_target(ctx.node, ctx.opset, shape, _ctx_const(ctx))
    except NotImplementedError as e:  # RuntimeParameters included
        raise NotCovered(str(e)) from None
    resized = _resized_axes(target)
    if _unchanged(target, shape, resized):
        return ctx.x(0)
    if (len(shape) != 4 or None in shape[1:] or ctx.dtype(0) != np.float32
            or not _channel_last_spatial(ctx, resized)):
        raise NotCovered("a resize other than of spatial axes of known 4-D float32 values")
    kernel = _tf_kernel(_samplings(at, target, shape, resized), target, shape)
    if kernel is None:
        raise NotCovered("a resize TF's kernels do not sample alike (gathered taps)")
    name, align, half = kernel
    builtin, kind = _KERNEL_BUILTINS[name]
    out = ctx.output()
    ctx.op(builtin, [ctx.x(0), ctx.ints(target.sizes[2:], "size")], out,
           options(kind, alignCorners=align, halfPixelCenters=half))
    return out


def _gather_resize(ctx, x, samplings: dict, extrapolation: float):
    """Per axis: gather each tap's input positions and sum them with their weights."""
    if ctx.dtype(0).kind == "f" and x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    rank = len(ctx.perm(0))
    fill_shape, inside = [1] * rank, np.ones(1)
    for a, sampling in samplings.items():
        axis = ctx.axis(a)
        x = _sample_axis(ctx, x, axis, sampling.compact())
        if sampling.outside.any():
            fill_shape[axis] = len(sampling.outside)
            shape = [1] * rank
            shape[axis] = -1
            inside = inside * (~sampling.outside).reshape(shape)
    if extrapolation and not np.all(inside):
        fill = np.broadcast_to((1 - inside) * extrapolation, fill_shape)
        x = x + ctx.const_tensor(fill.astype(x.dtype.as_numpy_dtype))
    return x


def _sample_axis(ctx, x, axis: int, sampling: Sampling):
    if sampling.is_identity():
        return x
    shape = [1] * x.shape.rank
    shape[axis] = -1
    total = None
    for index, weight in zip(sampling.index.T, sampling.weight.T):
        tap = tf.gather(x, ctx.const_tensor(index.astype(np.int32)), axis=axis)
        if not np.all(weight == 1):
            tap = tap * ctx.const_tensor(weight.reshape(shape).astype(x.dtype.as_numpy_dtype))
        total = tap if total is None else total + tap
    return total


def _dynamic_resize(ctx, at: ResizeAttrs, target: Target, x, resized):
    """Unknown input sizes: only TF's kernels, where they match for every input size."""
    scales = [float(target.scales[a]) for a in range(2, len(target.scales))]
    kernel = kernel_for_any_size(at, [target.scales[a] for a in resized])
    if kernel is None or not _channel_last_spatial(ctx, resized):
        raise NotImplementedError(
            f"Resize ({at.mode}, {at.coord}, {at.nearest}) with scales {target.scales} on "
            f"dynamic spatial dims {ctx.shape(0)}; set static input shapes with -ois"
        )
    if all(float(s).is_integer() for s in scales):  # n * k in int32: exact, two ops
        size = tf.shape(x)[1:-1] * tf.constant([int(s) for s in scales], tf.int32)
    else:
        spatial = tf.cast(tf.shape(x)[1:-1], tf.float32)
        size = tf.cast(spatial * tf.constant(scales, tf.float32), tf.int32)
    return _tf_resize(x, kernel, size, ctx.rank(0))


# --- run-time scales, sizes or roi -----------------------------------------------------------
#
# The same sampling code (`taps`), run on TF in the graph from the run-time parameters: per
# resized axis, K input indices and weights per output position, gathered and summed.
# Coordinates follow the ONNX reference: with scales, align_corners and tf_crop_and_resize
# divide by the unrounded resized length in * scale.


def _runtime_input(ctx, i: int):
    """Input i as a tensor, or None when omitted or empty."""
    if not ctx.has(i):
        return None
    const = ctx.const(i)
    if const is not None:
        return None if const.size == 0 else tf.constant(const)
    shape = ctx.shape(i)
    return None if shape and shape[0] == 0 else ctx.x(i)


def _runtime_targets(ctx, x, axes: list[int]) -> list[Axis]:
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        roi, scales, sizes = None, _runtime_input(ctx, 1), None
    else:
        roi, scales, sizes = (_runtime_input(ctx, i) for i in (1, 2, 3))
    dims = tf.shape(x)
    n = [dims[ctx.axis(a)] for a in axes]
    nf = [tf.cast(d, tf.float32) for d in n]
    if scales is not None:
        s = [tf.cast(scales[i], tf.float32) for i in range(len(axes))]
        length = [si * di for si, di in zip(s, nf)]
        m = [tf.cast(li, tf.int32) for li in length]
    else:
        m = [tf.cast(sizes[i], tf.int32) for i in range(len(axes))]
        # The TFLite converter turns a division by a constant (a static input length) into a
        # multiplication by its rounded reciprocal, which moves nearest's ties: tying the
        # divisor to a run-time value (max(n, min(m, 0)) == n) keeps a true division.
        s = [
            tf.cast(mi, tf.float32) / tf.maximum(di, tf.cast(tf.minimum(mi, 0), tf.float32))
            for mi, di in zip(m, nf)
        ]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            common = (tf.reduce_min if policy == "not_larger" else tf.reduce_max)(tf.stack(s))
            s = [common] * len(axes)
            m = [tf.cast(tf.floor(common * di + 0.5), tf.int32) for di in nf]
        length = [tf.cast(mi, tf.float32) for mi in m]
    if roi is None or not _uses_roi(ctx.node):
        rois = [(0.0, 1.0)] * len(axes)
    else:
        roi = tf.cast(roi, tf.float32)
        rois = [(roi[i], roi[len(axes) + i]) for i in range(len(axes))]
    return [Axis(*t) for t in zip(n, m, s, length, length, rois)]


def _along(v, axis: int, rank: int):
    """v, broadcastable against a rank-`rank` tensor whose axes from `axis` on it runs along."""
    for _ in range(rank - axis - v.shape.rank):
        v = tf.expand_dims(v, -1)
    for _ in range(axis):
        v = tf.expand_dims(v, 0)
    return v


def runtime_resize(ctx, at: ResizeAttrs):
    """Resize whose scales, sizes or roi are known only at run time, on any axis and layout."""
    x = ctx.x(0)
    if at.mode != "nearest" and ctx.dtype(0).kind != "f":
        raise NotImplementedError(f"Resize mode {at.mode!r} on {ctx.dtype(0)} data")
    if ctx.dtype(0).kind == "f" and x.dtype not in (tf.float32, tf.float64):
        x = tf.cast(x, tf.float32)
    rank = ctx.rank(0)
    axes = resize_axes(ctx.node, ctx.opset, rank)
    inside = None
    for a, target in zip(axes, _runtime_targets(ctx, x, axes)):
        axis = ctx.axis(a)
        index, weight, outside = taps(tensorflow_ops(), at, target)
        if weight is not None and not at.antialias:
            # each of the K taps gathered and weighted, summed in order as a reduction sums
            # them: two GATHERs, MULs and an ADD on the output's size (XNNPACK takes the MUL
            # and ADD), not a gather of K times the output and a SUM on TFLite's kernel
            weight = tf.cast(weight, x.dtype)
            parts = [tf.gather(x, index[:, k], axis=axis) * _along(weight[:, k], axis, rank)
                     for k in range(_TAPS[at.mode])]
            x = parts[0]
            for part in parts[1:]:
                x = x + part
        else:
            x = tf.gather(x, index, axis=axis)
            if weight is not None:  # antialiased: K known at run time
                weight = _along(tf.cast(weight, x.dtype), axis, rank + 1)
                x = tf.reduce_sum(x * weight, axis + 1)
        if outside is not None:
            keep = _along(tf.logical_not(outside), axis, rank)
            inside = keep if inside is None else inside & keep
    if inside is not None:
        x = tf.where(inside, x, tf.cast(at.extrapolation, x.dtype))
    known = ctx.out_phys_shape(0)
    if known is not None and any(d is None and k is not None for d, k in zip(x.shape, known)):
        # restore the static dims (channels) the next ops need, axis by axis: inside a Loop
        # body every dim of x may be unknown (torchvision pastes each mask at its box size)
        dims = tf.shape(x)
        x = reshape_to_dims(x, [dims[i] if k is None else k for i, k in enumerate(known)])
    return x
