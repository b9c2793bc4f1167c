"""DepthToSpace and SpaceToDepth on channel-last tensors (TFLite DEPTH_TO_SPACE, SPACE_TO_DEPTH).

TF's kernels order the depth as (block row, block column, channel), which is ONNX's DCR mode
and SpaceToDepth's order; CRD (channel, block row, block column) first reorders the channels
with one gather, so no transpose is needed.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.layout.policies import channel_last
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler


def crd_to_dcr(depth: int, block: int) -> np.ndarray:
    """Source channel of each DCR channel: DCR (i * block + j) * C + c holds CRD c * block² + ..."""
    out_channels = depth // (block * block)
    k = np.arange(depth)
    return (k % out_channels) * block * block + k // out_channels


@handler("DepthToSpace", layout=channel_last(0), limits="CRD mode needs a static channel count")
def depth_to_space(ctx):
    block = ctx.attr("blocksize")
    x = ctx.x(0)
    if ctx.attr("mode", "DCR") == "CRD":
        depth = ctx.shape(0)[1]
        if depth is None:
            raise NotImplementedError("DepthToSpace CRD with an unknown channel count")
        order = crd_to_dcr(depth, block)
        if np.any(order != np.arange(depth)):
            x = tf.gather(x, ctx.const_tensor(order.astype(np.int32)), axis=-1)
    return tf.nn.depth_to_space(x, block)


@handler("SpaceToDepth", layout=channel_last(0), limits="CRD mode needs a static channel count")
def space_to_depth(ctx):
    x = ctx.x(0)
    if x.dtype.is_integer and x.dtype.size <= 2:
        # TFLite's converter has no builtin SPACE_TO_DEPTH for unquantized 8/16-bit integers;
        # float32 holds them exactly (the builder casts the result back)
        x = tf.cast(x, tf.float32)
    block = ctx.attr("blocksize")
    y = tf.nn.space_to_depth(x, block)
    if ctx.attr("mode", "DCR") == "CRD":  # mode exists from opset 28
        depth = ctx.shape(0)[1]
        if depth is None:
            raise NotImplementedError("SpaceToDepth CRD with an unknown channel count")
        order = np.argsort(crd_to_dcr(depth * block * block, block))
        if np.any(order != np.arange(order.size)):
            y = tf.gather(y, ctx.const_tensor(order.astype(np.int32)), axis=-1)
    return y


def _channel_gather(ctx, x: int, order: np.ndarray, shape, out: int | None = None) -> int:
    """GATHER of channel-last x's channels in `order` (into `out`, else a new tensor)."""
    out = ctx.temp(shape, "reordered") if out is None else out
    ctx.op("GATHER", [x, ctx.ints(order, "order")], out,
           options("GatherOptions", axis=len(shape) - 1, batchDims=0))
    return out


def _crd_order(ctx, depth: int, block: int, inverse: bool) -> np.ndarray | None:
    """The gather of CRD mode (None: none needed), as the handlers compute it."""
    if ctx.attr("mode", "DCR") != "CRD":
        return None
    if depth is None:
        raise NotCovered("CRD mode with an unknown channel count")
    order = crd_to_dcr(depth, block)
    order = np.argsort(order) if inverse else order
    return None if np.all(order == np.arange(depth)) else order


@direct("DepthToSpace")
def depth_to_space_direct(ctx):
    block, x = ctx.attr("blocksize"), ctx.x(0)
    order = _crd_order(ctx, ctx.shape(0)[1], block, inverse=False)
    if order is not None:
        x = _channel_gather(ctx, x, order, ctx.flat.shape(x))
    out = ctx.output()
    ctx.op("DEPTH_TO_SPACE", [x], out, options("DepthToSpaceOptions", blockSize=block))
    return out


@direct("SpaceToDepth")
def space_to_depth_direct(ctx):
    block, shape = ctx.attr("blocksize"), ctx.out_phys_shape()
    depth = None if ctx.shape(0)[1] is None else ctx.shape(0)[1] * block * block
    order = _crd_order(ctx, depth, block, inverse=True)
    out = ctx.output()
    y = out if order is None else ctx.temp(shape, "blocks")
    ctx.op("SPACE_TO_DEPTH", [ctx.x(0)], y, options("SpaceToDepthOptions", blockSize=block))
    return out if order is None else _channel_gather(ctx, y, order, shape, out)
