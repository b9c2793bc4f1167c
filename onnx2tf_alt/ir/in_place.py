"""An ONNX file read without copying its inline weights: each large initializer's bytes are
left where they lie in the file and pointed at as external data of the file itself.

`onnx.load` reads the whole file into memory and parses it into a proto that holds every
weight again: a 1.6 GB single-file export cost 4.3 GB at its peak and 2.4 GB after, and
then its weights went to a temporary file (ir/weights.spill) so that later stages could
read them through memory maps. Protobuf's wire format stores an initializer's `raw_data` as
one contiguous run of bytes, so a walk over the file's field headers (ModelProto.graph ->
GraphProto.initializer -> TensorProto.raw_data) finds each run's offset without touching
it. The proto is parsed from everything else; each initializer whose raw_data has at least
IN_PLACE_BYTES gets `data_location: EXTERNAL` with the model file itself as `location`, the
run's offset and length: what ir/weights.py memory-maps and onnxruntime reads.

Only the main graph's initializers are read in place; subgraphs, Constant nodes and typed
fields (float_data ...) stay in the proto as onnx.load reads them. A file the walk does not
understand is read by onnx.load, which says what is wrong with it.
"""

from __future__ import annotations

import mmap
import os

import onnx

from onnx2tf_alt.ir.weights import RAW_TYPES, tensor_bytes

IN_PLACE_BYTES = 64 << 10  # smaller raw_data stays in the proto (shape data, biases)

# field numbers (onnx.proto)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
# wire types
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _NotUnderstood(Exception):
    """The bytes are not the protobuf this walk reads: onnx.load decides."""


def read_in_place(path: str) -> tuple[onnx.ModelProto, int]:
    """(the model at `path` with its large inline initializers pointed at in the file, the
    bytes left there). Raises what onnx.load raises for a file that is not a model."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < IN_PLACE_BYTES:
            return onnx.load(path, load_external_data=False), 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            try:
                content, left = _without_weights(view, os.path.basename(path))
            except _NotUnderstood:
                return onnx.load(path, load_external_data=False), 0
    model = onnx.ModelProto()
    model.ParseFromString(content)
    return model, left


def _without_weights(view, location: str) -> tuple[bytes, int]:
    """The serialized model in `view` with each large raw_data of the main graph's
    initializers replaced by a reference to its bytes in the file named `location`."""
    parts, graph, left = [], None, 0
    for number, wire, start, body, end in _fields(view, 0, len(view)):
        if number == _MODEL_GRAPH and wire == _LENGTH:
            if graph is not None:
                raise _NotUnderstood("two graphs")  # protobuf would merge them
            graph_parts = []
            for g_number, g_wire, g_start, g_body, g_end in _fields(view, body, end):
                if g_number == _GRAPH_INITIALIZER and g_wire == _LENGTH:
                    tensor, moved = _tensor(view, g_body, g_end, location)
                    left += moved
                    graph_parts.append(_key(_GRAPH_INITIALIZER, _LENGTH)
                                       + _varint(len(tensor)) + tensor)
                else:
                    graph_parts.append(bytes(view[g_start:g_end]))
            graph = b"".join(graph_parts)
        else:
            parts.append(bytes(view[start:end]))
    if graph is None:
        raise _NotUnderstood("no graph")
    parts.append(_key(_MODEL_GRAPH, _LENGTH) + _varint(len(graph)) + graph)
    return b"".join(parts), left


def _tensor(view, start: int, end: int, location: str) -> tuple[bytes, int]:
    """(a TensorProto's bytes, the bytes left in the file): its raw_data, where it has at
    least IN_PLACE_BYTES, replaced by a reference to them."""
    fields = list(_fields(view, start, end))
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA and f[1] == _LENGTH]
    if len(raw) != 1 or raw[0][4] - raw[0][3] < IN_PLACE_BYTES:
        return bytes(view[start:end]), 0
    _, _, _, body, stop = raw[0]
    tensor = onnx.TensorProto()
    tensor.ParseFromString(b"".join(bytes(view[f[2]:f[4]]) for f in fields if f is not raw[0]))
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
        raise _NotUnderstood("raw_data beside external data")
    if tensor.data_type not in RAW_TYPES or stop - body != tensor_bytes(tensor):
        return bytes(view[start:end]), 0  # onnx's own reader and checker judge it
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(body)),
                       ("length", str(stop - body))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor.SerializeToString(), stop - body


def _fields(view, start: int, end: int):
    """(field number, wire type, start, body start, end) of each field in view[start:end]."""
    at = start
    while at < end:
        key, body = _read_varint(view, at, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _NotUnderstood("field 0")
        if wire == _VARINT:
            _, stop = _read_varint(view, body, end)
        elif wire == _FIXED64:
            stop = body + 8
        elif wire == _FIXED32:
            stop = body + 4
        elif wire == _LENGTH:
            length, body = _read_varint(view, body, end)
            stop = body + length
        else:  # groups: no ONNX field is one
            raise _NotUnderstood(f"wire type {wire}")
        if stop > end:
            raise _NotUnderstood("a field past its message")
        yield number, wire, at, body, stop
        at = stop


def _read_varint(view, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise _NotUnderstood("a truncated varint")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)
