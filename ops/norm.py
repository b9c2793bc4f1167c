"""Normalization ops: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LRN, MeanVarianceNormalization, LpNormalization.

Per-channel ops run channel-last (the channel is the last physical axis); the others run
in their input's perm with the normalized axes mapped through it.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.layout.policies import Decision, channel_last, custom_policy, same_as_input
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from .reduce import innermost


@custom_policy
def broadcast_like_data(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
    """Input 0 keeps its perm; the other inputs broadcast against it, so they are
    rank-aligned (leading size-1 axes) and given the same perm; outputs of its rank keep it.
    """
    base = in_perms[0]
    wanted = [None if p is None else base for p in in_perms]
    ranks = [graph.rank(o) or 0 for o in node.outputs]
    return Decision(wanted, [base if r == len(base) else P.identity(r) for r in ranks])


def normalize(x, axes, epsilon):
    """((x - mean) * inv_std, mean, inv_std) over physical `axes` (statistics keep dims),
    computed over the innermost axes where a RESHAPE makes them so (see innermost)."""
    moved, axes = innermost(x, axes)
    mean = tf.reduce_mean(moved, axes, keepdims=True)
    centered = moved - mean
    inv_std = tf.math.rsqrt(tf.reduce_mean(centered * centered, axes, keepdims=True) + epsilon)
    y = centered * inv_std
    return (y if moved is x else tf.reshape(y, x.shape)), mean, inv_std


def _stashed(ctx, x):
    """x in the precision of the statistics (stash_type=1: at least float32)."""
    if ctx.attr("stash_type", 1) == 1 and x.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(x, tf.float32)
    return x


def _reshape_like(y, x):
    """y reshaped to x's shape (read at run time when several dims are unknown)."""
    shape = x.shape.as_list()
    if shape.count(None) > 1:
        return tf.reshape(y, tf.shape(x))
    return tf.reshape(y, [-1 if d is None else d for d in shape])


def _static_channels(ctx) -> int:
    channels = ctx.shape(0)[1]
    if channels is None:
        raise NotImplementedError(f"{ctx.node.op_type} needs a static channel dimension")
    return int(channels)


def _channel_param(ctx, i: int, dtype):
    """BatchNormalization parameter i in the physical layout of a channel-last input.

    Parameters are (C,), or with spatial=0 (opset < 9) (C, D1, ..., Dn): the channel
    axis moves last, as in the data.
    """
    value = ctx.const(i)
    if value is not None:
        return ctx.physical(value.astype(np.float64), 0, first_axis=1)
    tensor = tf.cast(ctx.x(i), dtype)
    rank = ctx.rank(i)
    return tensor if rank == 1 else tf.transpose(tensor, [*range(1, rank), 0])


def _folded(ctx) -> tuple[np.ndarray, np.ndarray] | None:
    """(mul, add) of an inference BatchNormalization with constant parameters, computed at
    conversion time in float64, in the input's dtype and physical layout; None otherwise."""
    if any(ctx.const(i) is None for i in range(1, 5)):
        return None
    scale, bias, mean, var = (_channel_param(ctx, i, None) for i in range(1, 5))
    mul = scale / np.sqrt(var + ctx.attr("epsilon", 1e-5))
    dtype = ctx.dtype(0)
    return mul.astype(dtype), (bias - mean * mul).astype(dtype)


@direct("BatchNormalization", since=7)
def batch_normalization_direct(ctx):
    folded = None if ctx.attr("training_mode", 0) or any(ctx.node.outputs[1:]) else _folded(ctx)
    if folded is None:
        raise NotCovered("training mode or run-time parameters")
    scaled, out = ctx.temp(ctx.out_phys_shape(), "scaled"), ctx.output()
    arithmetic = options("MulOptions", fusedActivationFunction=0)
    ctx.op("MUL", [ctx.x(0), ctx.weight(folded[0], "mul")], scaled, arithmetic)
    ctx.op("ADD", [scaled, ctx.weight(folded[1], "add")], out,
           options("AddOptions", fusedActivationFunction=0))
    return out


@handler(
    "BatchNormalization",
    since=7,
    layout=channel_last(0),
    limits="training_mode=1 from opset 14 (batch statistics, updated running statistics); "
    "the saved statistics outputs of opsets 7-13 are not supported",
)
def batch_normalization(ctx):
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx)
    if any(ctx.node.outputs[1:]):
        raise NotImplementedError(
            "BatchNormalization with saved-statistics outputs (training, before opset 14) is "
            "not supported; export the model in inference mode"
        )
    x = ctx.x(0)
    folded = _folded(ctx)
    if folded is not None:  # one MUL and one ADD, which TFLite fuses into a conv
        return x * ctx.const_tensor(folded[0]) + ctx.const_tensor(folded[1])
    epsilon = ctx.attr("epsilon", 1e-5)
    scale, bias, mean, var = (_channel_param(ctx, i, x.dtype) for i in range(1, 5))
    scale, bias, mean, var = (
        ctx.const_tensor(p.astype(ctx.dtype(0))) if isinstance(p, np.ndarray) else p
        for p in (scale, bias, mean, var)
    )
    mul = scale * tf.math.rsqrt(var + epsilon)
    return x * mul + (bias - mean * mul)


def _batch_norm_training(ctx):
    """Normalize with the batch's own mean and (population) variance per channel; the
    running statistics outputs are input * momentum + batch * (1 - momentum)."""
    x = ctx.x(0)
    channel = ctx.axis(1)
    axes = [a for a in range(ctx.rank(0)) if a != channel]
    mean = tf.reduce_mean(x, axes)
    centered = x - _to_channel(mean, ctx)
    var = tf.reduce_mean(centered * centered, axes)  # MUL: see elementwise._POW_SHORTCUTS
    momentum = ctx.attr("momentum", 0.9)
    scale = ctx.x(1) * tf.math.rsqrt(var + ctx.attr("epsilon", 1e-5))
    y = x * _to_channel(scale, ctx) + _to_channel(ctx.x(2) - mean * scale, ctx)
    running_mean = ctx.x(3) * momentum + mean * (1 - momentum)
    running_var = ctx.x(4) * momentum + var * (1 - momentum)
    return [y, running_mean, running_var][: len(ctx.node.outputs)]


def _to_channel(vector, ctx):
    """A per-channel vector shaped to broadcast along input 0's physical channel axis."""
    shape = [1] * ctx.rank(0)
    shape[ctx.axis(1)] = -1
    return tf.reshape(vector, shape)


@handler("InstanceNormalization", since=6, layout=channel_last(0))
def instance_normalization(ctx):
    spatial = list(range(1, ctx.rank(0) - 1))
    y, _, _ = normalize(ctx.x(0), spatial, ctx.attr("epsilon", 1e-5))
    scale, bias = ctx.const(1), ctx.const(2)  # GroupNorm exports: ones and zeros
    if scale is None or np.any(scale != 1):
        y = y * ctx.x(1)
    return y if bias is not None and not np.any(bias) else y + ctx.x(2)


# onnxruntime also runs LayerNormalization below opset 17 (a contrib op of the ONNX domain,
# which its transformers optimizer writes).
@handler("LayerNormalization", since=1, layout=broadcast_like_data)
def layer_normalization(ctx):
    rank = ctx.rank(0)
    axis = ctx.attr("axis", -1) % rank
    x = ctx.x(0)
    axes = ctx.axes(range(axis, rank))
    y, mean, inv_std = normalize(_stashed(ctx, x), axes, ctx.attr("epsilon", 1e-5))
    y = tf.cast(y, x.dtype) * ctx.x(1)
    if ctx.has(2):
        y = y + ctx.x(2)
    return [y, mean, inv_std]


@direct("LayerNormalization", since=1)
def layer_normalization_direct(ctx):
    """normalize's ops (MEAN, SUB, MUL, MEAN, ADD, RSQRT, MUL), then the scale and bias."""
    if any(ctx.node.outputs[1:]):
        raise NotCovered("the mean and inverse deviation outputs")
    rank = ctx.rank(0)
    reduced = ctx.axes(range(ctx.attr("axis", -1) % rank, rank))
    axes = ctx.ints(reduced, "axes")
    shape, x = ctx.out_phys_shape(), ctx.x(0)
    kept = tuple(1 if a in reduced else d for a, d in enumerate(shape))
    reduce = options("ReducerOptions", keepDims=True)

    def arith(kind: str):
        return options(f"{kind.title()}Options", fusedActivationFunction=0)

    mean, centered, squared, variance, shifted, inv_std, normalized = (
        ctx.temp(s, n) for s, n in ((kept, "mean"), (shape, "centered"), (shape, "squared"),
                                    (kept, "variance"), (kept, "shifted"), (kept, "inv_std"),
                                    (shape, "normalized")))
    ctx.op("MEAN", [x, axes], mean, reduce)
    ctx.op("SUB", [x, mean], centered, arith("sub"))
    ctx.op("MUL", [centered, centered], squared, arith("mul"))
    ctx.op("MEAN", [squared, axes], variance, reduce)
    ctx.op("ADD", [variance, ctx.weight(np.float32(ctx.attr("epsilon", 1e-5)), "epsilon")],
           shifted, arith("add"))
    ctx.op("RSQRT", [shifted], inv_std)
    ctx.op("MUL", [centered, inv_std], normalized, arith("mul"))
    out = ctx.output()
    scaled = ctx.temp(shape, "scaled") if ctx.has(2) else out
    ctx.op("MUL", [normalized, ctx.x(1)], scaled, arith("mul"))
    if ctx.has(2):
        ctx.op("ADD", [scaled, ctx.x(2)], out, arith("add"))
    return out


def _group_normalize(ctx, x):
    """x (N, spatial..., C) normalized per instance and group, as (N, S, G, C/G)."""
    groups = ctx.attr("num_groups")
    channels = _static_channels(ctx)
    n, *spatial, _ = x.shape.as_list()
    inner = [groups, channels // groups]
    if None not in spatial:
        dims = [-1, int(np.prod(spatial)), *inner]
    elif n is not None:
        dims = [n, -1, *inner]
    else:
        dims = tf.concat([tf.shape(x)[:1], [-1, *inner]], axis=0)
    y, _, _ = normalize(tf.reshape(x, dims), [1, 3], ctx.attr("epsilon", 1e-5))
    return y


@handler("GroupNormalization", since=18, layout=channel_last(0),
         limits="the channel dimension must be static")
def group_normalization_18(ctx):
    """Opset 18: scale and bias hold one value per group."""
    x = ctx.x(0)
    groups = ctx.attr("num_groups")
    y = _group_normalize(ctx, x)
    y = y * tf.reshape(ctx.x(1), [groups, 1]) + tf.reshape(ctx.x(2), [groups, 1])
    return _reshape_like(y, x)


@handler("GroupNormalization", since=21, layout=channel_last(0),
         limits="the channel dimension must be static")
def group_normalization_21(ctx):
    """Opset 21: scale and bias hold one value per channel; statistics in stash_type."""
    x = ctx.x(0)
    y = _reshape_like(_group_normalize(ctx, _stashed(ctx, x)), x)
    return tf.cast(y, x.dtype) * ctx.x(1) + ctx.x(2)


@handler("LRN", since=1, layout=channel_last(0), limits="the channel dimension must be static "
         "unless the input is 4-D and size is odd")
def lrn(ctx):
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    x = ctx.x(0)
    if size % 2 == 1 and ctx.rank(0) == 4:
        # TF's window is symmetric and its alpha is not divided by the window size.
        return tf.nn.local_response_normalization(
            x, depth_radius=size // 2, bias=bias, alpha=alpha / size, beta=beta
        )
    # Even sizes have an asymmetric window (floor((size-1)/2) channels before, the rest
    # after): sum the squares over it with a banded channel-mixing matrix.
    channels = _static_channels(ctx)
    before = (size - 1) // 2
    offset = np.arange(channels)[:, None] - np.arange(channels)[None, :]  # in - out channel
    band = ((offset >= -before) & (offset <= size - 1 - before)).astype(ctx.dtype(0))
    square_sum = tf.linalg.matmul(tf.square(x), ctx.const_tensor(band))
    return x / tf.pow(bias + (alpha / size) * square_sum, beta)


@handler("MeanVarianceNormalization", since=9, layout=same_as_input(0))
def mean_variance_normalization(ctx):
    x = ctx.x(0)
    axes = ctx.axes(ctx.attr("axes", [0, 2, 3]))
    mean = tf.reduce_mean(x, axes, keepdims=True)
    centered = x - mean
    std = tf.sqrt(tf.reduce_mean(centered * centered, axes, keepdims=True))
    return centered / (std + 1e-9)


@handler("LpNormalization", since=1, layout=same_as_input(0), limits="p must be 1 or 2")
def lp_normalization(ctx):
    x = ctx.x(0)
    axis = ctx.axis(ctx.attr("axis", -1))
    p = ctx.attr("p", 2)
    if p == 1:
        norm = tf.reduce_sum(tf.abs(x), axis, keepdims=True)
    elif p == 2:
        norm = tf.sqrt(tf.reduce_sum(tf.square(x), axis, keepdims=True))
    else:
        raise NotImplementedError(f"LpNormalization with p={p} (ONNX allows only 1 and 2)")
    # an all-zero slice normalizes to zeros (0 / tiny), not NaN
    return x / tf.maximum(norm, np.finfo(x.dtype.as_numpy_dtype).tiny)
