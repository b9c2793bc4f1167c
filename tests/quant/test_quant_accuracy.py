"""What the calibrated quantized files are built from (quant/prepare.py): the rewrites of
onnx2tf_alt/passes/quant_rewrites.py, exact in float (checked against onnxruntime through the TF
model and the float32 TFLite), and GPTQ weight rounding (quant/weight_rounding.py), on a
block shaped like PP-LCNetV3's (learnable affine after Conv and after the written-out
hard-swish, squeeze-excitation residual)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.api import convert
from onnx2tf_alt.passes.quant_rewrites import rewrite_for_quantization
from onnx2tf_alt.quant.quantize import cosine
from onnx2tf_alt.quant.weight_rounding import LEVELS, round_conv_weights, round_rows

from harness import check_model, count_tflite_ops, make_model, ort_run

C = 8  # channels of the block


def _weights(rng, out_ch, in_ch, k):
    return (rng.standard_normal((out_ch, in_ch, k, k)) * np.sqrt(2 / (in_ch * k * k))).astype(
        np.float32)


def _hard_swish(x: str, out: str, p: str, sigmoid: bool) -> list:
    """hard-swish written out: x * Clip(x + 3, 0, 6) / 6, or x * HardSigmoid(x; 1/6, 0.5)."""
    if sigmoid:
        return [helper.make_node("HardSigmoid", [x], [f"{p}_g"], alpha=1 / 6, beta=0.5),
                helper.make_node("Mul", [x, f"{p}_g"], [out])]
    return [helper.make_node("Add", [x, "three"], [f"{p}_s"]),
            helper.make_node("Clip", [f"{p}_s", "zero", "six"], [f"{p}_c"]),
            helper.make_node("Mul", [x, f"{p}_c"], [f"{p}_m"]),
            helper.make_node("Div", [f"{p}_m", "six"], [out])]


def lcnet_block(opset: int, batch: int = 2, height: int = 13, width: int = 11) -> onnx.ModelProto:
    """stem Conv -> scalar affine -> hard-swish -> per-channel affine -> 1x1 Conv (folded,
    shift included) -> hard-swish (x * HardSigmoid) -> scale -> padded depthwise Conv
    (folded: a scale keeps the zero border) -> affine -> padded 3x3 Conv (not folded: the
    shift would change the border) -> SE gate -> x + x * s."""
    rng = np.random.default_rng(0)
    init = {
        "three": np.array(3, np.float32), "zero": np.array(0, np.float32),
        "six": np.array(6, np.float32),
        "w0": _weights(rng, C, 3, 3), "b0": rng.standard_normal(C).astype(np.float32) * 0.1,
        "a0": np.array([1.7], np.float32), "s0": np.array([0.4], np.float32),
        "a1": rng.uniform(0.5, 1.5, (1, C, 1, 1)).astype(np.float32),
        "s1": rng.standard_normal((1, C, 1, 1)).astype(np.float32) * 0.3,
        "w1": _weights(rng, C, C, 1), "b1": rng.standard_normal(C).astype(np.float32) * 0.1,
        "a2": np.array(0.8, np.float32),
        "w2": _weights(rng, C, 1, 3),
        "a3": np.array([1.2], np.float32), "s3": np.array([-0.3], np.float32),
        "w3": _weights(rng, C, C, 3), "b3": rng.standard_normal(C).astype(np.float32) * 0.1,
        "wse1": _weights(rng, 4, C, 1), "wse2": _weights(rng, C, 4, 1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Mul", ["a0", "c0"], ["m0"]),
        helper.make_node("Add", ["m0", "s0"], ["l0"]),
        *_hard_swish("l0", "h0", "hs0", sigmoid=False),
        helper.make_node("Mul", ["h0", "a1"], ["m1"]),
        helper.make_node("Add", ["m1", "s1"], ["l1"]),
        helper.make_node("Conv", ["l1", "w1", "b1"], ["c1"]),
        *_hard_swish("c1", "h1", "hs1", sigmoid=True),
        helper.make_node("Mul", ["h1", "a2"], ["m2"]),
        helper.make_node("Conv", ["m2", "w2"], ["c2"], pads=[1, 1, 1, 1], group=C),
        helper.make_node("Mul", ["c2", "a3"], ["m3"]),
        helper.make_node("Add", ["m3", "s3"], ["l3"]),
        helper.make_node("Conv", ["l3", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c3"], ["gap"]),
        helper.make_node("Conv", ["gap", "wse1"], ["se1"]),
        helper.make_node("Relu", ["se1"], ["se1r"]),
        helper.make_node("Conv", ["se1r", "wse2"], ["se2"]),
        helper.make_node("HardSigmoid", ["se2"], ["gate"]),
        helper.make_node("Mul", ["c3", "gate"], ["gated"]),
        helper.make_node("Add", ["c3", "gated"], ["y"]),
    ]
    feeds = {"x": np.zeros((batch, 3, height, width), np.float32)}
    return make_model(nodes, feeds, ["y"], init, opset=opset)


def _feeds(batch: int = 2, height: int = 13, width: int = 11) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).uniform(-2, 2, (batch, 3, height, width)).astype(
        np.float32)}


EXPECTED = {"affine_into_conv": 2, "gated_residual": 1}


@pytest.mark.parametrize("opset", [12, 17])
def test_rewrites_are_exact_in_float(opset):
    model = lcnet_block(opset)
    rewritten, counts = rewrite_for_quantization(model)
    assert counts == EXPECTED
    onnx.checker.check_model(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    before = model_ops(model)
    # a1 * . + s1 and a2 * . folded; the SE's x + x * s became x * (s + 1)
    assert (ops.count("Mul"), ops.count("Add")) == (before.count("Mul") - 2,
                                                   before.count("Add") - 1)
    feeds = _feeds()
    np.testing.assert_allclose(ort_run(rewritten, feeds)[0], ort_run(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    check_model(rewritten, feeds, tol=1e-4)


def model_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_rewritten_model_has_fewer_tflite_ops():
    model = lcnet_block(17, batch=1, height=16, width=16)
    feeds = _feeds(1, 16, 16)
    before = count_tflite_ops(check_model(model, feeds).tflite)
    after = count_tflite_ops(check_model(rewrite_for_quantization(model)[0], feeds).tflite)
    assert sum(after.values()) < sum(before.values())


def test_look_alikes_are_left_alone():
    """A Mul whose output is read twice, a non-constant scale, a Conv with a shifted padded
    input and a residual whose gate is as large as x are left alone."""
    rng = np.random.default_rng(2)
    init = {"two": np.array(2, np.float32), "zero": np.array(0, np.float32),
            "six": np.array(6, np.float32), "a": np.array([1.5], np.float32),
            "w": _weights(rng, 4, 4, 1), "w3": _weights(rng, 4, 4, 3),
            "b": np.array([0.5], np.float32)}
    nodes = [
        helper.make_node("Add", ["x", "two"], ["s"]),
        helper.make_node("Clip", ["s", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["h"]),
        helper.make_node("Mul", ["h", "a"], ["twice"]),
        helper.make_node("Conv", ["twice", "w"], ["k1"]),
        helper.make_node("Mul", ["k1", "twice"], ["k2"]),  # second reader of `twice`
        helper.make_node("Mul", ["k2", "x"], ["k3"]),  # a scale that is no constant
        helper.make_node("Conv", ["k3", "w"], ["k4"]),
        helper.make_node("Add", ["k4", "b"], ["k5"]),
        helper.make_node("Conv", ["k5", "w3"], ["k6"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["k6"], ["k6r"]),
        helper.make_node("Mul", ["k6", "k6r"], ["k7"]),  # a gate as large as x
        helper.make_node("Add", ["k6", "k7"], ["y"]),
    ]
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 4, 5, 6)).astype(np.float32)}
    model = make_model(nodes, feeds, ["y"], init, opset=14)
    rewritten, counts = rewrite_for_quantization(model)
    assert counts == {"affine_into_conv": 0, "gated_residual": 0}
    assert [n.op_type for n in rewritten.graph.node] == [n.op_type for n in model.graph.node]


def _correlated(rng, dims: int, n: int) -> np.ndarray:
    """Inputs with strongly correlated channels and a few large ones, as trained nets have."""
    mix = rng.standard_normal((dims, dims)) * np.linspace(3, 0.2, dims)
    return mix @ rng.standard_normal((dims, n))


def test_gptq_rounding_lies_on_the_tflite_grid_and_beats_nearest():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 24))
    w[5] = 0  # a dead channel stays zero
    data = _correlated(rng, 24, 6000)
    calibration, held_out = data[:, :2000], data[:, 2000:]
    q = round_rows(w, calibration @ calibration.T)
    assert not q[5].any()
    live = np.abs(w).max(axis=1) > 0
    scale = np.abs(w[live]).max(axis=1, keepdims=True) / LEVELS
    steps = q[live] / scale
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-6)
    assert np.all(np.abs(np.round(steps)).max(axis=1) == LEVELS)  # TFLite finds this scale
    w, q = w[live], q[live]
    nearest = np.round(w / scale) * scale
    error = np.linalg.norm((q - w) @ held_out)
    assert error < 0.7 * np.linalg.norm((nearest - w) @ held_out)


def test_gptq_groups_rounded_at_once_are_each_rounded_alone():
    """round_rows with a leading group axis (a depthwise conv's channels) gives each group
    exactly what it gives that group alone, a singular group's h included (nearest)."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((6, 2, 9))
    data = [_correlated(rng, 9, 200) for _ in range(6)]
    h = np.stack([x @ x.T for x in data])
    together = round_rows(w, h)
    for g in range(6):
        assert np.array_equal(together[g], round_rows(w[g], h[g])), g
    h[3] = -np.eye(9)  # not positive, no factor: that group rounds to nearest, the others alike
    mixed = round_rows(w, h)
    assert np.array_equal(np.delete(mixed, 3, 0), np.delete(together, 3, 0))
    scale = np.abs(w[3]).max(axis=1, keepdims=True) / LEVELS
    assert np.array_equal(mixed[3], np.round(w[3] / scale) * scale)


@pytest.mark.parametrize("strides, dilations, pads, groups",
                         [([1, 1], [1, 1], [1, 1, 1, 1], 1), ([2, 1], [1, 2], [0, 2, 1, 0], 1),
                          ([1, 2], [2, 1], [2, 2, 2, 2], 4)])
def test_patch_statistics_are_the_patches_outer_products(strides, dilations, pads, groups):
    """_group_hessians against an im2col written out position by position (batch 2, odd
    sizes): the patches of its sampled output positions, rows in (c, ky, kx) order."""
    from onnx2tf_alt.quant import weight_rounding

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    shape = (8, 4 // groups, 3, 3)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, dilations=dilations,
                            pads=pads, group=groups)
    got = weight_rounding._group_hessians(conv, x, shape)
    padded = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    out_h = (padded.shape[2] - dilations[0] * 2 - 1) // strides[0] + 1
    out_w = (padded.shape[3] - dilations[1] * 2 - 1) // strides[1] + 1
    columns = []
    for n in range(2):  # fewer positions than MIN_POSITIONS: every one is taken
        for r in range(out_h):
            for c in range(out_w):
                rows = np.arange(3) * dilations[0] + r * strides[0]
                cols = np.arange(3) * dilations[1] + c * strides[1]
                columns.append(padded[n][:, rows][:, :, cols].reshape(4, 9))
    patches = np.stack(columns, -1).astype(np.float64)  # (C, taps, positions)
    per_group = 4 // groups
    assert len(got) == groups
    for g in range(groups):
        p = patches[g * per_group:(g + 1) * per_group].reshape(per_group * 9, -1)
        np.testing.assert_allclose(got[g], p @ p.T, rtol=1e-5, atol=1e-4)


def test_gptq_conv_weights_keep_the_model_close():
    model = lcnet_block(17, batch=1, height=24, width=24)
    rng = np.random.default_rng(5)
    samples = [{"x": rng.uniform(-2, 2, (1, 3, 24, 24)).astype(np.float32)} for _ in range(6)]
    rounded, count = round_conv_weights(model, samples)
    assert count == 6  # every Conv of the block, the SE's 1x1 ones included
    feeds = {"x": rng.uniform(-2, 2, (1, 3, 24, 24)).astype(np.float32)}
    assert cosine(ort_run(rounded, feeds)[0], ort_run(model, feeds)[0]) > 0.999


def test_gptq_and_channel_peaks_read_the_weights_where_they_lie(tmp_path, monkeypatch):
    """The weights kept on disk (external data, or a single file's read in place: most
    models' now) reach onnxruntime through weights.ort_options: without it GPTQ's and the
    equalization's runs failed, and the INT16 files fell back to nearest rounding."""
    from onnx2tf_alt.ir import weights
    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.passes.quant_rewrites import channel_peaks

    monkeypatch.setattr(weights, "INFERENCE_VALUE_LIMIT", 16)  # every weight stays on disk
    path = tmp_path / "block.onnx"
    onnx.save(lcnet_block(17, batch=1, height=24, width=24), path, save_as_external_data=True,
              location="block.bin", size_threshold=0)
    model = load_model(str(path))
    assert weights.is_external(next(t for t in model.graph.initializer if t.name == "w3"))
    rng = np.random.default_rng(5)
    samples = [{"x": rng.uniform(-2, 2, (1, 3, 24, 24)).astype(np.float32)} for _ in range(6)]
    _, count = round_conv_weights(model, samples)
    assert count == 6
    peaks = channel_peaks(model, samples, ["c1"])
    assert peaks["c1"].shape == (C,) and (peaks["c1"] > 0).all()


@pytest.fixture(scope="module")
def quantized_block(tmp_path_factory):
    folder = tmp_path_factory.mktemp("block")
    path = str(folder / "block.onnx")
    onnx.save(lcnet_block(12, batch=1, height=32, width=32), path)
    out = str(folder / "out")
    convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
            output_integer_quantized_tflite=True)
    with open(os.path.join(out, "block_quant_report.json")) as f:
        return json.load(f)


def test_int16_activation_files_come_from_the_prepared_model(quantized_block):
    """The report says what the preparation changed; every file converts and stays close to
    the float32 one (the INT8 files from the equalized copy, the INT16-activation ones from
    the prepared copy)."""
    report = quantized_block
    notes = " ".join(report["notes"])
    assert "2 constant Mul/Add chain(s) folded" in notes and "6 Conv(s)" in notes
    assert "INT8 files: built from the model with the channel ranges of 1 " in notes
    assert not [e for e in report["files"] if e.get("error")]
    cosines = {e["variant"]: e["outputs"]["y"]["cosine"] for e in report["files"]}
    assert cosines["integer_quant"] > 0.995
    assert cosines["full_integer_quant"] > 0.995
    assert cosines["full_integer_quant_with_int16_act"] > 0.9999
