"""Activation ranges for the INT8 files, measured on the ONNX graph with onnxruntime's
calibrators, and handed to the TFLite quantizer as FakeQuantize nodes.

TF's own post-training quantizer takes the plain min and max of every activation over the
calibration samples (`--calibration_method tf`). Heads that end in a sigmoid or a softmax
and activations with rare outliers lose most of their resolution to that: a handful of
extreme values stretch the range. onnxruntime's Percentile and Entropy calibrators clip
them. Their ranges become `FakeQuantize` nodes (ops/quant.py) after every float
activation, which TF's converter turns into the same INT8 model a quantization-aware one
would be.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile

import numpy as np
import onnx
from onnx import helper
from onnx2tf_alt.ops.quant import FAKE_QUANT_DOMAIN

from calibration.methods import BY_NAME, ONNXRUNTIME
from onnx2tf_alt import progress

# Values that TFLite folds into the op that produces them carry no range of their own: a
# FakeQuantize there would stop CONV_2D/ADD/FULLY_CONNECTED fusing RELU/RELU6, or the
# converter folding a constant scale or shift (a BatchNorm exported as Mul/Add) into the
# weights. TF's calibration on the samples covers whatever range is still needed.
FUSED_CONSUMERS = {"Relu", "Clip"}
AFFINE_CONSUMERS = {"Mul", "Add", "Sub", "Div"}
INT8_MIN, INT8_MAX = -128, 127


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over our samples (ONNX layout)."""

    def __init__(self, samples: list[dict[str, np.ndarray]]):
        self._samples = iter(samples)

    def get_next(self):
        return next(self._samples, None)


def onnx_ranges(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                method: str) -> dict[str, tuple[float, float]]:
    """{value name: (low, high)} of every float activation of `model` over `samples`, by
    onnxruntime's calibrator of `method` (an ONNXRUNTIME row of methods.METHODS)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    row = BY_NAME.get(method)
    if row is None or row.measurer != ONNXRUNTIME:
        raise ValueError(f"'{method}' is not a method of onnxruntime's calibrators")
    options = {"symmetric": False}
    if row.percentile is not None:
        options["percentile"] = row.percentile
    from onnx2tf_alt.ir.weights import with_weights_inline

    with tempfile.TemporaryDirectory(prefix="onnx2tf_alt_calibrate_") as folder:
        path = os.path.join(folder, "model.onnx")
        inline = with_weights_inline(model)  # the weights kept on disk: in the saved copy
        large = inline.ByteSize() > 2**31 - 1
        onnx.save(inline, path, save_as_external_data=large)
        del inline
        calibrator = create_calibrator(
            path, None, os.path.join(folder, "augmented.onnx"), CalibrationMethod[row.algorithm],
            use_external_data_format=large,
            providers=["CPUExecutionProvider"], extra_options=options,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the calibrators print progress
            for sample in progress.each(samples, "calibrating (onnxruntime)"):  # one at a time:
                # a collection holds every activation
                calibrator.collect_data(_Reader([sample]))
            data = calibrator.compute_data()
        del calibrator  # its session holds the files open
    ranges = {}
    for name, entry in data.data.items():
        low, high = (float(np.asarray(v).reshape(-1)[0]) for v in entry.range_value)
        if np.isfinite(low) and np.isfinite(high):
            ranges[name] = (low, high)
    return ranges


def int8_parameters(low: float, high: float) -> dict:
    """Asymmetric int8 scale and zero point of [low, high], widened to hold 0 (as
    onnxruntime computes them)."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / (INT8_MAX - INT8_MIN) or 1.0
    zero_point = int(np.clip(round(INT8_MIN - low / scale), INT8_MIN, INT8_MAX))
    return {"scale": float(scale), "zero_point": zero_point, "qmin": INT8_MIN,
            "qmax": INT8_MAX}


FLOAT_SUFFIX = "__float"  # a value's name before its FakeQuantize, which takes the name


def fake_quantized(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]]
                   ) -> onnx.ModelProto:
    """A copy of `model` with a FakeQuantize node on every value of `ranges` (graph inputs
    and node outputs), except where TFLite fuses the value's only consumer."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    constants = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output}

    def folded_into_producer(user: onnx.NodeProto, name: str) -> bool:
        if user.op_type in FUSED_CONSUMERS:
            return True
        others = [n for n in user.input if n != name]
        return user.op_type in AFFINE_CONSUMERS and bool(others) and all(
            n in constants for n in others)

    def wanted(name: str) -> bool:
        users = consumers.get(name, [])
        fused = users and name not in outputs and all(
            folded_into_producer(n, name) for n in users)
        return name in ranges and not fused

    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}

    def typed(name: str, like: str) -> None:
        # FakeQuantize has no ONNX shape inference: its input's type is stated instead
        if like in types:
            graph.value_info.append(onnx.ValueInfoProto(name=name, type=types[like]))

    nodes = []
    for info in graph.input:
        if wanted(info.name):
            quantized = f"{info.name}__fake_quant"
            nodes.append(_fake_quant(info.name, quantized, ranges[info.name]))
            typed(quantized, info.name)
            for user in consumers.get(info.name, []):
                user.input[:] = [quantized if n == info.name else n for n in user.input]
    for node in graph.node:
        nodes.append(node)
        for k, name in enumerate(node.output):
            if name and wanted(name):
                node.output[k] = f"{name}{FLOAT_SUFFIX}"
                nodes.append(_fake_quant(node.output[k], name, ranges[name]))
                typed(node.output[k], name)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == FAKE_QUANT_DOMAIN for o in copy.opset_import):
        copy.opset_import.append(helper.make_opsetid(FAKE_QUANT_DOMAIN, 1))
    return copy


def _fake_quant(source: str, target: str, value_range: tuple[float, float]) -> onnx.NodeProto:
    return helper.make_node("FakeQuantize", [source], [target], name=f"{target}__fq",
                            domain=FAKE_QUANT_DOMAIN, **int8_parameters(*value_range))
