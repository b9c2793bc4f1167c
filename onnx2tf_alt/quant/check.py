"""The accuracy check of the quantized .tflite files, dequantized, against onnxruntime.

Quantization error is expected, so a float value passes on cosine similarity
(>= QUANT_MIN_COSINE) rather than on the report's atol; integer values stay exact. The input
is the first held-out quantization sample (a photograph for image inputs, the -cind data
otherwise), which the quantized ranges were made for, rather than the check's random one. With
-coto the shipped files are run. With -cotof:
- files of the direct writer and the own quantizer (every route but `--tflite_writer tf`
  and models the direct writer does not cover): the shipped file itself, each value read
  from the tensor that carries its name (check/file_values.py); a value the file computes
  inside a fused op (a convolution's sum before its ReLU) is unobserved;
- TF's converter's files: each variant is quantized once more from a Keras probe model
  whose outputs are every value under test (same converter settings and calibration
  samples); the extra outputs can stop the converter fusing an activation into the op
  before it, which the report's values then show unfused.
"""

from __future__ import annotations

import os

from onnx2tf_alt.check.compare import BackendReport, compare
from onnx2tf_alt.check.file_values import FUSED, exposed_file
from onnx2tf_alt.check.observe import ort_values, probe_conversion, targets
from onnx2tf_alt.quant.quantize import quantized_tflite, run_tflite, variants

QUANT_MIN_COSINE = 0.98


def quantized_backends(converted, plan, found, feeds, full: bool, folder: str,
                       stem: str) -> list[BackendReport]:
    """One BackendReport per quantized variant `plan` (quant.quantize.QuantPlan) made;
    `feeds` are used when the plan holds no held-out sample."""
    feeds = plan.samples.held_out[0] if plan.samples.held_out else feeds
    reference = ort_values(converted.model, feeds, [t.onnx_name for t in found])
    rebuilt = converted.rebuild(plan.range_model, for_quantization=True) if (
        plan.range_model is not None) else None
    reports = []
    for variant in variants(plan.options, plan.qdq_model is not None,
                            plan.range_model is not None):
        name = f"tflite:{variant.suffix}"
        path = os.path.join(folder, f"{stem}_{variant.suffix}.tflite")
        if not os.path.isfile(path):
            reports.append(BackendReport(name, error="the file was not written"))
            continue
        source = plan.source_for(variant, converted, rebuilt)
        try:
            values = _values(source, variant, plan, plan.calibration_for(variant), found, feeds,
                             full, path)
        except Exception as exc:  # noqa: BLE001 - reported, with every value unobserved
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            reports.append(BackendReport(name, error=lines[-1] if lines else type(exc).__name__))
            continue
        checks = [
            compare(t, reference[t.onnx_name], values.get(t.onnx_name), 0.0, 0.0,
                    _missing(t, source.result.model is None), min_cosine=QUANT_MIN_COSINE)
            for t in found
        ]
        reports.append(BackendReport(name, checks, criterion=f"cosine >= {QUANT_MIN_COSINE}"))
    return reports


def _values(source, variant, plan, calibration, found, feeds, full: bool, path: str) -> dict:
    """{ONNX name: dequantized value in ONNX order} of one variant on `feeds`."""
    if not full or source.result.model is None:  # the shipped file
        with open(path, "rb") as f:
            content = f.read()
        if not full:
            return run_tflite(content, source, [feeds])[0]
        content, probe = exposed_file(content, source, found)
    else:
        wanted = {t.onnx_name for t in found}
        probe = probe_conversion(source, [t for t in targets(source, True)
                                          if t.onnx_name in wanted])
        content = quantized_tflite(probe, variant, plan.options, calibration,
                                   keep_nodes=plan.kept_nodes).content
    return run_tflite(content, probe, [feeds])[0]


def _missing(target, direct: bool) -> str:
    if target.const is not None:
        return "constant at conversion time: no TFLite tensor holds it"
    return FUSED if direct else "not a value of the quantized model"
