"""TF's converter's last two passes, done on the model we unpack anyway.

After its MLIR conversion, TF's Python converter shares equal read-only buffers and then
adds the CONVERSION_METADATA entry, each pass a Python unpacking and packing of the whole
flatbuffer (three unpackings, two packings): on an unrolled 2-layer LSTM's 4,400 ops that
is 2.1 s of a 10 s conversion. The float32 files that lowering.py unpacks afterwards anyway
(to sign them or fold their run-time biases) instead ask TF to skip both
(`_experimental_use_buffer_offset`, which also puts the buffers after the flatbuffer) and
get the same two passes here, on that one unpacked model: the buffers read in, the
duplicates shared as TF shares them, the metadata TF would have written. A TF without that
switch or its metadata object converts as before.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import (
    inline_stored_buffers,
    pack_table,
    put_metadata,
    schema,
    unpack_model,
)

BUFFER_LOCATION = b"buffer_location"  # the metadata entry of a file with stored buffers
CONVERSION_METADATA = b"CONVERSION_METADATA"


class Finish:
    """Given to lowering._converted: `prepare` switches TF's last passes off on a
    converter, `model` unpacks the converted file and makes them."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.converter = enabled, None

    def prepare(self, converter) -> None:
        if (self.enabled and hasattr(converter, "_experimental_use_buffer_offset")
                and getattr(converter, "_metadata", None) is not None):
            converter._experimental_use_buffer_offset = True
            self.converter = converter
        else:
            self.converter = None

    def model(self, content: bytes):
        """`content` unpacked (schema.ModelT), finished as TF would have finished it."""
        model = unpack_model(content)
        if self.converter is None:
            return model
        read_stored_buffers(model, content)
        share_read_only_buffers(model)
        _record_metadata(model, self.converter._metadata)
        return model


def read_stored_buffers(model, content) -> None:
    """Buffers stored after the flatbuffer (offset > 1) become views of `content`, and the
    entry that says they are stored goes."""
    inline_stored_buffers(model, content)
    if model.metadata:
        kept = [m for m in model.metadata if m.name != BUFFER_LOCATION]
        for entry in model.metadata:
            if entry.name != BUFFER_LOCATION:
                continue
            if entry.buffer == len(model.buffers) - 1:  # where the exporter puts it
                model.buffers.pop()
            else:
                model.buffers[entry.buffer] = schema.BufferT()
        model.metadata = kept


def share_read_only_buffers(model) -> None:
    """Tensors that ops only read (not variables, mutated inputs, op outputs or
    intermediates, subgraph inputs or outputs) and whose buffers hold the same bytes read
    one of those buffers; the others are emptied. The biggest first, as TF's converter does
    (tensorflow/lite/python/convert.py: deduplicate_readonly_buffers)."""
    read_only: set[int] = set()
    for subgraph in model.subgraphs:
        tensors: set[int] = set()
        for op in subgraph.operators:
            mutated = op.mutatingVariableInputs
            for i, index in enumerate(op.inputs if op.inputs is not None else []):
                if index < 0 or (mutated is not None and i < len(mutated) and mutated[i]):
                    continue
                if not subgraph.tensors[index].isVariable:
                    tensors.add(int(index))
        for op in subgraph.operators:
            tensors -= {int(i) for i in (op.outputs if op.outputs is not None else [])}
            tensors -= {int(i) for i in (op.intermediates if op.intermediates is not None
                                         else [])}
        tensors -= {int(i) for i in (subgraph.inputs if subgraph.inputs is not None else [])}
        tensors -= {int(i) for i in (subgraph.outputs if subgraph.outputs is not None else [])}
        read_only |= {int(subgraph.tensors[i].buffer) for i in tensors}
    first: dict[bytes, int] = {}
    same: dict[int, int] = {}
    for index in sorted(read_only, key=lambda b: (-_size(model, b), b)):
        data = model.buffers[index].data if index >= 0 else None
        if data is None or isinstance(data, list) or data.size == 0:
            continue
        key = np.asarray(data).tobytes()
        if key in first:
            same[index] = first[key]
        else:
            first[key] = index
    if not same:
        return
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            for index in op.inputs if op.inputs is not None else []:
                tensor = subgraph.tensors[index]
                if index >= 0 and tensor.buffer in same:
                    tensor.buffer = same[tensor.buffer]
    for index in same:
        model.buffers[index].data = None


def _size(model, index: int) -> int:
    data = model.buffers[index].data if index >= 0 else None
    return 0 if data is None or isinstance(data, list) else int(data.size)


def _record_metadata(model, metadata) -> None:
    """The CONVERSION_METADATA entry TF writes: its converter's record of the conversion,
    with the model's structural hash."""
    from tensorflow.lite.python.util import get_model_hash

    metadata.environment.modelHash = get_model_hash(model)
    put_metadata(model, CONVERSION_METADATA, pack_table(metadata))
