"""onnxruntime's transformer fusions (com.microsoft domain, and SimplifiedLayerNormalization of
the ONNX domain): what `onnxruntime.transformers.optimizer` writes into BERT, GPT-2 and LLM
graphs.

They lower to the same TF ops as their standard counterparts (ops/norm.py,
ops/transformer.py, ops/matmul.py, ops/conv.py), in the logical layout. onnxruntime masks
padded keys by adding `mask_filter_value` (-10000 by default) to the scores, not -inf, and
excludes future keys outright; the handlers do the same, so rows without an attendable key
match too. Their output shapes come from each handler's `infer` (ONNX inference does not
know these ops).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx2tf_alt.layout.policies import channel_last
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import handler

from ._dtypes import compute_dtype
from ._infer import attrs_of, dtype_of, infer_as, infer_attention, plus
from ._matmul_common import operand
from ._shapes import dims_of, reshape_to_dims
from .activation import relu
from .conv import conv
from .matmul import matmul_operands
from .norm import normalize
from .softmax import softmax
from .transformer import (
    grouped_scores,
    grouped_values,
    mask_out,
    merge_heads,
    rms_normalize,
    rotate,
    split_heads,
)

MS = "com.microsoft"
FLOAT, INT32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32


# --- output types (ONNX shape inference does not know these ops) -------------------------

def like_inputs(*sources):
    """`infer` giving output j the type of input sources[j] (None: output left unknown)."""

    def infer(node, types):
        return [None if i is None or i >= len(types) else types[i] for i in sources]

    return infer


def _broadcast(a: list, b: list) -> list:
    """numpy broadcasting of two dim lists (a symbolic dim wins over 1)."""
    a, b = [1] * (len(b) - len(a)) + list(a), [1] * (len(a) - len(b)) + list(b)
    return [y if x == 1 else x for x, y in zip(a, b)]


def _infer_fused_matmul(node, types):
    attrs = attrs_of(node)
    (dtype, a), (_, b) = types[0], types[1]
    rows = a[-1] if attrs.get("transA") else a[-2]
    cols = b[-2] if attrs.get("transB") else b[-1]
    return [(dtype, [*_broadcast(a[:-2], b[:-2]), rows, cols])]


# --- normalization -----------------------------------------------------------------------

def _skip_sum(ctx, bias_input: int):
    """input + skip (+ bias), in the compute dtype: what the Skip*Normalization ops normalize."""
    x = ctx.x(0)
    dtype = compute_dtype(x)
    total = tf.cast(x, dtype) + tf.cast(ctx.x(1), dtype)
    if ctx.has(bias_input):
        total = total + tf.cast(ctx.x(bias_input), dtype)
    return total


@handler("SkipLayerNormalization", domain=MS, infer=like_inputs(0, None, None, 0),
         limits="outputs mean and inv_std_var (training only) are not produced")
def skip_layer_normalization(ctx):
    """LayerNorm(input + skip + bias) * gamma + beta over the last axis; output 3 is the sum."""
    total = _skip_sum(ctx, 4)
    y, _, _ = normalize(total, [-1], ctx.attr("epsilon", 1e-12))
    y = y * tf.cast(ctx.x(2), y.dtype)
    if ctx.has(3):
        y = y + tf.cast(ctx.x(3), y.dtype)
    return _with_sum(ctx, y, total)


@handler("SkipSimplifiedLayerNormalization", domain=MS, infer=like_inputs(0, None, None, 0),
         limits="outputs mean and inv_std_var (training only) are not produced")
def skip_simplified_layer_normalization(ctx):
    """RMSNorm(input + skip + bias) * gamma; output 3 is the sum."""
    total = _skip_sum(ctx, 3)
    y = rms_normalize(total, [-1], ctx.attr("epsilon", 1e-12)) * tf.cast(ctx.x(2), total.dtype)
    return _with_sum(ctx, y, total)


def _with_sum(ctx, y, total) -> list:
    outputs = ctx.node.outputs
    if any(outputs[1:3]):
        raise NotImplementedError(f"{ctx.node.op_type}: the mean / inv_std_var outputs "
                                  "(training only) are not supported")
    return [y, None, None, total][: len(outputs)]


@handler("SimplifiedLayerNormalization", since=1, infer=like_inputs(0),
         limits="output inv_std_var is not produced")
def simplified_layer_normalization(ctx):
    """onnxruntime's RMS normalization of the ONNX domain (LLaMA-style graphs)."""
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise NotImplementedError("SimplifiedLayerNormalization: the inv_std_var output "
                                  "is not supported")
    x = ctx.x(0)
    x = tf.cast(x, compute_dtype(x))
    rank = ctx.rank(0)
    axes = list(range(ctx.attr("axis", -1) % rank, rank))
    return rms_normalize(x, axes, ctx.attr("epsilon", 1e-5)) * tf.cast(ctx.x(1), x.dtype)


def _infer_embed(node, types):
    (_, ids), (dtype, table) = types[0], types[2]
    embedded = (dtype, [*ids, table[-1]])
    return [embedded, (INT32, ids[:1]), embedded]


@handler("EmbedLayerNormalization", domain=MS, infer=_infer_embed,
         limits="mask_index is the per-row count of mask ones (right padding)")
def embed_layer_normalization(ctx):
    """LayerNorm(word[ids] + position[pos] + segment[segment_ids]) * gamma + beta; the second
    output (mask_index) is the number of ones in each row of the mask (0 without a mask)."""
    ids = tf.cast(ctx.x(0), tf.int32)
    total = tf.gather(ctx.x(2), ids)
    if ctx.has(8):
        positions = tf.cast(ctx.x(8), tf.int32)
    else:
        positions = tf.range(tf.shape(ids)[1])
    total = total + tf.gather(ctx.x(3), positions)
    if ctx.has(1) and ctx.has(4):
        total = total + tf.gather(ctx.x(4), tf.cast(ctx.x(1), tf.int32))
    y, _, _ = normalize(total, [-1], ctx.attr("epsilon", 1e-12))
    y = y * ctx.x(5) + ctx.x(6)
    if ctx.has(7):
        mask_index = tf.reduce_sum(tf.cast(ctx.x(7), tf.int32), axis=1)
    else:
        mask_index = tf.zeros_like(ids[:, 0])
    return [y, mask_index, total][: len(ctx.node.outputs)]


# --- bias fusions of diffusion models (onnxruntime runs them on CUDA only) ---------------

@handler("BiasAdd", domain=MS, infer=like_inputs(0),
         limits="tested against onnxruntime running the standard ops it fuses")
def bias_add(ctx):
    """input + bias + skip."""
    return ctx.x(0) + ctx.x(1) + ctx.x(2)


def _infer_bias_split_gelu(node, types):
    dtype, dims = types[0]
    half = dims[-1] // 2 if isinstance(dims[-1], int) else None
    return [(dtype, [*dims[:-1], half])]


@handler("BiasSplitGelu", domain=MS, infer=_infer_bias_split_gelu,
         limits="tested against onnxruntime running the standard ops it fuses")
def bias_split_gelu(ctx):
    """(input + bias) split in halves along the last axis: left * Gelu(right)."""
    left, right = tf.split(ctx.x(0) + ctx.x(1), 2, axis=-1)
    return left * tf.nn.gelu(right, approximate=False)


# --- matrix products and convolution ---------------------------------------------------

def _fused_matmul(ctx):
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise NotImplementedError(f"{ctx.node.op_type} with transBatchA/transBatchB")
    if min(ctx.rank(0), ctx.rank(1)) < 2:
        raise NotImplementedError(f"{ctx.node.op_type} with a 1-D operand")
    a, ta = operand(ctx, 0)
    b, tb = operand(ctx, 1)
    ta ^= bool(ctx.attr("transA", 0))
    tb ^= bool(ctx.attr("transB", 0))
    y = tf.linalg.matmul(a, b, transpose_a=ta, transpose_b=tb)
    alpha = ctx.attr("alpha", 1.0)
    return y if alpha == 1 else y * tf.constant(alpha, y.dtype)


handler("FusedMatMul", domain=MS, layout=matmul_operands(0, 1), infer=_infer_fused_matmul,
        limits="transBatchA/transBatchB and 1-D operands are not supported")(_fused_matmul)
handler("TransposeMatMul", domain=MS, layout=matmul_operands(0, 1), infer=_infer_fused_matmul,
        limits="transBatchA/transBatchB and 1-D operands are not supported")(_fused_matmul)


def _activation(name: str, params: list[float]):
    """FusedConv's `activation` attribute as a function (parameters as onnxruntime reads them)."""
    if name == "Relu":
        return relu
    if name == "Sigmoid":
        return tf.sigmoid
    if name == "Tanh":
        return tf.tanh
    if name == "LeakyRelu":
        return lambda y: tf.nn.leaky_relu(y, alpha=params[0] if params else 0.01)
    if name == "Clip":
        low, high = params or (np.finfo(np.float32).min, np.finfo(np.float32).max)
        return lambda y: tf.minimum(tf.maximum(y, low), high)
    if name == "HardSigmoid":
        alpha, beta = params or (0.2, 0.5)
        return lambda y: tf.minimum(tf.nn.relu(y * alpha + beta), 1.0)
    raise NotImplementedError(f"FusedConv activation {name!r}")


@handler("FusedConv", domain=MS, layout=channel_last(0, 3),
         infer=infer_as("Conv", [0, 1, 2], dtype_of(0)),
         limits="activation Relu, Sigmoid, Tanh, LeakyRelu, Clip or HardSigmoid")
def fused_conv(ctx):
    """Conv (+ Z, input 3) followed by the `activation` attribute."""
    y = conv(ctx)
    if ctx.has(3):
        y = y + ctx.x(3)
    name = ctx.attr("activation")
    if not name:
        return y
    if isinstance(name, bytes):
        name = name.decode()
    return _activation(name, list(ctx.attr("activation_params", [])))(y)


# --- attention -----------------------------------------------------------------------------

def _additive_mask(allowed, value: float, dtype):
    """0 where `allowed`, `value` (mask_filter_value) elsewhere."""
    return tf.where(allowed, tf.constant(0, dtype), tf.constant(value, dtype))


def _positions(length, shape: list[int]):
    """0 .. length - 1 (int32) reshaped to `shape` (one -1): a numpy constant when the length
    is static, else a RANGE at run time."""
    if isinstance(length, int):
        return np.arange(length, dtype=np.int32).reshape(shape)
    return tf.reshape(tf.range(length), shape)


def _causal(q_len, kv_len, past_len):
    """[S, T] 'may attend': key j for query i where j <= past_len + i (numpy when static)."""
    return _positions(q_len, [-1, 1]) + past_len >= _positions(kv_len, [1, -1])


def _key_padding(mask, batch, kv_len):
    """A com.microsoft key mask as 'may attend' [B, 1, S or 1, T] booleans.

    Forms: 1-D [B] valid lengths; 1-D [2B] end then start positions; 2-D [B, T] raw 0/1;
    3-D [B, S, T] raw 0/1.
    """
    keys = _positions(kv_len, [1, 1, 1, -1])
    rank = mask.shape.rank
    if rank == 1:
        mask = tf.cast(mask, tf.int32)
        if mask.shape[0] is not None and batch is not None and mask.shape[0] == 2 * batch:
            end, start = mask[:batch], mask[batch:]
            return tf.logical_and(tf.reshape(end, [-1, 1, 1, 1]) > keys,
                                  tf.reshape(start, [-1, 1, 1, 1]) <= keys)
        return tf.reshape(mask, [-1, 1, 1, 1]) > keys
    if rank == 2:
        return tf.expand_dims(tf.expand_dims(tf.not_equal(mask, tf.zeros_like(mask)), 1), 1)
    if rank == 3:
        return tf.expand_dims(tf.not_equal(mask, tf.zeros_like(mask)), 1)
    raise NotImplementedError(f"attention mask of rank {rank} (4-D Megatron masks)")


def _attend(ctx, q, k, v, mask=None, bias=None, past_len=0, allowed=None):
    """Multi-head attention of q [B, N, S, D], k and v [B, Nkv, T, D] as onnxruntime computes
    it: the optional key mask, causal order (unidirectional or GroupQueryAttention, or the
    given `allowed` [B or 1, 1, S, T]) and attention bias [B or 1, N or 1, S, T] are added to
    the scores; returns [B, S, N*Dv]. An `allowed` known only at run time becomes an additive
    bias (0 or the lowest float): an ADD that XNNPACK runs, where a SELECT would split its
    partition."""
    q_len, kv_len, head_size = dims_of(q)[2], dims_of(k)[2], q.shape[3]
    scale = ctx.attr("scale", 0.0) or 1.0 / np.sqrt(head_size)
    scores = grouped_scores(q, k, scale)
    softcap = ctx.attr("softcap", 0.0)
    if softcap > 0:
        scores = tf.tanh(scores / softcap) * softcap
    # Masked keys get `mask_filter_value` added; future keys are excluded outright (so a
    # query whose past keys are all masked attends them evenly, as in onnxruntime).
    if mask is not None:
        filled = _key_padding(mask, q.shape[0], kv_len)
        filler = ctx.attr("mask_filter_value", -10000.0)
        scores = scores + _additive_mask(filled, filler, scores.dtype)
    if allowed is None and (ctx.attr("unidirectional", 0)
                            or ctx.node.op_type == "GroupQueryAttention"):
        causal = _causal(q_len, kv_len, past_len)
        scores = mask_out(scores, ctx.const_tensor(causal)
                          if isinstance(causal, np.ndarray) else causal, keep_inf=False)
    elif isinstance(allowed, np.ndarray):
        scores = mask_out(scores, ctx.const_tensor(allowed), keep_inf=False)
    elif allowed is not None:
        scores = scores + _additive_mask(allowed, scores.dtype.min, scores.dtype)
    if bias is not None:
        scores = scores + tf.cast(bias, scores.dtype)
    return merge_heads(grouped_values(softmax(scores, [3]), v))


def _with_past(past_k, past_v, k, v):
    """(K, V) with the cached keys and values first, and the cached length."""
    if past_k is None:
        return k, v, 0
    return tf.concat([past_k, k], axis=2), tf.concat([past_v, v], axis=2), dims_of(past_k)[2]


@handler("Attention", domain=MS, infer=infer_attention,
         limits="no rotary (do_rotary), no 4-D Megatron mask, no past_present_share_buffer")
def ms_attention(ctx):
    """BERT / GPT-2 attention with packed QKV weights [in, q + k + v] and bias."""
    if ctx.attr("do_rotary", 0) or ctx.attr("past_present_share_buffer", 0):
        raise NotImplementedError("Attention with do_rotary or past_present_share_buffer")
    heads = ctx.attr("num_heads")
    x = ctx.x(0)
    qkv = tf.linalg.matmul(x, ctx.x(1))
    if ctx.has(2):
        qkv = qkv + ctx.x(2)
    total = int(ctx.shape(1)[1])
    sizes = list(ctx.attr("qkv_hidden_sizes", [total // 3] * 3))
    if len(set(sizes)) == 1:  # one TRANSPOSE for the three: [B, S, 3, N, D] -> [3, B, N, S, D]
        b, s, _ = dims_of(qkv)
        packed = reshape_to_dims(qkv, [b, s, 3, heads, sizes[0] // heads])
        q, k, v = tf.unstack(tf.transpose(packed, [2, 0, 3, 1, 4]))
    else:
        q, k, v = (split_heads(t, heads) for t in tf.split(qkv, sizes, axis=-1))
    past_k = past_v = None
    if ctx.has(4):
        past = ctx.x(4)
        past_k, past_v = past[0], past[1]
    k, v, past_len = _with_past(past_k, past_v, k, v)
    mask = ctx.x(3) if ctx.has(3) else None
    bias = ctx.x(5) if ctx.has(5) else None
    y = _attend(ctx, q, k, v, mask, bias, past_len)
    if len(ctx.node.outputs) < 2 or not ctx.node.outputs[1]:
        return y
    return [y, tf.stack([k, v])]


def _heads_of(x, heads: int):
    """A 3-D [B, L, N*D] input as [B, N, L, D]; a 4-D one is already [B, N, L, D]."""
    return split_heads(x, heads) if x.shape.rank == 3 else x


def _infer_mha(node, types):
    heads = attrs_of(node)["num_heads"]
    (dtype, q), (_, k), (_, v) = types[:3]
    if len(k) == 3:
        k, v = [k[0], heads, k[1], k[2] // heads], [v[0], heads, v[1], v[2] // heads]
    past_len = types[6][1][2] if len(types) > 6 and types[6] else 0
    present_k = (dtype, [k[0], heads, plus(past_len, k[2]), k[3]])
    present_v = (dtype, [v[0], heads, plus(past_len, v[2]), v[3]])
    return [(dtype, [q[0], q[1], v[1] * v[3]]), present_k, present_v]


@handler("MultiHeadAttention", domain=MS, infer=_infer_mha,
         limits="separate query, key and value (no packed QKV/KV)")
def multi_head_attention(ctx):
    heads = ctx.attr("num_heads")
    q, k, v = ctx.x(0), ctx.x(1), ctx.x(2)
    if q.shape.rank != 3 or not ctx.has(2):
        raise NotImplementedError("MultiHeadAttention with packed QKV or KV")
    if ctx.has(3):
        hidden = q.shape[-1]
        bias_q, bias_k, bias_v = tf.split(ctx.x(3), [hidden, k.shape[-1], v.shape[-1]])
        q, k, v = q + bias_q, k + bias_k, v + bias_v
    q, k, v = split_heads(q, heads), _heads_of(k, heads), _heads_of(v, heads)
    past_k = ctx.x(6) if ctx.has(6) else None
    past_v = ctx.x(7) if ctx.has(7) else None
    k, v, past_len = _with_past(past_k, past_v, k, v)
    mask = ctx.x(4) if ctx.has(4) else None
    bias = ctx.x(5) if ctx.has(5) else None
    return [_attend(ctx, q, k, v, mask, bias, past_len), k, v][: len(ctx.node.outputs)]


def _rotary_caches(ctx, seq_len):
    """cos and sin [B or 1, S, rotary/2] of com.microsoft RotaryEmbedding: gathered at the
    position ids [B, S] (input 1), or from a single start offset for every row."""
    cos, sin = ctx.x(2), ctx.x(3)
    positions = tf.cast(ctx.x(1), tf.int32)
    if positions.shape.rank != 2:
        start = tf.reshape(positions, [-1])[:1]
        positions = tf.expand_dims(tf.range(seq_len) + start, 0)
    return tf.gather(cos, positions), tf.gather(sin, positions)


@handler("RotaryEmbedding", domain=MS, infer=like_inputs(0),
         limits="is_packed_batching and scale other than 1 are not supported")
def ms_rotary_embedding(ctx):
    """Inputs (x, position_ids, cos_cache, sin_cache); x [B, S, N*D] or [B, N, S, D]."""
    if ctx.attr("is_packed_batching", 0) or ctx.attr("scale", 1.0) != 1.0:
        raise NotImplementedError("RotaryEmbedding with is_packed_batching or a scale")
    dims = dims_of(ctx.x(0))
    four_d = len(dims) == 4
    cos, sin = _rotary_caches(ctx, dims[2] if four_d else dims[1])
    return rotate(ctx.x(0), cos, sin, 1 if four_d else 2, ctx.attr("num_heads", 0),
                  2 * int(ctx.shape(2)[-1]), bool(ctx.attr("interleaved", 0)))


def _infer_gqa(node, types):
    attrs = attrs_of(node)
    (dtype, q) = types[0]
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    packed = len(types) < 2 or not types[1]
    past = types[3][1] if len(types) > 3 and types[3] else None
    if isinstance(q[2], int):
        head_size = q[2] // (heads + 2 * kv_heads if packed else heads)
    else:
        head_size = past[3] if past else f"({q[2]}) // {heads + 2 * kv_heads}"
    width = heads * head_size if isinstance(head_size, int) else f"{heads} * {head_size}"
    present = (dtype, [q[0], kv_heads, plus(past[2] if past else 0, q[1]), head_size])
    return [(dtype, [q[0], q[1], width]), present, present]


def _gqa_inputs(ctx, heads: int, kv_heads: int):
    """q [B, S, N*D], k and v [B, S, Nkv*D]: separate inputs, or packed in the query."""
    q = ctx.x(0)
    if ctx.has(1):
        return q, ctx.x(1), ctx.x(2)
    head_size = int(ctx.shape(0)[2]) // (heads + 2 * kv_heads)
    return tf.split(q, [heads * head_size, kv_heads * head_size, kv_heads * head_size], axis=-1)


def _gqa_past_rows(ctx, seq_len):
    """Each row's past length [B] (int32), as onnxruntime reads it: seqlens_k + 1 - S (the
    filled prefix of the past buffer), or 0 for a first prompt (S == total_sequence_length).
    A static int when every row's is known at conversion."""
    total = ctx.const(6)
    if isinstance(seq_len, int) and total is not None and int(np.ravel(total)[0]) == seq_len:
        return 0
    rows = tf.reshape(tf.cast(ctx.x(5), tf.int32), [-1]) + 1 - seq_len
    if total is not None:
        return rows
    first = tf.equal(tf.reshape(tf.cast(ctx.x(6), tf.int32), []), seq_len)
    return tf.where(first, tf.zeros_like(rows), rows)


def _gqa_allowed(seq_len, past_len, past_rows, window: int = -1):
    """'May attend' [B or 1, 1, S, P + S] over the keys Concat(past, new): past slot j when
    j < the row's past length, new key i' for query i when i' <= i; with a local `window`
    (> 0) only the `window` latest positions, the query's own included (onnxruntime 1.32's
    local_window_size, as Mistral's sliding window). A numpy array when everything is
    static."""
    keys = _positions(past_len + seq_len, [1, 1, 1, -1])
    queries = _positions(seq_len, [1, 1, -1, 1])
    static = all(isinstance(v, int) for v in (past_rows, past_len, seq_len))
    and_, or_ = (np.logical_and, np.logical_or) if static else (tf.logical_and, tf.logical_or)
    new = and_(keys >= past_len, keys - past_len <= queries)
    if window > 0:  # a new key i' is i - i' positions before query i
        new = and_(new, keys - past_len > queries - window)
    if isinstance(past_len, int) and past_len == 0:
        return new
    if static:
        limit, rows = min(past_rows, past_len), past_rows
        past = keys < limit
    else:
        rows = tf.reshape(tf.convert_to_tensor(past_rows, tf.int32), [-1, 1, 1, 1])
        past = tf.less(keys, tf.minimum(rows, past_len))
    if window > 0:  # past slot j is past_rows + i - j positions before query i
        near = rows + queries - window
        past = and_(past, keys > near if static else tf.greater(keys, near))
    return or_(new, past)


def _gqa_present(past, new, past_rows, past_len, seq_len):
    """onnxruntime's present key or value [B, Nkv, P + S, D]: each row's filled past, its new
    entries right after it, zeros beyond."""
    both = tf.concat([past, new], axis=2)
    if isinstance(past_rows, int) and past_rows == past_len:
        return both
    length = past_len + seq_len
    slots = tf.reshape(tf.range(length), [1, -1])
    rows = tf.reshape(tf.minimum(past_rows, past_len), [-1, 1])
    index = tf.where(tf.less(slots, rows), slots, slots - rows + past_len)
    index = tf.minimum(index, length - 1) + tf.zeros([tf.shape(both)[0], 1], tf.int32)
    filled = tf.cast(tf.less(slots, rows + seq_len), both.dtype)
    gathered = tf.gather(both, index, axis=2, batch_dims=1)
    return gathered * filled[:, None, :, None]


_GQA_INPUTS_UNSUPPORTED = {11: "head_sink", 12: "k_scale", 13: "v_scale", 14: "q_norm_weight",
                           15: "k_norm_weight", 16: "query_seqlens"}


def _gqa_supported(ctx) -> None:
    """NotImplementedError naming what this GroupQueryAttention asks beyond the handler:
    onnxruntime's newer inputs and attributes (attention sinks, a quantized or windowed ring
    cache, per-head Q/K norms, non-causal attention, smooth softmax, the QK output)."""
    asked = [name for i, name in _GQA_INPUTS_UNSUPPORTED.items() if ctx.has(i)]
    flags = {"smooth_softmax": 0, "sliding_window_cache": 0, "kv_cache_bit_width": 0,
             "qk_output": 0, "causal": 1}
    asked += [f"{name}={ctx.attr(name)}" for name, default in flags.items()
              if ctx.attr(name, default) != default]
    asked += [f"{name}={ctx.attr(name)!r}" for name in ("k_quant_type", "v_quant_type")
              if str(ctx.attr(name, "NONE")).upper() not in ("NONE", "B'NONE'")]
    if asked:
        raise NotImplementedError(f"GroupQueryAttention with {', '.join(asked)}")


@handler("GroupQueryAttention", domain=MS, infer=_infer_gqa,
         limits="past and present of past + new positions (no shared buffer or windowed "
         "ring cache); no attention sink, quantized cache, Q/K norm inputs, non-causal or "
         "smooth softmax")
def group_query_attention(ctx):
    """Causal grouped-query attention after each row's filled past ([B, Nkv, P, D], rows
    told by seqlens_k as onnxruntime reads them), rotary embedding of the new positions with
    do_rotary; query, key and value separate or packed."""
    _gqa_supported(ctx)
    window = ctx.attr("local_window_size", -1)
    heads, kv_heads = ctx.attr("num_heads"), ctx.attr("kv_num_heads")
    q, k, v = _gqa_inputs(ctx, heads, kv_heads)
    seq_len = dims_of(q)[1]
    past_len = dims_of(ctx.x(3))[2] if ctx.has(3) else 0
    total = ctx.const(6)
    if total is not None and isinstance(past_len, int) and isinstance(seq_len, int) \
            and max(int(np.ravel(total)[0]), past_len) != past_len + seq_len:
        raise NotImplementedError("GroupQueryAttention with a shared past/present buffer "
                                  "(total_sequence_length < past + new positions)")
    no_past = isinstance(past_len, int) and past_len == 0
    past_rows = 0 if no_past else _gqa_past_rows(ctx, seq_len)
    if ctx.attr("do_rotary", 0):
        interleaved = bool(ctx.attr("rotary_interleaved", 0))
        if ctx.has(9):
            positions = ctx.x(9)
        else:
            positions = _positions(seq_len, [1, -1])
            if not isinstance(past_rows, int):
                positions = tf.add(positions, tf.reshape(past_rows, [-1, 1]))
            elif past_rows:
                positions = positions + past_rows
        cos, sin = tf.gather(ctx.x(7), positions), tf.gather(ctx.x(8), positions)
        rotary = 2 * int(ctx.shape(7)[-1])
        q = rotate(q, cos, sin, 2, heads, rotary, interleaved)
        k = rotate(k, cos, sin, 2, kv_heads, rotary, interleaved)
    q, k, v = split_heads(q, heads), split_heads(k, kv_heads), split_heads(v, kv_heads)
    bias = ctx.x(10) if ctx.has(10) else None
    if no_past:
        allowed = _gqa_allowed(seq_len, 0, 0, window) if window > 0 else None
        y = _attend(ctx, q, k, v, bias=bias, allowed=allowed)
        return [y, k, v][: len(ctx.node.outputs)]
    keys, values, _ = _with_past(ctx.x(3), ctx.x(4), k, v)
    allowed = _gqa_allowed(seq_len, past_len, past_rows, window)
    y = _attend(ctx, q, keys, values, bias=bias, allowed=allowed)
    outputs = [y]
    if len(ctx.node.outputs) > 1:
        outputs += [_gqa_present(ctx.x(3), k, past_rows, past_len, seq_len),
                    _gqa_present(ctx.x(4), v, past_rows, past_len, seq_len)]
    return outputs[: len(ctx.node.outputs)]
