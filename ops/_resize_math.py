"""Where Resize samples its input: the ONNX sampling, written once over an array module.

Per resized axis, each output position reads a few input indices with weights. The same code
runs on numpy at conversion time (constant scales and sizes: the taps become constants) and
on TensorFlow at run time (scales, sizes or roi computed in the graph): `ArrayOps` holds the
few functions it needs. Coordinates are float32, as onnxruntime computes them, which decides
nearest's rounding at exact ties. This module never imports TensorFlow itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class ArrayOps:
    """The array functions the sampling uses: numpy's or TensorFlow's.

    `wide` is float64 on numpy: conversion-time sums and tap bounds are exact there for free;
    TF stays in float32, as TFLite computes. `narrow` undoes it.
    """

    arange_f: Callable  # arange_f(n): 0, 1, ..., n - 1 in float32
    arange: Callable  # arange(n): integer 0, 1, ..., n - 1
    constant: Callable  # constant(list of ints)
    to_int: Callable
    to_float: Callable  # to float32
    wide: Callable
    narrow: Callable
    floor: Callable
    ceil: Callable
    abs: Callable
    sign: Callable
    where: Callable
    equal: Callable
    not_equal: Callable
    minimum: Callable
    maximum: Callable
    clip: Callable  # clip(x, lo, hi)
    stack: Callable  # stack(values, axis)
    sum_rows: Callable  # sum over axis 1, kept
    max_all: Callable


NUMPY = ArrayOps(
    arange_f=lambda n: np.arange(n, dtype=F32),
    arange=np.arange,
    constant=np.asarray,
    to_int=lambda v: np.asarray(v).astype(np.int64),
    to_float=F32,
    wide=lambda v: np.asarray(v, np.float64),
    narrow=F32,
    floor=np.floor,
    ceil=np.ceil,
    abs=np.abs,
    sign=np.sign,
    where=np.where,
    equal=np.equal,
    not_equal=np.not_equal,
    minimum=np.minimum,
    maximum=np.maximum,
    clip=np.clip,
    stack=np.stack,
    sum_rows=lambda v: v.sum(1, keepdims=True),
    max_all=np.max,
)


def tensorflow_ops() -> ArrayOps:
    """The tf functions, of what stands for tf now (translate/lazy.py: TensorFlow, or the
    direct writer's Recorder)."""
    from onnx2tf_alt.translate.lazy import tf

    def same(v):
        return v

    return ArrayOps(
        arange_f=lambda n: tf.range(n, dtype=tf.float32),
        arange=tf.range,
        constant=tf.constant,
        to_int=lambda v: tf.cast(v, tf.int32),
        to_float=lambda v: tf.cast(v, tf.float32),
        wide=same,
        narrow=same,
        floor=tf.floor,
        ceil=tf.math.ceil,
        abs=tf.abs,
        sign=tf.sign,
        where=tf.where,
        equal=tf.equal,
        not_equal=tf.not_equal,
        minimum=tf.minimum,
        maximum=tf.maximum,
        clip=tf.clip_by_value,
        stack=tf.stack,
        sum_rows=lambda v: tf.reduce_sum(v, 1, keepdims=True),
        max_all=tf.reduce_max,
    )


@dataclass(frozen=True)
class SamplingAttrs:
    """The Resize attributes that decide where and how each output position samples."""

    mode: str  # nearest | linear | cubic
    coord: str  # coordinate_transformation_mode
    nearest: str  # nearest_mode; "simple" for Resize-10 and Upsample
    cubic_a: float
    exclude_outside: bool
    antialias: bool


@dataclass
class Axis:
    """One resized axis: numbers at conversion time, scalar tensors at run time."""

    n: Any  # input length (int)
    m: Any  # output length (int)
    scale: Any  # float32
    length: Any  # in * scale, the resized length half_pixel_symmetric refers to (float32)
    span: Any  # the output length align_corners and tf_crop_and_resize spread over (float32)
    roi: tuple = (0.0, 1.0)  # (start, end) in float32; read by tf_crop_and_resize


_HALF_PIXEL = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")


def source_coords(xp: ArrayOps, coord: str, axis: Axis):
    """Input coordinate of each output position (float32, as onnxruntime computes it)."""
    y = xp.arange_f(axis.m)
    n, s, m, (r0, r1) = xp.to_float(axis.n), axis.scale, axis.m, axis.roi
    if coord == "asymmetric":
        x = y / s
    elif coord == "tf_half_pixel_for_nn":
        x = (y + 0.5) / s
    elif coord in ("half_pixel", "pytorch_half_pixel"):
        x = (y + 0.5) / s - 0.5
        if coord == "pytorch_half_pixel":
            x = xp.where(m > 1, x, 0.0)
    elif coord == "half_pixel_symmetric":
        offset = n / 2 * (1 - xp.to_float(m) / axis.length)
        x = xp.narrow(xp.wide(offset) + ((xp.wide(y) + 0.5) / xp.wide(s) - 0.5))
    elif coord == "align_corners":
        x = xp.where(m > 1, y * (n - 1) / (axis.span - 1), 0.0)
    elif coord == "tf_crop_and_resize":
        spread = r0 * (n - 1) + y * (r1 - r0) * (n - 1) / (axis.span - 1)
        x = xp.where(m > 1, spread, 0.5 * (r0 + r1) * (n - 1))
    else:
        raise NotImplementedError(f"coordinate_transformation_mode {coord!r}")
    return xp.where(xp.equal(s, 1.0), y, x)  # an axis with scale 1 is copied


def _trunc(xp: ArrayOps, x):
    return xp.sign(x) * xp.floor(xp.abs(x))


def nearest_index(xp: ArrayOps, x, rule: str, scale):
    """The input position nearest_mode `rule` picks for coordinate x (float)."""
    if rule == "simple":  # Resize-10 and Upsample
        return xp.where(scale < 1, xp.ceil(x), _trunc(xp, x))
    if rule == "floor":
        return xp.floor(x)
    if rule == "ceil":
        return xp.ceil(x)
    away = xp.sign(x) * xp.floor(xp.abs(x) + 0.5)  # std::round
    if rule == "round_prefer_ceil":
        return away
    if rule == "round_prefer_floor":
        return xp.where(xp.equal(x, _trunc(xp, x) + 0.5), xp.floor(x), away)
    raise NotImplementedError(f"nearest_mode {rule!r}")


def linear_taps(xp: ArrayOps, x, n):
    """The two neighbours of x (clamped to the axis) and their weights."""
    x = xp.clip(x, 0.0, xp.to_float(n - 1))
    lo = xp.minimum(xp.to_int(x), n - 1)
    hi = xp.minimum(lo + 1, n - 1)
    same = xp.equal(lo, hi)
    w_lo = xp.where(same, 0.5, xp.abs(x - xp.to_float(hi)))
    w_hi = xp.where(same, 0.5, xp.abs(x - xp.to_float(lo)))
    return xp.stack([lo, hi], 1), xp.stack([w_lo, w_hi], 1)


def _keys_near(d, a):
    """Keys' cubic kernel for distances below 1."""
    return ((a + 2) * d - (a + 3)) * d * d + 1


def cubic_kernel(s, a) -> list:
    """Keys' cubic weights of the taps at distance s + 1, s, 1 - s, 2 - s (numpy or TF),
    with onnxruntime's float32 expression for the far taps."""

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(s + 1), _keys_near(s, a), _keys_near(1 - s, a), far(2 - s)]


def _normalized(xp: ArrayOps, weight):
    weight = xp.wide(weight)
    total = xp.sum_rows(weight)
    return weight / xp.where(xp.equal(total, 0.0), 1.0, total)


def cubic_taps(xp: ArrayOps, at: SamplingAttrs, x, n):
    """The four taps around x; with exclude_outside, those off the axis get no weight."""
    base = xp.floor(x)
    index = xp.to_int(base)[:, None] + xp.constant([-1, 0, 1, 2])
    weight = xp.stack(cubic_kernel(x - base, xp.to_float(at.cubic_a)), 1)
    if at.exclude_outside:
        weight = _normalized(xp, xp.where((index < 0) | (index >= n), 0.0, weight))
    return index, weight


def antialias_taps(xp: ArrayOps, at: SamplingAttrs, x, n, scale):
    """onnxruntime's antialiased filter: the kernel widened by 1/scale when downsampling, so
    the number of taps depends on the scale."""
    inv = 1 / scale  # input pixels per output pixel
    support = 1.0 if at.mode == "linear" else 2.0
    support = xp.where(inv >= 1, support * inv, support)
    stretch = xp.where(inv >= 1, 1 / inv, 1.0)
    center = x + 0.5
    lo = xp.to_int(xp.floor(xp.wide(center - support) + 0.5))
    hi = xp.to_int(xp.floor(xp.wide(center + support) + 0.5))
    if at.exclude_outside:
        lo, hi = xp.maximum(lo, 0), xp.minimum(hi, n)
    index = lo[:, None] + xp.arange(xp.max_all(hi - lo))
    dist = xp.abs((xp.to_float(index) - center[:, None] + 0.5) * stretch)
    if at.mode == "linear":
        weight = xp.where(dist < 1, 1 - dist, 0.0)
    else:  # onnxruntime's antialias filter has its own float32 expression for the far taps
        a = xp.to_float(at.cubic_a)
        far = (((dist - 5) * dist + 8) * dist - 4) * a
        weight = xp.where(dist < 1, _keys_near(dist, a), xp.where(dist < 2, far, 0.0))
    return index, _normalized(xp, xp.where(index < hi[:, None], weight, 0.0))


def clamp_index(xp: ArrayOps, index, n):
    """index clamped to [0, n). In float32 (exact below 2**24): the TFLite converter turns an
    integer clamp to [0, 6] into RELU6, which has no integer kernel."""
    return xp.to_int(xp.clip(xp.to_float(index), 0.0, xp.to_float(n - 1)))


def taps(xp: ArrayOps, at: SamplingAttrs, axis: Axis):
    """(index (m,) or (m, K), weight (m, K) or None for nearest, outside (m,) or None).

    `outside` marks tf_crop_and_resize's positions beyond the input (extrapolated)."""
    x = source_coords(xp, at.coord, axis)
    weight = None
    if at.antialias:
        index, weight = antialias_taps(xp, at, x, axis.n, axis.scale)
    elif at.mode == "nearest":
        index = xp.to_int(nearest_index(xp, x, at.nearest, axis.scale))
    elif at.mode == "linear":
        index, weight = linear_taps(xp, x, axis.n)
    elif at.mode == "cubic":
        index, weight = cubic_taps(xp, at, x, axis.n)
    else:
        raise NotImplementedError(f"Resize mode {at.mode!r}")
    outside = None
    if at.coord == "tf_crop_and_resize":
        beyond = (x < 0) | (x > xp.to_float(axis.n - 1))
        outside = beyond & xp.not_equal(axis.scale, 1.0)
    return clamp_index(xp, index, axis.n), weight, outside


# --- conversion time: taps as constants, compared with TF's resize kernels -------------------


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


def onnx_sampling(
    at: SamplingAttrs, size: int, out: int, scale, roi_start=0.0, roi_end=1.0
) -> Sampling:
    """The taps onnxruntime uses along one resized axis (scale != 1), as constants.

    onnxruntime spreads align_corners and tf_crop_and_resize over the output length."""
    scale = F32(scale)
    axis = Axis(size, out, scale, scale * F32(size), F32(out), (F32(roi_start), F32(roi_end)))
    with np.errstate(divide="ignore", invalid="ignore"):  # discarded branches of `where`
        index, weight, outside = taps(NUMPY, at, axis)
    if weight is None:
        index, weight = index[:, None], np.ones((out, 1))
    if outside is None:
        outside = np.zeros(out, bool)
    weight = np.where(outside[:, None], 0, np.asarray(weight, np.float64))
    return Sampling(size, index, weight, outside)


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


def tf_kernel_for(samplings: list[Sampling], outs: list[int]):
    """The cheapest TF kernel that samples like `samplings` (one per spatial axis), or None."""
    for kernel in TF_KERNELS:
        if all(s.matches(tf_sampling(kernel, s.size, n)) for s, n in zip(samplings, outs)):
            return kernel
    return None


def kernel_for_any_size(at: SamplingAttrs, scales):
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
