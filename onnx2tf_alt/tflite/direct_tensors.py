"""Tensors for the direct writers of ops whose handler computes with tf's API, so that the
handler's code stays the one place where the op's semantics live (ops/rnn.py: its
recurrences take the tf namespace as `ops`). `Tensor` adds, subtracts and multiplies;
`DirectOps` has the few tf functions that code calls. Each writes the TFLite builtins TF's
converter writes for the same calls; a function it does not have raises NotCovered, and
the model goes through TF's converter.

A product with a constant matrix waits for its use: adding a vector of its width makes the
vector the FULLY_CONNECTED op's bias (TF's converter fuses that ADD), any other use writes
it without one. Constants stay numpy arrays until an op reads them. A reshape that only
adds leading unit axes is a view: ops that broadcast, and FULLY_CONNECTED, read its
source, and the RESHAPE is written only for the others (as TF's converter drops it).
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatgraph import NotCovered, options
from onnx2tf_alt.tflite.tf_dtypes import as_dtype

_OPTIONS = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions",
            "MINIMUM": None, "MAXIMUM": None}
_FOLD = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MINIMUM": np.minimum,
         "MAXIMUM": np.maximum}


class Shape(tuple):
    """A physical shape (None: the batch, known at run time), read as tf.TensorShape."""

    @property
    def rank(self) -> int:
        return len(self)

    def as_list(self) -> list:
        return list(self)

    def is_fully_defined(self) -> bool:
        return None not in self

    def num_elements(self) -> int | None:
        return int(np.prod(self)) if None not in self else None


class TensorShape:
    """tf.TensorShape for handler code: dims (None: unknown), or an unknown rank."""

    def __init__(self, dims=None):
        self.dims = None if dims is None else tuple(None if d is None else int(d)
                                                    for d in dims)

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def as_list(self) -> list:
        return list(self.dims)

    def is_fully_defined(self) -> bool:
        return self.dims is not None and None not in self.dims

    def num_elements(self) -> int | None:
        return int(np.prod(self.dims)) if self.is_fully_defined() else None

    def __iter__(self):
        return iter(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    def __getitem__(self, key):
        return TensorShape(self.dims[key]) if isinstance(key, slice) else self.dims[key]

    def __eq__(self, other) -> bool:
        other = other.dims if isinstance(other, TensorShape) else (
            None if other is None else tuple(other))
        return self.dims == other

    __hash__ = None


class TensorSpec:
    """tf.TensorSpec for handler code: a shape and a dtype."""

    def __init__(self, shape, dtype, name=None):
        self.shape = shape if isinstance(shape, TensorShape) else TensorShape(
            None if shape is None else list(shape))
        self.dtype = as_dtype(dtype)


class Tensor:
    """A value of one node's direct writer: a flatbuffer tensor, a constant array, or a
    product not written yet (see the module's docstring)."""

    def __init__(self, ops: DirectOps, shape, index: int | None = None,
                 const: np.ndarray | None = None, product: tuple | None = None,
                 view: Tensor | None = None, dtype=None):
        self._ops, self.shape = ops, Shape(shape)
        self._index, self.const, self.product, self.view = index, const, product, view
        # the flat graph `index` is in: the one written when it was made (an IF branch's,
        # a WHILE body's, or the model's)
        self.owner = None if index is None else ops.target()
        if dtype is None:
            dtype = np.float32 if const is None else const.dtype
        self.dtype = as_dtype(dtype)
        self.dense_weight: dict = {}  # a constant matrix's FULLY_CONNECTED weights, by graph
        self.derived: dict = {}  # reshapes and slices of it, written once (in each graph)

    # numpy's operators defer to this class's reflected ones (array * Tensor is a Tensor)
    __array_priority__ = 1000

    def numpy(self) -> np.ndarray:
        """The value of a constant (tf's EagerTensor.numpy)."""
        if self.const is None:
            raise NotCovered("the value of a tensor known only at run time")
        return self.const

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.numpy(), dtype)

    def __int__(self) -> int:
        return int(self.numpy())

    __index__ = __int__

    def __float__(self) -> float:
        return float(self.numpy())

    @property
    def index(self) -> int:
        """The tensor's index in the flat graph being written (written at its first use;
        read from an enclosing graph, an input of this one: DirectOps.local)."""
        return self._ops.local(self)

    def __add__(self, other):
        return self._ops.add(self, other)

    def __radd__(self, other):
        return self._ops.add(other, self)

    def __sub__(self, other):
        return self._ops.binary("SUB", self, other)

    def __rsub__(self, other):
        return self._ops.binary("SUB", other, self)

    def __mul__(self, other):
        return self._ops.binary("MUL", self, other)

    def __rmul__(self, other):
        return self._ops.binary("MUL", other, self)

    def __getitem__(self, key):
        return self._ops.slice_first(self, key)

    def set_shape(self, shape) -> None:
        """What is known of the dims (tf's set_shape): unknown ones take the given."""
        dims = list(shape)
        if len(dims) == len(self.shape):
            self.shape = Shape(d if d is not None else g for d, g in zip(self.shape, dims))

    def _call(name: str, swap: bool = False):
        def operator(self, other=None):
            function = getattr(self._ops, name)  # NotCovered where the ops have none
            if other is None:
                return function(self)
            return function(other, self) if swap else function(self, other)

        return operator

    __gt__, __lt__ = _call("greater"), _call("less")
    __ge__, __le__ = _call("greater_equal"), _call("less_equal")
    __truediv__, __rtruediv__ = _call("truediv"), _call("truediv", swap=True)
    __floordiv__, __rfloordiv__ = _call("floordiv"), _call("floordiv", swap=True)
    __mod__, __rmod__ = _call("floormod"), _call("floormod", swap=True)
    __and__, __or__, __invert__ = _call("logical_and"), _call("logical_or"), _call("logical_not")
    __neg__ = _call("negative")
    del _call


class _Namespace:
    """tf.nn, tf.linalg, tf.math: the functions given, NotCovered for the rest."""

    def __init__(self, prefix: str, **functions):
        self._prefix = prefix
        self.__dict__.update(functions)

    def __getattr__(self, name: str):
        raise NotCovered(f"tf.{self._prefix}.{name} in the direct writer")


class DirectOps:
    """The tf namespace of a handler's code, writing into one node's DirectContext."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._count = 0
        self._inputs: dict[int, Tensor] = {}
        self.nn = _Namespace("nn", relu=lambda x: self._unary("RELU", x),
                             leaky_relu=self._leaky_relu)
        self.linalg = _Namespace("linalg", matmul=self.matmul)
        self.math = _Namespace("math")

    def __getattr__(self, name: str):
        raise NotCovered(f"tf.{name} in the direct writer")

    # --- values ------------------------------------------------------------------------
    float32 = np.float32

    def target(self):
        """The flat graph being written."""
        return self._ctx.flat

    def local(self, t: Tensor) -> int:
        """t's index in the graph being written, written there at its first use."""
        if t._index is None:
            t._index, t.owner = self.materialize(t), self.target()
        return t._index

    def node_input(self, i: int) -> Tensor:
        value = getattr(self._ctx, "x_constant", lambda _: None)(i)
        if value is not None:  # folds with what reads it, as TF's converter folds it
            return self.weight(value)
        index = self._ctx.x(i)
        if index not in self._inputs:
            self._inputs[index] = Tensor(self, self._ctx.flat.shape(index), index=index,
                                         dtype=self._ctx.flat.dtype(index))
        return self._inputs[index]

    def node_value(self, index: int) -> Tensor:
        """A float32 tensor the node's writer has written itself."""
        return Tensor(self, self._ctx.flat.shape(index), index=index)

    def weight(self, array) -> Tensor:
        array = np.asarray(array)
        return Tensor(self, array.shape, const=array)

    constant = weight

    def outputs(self, results: list) -> list:
        """The node's outputs (Tensors, None where not wanted) as tensor indices, each of
        the physical shape its perm gives it."""
        indices = []
        for j, value in enumerate(results):
            if value is None:
                indices.append(None)
                continue
            value = self._tensor(value)
            if value.const is not None:
                raise NotCovered("a constant output")
            want = self._ctx.out_phys_shape(j)
            if want is None or tuple(value.shape) != tuple(want):
                raise NotCovered(f"output {j} came out {list(value.shape)}, "
                                 f"planned {want}")
            indices.append(value.index)
        return indices

    def _tensor(self, value) -> Tensor:
        if isinstance(value, Tensor):
            return value
        return self.weight(np.asarray(value, np.float32))

    def _temp(self, shape, kind: str, dtype=np.float32) -> int:
        self._count += 1
        return self._ctx.temp(shape, f"{kind}_{self._count}", np.dtype(dtype))

    def materialize(self, t: Tensor) -> int:
        if t.const is not None:
            return self._ctx.weight(t.const, "const")
        if t.view is not None:
            out = self._temp(t.shape, "reshape", t.dtype)
            self._ctx.reshape(t.view.index, t.shape, out)
            return out
        x, matrix, bias = t.product
        if x.view is not None and x.shape.rank <= 2:  # FULLY_CONNECTED flattens it alike
            x = x.view
        here = id(self.target())
        if here not in matrix.dense_weight:  # one copy for every product with it
            matrix.dense_weight[here] = self._ctx.weight(
                np.ascontiguousarray(matrix.const.T, np.float32), "matrix")
        inputs = [x.index, matrix.dense_weight[here],
                  *([] if bias is None else [bias.index])]
        out = self._temp(t.shape, "dense")
        self._ctx.op("FULLY_CONNECTED", inputs, out, options(
            "FullyConnectedOptions", fusedActivationFunction=0, keepNumDims=x.shape.rank > 2))
        return out

    # --- arithmetic ----------------------------------------------------------------------
    def matmul(self, a, b, transpose_b: bool = False) -> Tensor:
        """a @ b with a constant 2-D b: a FULLY_CONNECTED written at its first use."""
        a, b = self._tensor(a), self._tensor(b)
        if b.const is None or b.const.ndim != 2 or transpose_b or a.shape.rank < 2:
            raise NotCovered("a product with run-time weights or of a vector")
        if a.shape[-1] != b.shape[0]:
            raise NotCovered(f"a product of {list(a.shape)} and {list(b.shape)}")
        return Tensor(self, (*a.shape[:-1], b.shape[1]), product=(a, b, None))

    def add(self, a, b) -> Tensor:
        a, b = self._tensor(a), self._tensor(b)
        for product, vector in ((a, b), (b, a)):
            if (product.product is not None and product.product[2] is None
                    and vector.shape == (product.shape[-1],)):
                x, matrix, _ = product.product
                return Tensor(self, product.shape, product=(x, matrix, vector))
        return self.binary("ADD", a, b)

    def binary(self, name: str, a, b) -> Tensor:
        a, b = self._tensor(a), self._tensor(b)
        if a.const is not None and b.const is not None:
            return self.weight(_FOLD[name](a.const, b.const).astype(np.float32))
        shape = _broadcast(a.shape, b.shape)
        a, b = next((x, y) for x, y in ((a.view or a, b.view or b), (a.view or a, b),
                                        (a, b.view or b), (a, b))
                    if _broadcast(x.shape, y.shape) == shape)
        out = self._temp(shape, name.lower())
        kind = _OPTIONS[name]
        self._ctx.op(name, [a.index, b.index], out,
                     None if kind is None else options(kind, fusedActivationFunction=0))
        return Tensor(self, shape, index=out)

    def minimum(self, a, b) -> Tensor:
        return self.binary("MINIMUM", a, b)

    def maximum(self, a, b) -> Tensor:
        return self.binary("MAXIMUM", a, b)

    def clip_by_value(self, x, low, high) -> Tensor:
        return self.maximum(self.minimum(x, high), low)

    def _unary(self, name: str, x, opts=None) -> Tensor:
        x = self._tensor(x)
        out = self._temp(x.shape, name.lower())
        self._ctx.op(name, [x.index], out, opts)
        return Tensor(self, x.shape, index=out)

    def _leaky_relu(self, x, alpha: float = 0.2) -> Tensor:
        return self._unary("LEAKY_RELU", x, options("LeakyReluOptions", alpha=float(alpha)))

    def sigmoid(self, x) -> Tensor:
        return self._unary("LOGISTIC", x)

    def tanh(self, x) -> Tensor:
        return self._unary("TANH", x)

    # --- shapes ------------------------------------------------------------------------
    def reshape(self, x, dims) -> Tensor:
        """RESHAPE to `dims` (one None: -1), as translate/context.reshape; none when the
        shape does not change."""
        x = self._tensor(x)
        dims = [None if d is None else int(d) for d in dims]
        if sum(d is None for d in dims) > 1:
            raise NotCovered("a reshape to several unknown dims")
        if None in dims and None not in x.shape:
            known = int(np.prod([d for d in dims if d is not None]))
            dims = [int(np.prod(x.shape)) // known if d is None else d for d in dims]
        if x.const is not None and None not in dims:
            return self.weight(x.const.reshape(dims))
        if tuple(dims) == tuple(x.shape):
            return x
        key = ("reshape", tuple(dims), id(self.target()))
        if key not in x.derived:
            x.derived[key] = self._reshaped(x, dims)
        return x.derived[key]

    def _reshaped(self, x: Tensor, dims: list) -> Tensor:
        source = x.view or x
        extra = len(dims) - source.shape.rank
        if (source._index is not None and extra > 0 and tuple(dims[extra:]) == source.shape
                and set(dims[:extra]) == {1}):
            return Tensor(self, dims, view=source, dtype=x.dtype)
        out = self._temp(dims, "reshape", x.dtype)
        self._ctx.reshape(x.index, dims, out)
        return Tensor(self, dims, index=out, dtype=x.dtype)

    def slice_first(self, x: Tensor, key) -> Tensor:
        """x[start:stop] of the first axis (a STRIDED_SLICE, as TF's converter writes it)."""
        if (not isinstance(key, slice) or key.step not in (None, 1) or None in x.shape
                or x.const is not None):
            raise NotCovered(f"an indexing by {key!r}")
        start, stop, _ = key.indices(x.shape[0])
        cached = ("slice", start, stop, id(self.target()))
        if cached not in x.derived:
            shape = (max(stop - start, 0), *x.shape[1:])
            out = self._temp(shape, "strided_slice", x.dtype)
            rank = x.shape.rank
            self._ctx.op("STRIDED_SLICE", [
                x.index, self._ctx.ints([start] + [0] * (rank - 1), "begin"),
                self._ctx.ints([stop, *x.shape[1:]], "end"), self._ctx.ints([1] * rank, "strides")],
                out, options("StridedSliceOptions"))
            x.derived[cached] = Tensor(self, shape, index=out, dtype=x.dtype)
        return x.derived[cached]

    def slice(self, x, begin, size) -> Tensor:
        """SLICE (a size of -1: the rest of the dim)."""
        x = self._tensor(x)
        shape = tuple(d - b if s == -1 else s for b, s, d in zip(begin, size, x.shape))
        if None in shape[1:]:
            raise NotCovered(f"a slice of {list(x.shape)} with unknown sizes")
        out = self._temp(shape, "slice", x.dtype)
        self._ctx.op("SLICE", [x.index, self._ctx.ints(begin, "begin"),
                               self._ctx.ints([-1 if d is None else d for d in shape], "size")],
                     out)
        return Tensor(self, shape, index=out, dtype=x.dtype)

    def pad(self, x, paddings) -> Tensor:
        """PAD with zeros."""
        x = self._tensor(x)
        shape = tuple(None if d is None else d + lo + hi for d, (lo, hi) in zip(x.shape, paddings))
        out = self._temp(shape, "pad", x.dtype)
        self._ctx.op("PAD", [x.index, self._ctx.ints(paddings, "paddings")], out)
        return Tensor(self, shape, index=out, dtype=x.dtype)

    def split(self, x, num_or_sizes, axis: int = 0) -> list[Tensor]:
        """SPLIT into equal parts, SPLIT_V into sizes."""
        x = self._tensor(x)
        axis %= x.shape.rank
        equal = isinstance(num_or_sizes, int)
        sizes = [x.shape[axis] // num_or_sizes] * num_or_sizes if equal else list(num_or_sizes)
        if x.shape[axis] is None or sum(sizes) != x.shape[axis]:
            raise NotCovered(f"a split of {list(x.shape)} into {sizes} on axis {axis}")
        outs = [self._temp(_with(x.shape, axis, s), "split", x.dtype) for s in sizes]
        where = self._ctx.ints(np.int32(axis), "axis")
        if equal:
            self._ctx.op("SPLIT", [where, x.index], outs,
                         options("SplitOptions", numSplits=len(sizes)))
        else:
            self._ctx.op("SPLIT_V", [x.index, self._ctx.ints(sizes, "sizes"), where], outs,
                         options("SplitVOptions", numSplits=len(sizes)))
        return [Tensor(self, _with(x.shape, axis, s), index=o, dtype=x.dtype)
                for s, o in zip(sizes, outs)]

    def delegated_split(self, x, sizes, axis: int) -> list[Tensor]:
        """As ops/_shapes.delegated_split: equal parts as one SPLIT, unequal ones as one
        SLICE each (the XNNPACK delegate takes no SPLIT_V)."""
        x = self._tensor(x)
        if len(set(sizes)) == 1:
            return self.split(x, len(sizes), axis)
        if None in x.shape:
            return self.split(x, sizes, axis)
        axis %= x.shape.rank
        parts, start = [], 0
        for size in sizes:
            shape = _with(x.shape, axis, size)
            out = self._temp(shape, "slice", x.dtype)
            begin = [start if a == axis else 0 for a in range(x.shape.rank)]
            self._ctx.op("SLICE", [x.index, self._ctx.ints(begin, "begin"),
                                   self._ctx.ints(shape, "size")], out)
            parts.append(Tensor(self, shape, index=out, dtype=x.dtype))
            start += size
        return parts

    def unstack(self, x, num: int | None = None, axis: int = 0) -> list[Tensor]:
        x = self._tensor(x)
        axis %= x.shape.rank
        count = x.shape[axis]
        if count is None or (num is not None and num != count):
            raise NotCovered(f"an unstack of {list(x.shape)} on axis {axis}")
        shape = x.shape[:axis] + x.shape[axis + 1:]
        outs = [self._temp(shape, "unstack", x.dtype) for _ in range(count)]
        self._ctx.op("UNPACK", [x.index], outs, options("UnpackOptions", num=count, axis=axis))
        return [Tensor(self, shape, index=o, dtype=x.dtype) for o in outs]

    def stack(self, values, axis: int = 0) -> Tensor:
        """PACK; a RESHAPE for one value."""
        values = [self._tensor(v) for v in values]
        shape = values[0].shape
        if any(v.shape != shape for v in values):
            raise NotCovered("a stack of values of several shapes")
        axis %= shape.rank + 1
        out_shape = (*shape[:axis], len(values), *shape[axis:])
        if len(values) == 1:
            return self.reshape(values[0], out_shape)
        if any(v.dtype != values[0].dtype for v in values):
            raise NotCovered("a stack of values of several dtypes")
        out = self._temp(out_shape, "stack", values[0].dtype)
        self._ctx.op("PACK", [v.index for v in values], out,
                     options("PackOptions", valuesCount=len(values), axis=axis))
        return Tensor(self, out_shape, index=out, dtype=values[0].dtype)

    def concat(self, values, axis: int) -> Tensor:
        values = [self._tensor(v) for v in values]
        rank = values[0].shape.rank
        axis %= rank
        if all(v.const is not None for v in values):
            return self.weight(np.concatenate([v.const for v in values], axis))
        if any(v.shape.rank != rank or v.shape[axis] is None for v in values):
            raise NotCovered("a concatenation of unknown sizes")
        if any(v.dtype != values[0].dtype for v in values):
            raise NotCovered("a concatenation of values of several dtypes")
        shape = _with(values[0].shape, axis, sum(v.shape[axis] for v in values))
        out = self._temp(shape, "concat", values[0].dtype)
        self._ctx.op("CONCATENATION", [v.index for v in values], out,
                     options("ConcatenationOptions", axis=axis, fusedActivationFunction=0))
        return Tensor(self, shape, index=out, dtype=values[0].dtype)


def _with(shape, axis: int, size: int) -> tuple:
    return tuple(size if a == axis else d for a, d in enumerate(shape))


def _broadcast(a: tuple, b: tuple) -> tuple:
    """numpy's broadcast of two shapes, None (the batch) where either is unknown and the
    other is not a larger dim."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x is None or y is None:
            known = y if x is None else x
            out.append(None if known in (1, None) else known)
        elif x == 1 or x == y:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            raise NotCovered(f"shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(out)
