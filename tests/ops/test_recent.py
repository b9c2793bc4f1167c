"""SwiGLU, TensorScatter, CausalConvWithState, LinearAttention and FlexAttention.

TensorScatter, CausalConvWithState and LinearAttention are compared with onnxruntime (which
runs the last two through their ONNX function bodies). onnxruntime has no SwiGLU (its
function body needs Swish-24) and no ai.onnx.preview FlexAttention: those are compared with
onnx.reference.ReferenceEvaluator instead, with the same tolerance, through the TF model
and the float32 TFLite.
"""

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from harness import (
    assert_close,
    assert_keras_reloads,
    check_model,
    check_node,
    convert,
    count_tflite_ops,
    make_model,
    tf_run,
    tflite_run,
)

rng = np.random.default_rng(0)


def normal(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check_with_reference(model, feeds, tol=1e-4):
    """check_model, but against onnx's reference evaluator; returns the conversion."""
    from onnx2tf_alt.export.tflite import tflite_bytes

    expected = ReferenceEvaluator(model).run(None, feeds)
    converted = convert(model)
    for i, (a, e) in enumerate(zip(tf_run(converted, feeds), expected)):
        assert_close(a, e, tol, f"TF output {i}")
    converted.tflite = tflite_bytes(converted.result)
    for i, (a, e) in enumerate(zip(tflite_run(converted, feeds, converted.tflite), expected)):
        assert_close(a, e, tol, f"TFLite output {i}")
    return converted


# --- SwiGLU ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, alpha", [((2, 4), None), ((3, 5, 7), 0.5), ((1, 2, 3, 9), 1.702), ((7,), None)]
)
def test_swiglu(shape, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], **attrs)
    feeds = {"a": normal(*shape, scale=3.0), "b": normal(*shape)}
    check_with_reference(make_model([node], feeds, ["y"], opset=28), feeds)


def test_swiglu_between_convs_has_no_transpose():
    """Gate and value from two convs, the product into a third: all channel-last."""
    c = 4
    inits = {f"w{i}": normal(c, c, 1, 1) for i in range(3)}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["gate"]),
        helper.make_node("Conv", ["x", "w1"], ["value"]),
        helper.make_node("SwiGLU", ["gate", "value"], ["h"], alpha=0.8),
        helper.make_node("Conv", ["h", "w2"], ["y"]),
    ]
    feeds = {"x": normal(2, c, 5, 7)}
    model = make_model(nodes, feeds, ["y"], inits, opset=28)
    converted = check_with_reference(model, feeds)
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)


# --- TensorScatter -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "cache, update, axis, mode, write",
    [
        ((2, 3, 6, 4), (2, 3, 2, 4), -2, "linear", [0, 3]),
        ((2, 3, 6, 4), (2, 3, 3, 4), -2, "circular", [5, 2]),
        ((3, 7, 5), (3, 7, 5), 1, "circular", [4, 0, 6]),
        ((3, 8, 2), (3, 1, 2), 1, "linear", [7, 0, 3]),
        ((2, 5, 3, 4), (2, 2, 3, 4), 1, "linear", None),
        ((2, 4, 6), (2, 4, 3), 2, "circular", [5, 1]),
    ],
)
def test_tensor_scatter(cache, update, axis, mode, write):
    inputs = {"past_cache": normal(*cache), "update": normal(*update)}
    if write is not None:
        inputs["write_indices"] = np.array(write, np.int64)
    check_node("TensorScatter", inputs, {"axis": axis, "mode": mode}, opset=24)


def test_tensor_scatter_dynamic_batch_int(tmp_path):
    inputs = {"past_cache": rng.integers(-9, 9, (3, 2, 6, 4)).astype(np.int32),
              "update": rng.integers(-9, 9, (3, 2, 2, 4)).astype(np.int32),
              "write_indices": np.array([0, 5, 3], np.int64)}
    shapes = {"past_cache": ["N", 2, 6, 4], "update": ["N", 2, 2, 4], "write_indices": ["N"]}
    converted = check_node("TensorScatter", inputs, {"mode": "circular"}, opset=24,
                           input_shapes=shapes)
    assert_keras_reloads(converted, inputs, tmp_path)


# --- CausalConvWithState -----------------------------------------------------------------
def causal_conv_case(batch, channels, length, taps, bias, past, activation, weights_runtime):
    """Inputs, constant initializers and the node's input order."""
    inputs = {"x": normal(batch, channels, length)}
    inits = {}
    params = {"w": normal(channels, 1, taps), "bias": normal(channels) if bias else None,
              "past": normal(batch, channels, taps - 1) if past else None}
    (inputs if weights_runtime else inits)["w"] = params["w"]
    if bias:
        (inputs if weights_runtime else inits)["bias"] = params["bias"]
    if past:
        inputs["past"] = params["past"]
    order = ["x", "w", "bias" if bias else "", "past" if past else ""]
    while order[-1] == "":
        order.pop()
    attrs = {} if activation is None else {"activation": activation}
    return inputs, inits, order, attrs


@pytest.mark.parametrize("weights_runtime", [False, True])
@pytest.mark.parametrize(
    "batch, channels, length, taps, bias, past, activation",
    [
        (2, 4, 8, 4, False, False, None),
        (3, 5, 7, 3, True, True, "silu"),
        (1, 6, 1, 4, True, True, "none"),  # a decode step
        (2, 3, 2, 5, False, False, "swish"),  # shorter than the state
        (2, 8, 9, 2, True, False, None),
    ],
)
def test_causal_conv_with_state(batch, channels, length, taps, bias, past, activation,
                                weights_runtime):
    inputs, inits, order, attrs = causal_conv_case(batch, channels, length, taps, bias, past,
                                                   activation, weights_runtime)
    check_node("CausalConvWithState", inputs, attrs, inits, num_outputs=2, opset=27,
               input_order=order)


@pytest.mark.parametrize("weights_runtime", [False, True])
def test_causal_conv_kernel_size_one(weights_runtime):
    """k = 1 leaves an empty present_state, which the TFLite interpreter cannot return:
    only the output is a graph output."""
    inputs, inits, order, _ = causal_conv_case(2, 3, 5, 1, True, False, "silu",
                                               weights_runtime)
    node = helper.make_node("CausalConvWithState", order, ["y", "state"], activation="silu")
    check_model(make_model([node], inputs, ["y"], inits, opset=27), inputs)


@pytest.mark.parametrize("weights_runtime", [False, True])
def test_causal_conv_between_convs_has_no_transpose(weights_runtime, tmp_path):
    """Conv1d -> CausalConvWithState -> Conv1d stays channel-last. present_state comes out
    channel-last (B, k-1, C); the past_state model input is declared so too, as a decoder
    feeding one step's state to the next would (by default it stays in ONNX order)."""
    c, taps = 6, 4
    inputs = {"x": normal(2, c, 9), "past": normal(2, c, taps - 1)}
    inits = {"w_in": normal(c, c, 1), "w_out": normal(c, c, 3), "bias": normal(c)}
    (inputs if weights_runtime else inits)["w"] = normal(c, 1, taps)
    nodes = [
        helper.make_node("Conv", ["x", "w_in"], ["h"]),
        helper.make_node("CausalConvWithState", ["h", "w", "bias", "past"], ["g", "state"],
                         activation="silu"),
        helper.make_node("Conv", ["g", "w_out"], ["y"], pads=[1, 1]),
    ]
    model = make_model(nodes, inputs, ["y", "state"], inits, opset=27)
    converted = check_model(model, inputs, keep_nwc_or_nhwc_or_ndhwc_input_names=["past"])
    assert converted.result.output_perms["state"] == (0, 2, 1)
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)
    assert_keras_reloads(converted, inputs, tmp_path)


# --- LinearAttention ---------------------------------------------------------------------
def linear_attention_inputs(batch, steps, q_heads, kv_heads, d_k, d_v, rule, decay_per_head,
                            beta_shared, past):
    inputs = {"query": normal(batch, steps, q_heads * d_k, scale=0.5),
              "key": normal(batch, steps, kv_heads * d_k, scale=0.5),
              "value": normal(batch, steps, kv_heads * d_v)}
    order = ["query", "key", "value", "", "", ""]
    if past:
        inputs["past_state"] = normal(batch, kv_heads, d_k, d_v, scale=0.3)
        order[3] = "past_state"
    if rule in ("gated", "gated_delta"):
        width = kv_heads if decay_per_head else kv_heads * d_k
        inputs["decay"] = -np.abs(normal(batch, steps, width, scale=0.3))
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
    check_flex(normal(batch, q_heads, q_len, d), normal(batch, kv_heads, kv_len, d),
               normal(batch, kv_heads, kv_len, d_v), **attrs)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flex_attention_score_mod_causal(kv_heads, tmp_path):
    check_flex(normal(2, 4, 6, 8), normal(2, kv_heads, 6, 8), normal(2, kv_heads, 6, 5),
               tmp_path, score_mod=causal_mask_graph())


def test_flex_attention_score_and_prob_mod():
    check_flex(normal(1, 2, 4, 8, scale=3.0), normal(1, 2, 5, 8, scale=3.0), normal(1, 2, 5, 8),
               score_mod=soft_cap_graph(5.0), prob_mod=prob_scale_graph(0.5),
               softmax_precision=1)
