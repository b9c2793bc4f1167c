"""DepthToSpace and SpaceToDepth against onnxruntime, through TF and TFLite."""

import numpy as np
import pytest
from onnx import helper

from onnx2tf_alt.tflite.lowering import tflite_bytes

from harness import check_model, check_node, count_tflite_ops, make_model

rng = np.random.default_rng(0)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("block, shape", [(2, (2, 12, 3, 5)), (3, (2, 18, 5, 3))])
def test_depth_to_space(mode, block, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    check_node("DepthToSpace", {"x": x}, {"blocksize": block, "mode": mode}, opset=13)


def test_depth_to_space_opset1_is_dcr():
    x = rng.standard_normal((2, 8, 3, 5)).astype(np.float32)
    check_node("DepthToSpace", {"x": x}, {"blocksize": 2}, opset=9)


def test_depth_to_space_crd_single_output_channel_needs_no_gather():
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    converted = check_node("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": "CRD"})
    assert count_tflite_ops(tflite_bytes(converted.result)) == {"DEPTH_TO_SPACE": 1}


@pytest.mark.parametrize("block, shape", [(2, (2, 3, 6, 4)), (3, (2, 2, 9, 6))])
def test_space_to_depth(block, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    check_node("SpaceToDepth", {"x": x}, {"blocksize": block})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("block, shape", [(2, (2, 3, 6, 4)), (3, (1, 2, 9, 6))])
def test_space_to_depth_modes(mode, block, shape):
    """Opset 28 adds CRD: one channel gather after SPACE_TO_DEPTH, no transpose."""
    x = rng.standard_normal(shape).astype(np.float32)
    converted = check_node("SpaceToDepth", {"x": x}, {"blocksize": block, "mode": mode}, opset=28)
    ops = count_tflite_ops(tflite_bytes(converted.result))
    assert ops == ({"SPACE_TO_DEPTH": 1, "GATHER": 1} if mode == "CRD" else {"SPACE_TO_DEPTH": 1})


@pytest.mark.parametrize(
    "op, attrs",
    [("DepthToSpace", {"blocksize": 2, "mode": "CRD"}), ("SpaceToDepth", {"blocksize": 2})],
)
def test_integer_data(op, attrs):
    x = rng.integers(0, 255, (2, 8, 4, 6)).astype(np.uint8)
    check_node(op, {"x": x}, attrs)


@pytest.mark.parametrize(
    "op, attrs, mid_channels",
    [
        ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, 2),
        ("DepthToSpace", {"blocksize": 2, "mode": "DCR"}, 2),
        ("SpaceToDepth", {"blocksize": 2}, 32),
    ],
)
def test_conv_op_conv_has_no_transpose(op, attrs, mid_channels):
    x = rng.standard_normal((2, 3, 6, 10)).astype(np.float32)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, mid_channels, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node(op, ["c1"], ["s"], **attrs),
        helper.make_node("Conv", ["s", "w2"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2})
    converted = check_model(model, {"x": x})
    ops = count_tflite_ops(tflite_bytes(converted.result))
    assert "TRANSPOSE" not in ops, ops
