"""QDQ models as onnxruntime's quantizer writes them: `quantize_static` (QDQ format, int8
per-channel weights, uint8 activations) of float ONNX models, calibrated on random inputs.

    python benchmarks/export_qdq.py OUT_DIR model.onnx [more.onnx ...] [--per-tensor]

Writes OUT_DIR/<stem>_qdq.onnx for each (`--per-tensor`: per-tensor weights, as
quantize_static writes them by default, OUT_DIR/<stem>_qdq_pt.onnx).
"""

from __future__ import annotations

import os
import sys

import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from onnx2tf_alt.batching.latency import random_feeds


class _Random(CalibrationDataReader):
    def __init__(self, model: onnx.ModelProto, count: int = 8):
        self.feeds = iter([random_feeds(model, seed) for seed in range(count)])

    def get_next(self):
        return next(self.feeds, None)


def export(path: str, out_dir: str, per_channel: bool = True) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(out_dir, f"{stem}_qdq{'' if per_channel else '_pt'}.onnx")
    quantize_static(path, out, _Random(onnx.load(path)), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8)
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--per-tensor"]
    os.makedirs(args[0], exist_ok=True)
    for model in args[1:]:
        print(export(model, args[0], "--per-tensor" not in sys.argv), flush=True)
