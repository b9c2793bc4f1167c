"""Transformer building blocks of opset 23+: Attention, RMSNormalization, RotaryEmbedding.

All run in the logical (ONNX) layout. Attention keeps the head axis where ONNX has it:
grouped-query attention folds the query heads of one KV head into the query sequence axis,
so K and V are never repeated. float16 inputs are computed in float32 (the builder casts the
outputs back to the ONNX dtype). Attention computes bfloat16 op by op in bfloat16, rounding
where the ONNX reference rounds (TFLite has no bfloat16 kernels, so this is the TF model's).
"""

from __future__ import annotations

import numpy as np
import onnx
import tensorflow as tf

from onnx2tf_alt.registry import handler

from .softmax import softmax

_NEG_INF = np.float32(-np.inf)


def _compute_dtype(tensor):
    """float32 for half-precision tensors (TFLite and most TF kernels prefer it)."""
    return tf.float32 if tensor.dtype in (tf.float16, tf.bfloat16) else tensor.dtype


def _dims(x) -> list:
    """x's shape: static ints, scalar tensors where unknown."""
    runtime = tf.shape(x)
    return [runtime[i] if d is None else int(d) for i, d in enumerate(x.shape.as_list())]


def _reshape(x, dims: list):
    if all(isinstance(d, int) for d in dims):
        return tf.reshape(x, dims)
    return tf.reshape(x, tf.stack([tf.cast(d, tf.int32) for d in dims]))


def split_heads(x, heads: int):
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, hidden = _dims(x)
    return tf.transpose(_reshape(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


def merge_heads(y):
    """[B, H, S, D] -> [B, S, H*D]."""
    b, heads, s, head_size = _dims(y)
    return _reshape(tf.transpose(y, [0, 2, 1, 3]), [b, s, heads * head_size])


def grouped_scores(q, k, scale: float):
    """q kᵀ * scale [B, Hq, S, T] of q [B, Hq, S, D] and k [B, Hkv, T, D].

    Query heads h*G .. h*G+G-1 share KV head h: they are folded into the query rows, so K
    is never repeated. Both operands are scaled by sqrt(scale) (as the ONNX reference).
    """
    b, q_heads, q_len, head_size = _dims(q)
    kv_heads, kv_len = k.shape[1], _dims(k)[2]
    root = tf.constant(np.sqrt(scale), q.dtype)
    q_rows = _reshape(q * root, [b, kv_heads, (q_heads // kv_heads) * q_len, head_size])
    return _reshape(tf.matmul(q_rows, k * root, transpose_b=True), [b, q_heads, q_len, kv_len])


def grouped_values(probs, v):
    """probs [B, Hq, S, T] times v [B, Hkv, T, Dv] -> [B, Hq, S, Dv] (heads grouped)."""
    b, q_heads, q_len, kv_len = _dims(probs)
    kv_heads = v.shape[1]
    rows = _reshape(probs, [b, kv_heads, (q_heads // kv_heads) * q_len, kv_len])
    return _reshape(tf.matmul(rows, v), [b, q_heads, q_len, v.shape[3]])


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
    return q.dtype if q.dtype == tf.bfloat16 else _compute_dtype(q)


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
    dtype = _compute_dtype(x)
    x = tf.cast(x, dtype)
    axes = list(range(ctx.attr("axis", -1) % ctx.rank(0), ctx.rank(0)))
    y = rms_normalize(x, axes, ctx.attr("epsilon", 1e-5))
    return y * tf.cast(ctx.x(1), dtype)


def rotate(x, cos, sin, head_axis: int, num_heads: int, rotary: int, interleaved: bool):
    """Rotary embedding of x [B, S, H*D] (split into `num_heads`) or 4-D, whose head axis is
    `head_axis`; cos and sin [B, S, rotary/2] broadcast over it. The first `rotary` (0: all)
    features of each head rotate, as interleaved pairs or as two halves."""
    dims = _dims(x)
    if len(dims) == 3:  # [B, S, H*D] -> [B, S, H, D]
        x = _reshape(x, [dims[0], dims[1], num_heads, dims[2] // num_heads])
    cos, sin = tf.expand_dims(cos, head_axis), tf.expand_dims(sin, head_axis)
    head_size = x.shape[-1]
    rotary = rotary or head_size
    part, keep = x[..., :rotary], x[..., rotary:]
    if interleaved:
        pairs = _reshape(part, [*_dims(part)[:-1], rotary // 2, 2])
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = part[..., : rotary // 2], part[..., rotary // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = _reshape(tf.stack([real, imag], axis=-1), _dims(part))
    else:
        rotated = tf.concat([real, imag], axis=-1)
    y = tf.concat([rotated, keep], axis=-1) if rotary < head_size else rotated
    return _reshape(y, dims)


@handler("RotaryEmbedding", since=23)
def rotary_embedding(ctx):
    """x [B, S, H*D] or [B, H, S, D]; cos and sin broadcast over the head axis."""
    cos, sin = ctx.x(1), ctx.x(2)
    if ctx.has(3):
        cos, sin = tf.gather(cos, ctx.x(3)), tf.gather(sin, ctx.x(3))
    head_axis = 2 if ctx.rank(0) == 3 else 1
    return rotate(ctx.x(0), cos, sin, head_axis, ctx.attr("num_heads", 0),
                  ctx.attr("rotary_embedding_dim", 0), bool(ctx.attr("interleaved", 0)))
