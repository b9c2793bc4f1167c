import numpy as np
import pytest
from onnx import helper

from harness import check_nodes

rng = np.random.default_rng(0)

OPS = ["Softmax", "LogSoftmax", "Hardmax"]


def check_each(shape, attrs, opset, channel_last=False, ops=OPS):
    """One model with a node per op (each on its own input), checked in one conversion."""
    feeds = {f"x_{op}": (3 * rng.standard_normal(shape)).astype(np.float32) for op in ops}
    nodes = [helper.make_node(op, [f"x_{op}"], [f"y_{op}"], **attrs) for op in ops]
    layout = {"keep_nwc_or_nhwc_or_ndhwc_input_names": list(feeds)} if channel_last else {}
    check_nodes(nodes, feeds, opset=opset, **layout)


@pytest.mark.parametrize(
    "shape, axis, channel_last",
    [((2, 3, 5, 4), None, False), ((2, 3, 5, 4), 1, True), ((2, 3, 5, 4), -1, True),
     ((2, 3, 5, 4), 2, True), ((2, 3, 5, 4), 0, False), ((3, 7), 0, False),
     ((2, 5, 3, 4, 3), 1, True)],
)
def test_softmax_single_axis(shape, axis, channel_last):
    attrs = {} if axis is None else {"axis": axis}
    check_each(shape, attrs, opset=13, channel_last=channel_last)


@pytest.mark.parametrize(
    "shape, axis, channel_last",
    [((2, 3, 5, 4), None, False), ((2, 3, 5, 4), None, True), ((2, 3, 5, 4), 2, True),
     ((2, 3, 5, 4), -1, True), ((2, 3, 5, 4), 0, False), ((2, 3, 1, 1), 1, True),
     ((2, 1, 4, 1), 1, True), ((3, 7), 1, False)],
)
def test_softmax_flattened_tail_before_13(shape, axis, channel_last):
    attrs = {} if axis is None else {"axis": axis}
    check_each(shape, attrs, opset=11, channel_last=channel_last)


def test_hardmax_ties_pick_the_first():
    feeds = {"x": rng.integers(0, 2, (2, 3, 4, 5)).astype(np.float32)}
    for opset, axis in ((13, 1), (11, 2)):
        nodes = [helper.make_node("Hardmax", ["x"], ["y"], axis=axis)]
        check_nodes(nodes, feeds, opset=opset, keep_nwc_or_nhwc_or_ndhwc_input_names=["x"])


@pytest.mark.parametrize(
    "op, opset, tflite_op",
    [("Softmax", 13, "SOFTMAX"), ("Softmax", 11, "SOFTMAX"), ("LogSoftmax", 13, "LOG_SOFTMAX")],
)
def test_conv_softmax_channels_has_no_transpose(op, opset, tflite_op):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((2, 4, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(op, ["c"], ["s"], axis=1),
        helper.make_node("Conv", ["s", "w2"], ["y"]),
    ]
    _, ops = check_nodes(nodes, {"x": x}, {"w": w, "w2": w2}, opset, outputs=["y"])
    assert "TRANSPOSE" not in ops and ops.get(tflite_op) == 1, ops
