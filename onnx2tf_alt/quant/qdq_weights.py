"""A QDQ model's per-tensor weights kept per tensor in its INT8 files.

onnxruntime's `quantize_static` quantizes weights per tensor unless asked otherwise: one
symmetric int8 scale s = max|w| / 127 for the whole weight. In the quantization-aware mode
that a QDQ model's FakeQuant ops put it in, TF's converter quantizes every convolution's
and fully-connected layer's weights per output channel, whatever it is told (its
disable-per-channel switch reaches calibrated files only). That grid is finer than the
model's own, so the INT8 file's integers left onnxruntime's from the first convolution on
(1 to 3 steps at every quantized tensor of a small CNN).

Where every weight of the model lies on its per-tensor grid, each per-channel weight of an
INT8 file goes back to that grid: with channel scales s_c <= s (s = max_c s_c, TF's own
max|w| / 127), q = round(q_c * s_c / s) is the model's integer exactly, since q_c * s_c is
within s_c / 2 of q * s. The int32 bias, on the channel grids s_in * s_c, moves to s_in * s
the same way.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx2tf_alt.ir.weights import to_array
from onnx2tf_alt.tflite.flatbuffer import op_name, pack_model, schema, unpack_model

LEVELS = 127  # symmetric int8 weights
GRID_TOLERANCE = 1e-3  # of a step: float32 rounding of q * s is far below
WEIGHTED = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (0, 1), "MatMul": (0, 1)}
FILTERED_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def on_per_tensor_grid(weights: np.ndarray) -> bool:
    """Whether every weight is an integer multiple of max|w| / 127."""
    peak = float(np.abs(weights).max()) if weights.size else 0.0
    if peak == 0.0:
        return False
    steps = weights.astype(np.float64) * (LEVELS / peak)
    return float(np.abs(steps - np.round(steps)).max()) <= GRID_TOLERANCE


def weights_per_tensor(model: onnx.ModelProto) -> bool:
    """Whether the (prepared) QDQ model has weights and every one of them, read by a Conv,
    ConvTranspose, Gemm or MatMul, is per tensor: a DequantizeLinear of a constant with
    one scale and zero point 0, or float constants on their per-tensor grid."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    found = False
    for node in model.graph.node:
        for k in WEIGHTED.get(node.op_type, ()):
            name = node.input[k] if k < len(node.input) else ""
            per_tensor = _per_tensor(name, inits, producers)
            if per_tensor is False:
                return False
            found = found or bool(per_tensor)
    return found


def _per_tensor(name: str, inits: dict, producers: dict) -> bool | None:
    """True / False for a constant weight that is / is not per tensor; None when `name` is
    no constant weight (an activation)."""
    dequantize = producers.get(name)
    if dequantize is not None and dequantize.op_type == "DequantizeLinear":
        if dequantize.input[0] not in inits or dequantize.input[1] not in inits:
            return None
        scale = to_array(inits[dequantize.input[1]])
        zero = (to_array(inits[dequantize.input[2]]) if len(dequantize.input) > 2
                and dequantize.input[2] in inits else np.zeros(1))
        return bool(scale.size == 1 and not np.any(zero))
    tensor = inits.get(name)
    if tensor is None or tensor.data_type != onnx.TensorProto.FLOAT:
        return None
    array = to_array(tensor)
    return on_per_tensor_grid(array) if array.ndim >= 2 else None


def requantize_per_tensor(content: bytes) -> tuple[bytes, int]:
    """`content` (an INT8 .tflite) with each per-channel int8 filter of a CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED on one scale, its int32 bias with it; returns the
    file and how many filters moved."""
    model = unpack_model(content)
    graph = model.subgraphs[0]
    done: set[int] = set()
    moved = 0
    for op in graph.operators:
        if op_name(model, op) not in FILTERED_OPS or len(op.inputs) < 2:
            continue
        data, weights = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        quant = weights.quantization
        if (weights.type != schema.TensorType.INT8 or quant is None or quant.scale is None
                or len(quant.scale) < 2 or weights.buffer in done):
            continue
        if data.quantization is None or data.quantization.scale is None or len(
                data.quantization.scale) != 1:
            continue
        channel = np.asarray(quant.scale, np.float64)
        scale = float(channel.max())
        axis = quant.quantizedDimension
        buffer = model.buffers[weights.buffer]
        shape = [1] * len(weights.shape)
        shape[axis] = -1
        q = np.frombuffer(bytes(buffer.data), np.int8).reshape(weights.shape)
        q = np.clip(np.round(q * (channel / scale).reshape(shape)), -LEVELS, LEVELS)
        buffer.data = np.frombuffer(q.astype(np.int8).tobytes(), np.uint8)
        weights.quantization.scale = [scale]
        weights.quantization.zeroPoint = [0]
        weights.quantization.quantizedDimension = 0
        done.add(weights.buffer)
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            _bias_on(model, graph.tensors[op.inputs[2]], float(data.quantization.scale[0])
                     * scale)
        moved += 1
    return (pack_model(model) if moved else content), moved


def _bias_on(model, bias, scale: float) -> None:
    """The int32 bias `bias` moved from its per-channel scales to `scale`."""
    quant = bias.quantization
    if bias.type != schema.TensorType.INT32 or quant is None or quant.scale is None:
        return
    buffer = model.buffers[bias.buffer]
    values = np.frombuffer(bytes(buffer.data), np.int32).astype(np.float64)
    moved = np.round(values * np.asarray(quant.scale, np.float64) / scale)
    info = np.iinfo(np.int32)
    buffer.data = np.frombuffer(np.clip(moved, info.min, info.max).astype(np.int32).tobytes(),
                                np.uint8)
    quant.scale = [scale]
    quant.zeroPoint = [0]
    quant.quantizedDimension = 0
