"""Conv, ConvTranspose and CausalConvWithState against onnxruntime, through TF and the
float32 TFLite.

Each test puts one node per attribute combination into one model (one conversion), with
outputs named after the attributes, so a failure names its combination.
"""

import numpy as np
import pytest
from onnx import helper

from harness import (
    Rng,
    assert_close,
    assert_keras_reloads,
    check_model,
    check_node,
    check_nodes,
    count_tflite_ops,
    label,
    make_model,
    ort_run,
    to_logical,
    to_physical,
)

rng = Rng(0)


def conv_node(op, x, i, out_ch, kernel, attrs, group=1, bias=True):
    """(node, initializers) of a Conv (out_ch outputs) or ConvTranspose (out_ch per group)."""
    in_ch = x.shape[1]
    if op == "Conv":
        w = rng.randn(out_ch, in_ch // group, *kernel)
    else:
        w = rng.randn(in_ch, out_ch, *kernel)
    init = {f"w{i}": w}
    if bias:
        init[f"b{i}"] = rng.randn(out_ch * (group if op == "ConvTranspose" else 1))
    attrs = {"group": group, **attrs}
    node = helper.make_node(op, ["x", *init], [label(op, attrs)], **attrs)
    return node, init


def check_cases(op, x, cases, opset=18, input_shapes=None):
    """cases: (out_ch, kernel, attrs[, group[, bias]]). Returns the TFLite census, which must
    hold no TRANSPOSE and no Flex op."""
    nodes, init = [], {}
    for i, case in enumerate(cases):
        node, weights = conv_node(op, x, i, *case)
        nodes.append(node)
        init.update(weights)
    if input_shapes:  # check_nodes has no symbolic input shapes
        outputs = [n.output[0] for n in nodes]
        model = make_model(nodes, {"x": x}, outputs, init, opset, input_shapes)
        check_model(model, {"x": x})
        return None
    _, counts = check_nodes(nodes, {"x": x}, init, opset=opset)
    assert "TRANSPOSE" not in counts, counts
    assert not any(name.startswith("Flex") for name in counts), counts
    return counts


# --- Conv 2-D -----------------------------------------------------------------------------


def test_conv2d_pads_groups():
    pads = [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 2, 1]]
    cases = [(8, (3, 3), {"pads": p}, g) for p in pads for g in (1, 2, 4)]
    counts = check_cases("Conv", rng.randn(2, 4, 9, 7), cases)
    # group 2 is one CONV_2D with grouped filters (no SPLIT / CONCATENATION), group 4 depthwise
    assert counts.get("CONV_2D") == 3 * 2 and counts.get("DEPTHWISE_CONV_2D") == 3, counts
    assert "SPLIT" not in counts and "CONCATENATION" not in counts, counts


def test_conv2d_attrs():
    cases = [
        (5, (3, 3), {"strides": [2, 2], "dilations": [2, 2], "pads": [1, 0, 2, 1]}),
        (5, (3, 3), {"strides": [2, 1], "dilations": [1, 2]}, 1, False),
        (5, (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        (5, (3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 1, False),
        (5, (3, 3), {"auto_pad": "VALID", "strides": [2, 3]}),
        (5, (3, 2), {"kernel_shape": [3, 2], "pads": [2, 0, 0, 1]}),
        (6, (1, 1), {"strides": [2, 2]}, 3),
    ]
    counts = check_cases("Conv", rng.randn(2, 3, 7, 9), cases)
    assert counts.get("CONV_2D") == 6 and counts.get("DEPTHWISE_CONV_2D") == 1, counts


def test_conv2d_depthwise():
    cases = [
        (4, (3, 3), {"pads": [1, 1, 1, 1]}, 4),
        (8, (3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}, 4),
        (4, (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, 4),
        (8, (3, 3), {"dilations": [2, 1], "strides": [2, 2], "pads": [1, 0, 2, 1]}, 4),
        (4, (3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 4, False),
    ]
    counts = check_cases("Conv", rng.randn(2, 4, 7, 9), cases)
    assert counts.get("DEPTHWISE_CONV_2D") == 5 and "CONV_2D" not in counts, counts


def test_large_depthwise_kernels_are_tiled():
    """Depthwise kernels of more than 25 taps (XNNPACK's fast limit) run as depthwise convs
    over bands of kernel rows, summed: 7x7 as 3x7 + 3x7 + 1x7, 1x31 as 1x25 + 1x6; SAME-like,
    asymmetric and SAME_UPPER pads, strides, dilations, a channel multiplier, batch 2."""
    cases = [
        (4, (7, 7), {"pads": [3, 3, 3, 3]}, 4),  # ConvNeXt's block
        (8, (7, 7), {"strides": [2, 2], "pads": [3, 2, 1, 3]}, 4),
        (4, (6, 5), {"dilations": [2, 1], "pads": [5, 2, 5, 2]}, 4),
        (4, (1, 31), {"pads": [0, 15, 0, 15]}, 4),
        (4, (7, 7), {"auto_pad": "SAME_UPPER"}, 4, False),
    ]
    counts = check_cases("Conv", rng.randn(2, 4, 9, 33), cases)
    assert counts.get("DEPTHWISE_CONV_2D") == 3 + 3 + 2 + 2 + 3 and "CONV_2D" not in counts, counts


def test_grouped_conv_is_one_conv2d():
    """1 < group < channels: one CONV_2D whose filters hold in_channels / group inputs, which
    XNNPACK runs as one grouped convolution (faster than SPLIT + a CONV_2D per group +
    CONCATENATION); odd sizes, batch 3, strides, dilations, asymmetric and SAME pads."""
    cases = [
        (6, (3, 3), {"pads": [1, 1, 1, 1]}, 3),
        (12, (3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 1]}, 2),
        (6, (3, 2), {"dilations": [2, 1], "pads": [2, 0, 1, 1]}, 6),
        (4, (3, 3), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 2, 1, 2]}, 2, False),
        (4, (3, 3), {"strides": [2, 1], "auto_pad": "SAME_UPPER"}, 4),
        (12, (1, 1), {"strides": [2, 2]}, 4),
        (6, (2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 3),
    ]
    counts = check_cases("Conv", rng.randn(3, 12, 9, 11), cases)
    assert counts.get("CONV_2D") == len(cases), counts
    assert "SPLIT" not in counts and "CONCATENATION" not in counts, counts
    counts = check_cases("Conv", rng.randn(3, 6, 13), [(9, (3,), {"pads": [1, 2]}, 3),
                                                       (4, (2,), {"strides": [2]}, 2)])
    assert counts.get("CONV_2D") == 2 and "SPLIT" not in counts, counts


def test_grouped_conv2d_without_xnnpack():
    """TFLite's own kernels (no XNNPACK delegate) compute the grouped CONV_2D too."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    x = rng.randn(2, 8, 7, 9)
    node, init = conv_node("Conv", x, 0, 6, (3, 3), {"strides": [2, 1], "pads": [1, 0, 2, 1]},
                           group=2)
    model = make_model([node], {"x": x}, list(node.output), init)
    converted = check_model(model, {"x": x})
    interpreter = Interpreter(
        model_content=converted.tflite,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    outputs = interpreter.get_signature_runner("serving_default")(
        **to_physical(converted, {"x": x}))
    assert_close(to_logical(converted, outputs)[0], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("opset", [7, 11, 23])
def test_conv_opsets(opset):
    cases = [(4, (2, 3), {"strides": [2, 1], "pads": [0, 1, 1, 1]}),
             (6, (3, 3), {"auto_pad": "SAME_UPPER"}, 3)]
    check_cases("Conv", rng.randn(2, 3, 7, 9), cases, opset=opset)


def test_conv_dynamic_batch():
    cases = [(6, (3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 2]}),
             (6, (3, 3), {"auto_pad": "SAME_UPPER"}, 3)]
    check_cases("Conv", rng.randn(2, 3, 7, 9), cases, input_shapes={"x": ["N", 3, 7, 9]})
    check_cases("Conv", rng.randn(2, 4, 11), [(6, (3,), {"pads": [1, 1]})],
                input_shapes={"x": ["N", 4, 11]})


def test_conv_unknown_spatial_dims():
    cases = [(6, (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
             (6, (3, 2), {"pads": [1, 0, 2, 1], "dilations": [1, 2]}, 3)]
    check_cases("Conv", rng.randn(2, 3, 7, 9), cases, input_shapes={"x": ["N", 3, "H", "W"]})


# --- Conv 1-D and 3-D ---------------------------------------------------------------------


def test_conv1d():
    cases = [
        (8, (3,), {"pads": [1, 2]}),
        (8, (3,), {"strides": [2], "dilations": [2], "pads": [0, 1]}),
        (8, (3,), {"auto_pad": "SAME_UPPER", "strides": [2]}),
        (8, (3,), {"auto_pad": "SAME_LOWER"}, 2),
        (8, (3,), {"strides": [2], "pads": [1, 1]}, 4),
    ]
    counts = check_cases("Conv", rng.randn(2, 4, 11), cases)
    assert counts.get("CONV_2D") == 3 + 1 and counts.get("DEPTHWISE_CONV_2D") == 1, counts


def test_conv3d():
    cases = [
        (6, (3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2]}),
        (6, (3, 2, 3), {"strides": [2, 1, 2], "dilations": [1, 2, 1]}),
        (6, (3, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [1, 2, 2]}, 1, False),
        (6, (3, 2, 3), {"pads": [1, 1, 1, 1, 1, 1]}, 3),
    ]
    check_cases("Conv", rng.randn(2, 3, 5, 6, 7), cases)


# --- ConvTranspose ------------------------------------------------------------------------


def test_conv_transpose2d():
    attrs = [
        {},
        {"strides": [2, 3], "pads": [1, 0, 2, 1]},
        {"strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"strides": [2, 2], "output_padding": [1, 0], "pads": [0, 1, 1, 0]},
        {"strides": [2, 2], "dilations": [2, 1]},
        {"strides": [2, 2], "output_shape": [14, 19]},
        {"strides": [3, 2], "output_shape": [19, 16], "auto_pad": "SAME_UPPER"},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"strides": [2, 3], "auto_pad": "SAME_LOWER"},
        {"strides": [2, 2], "auto_pad": "VALID", "output_padding": [1, 1]},
    ]
    cases = [(3, (3, 3), a, 1, bool(a)) for a in attrs]
    counts = check_cases("ConvTranspose", rng.randn(2, 4, 7, 9), cases)
    # equal strides without dilations: convolutions of the output phases
    # (passes/deconv_phases.py, tested there); the others one TRANSPOSE_CONV each
    assert counts.get("TRANSPOSE_CONV") == len(cases) - 5, counts
    assert counts.get("DEPTH_TO_SPACE") == 5, counts


def test_conv_transpose_same_kernel_shorter_than_stride():
    """SAME asks for in * stride, but with a kernel shorter than the stride the pads would
    be negative: onnxruntime keeps the full s * (in - 1) + k instead (26, not 27, here)."""
    cases = [(3, (3, 2), {"strides": [2, 3], "auto_pad": "SAME_UPPER"}),
             (3, (3, 2), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
             (2, (1, 2), {"strides": [3, 4], "auto_pad": "SAME_UPPER"}, 1, False)]
    check_cases("ConvTranspose", rng.randn(2, 4, 7, 9), cases)
    check_cases("ConvTranspose", rng.randn(2, 4, 11), [(3, (2,), {"strides": [3],
                                                                  "auto_pad": "SAME_UPPER"})])


def test_conv_transpose2d_groups():
    cases = [
        (3, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 2),
        (1, (3, 3), {"strides": [2, 2]}, 4),
        (2, (3, 3), {"strides": [2, 1], "pads": [0, 1, 1, 0], "dilations": [1, 2]}, 4),
    ]
    check_cases("ConvTranspose", rng.randn(2, 4, 7, 9), cases)


@pytest.mark.parametrize("opset", [7, 11, 23])
def test_conv_transpose_opsets(opset):
    cases = [(2, (3, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
             (2, (3, 3), {"strides": [2, 2], "output_shape": [10, 12]})]
    check_cases("ConvTranspose", rng.randn(2, 3, 5, 6), cases, opset=opset)


def test_conv_transpose_dynamic_batch():
    cases = [(3, (3, 3), {"strides": [2, 2], "pads": [1, 1, 0, 0]}),
             (3, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"})]
    check_cases("ConvTranspose", rng.randn(2, 4, 7, 9), cases, input_shapes={"x": ["N", 4, 7, 9]})


def test_conv_transpose1d():
    cases = [
        (3, (3,), {"strides": [2], "pads": [1, 2], "output_padding": [1]}),
        (3, (3,), {"dilations": [2], "output_shape": [14]}),
        (3, (3,), {"strides": [3], "auto_pad": "SAME_LOWER"}, 2),
    ]
    check_cases("ConvTranspose", rng.randn(2, 4, 11), cases)


def test_conv_transpose3d():
    cases = [
        (2, (3, 2, 3), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
        (2, (3, 2, 3), {"dilations": [2, 1, 1], "output_padding": [0, 1, 1],
                        "strides": [1, 2, 2]}),
        (2, (3, 2, 3), {"strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}, 3),
    ]
    check_cases("ConvTranspose", rng.randn(2, 3, 5, 6, 7), cases)


# --- run-time weights ---------------------------------------------------------------------


def check_runtime_cases(op, x, cases, opset=18, input_shapes=None):
    """Like check_cases, with every kernel and bias a graph input fed at run time. Returns
    the TFLite census: no Flex op, and TRANSPOSE only on kernels (at most two per kernel:
    to TF's layout and, by the TFLite converter, to TFLite's)."""
    nodes, feeds = [], {"x": x}
    for i, case in enumerate(cases):
        node, weights = conv_node(op, x, i, *case)
        nodes.append(node)
        feeds.update(weights)
    if input_shapes:
        outputs = [n.output[0] for n in nodes]
        check_model(make_model(nodes, feeds, outputs, input_shapes=input_shapes), feeds)
        return None
    _, counts = check_nodes(nodes, feeds, opset=opset)
    assert not any(name.startswith("Flex") for name in counts), counts
    kernels = sum(1 for name in feeds if name.startswith("w"))
    assert counts.get("TRANSPOSE", 0) <= 2 * kernels, counts
    return counts


def test_conv2d_runtime_weights():
    cases = [
        (5, (3, 3), {"pads": [1, 1, 1, 1]}),
        (5, (3, 3), {"strides": [2, 2], "dilations": [2, 2], "pads": [1, 0, 2, 1]}),
        (5, (3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 1, False),
        (5, (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 1]}),
        (4, (2, 3), {"strides": [1, 2]}, 2),
        (8, (3, 3), {"pads": [0, 1, 1, 0]}, 4),
        (4, (3, 3), {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 2, 0]}, 4, False),
    ]
    counts = check_runtime_cases("Conv", rng.randn(2, 4, 7, 9), cases)
    assert counts.get("CONV_2D") == 1 + 1 + 1 + 1 + 1, counts
    assert "SPLIT" not in counts and "CONCATENATION" not in counts, counts
    assert counts.get("DEPTHWISE_CONV_2D") == 2, counts


def test_conv1d_3d_runtime_weights():
    cases = [
        (6, (3,), {"pads": [1, 2], "strides": [2]}),
        (6, (3,), {"dilations": [2], "pads": [2, 1]}, 2),
        (6, (2,), {"auto_pad": "SAME_UPPER"}),
        (8, (3,), {"strides": [2], "pads": [1, 1]}, 4),
    ]
    check_runtime_cases("Conv", rng.randn(3, 4, 11), cases)
    cases = [
        (4, (3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2], "strides": [2, 1, 2]}),
        (6, (3, 2, 3), {"dilations": [1, 2, 1], "pads": [1, 1, 1, 1, 1, 1]}, 3),
    ]
    check_runtime_cases("Conv", rng.randn(2, 3, 5, 6, 7), cases)


def test_conv_runtime_weights_dynamic_batch_and_opsets():
    cases = [(6, (3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 2]}),
             (3, (3, 3), {"auto_pad": "SAME_UPPER"}, 3)]
    check_runtime_cases("Conv", rng.randn(2, 3, 7, 9), cases, input_shapes={"x": ["N", 3, 7, 9]})
    check_runtime_cases("Conv", rng.randn(2, 3, 7, 9), cases, opset=11)


def test_conv_transpose_runtime_weights():
    cases = [
        (3, (3, 3), {}),
        (3, (3, 3), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
        (3, (3, 3), {"strides": [2, 2], "output_padding": [1, 0], "dilations": [2, 1]}),
        (3, (3, 3), {"strides": [3, 2], "output_shape": [19, 16], "auto_pad": "SAME_UPPER"}),
        (3, (3, 3), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}, 1, False),
        (2, (3, 3), {"strides": [2, 1], "pads": [0, 1, 1, 0], "dilations": [1, 2]}, 2),
        (1, (2, 2), {"strides": [2, 2]}, 4),
    ]
    counts = check_runtime_cases("ConvTranspose", rng.randn(2, 4, 7, 9), cases)
    assert counts.get("TRANSPOSE_CONV") == 5 + 2 + 4, counts


def test_conv_transpose_1d_3d_runtime_weights():
    cases = [
        (3, (3,), {"strides": [2], "pads": [1, 2], "output_padding": [1]}),
        (2, (3,), {"dilations": [2], "output_shape": [14]}, 2),
    ]
    check_runtime_cases("ConvTranspose", rng.randn(2, 4, 11), cases)
    cases = [
        (2, (3, 2, 3), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
        (1, (2, 2, 3), {"dilations": [2, 1, 1], "strides": [1, 2, 2]}, 3),
    ]
    check_runtime_cases("ConvTranspose", rng.randn(2, 3, 4, 5, 6), cases)


def test_computed_weights_between_convs_stay_channel_last():
    """Conv -> Conv whose kernel is computed (Mul) -> Conv: the data stays channel-last;
    only the computed kernel is transposed."""
    x, w1 = rng.randn(2, 3, 8, 8), rng.randn(4, 3, 3, 3)
    w2, w3 = rng.randn(4, 4, 3, 3), rng.randn(2, 4, 1, 1)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["w2", "scale"], ["w2s"]),
        helper.make_node("Conv", ["c1", "w2s"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3"], ["y"]),
    ]
    model = make_model(nodes, {"x": x, "scale": rng.randn(1)}, ["y"],
                       {"w1": w1, "w2": w2, "w3": w3})
    converted = check_model(model, {"x": x, "scale": rng.randn(1)})
    assert converted.plan.perms["c2"] == (0, 2, 3, 1)
    counts = count_tflite_ops(converted.tflite)
    assert counts.get("TRANSPOSE", 0) <= 2 and counts.get("CONV_2D") == 3, counts


# --- CausalConvWithState -----------------------------------------------------------------
def causal_conv_case(batch, channels, length, taps, bias, past, activation, weights_runtime):
    """Inputs, constant initializers and the node's input order."""
    inputs = {"x": rng.randn(batch, channels, length)}
    inits = {}
    params = {"w": rng.randn(channels, 1, taps), "bias": rng.randn(channels) if bias else None,
              "past": rng.randn(batch, channels, taps - 1) if past else None}
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
    inputs = {"x": rng.randn(2, c, 9), "past": rng.randn(2, c, taps - 1)}
    inits = {"w_in": rng.randn(c, c, 1), "w_out": rng.randn(c, c, 3), "bias": rng.randn(c)}
    (inputs if weights_runtime else inits)["w"] = rng.randn(c, 1, taps)
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


def dfl_head(batch: int, anchors: int, bins: int = 16):
    """A YOLOv8-style distribution-focal-loss head: a conv's (N, 4*bins, 1, A) output regrouped
    to (N, 4, bins, A), bins moved to the channel axis, softmax over bins, a 1x1 conv with
    fixed weights 0..bins-1 (the expected bin) and a reshape to (N, 4, A)."""
    x = rng.randn(batch, 8, 1, anchors)
    inits = {
        "w0": rng.randn(4 * bins, 8, 1, 1), "b0": rng.randn(4 * bins),
        "split": np.array([batch, 4, bins, anchors], np.int64),
        "w1": np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1),
        "merge": np.array([batch, 4, anchors], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c"]),
        helper.make_node("Reshape", ["c", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Softmax", ["t"], ["s"], axis=1),
        helper.make_node("Conv", ["s", "w1"], ["d"]),
        helper.make_node("Reshape", ["d", "merge"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


@pytest.mark.parametrize("batch, anchors", [(1, 21), (2, 9)])
def test_pointwise_conv_takes_any_channel_last_perm(batch, anchors):
    """The DFL head's 1x1 conv reads the softmax in the perm it arrives in (channel axis
    last, the other axes in any order) instead of asking for a transpose: same numbers as
    onnxruntime, and the only TRANSPOSE left is the (N, 4, A) model output's return to ONNX
    layout (there was one more, before the conv)."""
    model, feeds = dfl_head(batch, anchors)
    converted = check_model(model, feeds)
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE") == 1
    assert {name for name, _ in converted.plan.transposes(converted.graph)} == {"y"}
    assert converted.plan.perms["s"][-1] == 1 and converted.plan.perms["s"] != (0, 2, 3, 1)


@pytest.mark.parametrize("attrs, transposes", [
    ({}, 0), ({"strides": [2, 1]}, 1), ({"pads": [0, 1, 0, 1]}, 1), ({"dilations": [2, 2]}, 0),
])
def test_only_a_true_pointwise_conv_ignores_the_spatial_order(attrs, transposes):
    """A conv's NHWC output with H and W swapped by a Transpose arrives at a 1x1 conv as
    (N, W, H, C): with stride 1 and no pads (any dilation) the conv runs on it as it is;
    strided or padded, the spatial order matters and it is transposed back to NHWC first."""
    x = rng.randn(2, 3, 5, 7)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Conv", ["t", "w1"], ["p"], **attrs),
        helper.make_node("ReduceSum", ["p", "axes"], ["y"]),  # (N, 4, 1, 1): any perm is free
    ]
    inits = {"w0": rng.randn(6, 3, 3, 3), "w1": rng.randn(4, 6, 1, 1), "axes": np.array([2, 3])}
    converted = check_model(make_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == transposes
    assert converted.plan.perms["t"] == (0, 3, 2, 1)


def test_conv_with_weights_past_the_cache_runs_in_output_channel_slices(monkeypatch):
    """Weights above conv.SPLIT_ABOVE run as CONV_2Ds over slices of the output channels
    (lowered here so that a small conv qualifies), joined by concatenations of at most 4
    inputs (XNNPACK leaves wider ones to the builtin kernel); the values do not change."""
    from onnx2tf_alt.ops import conv as conv_module

    w = rng.standard_normal((256, 8, 3, 3)).astype(np.float32)
    monkeypatch.setattr(conv_module, "SPLIT_ABOVE", w.nbytes - 1)
    monkeypatch.setattr(conv_module, "CACHE_BYTES", w.nbytes // 8)  # 8 slices of 32
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    model = make_model([node, helper.make_node("Relu", ["y"], ["r"])],
                       {"x": rng.standard_normal((2, 8, 9, 7)).astype(np.float32)}, ["r"],
                       {"w": w, "b": rng.standard_normal(256).astype(np.float32)})
    converted = check_model(model, {"x": rng.standard_normal((2, 8, 9, 7)).astype(np.float32)})
    ops = count_tflite_ops(converted.tflite)
    assert (ops["CONV_2D"], ops["CONCATENATION"]) == (8, 3) and "TRANSPOSE" not in ops, ops
