"""Convolutions and pools over a data-dependent number of rows (onnx2tf_alt/passes/empty_rows.py),
as a detector's per-region heads: with zero rows (an image with no detection) the TFLite
file must still run under XNNPACK and the TF model give the right shape; with rows, the
values match onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.passes.empty_rows import guard_empty_rows

from harness import check_model, make_model

rng = np.random.default_rng(4)


def _head(fragile: list[onnx.NodeProto]) -> onnx.ModelProto:
    """Rows of `features` whose score passes 0.5 (NonZero: a count known at run time)
    through `fragile` ops reading `rows` and writing `y`; `y` also feeds a ReduceSum."""
    nodes = [
        helper.make_node("Greater", ["scores", "half"], ["passed"]),
        helper.make_node("NonZero", ["passed"], ["where"]),
        helper.make_node("Squeeze", ["where", "axis0"], ["picked"]),
        helper.make_node("Gather", ["features", "picked"], ["rows"], axis=0),
        *fragile,
        helper.make_node("ReduceSum", ["y", "axes123"], ["total"], keepdims=0),
    ]
    inits = {"half": np.array(0.5, np.float32), "axis0": np.array([0], np.int64),
             "axes123": np.array([1, 2, 3], np.int64),
             "w1": rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3,
             "b1": rng.standard_normal(6).astype(np.float32),
             "w2": rng.standard_normal((6, 6, 3, 3)).astype(np.float32) * 0.3,
             "wt": rng.standard_normal((6, 3, 4, 4)).astype(np.float32) * 0.3}
    feeds = {"features": rng.standard_normal((9, 4, 6, 6)).astype(np.float32),
             "scores": np.zeros(9, np.float32)}
    return make_model(nodes, feeds, ["y", "total"], inits, opset=17)


CONV_CHAIN = [helper.make_node("Conv", ["rows", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c1"], ["r1"]),
              helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
              helper.make_node("Add", ["c2", "r1"], ["y"])]
POOLS = [helper.make_node("MaxPool", ["rows"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[3, 3])]
UPSAMPLE = [helper.make_node("Conv", ["rows", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("ConvTranspose", ["r1", "wt"], ["y"], strides=[2, 2],
                             pads=[1, 1, 1, 1])]


@pytest.mark.parametrize("ops", [CONV_CHAIN, POOLS, UPSAMPLE], ids=["convs", "pools", "deconv"])
@pytest.mark.parametrize("passing", [0, 1, 4])
def test_heads_on_zero_one_and_several_rows(ops, passing):
    model = _head(ops)
    scores = np.zeros(9, np.float32)
    scores[rng.choice(9, passing, replace=False)] = 1.0
    feeds = {"features": rng.standard_normal((9, 4, 6, 6)).astype(np.float32),
             "scores": scores}
    check_model(model, feeds)


def test_only_data_dependent_rows_are_guarded():
    """A batch the user chooses (a symbol of a graph input) is left alone; the count that
    NonZero makes is guarded once for its whole region: one Pad at its entry, a Slice at
    each of its two exits (the Add outside it reads c2 and r1)."""
    weights = {"w1": np.zeros((6, 4, 3, 3), np.float32), "b1": np.zeros(6, np.float32),
               "w2": np.zeros((6, 6, 3, 3), np.float32)}
    user = make_model(CONV_CHAIN, {"rows": np.zeros((2, 4, 6, 6), np.float32)}, ["y"],
                      weights, opset=17, input_shapes={"rows": ["batch", 4, 6, 6]})
    assert guard_empty_rows(onnx.shape_inference.infer_shapes(user)) == 0
    model = onnx.shape_inference.infer_shapes(_head(CONV_CHAIN))
    assert guard_empty_rows(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert (ops.count("Pad"), ops.count("Slice")) == (1, 2)
    onnx.checker.check_model(model)


def test_a_region_whose_entries_have_unknown_channels_is_left_alone():
    """Run-time Resize scales leave every dim unknown to ONNX inference: a padded copy
    could not keep the channel count the next Conv needs (it would need Flex)."""
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("Conv", ["r", "w1", "b1"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": np.zeros((2, 4, 6, 6), np.float32),
                               "scales": np.ones(4, np.float32)}, ["y"],
                       {"w1": np.zeros((6, 4, 3, 3), np.float32), "b1": np.zeros(6, np.float32)},
                       opset=17)
    assert guard_empty_rows(onnx.shape_inference.infer_shapes(model)) == 0
