"""The .tflite flatbuffer: the one place that reads, unpacks and writes it.

Every edit of a .tflite (float16 weights, -coion names, shared FULLY_CONNECTED weights,
bias correction, activation ranges) is the same round trip: `unpack_model` gives the
schema's object API (`schema.ModelT`: plain Python lists and objects), the caller edits it,
`pack_model` serializes it again. Readers that only look use `read_model`, the lazy flat
view. One schema package serves them all: ai_edge_litert's generated `schema_py_generated`
(a superset of TensorFlow's copy, with blockwise quantization), which does not import
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

FILE_IDENTIFIER = b"TFL3"
# buffer bytes past which a packed model stores them after its flatbuffer (flatbuffers'
# signed 32-bit offsets, with a margin for the tables)
MAX_INLINE = 2**31 - 1 - (64 << 20)
BUFFER_ALIGN = 16  # the alignment of buffers stored after the flatbuffer
SIGNATURE = "serving_default"  # the one signature a converted model has
OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if k.isupper()}


def read_model(content: bytes) -> schema.Model:
    """The flat, read-only view of a .tflite (nothing is copied)."""
    return schema.Model.GetRootAsModel(content, 0)


def unpack_model(content: bytes) -> schema.ModelT:
    """The whole model as editable Python objects; the buffers a file past 2 GB stores
    after its flatbuffer are views of `content` like the others (inline_stored_buffers)."""
    model = schema.ModelT.InitFromObj(read_model(content))
    inline_stored_buffers(model, content)
    return model


def pack_model(model: schema.ModelT, size_hint: int | None = None,
               release: bool = False) -> bytes:
    """`model` serialized as a .tflite file (`size_hint`: the builder's first allocation;
    by default packed_size: a builder that starts small doubles its buffer as it fills,
    holding the old one and a new one twice its size at each step). Past MAX_INLINE bytes
    of buffers (flatbuffers' signed 32-bit offsets) the buffers are stored after the
    flatbuffer (_pack_stored), as the schema's Buffer.offset/size allow. With `release`
    (a caller done with `model`) the model's buffers are dropped once the builder holds
    them, before the file is copied out of it: the buffers, the builder's and the file's
    bytes are never all held (the 2.3 GB model's 836 MB INT16 file: 0.8 GB less)."""
    _vectors_as_arrays(model)
    size = packed_size(model)
    if size >= MAX_INLINE:
        return _pack_stored(model)

    def dropped() -> None:
        for buffer in model.buffers or []:
            buffer.data = None

    return pack_table(model, size if size_hint is None else size_hint, FILE_IDENTIFIER,
                      dropped if release else None)


def with_buffer_data(content: bytes, data: dict[int, np.ndarray]) -> bytes:
    """`content` with the bytes of its buffers `data` ({buffer index: new values of the
    same byte length}) written where they lie: an edit of constant values only (bias
    correction's int32 biases) without the round trip, whose unpacking and packing of
    every table cost more than the edit; the same bytes as the round trip gives for a
    file pack_model wrote."""
    model = read_model(content)
    edited = bytearray(content)
    for index, values in data.items():
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
        buffer = model.Buffers(index)
        if buffer.Offset() > 1:  # stored after the flatbuffer
            start, length = buffer.Offset(), buffer.Size()
        else:
            field = buffer._tab.Offset(4)  # Buffer.data, the table's first field
            start = buffer._tab.Vector(field) if field else 0
            length = buffer.DataLength()
        if length != len(raw):
            raise ValueError(f"buffer {index} holds {length} bytes, not {len(raw)}")
        edited[start:start + length] = raw.tobytes()
    return bytes(edited)


def _pack_stored(model: schema.ModelT) -> bytes:
    """pack_model past 2 GB: the flatbuffer without buffer data, then each buffer's bytes
    at the offset its table records (16-byte aligned). The model is left as it was."""
    moved = [b for b in model.buffers if b.data is not None and len(b.data)]
    data = [b.data for b in moved]
    try:
        for buffer, values in zip(moved, data):  # placeholders: the table's final size
            buffer.data, buffer.offset, buffer.size = None, 2, len(values)
        end = _aligned(len(pack_table(model, 1 << 20, FILE_IDENTIFIER)))
        for buffer, values in zip(moved, data):
            buffer.offset, end = end, _aligned(end + len(values))
        head = pack_table(model, 1 << 20, FILE_IDENTIFIER)
        pieces, at = [head], len(head)
        for buffer, values in zip(moved, data):
            pieces += [bytes(buffer.offset - at), memoryview(np.ascontiguousarray(values)
                                                             ).cast("B")]
            at = buffer.offset + len(values)
        pieces.append(bytes(end - at))
        return b"".join(pieces)  # one copy of the weights
    finally:
        for buffer, values in zip(moved, data):
            buffer.data, buffer.offset, buffer.size = values, 0, 0


def _aligned(offset: int) -> int:
    return -(-offset // BUFFER_ALIGN) * BUFFER_ALIGN


def packed_size(model: schema.ModelT) -> int:
    """A size hint for pack_model: the bytes of `model`'s buffers with their alignment, of
    its tensors' quantization parameters, shapes and names, and 1 MiB for the rest (a hint
    of the file it was unpacked from would allocate, and fill, a float file's size for its
    INT8 file; a hint short of the file doubles the builder at its end: the 2.3 GB model's
    INT16 file, 2.9 MB of per-row scales past a buffers-only hint, took a 1.75 GB builder
    and its copy)."""
    size = sum(len(b.data) + 16 for b in model.buffers or [] if b.data is not None)
    for graph in model.subgraphs or []:
        for tensor in graph.tensors or []:
            size += 64 + len(tensor.name or b"") + 8 * len(tensor.shape if tensor.shape
                                                             is not None else ())
            q = tensor.quantization
            if q is not None:
                size += sum(4 * len(v) for v in (q.scale, q.min, q.max) if v is not None)
                size += 8 * len(q.zeroPoint) if q.zeroPoint is not None else 0
    return size + (1 << 20)


def _vectors_as_arrays(model: schema.ModelT) -> None:
    """The numeric vectors an edit left as Python lists (tensor indices, shapes,
    quantization parameters) as numpy arrays: the generated Pack writes an array in one
    copy and a list one element at a time (the PP-OCRv4 detector's per-channel INT8 file,
    224 ops: 0.070 s from lists, 0.036 s from arrays, the same bytes)."""
    def array(values, dtype):
        return None if values is None else np.asarray(values, dtype)

    for graph in model.subgraphs or []:
        graph.inputs, graph.outputs = array(graph.inputs, np.int32), array(graph.outputs,
                                                                           np.int32)
        for op in graph.operators or []:
            op.inputs, op.outputs = array(op.inputs, np.int32), array(op.outputs, np.int32)
            op.intermediates = array(op.intermediates, np.int32)
        for tensor in graph.tensors or []:
            tensor.shape = array(tensor.shape, np.int32)
            tensor.shapeSignature = array(tensor.shapeSignature, np.int32)
            q = tensor.quantization
            if q is not None:
                q.scale, q.min, q.max = (array(v, np.float32) for v in (q.scale, q.min, q.max))
                q.zeroPoint = array(q.zeroPoint, np.int64)


class _Builder(flatbuffers.Builder):
    """flatbuffers' builder writing a numpy vector into its buffer without first copying
    it to a bytes object (the library's `tobytes`: a 512 MB int16 table held twice while
    it was written); the same bytes."""

    def CreateNumpyVector(self, x):  # the library's name
        if not (isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "biuf"
                and x.dtype.str[0] in "<|" and x.flags.c_contiguous):
            return super().CreateNumpyVector(x)
        self.StartVector(x.itemsize, x.size, x.dtype.alignment)
        length = x.nbytes
        self.head = self.head - length
        self.Bytes[self.head:self.head + length] = memoryview(x).cast("B")
        self.vectorNumElems = x.size
        return self.EndVector()


def pack_table(table, size_hint: int = 1024, file_identifier: bytes | None = None,
               packed: Callable[[], None] | None = None) -> bytes:
    """Any object-API table (a model, the conversion metadata, ...) serialized on its own
    (`packed`: called once the builder holds it, before it is copied out)."""
    builder = _Builder(size_hint)
    builder.Finish(table.Pack(builder), file_identifier=file_identifier)
    if packed is not None:
        packed()
    return bytes(memoryview(builder.Bytes)[builder.Head():])  # one copy (Output() makes two)


def inline_stored_buffers(model, content) -> None:
    """The buffers of `model` stored after the flatbuffer `content` (offset > 1: files past
    2 GB, or asked for) become views of `content`, kept inside when packed again."""
    for buffer in model.buffers or []:
        if buffer.offset > 1:
            buffer.data = np.frombuffer(content, np.uint8, buffer.size, buffer.offset)
            buffer.offset = buffer.size = 0


def put_metadata(model, name: bytes, data: bytes) -> None:
    """`model`'s metadata entry `name` holds `data`: its buffer refilled, or a new buffer
    and entry added."""
    entry = next((m for m in model.metadata or [] if m.name == name), None)
    if entry is None:
        model.buffers.append(schema.BufferT())
        entry = schema.MetadataT()
        entry.name, entry.buffer = name, len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), entry]
    model.buffers[entry.buffer].data = np.frombuffer(data, np.uint8)


def builtin_codes(model: schema.Model) -> list[int]:
    """The builtin code of each operator code of a read (not unpacked) model, by index:
    codes below 127 live in the deprecated int8 field, newer ones only in the int32 one."""
    return [max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            for code in map(model.OperatorCodes, range(model.OperatorCodesLength()))]


def op_name(model, op) -> str:
    """The builtin name of `op` (an OperatorT of `model`), or the custom op's code."""
    code = model.operatorCodes[op.opcodeIndex]
    builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
    if builtin == schema.BuiltinOperator.CUSTOM:
        return code.customCode.decode() if code.customCode else "CUSTOM"
    return OP_NAMES.get(builtin, str(builtin))


def opcode_index(model, builtin: int, version: int, exact: bool = False) -> int:
    """The index of `builtin`'s operator code in `model` (schema.ModelT), added when
    missing: the first such code with its version raised to at least `version`, or with
    `exact` the one of exactly `version` (ops of one builtin at different versions)."""
    for k, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) != builtin:
            continue
        if not exact:
            code.version = max(code.version, version)
            return k
        if code.version == version:
            return k
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode = builtin, min(builtin, 127)
    code.version = version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1
