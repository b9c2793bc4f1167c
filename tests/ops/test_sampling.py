"""GridSample, AffineGrid, Col2Im, CenterCropPad and MaxUnpool against onnxruntime, through
TF and the float32 TFLite.

Most tests put one node per attribute combination into one model (one conversion), with
outputs named after the attributes, so a failure names its combination.
"""

import itertools

import numpy as np
import pytest
from onnx import helper

from harness import (
    Rng,
    assert_builtin,
    assert_keras_reloads,
    check_model,
    check_node,
    check_nodes,
    convert,
    count_tflite_ops,
    label,
    make_model,
)

rng = Rng(0)
F32 = np.float32


def grid_points(shape, spatial):
    """Random points reaching past [-1, 1], plus points that land exactly halfway between
    pixels (nearest's ties) for align_corners=1 on an axis of 5."""
    grid = rng.uniform(-1.4, 1.4, shape).astype(F32)
    ties = np.array([-0.75, -0.25, 0.25, 0.75, -1.25, 1.25], F32)
    flat = grid.reshape(-1, spatial)
    flat[: len(ties), 0] = ties
    flat[len(ties): 2 * len(ties), -1] = ties
    return grid


# --- GridSample ------------------------------------------------------------------------------
def all_combos(mode):
    return itertools.product([mode], ["zeros", "border", "reflection"], [0, 1])


def grid_sample_cases(combos, opset, x, grid):
    nodes = []
    for mode, padding, align in combos:
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
        nodes.append(helper.make_node("GridSample", ["x", "grid"], [label("GridSample", attrs)],
                                      **attrs))
    _, counts = check_nodes(nodes, {"x": x, "grid": grid}, opset=opset)
    assert_builtin(counts, transpose_free=True)
    return counts


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_20_2d(mode):
    """Every padding_mode x align_corners, odd sizes, points outside [-1, 1], batch 2."""
    counts = grid_sample_cases(all_combos(mode), 20, rng.randn(2, 3, 5, 7),
                               grid_points((2, 4, 6, 2), 2))
    assert "GATHER" in counts


def test_grid_sample_16_names():
    """Opset 16 names the modes bilinear and bicubic."""
    combos = [("bilinear", "reflection", 0), ("bicubic", "border", 1), ("nearest", "zeros", 0)]
    grid_sample_cases(combos, 16, rng.randn(2, 2, 6, 5), grid_points((2, 3, 4, 2), 2))


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_20_3d(mode):
    """5-D input: the grid's last axis is (x, y, z) = (W, H, D)."""
    grid_sample_cases(all_combos(mode), 20, rng.randn(2, 2, 3, 4, 5),
                      grid_points((2, 2, 3, 4, 3), 3))


def test_grid_sample_between_convs():
    """Conv -> GridSample -> Conv stays channel-last: no TRANSPOSE in the TFLite model."""
    x, grid = rng.randn(2, 3, 6, 5), grid_points((2, 4, 7, 2), 2)
    w1, w2 = rng.randn(4, 3, 3, 3), rng.randn(2, 4, 1, 1)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("GridSample", ["a", "grid"], ["b"], mode="bilinear",
                         padding_mode="border"),
        helper.make_node("Conv", ["b", "w2"], ["y"]),
    ]
    model = make_model(nodes, {"x": x, "grid": grid}, ["y"], {"w1": w1, "w2": w2}, opset=16)
    converted = check_model(model, {"x": x, "grid": grid})
    assert_builtin(count_tflite_ops(converted.tflite), transpose_free=True)


# --- AffineGrid ------------------------------------------------------------------------------
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(align):
    """2-D and 3-D grids (odd sizes, a size of 1), feeding a GridSample as well."""
    theta2, theta3 = rng.randn(2, 2, 3), rng.randn(2, 3, 4)
    x = rng.randn(2, 3, 5, 6)
    nodes = [
        helper.make_node("AffineGrid", ["theta2", "size2"], ["grid2"], align_corners=align),
        helper.make_node("AffineGrid", ["theta2", "size2b"], ["grid2b"], align_corners=align),
        helper.make_node("AffineGrid", ["theta3", "size3"], ["grid3"], align_corners=align),
        helper.make_node("GridSample", ["x", "grid2"], ["y"], align_corners=align),
    ]
    sizes = {"size2": np.array([2, 3, 4, 7], np.int64), "size2b": np.array([2, 1, 1, 5], np.int64),
             "size3": np.array([2, 1, 3, 4, 5], np.int64)}
    _, counts = check_nodes(nodes, {"theta2": theta2, "theta3": theta3, "x": x}, sizes, opset=20)
    assert_builtin(counts, transpose_free=True)


# --- Col2Im ----------------------------------------------------------------------------------
COL2IM_CASES = [
    ([5, 7], [2, 3], {}, 3),
    ([5, 7], [3, 3], {"strides": [2, 1], "pads": [1, 0, 1, 2]}, 3),
    ([6, 5], [2, 2], {"dilations": [2, 1], "strides": [1, 2], "pads": [0, 1, 1, 0]}, 3),
    ([9], [3], {"strides": [2], "pads": [1, 2]}, 3),
    # onnxruntime 1.32 (unlike the ONNX reference) misplaces 3-D columns dilated on a later
    # axis, or strided or padded with several channels: those are not tested
    ([3, 4, 5], [2, 2, 2], {"strides": [1, 2, 1], "dilations": [2, 1, 1],
                            "pads": [1, 0, 0, 0, 1, 1]}, 1),
    ([3, 4, 5], [2, 1, 3], {}, 3),
]


@pytest.mark.parametrize("image, block, attrs, channels", COL2IM_CASES)
def test_col2im(image, block, attrs, channels):
    n = len(image)
    dil, strides = attrs.get("dilations", [1] * n), attrs.get("strides", [1] * n)
    pads = attrs.get("pads", [0] * 2 * n)
    blocks = np.prod([(image[i] + pads[i] + pads[n + i] - dil[i] * (block[i] - 1) - 1)
                      // strides[i] + 1 for i in range(n)])
    x = rng.randn(2, channels * int(np.prod(block)), int(blocks))
    consts = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    check_node("Col2Im", {"x": x}, attrs, consts, opset=18)


# --- CenterCropPad ---------------------------------------------------------------------------
def test_center_crop_pad():
    """Crop and pad by even and odd amounts, default and chosen axes, on a channel-last
    value as well (check_nodes over a Conv output)."""
    x = rng.randn(2, 3, 6, 7)
    w = rng.randn(4, 3, 1, 1)
    cases = [
        ("all", None, [2, 5, 3, 10]),
        ("hw", [2, 3], [3, 4]),
        ("wh_neg", [-1, -2], [9, 5]),
        ("c", [1], [6]),
    ]
    nodes = [helper.make_node("Conv", ["x", "w"], ["xc"])]
    inits = {"w": w}
    for src in ["x", "xc"]:
        for name, axes, shape in cases:
            inits[f"shape_{name}"] = np.array(shape, np.int64)
            attrs = {} if axes is None else {"axes": axes}
            nodes.append(helper.make_node("CenterCropPad", [src, f"shape_{name}"],
                                          [f"{src}_{name}"], **attrs))
    outputs = [o for n in nodes[1:] for o in n.output]
    converted, counts = check_nodes(nodes, {"x": x}, inits, opset=18, outputs=outputs)
    assert converted.plan.perms["xc"] == (0, 2, 3, 1)
    assert_builtin(counts, transpose_free=True)


# --- MaxUnpool -------------------------------------------------------------------------------
def unpool_model(x, pool_attrs, unpool_attrs, output_shape=None, conv=False, opset=11):
    """(Conv ->) MaxPool with Indices -> MaxUnpool (-> Conv)."""
    nodes, inits, src = [], {}, "x"
    channels = x.shape[1]
    if conv:
        inits["w1"] = rng.randn(channels, channels, *[1] * (x.ndim - 2))
        inits["w2"] = rng.randn(2, channels, *[1] * (x.ndim - 2))
        nodes.append(helper.make_node("Conv", ["x", "w1"], ["xc"]))
        src = "xc"
    nodes.append(helper.make_node("MaxPool", [src], ["p", "i"], **pool_attrs))
    inputs = ["p", "i"]
    if output_shape is not None:
        inits["shape"] = np.array(output_shape, np.int64)
        inputs.append("shape")
    nodes.append(helper.make_node("MaxUnpool", inputs, ["u"], **unpool_attrs))
    if conv:
        nodes.append(helper.make_node("Conv", ["u", "w2"], ["y"]))
    return make_model(nodes, {"x": x}, ["y" if conv else "u"], inits, opset)


UNPOOL_CASES = [
    ((2, 3, 6, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
    ((2, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}, None),  # overlapping
    ((2, 3, 7, 9), {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 1, 0]},
     [2, 3, 7, 9]),
    ((2, 3, 7, 9), {"kernel_shape": [2, 2], "strides": [2, 2]}, [2, 3, 7, 9]),
    ((2, 4, 11), {"kernel_shape": [3], "strides": [2]}, None),
    ((2, 2, 4, 6, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, None),
]


@pytest.mark.parametrize("shape, attrs, output_shape", UNPOOL_CASES)
def test_max_unpool(shape, attrs, output_shape):
    x = rng.randn(*shape)
    check_model(unpool_model(x, attrs, attrs, output_shape), {"x": x})


@pytest.mark.parametrize("opset", [9, 11])
def test_max_unpool_between_convs(opset):
    """Conv -> MaxPool -> MaxUnpool -> Conv: indices rewritten for channel-last, no TRANSPOSE."""
    x = rng.randn(2, 3, 7, 9)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2]}
    converted = check_model(unpool_model(x, attrs, attrs, conv=True, opset=opset), {"x": x})
    assert_builtin(count_tflite_ops(converted.tflite), transpose_free=True)


def test_dynamic_batch():
    """GridSample and MaxUnpool with a symbolic batch size: batch offsets at run time."""
    feeds = {"x": rng.randn(2, 3, 7, 9), "grid": grid_points((2, 3, 5, 2), 2)}
    nodes = [
        helper.make_node("GridSample", ["x", "grid"], ["sampled"], mode="linear",
                         padding_mode="zeros"),
        helper.make_node("MaxPool", ["x"], ["pooled", "where"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxUnpool", ["pooled", "where"], ["unpooled"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    shapes = {"x": ["N", 3, 7, 9], "grid": ["N", 3, 5, 2]}
    model = make_model(nodes, feeds, ["sampled", "unpooled"], opset=20, input_shapes=shapes)
    converted = check_model(model, feeds)
    assert_builtin(count_tflite_ops(converted.tflite), transpose_free=True)


def test_keras_files_reload(tmp_path):
    """Every op of this family in one model survives a .h5 and a .keras reload."""
    feeds = {"x": rng.randn(2, 3, 6, 8), "theta": rng.randn(2, 2, 3), "cols": rng.randn(2, 12, 20)}
    inits = {"size": np.array([2, 3, 5, 4], np.int64), "crop": np.array([4, 9], np.int64),
             "image": np.array([5, 6], np.int64), "block": np.array([2, 2], np.int64)}
    nodes = [
        helper.make_node("AffineGrid", ["theta", "size"], ["grid"]),
        helper.make_node("GridSample", ["x", "grid"], ["sampled"], mode="cubic",
                         padding_mode="reflection"),
        helper.make_node("MaxPool", ["x"], ["pooled", "where"], kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("MaxUnpool", ["pooled", "where"], ["unpooled"], kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("CenterCropPad", ["x", "crop"], ["cropped"], axes=[2, 3]),
        helper.make_node("Col2Im", ["cols", "image", "block"], ["image_out"]),
    ]
    outputs = ["sampled", "unpooled", "cropped", "image_out"]
    converted = convert(make_model(nodes, feeds, outputs, inits, opset=20))
    assert_keras_reloads(converted, feeds, tmp_path)


# --- run-time parameters ---------------------------------------------------------------------
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_runtime_size(align):
    """size fed at run time: the base grid is computed at run time too (2-D, 3-D, size 1)."""
    feeds = {"theta2": rng.randn(2, 2, 3), "theta3": rng.randn(3, 3, 4),
             "size2": np.array([2, 3, 4, 7], np.int64), "size2b": np.array([2, 1, 1, 5], np.int64),
             "size3": np.array([3, 1, 3, 4, 5], np.int64)}
    nodes = [helper.make_node("AffineGrid", [theta, size], [f"grid_{size}"], align_corners=align)
             for theta, size in [("theta2", "size2"), ("theta2", "size2b"), ("theta3", "size3")]]
    _, counts = check_nodes(nodes, feeds, opset=20)
    assert_builtin(counts, transpose_free=True)


def test_col2im_runtime_shapes():
    """image_shape and block_shape fed at run time, every COL2IM_CASES combination."""
    feeds, nodes = {}, []
    for k, (image, block, attrs, channels) in enumerate(COL2IM_CASES):
        n = len(image)
        dil, strides = attrs.get("dilations", [1] * n), attrs.get("strides", [1] * n)
        pads = attrs.get("pads", [0] * 2 * n)
        blocks = np.prod([(image[i] + pads[i] + pads[n + i] - dil[i] * (block[i] - 1) - 1)
                          // strides[i] + 1 for i in range(n)])
        feeds[f"x{k}"] = rng.randn(2, channels * int(np.prod(block)), int(blocks))
        feeds[f"image{k}"], feeds[f"block{k}"] = np.array(image, np.int64), np.array(block, np.int64)
        nodes.append(helper.make_node("Col2Im", [f"x{k}", f"image{k}", f"block{k}"],
                                      [label(f"Col2Im{k}", attrs)], **attrs))
    _, counts = check_nodes(nodes, feeds, opset=18)
    assert_builtin(counts, transpose_free=True)


def test_center_crop_pad_runtime_shape():
    """Target shapes fed at run time (crop, pad, both; chosen and negative axes) on a 4-D
    value kept channel-last (it feeds a Conv) and on a 3-D one in ONNX order, and a constant
    target on symbolic dims between two Convs: no TRANSPOSE anywhere."""
    feeds = {"x": rng.randn(2, 3, 6, 7), "z": rng.randn(5, 4, 3),
             "all": np.array([2, 5, 3, 10], np.int64),
             "hw": np.array([3, 9], np.int64), "c": np.array([6], np.int64),
             "zt": np.array([3, 6], np.int64)}
    nodes = [helper.make_node("CenterCropPad", ["x", "all"], ["x_all"]),
             helper.make_node("CenterCropPad", ["x", "hw"], ["x_hw"], axes=[-2, -1]),
             helper.make_node("CenterCropPad", ["x", "c"], ["x_c"], axes=[1]),
             helper.make_node("CenterCropPad", ["z", "zt"], ["z_02"], axes=[0, 2]),
             helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("CenterCropPad", ["a", "fixed"], ["m"], axes=[2, 3]),
             helper.make_node("Conv", ["m", "w2"], ["y"])]
    inits = {"w": rng.randn(4, 3, 1, 1), "w2": rng.randn(2, 4, 1, 1),
             "fixed": np.array([4, 8], np.int64)}
    model = make_model(nodes, feeds, ["x_all", "x_hw", "x_c", "z_02", "y"], inits, opset=18,
                       input_shapes={"x": ["N", 3, "H", "W"]})
    converted = check_model(model, feeds)
    assert converted.plan.perms["x"] == (0, 2, 3, 1)
    assert_builtin(count_tflite_ops(converted.tflite), transpose_free=True)


def test_max_unpool_runtime_output_shape():
    """output_shape fed at run time (larger than the default unpooled shape)."""
    x = rng.randn(2, 3, 7, 9)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs),
             helper.make_node("MaxUnpool", ["p", "i", "shape"], ["u"], **attrs)]
    feeds = {"x": x, "shape": np.array([2, 3, 7, 9], np.int64)}
    _, counts = check_nodes(nodes, feeds, opset=11, outputs=["u"])
    assert_builtin(counts)
