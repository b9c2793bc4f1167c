"""What int8 weights alone cost a decoder: the ONNX model with each weight the dynamic-range
file stores as int8 replaced by its int8 values (dequantized, float32), so that converting
it without -odrqt gives a file whose only difference from the float32 one is the weights'
rounding, and generate.py then shows how many greedy tokens that rounding alone keeps.

    python benchmarks/int8_weight_floor.py MODEL.onnx FLOOR.onnx
    onnx2tf-alt -i FLOOR.onnx -o floor -dms --kv_cache_capacity 128 \
        --signature prefill input_ids:1,16 --signature decode input_ids:1,1
    python benchmarks/generate.py MODEL.onnx out/model_dynamic_range_quant.tflite \
        floor/FLOOR_float32.tflite --seed S

The rounding is quant/weight_only.py's (TF's dynamic-range rules): a MatMul's constant
right side of at least MIN_ELEMENTS elements (a FULLY_CONNECTED's weights) per output
channel (its last axis), a Gather's table per tensor; scales max|w| / 127, codes rounded
half away from zero. A token the int8 file and the floor both lose is lost to the weights'
rounding, which no int8 kernel undoes; one only the int8 file loses, to its kernels (the
activations quantized per row at run time).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import numpy_helper

from onnx2tf_alt.quant.weight_only import MIN_ELEMENTS


def rounded(values: np.ndarray, axis: int | None) -> np.ndarray:
    """`values` on the symmetric int8 grid of max|w| / 127 per slice along `axis` (None: the
    whole tensor), dequantized."""
    keep = tuple(k for k in range(values.ndim) if k != axis) if axis is not None else None
    scale = np.abs(values).max(axis=keep, keepdims=True) / 127 if axis is not None else (
        np.abs(values).max() / 127)
    scale = np.where(scale == 0, 1, scale)
    codes = np.clip(np.trunc(values / scale + np.copysign(0.5, values)), -127, 127)
    return (codes * scale).astype(np.float32)


def floor_model(model: onnx.ModelProto) -> int:
    """Rounds `model`'s weights in place (see the module docstring); returns how many."""
    rules = {}  # initializer -> axis (None: per tensor)
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1:
            rules.setdefault(node.input[1], -1)
        elif node.op_type == "Gather":
            rules.setdefault(node.input[0], None)
    count = 0
    for init in model.graph.initializer:
        if init.name not in rules or init.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(init)
        if values.size < MIN_ELEMENTS or values.ndim < 2:
            continue
        axis = rules[init.name]
        init.CopyFrom(numpy_helper.from_array(
            rounded(values, None if axis is None else values.ndim - 1), init.name))
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    args = parser.parse_args()
    model = onnx.load(args.model)
    print(f"{floor_model(model)} weights rounded to int8")
    onnx.save(model, args.out)


if __name__ == "__main__":
    main()
