"""torch's GroupNorm export (Reshape -> InstanceNormalization -> Reshape, below opset 18)
runs channel-last with no TRANSPOSE (onnx2tf_alt/group_norm.py); checked against
onnxruntime through TF and the float32 TFLite."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from harness import check_model, count_tflite_ops, make_model

rng = np.random.default_rng(0)


def group_norm_block(channels: int, groups: int, scale=None):
    """Conv -> torch-style GroupNorm (affine Mul/Add after) -> Relu -> Conv, opset 17."""
    inits = {
        "w1": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((5, channels, 1, 1)).astype(np.float32) * 0.3,
        "shape": np.array([0, groups, -1], np.int64),
        "ones": np.ones(groups, np.float32) if scale is None else scale,
        "zeros": np.zeros(groups, np.float32),
        "gamma": rng.standard_normal((channels, 1, 1)).astype(np.float32),
        "beta": rng.standard_normal((channels, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["r"]),
        helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-3),
        helper.make_node("Shape", ["c"], ["s"]),
        helper.make_node("Reshape", ["n", "s"], ["g"]),
        helper.make_node("Mul", ["g", "gamma"], ["a"]),
        helper.make_node("Add", ["a", "beta"], ["b"]),
        helper.make_node("Relu", ["b"], ["relu"]),
        helper.make_node("Conv", ["relu", "w2"], ["y"]),
    ]
    return nodes, inits


@pytest.mark.parametrize("dims, transposes", [([2, 3, 9, 7], 0), (["N", 3, "H", "W"], 2)],
                         ids=["static", "dynamic"])
def test_torch_group_norm_runs_channel_last(dims, transposes):
    """Static dims (Shape folded to a constant): no TRANSPOSE, against 4 before. Unknown
    spatial dims (Shape kept): merging two unknown dims in one reshape runs logically in
    the plan, so 2 remain (around the grouped statistics). Batch 2, opsets 17 and 18."""
    nodes, inits = group_norm_block(channels=12, groups=4)
    feeds = {"x": (rng.standard_normal((2, 3, 9, 7)) * 2 + 1).astype(np.float32)}
    for opset in (17, 18):
        model = make_model(nodes, feeds, ["y"], inits, opset=opset, input_shapes={"x": dims})
        converted = check_model(model, feeds)
        assert "InstanceNormalization" not in {n.op_type for n in converted.graph.nodes}
        assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == transposes


def test_group_norm_with_a_learned_instance_scale_is_left_as_it_is():
    """Only torch's pattern (InstanceNormalization scale 1, bias 0) is rewritten."""
    nodes, inits = group_norm_block(channels=6, groups=3,
                                    scale=np.array([0.5, 2.0, -1.0], np.float32))
    feeds = {"x": rng.standard_normal((1, 3, 5, 6)).astype(np.float32)}
    converted = check_model(make_model(nodes, feeds, ["y"], inits), feeds)
    assert "InstanceNormalization" in {n.op_type for n in converted.graph.nodes}
