"""The direct TFLite writer (onnx2tf_alt/tflite/direct.py) against onnxruntime and against
the TF route's file of the same plan: same outputs, same ops; what it does not cover goes
through TF's converter (auto) or stops with the node named (direct); a -dms CLI run it
covers imports no TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from dataclasses import replace

import numpy as np
import pytest

from onnx2tf_alt.ir.loader import load_model
from onnx2tf_alt.pipeline import plan_loaded, translate
from onnx2tf_alt.tflite.direct import DirectResult, NotCovered, write_direct
from onnx2tf_alt.tflite.lowering import tflite_bytes
from onnx2tf_alt.tflite.run import run_signature

from cli_runner import cli_env, manifest_files, run_cli, tree
from harness import (
    assert_close,
    both_routes,
    count_tflite_ops,
    make_model,
    node,
    ort_run,
    tflite_run,
)

RNG = np.random.default_rng(7)
MOBILENET = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")


def run_without_tensorflow(*args: str, timeout: int = 300) -> None:
    """The CLI with `args` in a fresh process, which must exit 0 without ever loading
    TensorFlow (this one may have it loaded)."""
    script = (
        "import sys\n"
        "from onnx2tf_alt.cli.main import main\n"
        f"code = main({list(map(str, args))!r})\n"
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=cli_env(), timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(autouse=True)
def _values_of_this_test(request):
    """Each test draws its own values, seeded by its name, whatever ran before it in this
    worker (under -n 2 the order differs from run to run)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONVS = [
    ({"pads": [1, 1, 1, 1]}, (8, 3, 3, 3)),  # TF SAME
    ({"pads": [1, 1, 1, 1], "strides": [2, 2]}, (8, 3, 3, 3)),  # explicit PAD
    ({"group": 2, "pads": [0, 1, 2, 1]}, (6, 2, 3, 2)),  # grouped filter, odd pads
    ({"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}, (8, 1, 3, 3)),  # depthwise x2
    ({"auto_pad": "SAME_UPPER", "strides": [2, 1]}, (5, 4, 3, 5)),
    ({"kernel_shape": [1, 1]}, (7, 4, 1, 1)),
    ({"group": 4, "pads": [3, 3, 3, 3]}, (4, 1, 7, 7)),  # 49 taps: bands of kernel rows
    ({"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}, (8, 1, 6, 5)),
    ({"group": 4, "pads": [3, 3, 3, 3], "strides": [2, 1]}, (4, 1, 7, 7)),  # bands, (2, 1)
]


@pytest.mark.parametrize(("attrs", "w_shape"), CONVS, ids=[str(a) for a, _ in CONVS])
@pytest.mark.parametrize("activation", ["Relu", "Clip6", "Clip"])
def test_conv_with_activation(attrs, w_shape, activation):
    channels = w_shape[1] * attrs.get("group", 1)
    x = rand(3, channels, 9, 11)
    inits = {"w": rand(*w_shape), "b": rand(w_shape[0])}
    nodes = [node("Conv", ["x", "w", "b"], "c", **attrs)]
    if activation == "Relu":
        nodes.append(node("Relu", ["c"], "y"))
    else:
        bounds = (0.0, 6.0) if activation == "Clip6" else (-0.5, 1.5)
        inits.update(low=np.float32(bounds[0]), high=np.float32(bounds[1]))
        nodes.append(node("Clip", ["c", "low", "high"], "y"))
    model = make_model(nodes, {"x": x}, ["y"], inits, input_shapes={"x": ["N", channels, 9, 11]})
    result = both_routes(model, {"x": x})
    census = count_tflite_ops(result.content)
    assert "RELU" not in census and "RELU6" not in census  # fused into the conv


@pytest.mark.parametrize(("between", "activation"), [
    ("TRANSPOSE", "RELU"), ("TRANSPOSE", "RELU6"), ("RESHAPE", "RELU"), (None, "RELU_N1_TO_1"),
    ("TRANSPOSE read elsewhere", "RELU"),  # the conv's own value is read: nothing fuses
])
def test_an_activation_goes_into_the_conv_through_a_move(between, activation):
    """direct_rewrites.fuse_activations: ShuffleNet V2's branch ends Conv -> Relu -> Concat
    -> channel shuffle, and the plan keeps the Relu channel-first, so the direct writer's
    graph holds CONV_2D -> TRANSPOSE -> RELU. The activation commutes with the TRANSPOSE (as
    with a lifted 1-D conv's RESHAPE) and goes into the conv, as TF's converter fuses it;
    the file computes the same values."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.direct import Part, _pack
    from onnx2tf_alt.tflite.direct_rewrites import rewrite
    from onnx2tf_alt.tflite.flatgraph import FlatGraph, options
    from onnx2tf_alt.tflite.run import run_signature

    x, w, b = rand(2, 5, 4, 3), rand(6, 1, 1, 3), rand(6)
    flat = FlatGraph()
    xt = flat.tensor("x", x.shape)
    c = flat.tensor("c", (2, 5, 4, 6))
    flat.op("CONV_2D", [xt, flat.tensor("w", w.shape, np.float32, w),
                        flat.tensor("b", b.shape, np.float32, b)], [c],
            options("Conv2DOptions", strideH=1, strideW=1))
    moved, expected = c, np.einsum("nhwc,oc->nhwo", x, w[:, 0, 0]) + b
    if between and between.startswith("TRANSPOSE"):
        moved = flat.tensor("t", (2, 6, 5, 4))
        flat.op("TRANSPOSE", [c, flat.tensor("perm", (4,), np.int32,
                                             np.array([0, 3, 1, 2], np.int32))], [moved])
        expected = expected.transpose(0, 3, 1, 2)
    elif between == "RESHAPE":
        moved = flat.tensor("t", (2, 20, 6))
        flat.op("RESHAPE", [c, flat.tensor("shape", (3,), np.int32,
                                           np.array([2, 20, 6], np.int32))], [moved])
        expected = expected.reshape(2, 20, 6)
    y = flat.tensor("y", flat.shape(moved))
    flat.op(activation, [moved], [y])
    low, high = {"RELU": (0, None), "RELU6": (0, 6), "RELU_N1_TO_1": (-1, 1)}[activation]
    expected = np.clip(expected, low, high)
    outputs = [y, c] if between and between.endswith("read elsewhere") else [y]
    rewrite(flat, outputs)
    names = [op.name for op in flat.operators]
    assert (activation in names) == (len(outputs) == 2), names
    content = _pack([Part("serving_default", flat, [xt], outputs, ["x"],
                          ["y", "c"][:len(outputs)])])
    got = run_signature(Interpreter(model_content=content), {"x": x})["y"]
    assert_close(got, expected, 1e-5, f"{between} {activation}")


@pytest.mark.parametrize(("attrs", "w_shape"), [
    ({"group": 4, "pads": [1, 2, 1, 2], "strides": [2, 1]}, (4, 1, 3, 5)),
    ({"group": 6, "auto_pad": "SAME_UPPER", "strides": [1, 2]}, (12, 1, 3, 3)),
    ({"group": 5, "strides": [3, 2]}, (5, 1, 3, 3)),
])
def test_depthwise_with_unequal_strides_is_one_op(attrs, w_shape):
    """A depthwise convolution whose row and column strides differ is one
    DEPTHWISE_CONV_2D with those strides (TFLite's and XNNPACK's kernels take them), not a
    stride-1 convolution subsampled by a SLICE: half the work for a (2, 1) one."""
    channels = attrs["group"]
    x = rand(2, channels, 10, 13)
    model = make_model([node("Conv", ["x", "w", "b"], "y", **attrs)], {"x": x}, ["y"],
                       {"w": rand(*w_shape), "b": rand(w_shape[0])})
    census = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert census.get("DEPTHWISE_CONV_2D") == 1, census
    assert not {"SLICE", "STRIDED_SLICE"} & set(census), census


@pytest.mark.parametrize("value", [0.0, -1.5])
def test_pad(value):
    """Swin's window padding: constant pads on the channel-last data."""
    x = rand(2, 3, 5, 6)
    inits = {"pads": np.array([0, 0, 1, 2, 0, 0, 3, 0], np.int64),
             "value": np.array(value, np.float32), "w": rand(4, 3, 1, 1)}
    nodes = [node("Conv", ["x", "w"], "c"), node("Pad", ["c", "pads", "value"], "p"),
             node("Relu", ["p"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    both_routes(model, {"x": x})


def test_a_pad_by_nothing_is_no_op():
    """Swin's window padding where the sizes are multiples of the window: zero pads."""
    x = rand(2, 3, 5, 6)
    nodes = [node("Conv", ["x", "w"], "c"), node("Pad", ["c", "pads"], "p"),
             node("Relu", ["p"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"pads": np.zeros(8, np.int64),
                                                "w": rand(4, 3, 1, 1)})
    assert "PAD" not in count_tflite_ops(both_routes(model, {"x": x}).content)


def test_tiled_depthwise_without_bias():
    x = rand(2, 6, 11, 9)
    model = make_model([node("Conv", ["x", "w"], "y", group=6, pads=[2, 3, 2, 3])], {"x": x},
                       ["y"], {"w": rand(6, 1, 5, 7)})
    both_routes(model, {"x": x})


def test_dense_pools_softmax():
    x = rand(2, 4, 12, 10)
    inits = {"w": rand(6, 4), "c": rand(6), "shape": np.array([2, -1], np.int64)}
    nodes = [
        node("MaxPool", ["x"], "m", kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
        node("AveragePool", ["m"], "a", kernel_shape=[2, 2], strides=[1, 1]),
        node("GlobalAveragePool", ["a"], "g"),
        node("Flatten", ["g"], "f"),
        node("Gemm", ["f", "w", "c"], "d", transB=1, alpha=0.5, beta=2.0),
        node("Softmax", ["d"], "y", axis=-1),
        node("GlobalMaxPool", ["x"], "gm"),
        node("Reshape", ["gm", "shape"], "r"),
    ]
    model = make_model(nodes, {"x": x}, ["y", "r"], inits)
    both_routes(model, {"x": x})


def test_matmul_keeps_leading_axes():
    x = rand(2, 5, 7)
    model = make_model([node("MatMul", ["x", "w"], "m"), node("Tanh", ["m"], "t"),
                        node("Sigmoid", ["t"], "y")], {"x": x}, ["y"], {"w": rand(7, 3)})
    both_routes(model, {"x": x})


def test_arithmetic_broadcasts_and_concatenates_in_a_tree():
    x, z = rand(2, 3, 5, 4), rand(2, 3, 5, 4)
    inits = {"per_channel": rand(1, 3, 1, 1), "row": rand(4), "half": np.float32(0.5)}
    nodes = [
        node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]),
        node("Add", ["c", "per_channel"], "a"),
        node("Sub", ["row", "a"], "s"),
        node("Mul", ["s", "z"], "m"),
        node("Div", ["m", "half"], "d"),
        node("Concat", ["d", "c", "a", "s", "m", "d", "c"], "cat", axis=1),
        node("Transpose", ["cat"], "y", perm=[0, 2, 3, 1]),
    ]
    inits["w"] = rand(3, 3, 3, 3)
    model = make_model(nodes, {"x": x, "z": z}, ["y"], inits)
    both_routes(model, {"x": x, "z": z})


@pytest.mark.parametrize("other", ["pair", "row", "full"])
def test_leading_unit_axes_stay_where_no_operand_restores_them(other):
    """A sequence [B, T, C] reshaped to an image [B, 1, T, C], then a QDQ pair (divided by
    its scale, a scalar) or a division by a row or by a 4-D value, then transposed to NCHW
    for a Conv (the PP-OCRv4 recognizer's neck): a RESHAPE adding leading unit axes may be
    read through only where another operand restores the rank. Through the pair's scalar
    the recognizer's CONV_2D got a 3-D tensor at run time."""
    x = rand(1, 5, 6)
    scaled = ([node("QuantizeLinear", ["r", "scale", "zero"], "q"),
               node("DequantizeLinear", ["q", "scale", "zero"], "d")] if other == "pair"
              else [node("Div", ["r", "operand"], "d")])
    nodes = [node("Reshape", ["x", "shape"], "r"), *scaled,
             node("Transpose", ["d"], "t", perm=[0, 3, 1, 2]),
             node("Conv", ["t", "w"], "y")]
    inits = {"shape": np.array([1, 1, 5, 6], np.int64), "w": rand(4, 6, 1, 1),
             "scale": np.float32(0.02), "zero": np.uint8(128),
             "operand": rand(6) if other == "row" else rand(1, 1, 5, 6)}
    model = make_model(nodes, {"x": x}, ["y"], inits)
    both_routes(model, {"x": x})


POOLS = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # edges
    ("MaxPool", {"kernel_shape": [2, 2], "pads": [1, 0, 1, 0]}),  # the lowest value
    ("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1}),
]


@pytest.mark.parametrize(("op", "attrs"), POOLS, ids=[f"{o}{a}" for o, a in POOLS])
def test_pools_with_pads(op, attrs):
    x = rand(2, 3, 9, 10)
    model = make_model([node(op, ["x"], "y", **attrs)], {"x": x}, ["y"])
    both_routes(model, {"x": x})


def test_norms_reductions_and_hard_activations():
    x = rand(2, 5, 6, 7)
    inits = {"scale": rand(5) + 2, "bias": rand(5), "mean": rand(5), "var": rand(5) ** 2 + 0.5,
             "axes": np.array([1, 3], np.int64)}
    nodes = [
        node("Concat", ["x", "x"], "c", axis=1),  # no conv to fold the normalization into
        node("Slice", ["c", "starts", "ends", "slice_axes"], "s"),
        node("BatchNormalization", ["s", "scale", "bias", "mean", "var"], "b", epsilon=1e-3),
        node("HardSwish", ["b"], "h"),
        node("HardSigmoid", ["h"], "g0", alpha=0.3, beta=0.4),
        node("LeakyRelu", ["g0"], "g", alpha=0.3),
        node("ReduceMean", ["g", "axes"], "y", keepdims=0),
        node("ReduceMax", ["g", "axes"], "z", keepdims=1),
    ]
    inits.update(starts=np.array([2, -5], np.int64), ends=np.array([7, 100], np.int64),
                 slice_axes=np.array([1, 3], np.int64))
    model = make_model(nodes, {"x": x}, ["y", "z"], inits)
    both_routes(model, {"x": x})


def test_a_transformer_block():
    """Patch embedding, class-token slice, LayerNorm, attention with K^T, Gelu: a ViT's ops."""
    x = rand(2, 3, 8, 8)
    d = 8
    inits = {"patch": rand(d, 3, 4, 4), "shape": np.array([2, d, 4], np.int64),
             "gamma": rand(d), "beta": rand(d), "wq": rand(d, d), "wk": rand(d, d),
             "wv": rand(d, d), "bq": rand(d), "zero": np.array(0, np.int64), "one": np.array([1], np.int64)}
    nodes = [
        node("Conv", ["x", "patch"], "p", strides=[4, 4]),
        node("Reshape", ["p", "shape"], "r"),
        node("Transpose", ["r"], "t", perm=[0, 2, 1]),
        node("LayerNormalization", ["t", "gamma", "beta"], "n", axis=-1, epsilon=1e-6),
        node("MatMul", ["n", "wq"], "q0"),
        node("Add", ["q0", "bq"], "q"),  # a Linear's bias: folded into FULLY_CONNECTED
        node("MatMul", ["n", "wk"], "k"),
        node("MatMul", ["n", "wv"], "v"),
        node("Transpose", ["k"], "kt", perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], "scores"),
        node("Softmax", ["scores"], "attn", axis=-1),
        node("MatMul", ["attn", "v"], "o"),
        node("Gelu", ["o"], "gelu"),
        node("Gather", ["gelu", "zero"], "first", axis=1),
        node("Unsqueeze", ["first", "one"], "y"),
        node("Squeeze", ["y", "one"], "z"),
    ]
    model = make_model(nodes, {"x": x}, ["y", "z"], inits, opset=20)
    both_routes(model, {"x": x}, tol=2e-5)


SPLITS = [  # (opset, attributes, sizes input, input shape)
    (13, {"axis": 1}, [2, 3, 1], (2, 6, 5, 4)),  # unequal channels: a SLICE each
    (13, {"axis": -1}, None, (3, 6, 5, 4)),  # two equal parts: one SPLIT
    (11, {"axis": 2, "split": [1, 4]}, None, (2, 6, 5, 4)),
    (18, {"axis": 1, "num_outputs": 4}, None, (1, 7, 5, 4)),  # the last chunk smaller
]


@pytest.mark.parametrize(("opset", "attrs", "sizes", "shape"), SPLITS,
                         ids=[f"opset{o}-{a}" for o, a, _, _ in SPLITS])
def test_split_after_a_conv(opset, attrs, sizes, shape):
    """Split of a channel-last value (a Conv's output), each part used on its own."""
    x, count = rand(*shape), len(sizes or attrs.get("split", [])) or attrs.get("num_outputs", 2)
    inits = {"w": rand(shape[1], shape[1], 1, 1)}
    inputs = ["c"]
    if sizes is not None:
        inits["sizes"] = np.array(sizes, np.int64)
        inputs.append("sizes")
    parts = [f"p{i}" for i in range(count)]
    nodes = [node("Conv", ["x", "w"], "c"), node("Split", inputs, parts, **attrs),
             *[node("Relu", [p], f"y{i}") for i, p in enumerate(parts)]]
    model = make_model(nodes, {"x": x}, [f"y{i}" for i in range(count)], inits, opset=opset)
    both_routes(model, {"x": x})


RESIZES = [  # (opset, attributes, scales, sizes)
    (13, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
          "nearest_mode": "floor"}, [1, 1, 2, 2], None),  # torch's Upsample(nearest)
    (13, {"mode": "linear"}, [1, 1, 2, 3], None),  # half_pixel
    (13, {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None,
     [2, 4, 9, 5]),
    (13, {"mode": "nearest"}, None, [2, 4, 5, 7]),  # the input's sizes: no resize
    (9, {"mode": "nearest"}, [1, 1, 2, 2], None),  # Upsample
]


@pytest.mark.parametrize(("opset", "attrs", "scales", "sizes"), RESIZES,
                         ids=[f"opset{o}-{a['mode']}-{s or z}" for o, a, s, z in RESIZES])
def test_resize_after_a_conv(opset, attrs, scales, sizes):
    x = rand(2, 4, 5, 7)
    inits = {"w": rand(4, 4, 1, 1)}
    if opset < 11:
        inits["scales"] = np.array(scales, np.float32)
        resize = node("Upsample", ["c", "scales"], "r", **attrs)
    else:
        inits.update(roi=np.zeros(0, np.float32), scales=np.array(scales or [], np.float32))
        if sizes is not None:
            inits["sizes"] = np.array(sizes, np.int64)
        resize = node("Resize", ["c", "roi", "scales", *(["sizes"] if sizes else [])], "r",
                      **attrs)
    nodes = [node("Conv", ["x", "w"], "c"), resize, node("Relu", ["r"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], inits, opset=opset)
    result = both_routes(model, {"x": x})
    resizes = count_tflite_ops(result.content)
    assert resizes.get("RESIZE_NEAREST_NEIGHBOR", 0) + resizes.get("RESIZE_BILINEAR", 0) == (
        sizes != [2, 4, 5, 7]), resizes


STRIDED = [  # (starts, ends, axes, steps) on a Conv's [2, 4, 7, 6] output
    ([0, 1], [100, 100], [2, 3], [2, 2]),  # Swin's patch merging x[..., 0::2, 1::2]
    ([1, 0, 2], [3, 7, 5], [1, 2, 3], [1, 3, 2]),  # a short last block: PAD
    ([-6], [-1], [-1], [4]),  # negative bounds
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), STRIDED,
                         ids=[str(s) for *_, s in STRIDED])
def test_strided_slice_after_a_conv(starts, ends, axes, steps):
    x = rand(2, 4, 7, 6)
    inits = {"w": rand(4, 4, 1, 1), "starts": np.array(starts, np.int64),
             "ends": np.array(ends, np.int64), "axes": np.array(axes, np.int64),
             "steps": np.array(steps, np.int64)}
    nodes = [node("Conv", ["x", "w"], "c"),
             node("Slice", ["c", "starts", "ends", "axes", "steps"], "s"),
             node("Relu", ["s"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    assert "STRIDED_SLICE" not in count_tflite_ops(both_routes(model, {"x": x}).content)


def test_conv_split_for_the_cpu_cache(monkeypatch):
    """A conv whose weights pass conv.SPLIT_ABOVE (lowered here) runs as CONV_2Ds over
    slices of the output channels joined by a tree of CONCATENATIONs, as on the TF route."""
    from onnx2tf_alt.ops import conv as conv_module

    x, w = rand(2, 8, 9, 7), rand(256, 8, 3, 3)
    monkeypatch.setattr(conv_module, "SPLIT_ABOVE", w.nbytes - 1)
    monkeypatch.setattr(conv_module, "CACHE_BYTES", w.nbytes // 8)  # 8 slices of 32
    nodes = [node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Relu", ["c"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": rand(256)})
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert (ops["CONV_2D"], ops["CONCATENATION"]) == (8, 3), ops


def test_unary_functions_extrema_and_powers():
    x, z = rand(2, 3, 4, 5), rand(2, 3, 4, 5)
    inits = {"one": np.array(1, np.float32), "two": np.array([2], np.float32),
             "half": np.array(0.5, np.float32), "three": np.array(3, np.float32)}
    nodes = [
        node("Abs", ["x"], "a"), node("Add", ["a", "one"], "a1"), node("Log", ["a1"], "l"),
        node("Sqrt", ["a1"], "s"), node("Neg", ["l"], "n"), node("Exp", ["n"], "e"),
        node("Sin", ["e"], "si"), node("Cos", ["s"], "co"),
        node("Max", ["si", "z"], "mx"), node("Min", ["co", "mx"], "mn"),
        node("Pow", ["mn", "two"], "p2"), node("Pow", ["e", "half"], "ph"),
        node("Pow", ["a1", "three"], "p3"), node("Mul", ["x", "three"], "x3"),
        node("Floor", ["x3"], "f"), node("Ceil", ["x3"], "c"), node("Round", ["x3"], "r"),
        node("Sign", ["x"], "sg"),
    ]
    outputs = ["p2", "ph", "p3", "f", "c", "r", "sg"]
    model = make_model(nodes, {"x": x, "z": z}, outputs, inits)
    both_routes(model, {"x": x, "z": z})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode):
    x = rand(2, 8, 3, 5)
    nodes = [node("Conv", ["x", "w"], "c"), node("Relu", ["c"], "r"),
             node("DepthToSpace", ["r"], "d", blocksize=2, mode=mode),
             node("SpaceToDepth", ["d"], "y", blocksize=2,
                  **({"mode": mode} if mode == "CRD" else {}))]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rand(8, 8, 1, 1)},
                       opset=28 if mode == "CRD" else 13)
    both_routes(model, {"x": x})


@pytest.mark.parametrize("slope_shape", [(6, 1, 1), (1,), (1, 6, 1, 1)])
def test_prelu_after_a_conv(slope_shape):
    x = rand(2, 4, 5, 7)
    nodes = [node("Conv", ["x", "w"], "c"), node("PRelu", ["c", "slope"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rand(6, 4, 3, 3),
                                                "slope": rand(*slope_shape) * 0.3})
    assert count_tflite_ops(both_routes(model, {"x": x}).content).get("PRELU") == 1


CONV_TRANSPOSES = [  # (attributes, ONNX weight shape, written as output phases)
    ({"strides": [2, 2]}, (4, 6, 2, 2), True),  # a U-Net's up-sampling
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 3, 4, 4), True),
    ({"strides": [2, 1], "pads": [1, 1, 1, 1], "dilations": [1, 2]}, (4, 5, 3, 3), False),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (4, 3, 3, 3), True),
    ({"strides": [3, 2], "pads": [0, 2, 1, 0], "output_padding": [2, 1]}, (4, 2, 2, 3), False),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (4, 3, 3, 3), True),
    ({"strides": [2, 2], "output_shape": [11, 12]}, (4, 3, 3, 3), True),
    ({"strides": [2, 3], "auto_pad": "SAME_UPPER"}, (4, 3, 3, 3), False),
]


@pytest.mark.parametrize(("attrs", "w_shape", "phases"), CONV_TRANSPOSES,
                         ids=[str(a) for a, _, _ in CONV_TRANSPOSES])
def test_conv_transpose_with_bias(attrs, w_shape, phases):
    """One TRANSPOSE_CONV, or, where passes/deconv_phases.py takes it, convolutions of the
    output phases and one DEPTH_TO_SPACE: the same values on both routes."""
    x = rand(2, 4, 5, 6)
    nodes = [node("ConvTranspose", ["x", "w", "b"], "t", **attrs), node("Relu", ["t"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rand(*w_shape), "b": rand(w_shape[1])})
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert (ops.get("TRANSPOSE_CONV"), ops.get("DEPTH_TO_SPACE")) == (
        (None, 1) if phases else (1, None)), ops


CONV_1D = [  # (attributes, ONNX weight shape) on x [2, 6, 11]
    ({"pads": [1, 1]}, (8, 6, 3)),
    ({"strides": [2], "dilations": [2], "pads": [2, 1]}, (4, 6, 3)),
    ({"group": 2, "auto_pad": "SAME_UPPER"}, (4, 3, 4)),
    ({"group": 6, "strides": [2], "pads": [2, 2]}, (12, 1, 5)),  # depthwise, multiplier 2
    ({"group": 6, "dilations": [3], "pads": [3, 3]}, (6, 1, 3)),
]


@pytest.mark.parametrize(("attrs", "w_shape"), CONV_1D, ids=[str(a) for a, _ in CONV_1D])
def test_conv_1d(attrs, w_shape):
    x = rand(2, 6, 11)
    nodes = [node("Conv", ["x", "w", "b"], "c", **attrs), node("Relu", ["c"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rand(*w_shape), "b": rand(w_shape[0])})
    both_routes(model, {"x": x})


def test_the_same_computation_twice_is_written_once():
    """Two nodes computing the same (a square root as Sqrt and as Pow 0.5; two reshapes of
    one value to one shape): one op each, as TF's converter merges them."""
    x = rand(2, 3, 4, 5)
    inits = {"half": np.array(0.5, np.float32), "shape": np.array([2, 12, 5], np.int64)}
    nodes = [node("Abs", ["x"], "a"), node("Sqrt", ["a"], "s"), node("Pow", ["a", "half"], "p"),
             node("Reshape", ["s", "shape"], "r1"), node("Reshape", ["s", "shape"], "r2"),
             node("Add", ["r1", "r2"], "y"), node("Mul", ["s", "p"], "z")]
    model = make_model(nodes, {"x": x}, ["y", "z"], inits)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops["SQRT"] == 1 and ops.get("RESHAPE", 0) <= 1, ops


def test_a_constant_infinity_is_kept():
    """TF's converter stores an infinite constant as the largest float (the TF route's
    handler works around it); the direct file holds the infinity itself."""
    x = rand(2, 6)
    mask = np.where(np.arange(6) % 2, -np.inf, 0).astype(np.float32)
    model = make_model([node("Add", ["x", "mask"], "y")], {"x": x}, ["y"], {"mask": mask})
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan)
    got = tflite_run(replace(translate(planned), result=result, _tflite_result=result),
                     {"x": x}, result.content)[0]
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])


UNCOVERED = "(CumProd): tf.math.cumprod in the direct writer"  # the Recorder has none


def uncovered_model():
    """Relu, then a CumProd over 80 values, whose handler calls tf.math.cumprod (a Select TF
    op in TFLite), which the Recorder lacks."""
    x = np.random.default_rng(3).uniform(0.9, 1.1, (2, 80)).astype(np.float32)
    return make_model([node("Relu", ["x"], "r"), node("CumProd", ["r", "axis"], "y")],
                      {"x": x}, ["y"], {"axis": np.array(1, np.int64)}, opset=26)


def test_what_is_not_covered_is_named():
    planned = plan_loaded(load_model(None, uncovered_model()))
    result = write_direct(planned.graph, planned.plan)
    assert isinstance(result, NotCovered)
    assert UNCOVERED in str(result), str(result)
    grouped = make_model([node("Conv", ["x4", "w"], "y", group=2)], {"x4": rand(1, 4, 5, 5)},
                         ["y"], {"w": rand(4, 2, 3, 3)})
    planned = plan_loaded(load_model(None, grouped))
    assert isinstance(write_direct(planned.graph, planned.plan), DirectResult)


@pytest.fixture(scope="module")
def uncovered_path(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("cumprod") / "cumprod.onnx"
    onnx.save(uncovered_model(), path)
    return path


def test_cli_auto_falls_back_to_tf_and_says_so(uncovered_path, tmp_path):
    code, out = run_cli("-i", uncovered_path, "-o", tmp_path / "out", "-dms", "-v", "info")
    assert code == 0, out
    assert "direct TFLite writer: node" in out and "converting with TF" in out
    assert {"cumprod_float32.tflite", "cumprod_float16.tflite"} <= set(tree(tmp_path / "out"))


def test_cli_direct_refuses_what_it_does_not_cover(uncovered_path, tmp_path):
    code, out = run_cli("-i", uncovered_path, "-o", tmp_path / "out", "-dms",
                        "--tflite_writer", "direct")
    assert code == 1, out
    assert UNCOVERED in out, out
    assert not os.path.exists(tmp_path / "out" / "cumprod_float32.tflite")
    code, out = run_cli("-i", uncovered_path, "-o", tmp_path / "out2", "--tflite_writer",
                        "direct", "-osm")
    assert code == 2 and "leave out -osm" in out, out


def test_cli_run_imports_no_tensorflow_and_matches_the_tf_route(tmp_path):
    """mobilenet_block with -dms: the direct files, in a process that never loads TF; the
    float32 file runs like the TF route's, its io_layout and signature are the same."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature

    run_without_tensorflow("-i", MOBILENET, "-o", tmp_path / "direct", "-dms", "-n")
    code, out = run_cli("-i", MOBILENET, "-o", tmp_path / "tf", "-dms", "--tflite_writer", "tf",
                        "-n")
    assert code == 0, out
    stem = "mobilenet_block"
    assert manifest_files(tmp_path / "direct", stem) == manifest_files(tmp_path / "tf", stem)
    layouts = [json.loads((tmp_path / f / f"{stem}_io_layout.json").read_text())
               for f in ("direct", "tf")]
    assert layouts[0] == layouts[1]
    feeds = {"image": rand(3, 64, 64, 3)}
    for suffix, tol in (("float32", 1e-6), ("float16", 1e-2)):
        runs = [run_signature(Interpreter(model_path=str(tmp_path / f / f"{stem}_{suffix}.tflite")),
                              feeds)["logits"] for f in ("direct", "tf")]
        assert_close(runs[0], runs[1], tol, suffix)


@pytest.mark.parametrize(("scaling", "folds"), [
    (None, True), ("MUL", True), ("DIV", True),
    ("MUL by a matrix", False),  # not one value: the TRANSPOSE stays
    ("read elsewhere", False),  # the transposed value is an output too
])
def test_a_transposed_key_folds_into_the_product(scaling, folds):
    """direct_rewrites.transposed_operands on the form GPT-2's exported attention leaves in
    the direct writer's graph: the key cache transposed on its last two axes, scaled by a
    constant, multiplied by q. Folded, the BATCH_MATMUL reads the cache with adjY and no
    TRANSPOSE is left (as TF's converter folds it); the file computes q @ (k^T * c)."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.direct import Part, _pack
    from onnx2tf_alt.tflite.direct_rewrites import rewrite
    from onnx2tf_alt.tflite.flatgraph import FlatGraph, options
    from onnx2tf_alt.tflite.run import run_signature

    q, k = rand(2, 4, 6, 8), rand(2, 4, 5, 8)
    c = rand(1, 1, 8, 5) if scaling == "MUL by a matrix" else np.float32(0.35)
    flat = FlatGraph()
    xq, xk = flat.tensor("q", q.shape), flat.tensor("k", k.shape)
    kt = flat.tensor("kt", (2, 4, 8, 5))
    flat.op("TRANSPOSE", [xk, flat.tensor("perm", (4,), np.int32, np.array([0, 1, 3, 2],
                                                                          np.int32))], [kt])
    operand, outputs = kt, []
    if scaling not in (None, "read elsewhere"):
        operand = flat.tensor("ks", (2, 4, 8, 5))
        name = scaling.split()[0]
        flat.op(name, [kt, flat.tensor("c", np.shape(c), np.float32, c)], [operand],
                options(f"{name.title()}Options"))
    y = flat.tensor("y", (2, 4, 6, 5))
    flat.op("BATCH_MATMUL", [xq, operand], [y], options("BatchMatMulOptions"))
    outputs = [y, kt] if scaling == "read elsewhere" else [y]
    rewrite(flat, outputs)
    names = [op.name for op in flat.operators]
    assert ("TRANSPOSE" not in names) == folds, names
    content = _pack([Part("serving_default", flat, [xq, xk], outputs, ["q", "k"],
                          ["y", "kt"][:len(outputs)])])
    got = run_signature(Interpreter(model_content=content), {"q": q, "k": k})["y"]
    scaled = np.swapaxes(k, -1, -2)
    if scaling == "DIV":
        scaled = scaled / c
    elif scaling is not None and scaling != "read elsewhere":
        scaled = scaled * c
    assert_close(got, q @ scaled, 1e-5, str(scaling))


def _lcnet_block(kernel: int, shift) -> tuple:
    """PP-LCNet's block as Paddle2ONNX writes it: conv, hard-swish as Add 3 / Clip / Mul /
    Div 6, a learnable scale and shift, then a `kernel` x `kernel` conv (SAME pads)."""
    c, c2 = 6, 5
    shift = np.asarray(shift, np.float32)
    shift = shift.reshape(-1, 1, 1) if shift.ndim else shift  # one per channel (NCHW)
    init = {"w1": rand(c, 3, 3, 3) * 0.3, "b1": rand(c) * 0.1, "three": np.float32(3),
            "zero": np.float32(0), "six": np.float32(6), "a": np.float32(0.47),
            "b": shift, "w2": rand(c2, c, kernel, kernel) * 0.3,
            "b2": rand(c2) * 0.1}
    nodes = [node("Conv", ["x", "w1", "b1"], "h", pads=[1, 1, 1, 1]),
             node("Add", ["h", "three"], "h3"), node("Clip", ["h3", "zero", "six"], "r"),
             node("Mul", ["h", "r"], "hr"), node("Div", ["hr", "six"], "hs"),
             node("Mul", ["a", "hs"], "ha")]
    pad = kernel // 2
    nodes += [node("Add", ["ha", "b"], "hb"),
              node("Conv", ["hb", "w2", "b2"], "y", pads=[pad] * 4)]
    return nodes, init


@pytest.mark.parametrize(("kernel", "shift", "ops"), [
    # the shift into the pointwise conv's bias, then the scale a into its filter
    (1, 0.31, {"CONV_2D": 2, "HARD_SWISH": 1}),
    (1, [0.1, -0.2, 0.3, 0.05, -0.4, 0.7], {"CONV_2D": 2, "HARD_SWISH": 1}),
    # a 3x3 window pads with zeros, not with the shift: the ADD stays, and the MUL before it
    (3, 0.31, {"CONV_2D": 2, "HARD_SWISH": 1, "ADD": 1, "MUL": 1}),
])
def test_a_hard_swish_scale_and_shift_fold_as_tf_folds_them(kernel, shift, ops):
    """direct_rewrites.constant_divisions, hard_swishes, shifts_into_pointwise and
    scales_into_convolutions on PP-LCNet's block (the PP-OCR text detector's backbone):
    x * relu6(x + 3) / 6 one HARD_SWISH (TF's converter, which merges the / 6 with the
    learnable scale first, writes ADD, MUL and MUL), the shift and the scale folded into a
    following 1x1 conv. The file matches onnxruntime and TF's route's file (1e-6), with
    fewer ops (harness.both_routes)."""
    nodes, init = _lcnet_block(kernel, shift)
    x = rand(2, 3, 9, 7)
    model = make_model(nodes, {"x": x}, ["y"], initializers=init)
    assert count_tflite_ops(both_routes(model, {"x": x}).content) == ops  # Clip: a fused RELU6


HARD_SWISHES = {  # x * relu6(x + 3) / 6 as exporters write it, x the value "h"
    "tf2onnx": [node("Add", ["h", "three"], "h3"), node("Clip", ["h3", "zero", "six"], "r"),
                node("Mul", ["r", "sixth"], "rs"), node("Mul", ["h", "rs"], "hs")],
    "torch_div": [node("Add", ["h", "three"], "h3"), node("Clip", ["h3", "zero", "six"], "r"),
                  node("Mul", ["h", "r"], "hr"), node("Div", ["hr", "six"], "hs")],
    "gate_first": [node("Add", ["three", "h"], "h3"), node("Clip", ["h3", "zero", "six"], "r"),
                   node("Div", ["r", "six"], "rs"), node("Mul", ["rs", "h"], "hs")],
    "hard_sigmoid": [node("HardSigmoid", ["h"], "r", alpha=1 / 6, beta=0.5),
                     node("Mul", ["h", "r"], "hs")],
}


@pytest.mark.parametrize("form", HARD_SWISHES)
@pytest.mark.parametrize("then", ["Conv", "MaxPool"])
def test_each_form_of_hard_swish_is_one_op(form, then):
    """direct_rewrites.hard_swishes: every order of x * relu6(x + 3) / 6 and x *
    HardSigmoid(x) (torch's hard-swish before opset 14) between two convs is one HARD_SWISH
    (TF's converter fuses only tf2onnx's order, and only where the / 6 is not folded into
    the next conv first); the file matches onnxruntime and TF's route's (1e-6)."""
    x = rand(2, 3, 9, 7)
    init = {"w1": rand(6, 3, 3, 3), "three": np.float32(3), "zero": np.float32(0),
            "six": np.float32(6), "sixth": np.float32(1 / 6), "w2": rand(5, 6, 1, 1)}
    last = (node("Conv", ["hs", "w2"], "y") if then == "Conv"
            else node("MaxPool", ["hs"], "y", kernel_shape=[2, 2]))
    nodes = [node("Conv", ["x", "w1"], "h", pads=[1, 1, 1, 1]), *HARD_SWISHES[form], last]
    model = make_model(nodes, {"x": x}, ["y"], initializers=init, opset=13)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops == {"CONV_2D": 1 + (then == "Conv"), "HARD_SWISH": 1,
                   **({"MAX_POOL_2D": 1} if then == "MaxPool" else {})}, ops


@pytest.mark.parametrize(("change", "value"), [("sixth", 0.2), ("three", 2.5)])
def test_a_near_hard_swish_stays_what_it_is(change, value):
    """Another constant than 1 / 6 or 3, or a HardSigmoid of TF's default slope: no
    HARD_SWISH."""
    x = rand(2, 3, 9, 7)
    init = {"w1": rand(6, 3, 3, 3), "three": np.float32(3), "zero": np.float32(0),
            "six": np.float32(6), "sixth": np.float32(1 / 6), change: np.float32(value)}
    nodes = [node("Conv", ["x", "w1"], "h", pads=[1, 1, 1, 1]), *HARD_SWISHES["tf2onnx"],
             node("HardSigmoid", ["hs"], "g"), node("Mul", ["hs", "g"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], initializers=init, opset=13)
    assert "HARD_SWISH" not in count_tflite_ops(both_routes(model, {"x": x}).content)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_scale_folds_into_a_depthwise_conv_with_a_multiplier(per_channel):
    """scales_into_convolutions on a depthwise conv of channel multiplier 2 and SAME pads:
    input channel i feeds output channels 2i and 2i + 1, whose filter taps take its scale."""
    scale = (rand(4, 1, 1) if per_channel else np.float32(-0.7))
    x = rand(2, 3, 7, 6)
    init = {"w1": rand(4, 3, 1, 1), "s": scale, "w2": rand(8, 1, 3, 3), "b2": rand(8)}
    model = make_model([node("Conv", ["x", "w1"], "h"), node("Relu", ["h"], "r"),
                        node("Mul", ["r", "s"], "m"),
                        node("Conv", ["m", "w2", "b2"], "y", group=4, pads=[1, 1, 1, 1])],
                       {"x": x}, ["y"], initializers=init)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops == {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1}, ops


@pytest.mark.parametrize(("last", "dropped"), [
    ("shift of zeros", True),  # ViT's final LayerNorm at initialization
    ("scale of ones", True),  # T5's final RMSNorm weight at initialization
    ("scale of twos", False),
    ("broadcasting zeros", False),  # (1, 5, 6) + (3, 1, 1) zeros: the shape changes
])
def test_a_neutral_last_op_gives_its_output_to_the_op_before(last, dropped):
    """direct_rewrites.drop_logical_identities where the ADD of zeros or MUL by ones is the
    model's output: the op before it writes the output (as TF's converter folds it)."""
    x = rand(1, 5, 6)
    value = {"shift of zeros": 0.0, "scale of ones": 1.0, "scale of twos": 2.0,
             "broadcasting zeros": 0.0}[last]
    shape = (3, 1, 1) if last == "broadcasting zeros" else (6,)
    op = "Add" if "zeros" in last else "Mul"
    model = make_model([node("MatMul", ["x", "w"], "h"), node("Tanh", ["h"], "t"),
                        node(op, ["t", "c"], "y")], {"x": x}, ["y"],
                       initializers={"w": rand(6, 6), "c": np.full(shape, value, np.float32)})
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert (op.upper() not in ops) == dropped, ops


@pytest.mark.parametrize("batch", [1, 3])
def test_a_linear_between_two_reshapes_is_one_dense_op(batch):
    """direct_rewrites.kept_dims_into_dense: GPT-2's Conv1D as exported, Reshape to rows ->
    Gemm -> Reshape back, is one FULLY_CONNECTED keeping the input's dims (as TF's
    converter writes it); no RESHAPE is left."""
    x = rand(batch, 5, 8)
    init = {"w": rand(8, 6), "b": rand(6), "rows": np.array([-1, 8], np.int64),
            "back": np.array([batch, 5, 6], np.int64)}
    model = make_model([node("Reshape", ["x", "rows"], "r"),
                        node("Gemm", ["r", "w", "b"], "g"),
                        node("Reshape", ["g", "back"], "h"), node("Tanh", ["h"], "y")],
                       {"x": x}, ["y"], initializers=init)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops == {"FULLY_CONNECTED": 1, "TANH": 1}, ops


@pytest.mark.parametrize("before", [True, False])
def test_a_reshape_after_a_linear_moves_before_it(before):
    """direct_rewrites.reshapes_before_dense: Swin's window attention reshapes the tokens,
    projects them and reshapes the result back (keeping the channels last): the second
    RESHAPE moves before the FULLY_CONNECTED and merges with the first (one RESHAPE, as
    TF's converter writes it; without a first one, still one)."""
    x = rand(2, 12, 8)
    init = {"w": rand(8, 6), "a": np.array([2, 3, 4, 8], np.int64),
            "b": np.array([6, 4, 6], np.int64)}
    nodes = [node("Reshape", ["x", "a"], "r")] if before else []
    nodes += [node("MatMul", ["r" if before else "x", "w"], "h"),
              node("Reshape", ["h", "b"], "o"), node("Tanh", ["o"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], initializers=init)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops == {"RESHAPE": 1, "FULLY_CONNECTED": 1, "TANH": 1}, ops


@pytest.mark.parametrize("values", [300, 9000])  # 1.2 KB, 36 KB
def test_ops_with_equal_constants_of_kilobytes_are_merged(values):
    """direct_rewrites.merge_duplicates compares constants up to 64 KB by value: an
    unrolled LSTM's per-layer shape constants (2 KB) made each layer's shape ops again."""
    x = rand(2, values)
    c = rand(values)
    model = make_model([node("Add", ["x", "c1"], "a1"), node("Add", ["x", "c2"], "a2"),
                        node("Mul", ["a1", "a2"], "y")], {"x": x}, ["y"],
                       initializers={"c1": c, "c2": c.copy()})
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops == {"ADD": 1, "MUL": 1}, ops


def test_a_reshape_to_its_own_shape_is_dropped_where_others_read_its_input():
    """direct_rewrites.merge_reshapes: SegFormer's stage output is reshaped to an image for
    the next stage and 'to tokens' (its own shape) for the decode head: the second RESHAPE
    goes, its reader reads the value itself."""
    x = rand(1, 12, 4)
    init = {"image": np.array([1, 3, 4, 4], np.int64), "tokens": np.array([1, 12, 4], np.int64),
            "w": rand(4, 5), "g": rand(4)}
    model = make_model([node("Mul", ["x", "g"], "n"),
                        node("Reshape", ["n", "image"], "img"), node("Relu", ["img"], "y1"),
                        node("Reshape", ["n", "tokens"], "t"), node("MatMul", ["t", "w"], "y2")],
                       {"x": x}, ["y1", "y2"], initializers=init)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops.get("RESHAPE") == 1, ops


@pytest.mark.parametrize(("flat_shape", "activation", "folds"), [
    ([-1, 6], None, True),  # LeViT: Linear -> Flatten(0, 1) -> BatchNorm1d -> Reshape back
    ([-1, 6], "Relu", True),
    ([2, 30], None, False),  # the channel axis is not last after the reshape: stays
])
def test_a_batch_norm_after_a_reshape_of_a_linear_goes_into_it(flat_shape, activation, folds):
    """direct_rewrites.fold_affine through a RESHAPE that keeps the last axis: a MatMul's
    (N, T, C) output flattened to (N*T, C), batch-normalized and reshaped back is one
    FULLY_CONNECTED (LeViT: 510 ops -> 320, TF's converter 393)."""
    x = rand(2, 5, 8)
    channels = flat_shape[-1] if flat_shape[-1] > 0 else 6
    init = {"w": rand(8, 6), "b": rand(6), "flat": np.array(flat_shape, np.int64),
            "back": np.array([2, 5, 6], np.int64), "g": rand(channels),
            "beta": rand(channels), "mean": rand(channels),
            "var": np.abs(rand(channels)) + 0.5}
    nodes = [node("MatMul", ["x", "w"], "h"), node("Add", ["h", "b"], "hb"),
             node("Reshape", ["hb", "flat"], "f"),
             node("BatchNormalization", ["f", "g", "beta", "mean", "var"], "n")]
    if activation:
        nodes.append(node(activation, ["n"], "a"))
    nodes.append(node("Reshape", ["a" if activation else "n", "back"], "y"))
    model = make_model(nodes, {"x": x}, ["y"], initializers=init)
    ops = count_tflite_ops(both_routes(model, {"x": x}).content)
    assert ops.get("FULLY_CONNECTED") == 1, ops
    assert (not {"MUL", "ADD", "RELU"} & set(ops)) == folds, ops


@pytest.mark.parametrize(("bias", "activation", "attrs"), [
    (True, "Relu", {"strides": [2, 3]}),  # (equal strides: passes/deconv_phases.py)
    (False, None, {"strides": [3, 2]}),
    (True, "Clip", {"strides": [2, 3], "pads": [1, 0, 1, 0], "kernel_shape": [3, 3]}),
])
def test_a_transposed_conv_takes_its_bias_batch_norm_and_activation(bias, activation, attrs):
    """direct_rewrites.fold_affine on ConvTranspose -> BatchNormalization [-> Relu / Clip
    0..6]: the bias, the norm's scale and shift and the activation go into one
    TRANSPOSE_CONV (version 3 with a bias, 4 with a fused activation, as TF's converter
    writes it); XNNPACK and TFLite's reference kernels both give onnxruntime's outputs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from onnx2tf_alt.tflite.flatbuffer import unpack_model
    from onnx2tf_alt.tflite.run import run_signature

    x = rand(2, 4, 5, 7)
    kernel = attrs.get("kernel_shape", [2, 2])
    init = {"w": rand(4, 3, *kernel), "scale": rand(3) + 1.5, "shift": rand(3),
            "mean": rand(3) * 0.1, "var": np.abs(rand(3)) + 0.5}
    if bias:
        init["b"] = rand(3)
    nodes = [node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], "t", **attrs),
             node("BatchNormalization", ["t", "scale", "shift", "mean", "var"],
                  "n" if activation else "y")]
    if activation == "Relu":
        nodes.append(node("Relu", ["n"], "y"))
    elif activation == "Clip":
        init.update(lo=np.float32(0), hi=np.float32(6))
        nodes.append(node("Clip", ["n", "lo", "hi"], "y"))
    model = make_model(nodes, {"x": x}, ["y"], initializers=init)
    result = both_routes(model, {"x": x})
    assert count_tflite_ops(result.content) == {"TRANSPOSE_CONV": 1}
    flat = unpack_model(result.content)
    version = next(c.version for c in flat.operatorCodes if c.builtinCode == 67)
    assert version == 4 if activation else 3
    reference = Interpreter(model_content=result.content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    got = run_signature(reference, {"x": x.transpose(0, 2, 3, 1)})["y"]
    assert_close(got.transpose(0, 3, 1, 2), ort_run(model, {"x": x})[0], 1e-5, "reference")


@pytest.mark.parametrize(("second", "depthwise", "speed", "quantization"), [
    # the products stay two; a per-channel scale along a CONV_2D's input channels would
    # mix the grids of its outputs: both MULs stay
    ("channel", False, {"CONV_2D": 2}, {"CONV_2D": 2, "MUL": 2}),
    # one value scales whole output channels: into the filter
    ("scalar", False, {"CONV_2D": 2}, {"CONV_2D": 2, "MUL": 1}),
    # a depthwise filter is quantized per the channels the scale multiplies: folded
    ("channel", True, {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1},
     {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "MUL": 1}),
    ("scalar", True, {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1},
     {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "MUL": 1}),
])
def test_the_graph_a_quantizer_starts_from_keeps_every_grid_as_fine(second, depthwise, speed,
                                                                   quantization):
    """ConversionOptions.for_quantization (Converted.rebuild for the INT8 and INT16 sources):
    of the speed folds, the direct writer makes those that keep each quantization grid as
    fine (direct_rewrites.rewrite); the outputs of both graphs are onnxruntime's."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature
    from onnx2tf_alt.translate.options import ConversionOptions

    x = rand(2, 3, 7, 6)
    init = {"w1": rand(4, 3, 1, 1), "c1": rand(4, 1, 1),
            "c2": rand(4, 1, 1) if second == "channel" else np.float32(-0.7),
            "w2": rand(4, 1, 3, 3) if depthwise else rand(5, 4, 1, 1),
            "b2": rand(4 if depthwise else 5)}
    last = (node("Conv", ["m2", "w2", "b2"], "y", group=4, pads=[1, 1, 1, 1]) if depthwise
            else node("Conv", ["m2", "w2", "b2"], "y"))
    model = make_model([node("Conv", ["x", "w1"], "h"), node("Relu", ["h"], "r"),
                        node("Mul", ["r", "c1"], "m1"), node("Mul", ["m1", "c2"], "m2"), last],
                       {"x": x}, ["y"], initializers=init)
    planned = plan_loaded(load_model(None, model))
    want = ort_run(model, {"x": x})[0]
    for for_quantization, ops in ((False, speed), (True, quantization)):
        result = write_direct(planned.graph, planned.plan,
                              ConversionOptions(for_quantization=for_quantization))
        assert count_tflite_ops(result.content) == ops, for_quantization
        got = run_signature(Interpreter(model_content=result.content),
                            {"x": x.transpose(0, 2, 3, 1)})["y"]  # channel last
        assert_close(got.transpose(0, 3, 1, 2), want, 1e-5, f"y {for_quantization}")


@pytest.mark.parametrize(("divisor", "reader", "kept"), [
    (3.0, "Floor", True),  # x / 3 and x * fl(1 / 3) an ulp apart: the floor may move
    (3.0, "Less", True),  # likewise a comparison
    (4.0, "Floor", False),  # 1 / 4 exact: a product all the same
    (3.0, "Relu", False),
])
def test_a_quotient_rounded_or_compared_stays_a_division(divisor, reader, kept):
    """constant_divisions leaves DIV where its quotient is rounded or compared, unless the
    divisor is a power of two: the file gives onnxruntime's values exactly, at the integer
    boundaries 6 / 3 = 2 included; a quotient only computed with becomes a product."""
    x = np.array([[6.0, 9.0, -3.0, 7.5, 0.3, 12.0]], np.float32)
    extra = {"half": np.float32(1.5)} if reader == "Less" else {}
    second = ["q", "half"] if reader == "Less" else ["q"]
    model = make_model([node("Div", ["x", "c"], "q"), node(reader, second, "y")], {"x": x},
                       ["y"], initializers={"c": np.float32(divisor), **extra})
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert ("DIV" in count_tflite_ops(result.content)) == kept
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature

    got = run_signature(Interpreter(model_content=result.content), {"x": x})["y"]
    expected = ort_run(model, {"x": x})[0]
    if reader == "Relu":  # x * fl(1 / 3): an ulp from x / 3 (0.3 / 3), as TF's converter
        assert_close(got, expected, 1e-6, "y")
    else:
        np.testing.assert_array_equal(got, expected)


def test_a_division_by_a_constant_with_zeros_and_a_product_that_broadcasts():
    """x / c by a constant vector with a zero (inf and nan as onnxruntime gives them), and a
    product whose constant broadcasts x to a larger shape: not merged with the MUL before
    it (the merged constant would change the output's shape)."""
    x = rand(2, 1, 4)
    c = np.array([2.0, 0.0, -4.0, 0.5], np.float32)
    d = rand(3, 4)
    model = make_model([node("Div", ["x", "c"], "q"), node("Mul", ["q", "d"], "y")],
                       {"x": x}, ["y"], initializers={"c": c, "d": d})
    x[0, 0, 1] = 0.0  # 0 / 0
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = x / c * d
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature

    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)

    got = run_signature(Interpreter(model_content=result.content), {"x": x})["y"]
    assert np.isinf(expected).any() and np.isnan(expected).any()
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # inf and nan where expected
    assert count_tflite_ops(result.content) == {"MUL": 2}


def test_outputs_that_are_inputs_or_constants():
    """An Identity of an input, a Shape folded to a constant and a computed output, as TF's
    converter writes them: the input tensor and a constant tensor are outputs themselves."""
    x = rand(2, 3, 5)
    model = make_model([node("Identity", ["x"], "same"), node("Shape", ["x"], "shape"),
                        node("Relu", ["x"], "y"), node("Identity", ["y"], "again")],
                       {"x": x}, ["same", "shape", "y", "again"])
    result = both_routes(model, {"x": x})
    assert count_tflite_ops(result.content) == {"RELU": 1}


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_unsigned_values(dtype):
    """uint32 / uint64 tensors (the handlers' own code on the Recorder, a constant operand
    folded), against onnxruntime and the TF route's file. One op for uint64: between two,
    TF's converter cancels the bitcasts and offsets its handler writes to order uint64 as
    int64, which the direct writer keeps (2 ops more)."""
    a = RNG.integers(0, 1000, (2, 3, 4)).astype(dtype)
    b = RNG.integers(0, 1000, (3, 4)).astype(dtype)
    nodes = [node("Max", ["a", "b"], "m"), node("Min", ["m", "c"], "y")]
    if dtype == np.uint64:
        nodes = [node("Max", ["a", "b"], "y")]
    model = make_model(nodes, {"a": a, "b": b}, ["y"], {"c": np.full((4,), 700, dtype)})
    both_routes(model, {"a": a, "b": b})


def test_cli_dynamic_range_and_int4_files_need_no_tensorflow(tmp_path):
    """-dms -odrqt -oi4: the dynamic-range file, its quant report and the int4 file are
    made from the direct writer's float32 file in a process that never loads TF; the
    dynamic-range file computes as the float32 one does, within its int8 weights, and
    holds int8 filters."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.flatbuffer import unpack_model
    from onnx2tf_alt.tflite.run import run_signature

    out = tmp_path / "out"
    run_without_tensorflow("-i", MOBILENET, "-o", out, "-dms", "-odrqt", "-oi4", "-n")
    stem = "mobilenet_block"
    report = json.loads((out / f"{stem}_quant_report.json").read_text())
    (entry,) = report["files"]
    assert entry["file"] == f"{stem}_dynamic_range_quant.tflite"
    assert entry["outputs"]["logits"]["cosine_pooled"] > 0.999, entry
    feeds = {"image": rand(3, 64, 64, 3)}
    runs = {s: run_signature(Interpreter(model_path=str(out / f"{stem}_{s}.tflite")),
                             feeds)["logits"]
            for s in ("float32", "dynamic_range_quant", "int4_weight_quant")}
    assert_close(runs["dynamic_range_quant"], runs["float32"], 5e-2, "dynamic range")
    model = unpack_model((out / f"{stem}_dynamic_range_quant.tflite").read_bytes())
    int8 = [t for t in model.subgraphs[0].tensors if t.type == 9]  # INT8
    assert int8 and all(t.quantization.scale is not None for t in int8)


def test_cli_integer_files_need_no_tensorflow(tmp_path):
    """-dms -oiqt: the INT8 and INT16 files are calibrated on the direct writer's float32
    file and made by the own quantizer in a process that never loads TF; the INT8 files hold
    int8 kernels with int32 biases and follow the float32 file on the held-out photographs,
    the full-integer file with int8 input and output."""
    from ai_edge_litert.interpreter import Interpreter

    out = tmp_path / "out"
    run_without_tensorflow("-i", MOBILENET, "-o", out, "-dms", "-oiqt", "-n", timeout=600)
    stem = "mobilenet_block"
    report = json.loads((out / f"{stem}_quant_report.json").read_text())
    cosines = {e["variant"]: e["outputs"]["logits"]["cosine_pooled"] for e in report["files"]}
    assert set(cosines) == {"dynamic_range_quant", "integer_quant", "full_integer_quant",
                            "integer_quant_with_int16_act",
                            "full_integer_quant_with_int16_act"}, cosines
    assert min(cosines.values()) > 0.99, cosines
    assert cosines["integer_quant_with_int16_act"] > 0.9999, cosines
    runner = Interpreter(model_path=str(out / f"{stem}_full_integer_quant.tflite")
                         ).get_signature_runner("serving_default")
    (entry,), (result,) = (runner.get_input_details().values(),
                           runner.get_output_details().values())
    assert entry["dtype"] == np.int8 and result["dtype"] == np.int8
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = unpack_model((out / f"{stem}_integer_quant.tflite").read_bytes())
    graph = model.subgraphs[0]
    convs = [op for op in graph.operators if op_name(model, op) == "CONV_2D"]
    assert convs and all((graph.tensors[op.inputs[1]].type, graph.tensors[op.inputs[2]].type)
                         == (9, 2) for op in convs)  # INT8 kernels, INT32 biases


def test_cli_direct_refuses_what_needs_tf(tmp_path):
    """--tflite_writer direct with a Keras file asked for (-oh5 needs TF's model): exit 2,
    saying what to leave out, nothing written; onnxruntime's calibration methods with -oiqt
    need no TF any more (tests/quant/test_qdq_grids.py)."""
    code, out = run_cli("-i", MOBILENET, "-o", tmp_path / "out", "-dms", "-oiqt", "-oh5",
                        "--calibration_method", "ort_minmax", "--tflite_writer", "direct")
    assert code == 2 and "-oh5" in out and "calibration methods" not in out, out
    assert not (tmp_path / "out").exists()


def test_cli_keep_float_auto_needs_no_tensorflow(tmp_path):
    """-dms -oiqt --keep_float_auto: the ops are ranked by measuring re-quantized files
    (quant/group_ranking.py), not by a TF model's gradient. A target of 1.0 makes the search
    keep every segment that gains; each one kept is measured, and what it keeps is float in
    the INT8 file."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    out = tmp_path / "out"
    run_without_tensorflow("-i", MOBILENET, "-o", out, "-dms", "-oiqt", "--keep_float_auto",
                           "1.0", "-n", timeout=600)
    report = json.loads((out / "mobilenet_block_quant_report.json").read_text())
    sensitivity = report["sensitivity"]
    assert "measured on re-quantized files" in sensitivity["method"]
    added = [step for step in sensitivity["search"] if "added" in step]
    assert added and all(b["cosine"] > a["cosine"] for a, b in zip(
        sensitivity["search"], sensitivity["search"][1:])), sensitivity["search"]
    judged = sensitivity["judged"]
    model = unpack_model((out / "mobilenet_block_integer_quant.tflite").read_bytes())
    graph = model.subgraphs[0]
    floats = {graph.tensors[op.outputs[0]].name.decode() for op in graph.operators
              if graph.tensors[op.outputs[0]].type == 0 and op_name(model, op) != "DEQUANTIZE"}
    if judged["kept"]:  # kept on the unseen samples: the nodes found are float in the file
        assert sensitivity["kept_float_nodes"] and judged["mixed"] > judged["int8"]
        assert len(floats) >= added[-1]["float_ops"] - 1, floats  # the output may be one
    else:
        assert not sensitivity["kept_float_nodes"] and not floats, floats


def test_cli_keep_float_needs_no_tensorflow(tmp_path):
    """-dms -oiqt --keep_float NODE: the direct file's tensors name their nodes, so the
    node's ops and their readers stay float without TF; the rest is int8."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    out = tmp_path / "out"
    run_without_tensorflow("-i", MOBILENET, "-o", out, "-dms", "-oiqt", "--keep_float",
                           "/block/block.3/Conv", "-n", timeout=600)
    model = unpack_model((out / "mobilenet_block_integer_quant.tflite").read_bytes())
    graph = model.subgraphs[0]
    types = {op_name(model, op): [] for op in graph.operators}
    for op in graph.operators:
        types[op_name(model, op)].append(graph.tensors[op.outputs[0]].type)
    assert types["DEPTHWISE_CONV_2D"] == [0], types  # the node: float32
    assert sorted(types["CONV_2D"]) == [0, 9, 9], types  # its reader float, the others int8
    assert types["FULLY_CONNECTED"] == [9] and types["ADD"] == [9], types


def test_cli_keep_float_finds_nodes_whose_names_hold_semicolons(tmp_path):
    """tf2onnx names nodes and values 'model_1/a/conv1d;model_1/a/conv1d'; the direct
    writer joins fused names with ';' too. --keep_float finds such a node (it kept nothing
    on basic-pitch before: its 26 front-end convs named so, the INT8 file unchanged): the
    node and its reader float, the last conv int8."""
    import onnx

    from onnx2tf_alt.export.delegates import name_parts
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    a, b, c = (f"model_1/{k}/conv1d;model_1/{k}/conv1d" for k in "abc")
    ra, rb = "model_1/a/relu;model_1/a/relu", "model_1/b/relu;model_1/b/relu"
    model = make_model(
        [node("Conv", ["x", "w1", "b1"], a, name=a), node("Relu", [a], ra, name=ra),
         node("Conv", [ra, "w2", "b2"], b, name=b), node("Relu", [b], rb, name=rb),
         node("Conv", [rb, "w3", "b3"], c, name=c)],
        {"x": rand(2, 3, 12, 10)}, [c],
        {"w1": rand(6, 3, 3, 3), "b1": rand(6), "w2": rand(5, 6, 1, 1), "b2": rand(5),
         "w3": rand(4, 5, 1, 1), "b3": rand(4)})
    path = tmp_path / "semicolons.onnx"
    onnx.save(model, path)
    out = tmp_path / "out"
    code, printed = run_cli("-i", path, "-o", out, "-oiqt", "--keep_float", a, "-n")
    assert code == 0, printed
    notes = json.loads((out / "semicolons_quant_report.json").read_text())["notes"]
    assert any("1 ONNX node(s) to keep in float" in n for n in notes), notes
    model = unpack_model((out / "semicolons_integer_quant.tflite").read_bytes())
    graph = model.subgraphs[0]
    convs = [graph.tensors[op.outputs[0]] for op in graph.operators
             if op_name(model, op) == "CONV_2D"]
    assert [t.type for t in convs] == [0, 0, 9], [t.name for t in convs]
    known = {a, b}.__contains__
    assert name_parts(f"{a};{b}", known) == [a, b]
    assert name_parts(f"{a};x;y", known) == [a, "x", "y"]


@pytest.mark.parametrize("flags", [["-dms"], []], ids=["dms", "default"])
def test_cli_a_model_without_weights(tmp_path, flags):
    """No float32 weights to halve: the float16 file is the float32 one."""
    import onnx

    a, b = rand(1, 6), rand(3, 1)
    model = make_model([node("Add", ["a", "b"], "y")], {"a": a, "b": b}, ["y"])
    path = tmp_path / "add.onnx"
    onnx.save(model, path)
    code, out = run_cli("-i", path, "-o", tmp_path / "out", *flags, "-n")
    assert code == 0, out
    files = [(tmp_path / "out" / f"add_{s}.tflite").read_bytes() for s in ("float32", "float16")]
    assert files[0] == files[1]
    expected = ort_run(model, {"a": a, "b": b})[0]
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.run import run_signature

    got = run_signature(Interpreter(model_content=files[1]), {"a": a, "b": b})["y"]
    assert_close(got, expected, 1e-6, "float16 file")


def test_cli_direct_with_onnx_names(tmp_path):
    code, out = run_cli("-i", MOBILENET, "-o", tmp_path, "-dms", "-coion", "--tflite_writer",
                        "direct", "-n")
    assert code == 0, out
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(tmp_path / "mobilenet_block_float32.tflite"))
    details = runner.get_signature_runner().get_input_details()
    assert list(details) == ["image"]


def _recurrence_model(op: str, batch: int, steps: int = 5, size: int = 4, hidden: int = 6,
                      states: str = "none", extra_outputs: bool = False, batch_first=False,
                      **attrs):
    """One RNN / LSTM / GRU node with constant weights: `states` none, constant (non-zero)
    or input (initial states fed at run time); `batch_first`: X arrives through a
    Transpose, as PyTorch exports it."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    x = rand(batch, steps, size) if batch_first else rand(steps, batch, size)
    inits = {"w": rand(dirs, gates * hidden, size) * 0.5,
             "r": rand(dirs, gates * hidden, hidden) * 0.5, "b": rand(dirs, 2 * gates * hidden)}
    inputs, feeds = ["t" if batch_first else "x", "w", "r", "b", ""], {"x": x}
    state_names = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for name in state_names:
        value = rand(dirs, batch, hidden)
        if states == "constant":
            inits[name] = value
        elif states == "input":
            feeds[name] = value
        inputs.append(name if states != "none" else "")
    if op == "LSTM" and attrs.pop("peepholes", False):
        inits["p"] = rand(dirs, 3 * hidden)
        inputs.append("p")
    outputs = ["y", "yh", "yc"][:3 if op == "LSTM" else 2] if extra_outputs else ["y"]
    nodes = [node(op, [i for i in inputs], outputs, hidden_size=hidden, **attrs)]
    if batch_first:
        nodes.insert(0, node("Transpose", ["x"], "t", perm=[1, 0, 2]))
    while nodes[-1].input and not nodes[-1].input[-1]:
        nodes[-1].input.pop()
    return make_model(nodes, feeds, outputs, inits), feeds


RECURRENCES = [
    ("LSTM", 1, {}),  # one sequence: steps as run-time biases
    ("LSTM", 1, {"direction": "bidirectional", "states": "constant", "extra_outputs": True}),
    ("LSTM", 1, {"batch_first": True, "extra_outputs": True}),
    ("LSTM", 3, {"direction": "reverse", "clip": 0.7}),  # several: unrolled for the clip
    ("LSTM", 2, {"peepholes": True, "states": "input", "extra_outputs": True}),
    ("LSTM", 2, {"input_forget": 1}),
    ("GRU", 1, {"linear_before_reset": 1, "direction": "bidirectional"}),
    ("GRU", 1, {"states": "constant", "extra_outputs": True}),
    ("GRU", 3, {"linear_before_reset": 1, "states": "input", "extra_outputs": True}),
    ("GRU", 2, {"direction": "reverse"}),
    ("RNN", 1, {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    ("RNN", 4, {"activations": ["LeakyRelu"], "activation_alpha": [0.3],
                "states": "constant", "extra_outputs": True}),
    ("RNN", 2, {"batch_first": True, "activations": ["Sigmoid"]}),
]


@pytest.mark.parametrize(("op", "batch", "attrs"), RECURRENCES,
                         ids=[f"{o}-{b}-{a}" for o, b, a in RECURRENCES])
def test_recurrence(op, batch, attrs):
    """The handler's unrolled steps, written by the direct writer through DirectOps."""
    model, feeds = _recurrence_model(op, batch, **dict(attrs))
    result = both_routes(model, feeds)
    census = count_tflite_ops(result.content)
    assert census["FULLY_CONNECTED"] >= 5 and "WHILE" not in census


def test_recurrences_the_recorder_writes_and_the_fused_lstm_it_leaves_to_tf():
    """TFLite's fused LSTM kernel (several sequences) goes through TF's converter, named; an
    RNN with an activation DirectOps lacks (Softsign) or with weights fed at run time is
    written by its handler's code on the Recorder, equal to onnxruntime and the TF route."""
    planned = plan_loaded(load_model(None, _recurrence_model("LSTM", 3)[0]))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, NotCovered) and "fused LSTM kernel" in str(result), str(result)
    both_routes(*_recurrence_model("RNN", 2, activations=["Softsign"]))
    feeds = {"x": rand(5, 1, 4), "w": rand(1, 6, 4), "r": rand(1, 6, 6)}
    both_routes(make_model([node("RNN", ["x", "w", "r"], ["y"], hidden_size=6)], feeds, ["y"]),
                feeds)


def test_streamed_weights_write_the_same_files_also_beside_a_saved_model(tmp_path, monkeypatch):
    """Past STREAMED_BYTES of weights the direct writer writes the file as it goes (its
    weights never all in memory), also beside a saved_model: the float32 and -odrqt files
    are those of a -dms run that packs the file in memory, byte for byte; the float16 file
    holds the same ops, tensors and weights (made from the bound model, its table is laid
    out otherwise)."""
    from onnx2tf_alt.api import convert
    from onnx2tf_alt.tflite import direct

    model = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")
    names = ["mobilenet_block_float32.tflite", "mobilenet_block_float16.tflite",
             "mobilenet_block_dynamic_range_quant.tflite"]
    packed = tmp_path / "packed"
    convert(input_onnx_file_path=model, output_folder_path=str(packed), non_verbose=True,
            disable_model_save=True, output_dynamic_range_quantized_tflite=True)
    monkeypatch.setattr(direct, "STREAMED_BYTES", 0)
    written = []
    monkeypatch.setattr(direct.Bound, "write", lambda self, path, _write=direct.Bound.write: (
        written.append(os.path.basename(path)), _write(self, path))[1])
    for flags in ({}, {"output_saved_model": True}):
        out = tmp_path / ("beside" if flags else "dms")
        convert(input_onnx_file_path=model, output_folder_path=str(out), non_verbose=True,
                output_dynamic_range_quantized_tflite=True, **flags)
        for name in names:
            got, want = (out / name).read_bytes(), (packed / name).read_bytes()
            assert (_model_contents(got) == _model_contents(want) if "float16" in name
                    else got == want), (flags, name)
    assert written.count("mobilenet_block_float32.tflite") == 2  # streamed, both runs
    assert (tmp_path / "beside" / "saved_model.pb").exists()


def _model_contents(content: bytes) -> list:
    """A .tflite's operators, tensors and each tensor's weight bytes, in order."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = unpack_model(content)
    found = []
    for graph in model.subgraphs:
        found.append([(op_name(model, op), list(op.inputs), list(op.outputs))
                      for op in graph.operators])
        for tensor in graph.tensors:
            data = model.buffers[tensor.buffer].data
            found.append((tensor.name, tensor.type, list(tensor.shape),
                          None if data is None else bytes(data)))
    return found


def _int8_runs(tmp_path, monkeypatch, lowered: list[tuple], **flags) -> tuple:
    """mobilenet_block's -oiqt files, packed in memory (-dms), then again with each
    (module, name) bound of `lowered` set to 0 and `flags`: the two output folders."""
    from onnx2tf_alt.api import convert

    packed, other = tmp_path / "packed", tmp_path / "lowered"
    convert(input_onnx_file_path=MOBILENET, output_folder_path=str(packed), non_verbose=True,
            disable_model_save=True, output_integer_quantized_tflite=True)
    for module, name in lowered:
        monkeypatch.setattr(module, name, 0)
    convert(input_onnx_file_path=MOBILENET, output_folder_path=str(other), non_verbose=True,
            output_integer_quantized_tflite=True, **flags)
    return packed, other


def test_streamed_weights_are_read_back_for_the_int8_files(tmp_path, monkeypatch):
    """-oiqt beside a saved_model with the float32 file written as it was packed: the
    quantizer reads it back, and the INT8 file is the one of a -dms run that packed the
    file in memory."""
    from onnx2tf_alt.tflite import direct

    name = "mobilenet_block_integer_quant.tflite"
    packed, streamed = _int8_runs(tmp_path, monkeypatch, [(direct, "STREAMED_BYTES")],
                                  output_saved_model=True)
    assert (streamed / "saved_model.pb").exists()
    assert (streamed / name).read_bytes() == (packed / name).read_bytes()


def test_int8_and_int16_files_of_a_float_file_with_its_weights_after_the_flatbuffer(
        tmp_path, monkeypatch):
    """-oiqt where the float32 file keeps its weights after the flatbuffer, as past 2 GB
    (made so here by lowering the bounds): calibration, the range trial, bias correction
    and the quantizer read it (unpack_model gives its stored buffers as views), and every
    quantized file is the one of a run whose float file holds them inside, byte for byte."""
    from onnx2tf_alt.tflite import direct, late_weights
    from onnx2tf_alt.tflite.flatbuffer import read_model

    stem = "mobilenet_block"
    inline, stored = _int8_runs(tmp_path, monkeypatch, [
        (direct, "STREAMED_BYTES"), (late_weights, "MAX_INLINE")], disable_model_save=True)
    flat = read_model((stored / f"{stem}_float32.tflite").read_bytes())
    assert sum(flat.Buffers(i).Offset() > 1 for i in range(flat.BuffersLength())) >= 10
    report = json.loads((stored / f"{stem}_quant_report.json").read_text())
    assert not [e for e in report["files"] if "error" in e], report["files"]
    for variant in ("integer_quant", "full_integer_quant", "integer_quant_with_int16_act",
                    "full_integer_quant_with_int16_act"):
        name = f"{stem}_{variant}.tflite"
        assert (stored / name).read_bytes() == (inline / name).read_bytes(), name


# --- inputs of run-time height and width ------------------------------------------------------
SIZES = [(2, 24, 40), (1, 16, 16), (1, 40, 8)]  # (batch, height, width), all multiples of 8


def _at_sizes(model, name: str, channels: int, sizes=SIZES, tf_route: bool = True) -> dict:
    """The direct file of `model` (input `name` of run-time dims) against onnxruntime at each
    of `sizes`, and against the TF route's file where it has one; the direct file's ops."""
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, DirectResult), str(result)
    converted = translate(planned)
    direct = replace(converted, result=result, _tflite_result=result)
    tf_file = tflite_bytes(converted.tflite_result()) if tf_route else None
    for batch, height, width in sizes:
        feeds = {name: rand(batch, channels, height, width)}
        got, expected = tflite_run(direct, feeds, result.content), ort_run(model, feeds)
        for i, (a, e) in enumerate(zip(got, expected)):
            assert_close(a, e, 1e-5, f"direct output {i} at {feeds[name].shape}")
        if tf_file is not None:
            for i, (a, e) in enumerate(zip(tflite_run(converted, feeds, tf_file), expected)):
                assert_close(a, e, 1e-5, f"TF route's output {i} at {feeds[name].shape}")
    return count_tflite_ops(result.content)


def test_a_network_of_run_time_height_and_width():
    """A small U-Net with a classifier head on an input [N, 3, H, W] (tflite/direct.py:
    nodes whose values have several run-time dims are written by their handlers' code, as
    in TF): strided and padded convs, hard-swish, pooling, a transposed conv, a resize, a
    skip connection, global pooling and a dense layer; the same values as onnxruntime at
    three sizes, through the direct writer and TF's converter."""
    init = {"w1": rand(8, 3, 3, 3) * 0.3, "b1": rand(8), "w2": rand(8, 8, 3, 3) * 0.2,
            "w3": rand(8, 8, 1, 1) * 0.3, "wt": rand(8, 8, 2, 2) * 0.3, "bt": rand(8),
            "w4": rand(2, 8, 1, 1) * 0.3, "scales": np.array([1, 1, 2, 2], np.float32),
            "wd": rand(8, 5) * 0.3, "three": np.float32(3), "zero": np.float32(0),
            "six": np.float32(6)}
    nodes = [node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Add", ["c1", "three"], "s3"), node("Clip", ["s3", "zero", "six"], "r6"),
             node("Mul", ["c1", "r6"], "m6"), node("Div", ["m6", "six"], "h"),
             node("Conv", ["h", "w2"], "c2", pads=[1, 1, 1, 1]), node("Relu", ["c2"], "a"),
             node("MaxPool", ["a"], "p", kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["p", "w3"], "c3"),
             node("ConvTranspose", ["c3", "wt", "bt"], "u", strides=[2, 2]),
             node("Add", ["u", "a"], "skip"),
             node("Resize", ["skip", "", "scales"], "big", mode="nearest"),
             node("Conv", ["big", "w4"], "c4"), node("Sigmoid", ["c4"], "map"),
             node("GlobalAveragePool", ["skip"], "g"), node("Flatten", ["g"], "f"),
             node("MatMul", ["f", "wd"], "cls")]
    x = rand(1, 3, 16, 16)
    model = make_model(nodes, {"x": x}, ["map", "cls"], initializers=init, opset=13,
                       input_shapes={"x": ["N", 3, "H", "W"]})
    ops = _at_sizes(model, "x", 3)
    # the stride-2 conv's pads are TF's SAME only on odd sizes: one PAD; the stride-1 conv's
    # on every size (ops/_spatial.is_tf_same)
    assert ops.get("HARD_SWISH") == 1 and ops.get("PAD") == 1 and "TRANSPOSE" not in ops, ops


def _dims(name: str, axes: list[int], out: str) -> list:
    """TorchScript's x.size(a) for each axis, unsqueezed: Shape, Gather, Unsqueeze."""
    nodes = [node("Shape", [name], f"{out}_shape")]
    for a in axes:
        nodes += [node("Gather", [f"{out}_shape", f"i{a}"], f"{out}_{a}", axis=0),
                  node("Unsqueeze", [f"{out}_{a}", "axis0"], f"{out}_{a}u")]
    return nodes


def test_a_channel_shuffle_and_split_by_computed_sizes():
    """ShuffleNet V2 as TorchScript exports it with run-time batch, height and width: the
    shuffle's Reshapes to targets gathered from Shape (x.size(i)) and the channel split's
    Slice by bounds computed from x.size(1) // 2 (passes/prepare's fold of the known
    channel count, passes/shape_values' shapes): the direct file matches onnxruntime at
    three sizes. (TF's converter writes the last conv as FlexConv2D: TF's own shape
    inference loses the channel count through the computed Reshape.)"""
    c = 8
    init = {"w": rand(c, 3, 3, 3) * 0.3, "w2": rand(c // 2, c // 2, 1, 1) * 0.3,
            "axis0": np.array([0], np.int64), "two": np.array([2], np.int64),
            "half": np.array(2, np.int64), **{f"i{a}": np.array(a, np.int64) for a in range(4)}}
    nodes = [node("Conv", ["x", "w"], "h", pads=[1, 1, 1, 1]),
             *_dims("h", [0, 1, 2, 3], "d"),
             node("Div", ["d_1", "half"], "c2"), node("Unsqueeze", ["c2", "axis0"], "c2u"),
             node("Concat", ["d_0u", "two", "c2u", "d_2u", "d_3u"], "t5", axis=0),
             node("Reshape", ["h", "t5"], "g"),
             node("Transpose", ["g"], "gt", perm=[0, 2, 1, 3, 4]),
             node("Concat", ["d_0u", "d_1u", "d_2u", "d_3u"], "t4", axis=0),
             node("Reshape", ["gt", "t4"], "shuffled"),
             node("Slice", ["shuffled", "c2u", "d_1u", "i1u"], "right"),
             node("Conv", ["right", "w2"], "y"),
             # a depthwise conv of the shuffled value: TF's build lost its channels there
             # (ops/_conv_common.depthwise_conv takes them from the graph)
             node("Conv", ["shuffled", "wd"], "dw", group=c, pads=[1, 1, 1, 1])]
    nodes.insert(0, node("Unsqueeze", ["i1", "axis0"], "i1u"))
    init["wd"] = rand(c, 1, 3, 3) * 0.3
    model = make_model(nodes, {"x": rand(1, 3, 8, 6)}, ["y", "dw"], initializers=init,
                       opset=13, input_shapes={"x": ["N", 3, "H", "W"]})
    _at_sizes(model, "x", 3, tf_route=False)


DYNAMIC_CONV_TRANSPOSES = [  # (attributes, ONNX weight shape, written as output phases)
    ({"strides": [2, 2]}, (4, 6, 2, 2), True),  # output in · s: phases (deconv_phases)
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 3, 4, 4), True),
    ({"strides": [2, 2], "group": 2}, (4, 3, 2, 2), True),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (4, 3, 3, 3), True),
    ({"strides": [2, 2]}, (4, 3, 3, 3), False),  # TF's VALID, the full output
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (4, 3, 3, 3), False),  # TF's SAME
]


@pytest.mark.parametrize(("attrs", "w_shape", "phases"), DYNAMIC_CONV_TRANSPOSES,
                         ids=[str(a) for a, _, _ in DYNAMIC_CONV_TRANSPOSES])
def test_a_transposed_conv_of_run_time_height_and_width(attrs, w_shape, phases):
    """A transposed conv whose output is in · s whatever the input is written as
    convolutions of its phases and a DEPTH_TO_SPACE (passes/deconv_phases.py: XNNPACK's
    TRANSPOSE_CONV takes no run-time output shape, the PP-OCR detector of run-time size
    1.075 -> 1.000 of its fixed-size file's latency); the others as one TRANSPOSE_CONV of
    an output in · s + c computed at run time (ops/conv.py's _run_time_lengths: TF's SAME or
    VALID padding). Both routes at three sizes."""
    nodes = [node("ConvTranspose", ["x", "w", "b"], "t", **attrs), node("Relu", ["t"], "y")]
    groups = attrs.get("group", 1)
    model = make_model(nodes, {"x": rand(1, 4, 5, 6)}, ["y"],
                       {"w": rand(*w_shape), "b": rand(w_shape[1] * groups)}, opset=13,
                       input_shapes={"x": ["N", 4, "H", "W"]})
    ops = _at_sizes(model, "x", 4, sizes=[(2, 5, 6), (1, 3, 9), (1, 8, 1)])
    assert ("TRANSPOSE_CONV" not in ops and "DEPTH_TO_SPACE" in ops) == phases, ops


def test_a_transposed_conv_it_cannot_crop_at_run_time_is_refused_by_name():
    """Pads neither TF padding takes (an output cropped by a run-time length): the direct
    writer and the TF route name the node and -ois; nothing is written wrong."""
    nodes = [node("ConvTranspose", ["x", "w"], "y", strides=[2, 2], pads=[2, 2, 2, 2],
                  output_padding=[1, 1])]
    model = make_model(nodes, {"x": rand(1, 4, 5, 6)}, ["y"], {"w": rand(4, 3, 3, 3)},
                       opset=13, input_shapes={"x": ["N", 4, "H", "W"]})
    planned = plan_loaded(load_model(None, model))
    found = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(found, NotCovered) and "-ois" in str(found), found
    with pytest.raises(Exception, match="ConvTranspose with pads.*-ois"):
        translate(planned)


def test_a_flatten_by_a_computed_shape_at_opset_12():
    """Paddle2ONNX's flatten of a value of run-time width, Reshape(x, Concat(Slice(Shape(x),
    0, 2), [-1])), which ONNX's inference leaves without a rank before opset 17
    (passes/shape_values.py gives it [N, 8, W]), then a transpose and a dense layer (a text
    recognizer's head): both routes at three widths."""
    init = {"w": rand(8, 4, 3, 3) * 0.3, "zero": np.array([0], np.int64),
            "two": np.array([2], np.int64), "rest": np.array([-1], np.int64),
            "wd": rand(8, 5) * 0.3}
    nodes = [node("Conv", ["x", "w"], "c", pads=[0, 1, 0, 1], strides=[3, 1]),
             node("Shape", ["c"], "s"), node("Slice", ["s", "zero", "two", "zero"], "nc"),
             node("Concat", ["nc", "rest"], "target", axis=0),
             node("Reshape", ["c", "target"], "flat"),
             node("Transpose", ["flat"], "seq", perm=[0, 2, 1]),
             node("MatMul", ["seq", "wd"], "y")]
    model = make_model(nodes, {"x": rand(1, 4, 3, 10)}, ["y"], initializers=init, opset=12,
                       input_shapes={"x": ["N", 4, 3, "W"]})
    _at_sizes(model, "x", 4, sizes=[(1, 3, 10), (2, 3, 7), (1, 3, 1)])


def test_cli_an_image_of_run_time_size_is_written_directly(tmp_path):
    """tf2onnx's input [1, ?, ?, 3] (was refused by the direct writer: "several unknown
    dims"): written directly by a -dms run that imports no TensorFlow, its XNNPACK coverage
    reported (the report sizes the run-time dims), its outputs those of onnxruntime at two
    sizes."""
    nodes = [node("Transpose", ["image"], "nchw", perm=[0, 3, 1, 2]),
             node("Conv", ["nchw", "w"], "c", strides=[2, 2]), node("Relu", ["c"], "r"),
             node("GlobalAveragePool", ["r"], "y")]
    model = make_model(nodes, {"image": rand(1, 12, 10, 3)}, ["y"], {"w": rand(6, 3, 3, 3)},
                       opset=13,
                       input_shapes={"image": [1, "h", "w", 3]})
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    run_without_tensorflow("-i", path, "-o", tmp_path / "out", "-dms", "--tflite_writer",
                           "direct")
    report = json.loads((tmp_path / "out" / "m_delegates.json").read_text())
    assert report["ops_delegated"] == report["ops_total"], report["summary"]
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tmp_path / "out" / "m_float32.tflite"))
    for height, width in ((12, 10), (31, 17)):
        image = rand(1, height, width, 3)
        got = run_signature(interpreter, {"image": image})
        assert_close(next(iter(got.values())).reshape(-1),
                     ort_run(model, {"image": image})[0].reshape(-1), 1e-5, f"{image.shape}")


def test_token_ids_of_run_time_batch_and_length():
    """A BERT-style block on token ids [B, T] (was refused by the direct writer: "several
    unknown dims"): embedding gather, positions sliced to the run-time length, LayerNorm,
    heads split and merged by Reshapes to targets gathered from Shape, a padding mask,
    softmax attention. Direct file and TF route's against onnxruntime at three (B, T)."""
    d, heads, vocab = 8, 2, 20
    init = {"emb": rand(vocab, d), "pos": rand(40, d), "gamma": rand(d), "beta": rand(d),
            "wq": rand(d, d), "wk": rand(d, d), "wv": rand(d, d),
            "axis0": np.array([0], np.int64), "one": np.array([1], np.int64),
            "i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
            "split": np.array([heads, d // heads], np.int64), "merged": np.array([d], np.int64),
            "big": np.float32(-1e4), "unit": np.float32(1)}
    nodes = [node("Gather", ["emb", "ids"], "e"), *_dims("ids", [0, 1], "n"),
             node("Slice", ["pos", "axis0", "n_1u", "axis0"], "p"), node("Add", ["e", "p"], "h"),
             node("LayerNormalization", ["h", "gamma", "beta"], "ln", axis=-1, epsilon=1e-5)]
    for name, weight in (("q", "wq"), ("k", "wk"), ("v", "wv")):
        nodes += [node("MatMul", ["ln", weight], f"{name}0"),
                  node("Concat", ["n_0u", "n_1u", "split"], f"{name}_shape", axis=0),
                  node("Reshape", [f"{name}0", f"{name}_shape"], f"{name}4"),
                  node("Transpose", [f"{name}4"], f"{name}h",
                       perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [node("Cast", ["mask"], "maskf", to=1), node("Sub", ["unit", "maskf"], "off"),
              node("Mul", ["off", "big"], "neg"), node("Unsqueeze", ["neg", "one"], "neg3"),
              node("Unsqueeze", ["neg3", "one"], "neg4"),
              node("MatMul", ["qh", "kh"], "scores"), node("Add", ["scores", "neg4"], "masked"),
              node("Softmax", ["masked"], "attn", axis=-1), node("MatMul", ["attn", "vh"], "o"),
              node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
              node("Concat", ["n_0u", "n_1u", "merged"], "o_shape", axis=0),
              node("Reshape", ["ot", "o_shape"], "y")]

    def feeds(batch: int, length: int) -> dict:
        mask = np.ones((batch, length), np.int64)
        mask[0, length // 2:] = 0
        return {"ids": RNG.integers(0, vocab, (batch, length)).astype(np.int64), "mask": mask}

    model = make_model(nodes, feeds(2, 5), ["y"], initializers=init, opset=17,
                       input_shapes={"ids": ["B", "T"], "mask": ["B", "T"]})
    planned = plan_loaded(load_model(None, model))
    result = write_direct(planned.graph, planned.plan, planned.options)
    assert isinstance(result, DirectResult), str(result)
    converted = translate(planned)
    direct = replace(converted, result=result, _tflite_result=result)
    tf_file = tflite_bytes(converted.tflite_result())
    for batch, length in ((2, 5), (1, 1), (3, 17)):
        given = feeds(batch, length)
        expected = ort_run(model, given)[0]
        assert_close(tflite_run(direct, given, result.content)[0], expected, 1e-5,
                     f"direct at {(batch, length)}")
        assert_close(tflite_run(converted, given, tf_file)[0], expected, 1e-5,
                     f"TF route's at {(batch, length)}")


def test_a_concat_of_one_value_is_that_value_at_run_time_sizes():
    """TorchScript's torch.cat of a one-item list (DenseNet's first layer of each block, at
    opset 12) on a value of run-time height and width: no CONCATENATION (as tf.concat)."""
    nodes = [node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]),
             node("Concat", ["c"], "one", axis=1), node("Relu", ["one"], "y")]
    model = make_model(nodes, {"x": rand(1, 3, 6, 5)}, ["y"], {"w": rand(4, 3, 3, 3)},
                       opset=12, input_shapes={"x": ["N", 3, "H", "W"]})
    assert _at_sizes(model, "x", 3) == {"CONV_2D": 1}


def test_cli_quantized_files_of_run_time_size_run_at_every_size(tmp_path):
    """-oiqt on a model of run-time height and width, calibrated at 16 x 16: the size its
    resize computes from SHAPE (CAST, MUL by the scale, CAST) stays float arithmetic in the
    INT8 and INT16 files (quant/integer.py: ops on sizes alone are not quantized; quantized
    on the calibration's sizes, the INT8 file's upsampled branch came out one row short at
    any other size and its ADD failed to prepare). Each file follows onnxruntime at two
    other sizes."""
    from ai_edge_litert.interpreter import Interpreter

    init = {"w1": rand(8, 3, 3, 3) * 0.3, "w2": rand(8, 3, 3, 3) * 0.3,
            "scales": np.array([1, 1, 2, 2], np.float32)}
    nodes = [node("Conv", ["x", "w1"], "down", pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Relu", ["down"], "r"),
             node("Resize", ["r", "", "scales"], "up", mode="nearest"),
             node("Conv", ["x", "w2"], "skip", pads=[1, 1, 1, 1]),
             node("Add", ["up", "skip"], "y")]
    model = make_model(nodes, {"x": rand(1, 3, 16, 16)}, ["y"], initializers=init, opset=13,
                       input_shapes={"x": [1, 3, "H", "W"]})
    path, samples = tmp_path / "m.onnx", tmp_path / "cal.npy"
    path.write_bytes(model.SerializeToString())
    np.save(samples, RNG.random((8, 3, 16, 16), dtype=np.float32))
    code, log = run_cli("-i", path, "-o", tmp_path / "out", "-dms", "-oiqt", "-cind", "x",
                        samples, "-n")
    assert code == 0, log
    for variant in ("integer_quant", "full_integer_quant", "integer_quant_with_int16_act"):
        interpreter = Interpreter(model_path=str(tmp_path / "out" / f"m_{variant}.tflite"))
        entry, result = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
        for height, width in ((24, 20), (10, 14)):
            x = RNG.random((1, 3, height, width), dtype=np.float32)
            feed = x.transpose(0, 2, 3, 1)
            if entry["dtype"] != np.float32:
                scale, zero = entry["quantization"]
                feed = np.clip(np.round(feed / scale + zero), -128, 127).astype(entry["dtype"])
            interpreter.resize_tensor_input(entry["index"], feed.shape)
            interpreter.allocate_tensors()
            interpreter.set_tensor(entry["index"], feed)
            interpreter.invoke()
            got = interpreter.get_tensor(result["index"]).astype(np.float32)
            if result["dtype"] != np.float32:
                scale, zero = result["quantization"]
                got = (got - zero) * scale
            expected = ort_run(model, {"x": x})[0].transpose(0, 2, 3, 1)
            assert got.shape == expected.shape, (variant, got.shape)
            cosine = float(np.sum(got * expected) / np.linalg.norm(got) / np.linalg.norm(expected))
            assert cosine > 0.99, (variant, height, width, cosine)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_a_resize_to_the_input_size_at_run_time(mode):
    """A segmenter's head (torchvision's DeepLabV3 / LR-ASPP): features of a stride-4 conv
    resized back to the input's run-time height and width (sizes from Shape, a scale known
    only at run time): each tap gathered, weighted and summed in order (ops/resize.py's
    run-time path), as onnxruntime at three sizes, odd ones included."""
    init = {"w": rand(5, 3, 3, 3) * 0.3, "two": np.array([2], np.int64),
            "four": np.array([4], np.int64), "zero": np.array([0], np.int64)}
    nodes = [node("Conv", ["x", "w"], "f", pads=[1, 1, 1, 1], strides=[4, 4]),
             node("Shape", ["f"], "fs"), node("Slice", ["fs", "zero", "two"], "nc"),
             node("Shape", ["x"], "xs"), node("Slice", ["xs", "two", "four"], "hw"),
             node("Concat", ["nc", "hw"], "sizes", axis=0),
             node("Resize", ["f", "", "", "sizes"], "y", mode=mode,
                  coordinate_transformation_mode="pytorch_half_pixel")]
    model = make_model(nodes, {"x": rand(1, 3, 16, 16)}, ["y"], initializers=init, opset=13,
                       input_shapes={"x": ["N", 3, "H", "W"]})
    ops = _at_sizes(model, "x", 3, sizes=[(1, 16, 16), (2, 13, 22), (1, 9, 7)])
    assert "SUM" not in ops, ops


def _builtin_run(content: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The file's outputs on LiteRT's builtin kernels with its default memory planner (no
    XNNPACK, which plans the memory of its partitions itself), in the graph's output order."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), feeds.values()):
        interpreter.set_tensor(detail["index"], value.astype(detail["dtype"]))
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def _moved_and_read(form: str):
    """A decoder mask's count of filled slots (int64 [1]), reshaped to a scalar and added to
    a constant, and read as it is after that: added to the keys' positions ("added": that
    ADD then reads the scalar) or concatenated ("concatenated": the RESHAPE then reads a
    copy)."""
    mask = np.zeros((2, 9), np.int64)
    mask[:, :3] = mask[:, 8:] = 1
    init = {"starts": np.array([0, 0], np.int64), "ends": np.array([1, 8], np.int64),
            "axes": np.array([0, 1], np.int64), "one": np.array([1], np.int64),
            "eight": np.array(8, np.int64), "scalar": np.array([], np.int64),
            "nine": np.array(9, np.int64), "keys": np.arange(9, dtype=np.int64),
            "other": np.array([5], np.int64)}
    nodes = [node("Slice", ["m", "starts", "ends", "axes"], "part"),
             node("ReduceSum", ["part", "one"], "count", keepdims=0),
             node("Sub", ["count", "eight"], "shift_1"),
             node("Reshape", ["shift_1", "scalar"], "shift"),
             node("Add", ["nine", "shift"], "filled")]
    if form == "added":
        nodes += [node("Add", ["keys", "shift_1"], "moved"),
                  node("LessOrEqual", ["moved", "filled"], "y")]
    else:
        nodes += [node("Concat", ["shift_1", "other"], "joined", axis=0),
                  node("Mul", ["joined", "filled"], "y")]
    return make_model(nodes, {"m": mask}, ["y"], initializers=init), {"m": mask}


@pytest.mark.parametrize("form", ["added", "concatenated"])
def test_a_reshaped_value_read_elsewhere_too_is_not_written_over(form, monkeypatch):
    """LiteRT's builtin kernels with their default memory planner (LiteRT issues #8889,
    #8928) let the ADD of the scalar write over the count's buffer, which the other op has
    yet to read: direct_rewrites.unshared_moves gives the RESHAPE its input to itself (the
    other reader reads its result, or the RESHAPE a copy). Wrong values without it."""
    from onnx2tf_alt.tflite import direct_rewrites

    model, feeds = _moved_and_read(form)
    expected = ort_run(model, feeds)
    for guarded in (True, False):
        if not guarded:
            monkeypatch.setattr(direct_rewrites, "unshared_moves", lambda flat, outputs: None)
        planned = plan_loaded(load_model(None, model))
        result = write_direct(planned.graph, planned.plan, planned.options)
        got = _builtin_run(result.content, feeds)
        same = all(np.array_equal(np.asarray(g).reshape(e.shape), e)
                   for g, e in zip(got, expected))
        assert same == guarded, (guarded, got, expected)


def test_a_model_past_the_inline_bound_is_packed_with_its_buffers_after(monkeypatch):
    """pack_model past MAX_INLINE bytes of buffers (2 GB; lowered here) stores them after
    the flatbuffer, aligned; unpack_model reads them back as they were, and the
    interpreter runs the file as the inline one."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.pipeline import float32_planned
    from onnx2tf_alt.tflite import flatbuffer

    path = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")
    planned = float32_planned(plan_loaded(load_model(path)))
    content = write_direct(planned.graph, planned.plan, planned.options).content
    model = flatbuffer.unpack_model(content)
    monkeypatch.setattr(flatbuffer, "MAX_INLINE", 0)
    packed = flatbuffer.pack_model(model)
    flat = flatbuffer.read_model(packed)
    offsets = [flat.Buffers(i).Offset() for i in range(flat.BuffersLength())]
    assert sum(o > 1 for o in offsets) >= 10 and all(o % 16 == 0 for o in offsets)
    again = flatbuffer.unpack_model(packed)
    assert [None if b.data is None else bytes(b.data) for b in again.buffers] == [
        None if b.data is None else bytes(b.data) for b in model.buffers]
    x = np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype(np.float32)
    outputs = []
    for file in (content, packed):
        runner = Interpreter(model_content=file).get_signature_runner("serving_default")
        outputs.append(runner(**{next(iter(runner.get_input_details())): x}))
    assert outputs[0].keys() == outputs[1].keys()
    for key in outputs[0]:
        np.testing.assert_array_equal(outputs[0][key], outputs[1][key])


@pytest.mark.parametrize("stored", [False, True])
def test_buffer_data_written_in_place_is_the_repacked_file(stored, monkeypatch):
    """flatbuffer.with_buffer_data (bias correction's edit): a file with some buffers'
    values replaced where they lie is byte for byte the file the unpack-edit-pack round
    trip writes, buffers inline or stored after the flatbuffer; a value of another length
    is refused."""
    from onnx2tf_alt.tflite import flatbuffer

    path = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")
    planned = plan_loaded(load_model(path))
    content = write_direct(planned.graph, planned.plan, planned.options).content
    if stored:
        monkeypatch.setattr(flatbuffer, "MAX_INLINE", 0)
    content = flatbuffer.pack_model(flatbuffer.unpack_model(content))
    model = flatbuffer.unpack_model(content)
    filled = [k for k, b in enumerate(model.buffers) if b.data is not None and len(b.data)]
    rng = np.random.default_rng(1)
    edits = {k: rng.integers(0, 256, len(model.buffers[k].data)).astype(np.uint8)
             for k in filled[::3]}
    assert len(edits) >= 3
    for k, values in edits.items():
        model.buffers[k].data = values
    assert flatbuffer.with_buffer_data(content, edits) == flatbuffer.pack_model(model)
    with pytest.raises(ValueError, match="bytes"):
        flatbuffer.with_buffer_data(content, {filled[0]: np.zeros(3, np.uint8)})
