"""Resize (10, 11, 13, 18, 19) and Upsample (7, 9) against onnxruntime, through TF and TFLite,
with constant parameters and with scales, sizes and roi fed at run time.

Converting a model costs most of a test's time, so most models hold several Resize nodes
reading one input, each with its own output.
"""

import numpy as np
import pytest
from onnx import helper

from onnx2tf_alt.tflite.lowering import tflite_bytes

from harness import (
    assert_close,
    check_model,
    check_nodes,
    convert,
    count_tflite_ops,
    make_model,
    ort_run,
    tf_run,
    tflite_run,
)

rng = np.random.default_rng(0)
F32 = np.float32
X = rng.standard_normal((2, 3, 5, 7)).astype(F32)
ROI = [0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2]  # crops H, reaches outside W (extrapolation)
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
COORDS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]


def mode(name, coord="half_pixel", **attrs):
    return {"mode": name, "coordinate_transformation_mode": coord, **attrs}


def resize_nodes(specs, opset=19):
    """One Resize per spec (attrs, scales, sizes, roi), all reading x: (nodes, parameters)."""
    nodes, params = [], {}
    for k, (attrs, scales, sizes, roi) in enumerate(specs):
        names = ["x", "", "", ""]
        for slot, value, dtype in ((1, roi, F32), (2, scales, F32), (3, sizes, np.int64)):
            if value is not None:
                names[slot] = f"in{k}_{slot}"
                params[names[slot]] = np.array(value, dtype)
        if opset < 11:  # Resize-10 takes (X, scales)
            names = ["x", names[2]]
        while names[-1] == "":
            names.pop()
        nodes.append(helper.make_node("Resize", names, [f"y{k}"], **attrs))
    return nodes, params


def resize_model(x, specs, opset=19, input_shapes=None):
    """One Resize per spec, scales, sizes and roi as initializers."""
    nodes, params = resize_nodes(specs, opset)
    outputs = [f"y{k}" for k in range(len(specs))]
    return make_model(nodes, {"x": x}, outputs, params, opset, input_shapes)


def check_runtime(x, specs, opset=19):
    """One Resize per spec, scales, sizes and roi as graph inputs fed at run time."""
    nodes, params = resize_nodes(specs, opset)
    feeds = {"x": x, **params}
    outputs = [f"y{k}" for k in range(len(specs))]
    return check_model(make_model(nodes, feeds, outputs, opset=opset), feeds)


@pytest.mark.parametrize("coord", COORDS)
def test_coordinate_modes(coord):
    """Every mode and nearest_mode; up- and downsampling in one node (non-integer scales),
    by scales and by sizes, output size 1; odd shapes, batch 2."""
    roi = ROI if coord == "tf_crop_and_resize" else None
    specs = []
    for rule in NEAREST_MODES:
        attrs = mode("nearest", coord, nearest_mode=rule, extrapolation_value=-2.0)
        specs += [(attrs, [1, 1, 1.7, 0.65], None, roi), (attrs, None, [2, 3, 9, 3], roi)]
    specs.append((mode("nearest", coord), [1, 1, 0.5, 3.0], None, roi))
    linear = mode("linear", coord, extrapolation_value=0.5)
    specs += [
        (linear, [1, 1, 1.7, 0.6], None, roi),
        (linear, None, [2, 3, 9, 3], roi),
        (linear, None, [2, 3, 1, 1], roi),
        (mode("cubic", coord), [1, 1, 0.6, 2.0], None, roi),
        (mode("cubic", coord, cubic_coeff_a=-0.5, exclude_outside=1), None, [2, 3, 9, 3], roi),
    ]
    check_model(resize_model(X, specs), {"x": X})


def test_tf_half_pixel_for_nn_opset11():
    specs = [
        (mode("nearest", "tf_half_pixel_for_nn", nearest_mode=rule), [1, 1, 1.7, 0.6], None, [])
        for rule in NEAREST_MODES
    ]
    check_model(resize_model(X, specs, opset=11), {"x": X})


def test_antialias():
    x = rng.standard_normal((2, 3, 9, 11)).astype(F32)
    specs = [
        (mode("linear", antialias=1), [1, 1, 0.6, 0.3], None, None),
        (
            mode("linear", "align_corners", antialias=1, exclude_outside=1),
            None,
            [2, 3, 4, 15],
            None,
        ),
        (mode("cubic", antialias=1), [1, 1, 1.7, 0.45], None, None),
        (mode("cubic", "asymmetric", antialias=1, exclude_outside=1), [1, 1, 0.6, 0.3], None, None),
    ]
    check_model(resize_model(x, specs), {"x": x})


def test_axes_and_keep_aspect_ratio():
    specs = [
        (mode("linear", axes=[2, 3], keep_aspect_ratio_policy=policy), None, [9, 4], None)
        for policy in ("stretch", "not_larger", "not_smaller")
    ]
    specs += [
        (mode("nearest", axes=[3, 2], keep_aspect_ratio_policy="not_smaller"), None, [4, 9], None),
        (mode("cubic", axes=[-1]), [1.7], None, None),
        (mode("linear", "tf_crop_and_resize", axes=[2, 3]), [1.7, 0.6], None, [0.1, 0.2, 0.8, 1.1]),
    ]
    check_model(resize_model(X, specs, opset=18), {"x": X})


@pytest.mark.parametrize("opset", [13, 23])
def test_optional_inputs_omitted(opset):
    """roi and scales omitted ("" names) with sizes; then scales with roi and sizes omitted."""
    specs = [
        ({"mode": "linear"}, None, [2, 3, 8, 4], None),
        ({"mode": "nearest", "nearest_mode": "floor"}, [1, 1, 2.5, 0.5], None, None),
    ]
    check_model(resize_model(X, specs, opset=opset), {"x": X})


@pytest.mark.parametrize(
    "shape, scales",
    [((2, 3, 7), [1, 1, 1.7]), ((2, 3, 4, 5, 6), [1, 1, 1.5, 1.7, 0.6])],
    ids=["1d", "3d"],
)
def test_1d_and_3d(shape, scales):
    x = rng.standard_normal(shape).astype(F32)
    doubled = [1, 1] + [2] * (len(shape) - 2)
    specs = [
        (mode("linear"), scales, None, None),
        (mode("linear", "align_corners"), scales, None, None),
        (mode("nearest", nearest_mode="ceil"), scales, None, None),
        (mode("nearest", "asymmetric", nearest_mode="floor"), doubled, None, None),
    ]
    converted = check_model(resize_model(x, specs), {"x": x})
    assert converted.result.input_perms["x"] == (0, *range(2, len(shape)), 1)


def test_batch_and_channel_resize_run_logically():
    specs = [
        (mode("nearest"), [2, 1.5, 1, 1], None, None),
        (mode("nearest", nearest_mode="floor"), [1, 0.7, 1.7, 0.6], None, None),
        (mode("linear"), [1, 1.5, 1.7, 1], None, None),
    ]
    converted = check_model(resize_model(X, specs), {"x": X})
    assert converted.result.input_perms["x"] == (0, 1, 2, 3)


def test_integer_data_nearest():
    x = rng.integers(-50, 50, (2, 3, 5, 7)).astype(np.int32)
    specs = [
        (mode("nearest"), [1, 1, 2, 3], None, None),
        (mode("nearest", nearest_mode="floor"), [1, 1, 1.7, 0.6], None, None),
    ]
    check_model(resize_model(x, specs), {"x": x})


def test_resize_opset10():
    specs = [
        ({"mode": name}, scales, None, None)
        for name in ("nearest", "linear")
        for scales in ([1, 1, 2, 3], [1, 1, 0.6, 1.7])
    ]
    check_model(resize_model(X, specs, opset=10), {"x": X})


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(opset):
    scales = [1.0, 1.0, 2.0, 2.5]
    nodes, inits = [], {}
    for name in ("nearest", "linear"):
        if opset == 7:
            nodes.append(helper.make_node("Upsample", ["x"], [name], mode=name, scales=scales))
        else:
            nodes.append(helper.make_node("Upsample", ["x", "scales"], [name], mode=name))
            inits["scales"] = np.array(scales, F32)
    check_model(make_model(nodes, {"x": X}, ["nearest", "linear"], inits, opset), {"x": X})


def test_uses_tflite_resize_builtins():
    specs = [
        (mode("linear"), [1, 1, 2, 2], None, None),
        (mode("linear", "align_corners"), [1, 1, 1.7, 0.6], None, None),
        (mode("nearest", "asymmetric", nearest_mode="floor"), [1, 1, 2, 2], None, None),
        (mode("nearest"), [1, 1, 3, 2], None, None),
    ]
    converted = check_model(resize_model(X, specs), {"x": X})
    ops = count_tflite_ops(tflite_bytes(converted.result))
    assert ops == {"RESIZE_BILINEAR": 2, "RESIZE_NEAREST_NEIGHBOR": 2}, ops


def test_dynamic_spatial_dims():
    specs = [
        (mode("nearest"), [1, 1, 2, 2], None, None),
        (mode("nearest", "asymmetric", nearest_mode="floor"), [1, 1, 2, 4], None, None),
        (mode("linear", "pytorch_half_pixel"), [1, 1, 2, 3], None, None),
        (mode("linear", "align_corners"), [1, 1, 1.7, 0.6], None, None),
    ]
    model = resize_model(X, specs, input_shapes={"x": [None, 3, None, None]})
    converted = convert(model)
    content = tflite_bytes(converted.result)
    assert "GATHER" not in count_tflite_ops(content)
    for x in (X, rng.standard_normal((1, 3, 6, 4)).astype(F32)):
        expected = ort_run(model, {"x": x})
        for got in (tf_run(converted, {"x": x}), tflite_run(converted, {"x": x}, content)):
            for i, (a, e) in enumerate(zip(got, expected)):
                assert_close(a, e, what=f"output {i}, input {x.shape}")


@pytest.mark.parametrize(
    "attrs, scales",
    [(mode("linear"), [1, 1, 2, 2]), (mode("cubic", "asymmetric"), [1, 1, 1.7, 0.6])],
    ids=["bilinear_builtin", "cubic_gathers"],
)
def test_conv_resize_conv_has_no_transpose(attrs, scales):
    x = rng.standard_normal((2, 3, 9, 7)).astype(F32)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(F32)
    w2 = rng.standard_normal((5, 4, 3, 3)).astype(F32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c1", "", "scales"], ["r"], **attrs),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    inits = {"w1": w1, "w2": w2, "scales": np.array(scales, F32)}
    converted = check_model(make_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    ops = count_tflite_ops(tflite_bytes(converted.result))
    assert "TRANSPOSE" not in ops, ops


# --- scales, sizes and roi fed at run time -----------------------------------------------------

# align_corners and tf_crop_and_resize by scales: onnxruntime divides by the output length and
# the ONNX reference by in * scale, so these scales make both the same integer (5 * 1.6 = 8,
# 7 * 0.5 = 3.5 is avoided: 7 * 2 = 14, 5 * 0.6 = 3, 7 * 3 / 7 = 3).
EXACT_SCALES = {"up": [1, 1, 1.6, 2.0], "down": [1, 1, 0.6, 3 / 7]}


@pytest.mark.parametrize("coord", COORDS)
def test_runtime_coordinate_modes(coord):
    """The run-time path: every mode and nearest_mode, by scales and by sizes, odd shapes."""
    roi = ROI if coord == "tf_crop_and_resize" else None
    exact = coord in ("align_corners", "tf_crop_and_resize")
    up, down = ([1, 1, 1.7, 2.5], [1, 1, 0.65, 0.4]) if not exact else EXACT_SCALES.values()
    specs = []
    for rule in NEAREST_MODES:
        attrs = mode("nearest", coord, nearest_mode=rule, extrapolation_value=-2.0)
        specs += [(attrs, up, None, roi), (attrs, None, [2, 3, 9, 3], roi)]
    linear = mode("linear", coord, extrapolation_value=0.5)
    specs += [
        (linear, down, None, roi),
        (linear, None, [2, 3, 9, 3], roi),
        (linear, None, [2, 3, 1, 1], roi),
        (mode("cubic", coord), up, None, roi),
        (mode("cubic", coord, cubic_coeff_a=-0.5, exclude_outside=1), None, [2, 3, 9, 3], roi),
    ]
    converted = check_runtime(X, specs)
    assert converted.result.input_perms["x"] == (0, 2, 3, 1)


def test_runtime_tf_half_pixel_for_nn_and_opset10():
    specs = [
        (mode("nearest", "tf_half_pixel_for_nn", nearest_mode=rule), [1, 1, 1.7, 0.6], None, [])
        for rule in NEAREST_MODES
    ]
    check_runtime(X, specs, opset=11)
    specs = [({"mode": m}, [1, 1, 2, 0.6], None, None) for m in ("nearest", "linear")]
    check_runtime(X, specs, opset=10)


def test_runtime_upsample9():
    nodes = [
        helper.make_node("Upsample", ["x", "scales"], [m], mode=m) for m in ("nearest", "linear")
    ]
    feeds = {"x": X, "scales": np.array([1, 1, 2.0, 2.5], F32)}
    check_model(make_model(nodes, feeds, ["nearest", "linear"], opset=9), feeds)


def test_runtime_antialias():
    x = rng.standard_normal((2, 3, 9, 11)).astype(F32)
    specs = [
        (mode("linear", antialias=1), [1, 1, 0.6, 0.3], None, None),
        (mode("linear", antialias=1), [1, 1, 1.7, 0.45], None, None),
        (
            mode("linear", "align_corners", antialias=1, exclude_outside=1),
            None,
            [2, 3, 4, 15],
            None,
        ),
        (mode("cubic", antialias=1), [1, 1, 1.7, 0.45], None, None),
        (mode("cubic", "asymmetric", antialias=1, exclude_outside=1), [1, 1, 0.6, 0.3], None, None),
    ]
    check_runtime(x, specs)


def test_runtime_axes_and_keep_aspect_ratio():
    specs = [
        (mode("linear", axes=[2, 3], keep_aspect_ratio_policy=policy), None, [9, 4], None)
        for policy in ("stretch", "not_larger", "not_smaller")
    ]
    specs += [
        (mode("nearest", axes=[3, 2], keep_aspect_ratio_policy="not_smaller"), None, [4, 9], None),
        (mode("nearest", axes=[3, 2]), [2.5, 1.7], None, None),
        (mode("cubic", axes=[-1]), [1.7], None, None),
        (mode("linear", "tf_crop_and_resize", axes=[3, 2]), [2.0, 1.6], None, [0.2, 0.1, 1.1, 0.8]),
    ]
    converted = check_runtime(X, specs, opset=18)
    assert converted.result.input_perms["x"] == (0, 2, 3, 1)


def test_runtime_non_spatial_axes():
    """Batch and channel resized at run time: logically where the axes attribute says so;
    else the layout guesses spatial axes (channel-last) and the gathers resize any axis."""
    converted = check_runtime(X, [(mode("linear", axes=[1]), [1.7], None, None)], opset=18)
    assert converted.result.input_perms["x"] == (0, 1, 2, 3)
    specs = [
        (mode("nearest"), [2, 1.5, 1, 1], None, None),
        (mode("linear", "asymmetric"), [1, 1.2, 1.7, 1], None, None),
    ]
    converted = check_runtime(X, specs, opset=18)
    assert converted.result.input_perms["x"] == (0, 2, 3, 1)


def test_runtime_integer_data_nearest():
    x = rng.integers(-50, 50, (2, 3, 5, 7)).astype(np.int32)
    specs = [
        (mode("nearest"), [1, 1, 2, 3], None, None),
        (mode("nearest", nearest_mode="floor"), None, [2, 3, 8, 4], None),
    ]
    check_runtime(x, specs)


@pytest.mark.parametrize(
    "shape, scales",
    [((2, 3, 7), [1, 1, 1.7]), ((2, 3, 4, 5, 6), [1, 1, 1.5, 1.7, 0.6])],
    ids=["1d", "3d"],
)
def test_runtime_1d_and_3d(shape, scales):
    x = rng.standard_normal(shape).astype(F32)
    specs = [
        (mode("linear"), scales, None, None),
        (mode("linear", "asymmetric"), scales, None, None),
        (mode("nearest", nearest_mode="ceil"), None, [2, 3, *[4] * (len(shape) - 2)], None),
    ]
    converted = check_runtime(x, specs)
    assert converted.result.input_perms["x"] == (0, *range(2, len(shape)), 1)


def test_runtime_dynamic_spatial_dims():
    """Run-time sizes on an input whose spatial dims are unknown until run time."""
    specs = [
        (mode("linear"), None, [2, 3, 9, 4], None),
        (mode("nearest", "asymmetric", nearest_mode="floor"), None, [2, 3, 3, 8], None),
    ]
    nodes, params = resize_nodes(specs)
    feeds = {"x": X, **params}
    model = make_model(nodes, feeds, ["y0", "y1"], input_shapes={"x": [None, 3, None, None]})
    converted = convert(model)
    content = tflite_bytes(converted.result)
    for x in (X, rng.standard_normal((2, 3, 6, 4)).astype(F32)):
        expected = ort_run(model, {**feeds, "x": x})
        for got in (
            tf_run(converted, {**feeds, "x": x}),
            tflite_run(converted, {**feeds, "x": x}, content),
        ):
            for i, (a, e) in enumerate(zip(got, expected)):
                assert_close(a, e, what=f"output {i}, input {x.shape}")


def test_runtime_roi_unused_keeps_constant_path():
    """A run-time roi that the mode ignores leaves the constant path (TFLite builtins)."""
    specs = [(mode("linear"), [1, 1, 2, 2], None, [0, 0, 0, 0, 1, 1, 1, 1])]
    nodes, params = resize_nodes(specs)
    roi = {"in0_1": params.pop("in0_1")}
    feeds = {"x": X, **roi}
    converted = check_model(make_model(nodes, feeds, ["y0"], params), feeds)
    ops = count_tflite_ops(converted.tflite)
    assert "RESIZE_BILINEAR" in ops and "GATHER" not in ops, ops


@pytest.mark.parametrize("attrs", [mode("linear"), mode("nearest")], ids=["linear", "nearest"])
def test_runtime_conv_resize_conv_has_no_transpose(attrs):
    """Run-time spatial scales (axes [2, 3]: the channel count stays static for the Conv)."""
    x = rng.standard_normal((2, 3, 9, 7)).astype(F32)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(F32)
    w2 = rng.standard_normal((5, 4, 3, 3)).astype(F32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c1", "", "scales"], ["r"], axes=[2, 3], **attrs),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    feeds = {"x": x, "scales": np.array([1.7, 0.6], F32)}
    converted = check_model(make_model(nodes, feeds, ["y"], {"w1": w1, "w2": w2}), feeds)
    ops = count_tflite_ops(converted.tflite)
    assert "TRANSPOSE" not in ops and "GATHER" in ops, ops


def test_runtime_sizes_on_an_input_of_unknown_static_dims():
    """Resize to run-time sizes of an input whose every dim TF leaves unknown (a Reshape to
    a computed shape here; each mask torchvision's Mask R-CNN pastes in its Loop): the
    static channel dims are restored axis by axis. Reading the i-th unknown target dim from
    the i-th unknown input dim gave (1, 1, 7, 1) for (1, 7, 4, 1)."""
    nodes = [helper.make_node("Concat", ["ones", "dims"], ["shape"], axis=0),
             helper.make_node("Reshape", ["v", "shape"], ["x"]),
             helper.make_node("Concat", ["ones", "out_dims"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")]
    feeds = {"v": rng.standard_normal(30).astype(np.float32), "dims": np.array([5, 6], np.int64),
             "out_dims": np.array([7, 4], np.int64)}
    check_nodes(nodes, feeds, {"ones": np.array([1, 1], np.int64)}, outputs=["y"],
                input_shapes={"v": ["n"], "dims": [2], "out_dims": [2]})
