"""Transformer building blocks of opset 23+: Attention, RMSNormalization, RotaryEmbedding,
LinearAttention, and FlexAttention (ai.onnx.preview).

All run in the logical (ONNX) layout. Attention keeps the head axis where ONNX has it:
grouped-query attention folds the query heads of one KV head into the query sequence axis,
so K and V are never repeated. float16 inputs are computed in float32 (the builder casts the
outputs back to the ONNX dtype). Attention computes bfloat16 op by op in bfloat16, rounding
where the ONNX reference rounds (TFLite has no bfloat16 kernels, so this is the TF model's).
LinearAttention's recurrence over a static sequence is unrolled step by step, so the TFLite
model needs no WHILE and no Flex op; FlexAttention's score_mod / prob_mod subgraphs are
converted inline with the project's handlers.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx2tf_alt.passes.control_flow import free_names
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

from ._dtypes import compute_dtype, rounded_matmul
from ._shapes import dims_of, reshape_to_dims
from .control import run_subgraph
from .softmax import softmax

_NEG_INF = np.float32(-np.inf)


def split_heads(x, heads: int):
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, hidden = dims_of(x)
    return tf.transpose(reshape_to_dims(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


def merge_heads(y):
    """[B, H, S, D] -> [B, S, H*D]."""
    b, heads, s, head_size = dims_of(y)
    return reshape_to_dims(tf.transpose(y, [0, 2, 1, 3]), [b, s, heads * head_size])


def grouped_scores(q, k, scale: float):
    """q kᵀ * scale [B, Hq, S, T] of q [B, Hq, S, D] and k [B, Hkv, T, D].

    Query heads h*G .. h*G+G-1 share KV head h: they are folded into the query rows, so K
    is never repeated. Both operands are scaled by sqrt(scale) (as the ONNX reference).
    """
    b, q_heads, q_len, head_size = dims_of(q)
    kv_heads, kv_len = k.shape[1], dims_of(k)[2]
    root = tf.constant(np.sqrt(scale), q.dtype)
    q_rows = reshape_to_dims(q * root, [b, kv_heads, (q_heads // kv_heads) * q_len, head_size])
    scores = rounded_matmul(q_rows, k * root, transpose_b=True)
    return reshape_to_dims(scores, [b, q_heads, q_len, kv_len])



def grouped_values(probs, v):
    """probs [B, Hq, S, T] times v [B, Hkv, T, Dv] -> [B, Hq, S, Dv] (heads grouped)."""
    b, q_heads, q_len, kv_len = dims_of(probs)
    kv_heads = v.shape[1]
    rows = reshape_to_dims(probs, [b, kv_heads, (q_heads // kv_heads) * q_len, kv_len])
    return reshape_to_dims(rounded_matmul(rows, v), [b, q_heads, q_len, v.shape[3]])


def _structural_allowed(q_len: int, kv_len: int, offset, causal: bool, left: int, right: int):
    """Where query i may attend key j (causal and sliding window, offset-aligned).

    A static offset gives a numpy [q, kv] array; a per-batch runtime offset a [B, 1, q, kv]
    tensor.
    """
    i = np.arange(q_len, dtype=np.int32).reshape(q_len, 1)
    j = np.arange(kv_len, dtype=np.int32).reshape(1, kv_len)
    if isinstance(offset, int):
        diff, logical_and, allowed = i + offset - j, np.logical_and, np.ones((q_len, kv_len), bool)
    else:
        diff = tf.reshape(tf.cast(offset, tf.int32), [-1, 1, 1, 1]) + (i - j)
        logical_and, allowed = tf.logical_and, tf.ones_like(diff, dtype=tf.bool)
    if causal:
        allowed = logical_and(allowed, diff >= 0)
    if left >= 0:
        allowed = logical_and(allowed, diff <= left)
    if right >= 0:
        allowed = logical_and(allowed, -diff <= right)
    return allowed


def _attention_masks(ctx, dtype, q_len: int, kv_len: int, past_len: int):
    """(additive float mask or None, boolean 'may attend' mask or None), both [.., q, kv].

    Boolean masks, causal, sliding window and key padding are applied with a select, not
    by adding -inf: the TFLite converter stores a -inf constant as the lowest finite float.
    """
    additive, allowed = None, []
    if ctx.has(3):
        mask = ctx.x(3)
        width = mask.shape[-1] or kv_len
        if mask.dtype != tf.bool:
            mask = tf.cast(mask, dtype)
        if width < kv_len:  # keys past the mask are masked: zero bias, not allowed
            widths = [[0, 0]] * (mask.shape.rank - 1) + [[0, kv_len - width]]
            mask = tf.pad(mask, widths, constant_values=False if mask.dtype == tf.bool else 0)
            allowed.append(ctx.const_tensor(np.arange(kv_len) < width))
        if mask.dtype == tf.bool:
            allowed.append(mask)
        else:
            additive = mask
    causal = bool(ctx.attr("is_causal", 0))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    nonpad = ctx.x(6) if ctx.has(6) else None
    if causal or left >= 0 or right >= 0:
        offset = past_len if nonpad is None else nonpad - q_len
        structural = _structural_allowed(q_len, kv_len, offset, causal, left, right)
        if isinstance(structural, np.ndarray):
            structural = ctx.const_tensor(structural)
        allowed.append(structural)
    if nonpad is not None:
        keys = np.arange(kv_len, dtype=np.int32).reshape(1, 1, 1, kv_len)
        allowed.append(tf.reshape(tf.cast(nonpad, tf.int32), [-1, 1, 1, 1]) > keys)
    combined = None
    for term in allowed:
        combined = term if combined is None else tf.logical_and(combined, term)
    return additive, combined


def mask_out(scores, allowed, keep_inf: bool):
    """scores with -inf where not `allowed`.

    The TFLite converter stores a -inf constant as the lowest finite float, which is all a
    softmax needs; where the masked scores are an output (`keep_inf`), the -inf is made at
    run time instead: the lowest float added to itself overflows to -inf.
    """
    if not keep_inf:
        return tf.where(allowed, scores, tf.constant(_NEG_INF, scores.dtype))
    lowest = tf.constant(scores.dtype.min, scores.dtype)
    zero = tf.constant(0, scores.dtype)
    return tf.where(allowed, scores, lowest) + tf.where(allowed, zero, lowest)


def _key_softmax(scores, precision: int | None):
    """Softmax over the keys in the model's softmax_precision: bfloat16 is honoured, any
    other precision runs in float32 (as float16 inputs do)."""
    if precision is None:
        return softmax(scores, [3])
    target = tf.bfloat16 if precision == onnx.TensorProto.BFLOAT16 else tf.float32
    return tf.cast(softmax(tf.cast(scores, target), [3]), scores.dtype)


def _attention_dtype(q):
    """bfloat16 stays (the reference rounds every step to it); float16 runs in float32."""
    return q.dtype if q.dtype == tf.bfloat16 else compute_dtype(q)


@handler(
    "Attention",
    since=23,
    limits=(
        "static query and key/value sequence lengths; float16 computed in float32; "
        "softmax_precision other than bfloat16 computed in float32"
    ),
)
def attention(ctx):
    q, k, v = (ctx.x(i) for i in range(3))
    dtype = _attention_dtype(q)
    q, k, v = (tf.cast(t, dtype) for t in (q, k, v))
    three_d = q.shape.rank == 3
    if three_d:
        q = split_heads(q, ctx.attr("q_num_heads"))
        k = split_heads(k, ctx.attr("kv_num_heads"))
        v = split_heads(v, ctx.attr("kv_num_heads"))
    past_len = 0
    if ctx.has(4):
        past_len = int(ctx.shape(4)[2])
        k = tf.concat([tf.cast(ctx.x(4), dtype), k], axis=2)
        v = tf.concat([tf.cast(ctx.x(5), dtype), v], axis=2)
    present_k, present_v = k, v
    q_len, head_size, kv_len = q.shape[2], q.shape[3], k.shape[2]
    if q_len is None or kv_len is None:
        raise NotImplementedError("Attention needs static query and key/value sequence lengths")
    scores = grouped_scores(q, k, ctx.attr("scale", 1.0 / np.sqrt(head_size)))
    softcap = ctx.attr("softcap", 0.0)
    if softcap > 0:
        scores = tf.tanh(scores / softcap) * softcap
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk_out = scores
    additive, allowed = _attention_masks(ctx, dtype, q_len, kv_len, past_len)
    if additive is not None:
        scores = scores + additive
    if allowed is not None:
        scores = mask_out(scores, allowed, keep_inf=mode == 2)
    if mode == 2:
        qk_out = scores
    probs = _key_softmax(scores, ctx.attr("softmax_precision"))
    if additive is not None or allowed is not None:
        # A row with no attendable key yields 0 (softmax alone would give NaN).
        open_keys = allowed if additive is None else additive > _NEG_INF
        if additive is not None and allowed is not None:
            open_keys = tf.logical_and(open_keys, allowed)
        masked_row = tf.logical_not(tf.reduce_any(open_keys, axis=-1, keepdims=True))
        probs = tf.where(masked_row, tf.zeros_like(probs), probs)
    if mode == 3:
        qk_out = probs
    y = grouped_values(probs, v)
    if three_d:
        y = merge_heads(y)
    return [y, present_k, present_v, qk_out]


def rms_normalize(x, axes: list[int], epsilon: float):
    """x / sqrt(mean(x², axes) + epsilon) (the statistic keeps dims)."""
    mean_square = tf.reduce_mean(tf.square(x), axis=axes, keepdims=True)
    return x * tf.math.rsqrt(mean_square + epsilon)


@handler("RMSNormalization", since=23, limits="half precision computed in float32")
def rms_normalization(ctx):
    x = ctx.x(0)
    dtype = compute_dtype(x)
    x = tf.cast(x, dtype)
    axes = list(range(ctx.attr("axis", -1) % ctx.rank(0), ctx.rank(0)))
    y = rms_normalize(x, axes, ctx.attr("epsilon", 1e-5))
    return y * tf.cast(ctx.x(1), dtype)


def rotate(x, cos, sin, head_axis: int, num_heads: int, rotary: int, interleaved: bool):
    """Rotary embedding of x [B, S, H*D] (split into `num_heads`) or 4-D, whose head axis is
    `head_axis`; cos and sin [B, S, rotary/2] broadcast over it. The first `rotary` (0: all)
    features of each head rotate, as interleaved pairs or as two halves."""
    dims = dims_of(x)
    if len(dims) == 3:  # [B, S, H*D] -> [B, S, H, D]
        x = reshape_to_dims(x, [dims[0], dims[1], num_heads, dims[2] // num_heads])
    cos, sin = tf.expand_dims(cos, head_axis), tf.expand_dims(sin, head_axis)
    head_size = x.shape[-1]
    rotary = rotary or head_size
    part, keep = x[..., :rotary], x[..., rotary:]
    if interleaved:
        pairs = reshape_to_dims(part, [*dims_of(part)[:-1], rotary // 2, 2])
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = part[..., : rotary // 2], part[..., rotary // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = reshape_to_dims(tf.stack([real, imag], axis=-1), dims_of(part))
    else:
        rotated = tf.concat([real, imag], axis=-1)
    y = tf.concat([rotated, keep], axis=-1) if rotary < head_size else rotated
    return reshape_to_dims(y, dims)


@handler("RotaryEmbedding", since=23)
def rotary_embedding(ctx):
    """x [B, S, H*D] or [B, H, S, D]; cos and sin broadcast over the head axis."""
    cos, sin = ctx.x(1), ctx.x(2)
    if ctx.has(3):
        cos, sin = tf.gather(cos, ctx.x(3)), tf.gather(sin, ctx.x(3))
    head_axis = 2 if ctx.rank(0) == 3 else 1
    return rotate(ctx.x(0), cos, sin, head_axis, ctx.attr("num_heads", 0),
                  ctx.attr("rotary_embedding_dim", 0), bool(ctx.attr("interleaved", 0)))


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
_SOFTMAX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}


@handler("FlexAttention", since=1, domain="ai.onnx.preview",
         limits="static sequence lengths; score_mod / prob_mod subgraphs converted inline; "
         "half precision computed in float32")
def flex_attention(ctx):
    q, k, v = (ctx.x(i) for i in range(3))
    precision = ctx.attr("softmax_precision")
    dtype = tf.as_dtype(_SOFTMAX_DTYPES[precision]) if precision else compute_dtype(q)
    b, q_heads, q_len, head_size = dims_of(q)
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if not isinstance(q_len, int) or kv_len is None:
        raise NotImplementedError("FlexAttention needs static query and key/value lengths")
    scale = ctx.attr("scale", 1.0 / np.sqrt(head_size))
    # sqrt(scale) is taken in float32 and rounded to the input dtype, as the spec does.
    root = float(np.asarray(np.sqrt(np.float32(scale)), q.dtype.as_numpy_dtype))
    groups = q_heads // kv_heads
    # Query heads h*groups .. h*groups+groups-1 share KV head h: fold them into the rows.
    q_rows = reshape_to_dims(tf.cast(q, dtype) * root, [b, kv_heads, groups * q_len, head_size])
    scores = tf.matmul(q_rows, tf.cast(k, dtype) * root, transpose_b=True)
    scores = _modified(ctx, "score_mod", reshape_to_dims(scores, [b, q_heads, q_len, kv_len]))
    probs = _modified(ctx, "prob_mod", tf.nn.softmax(scores))
    probs = reshape_to_dims(probs, [b, kv_heads, groups * q_len, kv_len])
    y = tf.matmul(probs, tf.cast(v, dtype))
    return reshape_to_dims(y, [b, q_heads, q_len, v.shape[3]])


def _modified(ctx, name: str, x):
    """x through the node's modifier subgraph `name`, converted with the project's handlers
    (identity when the node has none)."""
    graph = ctx.attr(name)
    if graph is None:
        return x
    outer = {n: ctx.value(n) for n in free_names(graph)}
    (result,) = run_subgraph(graph, dict(ctx.graph.opsets), [x], outer)
    return tf.cast(result, x.dtype)
