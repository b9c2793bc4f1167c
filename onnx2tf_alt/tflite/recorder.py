"""A handler's own code run by the direct writer (issue 48: one place per op's semantics).

A node without a `@direct` writer, or with integer or boolean values, is written by running
its handler's function as the TF route does, on a `RecordingContext` whose inputs are the
direct writer's tensors (tflite/direct_tensors.Tensor) and with `tf` standing for a
`Recorder` (translate/lazy.standing_in): each tf function the handler calls writes the
TFLite builtin TF's converter writes for it, or folds constants with numpy as TF's converter
folds them. A function the recorder does not have raises NotCovered, and the model goes
through TF's converter (said at `-v info`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys

import numpy as np

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.tflite.direct_tensors import DirectOps, Tensor, _broadcast, _Namespace
from onnx2tf_alt.tflite.flatgraph import TYPES, NotCovered, options
from onnx2tf_alt.tflite.tf_dtypes import DTYPES, DType, as_dtype, as_numpy
from onnx2tf_alt.translate.lazy import standing_in

# tf function -> (builtin, numpy fold, options table or None)
_BINARY = {
    "add": ("ADD", np.add, "AddOptions"), "subtract": ("SUB", np.subtract, "SubOptions"),
    "multiply": ("MUL", np.multiply, "MulOptions"), "maximum": ("MAXIMUM", np.maximum, None),
    "minimum": ("MINIMUM", np.minimum, None),
    "floormod": ("FLOOR_MOD", np.mod, None), "floordiv": ("FLOOR_DIV", np.floor_divide, None),
    "pow": ("POW", np.power, None), "squared_difference": (
        "SQUARED_DIFFERENCE", lambda a, b: np.square(a - b), None),
}
_COMPARE = {
    "equal": ("EQUAL", np.equal), "not_equal": ("NOT_EQUAL", np.not_equal),
    "less": ("LESS", np.less), "less_equal": ("LESS_EQUAL", np.less_equal),
    "greater": ("GREATER", np.greater), "greater_equal": ("GREATER_EQUAL", np.greater_equal),
    "logical_and": ("LOGICAL_AND", np.logical_and), "logical_or": ("LOGICAL_OR", np.logical_or),
}
_UNARY = {  # tf function -> (builtin, numpy fold); float32 unless said
    "exp": ("EXP", np.exp), "log": ("LOG", np.log), "sqrt": ("SQRT", np.sqrt),
    "rsqrt": ("RSQRT", lambda x: 1 / np.sqrt(x)), "floor": ("FLOOR", np.floor),
    "ceil": ("CEIL", np.ceil), "round": ("ROUND", np.round), "sin": ("SIN", np.sin),
    "cos": ("COS", np.cos), "tanh": ("TANH", np.tanh),
    "sigmoid": ("LOGISTIC", lambda x: 1 / (1 + np.exp(-x))), "square": ("SQUARE", np.square),
    "abs": ("ABS", np.abs), "negative": ("NEG", np.negative), "sign": ("SIGN", np.sign),
    "logical_not": ("LOGICAL_NOT", np.logical_not), "relu": ("RELU", lambda x: np.maximum(x, 0)),
    "relu6": ("RELU6", lambda x: np.clip(x, 0, 6)),
}
_REDUCE = {  # tf function -> (builtin, numpy fold)
    "reduce_sum": ("SUM", np.sum), "reduce_mean": ("MEAN", np.mean),
    "reduce_max": ("REDUCE_MAX", np.max), "reduce_min": ("REDUCE_MIN", np.min),
    "reduce_prod": ("REDUCE_PROD", np.prod), "reduce_any": ("REDUCE_ANY", np.any),
    "reduce_all": ("REDUCE_ALL", np.all),
}


class Recorder(DirectOps):
    """The tf namespace of a handler's code (see the module's docstring)."""

    DType = DType

    def __init__(self, ctx):
        super().__init__(ctx)
        unary = {name: self._unary_fn(name) for name in _UNARY}
        self.nn = _Namespace("nn", relu=unary["relu"], relu6=unary["relu6"],
                             leaky_relu=self._leaky_relu, gelu=self.gelu, elu=self.elu,
                             softmax=self.softmax, log_softmax=self.log_softmax)
        self.bitwise = _Namespace(
            "bitwise", bitwise_xor=self._shift_fn("BITWISE_XOR", np.bitwise_xor),
            right_shift=self._shift_fn("RIGHT_SHIFT", np.right_shift))
        self.math = _Namespace("math", **{k: v for k, v in unary.items()},
                               floormod=self._binary_fn("floormod"),
                               reciprocal=self.reciprocal, divide=self.divide,
                               argmax=self.argmax, argmin=self.argmin, atan2=self.atan2,
                               top_k=self.top_k, cumsum=self.cumsum,
                               floordiv=self._binary_fn("floordiv"),
                               **{k: self._compare_fn(k) for k in _COMPARE},
                               **{k: self._reduce_fn(k) for k in _REDUCE})
        self.__dict__.update(unary)
        self.__dict__.update({k: self._binary_fn(k) for k in _BINARY})
        self.__dict__.update({k: self._compare_fn(k) for k in _COMPARE})
        self.__dict__.update({k: self._reduce_fn(k) for k in _REDUCE})
        self.__dict__.update(DTYPES)
        self.__internal__ = _Namespace("__internal__", EagerTensor=_EagerTensor)
        self.float32 = DTYPES["float32"]

    def __getattr__(self, name: str):
        raise NotCovered(f"tf.{name} in the direct writer")

    # --- values ------------------------------------------------------------------------
    @staticmethod
    def as_dtype(dtype) -> DType:
        return as_dtype(dtype)

    @staticmethod
    def is_tensor(value) -> bool:
        return isinstance(value, Tensor)

    def convert_to_tensor(self, value, dtype=None) -> Tensor:
        if isinstance(value, Tensor):
            return value if dtype is None else self.cast(value, dtype)
        return self.weight(np.asarray(value, None if dtype is None else as_numpy(dtype)))

    def constant(self, value, dtype=None, shape=None) -> Tensor:
        array = np.asarray(value, None if dtype is None else as_numpy(dtype))
        return self.weight(array if shape is None else np.broadcast_to(array, shape).copy())

    def identity(self, x) -> Tensor:
        return self._tensor(x)

    def _tensor(self, value, like: Tensor | None = None) -> Tensor:
        """A Tensor of `value`; a Python number takes `like`'s dtype (as tf's operators
        convert a scalar beside a tensor)."""
        if isinstance(value, Tensor):
            return value
        if like is not None and not isinstance(value, np.ndarray):
            return self.weight(np.asarray(value, as_numpy(like.dtype)))
        array = np.asarray(value)
        if isinstance(value, (np.ndarray, np.generic)):
            return self.weight(array)
        # Python numbers as tf converts them: int32, float32
        return self.weight(array.astype({"i": np.int32, "f": np.float32}.get(
            array.dtype.kind, array.dtype)))

    def _out(self, shape, dtype, kind: str) -> tuple[int, Tensor]:
        """A new tensor of the flat graph and its Tensor."""
        self._count += 1
        name = f"{self._ctx.node.name}/{kind}_{self._count}"
        index = self._ctx.flat.tensor(name, shape, as_numpy(dtype))
        return index, Tensor(self, shape, index=index, dtype=dtype)

    def outputs(self, results: list) -> list:
        """The node's outputs: tensor indices, or numpy arrays where a result folded to a
        constant (in the output's physical layout), each in the output's ONNX dtype."""
        values = []
        for j, value in enumerate(results):
            if value is None:
                values.append(None)
                continue
            value = self._tensor(value)
            want = self._ctx.out_dtype(j)
            if want is not None and value.dtype != want:
                value = self.cast(value, want)
            if value.const is not None:
                values.append(value.const)
                continue
            shape = self._ctx.out_phys_shape(j)
            if shape is None or tuple(value.shape) != tuple(shape):
                raise NotCovered(f"output {j} came out {list(value.shape)}, planned {shape}")
            values.append(value.index)
        return values

    # --- elementwise -------------------------------------------------------------------
    def cast(self, x, dtype) -> Tensor:
        x, dtype = self._tensor(x), as_dtype(dtype)
        if x.dtype == dtype:
            return x
        if x.const is not None:
            return self.weight(x.const.astype(as_numpy(dtype)))
        out, tensor = self._out(x.shape, dtype, "cast")
        self._ctx.op("CAST", [x.index], out)
        return tensor

    def _binary_fn(self, name: str):
        builtin, fold, kind = _BINARY[name]

        def apply(a, b, name=None):
            a, b = self._pair(a, b)
            if a.const is not None and b.const is not None:
                return self.weight(np.asarray(fold(a.const, b.const)).astype(
                    as_numpy(a.dtype)))
            if builtin in ("FLOOR_DIV", "POW") and a.dtype == np.int64:
                raise NotCovered(f"{builtin} of int64")
            opts = None if kind is None else options(kind, fusedActivationFunction=0)
            return self._write(builtin, [a, b], a.dtype, opts)

        return apply

    def _compare_fn(self, name: str):
        builtin, fold = _COMPARE[name]

        def apply(a, b, name=None):
            a, b = self._pair(a, b)
            if a.const is not None and b.const is not None:
                return self.weight(np.asarray(fold(a.const, b.const)))
            return self._write(builtin, [a, b], DTYPES["bool"])

        return apply

    def _unary_fn(self, name: str):
        builtin, fold = _UNARY[name]

        def apply(x, name=None):
            x = self._tensor(x)
            if x.const is not None:
                return self.weight(np.asarray(fold(x.const)).astype(as_numpy(x.dtype)))
            return self._write(builtin, [x], x.dtype)

        return apply

    def _pair(self, a, b) -> tuple[Tensor, Tensor]:
        a = self._tensor(a, b if isinstance(b, Tensor) else None)
        b = self._tensor(b, a)
        if a.dtype != b.dtype:
            raise NotCovered(f"an op on {a.dtype.name} and {b.dtype.name}")
        return a, b

    def _write(self, builtin: str, inputs: list[Tensor], dtype, opts=None) -> Tensor:
        shape = inputs[0].shape
        for other in inputs[1:]:
            shape = _broadcast(shape, other.shape)
        if len(shape) > 6:
            raise NotCovered("broadcasting above rank 6")
        out, tensor = self._out(shape, dtype, builtin.lower())
        self._ctx.op(builtin, [t.index for t in inputs], out, opts)
        return tensor

    def add(self, a, b, name=None) -> Tensor:
        a, b = self._pair(a, b)
        if a.dtype == np.float32:  # a product's bias (DirectOps.add), else ADD
            return super().add(a, b)
        return self._binary_fn("add")(a, b)

    def binary(self, name: str, a, b) -> Tensor:
        return self._binary_fn({"ADD": "add", "SUB": "subtract", "MUL": "multiply",
                                "MINIMUM": "minimum", "MAXIMUM": "maximum"}[name])(a, b)

    def divide(self, a, b, name=None) -> Tensor:
        a, b = self._pair(a, b)
        if not a.dtype.is_floating:
            raise NotCovered(f"a division of {a.dtype.name}")
        if a.const is not None and b.const is not None:
            return self.weight(np.asarray(a.const / b.const, as_numpy(a.dtype)))
        return self._write("DIV", [a, b], a.dtype, options("DivOptions",
                                                            fusedActivationFunction=0))

    truediv = divide

    def where(self, condition, x=None, y=None, name=None) -> Tensor:
        if x is None or y is None:
            raise NotCovered("tf.where of a condition alone (indices known at run time)")
        condition = self._tensor(condition)
        x, y = self._pair(x, y)
        if all(t.const is not None for t in (condition, x, y)):
            return self.weight(np.where(condition.const, x.const, y.const))
        return self._write("SELECT_V2", [condition, x, y], x.dtype)

    # --- shapes ------------------------------------------------------------------------
    def shape(self, x, out_type=None) -> Tensor:
        x = self._tensor(x)
        dtype = as_numpy(out_type or np.int32)
        if None not in x.shape:
            return self.weight(np.array(x.shape, dtype))
        out, tensor = self._out((len(x.shape),), dtype, "shape")
        self._ctx.op("SHAPE", [x.index], out, options("ShapeOptions",
                                                      outType=_tensor_type(dtype)))
        return tensor

    def reshape(self, x, dims, name=None) -> Tensor:
        if isinstance(dims, Tensor):
            if dims.const is None:
                raise NotCovered("a reshape to a shape known only at run time")
            dims = [None if d == -1 else int(d) for d in dims.const.reshape(-1)]
        x = self._tensor(x)
        dims = [None if d is None or int(d) == -1 else int(d) for d in dims]
        if x.dtype == np.float32:
            return super().reshape(x, dims)
        if x.const is not None and None not in x.shape:
            return self.weight(x.const.reshape([-1 if d is None else d for d in dims]))
        if None in dims and None not in x.shape:
            known = int(np.prod([d for d in dims if d is not None]))
            dims = [int(np.prod(x.shape)) // known if d is None else d for d in dims]
        if tuple(dims) == tuple(x.shape):
            return x
        out, tensor = self._out(dims, x.dtype, "reshape")
        self._ctx.reshape(x.index, dims, out)
        return tensor

    def expand_dims(self, x, axis: int, name=None) -> Tensor:
        x = self._tensor(x)
        axis = axis % (x.shape.rank + 1)
        return self.reshape(x, [*x.shape[:axis], 1, *x.shape[axis:]])

    def squeeze(self, x, axis=None, name=None) -> Tensor:
        x = self._tensor(x)
        axes = [a for a, d in enumerate(x.shape) if d == 1] if axis is None else [
            a % x.shape.rank for a in np.atleast_1d(axis)]
        return self.reshape(x, [d for a, d in enumerate(x.shape) if a not in axes])

    def transpose(self, x, perm, name=None) -> Tensor:
        x = self._tensor(x)
        perm = [int(p) for p in perm]
        if x.const is not None:
            return self.weight(np.transpose(x.const, perm))
        if perm == list(range(len(perm))):
            return x
        out, tensor = self._out(tuple(x.shape[p] for p in perm), x.dtype, "transpose")
        self._ctx.op("TRANSPOSE", [x.index, self._ctx.ints(perm, "perm")], out)
        return tensor

    def gather(self, params, indices, axis: int = 0, batch_dims: int = 0, name=None):
        params, indices = self._tensor(params), self._tensor(indices)
        axis %= params.shape.rank
        if params.const is not None and indices.const is not None:
            return self.weight(np.take(params.const, indices.const, axis=axis))
        if batch_dims:
            raise NotCovered("a gather with batch dims")
        shape = (*params.shape[:axis], *indices.shape, *params.shape[axis + 1:])
        if sum(d is None for d in shape) > 1:
            raise NotCovered(f"a gather into {list(shape)}")
        out, tensor = self._out(shape, params.dtype, "gather")
        self._ctx.op("GATHER", [params.index, indices.index], out,
                     options("GatherOptions", axis=axis, batchDims=0))
        return tensor

    def _reduce_fn(self, name: str):
        builtin, fold = _REDUCE[name]

        def apply(x, axis=None, keepdims: bool = False, name=None):
            x = self._tensor(x)
            axes = list(range(x.shape.rank)) if axis is None else sorted(
                int(a) % x.shape.rank for a in np.atleast_1d(axis))
            if x.const is not None:
                return self.weight(np.asarray(fold(x.const, axis=tuple(axes),
                                                   keepdims=keepdims)).astype(x.dtype.dtype))
            shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape)
                          if keepdims or a not in axes)
            out, tensor = self._out(shape, x.dtype, builtin.lower())
            self._ctx.op(builtin, [x.index, self._ctx.ints(axes, "axes")], out,
                         options("ReducerOptions", keepDims=bool(keepdims)))
            return tensor

        return apply

    def broadcast_to(self, x, shape, name=None) -> Tensor:
        x = self._tensor(x)
        shape = self._static(shape, "a broadcast to a shape known only at run time")
        if x.const is not None:
            return self.weight(np.broadcast_to(x.const, shape).copy())
        if tuple(shape) == tuple(x.shape):
            return x
        out, tensor = self._out(tuple(shape), x.dtype, "broadcast_to")
        self._ctx.op("BROADCAST_TO", [x.index, self._ctx.ints(shape, "shape")], out)
        return tensor

    def tile(self, x, multiples, name=None) -> Tensor:
        x = self._tensor(x)
        multiples = self._static(multiples, "a tile by multiples known only at run time")
        if x.const is not None:
            return self.weight(np.tile(x.const, multiples))
        shape = tuple(None if d is None else d * m for d, m in zip(x.shape, multiples))
        out, tensor = self._out(shape, x.dtype, "tile")
        self._ctx.op("TILE", [x.index, self._ctx.ints(multiples, "multiples")], out)
        return tensor

    def _static(self, values, why: str) -> list[int]:
        """A shape or list of ints known now (a constant Tensor, a list of ints or constant
        Tensors)."""
        if isinstance(values, Tensor):
            if values.const is None:
                raise NotCovered(why)
            return [int(v) for v in values.const.reshape(-1)]
        found = []
        for v in values:
            v = self._tensor(v)
            if v.const is None:
                raise NotCovered(why)
            found.append(int(v.const))
        return found

    def strided_slice(self, x, begin, end, strides=None, begin_mask: int = 0,
                      end_mask: int = 0, ellipsis_mask: int = 0, new_axis_mask: int = 0,
                      shrink_axis_mask: int = 0, name=None) -> Tensor:
        """A SLICE where every stride is 1 and no axis shrinks (as TF's converter lowers a
        static strided_slice), else a STRIDED_SLICE; constant bounds only."""
        x = self._tensor(x)
        if ellipsis_mask or new_axis_mask:
            raise NotCovered("a strided slice with an ellipsis or new axes")
        why = "a strided slice with bounds known only at run time"
        begin, end = self._static(begin, why), self._static(end, why)
        strides = [1] * len(begin) if strides is None else self._static(strides, why)
        rank = x.shape.rank
        begin_mask |= sum(1 << a for a in range(len(begin), rank))  # axes not named: whole
        end_mask |= sum(1 << a for a in range(len(end), rank))
        begin, end = begin + [0] * (rank - len(begin)), end + [0] * (rank - len(end))
        strides = strides + [1] * (rank - len(strides))
        starts, counts = [], []
        for a, dim in enumerate(x.shape):
            whole = begin_mask >> a & 1 and end_mask >> a & 1 and strides[a] == 1
            if dim is None and not (whole and not shrink_axis_mask >> a & 1):
                raise NotCovered("a strided slice of a dim known only at run time")
            if dim is None:
                starts.append(0)
                counts.append(None)
                continue
            if shrink_axis_mask >> a & 1:
                start = begin[a] + dim if begin[a] < 0 else begin[a]
                starts.append(start)
                counts.append(1)
                continue
            cut = slice(None if begin_mask >> a & 1 else begin[a],
                        None if end_mask >> a & 1 else end[a], strides[a]).indices(dim)
            starts.append(cut[0])
            counts.append(len(range(*cut)))
        shape = tuple(c for a, c in enumerate(counts) if not shrink_axis_mask >> a & 1)
        if x.const is not None:
            index = tuple(s if shrink_axis_mask >> a & 1 else slice(
                None if begin_mask >> a & 1 else begin[a], None if end_mask >> a & 1 else end[a],
                strides[a]) for a, s in enumerate(starts))
            return self.weight(np.asarray(x.const[index]))
        if all(st == 1 for st in strides) and not shrink_axis_mask:
            if tuple(shape) == tuple(x.shape):
                return x
            out, tensor = self._out(shape, x.dtype, "slice")
            self._ctx.op("SLICE", [x.index, self._ctx.ints(starts, "begin"), self._ctx.ints(
                [-1 if c is None else c for c in counts], "size")], out)
            return tensor
        out, tensor = self._out(shape, x.dtype, "strided_slice")
        self._ctx.op("STRIDED_SLICE", [
            x.index, self._ctx.ints(begin, "begin"), self._ctx.ints(end, "end"),
            self._ctx.ints(strides, "strides")], out, options(
                "StridedSliceOptions", beginMask=begin_mask, endMask=end_mask,
                shrinkAxisMask=shrink_axis_mask))
        return tensor

    def slice_first(self, x, key) -> Tensor:
        """x[key]: ints, slices, new axes (None) and one Ellipsis (tf's indexing) as
        strided_slice, then a reshape that inserts the new axes."""
        x = self._tensor(x)
        key = key if isinstance(key, tuple) else (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise NotCovered(f"an indexing by {key!r}")
        if Ellipsis in key:
            at = key.index(Ellipsis)
            taken = sum(k is not None for k in key) - 1
            key = key[:at] + (slice(None),) * (x.shape.rank - taken) + key[at + 1:]
        new_axes, kept = [], 0  # output positions of the new axes
        for k in key:
            if k is None:
                new_axes.append(kept)
            kept += k is None or isinstance(k, slice)
        if new_axes:
            y = self.slice_first(x, tuple(k for k in key if k is not None))
            shape = list(y.shape)
            for at in new_axes:
                shape.insert(at, 1)
            return self.reshape(y, shape)
        begin, end, strides, begin_mask, end_mask, shrink = [], [], [], 0, 0, 0
        for a, k in enumerate(key):
            if isinstance(k, slice):
                begin.append(0 if k.start is None else int(k.start))
                end.append(0 if k.stop is None else int(k.stop))
                strides.append(1 if k.step is None else int(k.step))
                begin_mask |= (k.start is None) << a
                end_mask |= (k.stop is None) << a
            else:
                k = self._static([k], "an indexing by a run-time index")[0]
                begin.append(k)
                end.append(k + 1)
                strides.append(1)
                shrink |= 1 << a
        return self.strided_slice(x, begin, end, strides, begin_mask, end_mask,
                                  shrink_axis_mask=shrink)

    def stack(self, values, axis: int = 0, name=None) -> Tensor:
        values = [self._tensor(v) for v in values]
        if all(v.const is not None for v in values):
            return self.weight(np.stack([v.const for v in values], axis))
        values = [self.cast(v, values[0].dtype) if v.const is not None else v for v in values]
        return super().stack(values, axis)

    def concat(self, values, axis: int, name=None) -> Tensor:
        values = [self._tensor(v) for v in values]
        return super().concat(values, axis)

    def ones(self, shape, dtype=np.float32, name=None) -> Tensor:
        shape = self._static(shape, "a fill of a shape known only at run time")
        return self.weight(np.ones(shape, as_numpy(dtype)))

    def zeros(self, shape, dtype=np.float32, name=None) -> Tensor:
        shape = self._static(shape, "a fill of a shape known only at run time")
        return self.weight(np.zeros(shape, as_numpy(dtype)))

    def fill(self, dims, value, name=None) -> Tensor:
        dims = self._static(dims, "a fill of a shape known only at run time")
        value = self._tensor(value)
        if value.const is None:
            raise NotCovered("a fill with a run-time value")
        return self.weight(np.full(dims, value.const))

    def reciprocal(self, x, name=None) -> Tensor:
        x = self._tensor(x)
        return self.divide(np.asarray(1, as_numpy(x.dtype)), x)

    def gelu(self, x, approximate: bool = False, name=None) -> Tensor:
        x = self._tensor(x)
        if x.const is not None or x.dtype != np.float32:
            raise NotCovered("gelu of a constant or of a non-float32 value")
        return self._write("GELU", [x], x.dtype, options("GeluOptions",
                                                          approximate=bool(approximate)))

    def size(self, x, out_type=np.int32, name=None) -> Tensor:
        x = self._tensor(x)
        if None in x.shape:
            raise NotCovered("the size of a shape known only at run time")
        return self.weight(np.array(int(np.prod(x.shape)), as_numpy(out_type)))

    def one_hot(self, indices, depth, on_value=None, off_value=None, axis: int = -1,
                dtype=None, name=None) -> Tensor:
        indices = self._tensor(indices)
        dtype = as_numpy(dtype or (self._tensor(on_value).dtype if on_value is not None
                                    else np.float32))
        depth = self._static([depth], "a one-hot depth known only at run time")[0]
        on = self._tensor(np.asarray(1 if on_value is None else on_value, dtype))
        off = self._tensor(np.asarray(0 if off_value is None else off_value, dtype))
        on, off = self.cast(on, dtype), self.cast(off, dtype)
        axis = axis % (indices.shape.rank + 1)
        shape = (*indices.shape[:axis], depth, *indices.shape[axis:])
        out, tensor = self._out(shape, dtype, "one_hot")
        self._ctx.op("ONE_HOT", [indices.index, self._ctx.ints(np.int32(depth), "depth"),
                                 on.index, off.index], out, options("OneHotOptions", axis=axis))
        return tensor

    def _arg(self, builtin: str, x, axis=None, output_type=np.int64, name=None) -> Tensor:
        x = self._tensor(x)
        axis = 0 if axis is None else int(np.asarray(
            axis.const if isinstance(axis, Tensor) else axis)) % x.shape.rank
        if x.const is not None:
            fold = np.argmax if builtin == "ARG_MAX" else np.argmin
            return self.weight(fold(x.const, axis).astype(as_numpy(output_type)))
        shape = tuple(d for a, d in enumerate(x.shape) if a != axis)
        out, tensor = self._out(shape, output_type, builtin.lower())
        kind = "ArgMaxOptions" if builtin == "ARG_MAX" else "ArgMinOptions"
        self._ctx.op(builtin, [x.index, self._ctx.ints(np.int32(axis), "axis")], out,
                     options(kind, outputType=_tensor_type(as_numpy(output_type))))
        return tensor

    def argmax(self, x, axis=None, output_type=np.int64, name=None) -> Tensor:
        return self._arg("ARG_MAX", x, axis, output_type)

    def argmin(self, x, axis=None, output_type=np.int64, name=None) -> Tensor:
        return self._arg("ARG_MIN", x, axis, output_type)

    def bitcast(self, x, dtype, name=None) -> Tensor:
        x, dtype = self._tensor(x), as_dtype(dtype)
        if x.dtype.size != dtype.size:
            raise NotCovered("a bitcast between sizes")
        if x.const is not None:
            return self.weight(x.const.view(as_numpy(dtype)))
        out, tensor = self._out(x.shape, dtype, "bitcast")
        self._ctx.op("BITCAST", [x.index], out)
        return tensor

    def add_n(self, values, name=None) -> Tensor:
        values = [self._tensor(v) for v in values]
        if len(values) == 1:
            return values[0]
        if any(v.shape != values[0].shape or v.dtype != values[0].dtype for v in values):
            raise NotCovered("an add_n of values of several shapes or dtypes")
        if all(v.const is not None for v in values):
            return self.weight(np.sum([v.const for v in values], axis=0).astype(
                as_numpy(values[0].dtype)))
        return self._write("ADD_N", values, values[0].dtype)

    def elu(self, x, name=None) -> Tensor:
        x = self._tensor(x)
        if x.const is not None:
            return self.weight(np.where(x.const > 0, x.const, np.expm1(x.const)).astype(
                as_numpy(x.dtype)))
        return self._write("ELU", [x], x.dtype)

    def atan2(self, y, x, name=None) -> Tensor:
        y, x = self._pair(y, x)
        if y.const is not None and x.const is not None:
            return self.weight(np.arctan2(y.const, x.const).astype(as_numpy(y.dtype)))
        return self._write("ATAN2", [y, x], y.dtype)

    def _shift_fn(self, builtin: str, fold):
        def apply(a, b, name=None):
            a, b = self._pair(a, b)
            if a.const is not None and b.const is not None:
                return self.weight(np.asarray(fold(a.const, b.const)).astype(
                    as_numpy(a.dtype)))
            return self._write(builtin, [a, b], a.dtype)

        return apply

    def matmul(self, a, b, transpose_a: bool = False, transpose_b: bool = False,
               name=None) -> Tensor:
        """A FULLY_CONNECTED by a constant matrix (DirectOps.matmul), else BATCH_MATMUL."""
        a, b = self._pair(a, b)
        if a.const is not None and b.const is not None:
            x = np.swapaxes(a.const, -1, -2) if transpose_a else a.const
            y = np.swapaxes(b.const, -1, -2) if transpose_b else b.const
            return self.weight(np.matmul(x, y).astype(as_numpy(a.dtype)))
        if a.shape.rank < 2 or b.shape.rank < 2 or a.dtype != np.float32:
            raise NotCovered("a product of vectors, or of other than float32")
        if b.const is not None and b.shape.rank == 2 and not transpose_a:
            return super().matmul(a, self.weight(b.const.T.copy()) if transpose_b else b)
        m = a.shape[-1] if transpose_a else a.shape[-2]
        n = b.shape[-2] if transpose_b else b.shape[-1]
        shape = (*_broadcast(a.shape[:-2], b.shape[:-2]), m, n)
        out, tensor = self._out(shape, a.dtype, "batch_matmul")
        self._ctx.op("BATCH_MATMUL", [a.index, b.index], out, options(
            "BatchMatMulOptions", adjX=bool(transpose_a), adjY=bool(transpose_b)))
        return tensor

    def reverse(self, x, axis, name=None) -> Tensor:
        x = self._tensor(x)
        axes = [a % x.shape.rank for a in self._static(np.atleast_1d(axis), "run-time axes")]
        if x.const is not None:
            return self.weight(np.flip(x.const, axes).copy())
        out, tensor = self._out(x.shape, x.dtype, "reverse_v2")
        self._ctx.op("REVERSE_V2", [x.index, self._ctx.ints(axes, "axes")], out)
        return tensor

    def top_k(self, x, k=1, sorted: bool = True, name=None):
        """TOPK_V2 on the last axis: (values, indices int32), sorted as TFLite's kernel
        sorts them."""
        x = self._tensor(x)
        k = self._static([k], "a top-k count known only at run time")[0]
        if not sorted or x.shape[-1] is None:
            raise NotCovered("an unsorted top-k, or over a dim known only at run time")
        shape = (*x.shape[:-1], k)
        values, value_tensor = self._out(shape, x.dtype, "topk_values")
        indices, index_tensor = self._out(shape, np.int32, "topk_indices")
        self._ctx.op("TOPK_V2", [x.index, self._ctx.ints(np.int32(k), "k")], [values, indices])
        return _TopK(value_tensor, index_tensor)

    def cumsum(self, x, axis: int = 0, exclusive: bool = False, reverse: bool = False,
               name=None) -> Tensor:
        """CUMSUM (float32, int32, int64), as TF's converter writes tf.math.cumsum."""
        x = self._tensor(x)
        axis = self._static([axis], "a cumulative sum on a run-time axis")[0] % x.shape.rank
        if x.const is not None:
            values = np.flip(x.const, axis) if reverse else x.const
            total = np.cumsum(values, axis).astype(values.dtype)
            if exclusive:
                total = total - values
            return self.weight(np.flip(total, axis).copy() if reverse else total)
        out, tensor = self._out(x.shape, x.dtype, "cumsum")
        self._ctx.op("CUMSUM", [x.index, self._ctx.ints(np.int32(axis), "axis")], out,
                     options("CumsumOptions", exclusive=bool(exclusive),
                             reverse=bool(reverse)))
        return tensor

    def zeros_like(self, x, dtype=None, name=None) -> Tensor:
        return self._filled(x, 0, dtype)

    def ones_like(self, x, dtype=None, name=None) -> Tensor:
        return self._filled(x, 1, dtype)

    def _filled(self, x, value, dtype) -> Tensor:
        x = self._tensor(x)
        if None in x.shape:
            raise NotCovered("a fill of a shape known only at run time")
        return self.weight(np.full(x.shape, value, as_numpy(dtype or x.dtype)))

    def range(self, start, limit=None, delta=1, dtype=None, name=None) -> Tensor:
        if limit is None:  # tf.range(n)
            start, limit = 0, start
        tensors = [v for v in (start, limit, delta) if isinstance(v, Tensor)]
        values = [self._tensor(v) for v in (start, limit, delta)]
        if any(v.const is None for v in values):
            raise NotCovered("a range known only at run time")
        if dtype is None:  # tf's: the tensors', else int32 or float32 for Python numbers
            dtype = tensors[0].dtype if tensors else np.result_type(*[v.const for v in values])
        array = np.arange(*[v.const for v in values])
        return self.weight(array.astype(as_numpy(dtype)))

    def softmax(self, x, axis: int = -1, name=None) -> Tensor:
        return self._softmax("SOFTMAX", x, axis)

    def log_softmax(self, x, axis: int = -1, name=None) -> Tensor:
        return self._softmax("LOG_SOFTMAX", x, axis)

    def _softmax(self, builtin: str, x, axis: int) -> Tensor:
        x = self._tensor(x)
        if x.const is not None or axis % x.shape.rank != x.shape.rank - 1:
            raise NotCovered(f"a {builtin.lower()} of a constant or over other than the last axis")
        opts = options("SoftmaxOptions", beta=1.0) if builtin == "SOFTMAX" else None
        return self._write(builtin, [x], x.dtype, opts)


def _tensor_type(dtype: np.dtype) -> int:
    return TYPES[np.dtype(dtype)]


class _TopK(tuple):
    """tf.math.top_k's result: (values, indices), also by name."""

    def __new__(cls, values: Tensor, indices: Tensor):
        return super().__new__(cls, (values, indices))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])


class _ConstantMeta(type):
    def __instancecheck__(cls, value) -> bool:
        return isinstance(value, Tensor) and value.const is not None


class _EagerTensor(metaclass=_ConstantMeta):
    """tf.__internal__.EagerTensor for handler code: a Tensor of a value known now."""


class RecordingContext:
    """The NodeContext a handler reads (translate/context.py), over a DirectContext: the
    same attributes, constants, shapes and perms, with its inputs as the Recorder's
    tensors."""

    in_layer = False

    def __init__(self, ctx, recorder: Recorder):
        self._ctx, self._recorder = ctx, recorder

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def x(self, i: int) -> Tensor:
        return self._recorder.node_input(i)

    def const_tensor(self, array) -> Tensor:
        return self._recorder.weight(np.asarray(array))

    def value(self, name: str):
        raise NotCovered("a subgraph's read of its enclosing scope")


def record_handler(handler, ctx) -> list:
    """The node of `ctx` (a DirectContext) written by running `handler`'s function on the
    Recorder: its outputs as tensor indices or constant arrays (ONNX order)."""
    recorder = Recorder(ctx)
    try:
        with standing_in(tf=recorder, tf_keras=_NoKeras()), _tensorflow_not_imported():
            result = handler.fn(RecordingContext(ctx, recorder))
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        # as the builder: one result per named output, the rest unread
        values = recorder.outputs([r if name else None for r, name in zip(
            results, ctx.node.outputs)])
    except (AttributeError, TypeError, ValueError, IndexError, KeyError,
            NotImplementedError) as error:  # what the tensors here do not have
        raise NotCovered(f"its handler's code needs more than the direct writer's tensors "
                         f"({type(error).__name__}: {error})") from None
    return [P.to_onnx_order(v, ctx.out_perm(j)) if isinstance(v, np.ndarray) else v
            for j, v in enumerate(values)]


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Refuses to import TensorFlow: a handler that imports it itself (not through
    translate/lazy.tf) is not written here, and a `-dms` run keeps from TF's import."""

    def find_spec(self, name: str, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tf_keras", "keras"):
            raise NotCovered(f"its handler's code imports {name}")


@contextlib.contextmanager
def _tensorflow_not_imported():
    finder = _TensorFlowFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _NoKeras:
    def __getattr__(self, name: str):
        raise NotCovered(f"tf_keras.{name} in the direct writer")
