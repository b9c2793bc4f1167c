"""Reductions (Reduce*) and arg-reductions (ArgMax, ArgMin) on the input's own layout.

These ops remap axes instead of transposing: they reduce over the physical axes that hold
the requested logical axes. With keepdims=1 the output keeps the input's perm; with
keepdims=0 it is the input's perm with the reduced axes dropped.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import custom_policy, derived
from onnx2tf_alt.tflite.direct import NotCovered, options
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler


def _static_axes(node, const_of, shape_of) -> list[int] | None:
    """The node's `axes` (attribute, or constant input 1); [] when absent or of static length 0;
    None at run time.

    `const_of(name)` returns a value's constant array (None when computed), `shape_of(name)`
    its inferred shape.
    """
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) < 2 or not node.inputs[1]:
        return []
    value = const_of(node.inputs[1])
    if value is None:
        return [] if shape_of(node.inputs[1]) == (0,) else None
    return [int(a) for a in np.asarray(value).reshape(-1)]


def _reduced_axes(node, axes: list[int], rank: int) -> list[int] | None:
    """Logical axes actually reduced (sorted, non-negative); None for the no-op case."""
    if not axes:
        return None if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a % rank for a in axes})


def _reduce_out_perm(node, graph, in_perm):
    axes = _static_axes(node, graph.constants.get, graph.shapes.get)
    if axes is None:
        return None
    reduced = _reduced_axes(node, axes, len(in_perm))
    if reduced is None or node.attrs.get("keepdims", 1):
        return in_perm
    return P.drop_axes(in_perm, reduced)


def innermost(x, axes):
    """(x, axes) made the same reduction over the innermost axes, where that takes only a
    RESHAPE: contiguous reduced axes followed by size-1 axes move behind them (the output
    shape, kept dims or not, is the same). XNNPACK reduces a middle axis with an inner size
    of 1 element by element: an instance norm over [1, 200704, 1] (PoolFormer's GroupNorm
    of one group) took 0.64 ms, 0.25 over [1, 1, 200704] (benchmarks/profile_tflite.py)."""
    shape = x.shape.as_list()
    reduced = sorted(a % len(shape) for a in axes) if shape else []
    if (not reduced or None in shape or reduced[-1] - reduced[0] != len(reduced) - 1
            or reduced[-1] == len(shape) - 1 or any(d != 1 for d in shape[reduced[-1] + 1:])):
        return x, axes
    trailing = len(shape) - 1 - reduced[-1]
    moved = shape[:reduced[0]] + [1] * trailing + shape[reduced[0]:reduced[-1] + 1]
    return tf.reshape(x, moved), [a + trailing for a in reduced]


def _log_sum_exp(x, reduce):
    """log(sum(exp(x))) shifted by the max, so large inputs do not overflow.

    The shift is clamped to the lowest finite value so all -inf slices give -inf, not NaN.
    """
    m = tf.maximum(reduce(tf.reduce_max, x, True), x.dtype.min)
    return tf.math.log(reduce(tf.reduce_sum, tf.exp(x - m))) + reduce(_squeeze_like, m)


def _squeeze_like(t, axis, keepdims):
    """A 'reduction' of size-1 axes: drops them unless keepdims."""
    return t if keepdims else tf.squeeze(t, axis)


def _max(x, reduce):
    y = reduce(tf.reduce_any if x.dtype == tf.bool else tf.reduce_max, x)
    return _over_empty(x, y, reduce, lambda info: -np.inf if info.dtype.kind == "f" else info.min)


def _min(x, reduce):
    y = reduce(tf.reduce_all if x.dtype == tf.bool else tf.reduce_min, x)
    return _over_empty(x, y, reduce, lambda info: np.inf if info.dtype.kind == "f" else info.max)


def _over_empty(x, y, reduce, identity):
    """y, with the identity ONNX gives a reduction over an empty set (-inf for ReduceMax)
    where x has an empty axis and y's values reduced none (TFLite's kernels give the
    lowest finite value): counted, as the axes may be known only at run time."""
    if x.dtype == tf.bool or 0 not in list(x.shape):
        return y
    dtype = np.dtype(x.dtype.as_numpy_dtype)
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    count = reduce(tf.reduce_sum, tf.ones_like(x, dtype=tf.int32))
    return tf.where(count > 0, y, tf.cast(np.asarray(identity(info), dtype), x.dtype))


# Each op as a formula over `reduce(fn, t[, keepdims])`; with noop_with_empty_axes and no
# axes `reduce` returns t unchanged, which gives onnxruntime's results (x*x, |x|, log x, ...).
REDUCTIONS = {
    "ReduceSum": lambda x, r: r(tf.reduce_sum, x),
    "ReduceMean": lambda x, r: r(tf.reduce_mean, x),
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": lambda x, r: r(tf.reduce_prod, x),
    "ReduceL1": lambda x, r: r(tf.reduce_sum, tf.abs(x)),
    "ReduceL2": lambda x, r: tf.sqrt(r(tf.reduce_sum, tf.square(x))),
    "ReduceSumSquare": lambda x, r: r(tf.reduce_sum, tf.square(x)),
    "ReduceLogSum": lambda x, r: tf.math.log(r(tf.reduce_sum, x)),
    "ReduceLogSumExp": _log_sum_exp,
}


def _reducer(ctx, axes: list[int] | None, keepdims: bool):
    """`reduce(fn, t, keep=None)`: fn over the node's physical axes (`axes`: logical ones, None
    at run time), keeping the reduced axes per `keep` (default: `keepdims`); t itself for the
    no-op case."""
    if axes is None:
        axis = _runtime_axes(ctx)
    else:
        reduced = _reduced_axes(ctx.node, axes, ctx.rank(0))
        if reduced is None:
            return lambda fn, t, keep=None: t
        axis = ctx.axes(reduced)

    def reduce(fn, t, keep=None):
        inner, inner_axis = (t, axis) if axes is None else innermost(t, axis)
        return fn(inner, axis=inner_axis, keepdims=keepdims if keep is None else keep)

    return reduce


def _runtime_axes(ctx):
    """Axes known only at run time (logical layout); an empty tensor means all axes."""
    axes = tf.cast(tf.reshape(ctx.x(1), [-1]), tf.int32)
    if ctx.attr("noop_with_empty_axes", 0):
        if ctx.shape(1) is None or ctx.shape(1)[0] is None:
            raise NotImplementedError("run-time axes of unknown length with noop_with_empty_axes")
        return axes  # statically non-empty: _static_axes took the empty case
    rank = ctx.rank(0)
    all_axes = tf.range(rank)[: rank * tf.cast(tf.equal(tf.size(axes), 0), tf.int32)]
    return tf.concat([axes, all_axes], axis=0)


def _reduce(ctx):
    """With run-time axes and keepdims=0 the reduced axes are unknown: reduce keeping them,
    then reshape to the inferred output shape (logical layout)."""
    keepdims = bool(ctx.attr("keepdims", 1))
    axes = _static_axes(ctx.node, lambda _: ctx.const(1), lambda _: ctx.shape(1))
    runtime = axes is None
    y = REDUCTIONS[ctx.node.op_type](ctx.x(0), _reducer(ctx, axes, keepdims or runtime))
    if keepdims or not runtime:
        return y
    out = ctx.out_shape(0)
    if out is not None and sum(d is None for d in out) <= 1:
        return tf.reshape(y, [-1 if d is None else int(d) for d in out])
    if ctx.shape(1) is None or ctx.shape(1)[0] is None:
        raise NotImplementedError("run-time axes of unknown length with keepdims=0")
    return tf.reshape(y, _kept_dims(y, _runtime_axes(ctx), ctx.rank_out()))


def _kept_dims(y, axes, out_rank: int):
    """Dims of `y` (reduced with keepdims) at the axes not in the run-time `axes`, as a
    vector of the static length `out_rank`: the i-th kept axis goes to position i."""
    rank = y.shape.rank
    axes = tf.math.floormod(axes, rank)
    keep = 1 - tf.reduce_max(tf.cast(tf.equal(tf.range(rank)[:, None], axes[None, :]), tf.int32),
                             axis=1)
    slot = tf.cumsum(keep) - 1
    into = tf.cast(tf.equal(tf.range(out_rank)[:, None], slot[None, :]), tf.int32) * keep
    return tf.reduce_sum(into * tf.shape(y)[None, :], axis=1)


@custom_policy
def _reduce_layout(node, graph, in_perms):
    """The derived layout; with run-time axes and no inferred output shape the output rank
    still follows from the input rank and the static length of the axes."""
    decision = _DERIVED.decide(node, graph, in_perms)
    out = node.outputs[0]
    if graph.rank(out) is None and _static_axes(node, graph.constants.get, graph.shapes.get) is None:
        rank, axes = len(in_perms[0]), graph.shapes.get(node.inputs[1])
        if node.attrs.get("keepdims", 1):
            decision.outputs = [P.identity(rank)]
        elif axes is not None and axes[0] is not None:
            decision.outputs = [P.identity(max(rank - axes[0], 0))]
    return decision


_DERIVED = derived(_reduce_out_perm)
_AXES_INPUT_SINCE = {"ReduceSum": 13}
for _op in REDUCTIONS:
    handler(_op, since=1, layout=derived(_reduce_out_perm))(_reduce)  # axes attribute
    handler(
        _op,
        since=_AXES_INPUT_SINCE.get(_op, 18),
        layout=_reduce_layout,
        limits="run-time axes: no duplicate axes",
    )(_reduce)


_DIRECT = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "REDUCE_MAX",
           "ReduceMin": "REDUCE_MIN", "ReduceProd": "REDUCE_PROD"}


def _reduce_direct(ctx):
    """_reduce with constant axes of a float reduction TFLite has as one builtin."""
    axes = _static_axes(ctx.node, lambda _: ctx.const(1), lambda _: ctx.shape(1))
    if axes is None:
        raise NotCovered("run-time axes")
    reduced = _reduced_axes(ctx.node, axes, ctx.rank(0))
    if reduced is None:
        return ctx.x(0)
    out = ctx.output()
    ctx.op(_DIRECT[ctx.node.op_type], [ctx.x(0), ctx.ints(ctx.axes(reduced), "axes")], out,
           options("ReducerOptions", keepDims=bool(ctx.attr("keepdims", 1))))
    return out


for _op in _DIRECT:
    for _since in (1, _AXES_INPUT_SINCE.get(_op, 18)):
        direct(_op, since=_since)(_reduce_direct)


def _arg_out_perm(node, graph, in_perm):
    if node.attrs.get("keepdims", 1):
        return in_perm
    return P.drop_axes(in_perm, [node.attrs.get("axis", 0) % len(in_perm)])


def _arg_reduce(ctx, fn):
    """fn (tf.math.argmax / argmin) on the physical axis; select_last_index by reversing."""
    x = ctx.x(0)
    axis = ctx.axis(ctx.attr("axis", 0))
    if ctx.attr("select_last_index", 0):
        size = x.shape[axis]
        size = tf.shape(x, out_type=tf.int64)[axis] if size is None else size
        y = size - 1 - fn(tf.reverse(x, [axis]), axis=axis, output_type=tf.int64)
    else:
        y = fn(x, axis=axis, output_type=tf.int64)
    return tf.expand_dims(y, axis) if ctx.attr("keepdims", 1) else y


@handler("ArgMax", since=1, layout=derived(_arg_out_perm))
def arg_max(ctx):
    return _arg_reduce(ctx, tf.math.argmax)


@handler("ArgMin", since=1, layout=derived(_arg_out_perm))
def arg_min(ctx):
    return _arg_reduce(ctx, tf.math.argmin)
