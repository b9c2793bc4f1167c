"""Bias correction of the INT8 files (quant/bias_correction.py): the convolutions without
fused activation get the mean error of their 8-bit output taken out of their int32 bias,
nothing else of the file changes, and the output on held-out samples gets closer to
onnxruntime's."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.api import convert
from onnx2tf_alt.pipeline import build
from onnx2tf_alt.quant.bias_correction import corrected_biases
from onnx2tf_alt.quant.quantize import QuantOptions, calibrated_tflite, run_tflite
from onnx2tf_alt.quant.sensitivity import quantize_calibrated

from harness import make_model, ort_run

SHAPE = (1, 4, 20, 23)


def _model() -> onnx.ModelProto:
    """Conv -> Conv + Relu -> Conv on positive, skewed inputs (mean 1): the int8 rounding
    of each output channel's few weights shifts its mean by sum((w - q(w)) * E[x])."""
    rng = np.random.default_rng(11)
    init = {"w0": (rng.standard_normal((8, 4, 3, 3)) * 0.4).astype(np.float32),
            "b0": rng.standard_normal(8).astype(np.float32),
            "w1": (rng.standard_normal((6, 8, 1, 1)) * 0.5).astype(np.float32),
            "w2": (rng.standard_normal((5, 6, 1, 1)) * 0.5).astype(np.float32),
            "b2": rng.standard_normal(5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c0", "w1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    return make_model(nodes, {"x": np.zeros(SHAPE, np.float32)}, ["y"], init, opset=13)


def _samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.exponential(1.0, SHAPE).astype(np.float32)} for _ in range(n)]


def _quantized(model: onnx.ModelProto, seed: int) -> tuple:
    """(the conversion of `model`, its min-max calibrated float file, the INT8 file
    without correction, the 8 calibration samples' feeds in the file's layout)."""
    converted = build(input_onnx_file_path=None, onnx_graph=model)
    calibration = _samples(8, seed=seed)
    options = QuantOptions(integer=True, calibration_method="minmax")
    calibrated = calibrated_tflite(converted, options, calibration)[0].written()
    plain = quantize_calibrated(calibrated, False, None, [])
    return converted, calibrated, plain, [converted.result.to_physical(s) for s in calibration]


@pytest.fixture(scope="module")
def files():
    model = _model()
    converted, calibrated, plain, feeds = _quantized(model, seed=1)
    corrected, count = corrected_biases(plain, calibrated, feeds)
    return model, converted, plain, corrected, count


def _buffers(content: bytes) -> tuple[list, list]:
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    model = unpack_model(content)
    graph = model.subgraphs[0]
    ops = [(model.operatorCodes[op.opcodeIndex].builtinCode, list(op.inputs), list(op.outputs))
           for op in graph.operators]
    biases = {graph.tensors[op.inputs[2]].buffer for op in graph.operators
              if len(op.inputs) > 2 and op.inputs[2] >= 0}
    data = [(i in biases, None if b.data is None else bytes(b.data))
            for i, b in enumerate(model.buffers)]
    return ops, data


def test_only_the_biases_of_convolutions_without_activation_change(files):
    _, _, plain, corrected, count = files
    assert count == 2  # the first and the last Conv; the middle one has a fused ReLU
    plain_ops, plain_data = _buffers(plain)
    ops, data = _buffers(corrected)
    assert ops == plain_ops
    changed = [k for k, (a, b) in enumerate(zip(plain_data, data)) if a[1] != b[1]]
    assert changed and all(data[k][0] for k in changed), changed
    assert len(changed) == 2


def test_corrected_file_is_closer_to_onnxruntime_on_held_out_samples(files):
    """The per-channel mean error of the output falls to a fraction, the mean |error| too."""
    model, converted, plain, corrected, _ = files
    held_out = _samples(6, seed=2)
    reference = [ort_run(model, s)[0] for s in held_out]
    shift, error = {}, {}
    for name, content in (("plain", plain), ("corrected", corrected)):
        outputs = [o["y"] for o in run_tflite(content, converted, held_out)]
        diff = np.stack([o - r for o, r in zip(outputs, reference)])
        shift[name] = float(np.abs(diff.mean(axis=(0, 1, 3, 4))).mean())
        error[name] = float(np.abs(diff).mean())
    assert shift["corrected"] < shift["plain"] / 3, shift
    assert error["corrected"] < error["plain"], error


def _converted_with_and_without(tmp_path, samples: int, seed: int) -> tuple[dict, dict]:
    """_model() converted with -oiqt on `samples` calibration inputs, with and without
    bias correction: ({flag: quant report}, {(flag, variant): .tflite bytes})."""
    path = str(tmp_path / "m.onnx")
    onnx.save(_model(), path)
    np.save(tmp_path / "x.npy", np.concatenate([s["x"] for s in _samples(samples, seed)]))
    reports, contents = {}, {}
    for flag in (True, False):
        out = str(tmp_path / f"out_{flag}")
        convert(input_onnx_file_path=path, output_folder_path=out, non_verbose=True,
                output_integer_quantized_tflite=True, bias_correction=flag,
                calibration_method="minmax",
                custom_input_op_name_np_data_path=[["x", str(tmp_path / "x.npy")]])
        with open(os.path.join(out, "m_quant_report.json")) as f:
            reports[flag] = json.load(f)
        for variant in ("integer_quant", "full_integer_quant"):
            with open(os.path.join(out, f"m_{variant}.tflite"), "rb") as f:
                contents[flag, variant] = f.read()
    return reports, contents


def test_cli_writes_corrected_files_unless_told_not_to(tmp_path):
    reports, contents = _converted_with_and_without(tmp_path, 10, seed=3)
    notes = [n for n in reports[True]["notes"] if "biases of 2 convolution(s)" in n]
    assert notes, reports[True]["notes"]
    assert not any("biases" in n for n in reports[False]["notes"]), reports[False]["notes"]
    full, half = contents[True, "full_integer_quant"], contents[True, "integer_quant"]
    assert full != contents[False, "full_integer_quant"]
    assert _buffers(full)[0] == _buffers(contents[False, "full_integer_quant"])[0]
    # the full-integer file takes the corrections measured on the float-input one
    assert sorted(d for bias, d in _buffers(full)[1] if bias) == sorted(
        d for bias, d in _buffers(half)[1] if bias)


def test_correction_is_kept_only_if_other_calibration_samples_agree(tmp_path):
    """With calibration samples beyond the 8 the corrections are measured on, both INT8
    files are scored on those; the note gives the two cosines and the written file is the
    better one (the corrected file, or the one written with --no_bias_correction)."""
    import re

    reports, contents = _converted_with_and_without(tmp_path, 24, seed=4)
    [note] = [n for n in reports[True]["notes"] if "biases of 2 convolution(s)" in n]
    before, after = (float(v) for v in re.search(
        r"on (?:\d+) other calibration samples (\d\.\d+) before, (\d\.\d+) after", note).groups())
    kept = after > before
    assert (" not corrected for" not in note) == kept, note
    assert (contents[True, "integer_quant"] != contents[False, "integer_quant"]) == kept


def test_refitted_on_every_sample_is_the_corrected_file(files):
    """refitted (the correction of a subset of the samples, for the folds that judge it)
    gives back the measured file when the subset is every sample, and a subset's file
    differs only in bias buffers."""
    from onnx2tf_alt.quant.bias_correction import refitted

    _, converted, plain, _, _ = files
    calibration = _samples(8, seed=1)
    options = QuantOptions(integer=True, calibration_method="minmax")
    calibrated = calibrated_tflite(converted, options, calibration)[0].written()
    errors: dict = {}
    feeds = [converted.result.to_physical(s) for s in calibration]
    corrected, count = corrected_biases(plain, calibrated, feeds, errors=errors)
    assert len(errors) == count == 2
    assert all(e.shape[0] == 8 for e, _ in errors.values())
    assert refitted(plain, errors, list(range(8))) == corrected
    subset = refitted(plain, errors, [0, 2, 4, 6])
    assert _buffers(subset)[0] == _buffers(plain)[0]
    changed = [bias for (bias, a), (_, b) in zip(_buffers(subset)[1], _buffers(plain)[1])
               if a != b]
    assert changed and all(changed)


def test_parallel_branches_share_a_cut_and_give_the_same_file(monkeypatch):
    """Conv a, then convs b and c reading a side by side (a feature pyramid's branches),
    their sum into conv d: b and c are measured on one cut (neither is upstream of the
    other), and the file equals the one measured a conv at a time."""
    from onnx2tf_alt.quant import bias_correction
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    rng = np.random.default_rng(4)
    init = {name: (rng.standard_normal(shape) * 0.4).astype(np.float32) for name, shape in (
        ("wa", (6, 4, 3, 3)), ("wb", (5, 6, 1, 1)), ("wc", (5, 6, 3, 3)), ("wd", (3, 5, 1, 1)))}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "wb"], ["b"]),
             helper.make_node("Conv", ["a", "wc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "c"], ["s"]),
             helper.make_node("Conv", ["s", "wd"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(SHAPE, np.float32)}, ["y"], init, opset=13)
    _, calibrated, plain, feeds = _quantized(model, seed=2)
    flat = unpack_model(plain)
    convs = [k for k, op in enumerate(flat.subgraphs[0].operators)
             if op_name(flat, op) == "CONV_2D"]
    assert len(convs) == 4
    assert bias_correction._waves(flat.subgraphs[0], convs) == [
        [convs[0]], [convs[1], convs[2]], [convs[3]]]
    together, count = corrected_biases(plain, calibrated, feeds)
    assert count == 4
    monkeypatch.setattr(bias_correction, "_waves", lambda graph, targets: [[t] for t in targets])
    one_at_a_time, _ = corrected_biases(plain, calibrated, feeds)
    assert together == one_at_a_time and together != plain


def test_a_file_with_other_float_ops_measures_its_own_corrections():
    """Corrections are shared only by files with the same float ops (the full-integer
    twin): a file with the first conv kept float (a --keep_float_auto trial) has other
    errors for the convs after it to take out, and gets the corrections measured on it, not
    the all-INT8 file's."""
    from onnx2tf_alt.tflite.flatbuffer import op_name, unpack_model

    model = _model()
    _, calibrated, plain, feeds = _quantized(model, seed=1)
    known: dict = {}
    first, _ = corrected_biases(plain, calibrated, feeds, known)
    again, _ = corrected_biases(plain, calibrated, feeds, known)  # the twin: from `known`
    assert again == first
    unpacked = unpack_model(plain)
    graph = unpacked.subgraphs[0]
    conv = next(graph.tensors[op.outputs[0]].name.decode() for op in graph.operators
                if op_name(unpacked, op) == "CONV_2D")
    mixed = quantize_calibrated(calibrated, False, None, [conv])
    shared, count = corrected_biases(mixed, calibrated, feeds, known)
    own, _ = corrected_biases(mixed, calibrated, feeds)
    assert count and shared == own
