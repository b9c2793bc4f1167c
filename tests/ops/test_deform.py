"""DeformConv against onnxruntime, through TF and the float32 TFLite.

Offsets are large enough that many taps sample outside the image (where the bilinear corners
count as zero) and between pixels. Kernels, offsets, masks and biases are fed at run time
(as in the ONNX node tests) or are constants (as in exported models).
"""

import numpy as np
import pytest
from onnx import helper

from harness import Rng, check_model, check_nodes, count_tflite_ops, make_model

rng = Rng(0)


def out_size(n, k, s, d, begin, end):
    return (n + begin + end - (k - 1) * d - 1) // s + 1


def deform_case(x, i, out_ch, kernel, attrs, mask=True, bias=True):
    """(node, arrays) of one DeformConv reading x, its other inputs named after case i."""
    group, offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)
    rank = len(kernel)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    out = [out_size(n, k, s, d, pads[a], pads[a + rank]) for a, (n, k, s, d)
           in enumerate(zip(x.shape[2:], kernel, strides, dilations))]
    taps = int(np.prod(kernel))
    arrays = {f"w{i}": rng.randn(out_ch, x.shape[1] // group, *kernel),
              f"offset{i}": rng.randn(x.shape[0], offset_group * taps * rank, *out, scale=2.0)}
    names = ["x", f"w{i}", f"offset{i}", ""]
    if bias:
        arrays[f"b{i}"] = rng.randn(out_ch)
        names[3] = f"b{i}"
    if mask:
        arrays[f"mask{i}"] = rng.uniform(0, 1, (x.shape[0], offset_group * taps, *out))
        arrays[f"mask{i}"] = arrays[f"mask{i}"].astype(np.float32)
        names.append(f"mask{i}")
    label = "deform(" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + f")_{i}"
    node = helper.make_node("DeformConv", names, [label], kernel_shape=list(kernel), **attrs)
    return node, arrays


CASES = [
    (2, (3, 3), {"pads": [1, 1, 1, 1]}),
    (3, (2, 3), {"strides": [2, 1], "pads": [1, 0, 0, 2]}, False, False),
    (4, (3, 3), {"dilations": [2, 1], "strides": [1, 2], "pads": [2, 1, 1, 1]}),
    (4, (3, 2), {"group": 2, "pads": [0, 1, 1, 0]}, True, False),
    (2, (2, 2), {"offset_group": 2, "strides": [2, 2]}, False, True),
    (4, (3, 3), {"group": 2, "offset_group": 4, "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("runtime", [True, False], ids=["runtime", "constant"])
def test_deform_conv(runtime):
    """Attribute combinations on a batch of 2; every parameter fed at run time, or kernel
    and bias constant (offsets and masks are always data)."""
    x = rng.randn(2, 4, 7, 6)
    nodes, feeds, init = [], {"x": x}, {}
    for i, case in enumerate(CASES):
        node, arrays = deform_case(x, i, *case)
        nodes.append(node)
        for name, value in arrays.items():
            constant = not runtime and name[0] in "wb"
            (init if constant else feeds)[name] = value
    _, census = check_nodes(nodes, feeds, init, opset=19)
    assert not any(name.startswith("Flex") for name in census), census


def test_deform_conv_dynamic_batch():
    x = rng.randn(3, 2, 5, 5)
    node, arrays = deform_case(x, 0, 3, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})
    feeds = {"x": x, **arrays}
    shapes = {n: ["N", *a.shape[1:]] for n, a in feeds.items() if n in ("x", "offset0", "mask0")}
    model = make_model([node], feeds, [node.output[0]], opset=19, input_shapes=shapes)
    check_model(model, feeds)


def test_deform_conv_between_convs_stays_channel_last():
    """Conv -> (offsets and mask from Convs of it) -> DeformConv -> Conv: a DCNv2 block with
    constant weights runs channel-last with no TRANSPOSE."""
    x = rng.randn(2, 3, 8, 7)
    init = {"w0": rng.randn(4, 3, 3, 3), "w_off": rng.randn(18, 4, 3, 3, scale=0.5),
            "w_mask": rng.randn(9, 4, 3, 3), "w_dcn": rng.randn(5, 4, 3, 3), "b_dcn": rng.randn(5),
            "w_out": rng.randn(2, 5, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c0", "w_off"], ["offset"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c0", "w_mask"], ["mask_logits"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["mask_logits"], ["mask"]),
        helper.make_node("DeformConv", ["c0", "w_dcn", "offset", "b_dcn", "mask"], ["d"],
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "w_out"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], init, opset=19)
    converted = check_model(model, {"x": x})
    assert converted.plan.perms["d"] == (0, 2, 3, 1)
    counts = count_tflite_ops(converted.tflite)
    assert "TRANSPOSE" not in counts and counts.get("GATHER") == 1, counts


def test_deform_conv_other_ranks_are_reported():
    """onnxruntime (the reference here) has 2-D DeformConv only; other ranks are refused."""
    from onnx2tf_alt.errors import ConversionError
    from onnx2tf_alt.pipeline import build

    x = rng.randn(2, 4, 9)
    node, arrays = deform_case(x, 0, 3, (3,), {"pads": [1, 1]})
    outputs = [node.output[0]]
    model = make_model([node], {"x": x, **arrays}, outputs, opset=19)
    with pytest.raises(ConversionError, match="2-D only"):
        build(onnx_graph=model)
