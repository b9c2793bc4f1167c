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
from onnx2tf_alt.context import reshape
from onnx2tf_alt.graph import Graph, Node
from onnx2tf_alt.layout import channel_last, logical
from onnx2tf_alt.registry import handler

F32 = np.float32
_EMPTY = np.zeros(0, np.float32)


class RuntimeParameters(NotImplementedError):
    """Scales, sizes or roi are computed at run time: the sampling must be computed in the graph."""


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


def _cubic_kernel(s, a) -> list:
    """Keys' cubic weights of the taps at distance s + 1, s, 1 - s, 2 - s (numpy or TF)."""

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(s + 1), near(s), near(1 - s), far(2 - s)]


def _cubic_coeffs(s: np.ndarray, a: float) -> np.ndarray:
    return np.stack(_cubic_kernel(s, F32(a)), 1)


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


# --- run-time scales, sizes or roi -----------------------------------------------------------
#
# The same sampling as above, computed in the graph from the run-time parameters: per resized
# axis, K input indices and weights per output position, gathered and summed. Coordinates
# follow the ONNX reference: with scales, align_corners and tf_crop_and_resize divide by the
# unrounded resized length in * scale.


@dataclass
class AxisTarget:
    """One resized axis at run time (scalar tensors)."""

    n: tf.Tensor  # input length, int32
    m: tf.Tensor  # output length, int32
    scale: tf.Tensor  # float32
    length: tf.Tensor  # resized length the coordinates use (float32): in * scale, or m
    roi: tuple  # (start, end), float32


def _runtime_input(ctx, i: int):
    """Input i as a tensor, or None when omitted or empty."""
    if not ctx.has(i):
        return None
    const = ctx.const(i)
    if const is not None:
        return None if const.size == 0 else tf.constant(const)
    shape = ctx.shape(i)
    return None if shape and shape[0] == 0 else ctx.x(i)


def _runtime_targets(ctx, x, axes: list[int]) -> list[AxisTarget]:
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
    return [AxisTarget(*t) for t in zip(n, m, s, length, rois)]


def _runtime_coords(coord: str, t: AxisTarget):
    """Input coordinate of each output position (float32, as onnxruntime computes it)."""
    y = tf.range(t.m, dtype=tf.float32)
    n, s, m, (r0, r1) = tf.cast(t.n, tf.float32), t.scale, t.m, t.roi
    if coord == "asymmetric":
        x = y / s
    elif coord == "tf_half_pixel_for_nn":
        x = (y + 0.5) / s
    elif coord in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        x = (y + 0.5) / s - 0.5
        if coord == "pytorch_half_pixel":
            x = tf.where(m > 1, x, 0.0)
        if coord == "half_pixel_symmetric":
            x = n / 2 * (1 - tf.cast(m, tf.float32) / t.length) + x
    elif coord == "align_corners":
        x = tf.where(m > 1, y * (n - 1) / (t.length - 1), 0.0)
    elif coord == "tf_crop_and_resize":
        spread = r0 * (n - 1) + y * (r1 - r0) * (n - 1) / (t.length - 1)
        x = tf.where(m > 1, spread, 0.5 * (r0 + r1) * (n - 1))
    else:
        raise NotImplementedError(f"coordinate_transformation_mode {coord!r}")
    return tf.where(tf.equal(s, 1.0), y, x)  # an axis with scale 1 is copied


def _trunc(x):
    return tf.sign(x) * tf.floor(tf.abs(x))


def _runtime_nearest(x, rule: str, scale):
    if rule == "simple":  # Resize-10 and Upsample
        return tf.where(scale < 1, tf.math.ceil(x), _trunc(x))
    if rule == "floor":
        return tf.floor(x)
    if rule == "ceil":
        return tf.math.ceil(x)
    away = tf.sign(x) * tf.floor(tf.abs(x) + 0.5)  # std::round
    if rule == "round_prefer_ceil":
        return away
    if rule == "round_prefer_floor":
        return tf.where(tf.equal(x, _trunc(x) + 0.5), tf.floor(x), away)
    raise NotImplementedError(f"nearest_mode {rule!r}")


def _runtime_linear(x, n):
    x = tf.clip_by_value(x, 0.0, tf.cast(n - 1, tf.float32))
    lo = tf.minimum(tf.cast(x, tf.int32), n - 1)
    hi = tf.minimum(lo + 1, n - 1)
    same = tf.equal(lo, hi)
    w_lo = tf.where(same, 0.5, tf.abs(x - tf.cast(hi, tf.float32)))
    w_hi = tf.where(same, 0.5, tf.abs(x - tf.cast(lo, tf.float32)))
    return tf.stack([lo, hi], 1), tf.stack([w_lo, w_hi], 1)


def _normalized(weight):
    total = tf.reduce_sum(weight, 1, keepdims=True)
    return weight / tf.where(tf.equal(total, 0.0), 1.0, total)


def _runtime_cubic(at: ResizeAttrs, x, n):
    base = tf.floor(x)
    index = tf.cast(base, tf.int32)[:, None] + tf.constant([-1, 0, 1, 2])
    weight = tf.stack(_cubic_kernel(x - base, tf.constant(at.cubic_a, tf.float32)), 1)
    if at.exclude_outside:
        weight = _normalized(tf.where((index < 0) | (index >= n), 0.0, weight))
    return index, weight


def _runtime_antialias(at: ResizeAttrs, x, n, scale):
    """onnxruntime's antialiased filter (see _antialias_taps); its width depends on the scale."""
    inv = 1 / scale
    support = 1.0 if at.mode == "linear" else 2.0
    support = tf.where(inv >= 1, support * inv, support)
    stretch = tf.where(inv >= 1, 1 / inv, 1.0)
    center = x + 0.5
    lo = tf.cast(tf.floor(center - support + 0.5), tf.int32)
    hi = tf.cast(tf.floor(center + support + 0.5), tf.int32)
    if at.exclude_outside:
        lo, hi = tf.maximum(lo, 0), tf.minimum(hi, n)
    index = lo[:, None] + tf.range(tf.reduce_max(hi - lo))
    dist = tf.abs((tf.cast(index, tf.float32) - center[:, None] + 0.5) * stretch)
    if at.mode == "linear":
        weight = tf.where(dist < 1, 1 - dist, 0.0)
    else:
        a = tf.constant(at.cubic_a, tf.float32)
        near = ((a + 2) * dist - (a + 3)) * dist * dist + 1
        far = (((dist - 5) * dist + 8) * dist - 4) * a
        weight = tf.where(dist < 1, near, tf.where(dist < 2, far, 0.0))
    return index, _normalized(tf.where(index < hi[:, None], weight, 0.0))


def _runtime_taps(at: ResizeAttrs, t: AxisTarget):
    """(index (m,) or (m, K), weight (m, K) or None for nearest, outside (m,) or None)."""
    x = _runtime_coords(at.coord, t)
    weight = None
    if at.antialias:
        index, weight = _runtime_antialias(at, x, t.n, t.scale)
    elif at.mode == "nearest":
        index = tf.cast(_runtime_nearest(x, at.nearest, t.scale), tf.int32)
    elif at.mode == "linear":
        index, weight = _runtime_linear(x, t.n)
    elif at.mode == "cubic":
        index, weight = _runtime_cubic(at, x, t.n)
    else:
        raise NotImplementedError(f"Resize mode {at.mode!r}")
    outside = None
    if at.coord == "tf_crop_and_resize":
        beyond = (x < 0) | (x > tf.cast(t.n - 1, tf.float32))
        outside = beyond & tf.not_equal(t.scale, 1.0)
    return _clamp_index(index, t.n), weight, outside


def _clamp_index(index, n):
    """index clamped to [0, n). In float32 (exact below 2**24): the TFLite converter turns an
    integer clamp to [0, 6] into RELU6, which has no integer kernel."""
    top = tf.cast(n - 1, tf.float32)
    return tf.cast(tf.clip_by_value(tf.cast(index, tf.float32), 0.0, top), tf.int32)


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
        index, weight, outside = _runtime_taps(at, target)
        x = tf.gather(x, index, axis=axis)
        if weight is not None:
            weight = _along(tf.cast(weight, x.dtype), axis, rank + 1)
            x = tf.reduce_sum(x * weight, axis + 1)
        if outside is not None:
            keep = _along(tf.logical_not(outside), axis, rank)
            inside = keep if inside is None else inside & keep
    if inside is not None:
        x = tf.where(inside, x, tf.cast(at.extrapolation, x.dtype))
    known = ctx.out_phys_shape(0)
    if known is not None and any(d is None and k is not None for d, k in zip(x.shape, known)):
        x = reshape(x, known)  # restore the static dims (channels) the next ops need
    return x
