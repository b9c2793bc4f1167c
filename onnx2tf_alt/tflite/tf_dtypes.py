"""tf.DType's face over numpy dtypes, for handler code run on the direct writer's tensors
(tflite/direct_tensors.py): what handlers read of a dtype (`x.dtype == tf.int64`,
`.name`, `.is_floating`, `.size`, `.as_numpy_dtype`, `tf.as_dtype(...)`), and the TFLite
tensor types the direct writer has for each."""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatgraph import NotCovered

_NAMES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "bool")


class DType:
    """A dtype as tf.DType reads; equal to the numpy dtype it holds and to its tf name."""

    def __init__(self, dtype):
        self.as_numpy_dtype = np.dtype(dtype).type
        self._np = np.dtype(dtype)

    @property
    def dtype(self) -> np.dtype:  # np.dtype(DType) reads it
        return self._np

    @property
    def name(self) -> str:
        return self._np.name

    @property
    def size(self) -> int:
        return self._np.itemsize

    @property
    def is_floating(self) -> bool:
        return self._np.kind == "f"

    @property
    def is_integer(self) -> bool:
        return self._np.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self._np.kind in "ub"

    @property
    def is_bool(self) -> bool:
        return self._np.kind == "b"

    @property
    def min(self):
        return np.finfo(self._np).min if self.is_floating else (
            False if self.is_bool else np.iinfo(self._np).min)

    @property
    def max(self):
        return np.finfo(self._np).max if self.is_floating else (
            True if self.is_bool else np.iinfo(self._np).max)

    def __eq__(self, other) -> bool:
        try:
            return self._np == as_numpy(other)
        except (TypeError, NotCovered):
            return False

    def __hash__(self) -> int:
        return hash(self._np)

    def __repr__(self) -> str:
        return f"tf.{self.name}"


def as_numpy(dtype) -> np.dtype:
    """The numpy dtype of a DType, a numpy dtype or type, or a tf-style name."""
    if isinstance(dtype, DType):
        return dtype.dtype  # NotCovered for one no value has
    if isinstance(dtype, str) and dtype not in _NAMES:
        raise NotCovered(f"dtype {dtype}")
    return np.dtype(dtype)


def as_dtype(dtype) -> DType:
    """tf.as_dtype."""
    return DType(as_numpy(dtype))


class _Unheld(DType):
    """A dtype no value here has (bfloat16: numpy has none): handlers compare with it."""

    def __init__(self, name: str):
        self._name = name
        self.as_numpy_dtype = None

    name = property(lambda self: self._name)
    dtype = size = is_floating = is_integer = is_unsigned = is_bool = min = max = property(
        lambda self: _unheld(self._name))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Unheld) and other._name == self._name

    def __hash__(self) -> int:
        return hash(self._name)


def _unheld(name: str):
    raise NotCovered(f"a {name} value")


DTYPES = {name: DType(name) for name in _NAMES}
DTYPES["bfloat16"] = _Unheld("bfloat16")
