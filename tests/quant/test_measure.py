"""onnx2tf_alt/quant/measure.py: the figures quantized files are judged by."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from onnx2tf_alt.quant.measure import compare_output, compare_outputs, cosine, figure, gain
from onnx2tf_alt.quant.quantize import QuantReport, _verdicts

rng = np.random.default_rng(34)


def _map(empty: bool) -> np.ndarray:
    """A (1, 1, 8, 8) probability map: text blobs, or nothing found."""
    value = np.zeros((1, 1, 8, 8), np.float32)
    if not empty:
        value[0, 0, 2:5, 1:7] = rng.uniform(0.6, 1.0, (3, 6))
    return value


def test_empty_samples_are_counted_not_averaged():
    """A map the float model leaves empty scores 0 per sample for any noise; it is counted
    and left out of the per-sample mean, and weighs nothing in the pooled cosine."""
    references = [_map(False), _map(False), _map(True)]
    noise = [r + rng.normal(0, 0.01, r.shape).astype(np.float32) * (r > 0) for r in references]
    noise[2] = noise[2] + 1e-4  # INT8 noise on the empty map
    m = compare_output(references, noise)
    assert m["empty_samples"] == 1 and len(m["cosine_per_sample"]) == 2
    assert m["cosine"] > 0.999 and cosine(noise[2], references[2]) == 0.0
    assert m["cosine_pooled"] > 0.999 and m["sqnr_db"] > 30
    assert m["iou"] == pytest.approx(1.0)


def test_pooled_cosine_and_sqnr_over_concatenated_samples():
    references = [rng.standard_normal((2, 10)).astype(np.float32) for _ in range(3)]
    actuals = [r + rng.normal(0, 0.1, r.shape).astype(np.float32) for r in references]
    m = compare_output(references, actuals)
    ref, act = np.concatenate(references), np.concatenate(actuals)
    assert m["cosine_pooled"] == pytest.approx(cosine(act, ref), abs=1e-6)
    expected_sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2)
                                  / np.sum((act - ref).astype(np.float64) ** 2))
    assert m["sqnr_db"] == pytest.approx(expected_sqnr, abs=0.01)
    assert 0 <= m["top1_agreement"] <= 1


def test_gain_must_exceed_the_noise_of_the_comparison():
    # its own generator: the module's depends on which tests ran before in this worker
    draw = np.random.default_rng(5)
    references = [{"y": draw.standard_normal((1, 50)).astype(np.float32)} for _ in range(8)]

    def noisy(scale, seed):
        r = np.random.default_rng(seed)
        return [{"y": s["y"] + r.normal(0, scale, (1, 50)).astype(np.float32)}
                for s in references]

    base = compare_outputs(references, noisy(0.3, 1))
    much_better = compare_outputs(references, noisy(0.05, 2))
    same = compare_outputs(references, noisy(0.3, 3))  # another draw of the same noise
    assert gain(much_better, base)[0]
    kept, delta, noise = gain(same, base)
    assert not kept and delta <= noise  # another draw may come out worse, never kept
    assert figure(much_better) > figure(base)


def test_run_ends_with_a_warning_naming_the_file_that_holds(caplog):
    def entry(name, pooled):
        return {"file": name, "outputs": {"y": {"cosine_pooled": pooled}}}

    report = QuantReport("m", "per-channel", False, {}, 10, 4, files=[
        entry("m_dynamic_range_quant.tflite", 0.996),
        entry("m_integer_quant.tflite", 0.944),
        entry("m_full_integer_quant.tflite", 0.995),
        entry("m_integer_quant_with_int16_act.tflite", 0.999)])
    with caplog.at_level(logging.DEBUG, logger="onnx2tf_alt"):
        lines = _verdicts(report, 0.99)
    warning = ("m_integer_quant.tflite: held-out pooled cosine 0.94400 is below 0.99; "
               "m_integer_quant_with_int16_act.tflite holds 0.99900")
    assert lines == [warning]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [warning]
    # the per-file figures are the table's: at debug level only
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 4 and all("held-out pooled cosine" in m for m in debug)
    assert not [r for r in caplog.records if r.levelno == logging.INFO]


def _metrics(per_sample: list[float]) -> dict:
    """Figures of one output whose per-sample cosines are `per_sample` (pooled: their mean)."""
    return {"y": {"cosine_pooled": float(np.mean(per_sample)),
                  "cosine_per_sample": list(per_sample)}}


@pytest.mark.parametrize("minmax,chosen", [
    ([0.990, 0.985, 0.992], "percentile"),  # ahead by 0.002, within the noise of 3 samples
    ([0.999, 0.998, 0.999], "minmax"),  # ahead on every sample, beyond the noise
])
def test_auto_keeps_percentile_unless_beaten_beyond_noise(monkeypatch, minmax, chosen):
    from onnx2tf_alt.quant import quantize

    scores = {"minmax": _metrics(minmax), "percentile": _metrics([0.984, 0.986, 0.985]),
              "mse": _metrics([0.970, 0.975, 0.972])}
    monkeypatch.setattr(quantize, "measured_ranges_split",
                        lambda content, feeds, split, methods: ({}, {}))
    monkeypatch.setattr(quantize, "_range_metrics", lambda *args: scores)
    notes = []
    method = quantize._choose_range_method(b"", None, quantize.QuantOptions(), [{}] * 12,
                                           [{}] * 12, notes)
    assert method == chosen
    assert f"activation ranges by {chosen}" in notes[0]
    assert ("not better beyond the noise" in notes[0]) == (chosen == "percentile")


def test_auto_with_few_samples_scores_each_fold_on_ranges_from_the_others(monkeypatch):
    """With 5 samples, every sample is scored once, by ranges measured without it."""
    from onnx2tf_alt.quant import quantize

    samples = [{"x": np.full((1, 4), k, np.float32)} for k in range(5)]
    fitted, scored = [], []

    def measured(content, fit, methods):
        fitted.append(sorted(int(f["x"][0, 0]) for f in fit))
        return {m: {} for m in methods}

    def outputs(content, ranges, converted, options, held):
        scored.append(sorted(int(h["x"][0, 0]) for h in held))
        ref = [{"y": h["x"] + np.arange(4, dtype=np.float32)} for h in held]
        wobble = np.array([[1, -1, 1, -1]], np.float32)
        return ref, {m: [{"y": r["y"] + (0.0 if m == "percentile" else 0.5) * wobble}
                         for r in ref] for m in ranges}

    monkeypatch.setattr(quantize, "measured_ranges", measured)
    monkeypatch.setattr(quantize, "_range_outputs", outputs)
    notes = []
    method = quantize._choose_range_method(b"", None, quantize.QuantOptions(), samples,
                                           samples, notes)
    assert method == "percentile"
    assert sorted(x for fold in scored for x in fold) == list(range(5))
    assert all(not set(f) & set(s) for f, s in zip(fitted, scored))
    assert "each with ranges measured on the others (4 folds)" in notes[0]


@pytest.mark.parametrize("count", [6, 11])
def test_bias_correction_with_few_samples_is_judged_in_folds(monkeypatch, count):
    """With fewer than 8 calibration samples beyond the first 8 (on which the corrections
    are measured), every calibration sample is judged once, by a file whose corrections
    did not see it: those after the first 8 by the corrected file, each fold of the first
    ones by corrections refitted on the other first ones; the figures are pooled."""
    from onnx2tf_alt.quant import bias_correction, quantize

    samples = [{"x": np.full((1, 4), k, np.float32)} for k in range(count)]
    judged: dict[int, bytes] = {}

    def refitted(content, errors, rows):
        assert content == b"int8" and errors == {"recorded": True}
        return b"fold:" + bytes(rows)

    def run(content, converted, held):
        ids = [int(h["x"][0, 0]) for h in held]
        if content not in (b"float", b"int8"):
            judged.update(dict.fromkeys(ids, content))
        wobble = {b"float": 0.0, b"int8": 0.5}.get(content, 0.1)
        return [{"y": h["x"] + np.arange(4, dtype=np.float32)
                 + wobble * np.array([[1, -1, 1, -1]], np.float32)} for h in held]

    monkeypatch.setattr(bias_correction, "refitted", refitted)
    monkeypatch.setattr(quantize, "run_tflite", run)
    before, after, where = quantize._bias_judgement(b"int8", b"fixed", b"float", None,
                                                    samples, {"recorded": True})
    assert sorted(judged) == list(range(count))
    for sample, content in judged.items():
        if sample >= 8:
            assert content == b"fixed"
        else:
            assert content.startswith(b"fold:") and sample not in content[5:], (sample, content)
    assert figure(after) > figure(before)
    assert f"on {count} calibration samples, each corrected by biases measured on others" in where
    assert f"(4 folds of the first {min(count, 8)})" in where
