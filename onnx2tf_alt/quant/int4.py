"""Weight-only int4 FULLY_CONNECTED weights (INT4 codes, a float16 scale per block of inputs)
made from the float32 .tflite with bound weights, one weight at a time like weight_only.py.

The form, tried point by point on ai-edge-litert 2.3.0 (and TF 2.21's interpreter): an INT4
[N, K] weight, two codes a byte, even K index in the low nibble, whose BlockwiseQuantization
names [N, K / block] FLOAT16 scales. Both kernels read the scales as float16 whatever their
type (float32 ones: XNNPACK "unsupported scale value", builtin NaN); XNNPACK rounds them to
bfloat16, so they are rounded so here and both kernels agree. XNNPACK refuses negative scales
and delegates blocks of multiples of 32 only; zero points are ignored. So: max|w| / 7, or / 8
with code -8 where the extreme is negative (-8..7 decode exactly), or where the block is
already on a grid of max|w| / 8 (4-bit codes kept, as far as positive scales allow).
Activations are quantized to int8 per row at run time regardless of
asymmetricQuantizeInputs; the op keeps its float version (TF's versioning has no rule for this; versions 1..14 run alike). The builtin kernel
drops a fused activation, so that becomes its own op. Older runtimes are silently wrong
(ai-edge-litert 1.0.1; 1.4.0 and 2.0.2 on XNNPACK; 2.1.0 on are right).

Measured (FC [M, 2048] x [2048, 5632], normal weights, 1 thread): relative RMS error against
float 9.2e-2 (int8 file: 1.1e-2); weights 0.56 of the int8 file's bytes; XNNPACK ran six such
FCs (past the cache) at M = 1 in 1.81 ms (int8 2.70, float 11.2); the builtin blockwise
kernel, a plain loop, is ~30x slower than builtin int8. Weights that do not qualify (K not a
multiple of the block, under MIN_ELEMENTS) stay float, for dynamic_range_model to make int8.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.export.float16 import record_optimization
from onnx2tf_alt.quant.weight_only import (
    MIN_ELEMENTS,
    PTQ_DYNAMIC_RANGE,
    float_values,
    replace_operators,
)
from onnx2tf_alt.tflite.flatbuffer import op_name, opcode_index, schema
from onnx2tf_alt.tflite.late_weights import LazyBuffer

RUNTIME = "2.21.0"  # the oldest runtime it was run on (TF's interpreter; ai-edge-litert 2.3.0)
XNNPACK_BLOCK = 32  # XNNPACK delegates block sizes that are multiples of this
CHUNK_ELEMENTS = 1 << 20  # weights are read this many elements at a time
Activation = schema.ActivationFunctionType
ACTIVATION_OPS = {getattr(Activation, name): getattr(schema.BuiltinOperator, name)
                  for name in ("RELU", "RELU_N1_TO_1", "RELU6", "TANH")}  # fused -> op


def int4_blockwise_model(model, block_size: int = 32) -> int:
    """Quantizes the FULLY_CONNECTED weights of `model` (an unpacked float32 .tflite,
    schema.ModelT, whose buffers may be LazyBuffers) in place to int4 with a float16 scale per
    `block_size` inputs; returns the number of weights quantized."""
    if block_size <= 0 or block_size % XNNPACK_BLOCK:
        raise ValueError(f"block_size {block_size}: a positive multiple of {XNNPACK_BLOCK}")
    made: dict[tuple, tuple[int, int] | None] = {}  # (float buffer, shape) -> (codes, scales)
    count = 0
    for subgraph_index, subgraph in enumerate(model.subgraphs):
        operators = []
        for op in subgraph.operators:
            operators.append(op)
            tensor = _qualifying_weight(model, subgraph, op, block_size)
            if tensor is None:
                continue
            key = (int(tensor.buffer), tuple(int(d) for d in tensor.shape))
            if key not in made:
                made[key] = _quantized(model, tensor, block_size)
            if made[key] is None:
                continue
            inputs = [int(i) for i in op.inputs]
            inputs[1] = _int4_tensor(subgraph, tensor, *made[key], block_size)
            op.inputs = inputs
            if op.builtinOptions.fusedActivationFunction != Activation.NONE:
                operators.append(_unfused_activation(model, subgraph, op))
            count += 1
        replace_operators(model, subgraph_index, operators)
    if count:
        record_optimization(model, RUNTIME, PTQ_DYNAMIC_RANGE, None)
    return count


def _qualifying_weight(model, subgraph, op, block_size: int):
    """The float32 constant weight [N, K] of a FULLY_CONNECTED op that is quantized, or None."""
    if op_name(model, op) != "FULLY_CONNECTED" or len(op.inputs) < 2 or op.inputs[1] < 0:
        return None
    tensor = subgraph.tensors[int(op.inputs[1])]
    buffer = model.buffers[tensor.buffer]
    constant = isinstance(buffer, LazyBuffer) or (buffer.data is not None and len(buffer.data))
    activation = op.builtinOptions.fusedActivationFunction
    elements = int(np.prod(tensor.shape, dtype=np.int64))
    if (tensor.type != schema.TensorType.FLOAT32 or len(tensor.shape) != 2 or not constant
            or tensor.shape[1] % block_size or elements < MIN_ELEMENTS
            or (activation != Activation.NONE and activation not in ACTIVATION_OPS)):
        return None
    return tensor


def _quantized(model, tensor, block_size: int) -> tuple[int, int] | None:
    """New buffers with the packed codes and the float16 scales of `tensor`'s weight (None
    where a scale does not fit in float16, or the weight is not finite)."""
    buffer, shape = model.buffers[tensor.buffer], tuple(int(d) for d in tensor.shape)
    scales = _scales(float_values(buffer, shape), block_size)
    if not np.all(np.isfinite(scales)):
        return None
    model.buffers.append(LazyBuffer(make=lambda: _packed_codes(float_values(buffer, shape),
                                                               scales, block_size),
                                    nbytes=shape[0] * shape[1] // 2))
    model.buffers.append(schema.BufferT())
    model.buffers[-1].data = np.frombuffer(scales.tobytes(), np.uint8)
    return len(model.buffers) - 2, len(model.buffers) - 1


def _row_chunks(rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // width)
    return (slice(start, start + step) for start in range(0, rows, step))


def _scales(value: np.ndarray, block_size: int) -> np.ndarray:
    """The float16 scale of each block of `block_size` along the rows of `value` [N, K]."""
    rows, width = value.shape
    scales = np.empty((rows, width // block_size), np.float32)
    for chunk in _row_chunks(rows, width):
        blocks = value[chunk].reshape(-1, scales.shape[1], block_size)
        peak, high = np.max(np.abs(blocks), axis=2), np.max(blocks, axis=2)
        scales[chunk] = peak / np.where((high <= peak * (7.5 / 8)) | _on_grid(blocks, peak / 8),
                                        8.0, 7.0)
    scales[scales == 0] = 1.0
    scales = np.maximum(_bfloat16_rounded(scales), np.finfo(np.float16).tiny)
    with np.errstate(over="ignore"):
        return scales.astype(np.float16)  # exact, or inf past float16's range


def _on_grid(blocks: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Blocks [R, B, size] whose values are all whole multiples of their `step` [R, B]:
    weights already 4-bit (onnxruntime's MatMulNBits, dequantized), whose codes the step
    keeps exactly, bar the one +8 a negative onnxruntime scale makes (clipped to 7)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = blocks / step[..., None]
    return np.all(np.abs(ratio - np.rint(ratio)) <= 1e-3, axis=2) & (step > 0)


def _bfloat16_rounded(values: np.ndarray) -> np.ndarray:
    """float32 `values` rounded (to nearest even) to bfloat16's 8 significant bits."""
    bits = values.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _packed_codes(value: np.ndarray, scales: np.ndarray, block_size: int) -> np.ndarray:
    """The int4 codes of `value` [N, K] rounded to nearest, two a byte, low nibble first."""
    rows, width = value.shape
    packed = np.empty((rows, width // 2), np.uint8)
    for chunk in _row_chunks(rows, width):
        blocks = value[chunk].reshape(-1, scales.shape[1], block_size)
        codes = np.clip(np.rint(blocks / scales[chunk, :, None].astype(np.float32)), -8, 7)
        nibbles = codes.astype(np.int8).view(np.uint8).reshape(-1, width) & 0x0F
        packed[chunk] = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    return packed.reshape(-1)


def _int4_tensor(subgraph, tensor, codes: int, scales: int, block_size: int) -> int:
    """New tensors of `subgraph`: the scales and the INT4 weight reading them (its index)."""
    name, (rows, width) = tensor.name or b"", (int(d) for d in tensor.shape)
    details = schema.BlockwiseQuantizationT()
    details.blockSize = block_size
    details.scales = _tensor(subgraph, name + b"/scales", schema.TensorType.FLOAT16, scales,
                             np.array([rows, width // block_size], np.int32))
    index = _tensor(subgraph, name + b"/int4", schema.TensorType.INT4, codes, tensor.shape,
                    tensor.shapeSignature)
    quantization = subgraph.tensors[index].quantization = schema.QuantizationParametersT()
    quantization.detailsType = schema.QuantizationDetails.BlockwiseQuantization
    quantization.details = details
    return index


def _unfused_activation(model, subgraph, op):
    """`op` writes its linear result into a new tensor; the returned activation op reads it
    and writes `op`'s output."""
    output = subgraph.tensors[int(op.outputs[0])]
    linear = _tensor(subgraph, (output.name or b"") + b"/linear", output.type, 0, output.shape,
                     output.shapeSignature)
    activation = schema.OperatorT()
    builtin = ACTIVATION_OPS[op.builtinOptions.fusedActivationFunction]
    activation.opcodeIndex = opcode_index(model, builtin, 1)
    activation.inputs, activation.outputs = [linear], [int(op.outputs[0])]
    op.outputs = [linear]
    op.builtinOptions.fusedActivationFunction = Activation.NONE
    return activation


def _tensor(subgraph, name: bytes, tensor_type: int, buffer: int, shape, signature=None) -> int:
    """A new tensor of `subgraph`; its index."""
    tensor = schema.TensorT()
    tensor.name, tensor.type, tensor.buffer = name, tensor_type, buffer
    tensor.shape, tensor.shapeSignature = shape, signature
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def write_int4_file(results: dict | None, float32_path: str, path: str) -> int:
    """`<stem>_int4_weight_quant.tflite` at `path`: the float32 file (TF's converter's:
    `results`, {signature key: BuildResult}, bound again where it can be; else, and for the
    direct writer's (None), `float32_path` unpacked) with int4 FULLY_CONNECTED weights
    and, as in the dynamic-range file, int8 ones elsewhere. Returns the int4 weight count."""
    from onnx2tf_alt.quant.weight_only import dynamic_range_model
    from onnx2tf_alt.tflite.flatbuffer import pack_model
    from onnx2tf_alt.tflite.late_weights import unpacked_file

    bound = None
    if results is not None:
        from onnx2tf_alt.tflite.lowering import late_bound_signatures

        bound = late_bound_signatures(results)
    model = bound.model if bound is not None else unpacked_file(float32_path)
    count = int4_blockwise_model(model)
    dynamic_range_model(model)
    if bound is not None:
        bound.write(path)
    else:
        with open(path, "wb") as f:
            f.write(pack_model(model))
    return count
