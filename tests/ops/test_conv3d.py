"""3-D Conv lowered to 2-D convolutions over frames (ops/_conv3d.py) against onnxruntime,
through TF and the float32 TFLite: every op of the file on XNNPACK, no CONV_3D.

Each test puts one node per attribute combination into one model (one conversion), with
outputs named after the attributes, so a failure names its combination.
"""

from onnx import helper

from onnx2tf_alt.export.delegates import analyze
from onnx2tf_alt.translate.options import ConversionOptions

from harness import Rng, check_model, count_tflite_ops, make_model

rng = Rng(0)


def conv_nodes(x, cases):
    """(nodes, weights) for cases (out_ch, kernel, attrs[, group[, bias]]) on input "x"."""
    nodes, weights = [], {}
    for i, (out_ch, kernel, attrs, *rest) in enumerate(cases):
        group, bias = [*rest, 1, True][0], [*rest, True, True][1]
        names = [f"w{i}"] + ([f"b{i}"] if bias else [])
        weights[f"w{i}"] = rng.randn(out_ch, x.shape[1] // group, *kernel)
        if bias:
            weights[f"b{i}"] = rng.randn(out_ch)
        attrs = {"group": group, "kernel_shape": list(kernel), **attrs}
        label = "Conv(" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + f", bias={bias})"
        nodes.append(helper.make_node("Conv", ["x", *names], [label], **attrs))
    return nodes, weights


def check_cases(x, cases, runtime_weights=False, input_shape=None, **convert_kwargs):
    """Convert and check all cases in one model; return (TFLite census, delegate report)."""
    nodes, weights = conv_nodes(x, cases)
    outputs = [n.output[0] for n in nodes]
    feeds = {"x": x, **(weights if runtime_weights else {})}
    model = make_model(nodes, feeds, outputs, None if runtime_weights else weights,
                       input_shapes={"x": input_shape} if input_shape else None)
    converted = check_model(model, feeds, **convert_kwargs)
    counts = count_tflite_ops(converted.tflite)
    assert not any(name.startswith("Flex") for name in counts), counts
    return counts, analyze(converted.tflite, converted.tflite_result(), converted.graph)


def assert_on_xnnpack(counts, report):
    assert "CONV_3D" not in counts, counts
    assert not report.reference_ops, [o.op for o in report.reference_ops]
    assert report.partitions == 1, report.partitions


def test_conv3d_attrs():
    """Group 1 with depth strides, dilations, asymmetric, SAME and VALID pads, odd sizes,
    batch 2: one CONV_2D per depth tap that reads a real frame."""
    cases = [
        (4, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
        (4, (3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2]}, 1, False),
        (4, (3, 3, 3), {"strides": [2, 1, 2], "dilations": [1, 2, 1]}),
        (4, (2, 3, 3), {"strides": [3, 2, 1], "pads": [1, 1, 0, 2, 1, 1]}),
        (4, (3, 3, 2), {"dilations": [2, 1, 2], "pads": [2, 1, 1, 1, 1, 0]}),
        (4, (3, 3, 3), {"strides": [2, 2, 2], "dilations": [2, 1, 1], "pads": [2, 1, 0] * 2}),
        (4, (3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
        (4, (2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [1, 2, 2]}, 1, False),
        (4, (3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2, 3]}),
        (4, (1, 1, 1), {"strides": [2, 2, 2]}, 1, False),
        (4, (1, 1, 1), {}),
        (4, (3, 5, 5), {"strides": [1, 2, 2], "pads": [1, 2, 2, 1, 2, 2]}),
    ]
    # Kept taps per case on 5 frames: with pads (1, 2) and stride 3, the 2 taps of the
    # fourth case read frames (-1, 2, 5) and (0, 3, 6): one real frame and two.
    taps = [3, 3, 3, 2, 3, 3, 3, 2, 3, 1, 1, 3]
    counts, report = check_cases(rng.randn(2, 3, 5, 6, 7), cases)
    assert_on_xnnpack(counts, report)
    assert counts.get("CONV_2D") == sum(taps), counts
    assert "TRANSPOSE" not in counts and "CONCATENATION" not in counts, counts


def test_r3d_block_conv_census():
    """A 3x3x3 conv with pads 1 on two frames (r3d_18's third stage): three CONV_2D, one per
    tap, the outer ones on the one frame each reads; their outputs padded in depth (2 PAD),
    summed (2 ADD); the bias fused into the middle tap's conv, the Relu into the last ADD."""
    x = rng.randn(2, 4, 2, 7, 5)
    nodes, weights = conv_nodes(x, [(6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]})])
    nodes.append(helper.make_node("Relu", [nodes[0].output[0]], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], weights)
    converted = check_model(model, {"x": x})
    counts = count_tflite_ops(converted.tflite)
    assert_on_xnnpack(counts, analyze(converted.tflite, converted.tflite_result(),
                                      converted.graph))
    assert {k: counts.get(k, 0) for k in ("CONV_2D", "PAD", "ADD", "RELU")} == {
        "CONV_2D": 3, "PAD": 2, "ADD": 2, "RELU": 0}, counts


def test_taps_that_read_only_padding_are_dropped():
    """One frame and depth pads: the outer taps read zeros only, so a 3x3x3 conv is one 3x3
    CONV_2D on the frame (no PAD); non-contiguous kept taps; an output that reads padding
    only (the bias)."""
    x = rng.randn(2, 3, 1, 6, 5)
    cases = [(4, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
             (4, (3, 3, 3), {"pads": [2, 1, 1, 2, 1, 1], "dilations": [2, 1, 1]})]
    counts, report = check_cases(x, cases)
    assert_on_xnnpack(counts, report)
    assert counts.get("CONV_2D") == 2 and "PAD" not in counts and "ADD" not in counts, counts
    cases = [(4, (4, 1, 1), {"pads": [3, 0, 0, 3, 0, 0], "strides": [3, 1, 1]}),  # taps 0, 3
             (4, (1, 3, 3), {"pads": [1, 1, 1, 0, 1, 1], "strides": [2, 1, 1]})]  # padding
    counts, report = check_cases(x, cases)
    assert_on_xnnpack(counts, report)


def test_grouped_and_depthwise_conv3d():
    """Groups: a grouped CONV_2D per depth tap; groups == channels: a
    DEPTHWISE_CONV_2D per tap (also with a channel multiplier, and with H/W strides and
    dilations together, which TF's depthwise conv does not take: the kernel is dilated)."""
    cases = [
        (6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}, 2),
        (9, (2, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}, 3, False),
        (6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}, 6),
        (12, (3, 2, 3), {"strides": [2, 2, 1], "pads": [0, 1, 1, 1, 0, 1]}, 6),
        (6, (2, 3, 3), {"strides": [1, 2, 2], "dilations": [2, 2, 2], "pads": [1, 2, 1] * 2}, 6),
        (6, (3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}, 6, False),
    ]
    counts, report = check_cases(rng.randn(2, 6, 5, 7, 6), cases)
    assert_on_xnnpack(counts, report)
    assert "SPLIT" not in counts, counts
    assert counts.get("DEPTHWISE_CONV_2D") == 3 + 3 + 2 + 3, counts
    assert counts.get("CONV_2D") == 3 + 2, counts


def test_grouped_conv3d_without_group_convolution():
    """-dgc: per group, plain CONV_2Ds only (groups x taps)."""
    cases = [(6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}, 3),
             (4, (2, 3, 3), {"strides": [2, 1, 2]}, 2, False)]
    counts, report = check_cases(rng.randn(2, 6, 4, 6, 5), cases,
                                 options=ConversionOptions(disable_group_convolution=True))
    assert_on_xnnpack(counts, report)
    assert counts.get("CONV_2D") == 3 * 3 + 2 * 2 and "DEPTHWISE_CONV_2D" not in counts, counts


def test_conv3d_runtime_weights():
    """Kernels and biases fed at run time (group 1, grouped, depthwise): one TRANSPOSE per
    kernel (to TFLite's layout), whatever the number of depth taps."""
    cases = [(4, (3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2], "strides": [2, 1, 2]}),
             (6, (3, 3, 3), {"dilations": [1, 2, 1], "pads": [1, 2, 1, 1, 2, 1]}, 3),
             (6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 2]}, 6)]
    counts, _ = check_cases(rng.randn(2, 6, 5, 6, 7), cases, runtime_weights=True)
    assert "CONV_3D" not in counts, counts
    assert counts.get("TRANSPOSE", 0) == len(cases), counts


def test_conv3d_dynamic_batch_and_unknown_spatial_dims():
    """A symbolic batch keeps the 2-D form; unknown D, H, W fall back to CONV_3D."""
    cases = [(4, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "strides": [2, 1, 1]}),
             (6, (3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}, 3)]
    x = rng.randn(2, 3, 5, 6, 7)
    counts, _ = check_cases(x, cases, input_shape=["N", 3, 5, 6, 7])
    assert "CONV_3D" not in counts, counts
    counts, _ = check_cases(x, cases[:1], input_shape=["N", 3, "D", "H", "W"])
    assert counts.get("CONV_3D") == 1, counts


def test_pointwise_conv3d_after_a_transpose():
    """A pointwise conv takes data in any channel-last perm (here D and H swapped by a
    Transpose, and swapped back after): it runs on the axes as they lie, no TRANSPOSE op."""
    x = rng.randn(2, 3, 5, 6, 7)
    nodes, weights = conv_nodes(x, [(4, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]})])
    weights.update(w_pw=rng.randn(5, 4, 1, 1, 1), b_pw=rng.randn(5))
    swap = [0, 1, 3, 2, 4]
    nodes += [helper.make_node("Transpose", [nodes[0].output[0]], ["t"], perm=swap),
              helper.make_node("Conv", ["t", "w_pw", "b_pw"], ["p"]),
              helper.make_node("Transpose", ["p"], ["y"], perm=swap)]
    model = make_model(nodes, {"x": x}, ["y"], weights)
    converted = check_model(model, {"x": x})
    counts = count_tflite_ops(converted.tflite)
    assert "TRANSPOSE" not in counts and "CONV_3D" not in counts, counts
    assert counts.get("CONV_2D") == 3 + 1, counts
