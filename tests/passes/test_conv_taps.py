"""Convolution taps that only ever read padding are cut (onnx2tf_alt/passes/conv_taps.py): the
rewritten graph computes what the original does (onnxruntime on both, many random
geometries), the kernel really shrinks where it should, and converted models match
onnxruntime through TF and the float32 TFLite."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnx2tf_alt.passes.conv_taps import cut_dead_taps
from onnx2tf_alt.passes.prepare import infer_shapes

from harness import check_model, make_model


def conv_model(x_shape, w_shape, seed, bias=True, **attrs):
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32)}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(np.float32)
        inputs.append("b")
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    node = helper.make_node("Conv", inputs, ["y"], **attrs)
    return make_model([node], feeds, ["y"], inits), feeds


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def kernel_of(model) -> tuple[int, ...]:
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weights = next(i for i in model.graph.initializer if i.name == conv.input[1])
    return tuple(numpy_helper.to_array(weights).shape[2:])


def cut(model):
    rewritten = infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    return cut_dead_taps(rewritten), rewritten


CASES = 150


def random_case(case: int, seed: int = 1000, size_range: tuple[int, int] = (1, 9),
                same: float = 0.25):
    """A random 1-D/2-D/3-D convolution with dilations up to twice the input, strides,
    groups, batch 1 or 2, explicit or (with probability `same`) SAME pads."""
    rng = np.random.default_rng(seed + case)
    rank = int(rng.integers(1, 4))
    sizes = [int(rng.integers(*size_range)) for _ in range(rank)]
    kernel = [int(rng.integers(1, 5)) for _ in range(rank)]
    dilations = [int(rng.integers(1, 2 * max(sizes) + 2)) for _ in range(rank)]
    strides = [int(rng.integers(1, 3)) for _ in range(rank)]
    group = int(rng.choice([1, 2]))
    attrs = {"kernel_shape": kernel, "dilations": dilations, "strides": strides, "group": group}
    if rng.random() < same:  # onnxruntime refuses SAME with dilations, so the pass does too
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER"]))
        attrs["dilations"] = dilations = [1] * rank
    else:  # pads with at least one output per axis
        extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
        begin = [int(rng.integers(0, e)) for e in extent]
        end = [max(int(rng.integers(0, e)), e - s - b) for e, s, b in zip(extent, sizes, begin)]
        attrs["pads"] = begin + end
    batch = int(rng.integers(1, 3))
    model, feeds = conv_model([batch, 2 * group, *sizes], [3 * group, 2, *kernel], case,
                              bias=bool(case % 2), **attrs)
    return model, feeds


@pytest.mark.parametrize("case", range(CASES))
def test_random_geometries_compute_the_same(case):
    """onnxruntime gives the same output before and after the cut."""
    model, feeds = random_case(case)
    expected = run(model, feeds)
    _, rewritten = cut(model)
    np.testing.assert_allclose(run(rewritten, feeds), expected, rtol=1e-5, atol=1e-5)


def test_random_geometries_are_often_cut():
    """The property test exercises the rewrite, not only the geometries it leaves alone."""
    cut_count = sum(cut(random_case(case)[0])[0] for case in range(CASES))
    assert cut_count >= CASES // 10, cut_count  # 23 of the 150


def test_aspp_branches_become_pointwise():
    """DeepLabV3's ASPP at 224: dilation 24 on a 14x14 map keeps only the centre tap (a 1x1
    conv with dilation 1); dilation 12 keeps the full kernel (each tap reads the map for some
    output)."""
    far, _ = conv_model([1, 8, 14, 14], [4, 8, 3, 3], 0, kernel_shape=[3, 3],
                        dilations=[24, 24], pads=[24, 24, 24, 24])
    changed, rewritten = cut(far)
    assert changed == 1 and kernel_of(rewritten) == (1, 1)
    conv = rewritten.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["pads"] == [0, 0, 0, 0] and attrs["dilations"] == [1, 1]
    near, _ = conv_model([1, 8, 14, 14], [4, 8, 3, 3], 0, kernel_shape=[3, 3],
                         dilations=[12, 12], pads=[12, 12, 12, 12])
    assert cut(near)[0] == 0


def test_one_axis_cut_keeps_the_other():
    """A 1xW map under a 3x3 dilated kernel: the rows shrink to one, the columns stay."""
    model, _ = conv_model([2, 3, 1, 9], [5, 3, 3, 3], 1, kernel_shape=[3, 3],
                          dilations=[2, 2], pads=[2, 2, 2, 2])
    changed, rewritten = cut(model)
    assert changed == 1 and kernel_of(rewritten) == (1, 3)


def test_unknown_sizes_are_left_alone():
    model, _ = conv_model([1, 4, 5, 5], [2, 4, 3, 3], 2, kernel_shape=[3, 3],
                          dilations=[9, 9], pads=[9, 9, 9, 9])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    assert cut(model)[0] == 0


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ([2, 6, 7, 9], [4, 6, 3, 3], {"dilations": [8, 10], "pads": [8, 10, 8, 10]}),
        ([1, 4, 5, 6], [4, 1, 3, 3], {"dilations": [6, 6], "pads": [6, 6, 6, 6], "group": 4}),
        ([2, 3, 2, 4], [5, 3, 5, 7], {"auto_pad": "SAME_UPPER"}),
        ([1, 2, 3, 3, 3], [3, 2, 3, 3, 3], {"dilations": [4, 1, 4], "pads": [4, 1, 4, 4, 1, 4]}),
    ],
    ids=["aspp-like", "depthwise", "same-upper", "3d"],
)
def test_converted_matches_onnxruntime(x_shape, w_shape, attrs):
    model, feeds = conv_model(x_shape, w_shape, 7, kernel_shape=w_shape[2:], **attrs)
    assert cut(model)[0] == 1
    check_model(model, feeds)
