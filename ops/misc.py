"""Ops without a family of their own: Swish, CumProd, BitCast, EyeLike, the two
classification losses, and the random generators.

All run in the logical (ONNX) layout.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from onnx import helper
from onnx2tf_alt.ops.softmax import softmax

from onnx2tf_alt.layout import agnostic
from onnx2tf_alt.registry import handler

# Longest axis for which CumProd is unrolled into TFLite builtins (MUL, CONCATENATION);
# longer ones use tf.math.cumprod (a Select TF op in TFLite).
_UNROLL_LIMIT = 64


@handler("Swish", since=24)
def swish(ctx):
    x = ctx.x(0)
    return x * tf.sigmoid(x * ctx.attr("alpha", 1.0))


def _cumprod(x, axis: int, exclusive: bool, reverse: bool):
    """Running product along `axis`, unrolled when the axis is short and static."""
    length = x.shape[axis]
    if length is None or length > _UNROLL_LIMIT:
        return tf.math.cumprod(x, axis=axis, exclusive=exclusive, reverse=reverse)
    parts = tf.split(x, length, axis=axis)
    if reverse:
        parts = parts[::-1]
    if exclusive:
        parts = [tf.ones_like(parts[0]), *parts[:-1]]
    running = [parts[0]]
    for part in parts[1:]:
        running.append(running[-1] * part)
    if reverse:
        running = running[::-1]
    return tf.concat(running, axis=axis)


@handler("CumProd", since=26)
def cumprod(ctx):
    x, axis, rank = ctx.x(0), ctx.const(1), ctx.rank(0)
    exclusive, reverse = bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))
    if axis is not None or rank == 1:
        return _cumprod(x, 0 if axis is None else int(axis) % rank, exclusive, reverse)
    # A runtime axis: the running product along every axis, picked by the axis value.
    every = tf.stack([_cumprod(x, a, exclusive, reverse) for a in range(rank)])
    index = tf.math.floormod(tf.reshape(tf.cast(ctx.x(1), tf.int32), [1]), rank)
    return tf.squeeze(tf.gather(every, index), 0)


@handler("BitCast", since=26)
def bit_cast(ctx):
    x = ctx.x(0)
    to = tf.as_dtype(helper.tensor_dtype_to_np_dtype(ctx.attr("to")))
    if tf.bool in (to, x.dtype):  # one byte holding 0 or 1; tf.bitcast has no bool
        return tf.cast(x, to)
    return tf.bitcast(x, to)


@handler("EyeLike", since=9, limits="static input shape")
def eye_like(ctx):
    rows, cols = ctx.shape(0)
    if rows is None or cols is None:
        raise NotImplementedError("EyeLike needs a static input shape")
    return np.eye(rows, cols, ctx.attr("k", 0), dtype=ctx.out_dtype(0))


def _shape(x):
    """x's shape as a list of ints when static, else as a tensor."""
    static = x.shape.as_list()
    return tf.shape(x) if None in static else static


def _merge_spatial(x, lead: int):
    """x with the axes after the first `lead` merged into one."""
    static = x.shape.as_list()
    if None in static[:lead]:
        return tf.reshape(x, tf.concat([tf.shape(x)[:lead], [-1]], axis=0))
    return tf.reshape(x, [*static[:lead], -1])


def _class_loss(ctx, log_prob):
    """-log_prob[n, target[n, ...], ...] weighted and reduced as both loss ops define it.

    Spatial axes are merged into one (as TFLite kernels take at most 5-D tensors).
    """
    target_shape = _shape(ctx.x(1))
    classes = log_prob.shape[1]
    target = _merge_spatial(tf.cast(ctx.x(1), tf.int32), 1)
    log_prob = _merge_spatial(log_prob, 2)
    # An out-of-range target (ignore_index) selects nothing and gets weight 0.
    chosen = tf.one_hot(target, classes, axis=1, dtype=log_prob.dtype)
    loss = -tf.reduce_sum(chosen * log_prob, axis=1)
    weight = None
    if ctx.has(2):
        per_class = tf.reshape(tf.cast(ctx.x(2), log_prob.dtype), [1, classes, 1])
        weight = tf.reduce_sum(chosen * per_class, axis=1)
    ignore = ctx.attr("ignore_index")
    if ignore is not None:
        keep = tf.cast(tf.not_equal(target, tf.constant(ignore, tf.int32)), loss.dtype)
        weight = keep if weight is None else weight * keep
    if weight is not None:
        loss = loss * weight
    reduction = ctx.attr("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction == "none":
        return tf.reshape(loss, target_shape)
    total = tf.reduce_sum(loss)
    if reduction == "sum":
        return total
    return total / tf.reduce_sum(weight) if weight is not None else tf.reduce_mean(loss)


@handler("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx):
    return _class_loss(ctx, ctx.x(0))


@handler("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx):
    scores = ctx.x(0)
    log_prob = softmax(_merge_spatial(scores, 2), [1], log=True)
    return [_class_loss(ctx, log_prob), tf.reshape(log_prob, _shape(scores))]


# Random generators: TFLite has RANDOM_UNIFORM and RANDOM_STANDARD_NORMAL builtins. The
# values cannot match another runtime's generator; shape and dtype do.
def _random(shape, ctx, normal: bool):
    dtype = tf.as_dtype(ctx.out_dtype(0))
    seed = ctx.attr("seed")
    seed = None if seed is None else int(seed)
    if normal:
        sample = tf.random.normal(shape, seed=seed)
        return tf.cast(sample * ctx.attr("scale", 1.0) + ctx.attr("mean", 0.0), dtype)
    low, high = ctx.attr("low", 0.0), ctx.attr("high", 1.0)
    return tf.cast(tf.random.uniform(shape, seed=seed) * (high - low) + low, dtype)


def _fixed_random(ctx, normal: bool):
    """No tensor input: values are drawn once, at conversion time (seeded by `seed`)."""
    seed = ctx.attr("seed")
    rng = np.random.default_rng(None if seed is None else int(seed))
    shape = tuple(ctx.attr("shape"))
    if normal:
        values = rng.normal(ctx.attr("mean", 0.0), ctx.attr("scale", 1.0), shape)
    else:
        values = rng.uniform(ctx.attr("low", 0.0), ctx.attr("high", 1.0), shape)
    return values.astype(ctx.out_dtype(0))


@handler("RandomUniformLike", since=1)
def random_uniform_like(ctx):
    return _random(tf.shape(ctx.x(0)), ctx, normal=False)


@handler("RandomNormalLike", since=1)
def random_normal_like(ctx):
    return _random(tf.shape(ctx.x(0)), ctx, normal=True)


@handler("RandomUniform", since=1, limits="values drawn once, at conversion time")
def random_uniform(ctx):
    return _fixed_random(ctx, normal=False)


@handler("RandomNormal", since=1, limits="values drawn once, at conversion time")
def random_normal(ctx):
    return _fixed_random(ctx, normal=True)


@handler("Bernoulli", since=15)
def bernoulli(ctx):
    p = ctx.x(0)
    seed = ctx.attr("seed")
    draw = tf.random.uniform(tf.shape(p), seed=None if seed is None else int(seed))
    return tf.cast(draw < tf.cast(p, tf.float32), tf.as_dtype(ctx.out_dtype(0)))


# --- Optional (tensor-typed values only) -------------------------------------------------
@handler("OptionalHasElement", since=15,
         limits="tensor inputs (always present) or no input; no optional-typed values")
def optional_has_element(ctx):
    return np.array(ctx.has(0))


@handler("OptionalGetElement", since=15, layout=agnostic, limits="tensor inputs only")
def optional_get_element(ctx):
    return tf.identity(ctx.x(0))
