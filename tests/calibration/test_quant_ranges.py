"""The activation ranges the INT8 files are quantized with (calibration/ranges.py): every range in
the calibrated flatbuffer is the range onnxruntime computes for the same ONNX value on the
calibration samples, including the hard-swish gate whose buffer TF's calibrator lets the
following multiply overwrite."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper

from calibration import ranges
from onnx2tf_alt.pipeline import build
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
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    model = unpack_model(content)
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
    options = QuantOptions(integer=True, calibration_method="minmax")
    calibrated, flex = calibrated_tflite(converted, options, samples)
    assert not flex
    return model, converted, samples, calibrated.written()


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
    """Above MAX_KEPT_BYTES of tensors kept at once (in a piece of the file) the ranges are
    not measured again: TF's records stay and a warning says why."""
    _, converted, samples, _ = calibrated
    monkeypatch.setattr(ranges, "MAX_KEPT_BYTES", 1024)
    logger = logging.getLogger("onnx2tf_alt")  # it does not propagate to the root logger
    caplog.set_level(logging.WARNING, logger="onnx2tf_alt")  # an earlier test may quiet it
    logger.addHandler(caplog.handler)
    try:
        content = calibrated_tflite(converted, QuantOptions(integer=True), samples)[0].written()
    finally:
        logger.removeHandler(caplog.handler)
    assert "TF's recorded ranges kept" in caplog.text and "GiB at once" in caplog.text
    assert _recorded_ranges(content), "the file is still calibrated"


# --- clipped ranges: --calibration_method percentile / mse ----------------------------------


def _quantization_mse(values: np.ndarray, low: float, high: float) -> float:
    """Mean squared error of `values` on the 8-bit grid of [low, high]."""
    step = (high - low) / 255
    grid = np.clip(np.round((values - low) / step), 0, 255) * step + low
    return float(((values - grid) ** 2).mean())


def _histogram(values: np.ndarray) -> tuple[np.ndarray, float, float]:
    low, high = float(values.min()), float(values.max())
    return np.histogram(values, ranges.BINS, (low, high))[0], low, high


def test_percentile_range_drops_only_the_rarest_values():
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.normal(0, 1, 200_000), [40.0, -35.0]])
    low, high = ranges.percentile_range(*_histogram(values))
    assert -5 < low < -3.5 and 3.5 < high < 5, (low, high)  # the 2.5e-5 quantiles: ±4.05
    assert np.mean(values < low) <= ranges.PERCENTILE_TAIL
    assert np.mean(values > high) <= ranges.PERCENTILE_TAIL
    # one end at 0 or a range beside 0 keeps that end
    relu = np.concatenate([np.maximum(rng.normal(0, 1, 100_000), 0), [30.0]])
    assert ranges.percentile_range(*_histogram(relu))[0] == 0
    shifted = rng.uniform(2, 3, 100_000)
    low, high = ranges.percentile_range(*_histogram(shifted))
    assert low == shifted.min() and 2.99 < high <= shifted.max() + 1e-6


def test_mse_range_is_the_least_error_range():
    """Against a brute-force search of the 8-bit error over the same kind of ranges on a
    heavy-tailed (Laplace) tensor."""
    rng = np.random.default_rng(5)
    values = rng.laplace(0.5, 1, 50_000)
    low, high = ranges.mse_range(*_histogram(values))
    ours = _quantization_mse(values, low, high)
    assert ours < _quantization_mse(values, values.min(), values.max())
    lows = np.linspace(values.min(), 0, 40)
    highs = np.linspace(0, values.max(), 40)
    best = min(_quantization_mse(values, a, b) for a in lows for b in highs if b > a)
    assert ours <= best * 1.05, (low, high, ours, best)
    assert low <= 0 <= high


def _input_range(content: bytes) -> tuple[float, float]:
    from onnx2tf_alt.tflite.flatbuffer import read_model

    model = read_model(content)
    q = model.Subgraphs(0).Tensors(model.Subgraphs(0).Inputs(0)).Quantization()
    return float(q.Min(0)), float(q.Max(0))


def _spiky_calibration() -> tuple[onnx.ModelProto, object, list, list]:
    """Conv -> Relu -> Conv, calibrated on 8 images of which one has a single pixel at 60
    (a glint), held out on 4 images without one."""
    rng = np.random.default_rng(6)
    shape = (1, 3, 64, 64)
    init = {"w0": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
            "w1": (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(shape, np.float32)}, ["y"], init, opset=13)
    calibration = [{"x": rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(8)]
    calibration[0]["x"][0, 1, 30, 30] = 60.0
    held_out = [{"x": rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(4)]
    return model, build(input_onnx_file_path=None, onnx_graph=model), calibration, held_out


def test_clipped_ranges_ignore_a_glint_that_minmax_keeps():
    """With min-max the one bright pixel sets the input's 8-bit step (about 0.24, a quarter
    of the images' [-1, 1]); percentile drops it, and the INT8 file's error on images
    without it falls by more than half (the conv outputs it reaches, 72 values in all,
    are too many to clip). (mse keeps it: clipping 60 to 1 costs more squared
    error than the coarse step over 98,304 values.)"""
    model, converted, calibration, held_out = _spiky_calibration()
    errors, input_highs = {}, {}
    for method in ("minmax", "percentile"):
        options = QuantOptions(integer=True, calibration_method=method)
        content = calibrated_tflite(converted, options, calibration)[0].written()
        input_highs[method] = _input_range(content)[1]
        int8 = quantize_calibrated(content, False, None, [])
        outputs = run_tflite(int8, converted, held_out)
        errors[method] = np.mean([np.abs(o["y"] - ort_run(model, s)[0]).mean()
                                  for o, s in zip(outputs, held_out)])
    # a histogram bin (61 / 2048) above the images' 1
    assert input_highs["minmax"] >= 60 and input_highs["percentile"] < 1.05, input_highs
    assert errors["percentile"] < errors["minmax"] / 2, errors  # 0.026 against 0.065


def test_auto_keeps_the_method_whose_int8_file_scores_best():
    """--calibration_method auto (the default) measures minmax, percentile and mse ranges on
    6 of the 8 calibration samples, scores each INT8 file against the float model on the
    other 2, and measures the best method's ranges on all 8; its note gives the scores."""
    import re

    _, converted, calibration, _ = _spiky_calibration()
    notes = []
    content = calibrated_tflite(converted, QuantOptions(integer=True), calibration,
                                notes)[0].written()
    assert QuantOptions().calibration_method == "auto"
    [note] = notes
    assert "on 2 calibration sample(s) not used to measure the ranges" in note, note
    scores = {m: float(v) for m, v in re.findall(r"(minmax|percentile|mse) (\d\.\d+)", note)}
    assert set(scores) == {"minmax", "percentile", "mse"}, note
    chosen = re.match(r"INT8 files: activation ranges by (\w+) ", note).group(1)
    assert scores[chosen] == max(scores.values()), note
    alone = calibrated_tflite(
        converted, QuantOptions(integer=True, calibration_method=chosen), calibration)[0].written()
    assert _recorded_ranges(content) == _recorded_ranges(alone)
    assert _recorded_ranges(content) != _recorded_ranges(calibrated_tflite(
        converted, QuantOptions(integer=True, calibration_method="minmax"),
        calibration)[0].written())
