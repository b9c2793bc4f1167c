"""Softmax, LogSoftmax and Hardmax over the physical axes that hold the logical ones.

Opset 13 normalizes over one axis; earlier opsets coerce the input to 2-D at `axis` and
normalize over the flattened tail [axis, rank). Softmax and LogSoftmax over several axes
do not depend on the order of those axes, so both versions run on the input's own layout:
TFLite gets its SOFTMAX / LOG_SOFTMAX when the axes are physically last, and reduce ops
over the physical axes otherwise (never a transpose). Half precision (TF only: TFLite
computes float16 models in float32 and has no bfloat16) is computed step by step as the
ONNX reference does in numpy, each step rounded to the half type: the TF kernels would sum
float16 in float16 and bfloat16 in float32, where numpy does the opposite.
"""

from __future__ import annotations

from onnx2tf_alt.ops._shapes import physical_axes

from onnx2tf_alt.layout.policies import custom_policy, logical, same_as_input
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

HALF = ("float16", "bfloat16")


def _flatten_tail(x, start: int):
    """x with physical axes [start, rank) merged into one."""
    head = x.shape[:start].as_list()
    if None in head:
        return tf.reshape(x, tf.concat([tf.shape(x)[:start], [-1]], axis=0))
    return tf.reshape(x, [*head, -1])


def _restore(y, like):
    shape = like.shape.as_list()
    return tf.reshape(y, tf.shape(like) if None in shape else shape)


def _is_tail(axes: list[int], rank: int) -> bool:
    return axes == list(range(rank - len(axes), rank))


def softmax(x, axes: list[int], log: bool = False):
    """(Log)softmax of x over the physical `axes` (sorted)."""
    rank = x.shape.rank
    if _is_tail(axes, rank) and x.dtype.name not in HALF:
        fn = tf.nn.log_softmax if log else tf.nn.softmax
        if len(axes) == 1:
            return fn(x)
        return _restore(fn(_flatten_tail(x, axes[0])), x)
    z = x - tf.reduce_max(x, axis=axes, keepdims=True)
    if log:
        return z - tf.math.log(_sum(tf.exp(z), axes))
    e = tf.exp(z)
    return e / _sum(e, axes)


def _sum(x, axes: list[int]):
    """Sum over `axes`, kept, accumulated as numpy does: float16 in float32, bfloat16 over
    one axis in order in bfloat16 (the last running sum of a cumsum)."""
    if x.dtype == tf.float16:
        return tf.cast(tf.reduce_sum(tf.cast(x, tf.float32), axis=axes, keepdims=True), x.dtype)
    if x.dtype == tf.bfloat16 and len(axes) == 1:
        depth = x.shape[axes[0]]
        last = depth - 1 if depth is not None else tf.shape(x)[axes[0]] - 1
        return tf.gather(tf.cumsum(x, axis=axes[0]), [last], axis=axes[0])
    return tf.reduce_sum(x, axis=axes, keepdims=True)


def hardmax(x, axes: list[int]):
    """1 at the first maximum over the physical `axes`, 0 elsewhere.

    Several axes must be the physical tail in logical order (the layout policy sees to it),
    so that 'first' follows the ONNX flattening.
    """
    if len(axes) > 1:
        return _restore(hardmax(_flatten_tail(x, axes[0]), [axes[0]]), x)
    axis = axes[0]
    depth = x.shape[axis]
    depth = tf.shape(x)[axis] if depth is None else depth
    return tf.one_hot(tf.math.argmax(x, axis=axis), depth, axis=axis, dtype=x.dtype)


def _flattened_tail(ctx) -> list[int]:
    rank = ctx.rank(0)
    return list(range(ctx.attr("axis", 1) % rank, rank))


@custom_policy
def _one_wide_tail(node, graph, in_perms):
    """Hardmax before opset 13: the input's layout when at most one tail axis is not 1."""
    shape = graph.shapes.get(node.inputs[0])
    if shape is not None:
        tail = shape[node.attrs.get("axis", 1) % len(shape):]
        if sum(d != 1 for d in tail) <= 1:
            return same_as_input(0).decide(node, graph, in_perms)
    return logical.decide(node, graph, in_perms)


def _register(op_type: str, fn, v1_layout) -> None:
    handler(op_type, since=1, layout=v1_layout)(
        lambda ctx: fn(ctx.x(0), physical_axes(ctx, _flattened_tail(ctx)))
    )
    handler(op_type, since=13, layout=same_as_input(0))(
        lambda ctx: fn(ctx.x(0), physical_axes(ctx, [ctx.attr("axis", -1) % ctx.rank(0)]))
    )


def _softmax_direct(ctx, axes: list[int]) -> int:
    """softmax's TFLite case: one SOFTMAX over the physical last axis."""
    if axes != [ctx.rank(0) - 1]:
        raise NotCovered("a softmax not over the one physical last axis")
    out = ctx.output()
    ctx.op("SOFTMAX", [ctx.x(0)], out, options("SoftmaxOptions", beta=1.0))
    return out


_register("Softmax", softmax, same_as_input(0))
direct("Softmax", since=1)(lambda ctx: _softmax_direct(ctx, physical_axes(ctx, _flattened_tail(ctx))))
direct("Softmax", since=13)(
    lambda ctx: _softmax_direct(ctx, physical_axes(ctx, [ctx.attr("axis", -1) % ctx.rank(0)])))
_register("LogSoftmax", lambda x, axes: softmax(x, axes, log=True), same_as_input(0))
_register("Hardmax", hardmax, _one_wide_tail)
