"""Random generators: RandomUniform(Like), RandomNormal(Like) and Bernoulli, in the logical
(ONNX) layout.

TFLite has RANDOM_UNIFORM and RANDOM_STANDARD_NORMAL builtins. The values cannot match
another runtime's generator; shape and dtype do.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler


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
