"""The flatbuffer graph the direct writer (tflite/direct.py) builds: tensors with their
buffers, and operators by builtin name, as they are added; packed by direct._pack.

A constant's buffer holds its array as the writer made it (`ArrayBuffer`): a transposed
view of an ONNX weight stays a view of it, and its bytes are made when the file is written,
a block of rows at a time, so a 2 GB decoder's weights are never copied whole."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx2tf_alt.ir.weights import release
from onnx2tf_alt.tflite.flatbuffer import schema
from onnx2tf_alt.tflite.late_weights import LazyBuffer, row_blocks

TYPES = {np.dtype(np.float32): schema.TensorType.FLOAT32,
          np.dtype(np.float16): schema.TensorType.FLOAT16,
          np.dtype(np.float64): schema.TensorType.FLOAT64,
          np.dtype(np.int32): schema.TensorType.INT32,
          np.dtype(np.int64): schema.TensorType.INT64,
          np.dtype(np.bool_): schema.TensorType.BOOL,
          np.dtype(np.int8): schema.TensorType.INT8,
          np.dtype(np.uint8): schema.TensorType.UINT8,
          np.dtype(np.int16): schema.TensorType.INT16,
          np.dtype(np.uint16): schema.TensorType.UINT16,
          np.dtype(np.uint32): schema.TensorType.UINT32,
          np.dtype(np.uint64): schema.TensorType.UINT64}


class NotCovered(Exception):
    """A node the direct writer does not write: the model goes through TF's converter.
    `node` is that node, where one is to blame (the failure report's repro)."""

    def __init__(self, reason: str, node=None):
        super().__init__(reason)
        self.node = node


def options(kind: str, **fields):
    """A builtin-options table of the schema's object API (`options("Conv2DOptions",
    padding=...)`), with its union type, for `DirectContext.op`."""
    table = getattr(schema, f"{kind}T")()
    for name, value in fields.items():
        if not hasattr(table, name):
            raise AttributeError(f"{kind} has no field {name}")
        setattr(table, name, value)
    return getattr(schema.BuiltinOptions, kind), table


class ArrayBuffer(LazyBuffer):
    """A constant's buffer: `array` (its tensor's dtype and physical shape, any strides),
    packed as its bytes in row order a block of rows at a time (late_weights.row_blocks); a
    LazyBuffer, so everything that writes or reads those (float16 and dynamic-range files,
    files past 2 GB with their weights after the flatbuffer) takes it as it is."""

    def __init__(self, array: np.ndarray):
        super().__init__(make=lambda: np.ascontiguousarray(self.array), nbytes=array.nbytes,
                         pieces=self._rows)
        self.array = array

    def _rows(self):
        yield from row_blocks(self.array)
        release(self.array)  # an ONNX weight kept on disk: its pages read, not resident


@dataclass
class Part:
    """One written subgraph of a file: `key` (its signature's, or its name where it has
    none: an IF branch, a WHILE body), the input and output tensors (indices into `flat`)
    and their keys."""

    key: str
    flat: FlatGraph
    inputs: list[int]
    outputs: list[int]
    input_keys: list[str]
    output_keys: list[str]


@dataclass
class Operator:
    name: str
    inputs: list[int]
    outputs: list[int]
    options: tuple | None = None


@dataclass
class FlatGraph:
    """The tensors, buffers and operators of one subgraph, as they are added."""

    tensors: list = field(default_factory=list)  # schema.TensorT
    buffers: list = field(default_factory=lambda: [schema.BufferT()])  # 0: the empty one
    operators: list[Operator] = field(default_factory=list)
    weight_bytes: int = 0
    subgraphs: list = field(default_factory=list)  # Parts its IF / WHILE ops run

    def subgraph_op(self, name: str, inputs: list[int], outputs: list[int], kind: str,
                    **parts) -> None:
        """An IF or WHILE running `parts` (Parts by options field: thenSubgraphIndex=...),
        their indices set when the file is packed."""
        opts = options(kind)
        opts[1].subgraph_parts = parts
        self.subgraphs.extend(parts.values())
        self.op(name, inputs, outputs, opts)

    def tensor(self, name: str, shape, dtype=np.float32, data: np.ndarray | None = None,
               dynamic: bool = False) -> int:
        """A new tensor of physical `shape` (None: the batch, known at run time; with
        `dynamic`, any dims: a value computed from run-time values, tflite/recorder.py)."""
        dtype = np.dtype(dtype)
        if dtype not in TYPES:
            raise NotCovered(f"dtype {dtype}")
        if not dynamic and sum(d is None for d in shape) > 1:
            raise NotCovered(f"'{name}' has several unknown dims {list(shape)} (-ois gives "
                             "an input's sizes)")
        t = schema.TensorT()
        t.name = name.encode()
        t.type = TYPES[dtype]
        t.shape = np.array([1 if d is None else d for d in shape], np.int32)
        if any(d is None for d in shape):
            t.shapeSignature = np.array([-1 if d is None else d for d in shape], np.int32)
        if data is None:
            buffer = schema.BufferT()
        else:
            buffer = ArrayBuffer(np.asarray(data, dtype).reshape(t.shape))
            self.weight_bytes += buffer.nbytes
        self.buffers.append(buffer)
        t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def set_shape(self, index: int, shape) -> None:
        """Tensor `index` has physical `shape` (what the plan knows of a value the Recorder
        computed with unknown dims)."""
        t = self.tensors[index]
        t.shape = np.array([1 if d is None else d for d in shape], np.int32)
        t.shapeSignature = (np.array([-1 if d is None else d for d in shape], np.int32)
                            if None in shape else None)

    def shape(self, index: int) -> tuple:
        t = self.tensors[index]
        dims = t.shapeSignature if t.shapeSignature is not None else t.shape
        return tuple(None if d < 0 else int(d) for d in dims)

    def constant(self, index: int) -> np.ndarray | None:
        """The values of a constant tensor (its array, physical shape), or None."""
        buffer = self.buffers[self.tensors[index].buffer]
        return buffer.array if isinstance(buffer, ArrayBuffer) else None

    def set_constant(self, index: int, values: np.ndarray) -> None:
        """Constant tensor `index` holds `values` now (same shape and dtype)."""
        tensor = self.tensors[index]
        array = np.asarray(values, self.dtype(index)).reshape(tensor.shape)
        self.weight_bytes += array.nbytes - self.buffers[tensor.buffer].nbytes
        self.buffers[tensor.buffer] = ArrayBuffer(array)

    def dtype(self, index: int) -> np.dtype:
        kind = self.tensors[index].type
        return next(d for d, t in TYPES.items() if t == kind)

    def op(self, name: str, inputs: list[int], outputs: list[int], opts=None) -> None:
        self.operators.append(Operator(name, list(inputs), list(outputs), opts))
