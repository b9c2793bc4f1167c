"""Attention, RMSNormalization and RotaryEmbedding (opset 23), LinearAttention (opset 27) and
FlexAttention (ai.onnx.preview), through TF and the float32 TFLite.

LinearAttention is compared with onnxruntime (which runs it through its ONNX function body);
onnxruntime has no FlexAttention, which is compared with onnx.reference.ReferenceEvaluator
instead, with the same tolerance.
"""

import numpy as np
import pytest
from onnx import helper

from harness import (
    Rng,
    assert_keras_reloads,
    check_node,
    check_nodes,
    check_with_reference,
    make_model,
)

rng = Rng(0)
OPSET = 23


def check_attention(q, k, v, attrs=None, mask=None, past=None, num_outputs=1):
    inputs = {"Q": q, "K": k, "V": v}
    order = ["Q", "K", "V"]
    if mask is not None:
        inputs["attn_mask"] = mask
        order.append("attn_mask")
    if past is not None:
        order += [""] * (4 - len(order)) + ["past_key", "past_value"]
        inputs["past_key"], inputs["past_value"] = past
    check_node("Attention", inputs, attrs, num_outputs=num_outputs, opset=OPSET,
               input_order=order)


@pytest.mark.parametrize(
    "heads, kv_heads, attrs",
    [(3, 3, {}), (4, 2, {}), (3, 3, {"is_causal": 1}), (6, 2, {"is_causal": 1, "scale": 0.3}),
     (3, 3, {"softcap": 2.0})],
)
def test_attention_4d(heads, kv_heads, attrs):
    check_attention(rng.randn(2, heads, 4, 8), rng.randn(2, kv_heads, 5, 8),
                    rng.randn(2, kv_heads, 5, 6), attrs)


@pytest.mark.parametrize("heads, kv_heads", [(3, 3), (4, 2)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_3d(heads, kv_heads, causal):
    attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads, "is_causal": causal}
    check_attention(rng.randn(2, 4, heads * 8), rng.randn(2, 6, kv_heads * 8),
                    rng.randn(2, 6, kv_heads * 4), attrs)


@pytest.mark.parametrize(
    "mask", [rng.randn(4, 6), rng.randn(2, 1, 4, 6), rng.random((2, 3, 4, 6)) > 0.3,
             rng.random((4, 6)) > 0.5],
)
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask, causal):
    check_attention(rng.randn(2, 3, 4, 8), rng.randn(2, 3, 6, 8), rng.randn(2, 3, 6, 8),
                    {"is_causal": causal}, mask=mask)


@pytest.mark.parametrize("kv_heads", [3, 1])
@pytest.mark.parametrize("mode", [0, 3])
def test_attention_past_and_present(kv_heads, mode):
    """Cache inputs, present outputs and the qk_matmul output (mask padded to past+new)."""
    past = (rng.randn(2, kv_heads, 3, 8), rng.randn(2, kv_heads, 3, 6))
    check_attention(rng.randn(2, 3, 4, 8), rng.randn(2, kv_heads, 4, 8),
                    rng.randn(2, kv_heads, 4, 6),
                    {"qk_matmul_output_mode": mode}, mask=rng.randn(4, 7), past=past,
                    num_outputs=4)


@pytest.mark.parametrize(
    "shape, axis, attrs",
    [((2, 5, 8), -1, {}), ((2, 3, 4, 6), 2, {"epsilon": 1e-3}), ((3, 7), 0, {}),
     ((2, 3, 4, 6), -1, {})],
)
def test_rms_normalization(shape, axis, attrs):
    scale = rng.standard_normal(shape[axis:]).astype(np.float32)
    check_node("RMSNormalization", {"x": rng.randn(*shape)}, {"axis": axis, **attrs},
               initializers={"scale": scale}, opset=OPSET)


def _caches(positions, half):
    angles = rng.random((*positions, half)).astype(np.float32) * 3
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize(
    "shape, num_heads, rotary_dim",
    [((2, 3, 5, 8), 0, 0), ((2, 5, 24), 3, 0), ((2, 3, 5, 8), 0, 4), ((1, 5, 16), 2, 4)],
)
def test_rotary_embedding(interleaved, shape, num_heads, rotary_dim, ):
    head = shape[-1] // (num_heads or 1)
    half = (rotary_dim or head) // 2
    batch, seq = shape[0], shape[2] if len(shape) == 4 else shape[1]
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if num_heads:
        attrs["num_heads"] = num_heads
    cos, sin = _caches((batch, seq), half)
    check_node("RotaryEmbedding", {"x": rng.randn(*shape), "cos": cos, "sin": sin}, attrs,
               opset=OPSET)


def test_rotary_embedding_position_ids():
    cos, sin = _caches((12,), 4)
    positions = rng.integers(0, 12, (2, 5)).astype(np.int64)
    check_node("RotaryEmbedding", {"x": rng.randn(2, 3, 5, 8), "pos": positions},
               {"interleaved": 1}, initializers={"cos": cos, "sin": sin}, opset=OPSET,
               input_order=["x", "cos", "sin", "pos"])


def test_attention_keras_files_reload(tmp_path):
    feeds = {"Q": rng.randn(1, 4, 16), "K": rng.randn(1, 6, 8), "V": rng.randn(1, 6, 8)}
    converted = check_node("Attention", feeds,
                           {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
                           opset=OPSET, tflite=False)
    assert_keras_reloads(converted, feeds, tmp_path)


def test_attention_softmax_precision():
    check_attention(rng.randn(2, 3, 4, 8), rng.randn(2, 3, 6, 8), rng.randn(2, 3, 6, 8),
                    {"softmax_precision": 1, "qk_matmul_output_mode": 3}, mask=rng.randn(4, 6),
                    num_outputs=4)


def test_attention_nonpad_kv_seqlen_at_run_time():
    inputs = {"Q": rng.randn(2, 4, 3, 8), "K": rng.randn(2, 2, 6, 8), "V": rng.randn(2, 2, 6, 8),
              "nonpad": np.array([4, 6], np.int64)}
    check_node("Attention", inputs, {"is_causal": 1}, opset=24,
               input_order=["Q", "K", "V", "", "", "", "nonpad"])


def test_additive_inf_bias_from_constants():
    """A causal -inf bias built from constants (as Attention's function body builds it) and
    added to run-time values stays -inf in TFLite, through Add and Sub."""
    tri = np.triu(np.ones((4, 6), bool), 1)
    inf_bias = np.where(tri, -np.inf, 0).astype(np.float32)
    nodes = [
        helper.make_node("Where", ["tri", "neg_inf", "zero"], ["causal"]),
        helper.make_node("Add", ["mask", "causal"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Add", ["inf_bias", "scores"], ["masked_const_first"]),
        helper.make_node("Sub", ["scores", "inf_bias"], ["minus_inf"]),
        helper.make_node("Sub", ["inf_bias", "scores"], ["inf_minus"]),
    ]
    inits = {"tri": tri, "neg_inf": np.array(-np.inf, np.float32),
             "zero": np.array(0, np.float32), "inf_bias": inf_bias}
    check_nodes(nodes, {"mask": rng.randn(4, 6), "scores": rng.randn(2, 3, 4, 6)}, inits,
                opset=OPSET, outputs=["masked", "masked_const_first", "minus_inf", "inf_minus"])


# --- LinearAttention ---------------------------------------------------------------------
def linear_attention_inputs(batch, steps, q_heads, kv_heads, d_k, d_v, rule, decay_per_head,
                            beta_shared, past):
    inputs = {"query": rng.randn(batch, steps, q_heads * d_k, scale=0.5),
              "key": rng.randn(batch, steps, kv_heads * d_k, scale=0.5),
              "value": rng.randn(batch, steps, kv_heads * d_v)}
    order = ["query", "key", "value", "", "", ""]
    if past:
        inputs["past_state"] = rng.randn(batch, kv_heads, d_k, d_v, scale=0.3)
        order[3] = "past_state"
    if rule in ("gated", "gated_delta"):
        width = kv_heads if decay_per_head else kv_heads * d_k
        inputs["decay"] = -np.abs(rng.randn(batch, steps, width, scale=0.3))
        order[4] = "decay"
    if rule in ("delta", "gated_delta"):
        width = 1 if beta_shared else kv_heads
        inputs["beta"] = rng.uniform(0.1, 0.9, (batch, steps, width)).astype(np.float32)
        order[5] = "beta"
    while order[-1] == "":
        order.pop()
    return inputs, order


@pytest.mark.parametrize(
    "batch, steps, q_heads, kv_heads, d_k, d_v, rule, decay_per_head, beta_shared, past, scale",
    [
        (2, 5, 2, 2, 4, 3, "linear", False, False, False, None),
        (1, 3, 3, 3, 5, 5, "linear", False, False, True, 0.3),
        (2, 4, 2, 2, 4, 6, "gated", False, False, True, None),
        (3, 3, 4, 2, 4, 4, "gated", True, False, False, None),
        (2, 6, 2, 2, 3, 4, "delta", False, True, True, None),
        (2, 4, 4, 2, 4, 3, "gated_delta", False, False, True, None),
        (2, 1, 6, 1, 4, 4, "gated_delta", True, True, True, 0.5),  # MQA decode step
        (3, 5, 2, 2, 8, 2, "gated_delta", False, False, False, None),
    ],
)
def test_linear_attention(batch, steps, q_heads, kv_heads, d_k, d_v, rule, decay_per_head,
                          beta_shared, past, scale):
    inputs, order = linear_attention_inputs(batch, steps, q_heads, kv_heads, d_k, d_v, rule,
                                            decay_per_head, beta_shared, past)
    attrs = {"q_num_heads": q_heads, "kv_num_heads": kv_heads, "update_rule": rule}
    if scale is not None:
        attrs["scale"] = scale
    check_node("LinearAttention", inputs, attrs, num_outputs=2, opset=27, input_order=order)


def test_linear_attention_dynamic_batch(tmp_path):
    inputs, order = linear_attention_inputs(3, 4, 4, 2, 4, 4, "gated_delta", False, False,
                                            True)
    shapes = {name: ["N", *a.shape[1:]] for name, a in inputs.items()}
    attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    converted = check_node("LinearAttention", inputs, attrs, num_outputs=2, opset=27,
                           input_order=order, input_shapes=shapes)
    assert_keras_reloads(converted, inputs, tmp_path)


# --- FlexAttention -----------------------------------------------------------------------
PREVIEW = "ai.onnx.preview"


def mod_graph(name: str, nodes, inits=()):
    info = helper.make_tensor_value_info
    scores = info("s", 1, ["B", "H", "L", "S"])
    out = info("s_out", 1, ["B", "H", "L", "S"])
    return helper.make_graph(nodes, name, [scores], [out], list(inits))


def causal_mask_graph():
    """Keys after the query position get -inf (positions from Shape and Range)."""
    const = helper.make_tensor
    inits = [const("zero", 7, [], [0]), const("one", 7, [], [1]), const("two", 7, [1], [2]),
             const("three", 7, [1], [3]), const("col", 7, [2], [-1, 1]),
             const("neg_inf", 1, [], [-np.inf])]
    nodes = [
        helper.make_node("Shape", ["s"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["l1"]),
        helper.make_node("Gather", ["shape", "three"], ["s1"]),
        helper.make_node("Squeeze", ["l1"], ["l"]),
        helper.make_node("Squeeze", ["s1"], ["n"]),
        helper.make_node("Range", ["zero", "l", "one"], ["qi"]),
        helper.make_node("Range", ["zero", "n", "one"], ["ki"]),
        helper.make_node("Reshape", ["qi", "col"], ["qc"]),
        helper.make_node("GreaterOrEqual", ["qc", "ki"], ["keep"]),
        helper.make_node("Where", ["keep", "s", "neg_inf"], ["s_out"]),
    ]
    return mod_graph("causal", nodes, inits)


def soft_cap_graph(cap: float):
    cap_t = helper.make_tensor("cap", 1, [], [cap])
    nodes = [helper.make_node("Div", ["s", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
             helper.make_node("Mul", ["t", "cap"], ["s_out"])]
    return mod_graph("soft_cap", nodes, [cap_t])


def prob_scale_graph(factor: float):
    factor_t = helper.make_tensor("f", 1, [], [factor])
    return mod_graph("prob_scale", [helper.make_node("Mul", ["s", "f"], ["s_out"])], [factor_t])


def check_flex(q, k, v, tmp_path=None, **attrs):
    feeds = {"Q": q, "K": k, "V": v}
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    model = make_model([node], feeds, ["Y"], opset=26, extra_opsets={PREVIEW: 1})
    converted = check_with_reference(model, feeds)
    if tmp_path is not None:
        assert_keras_reloads(converted, feeds, tmp_path)


@pytest.mark.parametrize(
    "batch, q_heads, kv_heads, q_len, kv_len, d, d_v, scale",
    [(2, 4, 4, 5, 7, 8, 8, None), (1, 6, 2, 3, 9, 4, 6, None), (3, 3, 1, 1, 4, 5, 3, 0.2)],
)
def test_flex_attention(batch, q_heads, kv_heads, q_len, kv_len, d, d_v, scale):
    attrs = {} if scale is None else {"scale": scale}
    check_flex(rng.randn(batch, q_heads, q_len, d), rng.randn(batch, kv_heads, kv_len, d),
               rng.randn(batch, kv_heads, kv_len, d_v), **attrs)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flex_attention_score_mod_causal(kv_heads, tmp_path):
    check_flex(rng.randn(2, 4, 6, 8), rng.randn(2, kv_heads, 6, 8), rng.randn(2, kv_heads, 6, 5),
               tmp_path, score_mod=causal_mask_graph())


def test_flex_attention_score_and_prob_mod():
    check_flex(rng.randn(1, 2, 4, 8, scale=3.0), rng.randn(1, 2, 5, 8, scale=3.0),
               rng.randn(1, 2, 5, 8), score_mod=soft_cap_graph(5.0), prob_mod=prob_scale_graph(0.5),
               softmax_precision=1)
