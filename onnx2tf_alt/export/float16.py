"""The float16 .tflite derived from the float32 one, without a second TF conversion.

TF's float16 post-training quantization stores every float32 constant as float16 and puts a
DEQUANTIZE (version 3) in front of its readers; nothing else about the graph changes. Doing
that to the float32 flatbuffer here gives the same ops and outputs for a fraction of the
cost: a second TF conversion traces the model, saves it and runs the MLIR pipeline again
(vgg11_bn, under cProfile: about 20 s for that conversion, 3.5 s for this derivation). The
float16 file then computes exactly the float32 file's ops on float16-rounded constants,
which is what its readers (XNNPACK, which unpacks the float16 weights once at load, and the
GPU delegates, told by the `reduced_precision_support` metadata that the model was meant for
float16) expect.

A float32 file past 2 GB keeps its weights after the flatbuffer (the schema's
`Buffer.offset/size`); they are read into the model here, so that its float16 file, half the
size, is an ordinary flatbuffer (a 2.3 GB decoder: 1.2 GB, without a second TF conversion
of 80-130 s and 4 GB). `float16_from_float32` returns None where it does not apply (custom
or Select TF ops, whose kernels may want their constants as they are; a float16 file that
would itself pass 2 GB); the caller then asks TF's converter.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import (
    inline_stored_buffers,
    opcode_index,
    pack_model,
    pack_table,
    put_metadata,
    schema,
    unpack_model,
)
from onnx2tf_alt.tflite.late_weights import LazyBuffer

DEQUANTIZE_VERSION = 3  # the version that reads float16
MAX_FLATBUFFER = 2**31 - 1  # flatbuffers' offsets are signed 32-bit
FLATBUFFER_MARGIN = 64 << 20  # room for the DEQUANTIZE ops, tensors and alignment
DEQUANTIZE_RUNTIME = "1.15.0"  # the TFLite release that runs DEQUANTIZE version 3
REDUCED_PRECISION = b"fp16accfp32"  # what TF's float16 files declare
PTQ_FLOAT16 = 1001  # ConversionMetadata's ModelOptimizationMode for float16 weights
HALF_MAX = float(np.finfo(np.float16).max)  # 65504
HALF_TINY = float(np.finfo(np.float16).tiny)  # 6.1e-5, the smallest normal float16
HALF_CHECKED_BYTES = 1 << 20


def float16_from_float32(content: bytes, model=None) -> bytes | None:
    """The float16-weights flatbuffer of the float32 .tflite `content`, or None where
    TF's converter should write it (see the module docstring). `model`: `content` already
    unpacked (schema.ModelT), which this changes."""
    model = unpack_model(content) if model is None else model
    if not _read_stored_buffers(model, content) or not float16_model(model):
        return None
    return pack_model(model, len(content) // 2 + 4096)


def float16_model(model) -> bool:
    """float16_from_float32 on an unpacked model (schema.ModelT), in place; False where it
    does not apply (the model is then not to be written). Buffers made when the model is written
    (tflite/late_weights.LazyBuffer) get float16 ones made the same way."""
    builtin = schema.BuiltinOperator
    if any(max(c.builtinCode, c.deprecatedBuiltinCode) == builtin.CUSTOM
           for c in model.operatorCodes):
        return False
    dequantize = opcode_index(model, builtin.DEQUANTIZE, DEQUANTIZE_VERSION)
    empty = _empty_buffer(model, schema)
    halves: dict[int, int] = {}  # float32 buffer -> its float16 copy
    for subgraph in model.subgraphs:
        readers = {i for op in subgraph.operators for i in op.inputs if i >= 0}
        entry, exits = set(subgraph.inputs), set(subgraph.outputs)
        front = []
        # Tensors of one buffer and shape (a weight every step of an unrolled recurrence
        # reads, bound after TF's converter) share one DEQUANTIZE: one per tensor would
        # dequantize the weight again for every reader at every invocation.
        first: dict[tuple, int] = {}
        same: dict[int, int] = {}
        for index in range(len(subgraph.tensors)):
            tensor = subgraph.tensors[index]
            buffer = model.buffers[tensor.buffer]
            if (tensor.type != schema.TensorType.FLOAT32 or not _inline_or_lazy(buffer)
                    or tensor.isVariable or index in entry or index not in readers
                    or not _halves_faithfully(buffer)):
                continue
            key = (tensor.buffer, tuple(tensor.shape if tensor.shape is not None else ()))
            if key in first and index not in exits:
                same[index] = first[key]
                tensor.buffer = empty
                continue
            first.setdefault(key, index)
            if tensor.buffer not in halves:
                model.buffers.append(_half(buffer))
                halves[tensor.buffer] = len(model.buffers) - 1
            stored = schema.TensorT()
            stored.shape, stored.shapeSignature = tensor.shape, tensor.shapeSignature
            stored.type, stored.buffer = schema.TensorType.FLOAT16, halves[tensor.buffer]
            stored.name = tensor.name
            tensor.name = (tensor.name or b"") + b"_dequantized"
            tensor.buffer = empty
            subgraph.tensors.append(stored)
            op = schema.OperatorT()
            op.opcodeIndex = dequantize
            op.inputs, op.outputs = [len(subgraph.tensors) - 1], [index]
            front.append(op)
        for op in subgraph.operators or []:
            if any(i in same for i in op.inputs):
                op.inputs = [same.get(i, i) for i in op.inputs]
        subgraph.operators = front + list(subgraph.operators or [])
    if not halves:
        return False
    still_read = {t.buffer for subgraph in model.subgraphs for t in subgraph.tensors}
    for index in set(halves) - still_read:
        model.buffers[index] = schema.BufferT()
    record_optimization(model, DEQUANTIZE_RUNTIME, PTQ_FLOAT16, REDUCED_PRECISION)
    return True


def _halves_faithfully(buffer) -> bool:
    """Whether the constant means the same in float16: no finite value beyond float16's
    range (+-65504: it would become +-inf, and -inf * 0 a NaN), and not a constant that lives
    wholly below float16's smallest normal number (a LayerNorm epsilon of 1e-12 would become
    0: BEiT's float16 file gave NaN wherever a row's variance is 0). Such a constant stays
    float32 (TF's float16 files halve it anyway). A buffer made when written is looked at
    where it is small (HALF_CHECKED_BYTES): a large one is a weight matrix."""
    if isinstance(buffer, LazyBuffer):
        if buffer.nbytes > HALF_CHECKED_BYTES:
            return True
        values = np.asarray(buffer.make(), np.float32).reshape(-1)
    else:  # a view of the bytes: no copy of the weights
        values = np.asarray(buffer.data, np.uint8).view("<f4")
    if not values.size:
        return True
    low, high = float(values.min()), float(values.max())  # two passes, no temporaries
    if not np.isfinite(low) or not np.isfinite(high):  # +-inf or NaN among them: rare
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    largest = max(-low, high)
    return largest <= HALF_MAX and not 0 < largest < HALF_TINY


def _inline_or_lazy(buffer) -> bool:
    return isinstance(buffer, LazyBuffer) or (buffer.data is not None and len(buffer.data) > 0)


def _half(buffer):
    """A float16 copy of a float32 buffer."""
    if isinstance(buffer, LazyBuffer):
        return LazyBuffer(make=lambda make=buffer.make: _halved(make()),
                          nbytes=buffer.nbytes // 2,
                          pieces=lambda: (_halved(part) for part in buffer.chunks()))
    half = schema.BufferT()
    half.data = _halved(np.frombuffer(np.asarray(buffer.data, np.uint8).tobytes(), "<f4")
                        ).view(np.uint8)
    return half


def _halved(array: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(array, "<f4").astype("<f2")


def _read_stored_buffers(model, content: bytes) -> bool:
    """Move the buffers stored after the flatbuffer (offset > 1) into it, as views of
    `content`; False when the float16 file would still pass flatbuffers' 2 GB."""
    stored = [b for b in model.buffers if b.offset > 1]
    if not stored:
        return True
    float32 = {t.buffer for g in model.subgraphs for t in g.tensors
               if t.type == schema.TensorType.FLOAT32}
    halved = sum(b.size for i, b in enumerate(model.buffers) if b.offset > 1 and i in float32)
    if len(content) - halved // 2 + FLATBUFFER_MARGIN > MAX_FLATBUFFER:
        return False
    inline_stored_buffers(model, content)
    return True


def _empty_buffer(model, schema) -> int:
    """Index of a buffer with no data (the schema's buffer 0 is one by convention)."""
    if model.buffers[0].data is None or not len(model.buffers[0].data):
        return 0
    model.buffers.append(schema.BufferT())
    return len(model.buffers) - 1


def record_optimization(model, runtime: str, mode: int, reduced_precision: bytes | None) -> None:
    """The metadata TF writes for a post-training optimization: min_runtime_version raised
    to `runtime` (float16 files: for DEQUANTIZE version 3), reduced_precision_support set
    (float16 files), and `mode` recorded among the conversion's optimization modes."""
    entries = {m.name: m for m in model.metadata or []}
    current = entries.get(b"min_runtime_version")
    old = (bytes(model.buffers[current.buffer].data).rstrip(b"\0").decode()
           if current is not None else "0")
    newest = max(old, runtime, key=lambda v: tuple(int(p) for p in v.split(".")))
    put_metadata(model, b"min_runtime_version", newest.encode().ljust(16, b"\0"))
    if reduced_precision:
        put_metadata(model, b"reduced_precision_support", reduced_precision)
    recorded = entries.get(b"CONVERSION_METADATA")
    if recorded is not None:  # TF's converter wrote it (the direct writer does not)
        from tensorflow.lite.python import conversion_metadata_schema_py_generated as conversion

        data = bytes(model.buffers[recorded.buffer].data)
        meta = conversion.ConversionMetadataT.InitFromObj(
            conversion.ConversionMetadata.GetRootAsConversionMetadata(data, 0))
        if meta.options is None:
            meta.options = conversion.ConversionOptionsT()
        modes = [int(m) for m in (meta.options.modelOptimizationModes
                                  if meta.options.modelOptimizationModes is not None else [])]
        meta.options.modelOptimizationModes = sorted({*modes, mode})
        put_metadata(model, b"CONVERSION_METADATA", pack_table(meta, len(data) + 64))
