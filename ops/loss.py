"""The classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, in the
logical (ONNX) layout."""

from __future__ import annotations

from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

from .softmax import softmax


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
