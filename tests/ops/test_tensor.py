"""Concat, Split, Slice, Gather, Pad, EyeLike (ops/tensor.py) against onnxruntime, TF and
TFLite.

Attribute variants of one op share a model (one conversion); check_both_layouts runs each
on a value in ONNX order and on one kept channel-last.
"""

import numpy as np
import pytest

from harness import (
    Rng,
    check_both_layouts,
    check_model,
    check_node,
    check_nodes,
    count_tflite_ops,
    ints,
    make_model,
    node,
)

rng = Rng(0)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def check_between_convs(middle, inits=None, channels=4, out_channels=None):
    """x -> Conv 'a' -> `middle` nodes (ending in 'm') -> Conv: no TRANSPOSE in the TFLite."""
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        *middle,
        node("Conv", ["m", "w2"], "y", pads=[1, 1, 1, 1]),
    ]
    inits = {"w1": rng.conv_weights(channels, 3),
             "w2": rng.conv_weights(2, out_channels or channels), **(inits or {})}
    converted, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits, outputs=["y"])
    assert census.get("TRANSPOSE", 0) == 0
    return converted


# --- Concat --------------------------------------------------------------------------------
def test_concat():
    inits = {f"c{a}": rng.randn(*[2 if i == a % 4 else s for i, s in enumerate((2, 3, 5, 7))])
             for a in (0, 1, -1, 2)}
    check_both_layouts(
        lambda src: [node("Concat", [src, f"c{a}", src], f"{src}_{a}", axis=a)
                     for a in (0, 1, -1, 2)],
        rng.randn(2, 3, 5, 7), inits)


def test_concat_dynamic_batch_and_opset11():
    check_both_layouts(lambda src: [node("Concat", [src, "c", src], f"{src}_0", axis=1)],
                       rng.randn(2, 3, 5, 7), {"c": rng.randn(2, 2, 5, 7)},
                       input_shape=["N", 3, 5, 7])
    check_both_layouts(lambda src: [node("Concat", ["c", src], f"{src}_0", axis=-1)],
                       rng.randn(2, 3, 5, 7), {"c": rng.randn(2, 3, 5, 2)}, opset=11)


@pytest.mark.parametrize("count, concats", [(6, 2), (12, 4), (27, 8)])
def test_concat_of_many_inputs_stays_on_the_delegate(count, concats):
    """XNNPACK takes a CONCATENATION of at most 5 inputs: a DenseNet-style concat of more is
    a tree of such ops (groups of 5 in order, level by level: 27 -> 6 -> 2 -> 1), all
    delegated, one partition."""
    from onnx2tf_alt.export.delegates import xnnpack_partitions

    names = [f"p{i}" for i in range(count)]
    nodes = [node("Relu", ["x"], "r")]
    nodes += [node("Mul", ["r", f"s{i}"], names[i]) for i in range(count)]
    nodes.append(node("Concat", names, "y", axis=1))
    inits = {f"s{i}": np.float32(i + 1) for i in range(count)}
    feeds = {"x": rng.randn(2, 3, 4, 5)}
    converted = check_model(make_model(nodes, feeds, ["y"], inits), feeds)
    assert count_tflite_ops(converted.tflite)["CONCATENATION"] == concats
    assert xnnpack_partitions(converted.tflite)[1] == 1


def test_concat_two_convs_has_no_transpose():
    nodes = [
        node("Conv", ["a", "wb"], "b", pads=[1, 1, 1, 1]),
        node("Concat", ["a", "b"], "m", axis=1),
    ]
    check_between_convs(nodes, {"wb": rng.conv_weights(3, 4)}, out_channels=7)


def test_concat_constant_first_keeps_channel_last():
    """The constant is input 0, but the plan follows the computed input's perm."""
    nodes = [node("Concat", ["c", "a"], "m", axis=1)]
    converted = check_between_convs(nodes, {"c": rng.randn(2, 2, 8, 6)}, out_channels=6)
    assert not converted.plan.transposes(converted.graph)


# --- Split ---------------------------------------------------------------------------------
def outs(src, tag, count):
    return [f"{src}_{tag}_{i}" for i in range(count)]


def test_split_opset11_attribute():
    cases = [(1, [1, 2]), (-1, [2, 2, 3]), (0, None), (2, [5])]
    check_both_layouts(
        lambda src: [node("Split", [src], outs(src, k, len(s) if s else 2), axis=a,
                          **({"split": s} if s else {}))
                     for k, (a, s) in enumerate(cases)],
        rng.randn(2, 3, 5, 7), opset=11)


def test_split_opset13_input():
    cases = [(2, [1, 4]), (-1, [3, 1, 4]), (3, None)]
    inits = {f"s{k}": ints(*s) for k, (_, s) in enumerate(cases) if s}
    check_both_layouts(
        lambda src: [node("Split", [src, f"s{k}"] if s else [src],
                          outs(src, k, len(s) if s else 2), axis=a)
                     for k, (a, s) in enumerate(cases)],
        rng.randn(2, 3, 5, 8), inits, opset=13)


def test_split_num_outputs_uneven():
    cases = [(3, 3), (2, 2), (4, -1), (3, 1)]
    check_both_layouts(
        lambda src: [node("Split", [src], outs(src, k, n), axis=a, num_outputs=n)
                     for k, (n, a) in enumerate(cases)],
        rng.randn(2, 3, 5, 7))


def test_split_ops_are_delegated():
    """Unequal chunks become one SLICE each and equal ones one SPLIT: no SPLIT_V, which the
    XNNPACK delegate does not take (an attention's q, k, v split fell off it)."""
    nodes = [node("Split", ["x", "s"], ["q", "k", "v"], axis=1),
             node("Split", ["x"], ["a", "b"], axis=3, num_outputs=2)]
    _, counts = check_nodes(nodes, {"x": rng.randn(2, 7, 3, 6)}, {"s": ints(2, 2, 3)}, opset=18)
    assert counts.get("SLICE") == 3 and counts.get("SPLIT") == 1, counts
    assert "SPLIT_V" not in counts, counts


def test_split_dynamic_batch():
    check_both_layouts(
        lambda src: [node("Split", [src], outs(src, 0, 3), axis=1, num_outputs=3),
                     node("Split", [src], outs(src, 1, 2), axis=-1, num_outputs=2)],
        rng.randn(2, 3, 5, 7), input_shape=["N", 3, 5, 7])


def test_split_between_convs_has_no_transpose():
    nodes = [
        node("Split", ["a", "s"], ["p", "q"], axis=1),
        node("Conv", ["q", "wq"], "r", pads=[1, 1, 1, 1]),
        node("Add", ["p", "r"], "m"),
    ]
    check_between_convs(nodes, {"s": ints(2, 3), "wq": rng.conv_weights(2, 3)}, channels=5,
                        out_channels=2)


def test_split_runtime_sizes():
    """Sizes fed at run time: static from the inferred output shapes (first node), a run-time
    size tensor where the outputs feed other ops and have no inferred shape (second)."""
    feeds = {"x": rng.randn(2, 6, 3), "s": ints(2, 4), "t": ints(1, 0, 2)}
    nodes = [
        node("Split", ["x", "s"], ["a", "b"], axis=1),
        node("Split", ["x", "t"], ["c", "d", "e"], axis=-1),
        *[node("Neg", [v], f"n{v}") for v in "cde"],
    ]
    check_nodes(nodes, feeds, outputs=["a", "b", "nc", "nd", "ne"])


# --- Slice ---------------------------------------------------------------------------------
SLICES = [
    ([1], [3], [1], None),
    ([0, 1], [INT64_MAX, -1], [2, 3], None),
    ([-1], [INT64_MIN], [3], [-1]),
    ([4, -2], [0, -100], [2, 1], [-2, -1]),
    ([-100, 10], [100, -10], [1, 2], [3, -1]),
    ([0, 0, 1], [2, 1, 5], [0, 1, 3], [1, 1, 2]),
    ([-9, 7], [-9, -9], [2, 3], [-1, -2]),
    ([1, 0], [2, -1], None, None),
]


def slice_inits():
    inits = {}
    for k, (starts, ends, axes, steps) in enumerate(SLICES):
        inits.update({f"st{k}": ints(*starts), f"en{k}": ints(*ends)})
        if axes is not None:
            inits[f"ax{k}"] = ints(*axes)
        if steps is not None:
            inits[f"sp{k}"] = ints(*steps)
    return inits


def slice_nodes(src):
    inits = slice_inits()
    return [
        node("Slice", [src, f"st{k}", f"en{k}"] + [n if n in inits else "" for n in
                                                      (f"ax{k}", f"sp{k}")],
             f"{src}_{k}")
        for k in range(len(SLICES))
    ]


def test_slice():
    check_both_layouts(slice_nodes, rng.randn(2, 3, 5, 7), slice_inits())


def test_stepped_slices_stay_on_the_delegate():
    """Positive steps on static dims run as SLICE + RESHAPE (+ PAD where the last block is
    short), never a strided STRIDED_SLICE, which XNNPACK does not take: Swin's patch merging
    (both phases of 2 on two axes), steps 3 on odd sizes, a step on the batch axis, bounds
    inside the axis, and a channel-last input."""
    cases = [  # (starts, ends, axes, steps)
        ([0, 0], [100, 100], [2, 3], [2, 2]), ([1, 0], [100, 100], [2, 3], [2, 2]),
        ([0, 1], [100, 100], [2, 3], [2, 2]), ([1, 1], [100, 100], [2, 3], [2, 2]),
        ([2], [7], [3], [3]), ([1, 0], [5, 4], [2, 1], [3, 2]), ([1], [2], [0], [2]),
    ]
    inits = {}
    for k, (st, en, ax, sp) in enumerate(cases):
        inits.update({f"st{k}": ints(*st), f"en{k}": ints(*en), f"ax{k}": ints(*ax),
                      f"sp{k}": ints(*sp)})
    nodes = [node("Slice", ["x", f"st{k}", f"en{k}", f"ax{k}", f"sp{k}"], f"y{k}")
             for k in range(len(cases))]
    _, counts = check_nodes(nodes, {"x": rng.randn(3, 4, 6, 7)}, inits)
    assert "STRIDED_SLICE" not in counts, counts
    nodes = [node("Conv", ["x", "w"], "c"), *[
        node("Slice", ["c", f"st{k}", f"en{k}", f"ax{k}", f"sp{k}"], f"z{k}") for k in range(4)]]
    _, counts = check_nodes(nodes, {"x": rng.randn(2, 4, 6, 7)},
                            {**inits, "w": rng.randn(5, 4, 1, 1)},
                            outputs=[f"z{k}" for k in range(4)])
    assert "STRIDED_SLICE" not in counts and "TRANSPOSE" not in counts, counts


def test_slice_opset9_attributes():
    cases = [{"starts": [0, 2], "ends": [2, 100]},
             {"starts": [1, -3], "ends": [100, -1], "axes": [1, -1]}]
    check_both_layouts(
        lambda src: [node("Slice", [src], f"{src}_{k}", **c) for k, c in enumerate(cases)],
        rng.randn(2, 3, 5, 7), opset=9)


def test_slice_dynamic_batch():
    check_both_layouts(slice_nodes, rng.randn(3, 3, 5, 7), slice_inits(),
                       input_shape=["N", 3, "H", 7])


def test_slice_runtime_end():
    """x[:, :, :S-1] where S is symbolic: the end comes from Shape at run time."""
    def variants(src):
        return [
            node("Shape", [src], f"{src}_s", start=3),
            node("Sub", [f"{src}_s", "one"], f"{src}_e"),
            node("Slice", [src, "zero", f"{src}_e", "axis"], f"{src}_0"),
        ]

    check_both_layouts(variants, rng.randn(2, 3, 4, 6), {"one": ints(1), "zero": ints(0),
                                                         "axis": ints(3)},
                       input_shape=["N", 3, 4, "S"])


@pytest.mark.parametrize("length", [3, 12])
def test_slice_bounds_past_a_dynamic_dim_on_builtin_kernels(length):
    """x[1:10] of a run-time length below 10 is clamped, as ONNX says. TF's converter
    lowered it to a SLICE of static size 9, which TFLite's builtin kernel refuses ("Invalid
    begin and size"; XNNPACK clamps): torchvision detectors' keep[:post_nms_top_n]."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    nodes = [node("Slice", ["x", "st", "en"], "y")]
    inits = {"st": ints(1), "en": ints(10)}
    feeds = {"x": rng.randn(length)}
    model = make_model(nodes, feeds, ["y"], inits, input_shapes={"x": ["L"]})
    converted = check_model(model, feeds)
    builtin = Interpreter(model_content=converted.tflite, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)).get_signature_runner()
    np.testing.assert_array_equal(builtin(**feeds)["y"], feeds["x"][1:10])


def test_slice_channels_between_convs_has_no_transpose():
    nodes = [node("Slice", ["a", "st", "en", "ax"], "m")]
    check_between_convs(nodes, {"st": ints(1), "en": ints(4), "ax": ints(1)}, channels=5,
                        out_channels=3)


def test_slice_above_tflite_rank_merges_whole_axes():
    """7-D slices (as in NegativeLogLikelihoodLoss's expanded graphs): runs of axes taken
    whole are merged so TFLite's 5-D STRIDED_SLICE takes them, with no Select TF op;
    constant and run-time starts, negative steps, a symbolic batch."""
    x = rng.randn(3, 2, 4, 1, 3, 2, 5)
    inits = {"s1": ints(1), "e1": ints(2), "a1": ints(1),
             "s2": ints(-1, 0), "e2": ints(-100, 5), "a2": ints(2, -1), "p2": ints(-2, 2),
             "e3": ints(3), "a3": ints(4)}
    nodes = [node("Slice", ["x", "s1", "e1", "a1"], "one_axis"),
             node("Slice", ["x", "s2", "e2", "a2", "p2"], "two_axes_stepped"),
             node("Slice", ["x", "start", "e3", "a3"], "runtime_start")]
    feeds = {"x": x, "start": ints(1)}
    outputs = [n.output[0] for n in nodes]
    model = make_model(nodes, feeds, outputs, inits, input_shapes={"x": ["N", 2, 4, 1, 3, 2, 5]})
    converted = check_model(model, feeds)
    census = count_tflite_ops(converted.tflite)
    assert not any(name.startswith("Flex") for name in census), census


RUNTIME_SLICES = [
    ([1, 0], [4, -1], [1, -1], [1, 2]),
    ([-1, 4], [INT64_MIN, 0], [3, 2], [-2, -1]),
    ([10, -100], [-100, 100], [-3, 0], [-1, 1]),
    ([0, 1], [INT64_MAX, 3], [2, 0], None),
]


def test_slice_runtime_axes_and_steps():
    """Axes and steps fed at run time, on x in ONNX order and on a channel-last Conv output."""
    x = rng.randn(2, 3, 5, 7)
    feeds = {"x": x}
    nodes = [node("Conv", ["x", "w"], "xc")]
    for k, (starts, ends, axes, steps) in enumerate(RUNTIME_SLICES):
        feeds.update({f"st{k}": ints(*starts), f"en{k}": ints(*ends), f"ax{k}": ints(*axes)})
        if steps is not None:
            feeds[f"sp{k}"] = ints(*steps)
        inputs = [f"st{k}", f"en{k}", f"ax{k}"] + ([f"sp{k}"] if steps is not None else [])
        nodes += [node("Slice", [src, *inputs], f"{src}_{k}") for src in ("x", "xc")]
    outputs = [n.output[0] for n in nodes[1:]]
    eye = np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1)
    model = make_model(nodes, feeds, outputs, {"w": eye})
    converted = check_model(model, feeds, keep_ncw_or_nchw_or_ncdhw_input_names=["x"])
    assert converted.plan.perms["xc"] != converted.plan.perms["x"], "xc is not channel-last"
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == 1  # x into the Conv only


# --- Gather --------------------------------------------------------------------------------
GATHERS = [(0, ints(1, 0, 1)), (1, ints(-1, 0)), (-1, ints(2)), (2, np.array(-2)),
           (1, ints(0, 2, -1, 1).reshape(2, 2)), (3, np.array([[0], [6]], np.int32)),
           (1, np.array(0))]


def test_gather():
    inits = {f"i{k}": idx for k, (_, idx) in enumerate(GATHERS)}
    check_both_layouts(
        lambda src: [node("Gather", [src, f"i{k}"], f"{src}_{k}", axis=a)
                     for k, (a, _) in enumerate(GATHERS)],
        rng.randn(2, 3, 5, 7), inits)


def test_gather_runtime_indices_dynamic_dim():
    x = rng.randn(3, 3, 5, 7)
    feeds = {"x": x, "i": ints(-1, 2, -5), "j": ints(-1, 0)}
    nodes = [node("Gather", ["x", "i"], "y", axis=2), node("Gather", ["x", "j"], "z", axis=0),
             node("Gather", ["x", "k"], "w", axis=0)]
    model = make_model(nodes, feeds, ["y", "z", "w"], {"k": ints(-2)},
                       input_shapes={"x": ["N", 3, 5, 7]})
    check_model(model, feeds)


def test_gather_scalar_of_channel_last_keeps_layout():
    """A scalar index on H drops the axis; the rest stays NHWC into a 1-D conv."""
    nodes = [
        node("Conv", ["x", "w1"], "a", pads=[1, 1, 1, 1]),
        node("Gather", ["a", "i"], "g", axis=2),
        node("Conv", ["g", "w3"], "y"),
    ]
    inits = {"w1": rng.conv_weights(4, 3), "i": np.array(-3, np.int64), "w3": rng.randn(2, 4, 3)}
    _, census = check_nodes(nodes, {"x": rng.randn(2, 3, 8, 6)}, inits, outputs=["y"])
    assert census.get("TRANSPOSE", 0) == 0


def test_gather_channels_between_convs_has_no_transpose():
    nodes = [node("Gather", ["a", "i"], "m", axis=1)]
    check_between_convs(nodes, {"i": ints(3, 0, -1)}, out_channels=3)


def test_gather_of_a_constant_run_is_a_slice():
    """Scalar indices and runs of consecutive constant indices (attention's q, k, v =
    qkv[0], qkv[1], qkv[2]) become SLICE, which XNNPACK takes, not GATHER; also with a
    dynamic batch, where the dropped axis goes through a squeeze."""
    qkv = rng.randn(3, 2, 4, 5, 6)
    nodes = [node("Gather", ["qkv", f"i{k}"], f"g{k}", axis=axis)
             for k, axis in enumerate([0, 0, 0, -1, 3, 2])]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
             "i2": np.array(-1, np.int64), "i3": ints(1, 2, 3), "i4": ints(-5, -4),
             "i5": ints(2)}
    outputs = [f"g{k}" for k in range(6)]
    model = make_model(nodes, {"qkv": qkv}, outputs, inits)
    census = count_tflite_ops(check_model(model, {"qkv": qkv}).tflite)
    assert "GATHER" not in census and census["SLICE"] == 6, census
    dynamic = make_model(nodes, {"qkv": qkv}, outputs, inits,
                         input_shapes={"qkv": [3, "B", 4, 5, 6]})
    assert "GATHER" not in count_tflite_ops(check_model(dynamic, {"qkv": qkv}).tflite)


def test_gather_embedding():
    """An embedding lookup: run-time indices into a large constant table."""
    nodes = [node("Gather", ["t", "i"], "y", axis=0)]
    check_nodes(nodes, {"i": ints(0, 299, -1, 7).reshape(2, 2)}, {"t": rng.randn(300, 8)})


# --- Pad -----------------------------------------------------------------------------------
PADS = [("constant", [0, 1, 2, 0, 0, 2, 1, 3]), ("reflect", [0, 0, 2, 1, 0, 0, 1, 3]),
        ("edge", [0, 1, 2, 3, 0, 2, 1, 0]), ("constant", [0, 0, -1, 2, 0, 0, 1, -3]),
        ("edge", [0, 0, -2, 1, 0, 0, 2, -1]), ("reflect", [0, 1, -1, 0, 0, 0, 1, -2])]


def pad_nodes(src, opset=18):
    value = ["value"] if opset >= 11 else []
    return [node("Pad", [src, f"p{k}", *value], f"{src}_{k}", mode=m)
            for k, (m, _) in enumerate(PADS)]


def test_pad():
    inits = {f"p{k}": ints(*p) for k, (_, p) in enumerate(PADS)}
    check_both_layouts(pad_nodes, rng.randn(2, 3, 5, 7),
                       {**inits, "value": np.array(1.5, np.float32)})


def test_pad_dynamic_batch():
    inits = {f"p{k}": ints(*p) for k, (_, p) in enumerate(PADS)}
    check_both_layouts(pad_nodes, rng.randn(2, 3, 5, 7),
                       {**inits, "value": np.array(-1, np.float32)}, input_shape=["N", 3, 5, "W"])


def test_pad_wrap_opset19_and_axes():
    inits = {"p": ints(0, 1, 2, 3, 0, 2, 1, 0), "pa": ints(1, 2, 3, 0), "ax": ints(-1, 1),
             "v": np.array(-2.0, np.float32)}
    check_both_layouts(
        lambda src: [node("Pad", [src, "p"], f"{src}_wrap", mode="wrap"),
                     node("Pad", [src, "pa", "v", "ax"], f"{src}_axes"),
                     node("Pad", [src, "pa", "", "ax"], f"{src}_axes_edge", mode="edge")],
        rng.randn(2, 3, 5, 7), inits, opset=19)


def test_pad_opset2_attributes():
    check_both_layouts(
        lambda src: [node("Pad", [src], f"{src}_0", pads=[0, 1, 2, 1, 0, 1], value=0.5),
                     node("Pad", [src], f"{src}_1", pads=[0, 0, 1, 0, 0, 2], mode="edge")],
        rng.randn(2, 3, 5), opset=2)


def test_pad_int_and_runtime_pads():
    feeds = {"x": rng.integers(-5, 5, (2, 3, 5, 7)).astype(np.int32),
             "f": rng.randn(2, 3, 5, 7), "p": ints(0, 1, 2, 0, 0, 2, 1, 3)}
    nodes = [node("Pad", ["x", "p4"], "y"), node("Pad", ["f", "p"], "z", mode="reflect"),
             node("Pad", ["f", "p", "v"], "w")]
    inits = {"p4": ints(0, 0, 1, 1, 0, 0, 1, 1), "v": np.array(0.25, np.float32)}
    model = make_model(nodes, feeds, ["y", "z", "w"], inits,
                       input_shapes={"x": ["N", 3, 5, 7], "f": ["N", 3, 5, 7]})
    check_model(model, feeds)


def test_pad_between_convs_has_no_transpose():
    nodes = [node("Pad", ["a", "pads"], "m", mode="reflect")]
    check_between_convs(nodes, {"pads": ints(0, 0, 1, 2, 0, 0, 2, 1)})


def test_pad_runtime_pads_channel_last():
    """Pads computed at run time, applied to a channel-last value: mapped, not transposed."""
    def variants(src):
        return [node("Pad", [src, "p"], f"{src}_0"),
                node("Pad", [src, "p"], f"{src}_1", mode="reflect")]

    x = rng.randn(2, 3, 5, 7)
    nodes = [node("Conv", ["x", "w"], "xc"), *variants("x"), *variants("xc")]
    feeds = {"x": x, "p": ints(0, 1, 2, 0, 0, 2, 1, 3)}
    model = make_model(nodes, feeds, ["x_0", "x_1", "xc_0", "xc_1"],
                       {"w": np.eye(3, dtype=np.float32)[..., None, None]})
    check_model(model, feeds, keep_ncw_or_nchw_or_ncdhw_input_names=["x"])


def test_pad_runtime_pads_and_axes():
    """Pads and axes fed at run time, every mode, negative pads (crops) included, on a value
    in ONNX order and on a channel-last one (mapped: the only TRANSPOSE feeds the Conv)."""
    modes = ["constant", "reflect", "edge", "wrap"]
    feeds = {"x": rng.randn(2, 3, 5, 7), "p": ints(0, 1, 2, -1, 0, 2, -1, 3),
             "pa": ints(1, -1, 2, 3), "ax": ints(-1, 2), "v": np.array(0.5, np.float32)}
    nodes = [node("Conv", ["x", "w"], "xc"),
             *(node("Pad", ["x", "pa", "v", "ax"], f"x_{m}_axes", mode=m) for m in modes),
             *(node("Pad", ["xc", "p", "v"], f"xc_{m}", mode=m) for m in modes),
             node("Pad", ["xc", "pa", "", "ax"], "xc_wrap_axes", mode="wrap")]
    outputs = [o for n in nodes[1:] for o in n.output]
    model = make_model(nodes, feeds, outputs, {"w": np.eye(3, dtype=np.float32)[..., None, None]})
    converted = check_model(model, feeds, keep_ncw_or_nchw_or_ncdhw_input_names=["x"])
    assert converted.plan.transposes(converted.graph) == {("x", (0, 2, 3, 1))}
    assert count_tflite_ops(converted.tflite).get("TRANSPOSE", 0) == 1


def test_pad_runtime_pads_int_and_symbolic_dims():
    """Run-time pads of an int32 value with symbolic dims (edge, wrap, constant)."""
    feeds = {"x": rng.integers(-5, 5, (2, 3, 4, 5)).astype(np.int32),
             "p": ints(0, 0, 1, 3, 0, 1, 2, -2)}
    nodes = [node("Pad", ["x", "p"], f"y_{m}", mode=m) for m in ["edge", "wrap", "constant"]]
    model = make_model(nodes, feeds, ["y_edge", "y_wrap", "y_constant"],
                       input_shapes={"x": ["N", 3, "H", "W"]}, opset=19)
    check_model(model, feeds)


def test_unit_axes_relayout_is_a_reshape():
    """A logical read (2-D Gather indices) of an NHWC (N, C, 1, 1) value needs its axes in
    ONNX order; only size-1 axes move, so the TFLite has a RESHAPE, not a TRANSPOSE."""
    nodes = [
        node("Conv", ["x", "w"], "a"),
        node("Gather", ["a", "i"], "y", axis=1),
    ]
    inits = {"w": rng.conv_weights(4, 3, 5), "i": ints(0, 3, 2, 1).reshape(2, 2)}
    converted, census = check_nodes(nodes, {"x": rng.randn(2, 3, 5, 5)}, inits, outputs=["y"])
    assert converted.plan.transposes(converted.graph) == {("a", (0, 1, 2, 3))}
    assert census.get("TRANSPOSE", 0) == 0


# --- EyeLike ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, attrs", [((3, 3), {}), ((3, 5), {"k": 2}), ((4, 2), {"k": -1, "dtype": 6})],
)
def test_eye_like(shape, attrs):
    check_node("EyeLike", {"x": rng.randn(*shape)}, attrs, opset=22)


def test_zero_constant_pad_is_a_pad_not_a_padv2():
    """A constant Pad with value 0 (omitted, given as an input, or opset 2's attribute) is
    TFLite's PAD, which XNNPACK runs; a PADV2 would run on the reference kernels and breaks
    TFLite's INT16-activation files (its value stays float). A non-zero value stays PADV2."""
    x = rng.randn(2, 3, 5, 7)
    nodes = [node("Pad", ["x", "p"], "omitted"), node("Pad", ["x", "q", "zero"], "given"),
             node("Pad", ["x", "p", "half"], "halved")]
    inits = {"p": ints(0, 1, 2, 0, 0, 2, 1, 3), "q": ints(1, 0, 0, 2, 0, 1, 3, 0),
             "zero": np.array(0.0, np.float32),
             "half": np.array(0.5, np.float32)}
    model = make_model(nodes, {"x": x}, ["omitted", "given", "halved"], inits)
    counts = count_tflite_ops(check_model(model, {"x": x}).tflite)
    assert counts.get("PAD") == 2 and counts.get("PADV2") == 1, counts
    model = make_model([node("Pad", ["x"], "y", pads=[0, 1, 2, 1, 0, 1, 0, 0], value=0.0)],
                       {"x": x}, ["y"], opset=2)
    counts = count_tflite_ops(check_model(model, {"x": x}).tflite)
    assert counts.get("PAD") == 1 and "PADV2" not in counts, counts


def test_zero_pad_of_a_tensor_with_trailing_unit_axes_pads_without_them():
    """A zero Pad whose channel-last tensor ends in unpadded axes of size 1 (a one-channel
    spectrogram, NCHW (N, 1, H, W)) pads the tensor without them, between RESHAPEs (XNNPACK's
    PAD of a last axis of 1 copies element by element); padding that axis itself, or a
    dynamic batch, still work."""
    x = rng.randn(2, 1, 6, 9)
    nodes = [node("Pad", ["x", "p"], "width"), node("Pad", ["x", "q"], "channel")]
    inits = {"p": ints(0, 0, 1, 2, 0, 0, 0, 3), "q": ints(0, 1, 0, 0, 0, 2, 0, 0)}
    model = make_model(nodes, {"x": x}, ["width", "channel"], inits)
    counts = count_tflite_ops(check_model(model, {"x": x}).tflite)
    assert counts.get("PAD") == 2 and "PADV2" not in counts, counts
    model = make_model(nodes[:1], {"x": x}, ["width"], inits,
                       input_shapes={"x": ["N", 1, 6, 9]})
    check_model(model, {"x": x})
