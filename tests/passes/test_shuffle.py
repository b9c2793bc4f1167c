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


def shufflenet_v2_units(units: int, channels: int = 116, size: int = 28, batch: int = 1):
    """A ShuffleNet V2 stage as torchvision exports it: a stride-2 unit (two branches from
    the stage input, concatenated and shuffled in 2 groups) and `units` stride-1 units (the
    pass-through half and the branch, 1x1 conv, 3x3 depthwise conv, 1x1 conv, concatenated,
    shuffled and split in halves again)."""
    half = channels // 2
    inits = {
        "split_shape": np.array([batch, 2, half, size, size], np.int64),
        "merge_shape": np.array([batch, channels, size, size], np.int64),
        "starts0": np.array([0], np.int64), "ends0": np.array([half], np.int64),
        "starts1": np.array([half], np.int64), "ends1": np.array([channels], np.int64),
        "axis": np.array([1], np.int64),
        "w_in": randn(24, 3, 3, 3, scale=0.2),
        "l_dw": randn(24, 1, 3, 3), "l_pw": randn(half, 24, 1, 1),
        "r_pw": randn(half, 24, 1, 1), "r_dw": randn(half, 1, 3, 3),
        "r_out": randn(half, half, 1, 1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w_in"], ["stem"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["stem", "l_dw"], ["s1"], group=24, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["s1", "l_pw"], ["s1p"]),
        helper.make_node("Relu", ["s1p"], ["left"]),
        helper.make_node("Conv", ["stem", "r_pw"], ["s2p"]),
        helper.make_node("Relu", ["s2p"], ["s2r"]),
        helper.make_node("Conv", ["s2r", "r_dw"], ["s2d"], group=half, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["s2d", "r_out"], ["s2q"]),
        helper.make_node("Relu", ["s2q"], ["right"]),
        helper.make_node("Concat", ["left", "right"], ["c_in"], axis=1),
        *shuffle_nodes("c_in", "y0", suffix="_in"),
    ]
    for k in range(units):
        nodes += [
            helper.make_node("Slice", [f"y{k}", "starts0", "ends0", "axis"], [f"a{k}"]),
            helper.make_node("Slice", [f"y{k}", "starts1", "ends1", "axis"], [f"b{k}"]),
        ]
        inits |= {f"p{k}": randn(half, half, 1, 1), f"d{k}": randn(half, 1, 3, 3),
                  f"q{k}": randn(half, half, 1, 1)}
        nodes += [
            helper.make_node("Conv", [f"b{k}", f"p{k}"], [f"bp{k}"]),
            helper.make_node("Relu", [f"bp{k}"], [f"br{k}"]),
            helper.make_node("Conv", [f"br{k}", f"d{k}"], [f"bd{k}"], group=half,
                             pads=[1, 1, 1, 1]),
            helper.make_node("Conv", [f"bd{k}", f"q{k}"], [f"bq{k}"]),
            helper.make_node("Relu", [f"bq{k}"], [f"bo{k}"]),
            helper.make_node("Concat", [f"a{k}", f"bo{k}"], [f"c{k}"], axis=1),
            *shuffle_nodes(f"c{k}", f"y{k + 1}", suffix=str(k)),
        ]
    inits["w_out"] = randn(32, channels, 1, 1)  # the conv after the stage (conv5)
    nodes.append(helper.make_node("Conv", [f"y{units}", "w_out"], ["out"]))
    feeds = {"x": rng.standard_normal((batch, 3, 2 * size, 2 * size)).astype(np.float32)}
    return make_model(nodes, feeds, ["out"], inits), feeds


def _narrow_transposes(content: bytes) -> list:
    """The TRANSPOSEs of a .tflite that move the innermost axis between tiles 2 wide."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    flat = unpack_model(content)
    graph = flat.subgraphs[0]
    found = []
    for op in graph.operators:
        if op_name(flat, op) != "TRANSPOSE":
            continue
        shape = list(graph.tensors[op.inputs[0]].shape)
        perm = np.frombuffer(bytes(flat.buffers[graph.tensors[op.inputs[1]].buffer].data),
                             np.int32)
        kept = [a for a in perm if shape[a] != 1]
        if kept[-1] != max(kept) and min(shape[kept[-1]], shape[max(kept)]) <= 2:
            found.append(shape)
    return found


def test_shufflenet_v2_shuffles_move_whole_planes(monkeypatch):
    """Channel-last, a 2-group shuffle interleaves single values ([HW, 2, C/2] -> [HW, C/2,
    2]: XNNPACK moved 0.24 ns per value against 0.09 for an NHWC -> NCHW transpose). Costed
    so (layout/cost.py NARROW_TILE), the plan runs the stage's pass-through half
    channel-first, where a shuffle moves whole planes: of the three shuffles left (the last
    one folds into the conv after the stage), two stop being narrow; costed as any
    transpose, all three are."""
    from onnx2tf_alt.layout import cost as LC

    from harness import both_routes

    model, feeds = shufflenet_v2_units(3)
    converted = check_model(model, feeds)
    assert len(_narrow_transposes(converted.tflite)) == 1
    both_routes(model, feeds, tol=1e-4)
    monkeypatch.setattr(LC, "NARROW_TILE", ())
    assert len(_narrow_transposes(check_model(model, feeds).tflite)) == 3
