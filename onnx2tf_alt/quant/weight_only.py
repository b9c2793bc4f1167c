"""The dynamic-range (`-odrqt`) .tflite made from the float32 one with bound weights
(tflite/late_weights.py), without TF's converter seeing the weights.

TF's converter with Optimize.DEFAULT and no calibration data stores the large float
constants of a few ops as int8 and leaves the rest of the graph in float; its kernels
quantize their float inputs at run time ("hybrid" kernels). Run on a 2.3 GB decoder it
needs the memory of the float conversion and more; here each weight is read, its scales
computed and its int8 codes made when the file is written, one weight at a time. The rules
are TF's (read from the files its converter writes), for a float32 constant of at least
MIN_ELEMENTS elements read as:

- the weights of FULLY_CONNECTED: int8 per output channel (axis 0), op version 12, inputs
  quantized asymmetrically at run time;
- the filter of CONV_2D: per output channel (axis 0), version 5;
- the filter of DEPTHWISE_CONV_2D: per channel (axis 3), version 6;
- the right side of BATCH_MATMUL: per tensor, version 4, inputs quantized asymmetrically;
- the table of GATHER: per tensor; the gathered rows are int8 and a DEQUANTIZE (version
  2) makes them float.

Scales are symmetric, max|w| / 127 (1 where a channel is all zeros), zero point 0; codes
are w / scale rounded half away from zero.
"""

from __future__ import annotations

import logging

import numpy as np

from onnx2tf_alt.export.float16 import record_optimization
from onnx2tf_alt.tflite.flatbuffer import op_name, opcode_index, pack_model, schema, unpack_model
from onnx2tf_alt.tflite.late_weights import LazyBuffer, drop_unused, unpacked_file

log = logging.getLogger("onnx2tf_alt")

MIN_ELEMENTS = 1024  # TF's default minimum size of a quantized weight
RUNTIME = "2.17.0"  # what TF's converter records for these op versions
PTQ_DYNAMIC_RANGE = 1002  # ConversionMetadata's ModelOptimizationMode

# op -> (input index, quantized axis or None for per tensor, op version, asymmetric inputs)
RULES = {
    "FULLY_CONNECTED": (1, 0, 12, True),
    "CONV_2D": (1, 0, 5, False),
    "DEPTHWISE_CONV_2D": (1, 3, 6, False),
    "BATCH_MATMUL": (1, None, 4, True),
    "GATHER": (0, None, 2, False),
}
DEQUANTIZE_VERSION = 2


def dynamic_range_model(model) -> int:
    """Quantizes `model` (an unpacked float32 .tflite, schema.ModelT, whose buffers may be
    LazyBuffers) in place by the rules above; returns the number of weights quantized."""
    made: dict[tuple[int, int | None], tuple[int, np.ndarray]] = {}  # (buffer, axis) ->
    count = 0
    for subgraph_index, subgraph in enumerate(model.subgraphs):
        operators = []
        for op in subgraph.operators:
            operators.append(op)
            name = op_name(model, op)
            rule = RULES.get(name)
            if rule is None or len(op.inputs) <= rule[0] or op.inputs[rule[0]] < 0:
                continue
            position, axis, version, asymmetric = rule
            tensor = subgraph.tensors[int(op.inputs[position])]
            buffer = model.buffers[tensor.buffer]
            if (tensor.type != schema.TensorType.FLOAT32
                    or int(np.prod(tensor.shape, dtype=np.int64)) < MIN_ELEMENTS
                    or not (isinstance(buffer, LazyBuffer) or
                            (buffer.data is not None and len(buffer.data)))):
                continue
            key = (int(tensor.buffer), axis)
            if key not in made:
                made[key] = _quantized_buffer(model, buffer, tensor.shape, axis)
            index, scales = made[key]
            quantized = _int8_tensor(tensor, index, scales, axis)
            subgraph.tensors.append(quantized)
            inputs = [int(i) for i in op.inputs]
            inputs[position] = len(subgraph.tensors) - 1
            op.inputs = inputs
            op.opcodeIndex = _opcode(model, op.opcodeIndex, version)
            if asymmetric:
                op.builtinOptions.asymmetricQuantizeInputs = True
            if name == "GATHER":
                operators.append(_dequantized_output(model, subgraph, op, quantized))
            count += 1
        replace_operators(model, subgraph_index, operators)
    if count:
        record_optimization(model, RUNTIME, PTQ_DYNAMIC_RANGE, None)
    return count


def dynamic_range_weights(model, name: str) -> None:
    """dynamic_range_model on `model`, the file `name`'s; a warning where no weight
    qualifies (the file then holds the float32 weights)."""
    if not dynamic_range_model(model):
        log.warning("-odrqt: no FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, BATCH_MATMUL or "
                    "GATHER reads a float32 weight of %d elements or more: %s holds the "
                    "float32 weights", MIN_ELEMENTS, name)


def dynamic_range_file(float32: str | bytes, name: str) -> bytes:
    """The bytes of the dynamic-range file `name` made from the float32 .tflite `float32`
    (its bytes, read where they lie, or its path: past 2 GB too, its stored weights are
    read from the mapped file)."""
    model = unpacked_file(float32) if isinstance(float32, str) else unpack_model(float32)
    dynamic_range_weights(model, name)
    return pack_model(model)


def replace_operators(model, subgraph_index: int, operators: list) -> None:
    """Subgraph `subgraph_index` of `model` computes `operators` now: the tensors and buffers
    nothing uses any more (float weights replaced by quantized ones) are dropped."""
    subgraph = model.subgraphs[subgraph_index]
    subgraph.operators = operators
    signatures = [s for s in model.signatureDefs or [] if s.subgraphIndex == subgraph_index]
    drop_unused(model, subgraph, signatures)


def float_values(buffer, shape) -> np.ndarray:
    """The float32 array of a constant `buffer` (a LazyBuffer, made now, or inline data)."""
    if isinstance(buffer, LazyBuffer):
        return np.asarray(buffer.make(), np.float32).reshape(tuple(shape))
    return np.asarray(buffer.data, np.uint8).view("<f4").reshape(tuple(shape))  # no copy


def _quantized_buffer(model, buffer, shape, axis: int | None) -> tuple[int, np.ndarray]:
    """A new buffer with the int8 codes of `buffer`'s float32 values, and their scales."""
    scales = _scales(float_values(buffer, shape), axis)
    nbytes = int(np.prod(shape, dtype=np.int64))
    model.buffers.append(LazyBuffer(make=lambda: _codes(float_values(buffer, shape), scales, axis),
                                    nbytes=nbytes))
    return len(model.buffers) - 1, scales


def _scales(value: np.ndarray, axis: int | None, rows: int = 1 << 20) -> np.ndarray:
    """max|value| / 127 per channel of `axis` (None: of the whole tensor), read a block of
    leading-axis slices at a time."""
    if value.size == 0:
        return np.ones(1, np.float32)
    if value.ndim == 0:
        value = value.reshape(1)
    other = tuple(a for a in range(value.ndim) if a != axis)
    step = max(1, rows // max(1, value[0].size))
    peaks = []
    for start in range(0, value.shape[0], step):
        block = np.abs(value[start:start + step])
        if axis is None:
            peaks.append(np.max(block).reshape(1))
        elif axis == 0:
            peaks.append(np.max(block, axis=other))
        else:
            peaks.append(np.max(block, axis=other, keepdims=True).reshape(-1, block.shape[axis]))
    if axis == 0:
        peak = np.concatenate(peaks)
    else:
        peak = np.max(np.concatenate(peaks, axis=0), axis=0)
    peak = np.asarray(peak, np.float32).reshape(-1)
    return np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)


def _codes(value: np.ndarray, scales: np.ndarray, axis: int | None,
           rows: int = 1 << 20) -> np.ndarray:
    """The int8 codes of `value`, made a block of leading-axis slices at a time (the
    temporaries of a whole 2048 x 32000 table would be four times its size)."""
    shape = [1] * value.ndim
    if axis is not None:
        shape[axis] = len(scales)
    scales = scales.reshape(shape)
    codes = np.empty(value.shape, np.int8)
    if value.ndim == 0 or value.size == 0:
        return np.clip(np.round(value / scales), -127, 127).astype(np.int8)
    step = max(1, rows // max(1, value[0].size))
    for start in range(0, value.shape[0], step):
        block = slice(start, start + step)
        scaled = value[block] / (scales[block] if axis == 0 else scales)
        rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # half away from zero
        codes[block] = np.clip(rounded, -127, 127)
    return codes


def _int8_tensor(tensor, buffer: int, scales: np.ndarray, axis: int | None):
    quantized = schema.TensorT()
    quantized.shape, quantized.shapeSignature = tensor.shape, tensor.shapeSignature
    quantized.type, quantized.buffer = schema.TensorType.INT8, buffer
    quantized.name = (tensor.name or b"") + b"/int8"
    quantized.quantization = _parameters(scales, axis)
    return quantized


def _parameters(scales: np.ndarray, axis: int | None):
    parameters = schema.QuantizationParametersT()
    parameters.scale = scales.astype(np.float32)
    parameters.zeroPoint = np.zeros(len(scales), np.int64)
    parameters.quantizedDimension = 0 if axis is None else axis
    return parameters


def _dequantized_output(model, subgraph, gather, table):
    """GATHER writes int8 rows into a new tensor; a DEQUANTIZE writes the float output."""
    output = int(gather.outputs[0])
    float_tensor = subgraph.tensors[output]
    rows = schema.TensorT()
    rows.shape, rows.shapeSignature = float_tensor.shape, float_tensor.shapeSignature
    rows.type, rows.buffer = schema.TensorType.INT8, 0
    rows.name = (float_tensor.name or b"") + b"/int8"
    rows.quantization = _parameters(table.quantization.scale, None)
    subgraph.tensors.append(rows)
    gather.outputs = [len(subgraph.tensors) - 1]
    dequantize = schema.OperatorT()
    code = schema.BuiltinOperator.DEQUANTIZE
    dequantize.opcodeIndex = opcode_index(model, code, DEQUANTIZE_VERSION, exact=True)
    dequantize.inputs, dequantize.outputs = [len(subgraph.tensors) - 1], [output]
    return dequantize


def _opcode(model, index: int, version: int) -> int:
    """The operator code of the op at `index`'s builtin with `version` (added if new)."""
    code = model.operatorCodes[index]
    return opcode_index(model, max(code.builtinCode, code.deprecatedBuiltinCode), version,
                        exact=True)
