"""The flatbuffer graph the direct writer (tflite/direct.py) builds: tensors with their
buffers, and operators by builtin name, as they are added; packed by direct._pack."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import RawBufferT, schema

LIMIT_BYTES = 1 << 30  # larger models go through TF's route (files past 2 GB need offsets)
TYPES = {np.dtype(np.float32): schema.TensorType.FLOAT32,
          np.dtype(np.int32): schema.TensorType.INT32,
          np.dtype(np.int64): schema.TensorType.INT64,
          np.dtype(np.bool_): schema.TensorType.BOOL,
          np.dtype(np.int8): schema.TensorType.INT8,
          np.dtype(np.uint8): schema.TensorType.UINT8,
          np.dtype(np.int16): schema.TensorType.INT16}


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

    def tensor(self, name: str, shape, dtype=np.float32, data: np.ndarray | None = None) -> int:
        """A new tensor of physical `shape` (None: the batch, known at run time)."""
        dtype = np.dtype(dtype)
        if dtype not in TYPES:
            raise NotCovered(f"dtype {dtype}")
        if sum(d is None for d in shape) > 1:
            raise NotCovered(f"'{name}' has several unknown dims {list(shape)}")
        t = schema.TensorT()
        t.name = name.encode()
        t.type = TYPES[dtype]
        t.shape = np.array([1 if d is None else d for d in shape], np.int32)
        if any(d is None for d in shape):
            t.shapeSignature = np.array([-1 if d is None else d for d in shape], np.int32)
        buffer = RawBufferT()
        if data is not None:
            data = np.ascontiguousarray(data, dtype)
            buffer.data = data.reshape(-1).view(np.uint8)
            self.weight_bytes += data.nbytes
            if self.weight_bytes > LIMIT_BYTES:
                raise NotCovered(f"weights above {LIMIT_BYTES >> 20} MB")
        self.buffers.append(buffer)
        t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def shape(self, index: int) -> tuple:
        t = self.tensors[index]
        dims = t.shapeSignature if t.shapeSignature is not None else t.shape
        return tuple(None if d < 0 else int(d) for d in dims)

    def dtype(self, index: int) -> np.dtype:
        kind = self.tensors[index].type
        return next(d for d, t in TYPES.items() if t == kind)

    def op(self, name: str, inputs: list[int], outputs: list[int], opts=None) -> None:
        self.operators.append(Operator(name, list(inputs), list(outputs), opts))
