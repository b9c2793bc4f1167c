"""The activation ranges the INT8 files are quantized with (quant/ranges.py): every range in
the calibrated flatbuffer is the range onnxruntime computes for the same ONNX value on the
calibration samples, including the hard-swish gate whose buffer TF's calibrator lets the
following multiply overwrite."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2tf_alt.pipeline import build
from onnx2tf_alt.quant import ranges
from onnx2tf_alt.quant.quantize import QuantOptions, calibrated_tflite, run_tflite
from onnx2tf_alt.quant.sensitivity import quantize_calibrated

from harness import make_model, ort_run

SHAPE = (1, 3, 15, 17)


def _hard_swish_model() -> onnx.ModelProto:
    """Conv -> x * Clip(x + 3, 0, 6) / 6 -> Conv, with conv outputs reaching about ±20 so
    that the product's range is some 20x the gate's [0, 6]."""
    rng = np.random.default_rng(0)
    init = {"w0": (rng.standard_normal((8, 3, 3, 3)) * 3).astype(np.float32),
            "b0": rng.standard_normal(8).astype(np.float32),
            "w1": (rng.standard_normal((5, 8, 1, 1)) * 0.3).astype(np.float32),
            "three": np.array(3, np.float32), "zero": np.array(0, np.float32),
            "six": np.array(6, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c0", "three"], ["s"]),
             helper.make_node("Clip", ["s", "zero", "six"], ["gate"]),
             helper.make_node("Mul", ["c0", "gate"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["h"]),
             helper.make_node("Conv", ["h", "w1"], ["y"])]
    return make_model(nodes, {"x": np.zeros(SHAPE, np.float32)}, ["y"], init, opset=13)


def _samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(-1, 1, SHAPE).astype(np.float32)} for _ in range(n)]


def _recorded_ranges(content: bytes) -> list[tuple[float, float]]:
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    ranges = []
    for tensor in model.subgraphs[0].tensors:
        q = tensor.quantization
        if q is not None and q.min is not None and len(q.min) == 1:
            ranges.append((float(q.min[0]), float(q.max[0])))
    return ranges


def _onnx_ranges(model: onnx.ModelProto, samples) -> dict[str, tuple[float, float]]:
    """{value: (min, max)} over the samples, from onnxruntime, for every node output."""
    names = [o for node in model.graph.node for o in node.output]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    values = [ort_run(probe, s) for s in samples]
    return {n: (min(float(v[i].min()) for v in values), max(float(v[i].max()) for v in values))
            for i, n in enumerate(names)}


@pytest.fixture(scope="module")
def calibrated():
    model = _hard_swish_model()
    converted = build(input_onnx_file_path=None, onnx_graph=model)
    samples = _samples(8, seed=1)
    content, flex = calibrated_tflite(converted, QuantOptions(integer=True), samples)
    assert not flex
    return model, converted, samples, content


def _close(a: tuple, b: tuple) -> bool:
    return all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b))


def test_every_recorded_range_is_an_onnx_values_range(calibrated):
    model, _, samples, content = calibrated
    truth = _onnx_ranges(model, samples)
    recorded = _recorded_ranges(content)
    x = (min(float(s["x"].min()) for s in samples), max(float(s["x"].max()) for s in samples))
    assert recorded, "the calibrated file records ranges"
    for low_high in recorded:
        assert _close(low_high, x) or any(_close(low_high, r) for r in truth.values()), low_high


def test_the_hard_swish_gate_keeps_its_own_range(calibrated):
    """The Clip output (fused into ADD as RELU6) is recorded as [0, 6]-ish, not as the range
    of the product that TF's calibrator lets overwrite it; the product keeps its own."""
    model, _, samples, content = calibrated
    truth = _onnx_ranges(model, samples)
    gate, product = truth["gate"], truth["m"]
    assert 0 <= gate[0] and gate[1] <= 6 and product[1] > 10 * gate[1]
    recorded = _recorded_ranges(content)
    assert any(_close(r, gate) for r in recorded)
    assert any(_close(r, product) for r in recorded)


def test_int8_file_stays_within_half_an_output_step(calibrated):
    """On held-out samples the INT8 file's mean error against onnxruntime is below half the
    step of an 8-bit grid over the output's range (about 0.4 of it here); with the gate on
    the product's grid (about 20 levels over [0, 6]) it was a whole step."""
    model, converted, _, content = calibrated
    held_out = _samples(4, seed=2)
    int8 = quantize_calibrated(content, False, None, [])
    for sample, out in zip(held_out, run_tflite(int8, converted, held_out)):
        reference = ort_run(model, sample)[0]
        step = (reference.max() - reference.min()) / 255
        assert np.abs(out["y"] - reference).mean() < step / 2


def test_a_model_too_large_to_keep_every_tensor_keeps_tfs_ranges(calibrated, monkeypatch,
                                                                  caplog):
    """Above MAX_KEPT_BYTES of tensors the ranges are not measured again: TF's records
    stay and a warning says why."""
    _, converted, samples, _ = calibrated
    monkeypatch.setattr(ranges, "MAX_KEPT_BYTES", 1024)
    logger = logging.getLogger("onnx2tf_alt")  # it does not propagate to the root logger
    caplog.set_level(logging.WARNING, logger="onnx2tf_alt")  # an earlier test may quiet it
    logger.addHandler(caplog.handler)
    try:
        content, _ = calibrated_tflite(converted, QuantOptions(integer=True), samples)
    finally:
        logger.removeHandler(caplog.handler)
    assert "TF's recorded ranges kept" in caplog.text and "GiB at once" in caplog.text
    assert _recorded_ranges(content), "the file is still calibrated"
