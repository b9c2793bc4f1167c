"""Quantization ops against onnxruntime, through TF and the float32 TFLite: QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear, ConvInteger, QLinearConv, MatMulInteger and
QLinearMatMul. Integer outputs must match exactly.

Several nodes share one model (one conversion) where they can; outputs are named after
their case, so a failure names it.
"""

import numpy as np
import pytest
from onnx import helper
from onnx2tf_alt.ops.quant import EXACT_LIMIT

from harness import Rng, check_node, check_nodes, reference_run

rng = Rng(0)


def ints(dtype, *shape, low=None, high=None):
    info = np.iinfo(dtype)
    low = info.min if low is None else low
    high = info.max if high is None else high
    return rng.integers(low, high, shape, endpoint=True).astype(dtype)


# --- QuantizeLinear / DequantizeLinear --------------------------------------------------------


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
def test_quantize_dequantize_per_tensor(opset):
    """Every integer type the opset allows; the DequantizeLinear reads a model input."""
    dtypes = [np.uint8, np.int8] + ([np.uint16, np.int16] if opset >= 21 else [])
    x = rng.randn(2, 3, 5, 7, scale=4.0)
    nodes, init, inputs = [], {"s": np.float32(0.0371)}, {"x": x}
    for dtype in dtypes:
        name = np.dtype(dtype).name
        init[f"z_{name}"] = ints(dtype, low=-10 if dtype in (np.int8, np.int16) else 0, high=20)
        inputs[f"q_{name}"] = ints(dtype, 2, 3, 5, 7)
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "s", f"z_{name}"], [f"quantize_{name}"]),
            helper.make_node("DequantizeLinear", [f"q_{name}", "s", f"z_{name}"],
                             [f"dequantize_{name}"]),
        ]
    nodes.append(helper.make_node("QuantizeLinear", ["x", "s"], ["quantize_no_zero_point"]))
    check_nodes(nodes, inputs, init, opset=opset)


@pytest.mark.parametrize("opset", [13, 21])
def test_quantize_dequantize_per_axis(opset):
    x = rng.randn(2, 3, 5, 7, scale=3.0)
    nodes, init, inputs = [], {}, {"x": x}
    for axis in (0, 1, 2, -1):
        size = x.shape[axis]
        init[f"s{axis}"] = rng.uniform(0.01, 0.1, size).astype(np.float32)
        init[f"z{axis}"] = ints(np.int8, size, low=-9, high=9)
        inputs[f"q{axis}"] = ints(np.int8, *x.shape)
        nodes += [
            helper.make_node("QuantizeLinear", ["x", f"s{axis}", f"z{axis}"],
                             [f"quantize_axis{axis}"], axis=axis),
            helper.make_node("DequantizeLinear", [f"q{axis}", f"s{axis}", f"z{axis}"],
                             [f"dequantize_axis{axis}"], axis=axis),
        ]
    check_nodes(nodes, inputs, init, opset=opset)


def test_quantize_rounds_half_to_even_and_saturates():
    """x / scale exactly halfway between integers, and far outside the range."""
    x = np.array([[-3.25, -0.75, -0.25, 0.25, 0.75, 1.25, 2.5, 100.0, -100.0]], np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zu"], ["uint8"]),
        helper.make_node("QuantizeLinear", ["x", "s", "zi"], ["int8"]),
    ]
    init = {"s": np.float32(0.5), "zu": np.uint8(7), "zi": np.int8(-1)}
    check_nodes(nodes, {"x": x}, init, opset=13)


def test_dequantize_int32_and_constant():
    """int32 (biases) and a constant DequantizeLinear, which folds at conversion time."""
    q = ints(np.int32, 4, 6, low=-(2**20), high=2**20)
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s"], ["int32"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["w_float"], axis=0),
        helper.make_node("MatMul", ["int32", "w_float"], ["matmul"]),
    ]
    init = {"s": np.float32(0.003), "w": ints(np.int8, 6, 5), "zw": np.zeros(6, np.int8),
            "sw": rng.uniform(0.01, 0.05, 6).astype(np.float32)}
    check_nodes(nodes, {"q": q}, init, opset=13)


def test_fake_quantized_constant_weights_feed_conv():
    """float weights -> QuantizeLinear -> DequantizeLinear -> Conv (per output channel):
    both fold to constants, so the Conv keeps constant weights."""
    x = rng.randn(2, 3, 8, 8)
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wdq"], axis=0),
        helper.make_node("Conv", ["x", "wdq"], ["y"], pads=[1, 1, 1, 1]),
    ]
    init = {"w": rng.randn(4, 3, 3, 3), "s": rng.uniform(0.005, 0.02, 4).astype(np.float32),
            "z": np.zeros(4, np.int8)}
    _, census = check_nodes(nodes, {"x": x}, init, opset=13, outputs=["y"])
    assert census.get("CONV_2D") == 1 and "ROUND" not in census, census


def test_qdq_between_convs_keeps_channel_last():
    """Conv -> QuantizeLinear -> DequantizeLinear -> Conv, per-tensor and per-channel: the
    pair runs on the channel-last tensor, with no TRANSPOSE."""
    x = rng.randn(2, 4, 9, 9)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
        helper.make_node("QuantizeLinear", ["c1", "sc", "zc"], ["qc"], axis=1),
        helper.make_node("DequantizeLinear", ["qc", "sc", "zc"], ["dqc"], axis=1),
        helper.make_node("Add", ["dq", "dqc"], ["sum"]),
        helper.make_node("Conv", ["sum", "w2"], ["out"]),
    ]
    init = {"w1": rng.randn(6, 4, 3, 3), "w2": rng.randn(5, 6, 1, 1), "s": np.float32(0.05),
            "z": np.uint8(128), "sc": rng.uniform(0.02, 0.08, 6).astype(np.float32),
            "zc": ints(np.int8, 6, low=-5, high=5)}
    converted, census = check_nodes(nodes, {"x": x}, init, opset=13,
                                    outputs=["qc", "dq", "out"])
    assert "TRANSPOSE" not in census, census
    assert converted.plan.perms["qc"] == (0, 2, 3, 1)


def blocked(shape, axis: int, block: int):
    """Shape of a blocked parameter: ceil(dim / block) entries along `axis`."""
    shape = list(shape)
    shape[axis] = -(-shape[axis] // block)
    return tuple(shape)


@pytest.mark.parametrize("runtime", [False, True], ids=["constant", "runtime"])
def test_blocked_quantize_dequantize(runtime):
    """block_size along several axes, blocks that do not divide the axis; scales and zero
    points as initializers or as graph inputs fed at run time."""
    x = rng.randn(2, 6, 5, 7, scale=3.0)
    nodes, params, inputs = [], {}, {"x": x}
    for axis, block in [(1, 2), (2, 3), (-1, 4), (0, 1)]:
        tag = f"{axis}_{block}".replace("-", "m")
        shape = blocked(x.shape, axis, block)
        params[f"s{tag}"] = rng.uniform(0.01, 0.1, shape).astype(np.float32)
        params[f"z{tag}"] = ints(np.uint8, *shape, low=100, high=150)
        inputs[f"q{tag}"] = ints(np.uint8, *x.shape)
        nodes += [
            helper.make_node("QuantizeLinear", ["x", f"s{tag}", f"z{tag}"], [f"quantize{tag}"],
                             axis=axis, block_size=block),
            helper.make_node("DequantizeLinear", [f"q{tag}", f"s{tag}", f"z{tag}"],
                             [f"dequantize{tag}"], axis=axis, block_size=block),
        ]
    nodes.append(helper.make_node("DequantizeLinear", ["q1_2", "s1_2"], ["no_zero_point"],
                                  axis=1, block_size=2))
    if runtime:
        inputs.update(params)
    _, census = check_nodes(nodes, inputs, None if runtime else params, opset=21)
    assert not any(name.startswith("Flex") for name in census), census


@pytest.mark.parametrize("runtime", [False, True], ids=["constant", "runtime"])
def test_blocked_qdq_between_convs_keeps_channel_last(runtime):
    """Conv -> blocked QuantizeLinear -> DequantizeLinear (blocks of channels) -> Conv: the
    parameters are expanded along the channel-last axis, with no TRANSPOSE."""
    x = rng.randn(2, 4, 7, 5)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["q"], axis=1, block_size=4),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], axis=1, block_size=4),
        helper.make_node("Conv", ["dq", "w2"], ["out"]),
    ]
    shape = blocked((2, 6, 7, 5), 1, 4)
    params = {"s": rng.uniform(0.02, 0.08, shape).astype(np.float32),
              "z": ints(np.int8, *shape, low=-5, high=5)}
    init = {"w1": rng.randn(6, 4, 3, 3), "w2": rng.randn(5, 6, 1, 1)}
    inputs = {"x": x, **(params if runtime else {})}
    converted, census = check_nodes(nodes, inputs, {**init, **({} if runtime else params)},
                                    opset=21, outputs=["q", "out"])
    assert "TRANSPOSE" not in census, census
    assert converted.plan.perms["q"] == (0, 2, 3, 1)


# --- DynamicQuantizeLinear --------------------------------------------------------------------


def test_dynamic_quantize_linear():
    inputs = {
        "mixed": rng.randn(3, 5, 7, scale=2.5),
        "positive": np.abs(rng.randn(4, 6)) + 0.5,
        "negative": -np.abs(rng.randn(4, 6)) - 0.1,
        "zeros": np.zeros((2, 3), np.float32),
    }
    nodes = [helper.make_node("DynamicQuantizeLinear", [n], [f"{n}_y", f"{n}_scale",
                                                             f"{n}_zero_point"])
             for n in inputs]
    check_nodes(nodes, inputs)


# --- ConvInteger / QLinearConv ------------------------------------------------------------


def _conv_bits(w: np.ndarray, zero_point) -> int:
    """Digit width _exact_product uses for these weights (8: no split)."""
    centered = w.astype(np.float64) - np.asarray(zero_point, np.float64).reshape(-1, 1, 1, 1)
    bound = np.abs(centered).reshape(len(w), -1).sum(axis=1).max()
    return min(8, int(np.floor(np.log2(EXACT_LIMIT / bound))))


@pytest.mark.parametrize("channels,expected_bits", [(8, 8), (64, 7), (512, 4)])
def test_conv_integer_exact_for_large_accumulations(channels, expected_bits):
    """Full-range weights: the larger the sums, the more digits the input is split into."""
    x = ints(np.uint8, 1, channels, 6, 6)
    w = np.where(rng.random((4, channels, 3, 3)) < 0.5, -127, 127).astype(np.int8)
    if channels == 8:
        w = ints(np.int8, 4, channels, 3, 3)
    assert _conv_bits(w, 0) == expected_bits
    check_node("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]},
               initializers={"w": w, "xz": np.uint8(131)})


def test_conv_integer_attributes():
    x = ints(np.uint8, 2, 4, 9, 8)
    cases = [({"pads": [1, 1, 1, 1]}, 1), ({"strides": [2, 2]}, 2), ({"dilations": [2, 1]}, 4),
             ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 1)]
    nodes, init = [], {"xz": np.uint8(100)}
    for i, (attrs, group) in enumerate(cases):
        init[f"w{i}"] = ints(np.int8, 6 if group != 4 else 4, 4 // group, 3, 3)
        init[f"wz{i}"] = np.int8(i - 1)
        nodes.append(helper.make_node("ConvInteger", ["x", f"w{i}", "xz", f"wz{i}"],
                                      [f"case{i}"], group=group, **attrs))
    _, census = check_nodes(nodes, {"x": x}, init, opset=10)
    assert "TRANSPOSE" not in census, census


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_conv(dtype):
    """Per-tensor and per-channel weights, groups, depthwise, bias, strides, 1-D."""
    x = ints(dtype, 2, 8, 9, 9)
    x1 = ints(dtype, 2, 8, 11)
    zero = np.int8(-3) if dtype == np.int8 else np.uint8(120)
    base = {"xs": np.float32(0.02), "xz": zero, "ys": np.float32(0.15), "yz": zero}
    cases = [
        ("per_tensor", x, (6, 8, 3, 3), 1, {"pads": [1, 1, 1, 1]}, False, False),
        ("per_channel_bias", x, (6, 8, 3, 3), 1, {"strides": [2, 2]}, True, True),
        ("groups", x, (6, 4, 3, 3), 2, {"pads": [0, 1, 1, 0]}, True, True),
        ("depthwise", x, (8, 1, 3, 3), 8, {"pads": [1, 1, 1, 1]}, True, True),
        ("conv1d", x1, (5, 8, 3), 1, {"pads": [1, 1]}, True, False),
    ]
    nodes, init = [], dict(base)
    for name, src, wshape, group, attrs, per_channel, bias in cases:
        out = wshape[0]
        init[f"{name}_w"] = ints(dtype, *wshape)
        init[f"{name}_ws"] = (rng.uniform(0.002, 0.01, out) if per_channel
                              else np.array(0.005)).astype(np.float32)
        init[f"{name}_wz"] = (np.full(out, 2, dtype) if per_channel else np.array(1, dtype))
        inputs = ["xs", "xz", f"{name}_w", f"{name}_ws", f"{name}_wz", "ys", "yz"]
        if bias:
            init[f"{name}_b"] = ints(np.int32, out, low=-2000, high=2000)
            inputs.append(f"{name}_b")
        source = "x" if src is x else "x1"
        nodes.append(helper.make_node("QLinearConv", [source, *inputs], [name], group=group,
                                      **attrs))
    _, census = check_nodes(nodes, {"x": x, "x1": x1}, init, opset=10)
    assert "TRANSPOSE" not in census, census


def test_conv_integer_runtime_weights_and_zero_points():
    """Every input fed at run time: weights and both zero points; groups, depthwise, dilations, 1-D, and a fan-in that needs digit splitting
    (run-time weights bound each tap by 255)."""
    x, x1, xw = ints(np.uint8, 2, 4, 9, 8), ints(np.uint8, 2, 4, 11), ints(np.uint8, 1, 64, 5, 5)
    cases = [("x", {"pads": [1, 1, 1, 1]}, 1, (6, 3, 3)), ("x", {"strides": [2, 2]}, 2, (6, 3, 3)),
             ("x", {"dilations": [2, 1], "pads": [2, 1, 2, 1]}, 4, (4, 3, 3)),
             ("x", {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 1, (5, 2, 3)),
             ("x1", {"strides": [2], "pads": [1, 1]}, 2, (4, 3)),
             ("xw", {"pads": [1, 1, 1, 1]}, 1, (3, 3, 3))]
    feeds = {"x": x, "x1": x1, "xw": xw, "xz": np.array(100, np.uint8)}
    nodes = []
    for i, (src, attrs, group, (out, *kernel)) in enumerate(cases):
        feeds[f"w{i}"] = ints(np.int8, out, feeds[src].shape[1] // group, *kernel)
        feeds[f"wz{i}"] = np.array(i - 2, np.int8)  # onnxruntime: per-tensor only
        nodes.append(helper.make_node("ConvInteger", [src, f"w{i}", "xz", f"wz{i}"],
                                      [f"case{i}"], group=group, **attrs))
    _, census = check_nodes(nodes, feeds, opset=10)
    assert not any(name.startswith("Flex") for name in census), census


def test_qlinear_conv_runtime_parameters():
    """QLinearConv with weights, scales, zero points and bias all fed at run time."""
    for dtype in (np.int8, np.uint8):
        x = ints(dtype, 2, 4, 7, 6)
        zero = np.array(-3 if dtype == np.int8 else 120, dtype)
        feeds = {"x": x, "xs": np.array(0.02, np.float32), "xz": zero,
                 "ys": np.array(0.15, np.float32), "yz": zero}
        nodes = []
        for name, group, per_channel in (("dense", 1, True), ("grouped", 2, False),
                                         ("depthwise", 4, True)):
            out = 6 if group < 4 else 4
            feeds[f"{name}_w"] = ints(dtype, out, 4 // group, 3, 3)
            shape = (out,) if per_channel else ()
            feeds[f"{name}_ws"] = rng.uniform(0.002, 0.01, shape).astype(np.float32)
            feeds[f"{name}_wz"] = np.full(shape, 2, dtype)
            feeds[f"{name}_b"] = ints(np.int32, out, low=-2000, high=2000)
            inputs = ["x", "xs", "xz", f"{name}_w", f"{name}_ws", f"{name}_wz", "ys", "yz",
                      f"{name}_b"]
            nodes.append(helper.make_node("QLinearConv", inputs, [name], group=group,
                                          pads=[1, 0, 1, 1]))
        _, census = check_nodes(nodes, feeds, opset=10)
        assert not any(name.startswith("Flex") for name in census), census


# --- MatMulInteger / QLinearMatMul ----------------------------------------------------------


# onnxruntime's x64 kernels for uint8 x int8 products on CPUs without AVX-512 VNNI add pairs
# of products in 16 bits, which saturate with full-range int8 weights: on an AVX2-only AMD
# EPYC its MatMulInteger was 21,320 away from the exact product. The spec's exact integer
# product (onnx.reference) is the reference for MatMulInteger instead.
def test_matmul_integer():
    """Scalar and per-column zero points; constant and run-time B; 1-D and batched
    operands; a K large enough to need digit splitting. (Per-row A zero points are not
    compared: onnxruntime, which these tests were first written against, has none.)"""
    a = ints(np.uint8, 2, 5, 40)
    a2 = ints(np.uint8, 5, 40)
    b_runtime = ints(np.uint8, 40, 7)
    big_a = ints(np.uint8, 3, 1200)
    big_b = np.where(rng.random((1200, 4)) < 0.5, -127, 127).astype(np.int8)
    vec = ints(np.uint8, 40)
    nodes = [
        helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["scalar_zero_points"]),
        helper.make_node("MatMulInteger", ["a2", "b", "az", "bz_cols"], ["per_column"]),
        helper.make_node("MatMulInteger", ["a", "b_runtime"], ["runtime_b"]),
        helper.make_node("MatMulInteger", ["big_a", "big_b"], ["large_k"]),
        helper.make_node("MatMulInteger", ["vec", "b", "az"], ["vector_a"]),
        helper.make_node("MatMulInteger", ["a2", "b_vec"], ["vector_b"]),
    ]
    init = {"b": ints(np.int8, 40, 7), "az": np.uint8(120), "bz": np.int8(3),
            "bz_cols": ints(np.int8, 7, low=-4, high=4),
            "big_b": big_b, "b_vec": ints(np.int8, 40)}
    inputs = {"a": a, "a2": a2, "b_runtime": b_runtime, "big_a": big_a, "vec": vec}
    check_nodes(nodes, inputs, init, opset=10, reference=reference_run)


def test_qlinear_matmul():
    a = ints(np.uint8, 2, 5, 30)
    ai = ints(np.int8, 4, 30)
    nodes = [
        helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                         ["uint8"]),
        helper.make_node("QLinearMatMul", ["ai", "as", "azi", "bi", "bsc", "bzc", "ys", "yzi"],
                         ["int8_per_column"]),
    ]
    init = {"as": np.float32(0.01), "az": np.uint8(120), "b": ints(np.uint8, 30, 7),
            "bs": np.float32(0.02), "bz": np.uint8(128), "ys": np.float32(0.3),
            "yz": np.uint8(128), "azi": np.int8(-2), "bi": ints(np.int8, 30, 6),
            "bsc": rng.uniform(0.01, 0.03, 6).astype(np.float32), "bzc": np.zeros(6, np.int8),
            "yzi": np.int8(5)}
    check_nodes(nodes, {"a": a, "ai": ai}, init, opset=21)


def test_dynamic_quantized_matmul_chain():
    """DynamicQuantizeLinear -> MatMulInteger with its run-time zero point, rescaled to
    float: the pattern of onnxruntime's quantize_dynamic."""
    x = rng.randn(3, 50, scale=2.0)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_float"], to=1),
        helper.make_node("Mul", ["s", "ws"], ["scale"]),
        helper.make_node("Mul", ["acc_float", "scale"], ["y"]),
    ]
    init = {"w": ints(np.int8, 50, 4), "ws": np.float32(0.01)}
    check_nodes(nodes, {"x": x}, init, outputs=["acc", "y"], reference=reference_run)
