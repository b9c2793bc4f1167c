"""Shape ops: reshapes, axis moves, shape queries and shape-made constants.

Reshape, Flatten, Squeeze, Unsqueeze and Transpose run on the physical tensor: their output
perm is derived from the input's, so they move no data (a Transpose is a perm change and
emits no op at all). Shape and Size read the logical shape of a value in any layout.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.policies import Decision, custom_policy, derived, reshaping, same_as_input
from onnx2tf_alt.tflite import direct as direct_writer
from onnx2tf_alt.translate.context import reshape as reshape_dims
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from ._shapes import scalar, shape_tensor


def reshape_to_output(ctx, runtime_target, out_shape=None):
    """Input 0 reshaped, as it lies physically, to output 0's physical shape.

    With at most one unknown output dim the target is static (-1 for the unknown), which
    keeps a plain RESHAPE; otherwise `runtime_target()` gives the logical target shape as
    an int32 tensor (-1 allowed) and it is permuted to the physical order. `out_shape`
    overrides the inferred output shape where the caller knows more.
    """
    dims = P.physical_shape(out_shape or ctx.out_shape(0), ctx.out_perm(0))
    if sum(d is None for d in dims) <= 1:
        return tf.reshape(ctx.x(0), [-1 if d is None else int(d) for d in dims])
    return tf.reshape(ctx.x(0), tf.gather(runtime_target(), ctx.out_perm(0)))


@custom_policy
def reads_shape_only(node: Node, graph: Graph, in_perms) -> Decision:
    """Layout policy of ops that only read their input's shape: take it as it lies."""
    return Decision(list(in_perms), [P.identity(graph.rank(o) or 0) for o in node.outputs])


# --- Transpose ----------------------------------------------------------------------------
def _transpose_perm(node: Node, graph: Graph, in_perm):
    onnx_perm = node.attrs.get("perm") or list(range(len(in_perm)))[::-1]
    return P.compose_transpose(in_perm, onnx_perm)


@handler("Transpose", layout=derived(_transpose_perm))
def transpose(ctx):
    return ctx.x(0)  # the plan already gave the output the composed perm: no data moves


@direct("Transpose")
def transpose_direct(ctx):
    return ctx.x(0)


# --- Reshape and Flatten -----------------------------------------------------------------
def _reshape_shapes(node: Node, graph: Graph):
    """(input shape, output shape) of a Reshape for planning it physically, or None.

    Unknown dims are paired in order by reshape_perm, so each unknown output dim must carry
    the symbol of the unknown input dim it pairs with; one leftover unknown output dim is
    deduced from the element count (the shape inference leaves it open when the target
    comes from a Shape of a value with a symbolic batch).
    """
    in_shape, out_shape = graph.shapes.get(node.inputs[0]), graph.shapes.get(node.outputs[0])
    if in_shape is None or out_shape is None:
        return None
    in_symbols = graph.symbols.get(node.inputs[0], {})
    out_symbols = graph.symbols.get(node.outputs[0], {})
    in_unknown = [in_symbols.get(i) for i, d in enumerate(in_shape) if d is None]
    if None in in_unknown or len(set(in_unknown)) != len(in_unknown):
        return None
    out = list(out_shape)
    unknown = [j for j, d in enumerate(out) if d is None]
    paired = [j for j in unknown if out_symbols.get(j) in in_unknown]
    rest = [j for j in unknown if j not in paired]
    if [out_symbols[j] for j in paired] != in_unknown or len(rest) > 1:
        return None
    if rest:
        known_in = int(np.prod([d for d in in_shape if d is not None]))
        known_out = int(np.prod([d for d in out if d is not None]))
        if known_out == 0 or known_in % known_out:
            return None
        out[rest[0]] = known_in // known_out
    return tuple(in_shape), tuple(out)


def _flatten_shapes(node: Node, graph: Graph):
    """Flatten's output dims are products of input prefixes/suffixes: in-order pairing holds."""
    return graph.shapes.get(node.inputs[0]), graph.shapes.get(node.outputs[0])


def _reshape(ctx, shape):
    """ONNX Reshape to the logical target `shape()` (0 copies an input dim unless allowzero)."""

    def target():
        wanted = tf.cast(shape(), tf.int32)
        if ctx.attr("allowzero", 0):
            return wanted
        n = min(len(ctx.shape(0)), len(ctx.out_shape(0)))
        copies = tf.concat([shape_tensor(ctx)[:n], wanted[n:]], axis=0)
        return tf.where(tf.equal(wanted, 0), copies, wanted)

    shapes = _reshape_shapes(ctx.node, ctx.graph)
    known = _static_target(ctx) if shapes is None else None
    return reshape_to_output(ctx, target, known or (shapes[1] if shapes else None))


def _static_target(ctx) -> tuple | None:
    """The logical output shape when the input's TF shape is fully known and the target is a
    constant (0 copies, -1 is what is left), though the graph's inference left dims open
    (after onnxruntime-only ops, whose shapes ONNX does not infer): a static RESHAPE instead
    of one built at run time. None otherwise."""
    x, wanted = ctx.x(0), ctx.const(1) if ctx.has(1) else None
    if wanted is None or not x.shape.is_fully_defined():
        return None
    given = P.logical_shape(x.shape.as_list(), ctx.perm(0))
    wanted = [int(w) for w in np.reshape(wanted, -1)]
    out = [given[i] if w == 0 and not ctx.attr("allowzero", 0) and i < len(given) else w
           for i, w in enumerate(wanted)]
    if out.count(-1) == 1:
        rest = int(np.prod([d for d in out if d != -1]))
        if rest == 0 or int(np.prod(given)) % rest:
            return None
        out[out.index(-1)] = int(np.prod(given)) // rest
    return tuple(out) if all(d >= 0 for d in out) and np.prod(out) == np.prod(given) else None


@handler("Reshape", layout=reshaping(_reshape_shapes), limits="shape attribute before opset 5")
def reshape_v1(ctx):
    return _reshape(ctx, lambda: tf.constant(ctx.attr("shape"), tf.int64))


@handler("Reshape", since=5, layout=reshaping(_reshape_shapes), limits="allowzero from opset 14")
def reshape(ctx):
    return _reshape(ctx, lambda: ctx.x(1))


@direct("Reshape", since=5)
def reshape_direct(ctx):
    if ctx.const(1) is None:
        raise direct_writer.NotCovered("a run-time target shape")
    return direct_writer.reshape_to_output(ctx)


@handler("Flatten", layout=reshaping(_flatten_shapes))
def flatten(ctx):
    axis = ctx.attr("axis", 1)
    axis += len(ctx.shape(0)) if axis < 0 else 0

    def target():
        shape = shape_tensor(ctx)
        return tf.stack([tf.reduce_prod(shape[:axis]), tf.reduce_prod(shape[axis:])])

    return reshape_to_output(ctx, target)


direct("Flatten")(direct_writer.reshape_to_output)


# --- Squeeze and Unsqueeze ---------------------------------------------------------------
def _axes(node: Node, graph: Graph):
    """The `axes` attribute (before opset 13) or constant input 1; None when not known."""
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1 and node.inputs[1]:
        value = graph.constants.get(node.inputs[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    return []


def _squeezed(node: Node, graph: Graph):
    """Normalized logical axes a Squeeze removes (no axes: every size-1 axis)."""
    shape = graph.shapes.get(node.inputs[0])
    axes = _axes(node, graph)
    if axes is None or shape is None:
        return None
    if not axes:
        return [i for i, d in enumerate(shape) if d == 1]
    return sorted(a % len(shape) for a in axes)


def _inserted(node: Node, graph: Graph):
    """Normalized output axes an Unsqueeze inserts."""
    axes, rank = _axes(node, graph), graph.rank(node.outputs[0])
    if rank is None and axes and graph.rank(node.inputs[0]) is not None:
        rank = graph.rank(node.inputs[0]) + len(axes)  # a body value ONNX could not follow
    if not axes or rank is None:
        return None
    return sorted(a % rank for a in axes)


def _squeeze_perm(node: Node, graph: Graph, in_perm):
    axes = _squeezed(node, graph)
    return None if axes is None else P.drop_axes(in_perm, axes)


def _unsqueeze_perm(node: Node, graph: Graph, in_perm):
    axes = _inserted(node, graph)
    return None if axes is None else P.insert_axes(in_perm, axes)


def _reshape_to_inferred(ctx):
    """Input 0 (logical layout) reshaped to the inferred output shape: how Squeeze and
    Unsqueeze with run-time axes run where ONNX inferred it (unknown dims pair in order, see
    context.reshape); else the shape is computed at run time (`_run_time_axes`)."""
    out = ctx.out_shape(0)
    if out is None:
        return _run_time_axes(ctx, inserting=ctx.node.op_type == "Unsqueeze")
    return reshape_dims(ctx.x(0), out)


def _run_time_axes(ctx, inserting: bool):
    """Unsqueeze / Squeeze by axes known only at run time (their count is static): a one-hot
    match of every output (Unsqueeze) or input (Squeeze) axis against the axes, then one
    RESHAPE to the dims computed from it."""
    count = ctx.shape(1)[0] if ctx.has(1) and ctx.shape(1) else None
    if count is None or ctx.shape(0) is None:
        raise NotImplementedError(
            "run-time axes need their count and the input's rank: give the model's inputs "
            "static shapes (-ois) so shape inference can follow them")
    rank = len(ctx.shape(0)) + (count if inserting else 0)
    axes = tf.reshape(tf.cast(ctx.x(1), tf.int32), [-1])
    axes = tf.where(axes < 0, axes + rank, axes)
    hit = tf.reduce_any(tf.equal(tf.range(rank)[:, None], axes[None, :]), axis=1)
    dims = shape_tensor(ctx)
    if inserting:  # output axis k is new (1) or the next input dim
        source = tf.maximum(tf.cumsum(tf.cast(tf.logical_not(hit), tf.int32)) - 1, 0)
        target = tf.where(hit, tf.ones([rank], tf.int32), tf.gather(dims, source))
    else:  # the kept input axes in order: a stable sort puts them (0s) first
        kept = tf.argsort(tf.cast(hit, tf.int32), stable=True)[: rank - count]
        target = tf.gather(dims, kept)
    return tf.reshape(ctx.x(0), target)


@handler("Squeeze", layout=derived(_squeeze_perm),
         limits="run-time axes: their count and the input's rank must be known")
def squeeze(ctx):
    axes = _squeezed(ctx.node, ctx.graph)
    if axes is None:
        return _reshape_to_inferred(ctx)
    kept = [a for a in range(len(ctx.shape(0))) if a not in axes]
    out_shape = [ctx.shape(0)[a] for a in kept]  # also where inference left it open
    return reshape_to_output(ctx, lambda: tf.gather(shape_tensor(ctx), kept), out_shape)


@direct("Squeeze")
def squeeze_direct(ctx):
    if _squeezed(ctx.node, ctx.graph) is None:
        raise direct_writer.NotCovered("run-time axes")
    return direct_writer.reshape_to_output(ctx)


@direct("Unsqueeze")
def unsqueeze_direct(ctx):
    if _inserted(ctx.node, ctx.graph) is None:
        raise direct_writer.NotCovered("run-time axes")
    return direct_writer.reshape_to_output(ctx)


@handler("Unsqueeze", layout=derived(_unsqueeze_perm),
         limits="run-time axes: their count and the input's rank must be known")
def unsqueeze(ctx):
    axes = _inserted(ctx.node, ctx.graph)
    if axes is None:
        return _reshape_to_inferred(ctx)
    rank = len(ctx.shape(0))
    kept = iter(range(rank))
    picks = [rank if a in axes else next(kept) for a in range(rank + len(axes))]
    return reshape_to_output(
        ctx, lambda: tf.gather(tf.concat([shape_tensor(ctx), [1]], axis=0), picks)
    )


# --- Shape and Size ----------------------------------------------------------------------
@handler("Shape", layout=reads_shape_only, limits="start/end from opset 15")
def shape(ctx):
    shape = ctx.shape(0)
    if shape is None:  # a subgraph value with no inferred shape lies in ONNX order
        x = ctx.x(0)
        picks = list(range(x.shape.rank))[ctx.attr("start", 0) : ctx.attr("end", None)]
        return tf.gather(tf.shape(x, out_type=tf.int64), np.array(picks, np.int32))
    picks = list(range(len(shape)))[ctx.attr("start", 0) : ctx.attr("end", None)]
    if all(shape[a] is not None for a in picks):
        return np.array([shape[a] for a in picks], dtype=np.int64)
    return tf.gather(shape_tensor(ctx, 0, tf.int64), picks)


@handler("Size", layout=reads_shape_only)
def size(ctx):
    shape = ctx.shape(0)
    if all(d is not None for d in shape):
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    return tf.size(ctx.x(0), out_type=tf.int64)


# --- Constants made from attributes or shapes --------------------------------------------
_CONSTANT_ATTRS = {
    "value": None,
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


@handler("Constant", limits="no sparse_value, no strings")
def constant(ctx):
    for name, dtype in _CONSTANT_ATTRS.items():
        if name in ctx.node.attrs:
            return np.asarray(ctx.attr(name), dtype=dtype)
    raise NotImplementedError(f"Constant with attribute(s) {sorted(ctx.node.attrs)}")


@handler("ConstantOfShape")
def constant_of_shape(ctx):
    value = np.asarray(ctx.attr("value", np.zeros(1, np.float32))).reshape(-1)
    shape = ctx.const(0)
    if shape is not None:  # a read-only view of one element: no memory of the shape's size
        return np.broadcast_to(value[:1].reshape(()), tuple(int(d) for d in shape))
    return tf.fill(tf.cast(ctx.x(0), tf.int32), tf.constant(value[0], dtype=value.dtype))


@handler("Range")
def range_(ctx):
    """Inputs are scalars; one-element tensors are read as scalars too (onnxruntime and the
    spec's own function bodies, e.g. AffineGrid's, pass them)."""
    start, limit, delta = (ctx.const(i) for i in range(3))
    if start is not None and limit is not None and delta is not None:
        start, limit, delta = (v.reshape(()) for v in (start, limit, delta))
        count = max(int(np.ceil((limit - start) / delta)), 0)
        return (start + np.arange(count) * delta).astype(start.dtype)
    count = (ctx.out_shape(0) or (None,))[0]
    if delta is not None and count is not None:
        # a length shape inference fixed (a decoder's positions past a run-time offset):
        # start + k * delta, an ADD, where TFLite's RANGE would give a run-time shape
        first = tf.reshape(scalar(ctx, 0), [1])
        steps = (np.arange(count) * delta.reshape(())).astype(ctx.dtype(0) or delta.dtype)
        return first + tf.constant(steps, dtype=first.dtype)
    return tf.range(*(tf.reshape(scalar(ctx, i), []) for i in range(3)))


# --- Expand and Tile ---------------------------------------------------------------------
def _expand_perm(node: Node, graph: Graph, in_perm):
    """Keep the input's perm; new leading axes (rank growth) go first."""
    rank = graph.rank(node.outputs[0])
    if rank is None or rank < len(in_perm):
        return None
    extra = rank - len(in_perm)
    return (*range(extra), *(a + extra for a in in_perm))


@handler("Expand", since=8, layout=derived(_expand_perm))
def expand(ctx):
    dims = P.physical_shape(ctx.out_shape(0), ctx.out_perm(0))
    if all(d is not None for d in dims):
        x, dims = ctx.x(0), [int(d) for d in dims]
        if x.dtype.is_floating and x.shape.is_fully_defined():
            # a broadcasting MUL by ones: XNNPACK computes it, not BROADCAST_TO (which would
            # split a decoder's grouped-query attention out of the delegate); exact
            have = [1] * (len(dims) - x.shape.rank) + x.shape.as_list()
            ones = [d if h == 1 else 1 for h, d in zip(have, dims)]
            return x * tf.ones(ones, x.dtype)
        return tf.broadcast_to(x, dims)
    wanted = tf.cast(ctx.x(1), tf.int32)
    logical = tf.broadcast_dynamic_shape(shape_tensor(ctx), wanted)
    return tf.broadcast_to(ctx.x(0), tf.gather(logical, ctx.out_perm(0)))


@handler("Tile", since=6, layout=same_as_input(0), limits="repeats input (opset 6+)")
def tile(ctx):
    repeats = ctx.const(1)
    if repeats is not None:
        return tf.tile(ctx.x(0), [int(repeats[a]) for a in ctx.perm(0)])
    return tf.tile(ctx.x(0), tf.gather(tf.cast(ctx.x(1), tf.int32), ctx.perm(0)))
