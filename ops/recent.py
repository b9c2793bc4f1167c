"""Ops of the newest opsets: SwiGLU, TensorScatter, CausalConvWithState, LinearAttention and
FlexAttention (ai.onnx.preview).

Half-precision inputs are computed in float32 (the builder casts the outputs back to the
ONNX dtype). Recurrences over a static sequence are unrolled step by step, so the TFLite
model needs no WHILE and no Flex op.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from onnx2tf_alt.ops.control import run_subgraph
from onnx2tf_alt.ops.elementwise import widen
from onnx2tf_alt.ops.transformer import _compute_dtype, _dims, _reshape

from onnx2tf_alt.control_flow import free_names
from onnx2tf_alt.layout import agnostic, channel_last
from onnx2tf_alt.registry import handler


@handler("SwiGLU", since=28, layout=agnostic)
def swiglu(ctx):
    gate, value = widen(ctx.x(0)), widen(ctx.x(1))
    return gate * tf.sigmoid(gate * ctx.attr("alpha", 1.0)) * value


# --- TensorScatter -----------------------------------------------------------------------
@handler("TensorScatter", since=24, limits="static sequence lengths; axis is not the batch axis")
def tensor_scatter(ctx):
    """Cache position p takes update row p - write_index (mod the cache length when
    circular) where that row exists, else keeps the past value: a gather and a select."""
    rank = len(ctx.shape(0))
    axis = ctx.attr("axis", -2) % rank
    max_len, length = ctx.shape(0)[axis], ctx.shape(1)[axis]
    if axis == 0 or max_len is None or length is None:
        raise NotImplementedError("TensorScatter needs static sequence lengths and axis >= 1")
    rows = np.arange(max_len, dtype=np.int32)
    if ctx.has(2):  # per batch entry: [B, max_len]
        rows = ctx.const_tensor(rows[np.newaxis]) - tf.reshape(tf.cast(ctx.x(2), tf.int32),
                                                               [-1, 1])
    if ctx.attr("mode", "linear") == "circular":
        rows = rows % max_len
    written = (rows >= 0) & (rows < length)
    # Rows outside the update are not used; `% length` only keeps their indices valid.
    picked = tf.gather(ctx.x(1), rows % length, axis=axis, batch_dims=1 if ctx.has(2) else 0)
    where = [1] * rank
    where[axis] = max_len
    if ctx.has(2):
        where[0] = -1
    return tf.where(tf.reshape(written, where), picked, ctx.x(0))


# --- CausalConvWithState -----------------------------------------------------------------
@handler("CausalConvWithState", since=27, layout=channel_last(0, 3),
         limits="static kernel size; half precision computed in float32")
def causal_conv_with_state(ctx):
    """Depthwise causal conv along the length of channel-last (B, L, C) data, the carried
    state prepended (zeros without one)."""
    x = ctx.x(0)
    dtype = _compute_dtype(x)
    taps = ctx.shape(1)[2]
    if ctx.has(3):
        padded = tf.concat([tf.cast(ctx.x(3), dtype), tf.cast(x, dtype)], axis=1)
    else:
        padded = tf.pad(tf.cast(x, dtype), [[0, 0], [taps - 1, 0], [0, 0]])
    weight = ctx.const(1)
    if weight is not None:
        kernel = weight[:, 0, :].T.reshape(1, taps, -1, 1).astype(dtype.as_numpy_dtype)
        y = tf.nn.depthwise_conv2d(tf.expand_dims(padded, 1), ctx.const_tensor(kernel),
                                   strides=[1, 1, 1, 1], padding="VALID")
        y = tf.squeeze(y, 1)
    else:
        y = _runtime_taps(padded, tf.cast(ctx.x(1), dtype), taps)
    if ctx.has(2):
        y = y + tf.cast(ctx.x(2), dtype)
    if ctx.attr("activation", "none") in ("silu", "swish"):
        y = y * tf.sigmoid(y)
    state = padded[:, -(taps - 1):, :] if taps > 1 else padded[:, :0, :]
    return [y, state]


def _runtime_taps(padded, weight, taps: int):
    """Sum over taps i of the window starting at i times weight[:, 0, i], per channel."""
    total = None
    for i in range(taps):
        end = i - (taps - 1)
        window = padded[:, i : end if end else None, :]
        term = window * weight[:, 0, i]
        total = term if total is None else total + term
    return total


# --- LinearAttention ---------------------------------------------------------------------
@handler("LinearAttention", since=27,
         limits="static sequence length (unrolled step by step); computed in float32")
def linear_attention(ctx):
    """The recurrence of the spec, one step per token, on states (B, H_kv, d_k, d_v).

    Query heads sharing a KV head are folded into one matmul row block, so the state is
    never repeated; per-step slices of the packed (B, T, H*D) inputs need no transpose.
    """
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    rule = ctx.attr("update_rule", "gated_delta")
    steps = ctx.shape(0)[1]
    if steps is None:
        raise NotImplementedError("LinearAttention needs a static sequence length")
    d_k, d_v = ctx.shape(0)[2] // q_heads, ctx.shape(2)[2] // kv_heads
    groups = q_heads // kv_heads

    def per_step(i: int, *dims: int):
        """Input i as float32 (B, T, *dims): one slice per step has the shape to use."""
        return tf.reshape(tf.cast(ctx.x(i), tf.float32), [-1, steps, *dims])

    q = per_step(0, kv_heads, groups, d_k)
    k, v = per_step(1, kv_heads, d_k, 1), per_step(2, kv_heads, 1, d_v)
    if ctx.has(3):
        state = tf.cast(ctx.x(3), tf.float32)
    else:
        state = tf.zeros(tf.stack([tf.shape(q)[0], kv_heads, d_k, d_v]))
    decay = beta = None
    if rule in ("gated", "gated_delta"):  # one decay per key dim, or per head
        decay = tf.exp(per_step(4, kv_heads, ctx.shape(4)[2] // kv_heads, 1))
    if rule in ("delta", "gated_delta"):  # one rate per KV head, or one for all
        beta = per_step(5, ctx.shape(5)[2], 1, 1)
    outputs = []
    for t in range(steps):
        k_t, v_t = k[:, t], v[:, t]
        if decay is not None:
            state = state * decay[:, t]
        if beta is not None:
            retrieved = tf.matmul(k_t, state, transpose_a=True)  # (B, H_kv, 1, d_v)
            v_t = beta[:, t] * (v_t - retrieved)
        state = state + k_t * v_t
        outputs.append(tf.matmul(q[:, t], state))  # (B, H_kv, groups, d_v)
    scale = ctx.attr("scale", 0.0) or 1.0 / np.sqrt(d_k)
    y = tf.reshape(tf.stack(outputs, axis=1), [-1, steps, q_heads * d_v]) * scale
    return [y, state]


# --- FlexAttention -----------------------------------------------------------------------
_SOFTMAX_DTYPES = {1: tf.float32, 10: tf.float16, 16: tf.bfloat16, 11: tf.float64}


@handler("FlexAttention", since=1, domain="ai.onnx.preview",
         limits="static sequence lengths; score_mod / prob_mod subgraphs converted inline; "
         "half precision computed in float32")
def flex_attention(ctx):
    q, k, v = (ctx.x(i) for i in range(3))
    precision = ctx.attr("softmax_precision")
    dtype = _SOFTMAX_DTYPES[precision] if precision else _compute_dtype(q)
    b, q_heads, q_len, head_size = _dims(q)
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if not isinstance(q_len, int) or kv_len is None:
        raise NotImplementedError("FlexAttention needs static query and key/value lengths")
    scale = ctx.attr("scale", 1.0 / np.sqrt(head_size))
    # sqrt(scale) is taken in float32 and rounded to the input dtype, as the spec does.
    root = float(np.asarray(np.sqrt(np.float32(scale)), q.dtype.as_numpy_dtype))
    groups = q_heads // kv_heads
    # Query heads h*groups .. h*groups+groups-1 share KV head h: fold them into the rows.
    q_rows = _reshape(tf.cast(q, dtype) * root, [b, kv_heads, groups * q_len, head_size])
    scores = tf.matmul(q_rows, tf.cast(k, dtype) * root, transpose_b=True)
    scores = _modified(ctx, "score_mod", _reshape(scores, [b, q_heads, q_len, kv_len]))
    probs = _modified(ctx, "prob_mod", tf.nn.softmax(scores))
    probs = _reshape(probs, [b, kv_heads, groups * q_len, kv_len])
    y = tf.matmul(probs, tf.cast(v, dtype))
    return _reshape(y, [b, q_heads, q_len, v.shape[3]])


def _modified(ctx, name: str, x):
    """x through the node's modifier subgraph `name`, converted with the project's handlers
    (identity when the node has none)."""
    graph = ctx.attr(name)
    if graph is None:
        return x
    outer = {n: ctx.value(n) for n in free_names(graph)}
    (result,) = run_subgraph(graph, dict(ctx.graph.opsets), [x], outer)
    return tf.cast(result, x.dtype)
