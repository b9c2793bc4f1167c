"""Channel shuffles (Reshape -> Transpose -> Reshape that only reorders channels) fold into the
weights of the dense Conv they feed or that feeds them: same numbers as onnxruntime, no
TRANSPOSE and no GATHER in the TFLite. Other shuffles keep RESHAPE + TRANSPOSE + RESHAPE:
XNNPACK runs that about twice as fast as one GATHER, which it does not delegate (measured:
conv -> shuffle -> conv on 1x28x28x116 at 1 thread, 0.28 ms against 0.43 ms; GATHER costs
shufflenet_v2_x0_5 6.1 ms against 4.1 ms)."""

import numpy as np
import pytest
from onnx import helper

from onnx2tf_alt.passes.prepare import infer_shapes, prepare_model
from onnx2tf_alt.passes.shuffle import absorb_channel_shuffles

from harness import check_model, count_tflite_ops, make_model

rng = np.random.default_rng(3)


def randn(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def shuffle_nodes(src: str, dst: str, suffix: str = ""):
    return [
        helper.make_node("Reshape", [src, "split_shape"], [f"r{suffix}"]),
        helper.make_node("Transpose", [f"r{suffix}"], [f"t{suffix}"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", [f"t{suffix}", "merge_shape"], [dst]),
    ]


def shuffle_model(batch, channels, groups, size, split=None, before="conv", after="conv"):
    """x -> [Conv] -> channel shuffle (groups) -> [Conv | Relu | two Convs], as ShuffleNet
    exports it."""
    h, w = size
    inits = {
        "w1": randn(channels, 3, 3, 3), "b1": randn(channels),
        "w2": randn(5, channels, 1, 1), "b2": randn(5), "w3": randn(4, channels, 3, 1),
        "split_shape": np.array(split or [batch, groups, channels // groups, h, w], np.int64),
        "merge_shape": np.array([batch, channels, h, w], np.int64),
    }
    nodes = []
    if before == "conv":
        nodes.append(helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]))
        feeds = {"x": rng.standard_normal((batch, 3, h, w)).astype(np.float32)}
    else:
        nodes.append(helper.make_node("Relu", ["x"], ["c"]))
        feeds = {"x": rng.standard_normal((batch, channels, h, w)).astype(np.float32)}
    nodes += shuffle_nodes("c", "s")
    outputs = ["y"]
    if after == "conv":
        nodes.append(helper.make_node("Conv", ["s", "w2", "b2"], ["y"]))
    elif after == "two convs":
        nodes.append(helper.make_node("Conv", ["s", "w2", "b2"], ["y"]))
        nodes.append(helper.make_node("Conv", ["s", "w3"], ["z"], pads=[1, 0, 1, 0]))
        outputs.append("z")
    else:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    inits = {k: v for k, v in inits.items() if any(k in n.input for n in nodes)}
    return make_model(nodes, feeds, outputs, inits), feeds


@pytest.mark.parametrize("batch,channels,groups,size", [
    (1, 12, 3, (5, 7)), (2, 8, 2, (4, 4)), (3, 24, 4, (6, 3)),
])
def test_shuffle_between_convs_folds_into_weights(batch, channels, groups, size):
    model, feeds = shuffle_model(batch, channels, groups, size)
    ops = [n.op_type for n in prepare_model(model).graph.node]
    assert ops == ["Conv", "Conv"], ops
    converted = check_model(model, feeds)
    census = count_tflite_ops(converted.tflite)
    assert "TRANSPOSE" not in census and "GATHER" not in census, census
    assert census.get("CONV_2D") == 2, census


@pytest.mark.parametrize("after", ["conv", "two convs"])
def test_shuffle_before_convs_folds_into_their_inputs(after):
    """Not produced by a conv (Relu): the consuming convs read the unshuffled channels."""
    model, feeds = shuffle_model(2, 12, 4, (5, 6), before="relu", after=after)
    prepared = prepare_model(model)
    assert [n.op_type for n in prepared.graph.node] == ["Relu", "Conv"] + ["Conv"] * (
        after == "two convs")
    assert not any(i.name in ("w2", "w3") for i in prepared.graph.initializer)
    converted = check_model(model, feeds)
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)


def test_shuffle_after_conv_folds_into_its_outputs():
    """Read by a Relu: the producing conv's output channels and bias are reordered."""
    model, feeds = shuffle_model(3, 12, 3, (4, 7), after="relu")
    assert [n.op_type for n in prepare_model(model).graph.node] == ["Conv", "Relu"]
    converted = check_model(model, feeds)
    assert "TRANSPOSE" not in count_tflite_ops(converted.tflite)


def test_shuffle_with_inferred_dims_folds():
    """-1 and 0 in the reshape targets, as torch's view(b, g, -1, h, w) exports them."""
    model, feeds = shuffle_model(2, 12, 3, (4, 5), split=[0, 3, -1, 4, 5])
    assert [n.op_type for n in prepare_model(model).graph.node] == ["Conv", "Conv"]
    check_model(model, feeds)


def test_shuffle_without_dense_conv_is_one_transpose():
    """Between a Relu and a grouped Conv (ShuffleNet v1) nothing can absorb the shuffle: it
    stays RESHAPE + TRANSPOSE + RESHAPE, channel-last, and never becomes a GATHER."""
    batch, channels, h, w = 2, 12, 5, 6
    inits = {
        "w0": randn(channels, 3, 1, 1), "wg": randn(channels, channels // 3, 3, 3),
        "split_shape": np.array([batch, 3, channels // 3, h, w], np.int64),
        "merge_shape": np.array([batch, channels, h, w], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Relu", ["c0"], ["c"]),
        *shuffle_nodes("c", "s"),
        helper.make_node("Conv", ["s", "wg"], ["y"], group=3, pads=[1, 1, 1, 1]),
    ]
    feeds = {"x": rng.standard_normal((batch, 3, h, w)).astype(np.float32)}
    model = make_model(nodes, feeds, ["y"], inits)
    assert not absorb_channel_shuffles(infer_shapes(model))
    converted = check_model(model, feeds)
    census = count_tflite_ops(converted.tflite)
    assert census.get("TRANSPOSE") == 1 and "GATHER" not in census, census


def test_shuffle_read_by_graph_output_and_conv_folds_into_producer():
    """The shuffled value is also a graph output, so the reading conv cannot skip it; the
    producing conv takes the reordering instead."""
    model, feeds = shuffle_model(1, 8, 2, (3, 4))
    model.graph.output.extend([
        helper.make_tensor_value_info("s", model.graph.output[0].type.tensor_type.elem_type,
                                      [1, 8, 3, 4]),
    ])
    assert [n.op_type for n in prepare_model(model).graph.node] == ["Conv", "Conv"]
    check_model(model, feeds)


def test_chain_moving_two_axes_is_kept():
    """Regrouping C with H and W moves elements along two axes: not a channel shuffle."""
    feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}
    inits = {"s1": np.array([2, 3, 20], np.int64), "s2": np.array([2, 3, 4, 5], np.int64)}
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "s2"], ["y"]),
    ]
    model = make_model(nodes, feeds, ["y"], inits)
    assert not absorb_channel_shuffles(infer_shapes(model))
    assert "Transpose" in [n.op_type for n in prepare_model(model).graph.node]
    check_model(model, feeds)
