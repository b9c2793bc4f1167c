"""Convolutions whose taps read mostly padding are computed region by region
(onnx2tf_alt/passes/conv_regions.py): the rewritten graph computes what the original does
(onnxruntime on both, many random geometries), the regions hold only the products with the
map, and converted models match onnxruntime through TF, TF's converter and the direct
writer."""

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from passes.test_conv_taps import conv_model
from passes.test_conv_taps import random_case as conv_taps_case

from onnx2tf_alt.passes import conv_regions
from onnx2tf_alt.passes.conv_regions import split_padded_regions
from onnx2tf_alt.passes.prepare import infer_shapes

from harness import both_routes, check_model, count_tflite_ops, ort_run

CASES = 120


@pytest.fixture
def any_size(monkeypatch):
    """Small test convolutions split as large ones are (no floor on the products saved)."""
    monkeypatch.setattr(conv_regions, "MIN_SAVED", 0)


def split(model):
    rewritten = infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    return split_padded_regions(rewritten), rewritten


def convs(model) -> list[tuple[tuple[int, ...], list[int]]]:
    """(kernel shape, output spatial shape) of every Conv of `model`."""
    model = infer_shapes(model)
    weights = {i.name: numpy_helper.to_array(i).shape for i in model.graph.initializer}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.value_info, *model.graph.output]}
    return [(weights[n.input[1]][2:], shapes[n.output[0]][2:])
            for n in model.graph.node if n.op_type == "Conv"]


def random_case(case: int):
    """Random convolutions as conv_taps' tests draw them, on maps of 2 to 11."""
    return conv_taps_case(case, seed=2000, size_range=(2, 12), same=0.2)


@pytest.mark.parametrize("case", range(CASES))
def test_random_geometries_compute_the_same(case, any_size):
    model, feeds = random_case(case)
    expected = ort_run(model, feeds)[0]
    _, rewritten = split(model)
    np.testing.assert_allclose(ort_run(rewritten, feeds)[0], expected, rtol=1e-5, atol=1e-5)


def test_random_geometries_are_often_split(any_size):
    """The property test exercises the rewrite, not only the geometries it leaves alone."""
    count = sum(split(random_case(case)[0])[0] for case in range(CASES))
    assert count >= CASES // 10, count


def test_aspp_branch_keeps_only_products_with_the_map():
    """DeepLabV3's ASPP branch of dilation 12 on a 14x14 map (224 input, 960 -> 256 channels
    as in MobileNetV3's): nine regions whose kernels hold the taps each output reads, 324
    output-tap products per channel pair against the 1,764 of the 3x3 kernel."""
    model, _ = conv_model([1, 960, 14, 14], [256, 960, 3, 3], 0, kernel_shape=[3, 3],
                          dilations=[12, 12], pads=[12, 12, 12, 12])
    changed, rewritten = split(model)
    assert changed == 1
    regions = convs(rewritten)
    assert len(regions) == 9
    per_axis = [(2, 2), (1, 10), (2, 2)]  # (taps, outputs): rows 0-1, 2-11, 12-13
    assert sorted(regions) == sorted(((ta, tb), [oa, ob]) for (ta, oa), (tb, ob)
                                     in itertools.product(per_axis, per_axis))
    products = sum(np.prod(k) * np.prod(o) for k, o in regions)
    assert products == 324
    assert {n.op_type for n in rewritten.graph.node} == {"Conv", "Slice", "Concat"}
    assert "w" not in {i.name for i in rewritten.graph.initializer}  # the 3x3 kernel is gone


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ([1, 64, 14, 14], [64, 64, 3, 3], {"pads": [1, 1, 1, 1]}),  # padding on the border only
    ([1, 4, 14, 14], [4, 4, 3, 3], {"dilations": [12, 12], "pads": [12, 12, 12, 12]}),  # tiny
    ([1, 64, 33, 33], [64, 64, 3, 3], {"dilations": [6, 6], "pads": [6, 6, 6, 6]}),  # 77 % kept
])
def test_convolutions_mostly_on_the_map_or_small_are_left_alone(x_shape, w_shape, attrs):
    model, _ = conv_model(x_shape, w_shape, 1, kernel_shape=w_shape[2:], **attrs)
    assert split(model)[0] == 0


CONVERTED = [
    ([2, 6, 7, 9], [4, 6, 3, 3], {"dilations": [5, 6], "pads": [5, 6, 5, 6]}),
    ([1, 4, 9, 8], [4, 1, 3, 3], {"dilations": [6, 6], "pads": [6, 6, 6, 6], "group": 4}),
    ([2, 4, 11, 10], [6, 2, 3, 3], {"dilations": [8, 7], "pads": [8, 7, 8, 7], "group": 2,
                                    "strides": [2, 1]}),
    ([1, 3, 20], [5, 3, 3], {"dilations": [15], "pads": [15, 15]}),
]
CONVERTED_IDS = ["aspp-like-batch2", "depthwise", "grouped-strided", "1d"]


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONVERTED, ids=CONVERTED_IDS)
def test_converted_matches_onnxruntime(x_shape, w_shape, attrs, any_size):
    model, feeds = conv_model(x_shape, w_shape, 7, kernel_shape=w_shape[2:], **attrs)
    assert split(model)[0] == 1
    check_model(model, feeds)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONVERTED[:3], ids=CONVERTED_IDS[:3])
def test_direct_file_matches_onnxruntime(x_shape, w_shape, attrs, any_size):
    """With a Relu after the convolution (ASPP's): each region's CONV_2D applies it."""
    model, feeds = conv_model(x_shape, w_shape, 8, kernel_shape=w_shape[2:], **attrs)
    model.graph.node.append(helper.make_node("Relu", ["y"], ["z"]))
    model.graph.output[0].name = "z"
    _, rewritten = split(model)
    assert sum(n.op_type == "Relu" for n in rewritten.graph.node) == len(convs(rewritten)) > 1
    census = count_tflite_ops(both_routes(model, feeds).content)
    assert "RELU" not in census and census["CONCATENATION"] >= 1, census


def test_keep_float_names_the_convolution_as_exported(tmp_path, any_size):
    """--keep_float with the Conv's own name keeps all its regions float in the INT8 file."""
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt import convert

    model, _ = conv_model([1, 3, 24, 24], [8, 3, 3, 3], 9, kernel_shape=[3, 3],
                          dilations=[20, 20], pads=[20, 20, 20, 20])
    model.graph.node[0].name = "aspp/Conv"
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    out = tmp_path / "out"
    convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
            output_integer_quantized_tflite=True, keep_float=["aspp/Conv"])
    interpreter = Interpreter(str(out / "m_integer_quant.tflite"))
    dtypes = {t["index"]: np.dtype(t["dtype"]).name for t in interpreter.get_tensor_details()}
    convs = [[dtypes[i] for i in op["inputs"] if i >= 0]
             for op in interpreter._get_ops_details() if op["op_name"] == "CONV_2D"]
    assert len(convs) == 9 and all(c == ["float32"] * 3 for c in convs), convs
