"""Attention, RMSNormalization and RotaryEmbedding (opset 23) against onnxruntime."""

import numpy as np
import pytest
from onnx import helper

from harness import assert_keras_reloads, check_node, check_nodes

rng = np.random.default_rng(0)
OPSET = 23


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


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
    check_attention(normal(2, heads, 4, 8), normal(2, kv_heads, 5, 8),
                    normal(2, kv_heads, 5, 6), attrs)


@pytest.mark.parametrize("heads, kv_heads", [(3, 3), (4, 2)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_3d(heads, kv_heads, causal):
    attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads, "is_causal": causal}
    check_attention(normal(2, 4, heads * 8), normal(2, 6, kv_heads * 8),
                    normal(2, 6, kv_heads * 4), attrs)


@pytest.mark.parametrize(
    "mask", [normal(4, 6), normal(2, 1, 4, 6), rng.random((2, 3, 4, 6)) > 0.3,
             rng.random((4, 6)) > 0.5],
)
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask, causal):
    check_attention(normal(2, 3, 4, 8), normal(2, 3, 6, 8), normal(2, 3, 6, 8),
                    {"is_causal": causal}, mask=mask)


@pytest.mark.parametrize("kv_heads", [3, 1])
@pytest.mark.parametrize("mode", [0, 3])
def test_attention_past_and_present(kv_heads, mode):
    """Cache inputs, present outputs and the qk_matmul output (mask padded to past+new)."""
    past = (normal(2, kv_heads, 3, 8), normal(2, kv_heads, 3, 6))
    check_attention(normal(2, 3, 4, 8), normal(2, kv_heads, 4, 8), normal(2, kv_heads, 4, 6),
                    {"qk_matmul_output_mode": mode}, mask=normal(4, 7), past=past,
                    num_outputs=4)


@pytest.mark.parametrize(
    "shape, axis, attrs",
    [((2, 5, 8), -1, {}), ((2, 3, 4, 6), 2, {"epsilon": 1e-3}), ((3, 7), 0, {}),
     ((2, 3, 4, 6), -1, {})],
)
def test_rms_normalization(shape, axis, attrs):
    scale = rng.standard_normal(shape[axis:]).astype(np.float32)
    check_node("RMSNormalization", {"x": normal(*shape)}, {"axis": axis, **attrs},
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
    check_node("RotaryEmbedding", {"x": normal(*shape), "cos": cos, "sin": sin}, attrs,
               opset=OPSET)


def test_rotary_embedding_position_ids():
    cos, sin = _caches((12,), 4)
    positions = rng.integers(0, 12, (2, 5)).astype(np.int64)
    check_node("RotaryEmbedding", {"x": normal(2, 3, 5, 8), "pos": positions},
               {"interleaved": 1}, initializers={"cos": cos, "sin": sin}, opset=OPSET,
               input_order=["x", "cos", "sin", "pos"])


def test_attention_keras_files_reload(tmp_path):
    feeds = {"Q": normal(1, 4, 16), "K": normal(1, 6, 8), "V": normal(1, 6, 8)}
    converted = check_node("Attention", feeds,
                           {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
                           opset=OPSET, tflite=False)
    assert_keras_reloads(converted, feeds, tmp_path)


def test_attention_softmax_precision():
    check_attention(normal(2, 3, 4, 8), normal(2, 3, 6, 8), normal(2, 3, 6, 8),
                    {"softmax_precision": 1, "qk_matmul_output_mode": 3}, mask=normal(4, 6),
                    num_outputs=4)


def test_attention_nonpad_kv_seqlen_at_run_time():
    inputs = {"Q": normal(2, 4, 3, 8), "K": normal(2, 2, 6, 8), "V": normal(2, 2, 6, 8),
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
    check_nodes(nodes, {"mask": normal(4, 6), "scores": normal(2, 3, 4, 6)}, inits, opset=OPSET,
                outputs=["masked", "masked_const_first", "minus_inf", "inf_minus"])
