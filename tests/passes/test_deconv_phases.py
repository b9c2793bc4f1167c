"""A strided ConvTranspose as convolutions of its output phases (passes/deconv_phases.py):
the rewritten ONNX graph computes what the original does (onnxruntime on both, random
geometries), converted models match onnxruntime through TF and the float32 TFLite with no
TRANSPOSE_CONV left, a BatchNormalization and a Relu / Clip after it end up inside the
CONV_2Ds, and what the pass does not take keeps its TRANSPOSE_CONV."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx2tf_alt.passes.deconv_phases import split_transposed_convs
from onnx2tf_alt.passes.prepare import infer_shapes

from harness import check_model, count_tflite_ops, make_model


def deconv_model(x_shape, c_out, kernel, seed, bias=True, opset=18, after=(), **attrs):
    """x -> ConvTranspose(kernel, attrs) [-> the ops of `after`] -> y."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((x_shape[1], c_out, *kernel)).astype(np.float32) * 0.3}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(c_out * attrs.get("group", 1)).astype(np.float32)
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["t0"], name="up", **attrs)]
    total = c_out * attrs.get("group", 1)  # the output channels
    for k, op in enumerate(after):
        if op == "BatchNormalization":
            for name, value in (("gamma", rng.uniform(0.5, 1.5, total)),
                                ("beta", rng.standard_normal(total)),
                                ("mean", rng.standard_normal(total) * 0.1),
                                ("var", rng.uniform(0.5, 1.5, total))):
                inits[name] = value.astype(np.float32)
            nodes.append(helper.make_node(op, [f"t{k}", "gamma", "beta", "mean", "var"],
                                          [f"t{k + 1}"], epsilon=1e-3))
        elif op == "Clip6":
            inits.update(lo=np.float32(0), hi=np.float32(6))
            nodes.append(helper.make_node("Clip", [f"t{k}", "lo", "hi"], [f"t{k + 1}"]))
        else:
            nodes.append(helper.make_node(op, [f"t{k}"], [f"t{k + 1}"]))
    nodes.append(helper.make_node("Identity", [f"t{len(after)}"], ["y"]))
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits, opset=opset), feeds


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def rewritten(model):
    copy = infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    return split_transposed_convs(copy), copy


def test_random_geometries_compute_what_onnxruntime_does():
    """Strides 2-4, kernels 1-6, pads below the stride, output padding, odd and non-square
    sizes, batch 2: every rewritten model gives the original's outputs in onnxruntime."""
    rng = np.random.default_rng(0)
    taken = 0
    for case in range(60):
        stride = int(rng.integers(2, 5))
        kernel = [int(rng.integers(1, 7)) for _ in range(2)]
        pads = [int(rng.integers(0, stride)) for _ in range(4)]
        padding = [int(rng.integers(0, stride)) for _ in range(2)]
        x_shape = (2, 3, int(rng.integers(2, 9)), int(rng.integers(2, 9)))
        if any((x_shape[2 + a] - 1) * stride - pads[a] - pads[a + 2] + kernel[a] + padding[a]
               < 1 for a in (0, 1)):
            continue  # no output
        model, feeds = deconv_model(x_shape, 4, kernel, case, bias=bool(case % 2),
                                    strides=[stride, stride], pads=pads, output_padding=padding)
        count, new = rewritten(model)
        if not count:
            continue
        taken += 1
        assert not any(n.op_type == "ConvTranspose" for n in new.graph.node)
        np.testing.assert_allclose(run(new, feeds), run(model, feeds), rtol=1e-5, atol=1e-5,
                                   err_msg=f"case {case}: {stride=} {kernel=} {pads=}")
    assert taken >= 15, taken


@pytest.mark.parametrize(("kernel", "attrs", "convs"), [
    ((3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, 4),
    ((2, 2), {"strides": [2, 2]}, 1),  # SAM's upscaling, a U-Net's: one CONV_2D
    ((4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 4),  # DCGAN's
    ((3, 3), {"strides": [2, 2]}, 4),  # 2 * 7 + 1: a cropped last row and column
    ((5, 4), {"strides": [3, 3], "pads": [2, 1, 0, 2]}, 9),
    ((4, 4), {"strides": [4, 4], "auto_pad": "VALID"}, 1),
])
def test_converted_files_hold_convolutions_and_one_depth_to_space(kernel, attrs, convs):
    model, feeds = deconv_model((2, 5, 7, 6), 3, kernel, 1, **attrs)
    converted = check_model(model, feeds)
    ops = count_tflite_ops(converted.tflite)
    assert "TRANSPOSE_CONV" not in ops and "TRANSPOSE" not in ops, ops
    assert ops.get("CONV_2D") == convs and ops.get("DEPTH_TO_SPACE") == 1, ops


@pytest.mark.parametrize("after", [("BatchNormalization", "Relu"), ("Relu",), ("Clip6",),
                                   ("BatchNormalization",)])
def test_a_norm_and_an_activation_after_it_go_into_the_convolutions(after):
    """A DB text detector's head (ConvTranspose 2x2 / 2 -> BatchNormalization -> Relu): one
    CONV_2D with the norm in its weights and the activation fused, then DEPTH_TO_SPACE."""
    model, feeds = deconv_model((2, 8, 6, 5), 4, (2, 2), 2, strides=[2, 2], after=after)
    ops = count_tflite_ops(check_model(model, feeds).tflite)
    assert ops == {"CONV_2D": 1, "DEPTH_TO_SPACE": 1}, ops
    model, feeds = deconv_model((2, 8, 6, 5), 4, (3, 3), 3, strides=[2, 2], pads=[1] * 4,
                                output_padding=[1, 1], after=after)
    ops = count_tflite_ops(check_model(model, feeds).tflite)
    assert ops == {"CONV_2D": 4, "CONCATENATION": 1, "DEPTH_TO_SPACE": 1}, ops


def test_same_pads_and_output_shapes_split_as_onnxruntime_does():
    """SAME_UPPER puts an odd total pad at the end, SAME_LOWER and an explicit output_shape
    at the start: the rewritten graph gives onnxruntime's outputs of the original."""
    taken = 0
    for case, (size, kernel, stride, mode, grow) in enumerate(itertools.product(
            [3, 5, 6], [2, 3, 4, 5], [2, 3], ["SAME_UPPER", "SAME_LOWER", "NOTSET"], [0, 1])):
        attrs = {"strides": [stride, stride]}
        if mode != "NOTSET":
            attrs["auto_pad"] = mode
        if grow or mode == "NOTSET":  # an output_shape a row and a column wider
            attrs["output_shape"] = [size * stride + grow] * 2
        model, feeds = deconv_model((1, 3, size, size), 2, (kernel, kernel), case, **attrs)
        count, new = rewritten(model)
        taken += count
        np.testing.assert_allclose(run(new, feeds), run(model, feeds), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{size=} {kernel=} {stride=} {mode=} {grow=}")
    assert taken >= 30, taken


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_older_opsets_get_their_slice_and_depth_to_space(opset):
    """Slice before opset 10 takes attributes; DepthToSpace before 11 has no mode (DCR)."""
    model, feeds = deconv_model((1, 3, 5, 5), 2, (3, 3), 4, opset=opset, strides=[2, 2])
    count, new = rewritten(model)
    assert count == 1
    np.testing.assert_allclose(run(new, feeds), run(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 2], "dilations": [2, 2]},
    {"strides": [2, 3]},
    {"strides": [2, 2], "pads": [2, 2, 2, 2]},  # a phase would start past the input
    {},
], ids=str)
def test_what_the_pass_does_not_take_stays_transpose_conv(attrs):
    model, feeds = deconv_model((2, 3, 6, 6), 2, (3, 3), 5, **attrs)
    assert rewritten(model)[0] == 0
    ops = count_tflite_ops(check_model(model, feeds).tflite)
    assert ops.get("TRANSPOSE_CONV") == 1 and "DEPTH_TO_SPACE" not in ops, ops


def deconv1d_model(length, c_in, c_out, kernel, seed, **attrs):
    """x [2, c_in, length] -> ConvTranspose 1-D -> Conv 1-D (3 taps) -> y."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((c_in, c_out, kernel)).astype(np.float32) * 0.3,
             "b": rng.standard_normal(c_out).astype(np.float32),
             "w2": rng.standard_normal((2, c_out, 3)).astype(np.float32) * 0.3}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], name="up", **attrs),
             helper.make_node("Conv", ["t", "w2"], ["y"], pads=[1, 1])]
    feeds = {"x": rng.standard_normal((2, c_in, length)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


def test_1d_random_geometries_compute_what_onnxruntime_does():
    rng = np.random.default_rng(1)
    taken = 0
    for case in range(40):
        stride, kernel = int(rng.integers(2, 9)), int(rng.integers(1, 17))
        pads = [int(rng.integers(0, stride)) for _ in range(2)]
        length, padding = int(rng.integers(3, 12)), int(rng.integers(0, stride))
        if (length - 1) * stride - sum(pads) + kernel + padding < 1:
            continue
        model, feeds = deconv1d_model(length, 3, 4, kernel, case, strides=[stride], pads=pads,
                                      output_padding=[padding])
        count, new = rewritten(model)
        taken += count
        np.testing.assert_allclose(run(new, feeds), run(model, feeds), rtol=1e-5, atol=1e-5,
                                   err_msg=f"case {case}: {stride=} {kernel=} {pads=}")
    assert taken >= 15, taken


@pytest.mark.parametrize(("kernel", "attrs"), [
    (16, {"strides": [8], "pads": [4, 4]}),  # a HiFi-GAN vocoder's upsampling
    (4, {"strides": [2], "pads": [1, 1]}),
    (3, {"strides": [2], "pads": [1, 1], "output_padding": [1]}),
])
def test_1d_files_interleave_the_phases_without_moving_data(kernel, attrs):
    model, feeds = deconv1d_model(9, 6, 5, kernel, 2, **attrs)
    ops = count_tflite_ops(check_model(model, feeds).tflite)
    assert "TRANSPOSE_CONV" not in ops and "TRANSPOSE" not in ops, ops
    assert ops.get("CONV_2D") == attrs["strides"][0] + 1, ops  # a conv per phase, and w2's


@pytest.mark.parametrize(("channels", "group", "per_group_out", "kind"), [
    (8, 8, 1, "DEPTHWISE_CONV_2D"),  # CenterNet's upsampling: 4x4 / 2, groups = channels
    (8, 2, 3, "CONV_2D"),
])
def test_grouped_transposed_convs_become_grouped_phase_convs(channels, group, per_group_out,
                                                              kind):
    """A grouped ConvTranspose (one TRANSPOSE_CONV per group before): a grouped (or
    depthwise) convolution per phase, with the BatchNormalization and Relu after it."""
    model, feeds = deconv_model((2, channels, 6, 5), per_group_out, (4, 4), 7,
                                strides=[2, 2], pads=[1, 1, 1, 1], group=group,
                                after=("BatchNormalization", "Relu"))
    count, new = rewritten(model)
    assert count == 1
    np.testing.assert_allclose(run(new, feeds), run(model, feeds), rtol=1e-5, atol=1e-5)
    ops = count_tflite_ops(check_model(model, feeds).tflite)
    assert "TRANSPOSE_CONV" not in ops and ops.get("DEPTH_TO_SPACE") == 1, ops
    assert ops.get(kind) == 4 and "RELU" not in ops and "MUL" not in ops, ops
