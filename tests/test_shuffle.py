"""Channel shuffles (Reshape -> Transpose -> Reshape that only reorders one axis) become one
Gather: same numbers as onnxruntime, no TRANSPOSE in the TFLite; other chains stay as they are."""

import numpy as np
import pytest
from onnx import helper

from onnx2tf_alt.prepare import infer_shapes, prepare_model
from onnx2tf_alt.shuffle import shuffles_to_gather

from harness import check_model, count_tflite_ops, make_model

rng = np.random.default_rng(3)


def shuffle_model(batch: int, channels: int, groups: int, size: tuple[int, int], split=None):
    """Conv -> channel shuffle (groups) -> Conv, as ShuffleNet v1/v2 export it."""
    h, w = size
    inits = {
        "w1": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((5, channels, 1, 1)).astype(np.float32) * 0.3,
        "split_shape": np.array(split or [batch, groups, channels // groups, h, w], np.int64),
        "merge_shape": np.array([batch, channels, h, w], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "split_shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "merge_shape"], ["s"]),
        helper.make_node("Conv", ["s", "w2"], ["y"]),
    ]
    feeds = {"x": rng.standard_normal((batch, 3, h, w)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("batch,channels,groups,size", [
    (1, 12, 3, (5, 7)), (2, 8, 2, (4, 4)), (3, 24, 4, (6, 3)),
])
def test_channel_shuffle_is_one_gather(batch, channels, groups, size):
    model, feeds = shuffle_model(batch, channels, groups, size)
    ops = [n.op_type for n in prepare_model(model).graph.node]
    assert ops == ["Conv", "Gather", "Conv"], ops
    converted = check_model(model, feeds)
    census = count_tflite_ops(converted.tflite)
    assert census.get("TRANSPOSE", 0) == 0, census
    assert census.get("GATHER", 0) == 1, census


def test_shuffle_with_inferred_dims_is_one_gather():
    """-1 and 0 in the reshape targets, as torch's view(b, g, -1, h, w) exports them."""
    model, feeds = shuffle_model(2, 12, 3, (4, 5), split=[0, 3, -1, 4, 5])
    assert [n.op_type for n in prepare_model(model).graph.node] == ["Conv", "Gather", "Conv"]
    check_model(model, feeds)


def test_chain_moving_two_axes_is_kept():
    """Regrouping C with H and W moves elements along two axes: not a single-axis gather."""
    feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}
    inits = {"s1": np.array([2, 3, 20], np.int64), "s2": np.array([2, 3, 4, 5], np.int64)}
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "s2"], ["y"]),
    ]
    model = make_model(nodes, feeds, ["y"], inits)
    assert not shuffles_to_gather(infer_shapes(model))
    assert "Transpose" in [n.op_type for n in prepare_model(model).graph.node]
    check_model(model, feeds)
