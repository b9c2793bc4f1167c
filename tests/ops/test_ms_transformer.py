"""onnxruntime's com.microsoft transformer fusions and weight-only quantized ops against
onnxruntime, through TF and the float32 TFLite: one-node models here; graphs written by
onnxruntime's own tools in tests/ops/test_ms_tools.py."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.errors import ConversionError

from harness import (
    Rng,
    assert_close,
    check_model,
    convert,
    count_tflite_ops,
    ort_run,
    tensor_info,
    tf_run,
    tflite_run,
)

rng = Rng(0)
MS = "com.microsoft"


def contrib_model(op, inputs, initializers=None, attrs=None, order=None, outputs=None,
                  domain=MS, opset=14, input_shapes=None):
    """One node, each output read by an Identity that is a graph output (typed by an
    onnxruntime run): ONNX shape inference does not know these ops, so the converter must
    infer the node's output shapes itself.

    `outputs` lists (name, dtype) pairs, ("", None) for an omitted output; `input_shapes`
    may declare inputs with symbolic dims."""
    initializers = initializers or {}
    outputs = outputs or [("y", np.float32)]
    order = order or [*inputs, *initializers]
    raw = [f"{n}_raw" if n else "" for n, _ in outputs]
    nodes = [helper.make_node(op, order, raw, domain=domain, **(attrs or {}))]
    nodes += [helper.make_node("Identity", [r], [n]) for r, (n, _) in zip(raw, outputs) if n]
    graph = helper.make_graph(
        nodes, "test", [tensor_info(n, a, (input_shapes or {}).get(n)) for n, a in inputs.items()],
        [tensor_info(n, t, None) for n, t in outputs if n],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    results = ort_run(model, inputs)
    del model.graph.output[:]
    model.graph.output.extend(tensor_info(n, r) for (n, _), r in
                              zip([o for o in outputs if o[0]], results))
    return model


def check_contrib(*args, tol=1e-4, **kwargs):
    """Convert, compare with onnxruntime (TF and TFLite), return the TFLite op census."""
    inputs = args[1]
    converted = check_model(contrib_model(*args, **kwargs), inputs, tol=tol)
    return count_tflite_ops(converted.tflite)


# --- normalization -----------------------------------------------------------------------

WITH_SUM = [("y", np.float32), ("", None), ("", None), ("sum", np.float32)]


@pytest.mark.parametrize("skip_shape, bias, beta", [((2, 5, 8), True, True),
                                                    ((5, 8), False, True),
                                                    ((1, 5, 8), True, False)])
def test_skip_layer_normalization(skip_shape, bias, beta):
    params = {"gamma": rng.randn(8), "beta": rng.randn(8), "bias": rng.randn(8)}
    order = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    params = {k: v for k, v in params.items() if k in order}
    census = check_contrib("SkipLayerNormalization", {"x": rng.randn(2, 5, 8),
                                                      "skip": rng.randn(*skip_shape)},
                           params, {"epsilon": 1e-5}, order,
                           WITH_SUM)
    assert census.get("TRANSPOSE", 0) == 0


@pytest.mark.parametrize("bias", [True, False])
def test_skip_simplified_layer_normalization(bias):
    params = {"gamma": rng.randn(12), "bias": rng.randn(12)}
    order = ["x", "skip", "gamma", "bias" if bias else ""]
    params = {k: v for k, v in params.items() if k in order}
    check_contrib("SkipSimplifiedLayerNormalization", {"x": rng.randn(3, 4, 12),
                                                       "skip": rng.randn(3, 4, 12)},
                  params, {"epsilon": 1e-6}, order,
                  WITH_SUM)


@pytest.mark.parametrize("shape, axis", [((2, 5, 8), -1), ((2, 5, 8), 1), ((3, 7), -1)])
def test_simplified_layer_normalization(shape, axis):
    check_contrib("SimplifiedLayerNormalization", {"x": rng.randn(*shape)},
                  {"scale": rng.randn(*shape[axis:])}, {"axis": axis, "epsilon": 1e-5},
                  domain="")


def test_layer_normalization_below_opset_17():
    """onnxruntime's LayerNormalization of opsets 1-16 (its optimizer writes it there)."""
    check_contrib("LayerNormalization", {"x": rng.randn(2, 5, 8)},
                  {"scale": rng.randn(8), "bias": rng.randn(8)}, {"epsilon": 1e-5}, domain="")


EMBED_TABLES = {"word": rng.randn(30, 16), "position": rng.randn(12, 16),
                "segment": rng.randn(2, 16), "gamma": rng.randn(16), "beta": rng.randn(16)}


@pytest.mark.parametrize("segments, mask, positions", [(True, True, False),
                                                       (False, False, False),
                                                       (True, False, True)])
def test_embed_layer_normalization(segments, mask, positions):
    ids = rng.integers(0, 30, (3, 7)).astype(np.int32)
    inputs = {"ids": ids}
    if segments:
        inputs["segment_ids"] = rng.integers(0, 2, (3, 7)).astype(np.int32)
    if mask:
        inputs["mask"] = (np.arange(7) < np.array([[7], [4], [1]])).astype(np.int32)
    if positions:
        inputs["position_ids"] = rng.integers(0, 12, (3, 7)).astype(np.int32)
    order = ["ids", "segment_ids" if segments else "", "word", "position",
             "segment" if segments else "", "gamma", "beta", "mask" if mask else "",
             "position_ids" if positions else ""]
    tables = {k: v for k, v in EMBED_TABLES.items() if k in order}
    outputs = [("y", np.float32), ("mask_index", np.int32), ("sum", np.float32)]
    check_contrib("EmbedLayerNormalization", inputs, tables, {"epsilon": 1e-12}, order,
                  outputs)


# --- bias fusions without a CPU kernel in onnxruntime ------------------------------------

def _graph_model(nodes, inputs, initializers, y_type):
    graph = helper.make_graph(nodes, "test", [tensor_info(n, a) for n, a in inputs.items()],
                              [tensor_info("y", y_type)],
                              [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def check_against_decomposed(op, order, inputs, initializers, reference_nodes):
    """An op onnxruntime runs on CUDA only: the reference is onnxruntime running the standard
    ops it stands for (`reference_nodes`, writing y)."""
    expected = ort_run(_graph_model(reference_nodes, inputs, initializers, np.float32),
                       inputs)[0]
    nodes = [helper.make_node(op, order, ["y_raw"], domain=MS),
             helper.make_node("Identity", ["y_raw"], ["y"])]
    converted = convert(_graph_model(nodes, inputs, initializers, expected))
    assert_close(tf_run(converted, inputs)[0], expected, what="TF")
    assert_close(tflite_run(converted, inputs)[0], expected, what="TFLite")


def test_bias_add():
    check_against_decomposed(
        "BiasAdd", ["x", "bias", "skip"], {"x": rng.randn(2, 9, 6), "skip": rng.randn(2, 9, 6)},
        {"bias": rng.randn(6)},
        [helper.make_node("Add", ["x", "bias"], ["t"]), helper.make_node("Add", ["t", "skip"],
                                                                         ["y"])])


def test_bias_split_gelu():
    halves = [helper.make_node("Add", ["x", "bias"], ["t"]),
              helper.make_node("Split", ["t"], ["left", "right"], axis=-1),
              helper.make_node("Gelu", ["right"], ["g"], domain=MS),
              helper.make_node("Mul", ["left", "g"], ["y"])]
    check_against_decomposed("BiasSplitGelu", ["x", "bias"], {"x": rng.randn(2, 16, 10)},
                             {"bias": rng.randn(10)}, halves)


# --- matrix products and convolution ---------------------------------------------------

@pytest.mark.parametrize("op, trans_a, trans_b, alpha", [
    ("FusedMatMul", 0, 0, 1.0), ("FusedMatMul", 1, 0, 0.5), ("FusedMatMul", 1, 1, -1.5),
    ("TransposeMatMul", 0, 1, 1.0), ("TransposeMatMul", 1, 0, 1.0)])
def test_fused_matmul(op, trans_a, trans_b, alpha):
    a = rng.randn(2, 3, *((4, 5) if trans_a else (5, 4)))
    b = rng.randn(3, *((6, 4) if trans_b else (4, 6)))
    attrs = {"transA": trans_a, "transB": trans_b}
    if op == "FusedMatMul":
        attrs["alpha"] = alpha
    census = check_contrib(op, {"a": a, "b": b}, attrs=attrs)
    assert census.get("TRANSPOSE", 0) == 0


def test_fused_matmul_constant_weights():
    check_contrib("FusedMatMul", {"a": rng.randn(2, 5, 4)}, {"w": rng.randn(6, 4)},
                  {"transB": 1, "alpha": 0.25})


@pytest.mark.parametrize("activation, params", [("Relu", None), ("Tanh", None),
                                                ("LeakyRelu", [0.2]),
                                                ("Clip", [-0.5, 0.7]),
                                                ("HardSigmoid", [0.3, 0.4]), ("", None)])
def test_fused_conv(activation, params):
    attrs = {"pads": [1, 0, 1, 2], "strides": [1, 2]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    census = check_contrib("FusedConv", {"x": rng.randn(2, 3, 7, 9)},
                           {"w": rng.randn(4, 3, 3, 3), "b": rng.randn(4)}, attrs)
    assert census.get("TRANSPOSE", 0) <= 2  # the NCHW model input and output only


def test_fused_conv_with_sum():
    """A 4th input Z is added before the activation (Conv + Add + Relu fused)."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["z"], pads=[1, 1, 1, 1]),
        helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=MS, pads=[1, 1, 1, 1],
                         activation="Relu"),
    ]
    inputs = {"x": rng.randn(2, 3, 6, 5)}
    weights = {"w0": rng.randn(4, 3, 3, 3), "w": rng.randn(4, 3, 3, 3), "b": rng.randn(4)}
    graph = helper.make_graph(nodes, "test", [tensor_info("x", inputs["x"])],
                              [tensor_info("y", np.float32, [2, 4, 6, 5])],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    converted = check_model(model, inputs)
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) <= 2


# --- attention -----------------------------------------------------------------------------

def _lengths(batch, length):
    return rng.integers(1, length + 1, batch).astype(np.int32)


def _raw_mask(*shape):
    mask = (rng.random(shape) > 0.3).astype(np.int32)
    mask[..., 0] = 1  # every query keeps a key
    return mask


ATTENTION_MASKS = {
    "none": None,
    "lengths": lambda b, s, t: _lengths(b, t),
    "end_start": lambda b, s, t: np.concatenate([np.full(b, t - 1), rng.integers(0, 2, b)]
                                                ).astype(np.int32),
    "raw_2d": lambda b, s, t: _raw_mask(b, t),
    "raw_3d": lambda b, s, t: _raw_mask(b, s, t),
}


@pytest.mark.parametrize("mask, unidirectional", [
    *((mask, 0) for mask in ATTENTION_MASKS), ("none", 1), ("raw_2d", 1), ("end_start", 1)])
def test_attention(mask, unidirectional):
    batch, seq, hidden, heads = 2, 5, 12, 3
    inputs = {"x": rng.randn(batch, seq, 10)}
    order = ["x", "w", "bias"]
    if ATTENTION_MASKS[mask]:
        inputs["mask_index"] = ATTENTION_MASKS[mask](batch, seq, seq)
        order.append("mask_index")
    check_contrib("Attention", inputs,
                  {"w": rng.randn(10, 3 * hidden), "bias": rng.randn(3 * hidden)},
                  {"num_heads": heads, "unidirectional": unidirectional}, order)


@pytest.mark.parametrize("mask", ["raw_2d", "lengths"])
def test_attention_dynamic_lengths(mask):
    """Batch and sequence length unknown until run time (a model exported with dynamic axes)."""
    inputs = {"x": rng.randn(2, 5, 8), "mask_index": ATTENTION_MASKS[mask](2, 5, 5)}
    shapes = {"x": ["batch", "sequence", 8],
              "mask_index": ["batch", "sequence"] if mask == "raw_2d" else ["batch"]}
    check_contrib("Attention", inputs, {"w": rng.randn(8, 24), "bias": rng.randn(24)},
                  {"num_heads": 2, "unidirectional": 1}, ["x", "w", "bias", "mask_index"],
                  input_shapes=shapes)


def test_attention_sizes_scale_and_bias():
    """qkv_hidden_sizes with a wider V, a scale, an attention bias and a mask filter value."""
    inputs = {"x": rng.randn(3, 4, 8), "mask_index": _raw_mask(3, 4),
              "attention_bias": rng.randn(3, 2, 4, 4)}
    check_contrib("Attention", inputs, {"w": rng.randn(8, 8 + 8 + 12), "bias": rng.randn(28)},
                  {"num_heads": 2, "qkv_hidden_sizes": [8, 8, 12], "scale": 0.3,
                   "mask_filter_value": -1000.0},
                  ["x", "w", "bias", "mask_index", "", "attention_bias"])


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_past_and_present(unidirectional):
    batch, seq, past_len, heads, head_size = 2, 3, 4, 2, 4
    hidden = heads * head_size
    inputs = {"x": rng.randn(batch, seq, hidden), "mask_index": _raw_mask(batch, past_len + seq),
              "past": rng.randn(2, batch, heads, past_len, head_size)}
    check_contrib("Attention", inputs, {"w": rng.randn(hidden, 3 * hidden)},
                  {"num_heads": heads, "unidirectional": unidirectional},
                  ["x", "w", "", "mask_index", "past"],
                  [("y", np.float32), ("present", np.float32)])


@pytest.mark.parametrize("mask, four_d_kv", [("none", False), ("lengths", True),
                                             ("raw_2d", False), ("raw_2d", True)])
def test_multi_head_attention(mask, four_d_kv):
    batch, seq, kv_len, heads, head_size = 2, 4, 6, 3, 4
    hidden = heads * head_size
    key, value = rng.randn(batch, kv_len, hidden), rng.randn(batch, kv_len, hidden)
    if four_d_kv:
        key = key.reshape(batch, kv_len, heads, head_size).transpose(0, 2, 1, 3).copy()
        value = value.reshape(batch, kv_len, heads, head_size).transpose(0, 2, 1, 3).copy()
    inputs = {"q": rng.randn(batch, seq, hidden), "k": key, "v": value}
    order = ["q", "k", "v", ""]
    if ATTENTION_MASKS[mask]:
        inputs["key_padding_mask"] = ATTENTION_MASKS[mask](batch, seq, kv_len)
        order.append("key_padding_mask")
    check_contrib("MultiHeadAttention", inputs, attrs={"num_heads": heads}, order=order)


def test_multi_head_attention_bias_and_present():
    batch, seq, heads, head_size, past_len = 2, 3, 2, 4, 5
    hidden = heads * head_size
    inputs = {"q": rng.randn(batch, seq, hidden), "k": rng.randn(batch, seq, hidden),
              "v": rng.randn(batch, seq, hidden),
              "attention_bias": rng.randn(1, heads, seq, past_len + seq),
              "past_key": rng.randn(batch, heads, past_len, head_size),
              "past_value": rng.randn(batch, heads, past_len, head_size)}
    check_contrib("MultiHeadAttention", inputs, {"bias": rng.randn(3 * hidden)},
                  {"num_heads": heads, "unidirectional": 1, "scale": 0.5},
                  ["q", "k", "v", "bias", "", "attention_bias", "past_key", "past_value"],
                  [("y", np.float32), ("present_key", np.float32),
                   ("present_value", np.float32)])


def _rotary_caches(positions, half):
    angles = rng.random((positions, half)).astype(np.float32) * 3
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved, shape, num_heads, rotary_dim", [
    (0, (2, 5, 24), 3, 0), (1, (2, 5, 24), 3, 0), (0, (2, 3, 5, 8), 0, 0),
    (1, (2, 5, 16), 2, 4)])
def test_rotary_embedding(interleaved, shape, num_heads, rotary_dim):
    head = shape[-1] // (num_heads or 1) if len(shape) == 3 else shape[-1]
    cos, sin = _rotary_caches(16, (rotary_dim or head) // 2)
    seq = shape[-2] if len(shape) == 4 else shape[1]
    positions = rng.integers(0, 16 - seq, (shape[0], seq)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if num_heads:
        attrs["num_heads"] = num_heads
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    check_contrib("RotaryEmbedding", {"x": rng.randn(*shape), "position_ids": positions},
                  {"cos": cos, "sin": sin}, attrs)


def test_rotary_embedding_start_offset():
    cos, sin = _rotary_caches(12, 4)
    check_contrib("RotaryEmbedding", {"x": rng.randn(2, 5, 16), "offset": np.array([3], np.int64)},
                  {"cos": cos, "sin": sin}, {"num_heads": 2})


def _check_gqa(inputs, order, heads, kv_heads, head_size, rotary, constants=None, **attrs):
    """GroupQueryAttention on `inputs` (in `order`), with cos/sin caches when `rotary` (True:
    of the whole head; a number: of that many features); `constants` are initializers (e.g.
    a total_sequence_length known at conversion)."""
    initializers = dict(constants or {})
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, **attrs}
    if rotary:
        rotated = head_size if rotary is True else rotary
        initializers["cos"], initializers["sin"] = _rotary_caches(16, rotated // 2)
        order = [*order, "cos", "sin"]
        attrs["do_rotary"] = 1
    outputs = [("y", np.float32), ("present_key", np.float32), ("present_value", np.float32)]
    check_contrib("GroupQueryAttention", inputs, initializers, attrs, order, outputs)


@pytest.mark.parametrize("heads, kv_heads, rotary", [(4, 2, False), (3, 3, False),
                                                    (4, 2, True), (4, 1, True)])
def test_group_query_attention(heads, kv_heads, rotary):
    batch, seq = 2, 5
    head_size = 16 if rotary else 8  # onnxruntime rotates heads of a multiple of 16 only
    inputs = {"q": rng.randn(batch, seq, heads * head_size),
              "k": rng.randn(batch, seq, kv_heads * head_size),
              "v": rng.randn(batch, seq, kv_heads * head_size),
              "seqlens_k": np.full(batch, seq - 1, np.int32),
              "total_sequence_length": np.array(seq, np.int32)}
    _check_gqa(inputs, ["q", "k", "v", "", "", "seqlens_k", "total_sequence_length"],
               heads, kv_heads, head_size, rotary)


GQA_ORDER = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length"]


def _gqa_step(batch, seq, past, filled, heads=4, kv_heads=2, head_size=16):
    """Packed QKV [B, S, (N + 2 Nkv) D] after a past buffer of `past` positions of which row
    b has `filled[b]` filled (onnxruntime model-builder form: seqlens_k = filled + S - 1)."""
    return {"qkv": rng.randn(batch, seq, (heads + 2 * kv_heads) * head_size),
            "past_key": rng.randn(batch, kv_heads, past, head_size),
            "past_value": rng.randn(batch, kv_heads, past, head_size),
            "seqlens_k": np.array(filled, np.int32) + seq - 1,
            "total_sequence_length": np.array(past + seq, np.int32)}


@pytest.mark.parametrize("rotary, attrs", [(True, {}), (False, {}),
                                           (True, {"scale": 0.3, "softcap": 2.0})])
def test_group_query_attention_decodes_rows_of_different_lengths(rotary, attrs):
    """One new token per row after a past buffer of 6 positions filled 6, 3 and 0 deep: each
    row attends its own filled prefix, rotates at its own position, and its present has the
    new entries right after that prefix (zeros beyond), as onnxruntime reads seqlens_k."""
    _check_gqa(_gqa_step(3, 1, 6, [6, 3, 0]), GQA_ORDER, 4, 2, 16, rotary, **attrs)


def test_group_query_attention_rotates_part_of_each_head():
    """A rotary embedding of the first 16 of 32 features (phi-style), rows of different
    lengths."""
    _check_gqa(_gqa_step(2, 1, 6, [6, 2], head_size=32), GQA_ORDER, 4, 2, 32, 16)
    _check_gqa(_gqa_step(2, 1, 6, [4, 1], head_size=32), GQA_ORDER, 4, 2, 32, 16,
               rotary_interleaved=1)


def test_group_query_attention_with_a_local_window():
    """Sliding-window attention (Mistral, Gemma: local_window_size w attends the w latest
    positions, its own included): a first prompt, rows of different lengths, a prompt after a past."""
    inputs = _gqa_step(2, 6, 0, [0, 0])
    for name in ("past_key", "past_value"):
        del inputs[name]
    _check_gqa(inputs, ["qkv", "", "", "", "", "seqlens_k", "total_sequence_length"],
               4, 2, 16, True, local_window_size=2)
    _check_gqa(_gqa_step(3, 1, 6, [6, 3, 1]), GQA_ORDER, 4, 2, 16, True, local_window_size=3)
    _check_gqa(_gqa_step(1, 4, 8, [5]), GQA_ORDER, 4, 2, 16, False, local_window_size=2)


def test_group_query_attention_with_a_known_total_length():
    """total_sequence_length a constant (the attention mask's static length)."""
    inputs = _gqa_step(2, 1, 5, [5, 2])
    total = inputs.pop("total_sequence_length")
    _check_gqa(inputs, GQA_ORDER, 4, 2, 16, True, {"total_sequence_length": total})


def test_group_query_attention_continues_a_prompt_after_a_partly_filled_past():
    """Several new tokens after a past buffer of 8 filled 3 deep (onnxruntime allows it for
    one row only), and a first prompt of packed QKV without a past."""
    _check_gqa(_gqa_step(1, 4, 8, [3]), GQA_ORDER, 4, 2, 16, True)
    inputs = _gqa_step(2, 5, 0, [0, 0])
    for name in ("past_key", "past_value"):
        del inputs[name]
    _check_gqa(inputs, ["qkv", "", "", "", "", "seqlens_k", "total_sequence_length"],
               4, 2, 16, True)


# --- weight-only quantization ------------------------------------------------------------

def _pack(codes, bits):
    """Codes [..., n] (n a multiple of 8 / bits) packed low bits first into uint8."""
    per_byte = 8 // bits
    codes = codes.reshape(*codes.shape[:-1], -1, per_byte).astype(np.uint8)
    return np.bitwise_or.reduce(codes << (np.arange(per_byte) * bits).astype(np.uint8),
                                axis=-1).astype(np.uint8)


@pytest.mark.parametrize("bits, block, k, zero_points", [
    (4, 16, 40, "none"), (4, 16, 40, "packed"), (4, 32, 64, "float"), (4, 128, 100, "packed"),
    (8, 16, 24, "none"), (8, 16, 24, "packed"), (2, 16, 32, "float"),
])  # onnxruntime's CPU kernel has no 8-bit weights with float zero points
def test_matmul_nbits(bits, block, k, zero_points):
    n, blocks = 6, -(-k // block)
    codes = rng.integers(0, 1 << bits, (n, blocks, block))
    initializers = {"B": _pack(codes, bits), "scales": rng.randn(n * blocks) * 0.1}
    order = ["A", "B", "scales"]
    if zero_points == "packed":
        zero = rng.integers(0, 1 << bits, (n, -(-blocks * bits // 8) * 8 // bits))
        initializers["zero_points"] = _pack(zero, bits).reshape(-1)
        order.append("zero_points")
    elif zero_points == "float":
        initializers["zero_points"] = rng.randn(n * blocks) + (1 << (bits - 1))
        order.append("zero_points")
    initializers["bias"] = rng.randn(n)
    order += [""] * (5 - len(order)) + ["bias"]
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    census = check_contrib("MatMulNBits", {"A": rng.randn(2, 3, k)}, initializers, attrs, order)
    assert census.get("TRANSPOSE", 0) == 0


def _gather_tables(content: bytes) -> list:
    """The element types of the tables GATHER ops read in a .tflite, sorted by name."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    return sorted(np.dtype(tensors[op["inputs"][0]]["dtype"]).name
                  for op in interpreter._get_ops_details() if op["op_name"] == "GATHER")


@pytest.mark.parametrize("bits, block, dim, with_zero_points, table", [
    (4, 16, 64, False, np.int8), (4, 32, 64, True, np.int8), (4, 16, 60, True, np.int8),
    (8, 32, 64, False, np.int8), (8, 16, 64, True, np.int16)])
@pytest.mark.parametrize("index_shape", [(2, 5), ("batch", 3)])
def test_gather_block_quantized(bits, block, dim, with_zero_points, table, index_shape):
    """A 2-D table blocked along its rows stays integer (int16 where 8-bit codes less their
    zero points need it) and only the gathered rows are scaled; rows whose length is not a
    whole number of blocks; indices of a run-time batch."""
    rows, blocks = 20, -(-dim // block)
    codes = rng.integers(0, 1 << bits, (rows, dim))
    data = _pack(codes, bits) if bits == 4 else codes.astype(np.uint8)
    initializers = {"data": data, "scales": rng.randn(rows, blocks) * 0.1}
    order = ["data", "indices", "scales"]
    if with_zero_points:
        zero = rng.integers(0, 1 << bits, (rows, -(-blocks // 2) * 2))[:, :blocks]
        initializers["zero_points"] = _pack(zero, bits) if bits == 4 else zero.astype(np.uint8)
        order.append("zero_points")
    indices = rng.integers(-rows, rows, (2, 5) if index_shape[0] == 2 else (4, 3)).astype(
        np.int64)
    converted = check_model(contrib_model(
        "GatherBlockQuantized", {"indices": indices}, initializers,
        {"bits": bits, "block_size": block, "gather_axis": 0, "quantize_axis": 1}, order,
        input_shapes={"indices": list(index_shape)}), {"indices": indices})
    assert _gather_tables(converted.tflite) == sorted([np.dtype(table).name, "float32"])


def test_gather_block_quantized_of_a_3d_table_gathers_its_dequantized_values():
    """Other layouts than rows of a 2-D table gather from the table dequantized."""
    codes = rng.integers(0, 16, (4, 6, 32))
    initializers = {"data": _pack(codes, 4), "scales": rng.randn(4, 6, 2) * 0.1}
    indices = np.array([[3, -1], [0, 2], [1, 1]], np.int64)
    converted = check_model(contrib_model(
        "GatherBlockQuantized", {"indices": indices}, initializers,
        {"bits": 4, "block_size": 16, "gather_axis": 0, "quantize_axis": 2},
        ["data", "indices", "scales"]), {"indices": indices})
    assert _gather_tables(converted.tflite) == ["float32"]


@pytest.mark.parametrize("op, tool", [("DecoderMaskedMultiHeadAttention", "transformers optimizer"),
                                      ("QOrderedMatMul", "quantization tools")])
def test_unsupported_contrib_op_names_its_tool(op, tool):
    node = helper.make_node(op, ["x"], ["y"], domain=MS)
    graph = helper.make_graph([node], "test", [tensor_info("x", np.float32, [2, 3])],
                              [tensor_info("y", np.float32, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    hint = f"com.microsoft::{op} comes from onnxruntime's {tool}"
    with pytest.raises(ConversionError, match=hint):
        convert(model)


@pytest.mark.parametrize("heads, kv_heads, rotary, batch, seq", [(4, 2, False, 2, 1),
                                                               (4, 1, True, 1, 3)])
def test_group_query_attention_with_past(heads, kv_heads, rotary, batch, seq):
    """A decoding step after a cache of 6 positions, every row full (onnxruntime takes
    several new tokens after a cache for batch 1 only)."""
    past_len, head_size = 6, 16
    inputs = {"q": rng.randn(batch, seq, heads * head_size),
              "k": rng.randn(batch, seq, kv_heads * head_size),
              "v": rng.randn(batch, seq, kv_heads * head_size),
              "past_key": rng.randn(batch, kv_heads, past_len, head_size),
              "past_value": rng.randn(batch, kv_heads, past_len, head_size),
              "seqlens_k": np.full(batch, past_len + seq - 1, np.int32),
              "total_sequence_length": np.array(past_len + seq, np.int32)}
    _check_gqa(inputs, ["q", "k", "v", "past_key", "past_value", "seqlens_k",
                        "total_sequence_length"], heads, kv_heads, head_size, rotary)


@pytest.mark.parametrize("attrs, extra, named", [
    ({"smooth_softmax": 1}, {}, "smooth_softmax=1"),
    ({"sliding_window_cache": 1, "local_window_size": 4}, {}, "sliding_window_cache=1"),
    ({"k_quant_type": "PER_TENSOR"}, {}, "k_quant_type"),
    ({}, {14: "q_norm", 15: "k_norm"}, "q_norm_weight, k_norm_weight"),
])
def test_group_query_attention_refuses_what_it_does_not_compute(attrs, extra, named):
    """onnxruntime's newer GroupQueryAttention inputs and attributes are named in the error,
    not silently dropped."""
    order = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    order += [""] * (max(extra, default=0) + 1 - len(order))
    for index, name in extra.items():
        order[index] = name
    graph = helper.make_graph(
        [helper.make_node("GroupQueryAttention", order, ["y", "pk", "pv"], domain=MS,
                          num_heads=4, kv_num_heads=2, **attrs)], "gqa",
        [tensor_info(n, a) for n, a in _gqa_step(1, 1, 4, [4]).items()],
        [tensor_info("y", np.zeros((1, 1, 64), np.float32))],
        [numpy_helper.from_array(np.ones(16, np.float32), n) for n in extra.values()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    with pytest.raises(ConversionError, match=named):
        convert(model)


def test_reshapes_around_an_onnxruntime_norm_are_static():
    """Qwen3's per-head Q norm as onnxruntime's model builder writes it: Split, Reshape to
    heads, SimplifiedLayerNormalization (which ONNX does not infer), Reshape back with
    [0, -1, width], intermediate shapes declared with symbols nothing binds. (The builder's
    own Qwen3 export failed here until a constant target resolved against the TF input's
    static shape, ops/shape._static_target; this smaller graph converts either way.)"""
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma_in"], ["h"],
                              axis=-1, epsilon=1e-6),  # from here on ONNX infers no shape
             helper.make_node("MatMul", ["h", "w"], ["qkv"]),
             helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1),
             helper.make_node("Reshape", ["q", "heads"], ["per_head"]),
             helper.make_node("SimplifiedLayerNormalization", ["per_head", "gamma"], ["normed"],
                              axis=-1, epsilon=1e-6),
             helper.make_node("Reshape", ["normed", "merged"], ["y"]),
             helper.make_node("Add", ["k", "v"], ["kv"])]
    inputs = {"x": rng.randn(2, 5, 24)}
    constants = {"gamma_in": rng.randn(24), "w": rng.randn(24, 96),
                 "sizes": np.array([64, 16, 16], np.int64),
                 "heads": np.array([0, -1, 16], np.int64), "gamma": rng.randn(16),
                 "merged": np.array([0, -1, 64], np.int64)}
    graph = helper.make_graph(nodes, "qk_norm", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, ["batch_size", "sequence_length", 24])],
                              [tensor_info("y", np.float32), tensor_info("kv", np.float32)],
                              [numpy_helper.from_array(a, n) for n, a in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # SimplifiedLayerNormalization: onnxruntime's, in the ONNX domain
    for name, width in (("per_head", 16), ("normed", 16), ("y", 64)):  # as the builder has
        model.graph.value_info.append(helper.make_tensor_value_info(  # them: open symbols
            name, onnx.TensorProto.FLOAT, ["batch_size", "sequence_length" + (
                " * num_attention_heads" if width == 16 else ""), width]))
    results = ort_run(model, inputs)  # typed outputs, as contrib_model makes them
    del model.graph.output[:]
    model.graph.output.extend(tensor_info(n, r) for n, r in zip(["y", "kv"], results))
    check_model(model, inputs, overwrite_input_shape=["x:2,5,24"])
