"""QDQ models as onnxruntime's quantizer writes them: `quantize_static` (QDQ format, int8
per-channel weights, uint8 activations) of float ONNX models, calibrated on random inputs,
or on the samples of `--calibration FILE.npy` (one input, samples along axis 0: a trained
model calibrated as its user would). The model is pre-processed first as onnxruntime asks
(`quant_pre_process`: batch norms folded into their convolutions; opset 13 at least, which
per-channel weights need); `--raw` skips that.

    python benchmarks/export_qdq.py OUT_DIR model.onnx [more.onnx ...] [--per-tensor]
        [--calibration cal.npy] [--raw]

Writes OUT_DIR/<stem>_qdq.onnx for each (`--per-tensor`: per-tensor weights, as
quantize_static writes them by default, OUT_DIR/<stem>_qdq_pt.onnx).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import onnx.version_converter
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from onnx2tf_alt.batching.latency import random_feeds


class _Random(CalibrationDataReader):
    def __init__(self, model: onnx.ModelProto, count: int = 8, samples: str | None = None):
        if samples is None:
            self.feeds = iter([random_feeds(model, seed) for seed in range(count)])
        else:
            name = model.graph.input[0].name
            self.feeds = iter([{name: s[np.newaxis]} for s in np.load(samples)])

    def get_next(self):
        return next(self.feeds, None)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def export(path: str, out_dir: str, per_channel: bool = True, samples: str | None = None,
           raw: bool = False) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(out_dir, f"{stem}_qdq{'' if per_channel else '_pt'}.onnx")
    if not raw:
        prepared = os.path.join(out_dir, f"{stem}_prepared.onnx")
        try:
            quant_pre_process(path, prepared)
        except AssertionError:  # its symbolic shape inference refuses some graphs
            quant_pre_process(path, prepared, skip_symbolic_shape=True)
        model = onnx.load(prepared)
        if per_channel and _opset(model) < 13:  # per-axis DequantizeLinear needs opset 13
            onnx.save(onnx.version_converter.convert_version(model, 13), prepared)
        path = prepared
    reader = _Random(onnx.load(path), samples=samples)
    quantize_static(path, out, reader, quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8)
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--per-tensor", "--raw")]
    samples = None
    if "--calibration" in args:
        at = args.index("--calibration")
        samples = args[at + 1]
        del args[at:at + 2]
    os.makedirs(args[0], exist_ok=True)
    for model in args[1:]:
        print(export(model, args[0], "--per-tensor" not in sys.argv, samples,
                     "--raw" in sys.argv), flush=True)
