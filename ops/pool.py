"""Pooling on channel-last tensors: MaxPool, AveragePool, LpPool and the global pools.

Undilated windows become TF pools (TFLite MAX_POOL_2D / AVERAGE_POOL_2D): 1-D runs as 2-D
with a unit height and 3-D as two 2-D pools (TFLite has no 3-D pool; max and mean are
separable). Padding TF's SAME does not reproduce (pads no window reaches do not count) is
added explicitly (for max copies of the edge where every window holds a real element, else
the dtype's lowest value; zeros for sums) and averages are rescaled to the spec's divisor.
Dilated windows, and MaxPool's Indices, are reduced from one strided slice per kernel tap.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from onnx2tf_alt.ops._spatial import (
    is_tf_same,
    kernel_attrs,
    outer,
    pad_spatial,
    pool_output_size,
    replicate_edges,
    same_pads,
    taps_inside,
)

from onnx2tf_alt.layout.policies import channel_last, same_as_input
from onnx2tf_alt.tflite import direct as direct_writer
from onnx2tf_alt.tflite.direct import PADDING, NotCovered, options
from onnx2tf_alt.translate.context import reshape
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler


@dataclass
class Window:
    """A pooling window along the spatial axes, with ONNX semantics resolved."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list  # (begin, end) per axis; None: TF SAME at run time (unknown size)
    spatial: tuple  # input sizes (None: unknown)
    ceil_mode: bool

    @property
    def dilated(self) -> bool:
        return any(d > 1 for d in self.dilations)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    def require_static(self, what: str) -> None:
        if any(size is None for size in self.spatial):
            raise NotImplementedError(f"{what} needs static spatial dims; use -ois")

    def tf_padding(self) -> str | None:
        """'VALID' or 'SAME' when a TF pool visits exactly this window's taps, else None.

        Pads no window reaches do not count (explicit_pads), so ceil_mode and floor-mode
        leftovers often fold into SAME: TF's SAME pool skips its padded cells, which for a max
        equals padding with the lowest value and for an average excludes them from the divisor.
        """
        if self.dilated:
            return None
        if any(size is None for size in self.spatial):
            if self.ceil_mode:
                return None
            if all(p == (0, 0) for p in self.pads):
                return "VALID"
            return "SAME" if is_tf_same(self.pads, self.kernel, self.strides, self.dilations,
                                        self.spatial) else None
        pads = self.explicit_pads()
        if all(p == (0, 0) for p in pads):
            return "VALID"
        same = [(math.ceil(size / s), same_pads(size, k, s, 1)[0])
                for size, k, s in zip(self.spatial, self.kernel, self.strides)]
        if same == [(out, b) for out, (b, _) in zip(self.out_sizes(), pads)]:
            return "SAME"
        return None

    def explicit_pads(self) -> list[tuple[int, int]]:
        """(begin, end) that make every window lie inside the padded tensor; end pads that no
        window reaches (floor-mode leftovers) are dropped, ceil_mode's extra ones added."""
        if any(p is None for p in self.pads):
            self.require_static("this padding")
        if not self.ceil_mode and any(size is None for size in self.spatial):
            return list(self.pads)
        return [(b, max((out - 1) * s + (k - 1) * d + 1 - size - b, 0))
                for out, size, k, s, d, (b, _) in zip(self.out_sizes(), *self._axes())]

    def out_sizes(self) -> list[int]:
        self.require_static("this pooling window")
        return [pool_output_size(size, k, s, d, p, self.ceil_mode)
                for size, k, s, d, p in zip(*self._axes())]

    def divisor(self, include_pad: bool) -> np.ndarray | int:
        """Per output position, the number of taps the spec averages over."""
        if include_pad and not self.ceil_mode:  # every tap lies in the counted region
            return self.taps
        self.require_static("AveragePool with this padding")
        counts = []
        for out, (size, k, s, d, (b, e)) in zip(self.out_sizes(), zip(*self._axes())):
            lo, hi = (-b, size + e) if include_pad else (0, size)
            counts.append(taps_inside(out, k, s, d, b, lo, hi))
        return outer(counts)

    def _axes(self):
        return self.spatial, self.kernel, self.strides, self.dilations, self.pads


def _window(ctx) -> Window:
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = kernel_attrs(ctx, kernel)
    return Window(kernel, strides, dilations, pads, tuple(ctx.shape(0)[2:]),
                  bool(ctx.attr("ceil_mode", 0)))


def _pool_nd(x, kind: str, kernel, strides, padding: str):
    """TF max or average pool of a channel-last 1-D, 2-D or 3-D tensor."""
    op = tf.nn.max_pool2d if kind == "MAX" else tf.nn.avg_pool2d
    if len(kernel) == 1:
        return tf.squeeze(op(tf.expand_dims(x, 1), [1, *kernel], [1, *strides], padding), 1)
    if len(kernel) == 2:
        return op(x, kernel, strides, padding)
    _, depth, height, width, channels = x.shape
    if None in (depth, height, width, channels):
        raise NotImplementedError("3-D pooling needs static spatial dims; use -ois")
    y = op(reshape(x, [None, height, width, channels]), kernel[1:], strides[1:], padding)
    _, height, width, _ = y.shape
    y = op(reshape(y, [None, depth, height * width, channels]), [kernel[0], 1],
           [strides[0], 1], padding)
    return reshape(y, [None, y.shape[1], height, width, channels])


def _tap_slices(x, win: Window):
    """(tap, slice) per kernel tap in row-major order, from x padded by win.explicit_pads()."""
    n, outs = len(win.kernel), win.out_sizes()
    edges = 1 | 1 << (n + 1)  # batch and channel axes: take all
    for tap in itertools.product(*(range(k) for k in win.kernel)):
        begin = [j * d for j, d in zip(tap, win.dilations)]
        end = [b + (o - 1) * s + 1 for b, o, s in zip(begin, outs, win.strides)]
        yield tap, tf.strided_slice(x, [0, *begin, 0], [0, *end, 0], [1, *win.strides, 1],
                                    begin_mask=edges, end_mask=edges)


def _scaled(ctx, y, factor):
    """y * factor (a scalar or one value per output position); no op when it is all ones."""
    factor = np.asarray(factor, dtype=y.dtype.as_numpy_dtype)
    if np.all(factor == 1):
        return y
    if factor.ndim:
        factor = ctx.const_tensor(factor.reshape(1, *factor.shape, 1))
    return y * factor


def _window_sum(ctx, x, win: Window, scale=1.0):
    """Sum over each window, padding counted as zeros, times `scale`."""
    x = pad_spatial(x, win.explicit_pads())
    if win.dilated:
        return _scaled(ctx, tf.add_n([s for _, s in _tap_slices(x, win)]), scale)
    mean = _pool_nd(x, "AVG", win.kernel, win.strides, "VALID")
    return _scaled(ctx, mean, np.asarray(scale) * win.taps)


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min


def _max_with_indices(ctx, win: Window, x):
    """MaxPool's (Y, Indices) from x padded by win.explicit_pads().

    An index points into the NC(D)HW input flattened row-major (storage_order 1: spatial
    axes column-major). ARG_MAX over the taps picks the first maximum in row-major tap
    order, as onnxruntime does; its tap is then an offset from the window's first tap.
    Computed in int32 (int64 constants would not survive a Keras reload); the builder
    casts to the ONNX int64.
    """
    sizes, outs = win.spatial, win.out_sizes()
    if ctx.attr("storage_order", 0):
        steps = [math.prod(sizes[:i]) for i in range(len(sizes))]
    else:
        steps = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    taps = list(_tap_slices(x, win))
    tap_offsets = [sum(j * d * n for j, d, n in zip(tap, win.dilations, steps)) for tap, _ in taps]
    stacked = tf.stack([values for _, values in taps], axis=-1)
    offset = tf.gather(tf.constant(tap_offsets, tf.int32),
                       tf.argmax(stacked, axis=-1, output_type=tf.int32))
    starts = [(np.arange(o) * s - b) * n
              for o, s, (b, _), n in zip(outs, win.strides, win.pads, steps)]
    first_tap = outer(starts, np.add).astype(np.int32).reshape(1, *outs, 1)
    plane, channels = math.prod(sizes), x.shape[-1]
    per_channel = np.arange(channels, dtype=np.int32) * plane
    batch = tf.range(tf.shape(x)[0]) * (channels * plane)
    batch = tf.reshape(batch, [-1] + [1] * (len(sizes) + 1))
    indices = offset + ctx.const_tensor(first_tap + per_channel) + batch
    return tf.reduce_max(stacked, axis=-1), indices


@handler("MaxPool", layout=channel_last(0),
         limits="static spatial dims for dilations, ceil_mode, Indices and non-SAME pads; "
                "Indices below 2**31")
def max_pool(ctx):
    win = _window(ctx)
    lowest = _lowest(ctx.dtype(0))
    x = ctx.x(0)
    if x.dtype.is_integer:  # int8 / uint8: TFLite's max pool takes them only quantized
        x = tf.cast(x, tf.float32)  # exact; the builder casts the result back
        lowest = float(lowest) - 1  # below every value, so Indices never pick the padding
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        return _max_with_indices(ctx, win, pad_spatial(x, win.explicit_pads(), lowest))
    padding = win.tf_padding()
    if padding is not None:
        return _pool_nd(x, "MAX", win.kernel, win.strides, padding)
    pads = win.explicit_pads()
    if not win.dilated and all(max(p) < k for p, k in zip(pads, win.kernel)):
        # Copies of the edge never change a window's max while each window still holds a real
        # element (and so, being contiguous, the edge it copies). Unlike the dtype's lowest
        # value (a PADV2), they keep INT8 calibration ranges sane.
        x = replicate_edges(x, pads)
    else:
        x = pad_spatial(x, pads, lowest)
    if win.dilated:
        return tf.reduce_max(tf.stack([s for _, s in _tap_slices(x, win)], axis=-1), axis=-1)
    return _pool_nd(x, "MAX", win.kernel, win.strides, "VALID")


def _pool_direct(ctx, builtin: str, padding: str, x: int | None = None,
                 out: int | None = None) -> int:
    """MAX_POOL_2D / AVERAGE_POOL_2D of a 2-D window with TF's `padding` (_pool_nd's 2-D
    case) on `x` (default input 0) into `out` (default output 0)."""
    win = _window(ctx)
    if len(win.kernel) != 2 or win.dilated:
        raise NotCovered("1-D, 3-D and dilated pools")
    x = ctx.x(0) if x is None else x
    out = ctx.output() if out is None else out
    ctx.op(builtin, [x], out, options(
        "Pool2DOptions", padding=PADDING[padding], strideH=win.strides[0],
        strideW=win.strides[1], filterHeight=win.kernel[0], filterWidth=win.kernel[1],
        fusedActivationFunction=0))
    return out


@direct("MaxPool")
def max_pool_direct(ctx):
    """max_pool's float cases without Indices: TF's padding, else the edges replicated (or
    the lowest value padded) and a VALID pool."""
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise NotCovered("Indices")
    win = _window(ctx)
    padding = win.tf_padding()
    if padding is not None:
        return _pool_direct(ctx, "MAX_POOL_2D", padding)
    if win.dilated or any(size is None for size in win.spatial):
        raise NotCovered("dilated windows, or pads on sizes known at run time")
    pads = win.explicit_pads()
    if all(max(p) < k for p, k in zip(pads, win.kernel)):
        x = direct_writer.replicate_edges(ctx, ctx.x(0), pads)
    else:
        x = direct_writer.pad_spatial(ctx, ctx.x(0), pads, _lowest(ctx.dtype(0)))
    return _pool_direct(ctx, "MAX_POOL_2D", "VALID", x)


@handler("AveragePool", layout=channel_last(0),
         limits="static spatial dims unless the padding is VALID or TF SAME")
def average_pool(ctx):
    return average(ctx, ctx.x(0))


@direct("AveragePool")
def average_pool_direct(ctx):
    """average's cases: TF's padding, else zero pads, a VALID pool and the spec's divisor."""
    win = _window(ctx)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    padding = win.tf_padding()
    if padding == "VALID" or (padding == "SAME" and not include_pad):
        return _pool_direct(ctx, "AVERAGE_POOL_2D", padding)
    if win.dilated or any(size is None for size in win.spatial):
        raise NotCovered("dilated windows, or pads on sizes known at run time")
    x = direct_writer.pad_spatial(ctx, ctx.x(0), win.explicit_pads())
    factor = np.asarray(win.taps / np.asarray(win.divisor(include_pad)), np.float32)
    if np.all(factor == 1):
        return _pool_direct(ctx, "AVERAGE_POOL_2D", "VALID", x)
    mean = _pool_direct(ctx, "AVERAGE_POOL_2D", "VALID", x, ctx.temp(ctx.out_phys_shape(), "mean"))
    out = ctx.output()
    scale = factor.reshape(1, *factor.shape, 1) if factor.ndim else factor
    ctx.op("MUL", [mean, ctx.weight(scale, "divisor")], out,
           options("MulOptions", fusedActivationFunction=0))
    return out


def average(ctx, x):
    """AveragePool of the channel-last x with the node's attributes (QLinearAveragePool
    pools its dequantized input with it)."""
    win = _window(ctx)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    padding = win.tf_padding()
    if padding == "VALID" or (padding == "SAME" and not include_pad):  # TF SAME skips pads
        return _pool_nd(x, "AVG", win.kernel, win.strides, padding)
    return _window_sum(ctx, x, win, 1.0 / win.divisor(include_pad))


def _abs_pow(x, p: float):
    return tf.square(x) if p == 2 else tf.abs(x) if p == 1 else tf.pow(tf.abs(x), p)


def _root(x, p: float):
    return tf.sqrt(x) if p == 2 else x if p == 1 else tf.pow(x, 1.0 / p)


@handler("LpPool", layout=channel_last(0), limits="static spatial dims unless unpadded")
def lp_pool(ctx):
    p = float(ctx.attr("p", 2))
    return _root(_window_sum(ctx, _abs_pow(ctx.x(0), p), _window(ctx)), p)


def _spatial_axes(ctx) -> list[int]:
    """Physical axes of the input's spatial (logical 2..) axes: global pools run on any perm."""
    return ctx.axes(range(2, ctx.rank(0)))


@handler("GlobalAveragePool", layout=same_as_input(0))
def global_average_pool(ctx):
    return tf.reduce_mean(ctx.x(0), _spatial_axes(ctx), keepdims=True)


def _reduce_direct(ctx, builtin: str) -> int:
    out = ctx.output()
    axes = ctx.ints(_spatial_axes(ctx), "axes")
    ctx.op(builtin, [ctx.x(0), axes], out, options("ReducerOptions", keepDims=True))
    return out


@direct("GlobalAveragePool")
def global_average_pool_direct(ctx):
    return _reduce_direct(ctx, "MEAN")


@direct("GlobalMaxPool")
def global_max_pool_direct(ctx):
    return _reduce_direct(ctx, "REDUCE_MAX")


@handler("GlobalMaxPool", layout=same_as_input(0))
def global_max_pool(ctx):
    return tf.reduce_max(ctx.x(0), _spatial_axes(ctx), keepdims=True)


@handler("GlobalLpPool", layout=same_as_input(0))
def global_lp_pool(ctx):
    p = float(ctx.attr("p", 2))
    return _root(tf.reduce_sum(_abs_pow(ctx.x(0), p), _spatial_axes(ctx), keepdims=True), p)
