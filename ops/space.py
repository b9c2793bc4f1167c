"""DepthToSpace and SpaceToDepth on channel-last tensors (TFLite DEPTH_TO_SPACE, SPACE_TO_DEPTH).

TF's kernels order the depth as (block row, block column, channel), which is ONNX's DCR mode
and SpaceToDepth's order; CRD (channel, block row, block column) first reorders the channels
with one gather, so no transpose is needed.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.layout.policies import channel_last
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


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
