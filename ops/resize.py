"""Resize and Upsample.

Shapes are static in almost every model, so where each output element samples the input is
computed here, at conversion time, in float32 exactly as onnxruntime computes it: per resized
axis, a few input indices and weights per output position. When TF's own resize kernels
(TFLite RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR) sample the same positions with the same
weights, the node becomes one of them; otherwise it becomes, per axis, gathers of the taps
and their weighted sum, which is exact for every mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from onnx2tf_alt import perms as P
from onnx2tf_alt.graph import Graph, Node
from onnx2tf_alt.layout import channel_last, logical
from onnx2tf_alt.registry import handler

F32 = np.float32
_EMPTY = np.zeros(0, np.float32)


@dataclass(frozen=True)
class ResizeAttrs:
    mode: str  # nearest | linear | cubic
    coord: str  # coordinate_transformation_mode
    nearest: str  # nearest_mode; "simple" for Resize-10 and Upsample
    cubic_a: float
    exclude_outside: bool
    antialias: bool
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
        raise NotImplementedError(f"{node.op_type} with run-time scales, sizes or roi")
    axes = [a % rank for a in node.attrs.get("axes", range(rank))] if opset >= 18 else range(rank)
    axes = list(axes)
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


def _uses_roi(node: Node) -> bool:
    return node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"


def _graph_const(node: Node, graph: Graph):
    def const(i):
        if i >= len(node.inputs) or not node.inputs[i]:
            return _EMPTY
        return graph.constants.get(node.inputs[i])

    return const


# --- where each output position samples one input axis ---------------------------------------


@dataclass
class Sampling:
    """How one output axis reads its input axis: K input indices and weights per position."""

    size: int  # input length
    index: np.ndarray  # (out, K) in [0, size)
    weight: np.ndarray  # (out, K)
    outside: np.ndarray  # (out,) bool: extrapolated positions; their weights are 0

    @staticmethod
    def identity(size: int) -> Sampling:
        return Sampling(size, np.arange(size)[:, None], np.ones((size, 1)), np.zeros(size, bool))

    def _keys(self):
        rows = np.repeat(np.arange(self.index.shape[0]), self.index.shape[1])
        return rows * self.size + self.index.ravel(), self.weight.ravel()

    def compact(self) -> Sampling:
        """Same sampling with repeated indices merged and zero weights dropped."""
        keys, weights = self._keys()
        keys, inverse = np.unique(keys, return_inverse=True)
        weights = np.bincount(inverse, weights, minlength=len(keys))
        keep = weights != 0
        keys, weights = keys[keep], weights[keep]
        rows, cols = np.divmod(keys, self.size)
        out = self.index.shape[0]
        counts = np.bincount(rows, minlength=out)
        slot = np.arange(len(keys)) - np.repeat(np.cumsum(counts) - counts, counts)
        index = np.zeros((out, max(int(counts.max(initial=0)), 1)), np.int64)
        weight = np.zeros(index.shape)
        index[rows, slot], weight[rows, slot] = cols, weights
        return Sampling(self.size, index, weight, self.outside)

    def matches(self, other: Sampling) -> bool:
        """Same positions and weights, up to what float32 coordinates can resolve."""
        if self.index.shape[0] != other.index.shape[0] or self.outside.any():
            return False
        (ka, wa), (kb, wb) = self._keys(), other._keys()
        keys, inverse = np.unique(np.concatenate([ka, kb]), return_inverse=True)
        diff = np.bincount(inverse, np.concatenate([wa, -wb]), minlength=len(keys))
        return np.abs(diff).max() <= 1e-5 + 4 * np.spacing(F32(self.size))

    def is_identity(self) -> bool:
        return self.matches(Sampling.identity(self.size))


def source_coords(coord: str, size: int, out: int, scale, roi_start, roi_end) -> np.ndarray:
    """Input coordinate of each output position, with onnxruntime's float32 arithmetic
    (which decides the rounding of nearest at exact ties)."""
    x = np.arange(out, dtype=F32)
    size_f, out_f, half = F32(size), F32(out), F32(0.5)
    scale, roi_start, roi_end = F32(scale), F32(roi_start), F32(roi_end)
    if scale == 1:
        return x
    if coord == "asymmetric":
        return x / scale
    if coord == "half_pixel" or (coord == "pytorch_half_pixel" and out > 1):
        return (x + half) / scale - half
    if coord == "pytorch_half_pixel":
        return np.zeros(out, F32)
    if coord == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if coord == "align_corners":
        return np.zeros(out, F32) if out == 1 else x * (size_f - 1) / (out_f - 1)
    if coord == "tf_crop_and_resize":
        if out == 1:
            return np.full(1, 0.5 * float(roi_start + roi_end) * (size - 1), F32)
        return roi_start * (size_f - 1) + x * (roi_end - roi_start) * (size_f - 1) / (out_f - 1)
    if coord == "half_pixel_symmetric":
        offset = size_f / 2 * (1 - out_f / (scale * size_f))
        return (float(offset) + (x.astype(np.float64) + 0.5) / float(scale) - 0.5).astype(F32)
    raise NotImplementedError(f"coordinate_transformation_mode {coord!r}")


def _nearest_index(x: np.ndarray, rule: str, downsampling: bool) -> np.ndarray:
    if rule == "simple":  # Resize-10 and Upsample
        return np.ceil(x) if downsampling else np.trunc(x)
    if rule == "floor":
        return np.floor(x)
    if rule == "ceil":
        return np.ceil(x)
    away = np.sign(x) * np.floor(np.abs(x) + F32(0.5))  # std::round
    if rule == "round_prefer_ceil":
        return away
    if rule == "round_prefer_floor":
        return np.where(x == np.trunc(x) + F32(0.5), np.floor(x), away)
    raise NotImplementedError(f"nearest_mode {rule!r}")


def _linear_taps(x: np.ndarray, size: int):
    x = np.clip(x, F32(0), F32(size - 1))
    lo = np.minimum(x.astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    w_lo, w_hi = np.abs(x - hi.astype(F32)), np.abs(x - lo.astype(F32))
    same = lo == hi
    w_lo[same], w_hi[same] = 0.5, 0.5
    return np.stack([lo, hi], 1), np.stack([w_lo, w_hi], 1).astype(np.float64)


def _cubic_coeffs(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic weights of the taps at distance s + 1, s, 1 - s, 2 - s."""
    a = F32(a)

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(s + 1), near(s), near(1 - s), far(2 - s)], 1)


def _cubic_taps(x: np.ndarray, size: int, a: float, exclude_outside: bool):
    base = np.floor(x)
    index = base.astype(np.int64)[:, None] + np.arange(-1, 3)
    weight = _cubic_coeffs(x - base, a).astype(np.float64)
    if exclude_outside:
        weight[(index < 0) | (index >= size)] = 0
        weight /= weight.sum(1, keepdims=True)
    return index, weight


def _antialias_taps(at: ResizeAttrs, x: np.ndarray, size: int, scale):
    """onnxruntime's antialiased filter: the kernel widened by 1/scale when downsampling."""
    inv = F32(1) / F32(scale)  # input pixels per output pixel
    support = F32(2.0 if at.mode == "linear" else 4.0) * F32(0.5)
    if inv >= 1:
        support, stretch = support * inv, F32(1) / inv
    else:
        stretch = F32(1)
    center = x + F32(0.5)
    lo = np.floor((center - support).astype(np.float64) + 0.5).astype(np.int64)
    hi = np.floor((center + support).astype(np.float64) + 0.5).astype(np.int64)
    if at.exclude_outside:
        lo, hi = np.maximum(lo, 0), np.minimum(hi, size)
    width = int((hi - lo).max())
    index = lo[:, None] + np.arange(width)
    dist = np.abs((index.astype(F32) - center[:, None] + F32(0.5)) * stretch)
    if at.mode == "linear":
        weight = np.where(dist < 1, 1 - dist, 0)
    else:
        a = F32(at.cubic_a)
        near = ((a + 2) * dist - (a + 3)) * dist * dist + 1
        far = (((dist - 5) * dist + 8) * dist - 4) * a
        weight = np.where(dist < 1, near, np.where(dist < 2, far, 0))
    weight = np.where(index < hi[:, None], weight, 0).astype(np.float64)
    total = weight.sum(1, keepdims=True)
    return index, weight / np.where(total == 0, 1, total)


def onnx_sampling(at: ResizeAttrs, size: int, out: int, scale, roi_start, roi_end) -> Sampling:
    """The taps onnxruntime uses along one axis."""
    x = source_coords(at.coord, size, out, scale, roi_start, roi_end)
    if scale == 1:
        index, weight = np.arange(out)[:, None], np.ones((out, 1))
    elif at.antialias:
        index, weight = _antialias_taps(at, x, size, scale)
    elif at.mode == "nearest":
        index = _nearest_index(x, at.nearest, scale < 1).astype(np.int64)[:, None]
        weight = np.ones((out, 1))
    elif at.mode == "linear":
        index, weight = _linear_taps(x, size)
    elif at.mode == "cubic":
        index, weight = _cubic_taps(x, size, at.cubic_a, at.exclude_outside)
    else:
        raise NotImplementedError(f"Resize mode {at.mode!r}")
    outside = np.zeros(out, bool)
    if at.coord == "tf_crop_and_resize" and scale != 1:
        outside = (x < 0) | (x > size - 1)
        weight = np.where(outside[:, None], 0, weight)
    return Sampling(size, np.clip(index, 0, size - 1), weight, outside)


# --- TF's resize kernels ---------------------------------------------------------------------

# (kernel, align_corners, half_pixel_centers), cheapest first
TF_KERNELS = [
    ("nearest", False, False),
    ("nearest", False, True),
    ("nearest", True, False),
    ("bilinear", False, False),
    ("bilinear", False, True),
    ("bilinear", True, False),
]


def tf_sampling(kernel, size: int, out: int) -> Sampling:
    """The taps TF's and TFLite's resize kernels use along one axis (float32, as they do)."""
    name, align, half = kernel
    if align and out > 1:
        scale = F32(size - 1) / F32(out - 1)
    else:
        scale = F32(size) / F32(out)
    i = np.arange(out, dtype=F32)
    none = np.zeros(out, bool)
    if name == "nearest":
        v = (i + F32(0.5)) * scale if half else i * scale
        index = np.floor(v + F32(0.5)) if align else np.floor(v)
        index = np.clip(index.astype(np.int64), 0, size - 1)
        return Sampling(size, index[:, None], np.ones((out, 1)), none)
    v = (i + F32(0.5)) * scale - F32(0.5) if half else i * scale
    lo = np.maximum(np.floor(v), 0).astype(np.int64)
    hi = np.minimum(np.ceil(v).astype(np.int64), size - 1)
    lerp = (v - np.floor(v)).astype(np.float64)
    return Sampling(size, np.stack([lo, hi], 1), np.stack([1 - lerp, lerp], 1), none)


def _tf_kernel_for(samplings: list[Sampling], outs: list[int]):
    for kernel in TF_KERNELS:
        if all(s.matches(tf_sampling(kernel, s.size, n)) for s, n in zip(samplings, outs)):
            return kernel
    return None


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
    try:
        target = resize_target(node, graph.opset_of(node.domain), shape, _graph_const(node, graph))
    except NotImplementedError:
        return False
    return all(a >= 2 for a in _resized_axes(target))


_CHANNEL_LAST = channel_last(0)


def resize_layout(node: Node, graph: Graph, in_perms):
    """Channel-last when only spatial axes are resized (the usual case), else logical."""
    policy = _CHANNEL_LAST if _spatial_only(node, graph) else logical
    return policy(node, graph, in_perms)


resize_layout.wants_channel_last = _spatial_only


def _ctx_const(ctx):
    def const(i):
        return ctx.const(i) if ctx.has(i) else _EMPTY

    return const


def _channel_last_spatial(ctx, resized) -> bool:
    rank = ctx.rank(0)
    return rank in (3, 4) and ctx.perm(0) == P.channel_last(rank) and min(resized) >= 2


_LIMITS = (
    "scales, sizes and roi must be constant; linear and cubic need float data; dynamic "
    "spatial dims only where TF's resize kernels match for every size (integer scales, "
    "align_corners linear)"
)


@handler("Upsample", since=7, layout=resize_layout, limits=_LIMITS)
@handler("Resize", since=10, layout=resize_layout, limits=_LIMITS)
def resize(ctx):
    """Resize-10 and Upsample differ from Resize-11+ only in their attributes (ResizeAttrs)."""
    at = ResizeAttrs.of(ctx.node, ctx.opset)
    shape = ctx.shape(0)
    target = resize_target(ctx.node, ctx.opset, shape, _ctx_const(ctx))
    x = ctx.x(0)
    resized = _resized_axes(target)
    if all(n == d and n is not None for n, d in zip(target.sizes, shape)) or not resized:
        return x  # onnxruntime copies the input when no dimension changes
    if at.mode != "nearest" and ctx.dtype(0).kind != "f":
        raise NotImplementedError(f"Resize mode {at.mode!r} on {ctx.dtype(0)} data")
    if any(shape[a] is None for a in resized):
        return _dynamic_resize(ctx, at, target, x, resized)
    rank = len(shape)
    samplings = {
        a: onnx_sampling(
            at, shape[a], target.sizes[a], target.scales[a], target.roi[a], target.roi[rank + a]
        )
        for a in resized
    }
    if _channel_last_spatial(ctx, resized) and x.dtype == tf.float32 and None not in shape[2:]:
        spatial = [samplings.get(a) or Sampling.identity(shape[a]) for a in range(2, rank)]
        outs = target.sizes[2:]
        kernel = _tf_kernel_for(spatial, outs)
        if kernel is not None:
            return _tf_resize(x, kernel, outs, rank)
    return _gather_resize(ctx, x, samplings, at.extrapolation)


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
    kernel = _kernel_for_any_size(at, [target.scales[a] for a in resized])
    if kernel is None or not _channel_last_spatial(ctx, resized):
        raise NotImplementedError(
            f"Resize ({at.mode}, {at.coord}, {at.nearest}) with scales {target.scales} on "
            f"dynamic spatial dims {ctx.shape(0)}; set static input shapes with -ois"
        )
    spatial = tf.cast(tf.shape(x)[1:-1], tf.float32)
    size = tf.cast(spatial * tf.constant(scales, tf.float32), tf.int32)
    return _tf_resize(x, kernel, size, ctx.rank(0))


_HALF_PIXEL = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")


def _kernel_for_any_size(at: ResizeAttrs, scales):
    """TF kernel that matches onnxruntime for every input size, or None.

    Integer scales k make out/in == k exactly, so TF's in/out ratio equals 1/k; nearest
    positions then never sit on a rounding tie, except asymmetric ones, which are exact
    only when 1/k is exact in float32 (k a power of two).
    """
    integer = all(float(s).is_integer() and s >= 1 for s in scales)
    power_of_two = integer and all(int(s) & (int(s) - 1) == 0 for s in scales)
    if at.antialias or at.coord == "tf_crop_and_resize":
        return None
    if at.mode == "linear":
        if at.coord == "align_corners":
            return ("bilinear", True, False)
        if integer and at.coord in _HALF_PIXEL:
            return ("bilinear", False, True)
        if integer and at.coord == "asymmetric":
            return ("bilinear", False, False)
    if at.mode == "nearest" and integer:
        if at.coord in _HALF_PIXEL and at.nearest.startswith("round"):
            return ("nearest", False, True)
        if at.coord == "tf_half_pixel_for_nn" and at.nearest == "floor":
            return ("nearest", False, True)
        if power_of_two and at.coord == "asymmetric" and at.nearest in ("floor", "simple"):
            return ("nearest", False, False)
    return None
