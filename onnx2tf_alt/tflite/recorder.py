"""A handler's own code run by the direct writer (issue 48: one place per op's semantics).

A node without a `@direct` writer, or with integer or boolean values, is written by running
its handler's function as the TF route does, on a `RecordingContext` whose inputs are the
direct writer's tensors (tflite/direct_tensors.Tensor) and with `tf` standing for a
`Recorder` (translate/lazy.standing_in): each tf function the handler calls writes the
TFLite builtin TF's converter writes for it, or folds constants with numpy as TF's converter
folds them. A function the recorder does not have raises NotCovered, and the model goes
through TF's converter (said at `-v info`).

Sizes, bounds, axes and counts computed at run time are the builtins' run-time inputs (a dim
known only then is None in a Tensor's shape). `tf.cond` and `tf.while_loop` (ops/control.py's
If, Loop and Scan) write IF and WHILE ops whose branches and bodies are subgraphs of the
file, each written into its own FlatGraph (`_Branch`), the enclosing values they read
passed in as inputs.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys

import numpy as np

from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.tflite.direct_rewrites import rewrite
from onnx2tf_alt.tflite.direct_tensors import (
    DirectOps,
    Tensor,
    TensorShape,
    TensorSpec,
    _broadcast,
    _Namespace,
)
from onnx2tf_alt.tflite.flatbuffer import schema
from onnx2tf_alt.tflite.flatgraph import TYPES, FlatGraph, NotCovered, Part, options
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
    TensorShape, TensorSpec = TensorShape, TensorSpec

    def __init__(self, ctx):
        super().__init__(ctx)
        self._branches: list[_Branch] = []  # the IF branches being written, innermost last
        unary = {name: self._unary_fn(name) for name in _UNARY}
        self.nn = _Namespace("nn", relu=unary["relu"], relu6=unary["relu6"],
                             leaky_relu=self._leaky_relu, gelu=self.gelu, elu=self.elu,
                             softmax=self.softmax, log_softmax=self.log_softmax,
                             conv2d=self.conv2d, depthwise_conv2d=self.depthwise_conv2d,
                             conv2d_transpose=self.conv_transpose,
                             conv3d_transpose=self.conv_transpose,
                             max_pool2d=self._pool_fn("MAX_POOL_2D"),
                             avg_pool2d=self._pool_fn("AVERAGE_POOL_2D"),
                             bias_add=lambda x, bias, name=None: self.add(x, bias),
                             local_response_normalization=self.local_response_normalization,
                             softsign=self.softsign,
                             depth_to_space=self._blocks_fn("DEPTH_TO_SPACE"),
                             space_to_depth=self._blocks_fn("SPACE_TO_DEPTH"))
        self.bitwise = _Namespace(
            "bitwise", bitwise_xor=self._shift_fn("BITWISE_XOR", np.bitwise_xor),
            right_shift=self._shift_fn("RIGHT_SHIFT", np.right_shift))
        self.math = _Namespace("math", **{k: v for k, v in unary.items()},
                               floormod=self._binary_fn("floormod"),
                               reciprocal=self.reciprocal, divide=self.divide,
                               argmax=self.argmax, argmin=self.argmin, atan2=self.atan2,
                               top_k=self.top_k, cumsum=self.cumsum,
                               floordiv=self._binary_fn("floordiv"),
                               **{k: self._binary_fn(k) for k in _BINARY if k not in (
                                   "floormod", "floordiv")},
                               **{k: self._compare_fn(k) for k in _COMPARE},
                               **{k: self._reduce_fn(k) for k in _REDUCE},
                               truncatediv=self.truncatediv,
                               **{f"unsorted_segment_{k}": self._segment_fn(k)
                                  for k in ("sum", "max", "min", "prod")})
        self.random = _Namespace("random", uniform=self._random_fn("RANDOM_UNIFORM"),
                                 normal=self._random_fn("RANDOM_STANDARD_NORMAL"))
        self.image = _Namespace("image", non_max_suppression=self.non_max_suppression)
        self.compat = _Namespace("compat", v1=_Namespace("v1", image=_Namespace(
            "image", resize_nearest_neighbor=self._resize_fn("RESIZE_NEAREST_NEIGHBOR"),
            resize_bilinear=self._resize_fn("RESIZE_BILINEAR"))))
        self.newaxis = None
        self.__dict__.update(unary)
        self.__dict__.update({k: self._binary_fn(k) for k in _BINARY})
        self.__dict__.update({k: self._compare_fn(k) for k in _COMPARE})
        self.__dict__.update({k: self._reduce_fn(k) for k in _REDUCE})
        self.__dict__.update(DTYPES)
        self.__internal__ = _Namespace("__internal__", EagerTensor=_EagerTensor)
        self.float32 = DTYPES["float32"]

    def __getattr__(self, name: str):
        raise NotCovered(f"tf.{name} in the direct writer")

    # --- graphs: the model's, and the IF branches it runs ------------------------------
    def local(self, t: Tensor) -> int:
        """t's index in the graph being written: where it was written; a constant, a view
        or a product written again in each graph that reads it; a value of an enclosing
        graph read inside a branch, an input of the branch (IF passes it in)."""
        flat = self.target()
        if t._index is not None and t.owner is flat:
            return t._index
        if t._index is None or t.const is not None or t.view is not None or t.product:
            key = ("written in", id(flat))
            if t._index is None:
                t._index, t.owner = self.materialize(t), flat
                return t._index
            if key not in t.derived:
                t.derived[key] = self.materialize(t)
            return t.derived[key]
        if not self._branches:
            raise NotCovered("a value of a graph the direct writer has left")
        return self._branches[-1].capture(t)

    def cond(self, pred, true_fn, false_fn, name=None):
        """IF of two branches, each written into its own subgraph, with the values of this
        graph they read as inputs (a constant condition runs one branch here)."""
        pred = self._scalar(pred, np.bool_)
        if pred.const is not None:
            return (true_fn if pred.const else false_fn)()
        branches = [self._branch(fn, kind) for fn, kind in ((true_fn, "then"),
                                                            (false_fn, "else"))]
        results = [b.results for b in branches]
        if len(results[0]) != len(results[1]):
            raise NotCovered("If branches with different numbers of outputs")
        read = _read_by(branches)
        outputs, tensors = [], []
        for first, second in zip(*results):
            if first.dtype != second.dtype or first.shape.rank != second.shape.rank:
                raise NotCovered("If branches with outputs of different dtypes or ranks")
            shape = tuple(a if a == b else None for a, b in zip(first.shape, second.shape))
            index, tensor = self._out(shape, first.dtype, "if")
            outputs.append(index)
            tensors.append(tensor)
        parts = {field: b.part(read, f"{self._ctx.node.name}/{b.kind}")
                 for field, b in zip(("thenSubgraphIndex", "elseSubgraphIndex"), branches)}
        self.target().subgraph_op("IF", [pred.index, *(self.local(t) for t in read)], outputs,
                                  "IfOptions", **parts)
        return tensors if branches[0].several else tensors[0]

    def while_loop(self, cond, body, loop_vars, shape_invariants=None, name=None):
        """WHILE: `cond` and `body` each written into a subgraph taking every loop value
        (nested tuples flattened) and, after them, the values of this graph they read
        (passed through by the body). A value's dims that change between steps are
        unknown in both (its `shape_invariants`)."""
        values, rebuild = _flatten(loop_vars)
        values = [self._tensor(v) for v in values]
        shapes = values if shape_invariants is None else _flatten(shape_invariants)[0]
        if len(shapes) != len(values):
            raise NotCovered("shape invariants that do not match the loop values")
        specs = [(tuple(v.shape) if s is v else _invariant(s, v), v.dtype)
                 for v, s in zip(values, shapes)]
        test = self._branch(lambda *vs: cond(*rebuild(list(vs))), "cond", specs)
        step = self._branch(lambda *vs: _flatten(body(*rebuild(list(vs))))[0], "body", specs)
        if len(step.results) != len(values):
            raise NotCovered("a loop body whose outputs do not match its values")
        read = _read_by([test, step])
        outputs, tensors = [], []
        for (shape, dtype) in specs:
            index, tensor = self._out(shape, dtype, "while")
            outputs.append(index)
            tensors.append(tensor)
        extra = [self._out(t.shape, t.dtype, "while_read")[0] for t in read]
        parts = {"condSubgraphIndex": test.part(read, f"{self._ctx.node.name}/cond"),
                 "bodySubgraphIndex": step.part(read, f"{self._ctx.node.name}/body",
                                                passed=True)}
        inputs = [self.local(v) for v in values] + [self.local(t) for t in read]
        self.target().subgraph_op("WHILE", inputs, outputs + extra, "WhileOptions", **parts)
        return rebuild(tensors)

    def _branch(self, fn, kind: str, formal: list | None = None) -> _Branch:
        """`fn` run with its ops written into a new subgraph; `formal`: (shape, dtype) of
        the subgraph's own inputs, fed to fn as Tensors (a WHILE's loop values)."""
        branch = _Branch(self, kind)
        ctx, writer = self._ctx, self._ctx._writer
        saved = ctx.flat, writer.flat
        ctx.flat = writer.flat = branch.flat
        self._branches.append(branch)
        try:
            args = []
            for k, (shape, dtype) in enumerate(formal or []):
                index = branch.flat.tensor(f"{kind}_value_{k}", shape, as_numpy(dtype),
                                           dynamic=True)
                branch.formal.append(index)
                args.append(Tensor(self, shape, index=index, dtype=dtype))
            result = fn(*args)
            branch.several = isinstance(result, (list, tuple))
            branch.results = [self._tensor(r) for r in (result if branch.several else [result])]
            branch.outputs = [self.local(r) for r in branch.results]
        finally:
            self._branches.pop()
            ctx.flat, writer.flat = saved
        rewrite(branch.flat, branch.outputs)
        return branch

    def run_subgraph(self, graph, plan, feeds: dict) -> list:
        """A prepared, planned subgraph (an If branch, a Loop body) written into the graph
        being written, its nodes by their writers as the model's
        (tflite/direct.DirectWriter.run_subgraph), on `feeds` (Tensors, or arrays for
        constants, in ONNX order); its outputs, in ONNX order."""
        fed = {}
        for name, value in feeds.items():
            value = value if isinstance(value, np.ndarray) else self._tensor(value)
            if isinstance(value, Tensor) and value.const is not None:
                value = value.const
            fed[name] = value if isinstance(value, np.ndarray) else (self.local(value),
                                                                   value.shape.rank)
        flat, outputs = self.target(), []
        for value in self._ctx._writer.run_subgraph(graph, plan, fed):
            outputs.append(self.weight(value) if isinstance(value, np.ndarray) else Tensor(
                self, flat.shape(value), index=value, dtype=flat.dtype(value)))
        return outputs

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
        return self.constant(value, dtype)

    def constant(self, value, dtype=None, shape=None) -> Tensor:
        """Python numbers and lists as tf converts them (int32, float32), arrays as they
        are."""
        if dtype is None and not isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            array = array.astype({"i": np.int32, "f": np.float32}.get(array.dtype.kind,
                                                                         array.dtype))
        else:
            array = np.asarray(value, None if dtype is None else as_numpy(dtype))
        return self.weight(array if shape is None else np.broadcast_to(array, shape).copy())

    def identity(self, x) -> Tensor:
        return self._tensor(x)

    def _tensor(self, value, like: Tensor | None = None) -> Tensor:
        """A Tensor of `value`; a Python number takes `like`'s dtype (as tf's operators
        convert a scalar beside a tensor)."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, (list, tuple)) and _holds_tensors(value):  # tf packs them
            return self.stack([self._tensor(v) for v in value])
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
        index = self._ctx.flat.tensor(name, shape, as_numpy(dtype), dynamic=True)
        return index, Tensor(self, shape, index=index, dtype=dtype)

    def _temp(self, shape, kind: str, dtype=np.float32) -> int:
        return self._out(shape, dtype, kind)[0]

    def _vector(self, values) -> Tensor:
        """`values` (a Tensor, or a list of ints and scalar or one-element Tensors) as one
        1-D int32 Tensor: a constant where every value is known, else the run-time values
        gathered (a CONCATENATION of the known and the computed)."""
        if isinstance(values, Tensor):
            if values.shape.rank > 1:
                raise NotCovered(f"a {values.shape.rank}-D list of sizes")
            vector = values if values.shape.rank == 1 else self.reshape(values, [1])
            return self.cast(vector, np.int32)
        items = [self._tensor(v) for v in values]
        if all(i.const is not None for i in items):
            return self.weight(np.array([int(np.asarray(i.const).reshape(-1)[0])
                                         for i in items], np.int32).reshape(len(items)))
        if any(i.shape not in ((), (1,)) for i in items):
            raise NotCovered("a list of sizes with a non-scalar entry")
        return self.concat([self.reshape(self.cast(i, np.int32), [1]) for i in items], 0)

    @staticmethod
    def _runtime(values) -> bool:
        """Whether a list of sizes (a Tensor, or a list of ints and Tensors) has an entry
        computed at run time."""
        if isinstance(values, Tensor):
            return values.const is None
        return any(isinstance(v, Tensor) and v.const is None for v in values)

    @staticmethod
    def _known(values) -> list | None:
        """The entries of a list of sizes known now (None for those computed at run time),
        or None where not even its length is."""
        if isinstance(values, Tensor):
            if values.const is not None:
                return [int(v) for v in values.const.reshape(-1)]
            count = values.shape[0] if values.shape.rank == 1 else 1
            return None if count is None else [None] * count
        return [None if v is None or isinstance(v, Tensor) and v.const is None else
                int(np.asarray(v.const if isinstance(v, Tensor) else v).reshape(-1)[0])
                for v in values]

    def _scalar(self, value, dtype=np.int32) -> Tensor:
        """A scalar Tensor of `value` in `dtype` (a run-time one-element value reshaped)."""
        value = self.cast(self._tensor(value), dtype)
        return value if value.shape == () else self.reshape(value, [])

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
            if shape is None:  # not inferred: the shape the Recorder computed
                values.append(value.index)
                continue
            if not _fits(value.shape, shape):
                raise NotCovered(f"output {j} came out {list(value.shape)}, planned {shape}")
            if tuple(value.shape) != tuple(shape):  # dims computed at run time: as planned
                self._ctx.flat.set_shape(value.index, shape)
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
        """A builtin whose result has its inputs' broadcast shape."""
        shape = inputs[0].shape
        for other in inputs[1:]:
            shape = _broadcast(shape, other.shape)
        if len(shape) > 6 and None not in shape:  # TFLite broadcasts up to 6-D: a constant
            inputs = [self.weight(np.broadcast_to(t.const, shape).copy())  # full, as TF's
                      if t.const is not None and tuple(t.shape) != tuple(shape) else t
                      for t in inputs]
        if len(shape) > 6 and any(tuple(t.shape) != tuple(shape) for t in inputs):
            raise NotCovered("broadcasting above rank 6")
        return self._write_shaped(builtin, inputs, shape, dtype, opts)

    def _write_shaped(self, builtin: str, inputs: list[Tensor], shape, dtype,
                      opts=None) -> Tensor:
        """A one-output builtin on `inputs`, its result of `shape` and `dtype`."""
        out, tensor = self._out(tuple(shape), dtype, builtin.lower())
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
        condition = self._tensor(condition)
        if x is None and y is None:  # the coordinates of its true values: WHERE
            if condition.const is not None:
                return self.weight(np.argwhere(condition.const).astype(np.int64))
            out, tensor = self._out((None, condition.shape.rank), np.int64, "where")
            self._ctx.op("WHERE", [self.cast(condition, np.bool_).index], out)
            return tensor
        if x is None or y is None:
            raise NotCovered("tf.where with one of x and y")
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
        """RESHAPE to `dims` (-1 or None: the rest); dims computed at run time are read as
        -1 where only one is unknown, else from the RESHAPE's run-time shape input."""
        x = self._tensor(x)
        known = self._known(dims)
        if known is None:
            raise NotCovered("a reshape to a shape of unknown rank")
        if sum(d is None for d in known) + known.count(-1) > 1:
            if (known.count(-1) > 1 or not self._runtime(dims) or not isinstance(dims, Tensor)
                    and any(d is None for d in dims)):
                raise NotCovered("a reshape to several unknown dims")
            shape = tuple(None if d is None or d == -1 else d for d in known)
            out, tensor = self._out(shape, x.dtype, "reshape")
            self._ctx.op("RESHAPE", [x.index, self._vector(dims).index], out)
            return tensor
        dims = [None if d is None or d == -1 else d for d in known]
        moved = _as_transpose(x, dims)
        if moved is not None:  # a TRANSPOSE's value, its unit axes moved: one TRANSPOSE
            return self.transpose(*moved)
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
        """A RESHAPE; EXPAND_DIMS where several dims are known only at run time."""
        x = self._tensor(x)
        axis = int(axis) % (x.shape.rank + 1)
        shape = (*x.shape[:axis], 1, *x.shape[axis:])
        if sum(d is None for d in x.shape) <= 1:
            return self.reshape(x, list(shape))
        out, tensor = self._out(shape, x.dtype, "expand_dims")
        self._ctx.op("EXPAND_DIMS", [x.index, self._ctx.ints(np.int32(axis), "axis")], out)
        return tensor

    def squeeze(self, x, axis=None, name=None) -> Tensor:
        """A RESHAPE; SQUEEZE where several dims are known only at run time."""
        x = self._tensor(x)
        axes = [a for a, d in enumerate(x.shape) if d == 1] if axis is None else [
            int(a) % x.shape.rank for a in np.atleast_1d(axis)]
        shape = [d for a, d in enumerate(x.shape) if a not in axes]
        if sum(d is None for d in x.shape) <= 1:
            return self.reshape(x, shape)
        out, tensor = self._out(tuple(shape), x.dtype, "squeeze")
        self._ctx.op("SQUEEZE", [x.index], out, options("SqueezeOptions", squeezeDims=axes))
        return tensor

    def transpose(self, x, perm, name=None) -> Tensor:
        """TRANSPOSE; of a TRANSPOSE written here, one of its input by the composed perm
        (the first is then read by nothing and dropped, as TF's converter folds them)."""
        x = self._tensor(x)
        perm = [int(p) for p in perm]
        if x.const is not None:
            return self.weight(np.transpose(x.const, perm))
        before = x.derived.get("transposed")
        if before is not None:
            x, perm = before[0], [before[1][p] for p in perm]
        if perm == list(range(len(perm))):
            return x
        out, tensor = self._out(tuple(x.shape[p] for p in perm), x.dtype, "transpose")
        self._ctx.op("TRANSPOSE", [x.index, self._ctx.ints(perm, "perm")], out)
        tensor.derived["transposed"] = (x, perm)
        return tensor

    def gather(self, params, indices, axis: int = 0, batch_dims: int = 0, name=None):
        params, indices = self._tensor(params), self._tensor(indices)
        if indices.const is not None and indices.const.size == 0:  # [] reads as int32
            indices = self.weight(indices.const.astype(np.int32))
        axis %= params.shape.rank
        if params.const is not None and indices.const is not None:
            return self.weight(np.take(params.const, indices.const, axis=axis))
        batch_dims %= max(indices.shape.rank, 1)
        shape = (*params.shape[:axis], *indices.shape[batch_dims:], *params.shape[axis + 1:])
        out, tensor = self._out(shape, params.dtype, "gather")
        self._ctx.op("GATHER", [params.index, indices.index], out,
                     options("GatherOptions", axis=axis, batchDims=batch_dims))
        return tensor

    def _reduce_fn(self, name: str):
        builtin, fold = _REDUCE[name]

        def apply(x, axis=None, keepdims: bool = False, name=None):
            x = self._tensor(x)
            if isinstance(axis, Tensor) and axis.const is None:
                return self._reduce_at_run_time(builtin, x, axis, keepdims)
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

    def _reduce_at_run_time(self, builtin: str, x: Tensor, axis: Tensor, keepdims) -> Tensor:
        """The reduction over axes computed at run time (no duplicates, as TFLite's kernels
        want): kept, each dim is 1 or itself; dropped, the rank falls by their count."""
        count = 1 if axis.shape.rank == 0 else axis.shape[0]
        if axis.shape.rank > 1 or count is None:
            raise NotCovered("a reduction over a run-time number of axes")
        if keepdims:
            shape = tuple(1 if d == 1 else None for d in x.shape)
        else:
            shape = (None,) * max(x.shape.rank - count, 0)
        out, tensor = self._out(shape, x.dtype, builtin.lower())
        self._ctx.op(builtin, [x.index, self.cast(axis, np.int32).index], out,
                     options("ReducerOptions", keepDims=bool(keepdims)))
        return tensor

    def broadcast_to(self, x, shape, name=None) -> Tensor:
        x = self._tensor(x)
        known = self._known(shape)
        if self._runtime(shape) and known is not None:
            out, tensor = self._out(tuple(known), x.dtype, "broadcast_to")
            self._ctx.op("BROADCAST_TO", [x.index, self._vector(shape).index], out)
            return tensor
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
        known = self._known(multiples)
        if self._runtime(multiples) and known is not None:
            shape = tuple(None if d is None or m is None else d * m
                          for d, m in zip(x.shape, known))
            out, tensor = self._out(shape, x.dtype, "tile")
            self._ctx.op("TILE", [x.index, self._vector(multiples).index], out)
            return tensor
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
        if any(self._runtime(v) for v in (begin, end) + (() if strides is None else (strides,))):
            return self._strided_slice_at_run_time(x, begin, end, strides, begin_mask, end_mask,
                                                   shrink_axis_mask)
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
                return self._strided_slice_at_run_time(x, begin, end, strides, begin_mask,
                                                       end_mask, shrink_axis_mask)
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

    def _strided_slice_at_run_time(self, x: Tensor, begin, end, strides, begin_mask: int,
                                   end_mask: int, shrink: int) -> Tensor:
        """STRIDED_SLICE with bounds computed at run time: a dim is known where its bounds
        and stride are, or it is taken whole."""
        rank = x.shape.rank
        bounds = [self._known(v) for v in (begin, end)]
        steps = [1] * len(bounds[0]) if strides is None else self._known(strides)
        if None in (bounds[0], bounds[1], steps) or not len(bounds[0]) == len(bounds[1]) == len(
                steps) or len(steps) > rank:
            raise NotCovered("a strided slice of run-time bounds of unknown length")
        named = len(steps)
        begin_mask |= sum(1 << a for a in range(named, rank))
        end_mask |= sum(1 << a for a in range(named, rank))
        rest = rank - named
        vectors = [self._vector(begin), self._vector(end), self._vector(
            [1] * named if strides is None else strides)]
        if rest:
            vectors = [self.concat([v, self.weight(np.full(rest, fill, np.int32))], 0)
                       for v, fill in zip(vectors, (0, 0, 1))]
        b, e, st = bounds[0] + [0] * rest, bounds[1] + [0] * rest, steps + [1] * rest
        shape = []
        for a, dim in enumerate(x.shape):
            if shrink >> a & 1:
                continue
            whole_begin, whole_end = begin_mask >> a & 1, end_mask >> a & 1
            if dim is None or st[a] is None or (b[a] is None and not whole_begin) or (
                    e[a] is None and not whole_end):
                shape.append(None)
                continue
            cut = slice(None if whole_begin else b[a], None if whole_end else e[a], st[a])
            shape.append(len(range(*cut.indices(dim))))
        out, tensor = self._out(tuple(shape), x.dtype, "strided_slice")
        self._ctx.op("STRIDED_SLICE", [x.index, *(v.index for v in vectors)], out, options(
            "StridedSliceOptions", beginMask=begin_mask, endMask=end_mask,
            shrinkAxisMask=shrink))
        return tensor

    def slice(self, x, begin, size, name=None) -> Tensor:
        """SLICE (a size of -1: the rest of the dim); begin and size may be computed at run
        time."""
        x = self._tensor(x)
        if not (self._runtime(begin) or self._runtime(size)):
            begin = self._static(begin, "")
            size = self._static(size, "")
            if x.const is not None:
                index = tuple(slice(b, None if n == -1 else b + n) for b, n in zip(begin, size))
                return self.weight(np.asarray(x.const[index]))
            if None not in x.shape:
                return super().slice(x, begin, size)
        starts, sizes = self._known(begin), self._known(size)
        if starts is None or sizes is None:
            raise NotCovered("a slice of run-time bounds of unknown length")
        shape = tuple(None if n is None or d is None and n == -1 else
                      d - b if n == -1 and b is not None else None if n == -1 else n
                      for b, n, d in zip(starts, sizes, x.shape))
        out, tensor = self._out(shape, x.dtype, "slice")
        self._ctx.op("SLICE", [x.index, self._vector(begin).index, self._vector(size).index],
                     out)
        return tensor

    def pad(self, x, paddings, mode: str = "CONSTANT", constant_values=0,
            name=None) -> Tensor:
        """PAD, PADV2 (a constant other than zero) or MIRROR_PAD (REFLECT, SYMMETRIC);
        paddings may be computed at run time."""
        x = self._tensor(x)
        mode = mode.upper()
        value = self._tensor(constant_values, x)
        if isinstance(paddings, Tensor):
            widths = self._known(self.reshape(paddings, [-1])) if paddings.const is None else [
                int(v) for v in paddings.const.reshape(-1)]
            table = paddings
        else:
            rows = [[_bound(v) for v in row] for row in paddings]
            widths = [v if isinstance(v, int) else None for row in rows for v in row]
            table = self.reshape(self._vector([v for row in rows for v in row]),
                                 [len(rows), 2])
        if widths is None or len(widths) != 2 * x.shape.rank:
            raise NotCovered("paddings of unknown length")
        shape = tuple(None if d is None or lo is None or hi is None else d + lo + hi
                      for d, lo, hi in zip(x.shape, widths[0::2], widths[1::2]))
        if x.const is not None and None not in widths and value.const is not None and (
                mode == "CONSTANT"):
            return self.weight(np.pad(x.const, np.reshape(widths, (-1, 2)),
                                      constant_values=value.const))
        table = self.cast(table, np.int32)
        out, tensor = self._out(shape, x.dtype, "pad")
        if mode in ("REFLECT", "SYMMETRIC"):
            self._ctx.op("MIRROR_PAD", [x.index, table.index], out, options(
                "MirrorPadOptions", mode=getattr(schema.MirrorPadMode, mode)))
        elif mode != "CONSTANT":
            raise NotCovered(f"a pad of mode {mode}")
        elif value.const is not None and not np.any(value.const):
            self._ctx.op("PAD", [x.index, table.index], out)
        else:
            self._ctx.op("PADV2", [x.index, table.index, self._scalar(value, x.dtype).index],
                         out)
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
                begin.append(0 if k.start is None else _bound(k.start))
                end.append(0 if k.stop is None else _bound(k.stop))
                strides.append(1 if k.step is None else _bound(k.step))
                begin_mask |= (k.start is None) << a
                end_mask |= (k.stop is None) << a
            else:
                k = _bound(k)
                begin.append(k)
                end.append(k + 1 if not isinstance(k, Tensor) else self.add(k, 1))
                strides.append(1)
                shrink |= 1 << a
        return self.strided_slice(x, begin, end, strides, begin_mask, end_mask,
                                  shrink_axis_mask=shrink)

    def stack(self, values, axis: int = 0, name=None) -> Tensor:
        values = [self._tensor(v) for v in values]
        if all(v.const is not None for v in values):
            return self.weight(np.stack([v.const for v in values], axis))
        values = [self.cast(v, values[0].dtype) if v.const is not None else v for v in values]
        if values[0].dtype == np.bool_ and len(values) > 1:  # TFLite's PACK has no bool
            return self.concat([self.expand_dims(v, axis) for v in values], axis)
        return super().stack(values, axis)

    def concat(self, values, axis: int, name=None) -> Tensor:
        """CONCATENATION; its dim is computed at run time where a part's is. One value is
        itself (tf.concat's identity: TorchScript's torch.cat of a one-item list)."""
        values = [self._tensor(v) for v in values]
        if len(values) == 1:
            return values[0]
        dtype = next((v.dtype for v in values if v.const is None), values[0].dtype)
        values = [self.cast(v, dtype) if v.const is not None else v for v in values]
        rank = values[0].shape.rank
        if any(v.shape[int(axis) % rank] is None for v in values if v.shape.rank == rank):
            if any(v.shape.rank != rank or v.dtype != values[0].dtype for v in values):
                raise NotCovered("a concatenation of values of several ranks or dtypes")
            axis = int(axis) % rank
            shape = tuple(None if a == axis else d for a, d in enumerate(
                _broadcast_all([v.shape for v in values], axis)))
            out, tensor = self._out(shape, values[0].dtype, "concat")
            self._ctx.op("CONCATENATION", [v.index for v in values], out, options(
                "ConcatenationOptions", axis=axis, fusedActivationFunction=0))
            return tensor
        return super().concat(values, axis)

    def ones(self, shape, dtype=np.float32, name=None) -> Tensor:
        return self.fill(shape, np.asarray(1, as_numpy(dtype)))

    def zeros(self, shape, dtype=np.float32, name=None) -> Tensor:
        return self.fill(shape, np.asarray(0, as_numpy(dtype)))

    def fill(self, dims, value, name=None) -> Tensor:
        """A constant where the shape and value are known, else FILL."""
        value = self._tensor(value)
        if not self._runtime(dims) and value.const is not None:
            dims = self._static(dims, "a fill of a shape known only at run time")
            return self.weight(np.full(dims, value.const))
        known = self._known(dims)
        if known is None:
            raise NotCovered("a fill of a shape of unknown rank")
        value = self._scalar(value, value.dtype)
        out, tensor = self._out(tuple(known), value.dtype, "fill")
        self._ctx.op("FILL", [self._vector(dims).index, value.index], out)
        return tensor

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
        """A constant, or the product of the run-time shape (TFLite has no SIZE)."""
        x = self._tensor(x)
        if None in x.shape:
            return self.cast(self.reduce_prod(self.shape(x), axis=0), out_type)
        return self.weight(np.array(int(np.prod(x.shape)), as_numpy(out_type)))

    def one_hot(self, indices, depth, on_value=None, off_value=None, axis: int = -1,
                dtype=None, name=None) -> Tensor:
        indices = self._tensor(indices)
        dtype = as_numpy(dtype or (self._tensor(on_value).dtype if on_value is not None
                                    else np.float32))
        depth = self._scalar(depth)
        on = self._tensor(np.asarray(1, dtype) if on_value is None else on_value)
        off = self._tensor(np.asarray(0, dtype) if off_value is None else off_value)
        on, off = self._scalar(on, dtype), self._scalar(off, dtype)
        axis = axis % (indices.shape.rank + 1)
        size = None if depth.const is None else int(depth.const)
        shape = (*indices.shape[:axis], size, *indices.shape[axis:])
        out, tensor = self._out(shape, dtype, "one_hot")
        self._ctx.op("ONE_HOT", [indices.index, depth.index, on.index, off.index], out,
                     options("OneHotOptions", axis=axis))
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
        shape = tuple(x.shape)
        if x.dtype.size > dtype.size:  # as tf.bitcast: a new last axis of the parts
            shape = (*shape, x.dtype.size // dtype.size)
        elif x.dtype.size < dtype.size:  # the last axis holds the parts of one value
            if not shape or shape[-1] != dtype.size // x.dtype.size:
                raise NotCovered("a bitcast to a wider type of other than its last axis")
            shape = shape[:-1]
        if x.const is not None:
            return self.weight(np.ascontiguousarray(x.const).view(as_numpy(dtype)).reshape(
                shape))
        out, tensor = self._out(shape, dtype, "bitcast")
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
        if (b.shape.rank == a.shape.rank == 2 and transpose_b and not transpose_a
                and None not in b.shape):  # by run-time (out, in) weights, as TF's converter
            out, tensor = self._out((a.shape[0], b.shape[0]), a.dtype, "fully_connected")
            self._ctx.op("FULLY_CONNECTED", [a.index, b.index], out, options(
                "FullyConnectedOptions", fusedActivationFunction=0, keepNumDims=False))
            return tensor
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
        x, k = self._tensor(x), self._scalar(k)
        if not sorted:
            raise NotCovered("an unsorted top-k")
        shape = (*x.shape[:-1], None if k.const is None else int(k.const))
        values, value_tensor = self._out(shape, x.dtype, "topk_values")
        indices, index_tensor = self._out(shape, np.int32, "topk_indices")
        self._ctx.op("TOPK_V2", [x.index, k.index], [values, indices])
        return _TopK(value_tensor, index_tensor)

    def cumsum(self, x, axis: int = 0, exclusive: bool = False, reverse: bool = False,
               name=None) -> Tensor:
        """CUMSUM (float32, int32, int64), as TF's converter writes tf.math.cumsum."""
        x = self._tensor(x)
        if isinstance(axis, Tensor) and axis.const is None:
            out, tensor = self._out(x.shape, x.dtype, "cumsum")
            self._ctx.op("CUMSUM", [x.index, self._scalar(axis).index], out,
                         options("CumsumOptions", exclusive=bool(exclusive),
                                 reverse=bool(reverse)))
            return tensor
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
        value = np.asarray(value, as_numpy(dtype or x.dtype))
        if None in x.shape:
            return self.fill(self.shape(x), value)
        return self.weight(np.full(x.shape, value))

    def range(self, start, limit=None, delta=1, dtype=None, name=None) -> Tensor:
        if limit is None:  # tf.range(n)
            start, limit = 0, start
        tensors = [v for v in (start, limit, delta) if isinstance(v, Tensor)]
        values = [self._tensor(v) for v in (start, limit, delta)]
        if dtype is None:  # tf's: the tensors', else int32 or float32 for Python numbers
            dtype = tensors[0].dtype if tensors else np.result_type(*[v.const for v in values])
        if all(v.const is not None for v in values):
            array = np.arange(*[np.asarray(v.const).reshape(()) for v in values])
            return self.weight(array.astype(as_numpy(dtype)))
        values = [self._scalar(v, dtype) for v in values]
        out, tensor = self._out((None,), dtype, "range")
        self._ctx.op("RANGE", [v.index for v in values], out)
        return tensor

    # --- integers, segments, scatters, sets, draws ---------------------------------------
    def truncatediv(self, a, b, name=None) -> Tensor:
        """Integer division rounding toward zero: TFLite's int32 DIV (C++'s division);
        narrower integers through int32, as TF's converter writes them."""
        a, b = self._pair(a, b)
        if a.const is not None and b.const is not None:
            quotient = np.trunc(a.const.astype(np.float64) / b.const).astype(a.const.dtype)
            return self.weight(quotient)
        if a.dtype.is_floating or a.dtype.size > 4 or a.dtype == np.uint32:
            raise NotCovered(f"a truncated division of {a.dtype.name}")
        if a.dtype == np.int32:
            return self._write("DIV", [a, b], a.dtype, options("DivOptions",
                                                                fusedActivationFunction=0))
        return self.cast(self.truncatediv(self.cast(a, np.int32), self.cast(b, np.int32)),
                         a.dtype)

    def _blocks_fn(self, builtin: str):
        """DEPTH_TO_SPACE / SPACE_TO_DEPTH of NHWC values."""
        def move(input, block_size, data_format="NHWC", name=None) -> Tensor:
            x, block = self._tensor(input), int(block_size)
            if x.shape.rank != 4:
                raise NotCovered(f"a {builtin.lower()} of other than NHWC values")
            n, h, w, c = x.shape
            if builtin == "DEPTH_TO_SPACE":
                shape = (n, _times(h, block), _times(w, block),
                         None if c is None else c // (block * block))
            else:
                shape = (n, None if h is None else h // block, None if w is None else w // block,
                         _times(c, block * block))
            kind = "DepthToSpaceOptions" if builtin == "DEPTH_TO_SPACE" else "SpaceToDepthOptions"
            return self._write_shaped(builtin, [x], shape, x.dtype, options(kind, blockSize=block))

        return move

    def argsort(self, values, axis: int = -1, direction: str = "ASCENDING",
                stable: bool = False, name=None) -> Tensor:
        """The order of the last axis by TOPK_V2 over all of it (equal values keep their
        index order), of the negated values for ASCENDING."""
        x = self._tensor(values)
        if int(axis) % x.shape.rank != x.shape.rank - 1 or x.shape[-1] is None:
            raise NotCovered("an argsort over other than a known last axis")
        if direction == "ASCENDING":
            x = self.negative(x if x.dtype.is_floating or x.dtype == np.int32 else
                              self.cast(x, np.int32))
        return self.top_k(x, x.shape[-1]).indices

    def softsign(self, x, name=None) -> Tensor:
        x = self._tensor(x)
        return self.divide(x, self.add(self.abs(x), 1))

    def _segment_fn(self, kind: str):
        builtin = f"UNSORTED_SEGMENT_{kind.upper()}"

        def segments(data, segment_ids, num_segments, name=None) -> Tensor:
            data, ids = self._tensor(data), self._tensor(segment_ids)
            count = self._scalar(num_segments)
            shape = (None if count.const is None else int(count.const),
                     *data.shape[ids.shape.rank:])
            return self._write_shaped(builtin, [data, self.cast(ids, np.int32), count], shape,
                                      data.dtype)

        return segments

    def scatter_nd(self, indices, updates, shape, name=None) -> Tensor:
        indices, updates = self._tensor(indices), self._tensor(updates)
        known = self._known(shape)
        if known is None:
            raise NotCovered("a scatter into a shape of unknown rank")
        return self._write_shaped("SCATTER_ND", [self.cast(indices, np.int32), updates,
                                                 self._vector(shape)], known, updates.dtype)

    def unique(self, x, out_idx=np.int32, name=None):
        """UNIQUE of a vector: (values in first-seen order, each one's index in them)."""
        x = self._tensor(x)
        if x.shape.rank != 1:
            raise NotCovered("a unique of other than a vector")
        values, value_tensor = self._out((None,), x.dtype, "unique_values")
        where, index_tensor = self._out(x.shape, out_idx, "unique_indices")
        self._ctx.op("UNIQUE", [x.index], [values, where], options(
            "UniqueOptions", idxOutType=_tensor_type(as_numpy(out_idx))))
        return value_tensor, index_tensor

    def reverse_sequence(self, input, seq_lengths, seq_axis=None, batch_axis=None,
                         name=None) -> Tensor:
        x, lengths = self._tensor(input), self._tensor(seq_lengths)
        rank = x.shape.rank
        seq_axis, batch_axis = int(seq_axis) % rank, int(batch_axis or 0) % rank
        return self._write_shaped("REVERSE_SEQUENCE", [x, lengths], x.shape, x.dtype, options(
            "ReverseSequenceOptions", seqDim=seq_axis, batchDim=batch_axis))

    def non_max_suppression(self, boxes, scores, max_output_size, iou_threshold=0.5,
                            score_threshold=float("-inf"), name=None) -> Tensor:
        """NON_MAX_SUPPRESSION_V4 (its output padded to max_output_size), then the
        selected indices alone (a SLICE by its count), as tf.image's."""
        boxes, scores = self._tensor(boxes), self._tensor(scores)
        limit = self._scalar(max_output_size)
        iou = self._scalar(iou_threshold, np.float32)
        least = self._scalar(score_threshold, np.float32)
        padded = None if limit.const is None else int(limit.const)
        selected, selected_tensor = self._out((padded,), np.int32, "nms_selected")
        count, count_tensor = self._out((), np.int32, "nms_count")
        self._ctx.op("NON_MAX_SUPPRESSION_V4", [boxes.index, scores.index, limit.index,
                                                iou.index, least.index], [selected, count])
        return self.slice(selected_tensor, [0], self.reshape(count_tensor, [1]))

    def _resize_fn(self, builtin: str):
        """tf.compat.v1.image's resize of an NHWC value to `size` (2 ints, or a run-time
        int32 vector): RESIZE_NEAREST_NEIGHBOR or RESIZE_BILINEAR with its flags."""
        kind = "ResizeNearestNeighborOptions" if "NEAREST" in builtin else "ResizeBilinearOptions"

        def resize(images, size, align_corners=False, half_pixel_centers=False, name=None):
            x, size = self._tensor(images), self.cast(self._tensor(size), np.int32)
            if x.shape.rank != 4 or size.shape != (2,):
                raise NotCovered(f"tf.compat.v1.image resize of {list(x.shape)} to {size.shape}")
            hw = ((None, None) if size.const is None
                  else tuple(int(d) for d in size.const.reshape(-1)))
            return self._write_shaped(builtin, [x, size], (x.shape[0], *hw, x.shape[3]),
                                      x.dtype, options(kind, alignCorners=bool(align_corners),
                                                       halfPixelCenters=bool(half_pixel_centers)))
        return resize

    def _random_fn(self, builtin: str):
        """RANDOM_UNIFORM in [0, 1) or RANDOM_STANDARD_NORMAL, scaled as asked (a draw per
        run: its values are the runtime's, as TF's converter's files draw them)."""

        def draw(shape, minval=0, maxval=None, dtype=np.float32, seed=None, name=None,
                 mean=None, stddev=None):
            known = self._known(shape)
            if known is None or not as_dtype(dtype).is_floating:
                raise NotCovered("a draw of a shape of unknown rank, or of integers")
            out, tensor = self._out(tuple(known), np.float32, builtin.lower())
            self._ctx.op(builtin, [self._vector(shape).index], out, options(
                "RandomOptions", seed=int(seed or 0), seed2=0))
            if builtin == "RANDOM_UNIFORM" and (minval != 0 or maxval not in (None, 1)):
                tensor = self.add(self.multiply(tensor, np.float32(
                    (1.0 if maxval is None else maxval) - minval)), np.float32(minval))
            if builtin != "RANDOM_UNIFORM" and (mean or stddev not in (None, 1)):
                tensor = self.add(self.multiply(tensor, np.float32(
                    1.0 if stddev is None else stddev)), np.float32(mean or 0))
            return self.cast(tensor, dtype)

        return draw

    def broadcast_dynamic_shape(self, shape_x, shape_y) -> Tensor:
        """The broadcast of two shapes (vectors of static length): a constant where both
        are known, else, each padded with leading ones, y's dim where x's is 1."""
        a, b = self._tensor(shape_x), self._tensor(shape_y)
        if a.const is not None and b.const is not None:
            return self.weight(np.array(np.broadcast_shapes(tuple(a.const), tuple(b.const)),
                                        a.dtype.as_numpy_dtype))
        if a.shape[0] is None or b.shape[0] is None:
            raise NotCovered("a broadcast of shapes of unknown length")
        rank = max(a.shape[0], b.shape[0])
        a, b = (self.concat([self.weight(np.ones(rank - v.shape[0], as_numpy(v.dtype))), v], 0)
                if v.shape[0] < rank else v for v in (a, b))
        b = self.cast(b, a.dtype)
        return self.where(self.equal(a, 1), b, a)

    # --- windows (channel-last, as TF's converter writes tf.nn's) ----------------------
    def conv2d(self, input, filters, strides, padding, data_format=None, dilations=None,
               name=None) -> Tensor:
        """CONV_2D of NHWC `input` by HWIO `filters` (a constant, or run-time weights
        moved to OHWI by a TRANSPOSE, as TF's converter does), groups where I divides C."""
        x, w = self._tensor(input), self._tensor(filters)
        if x.dtype != np.float32 or w.dtype != np.float32 or x.shape.rank != 4:
            raise NotCovered("a convolution of other than float32 NHWC values")
        kh, kw, depth, count = w.shape
        if None in (kh, kw, depth, count) or x.shape[3] is None or x.shape[3] % depth:
            raise NotCovered("a convolution of unknown or unmatched channels")
        (sh, sw), (dh, dw) = _spatial(strides, 2), _spatial(dilations or 1, 2)
        shape = (x.shape[0], _window_out(x.shape[1], kh, sh, dh, padding),
                 _window_out(x.shape[2], kw, sw, dw, padding), count)
        return self._write_shaped(
            "CONV_2D", [x, self.transpose(w, [3, 0, 1, 2]),
                        self.weight(np.zeros(count, np.float32))], shape, x.dtype,
            options("Conv2DOptions", padding=_padding(padding), strideH=sh, strideW=sw,
                    dilationHFactor=dh, dilationWFactor=dw, fusedActivationFunction=0))

    def depthwise_conv2d(self, input, filter, strides, padding, data_format=None,
                         dilations=None, name=None) -> Tensor:
        """DEPTHWISE_CONV_2D of NHWC `input` by (kh, kw, C, M) `filter`, as (1, kh, kw,
        C * M) with a depth multiplier M."""
        x, w = self._tensor(input), self._tensor(filter)
        if x.dtype != np.float32 or w.dtype != np.float32 or x.shape.rank != 4:
            raise NotCovered("a depthwise convolution of other than float32 NHWC values")
        kh, kw, channels, multiplier = w.shape
        if None in (kh, kw, channels, multiplier) or x.shape[3] != channels:
            raise NotCovered("a depthwise convolution of unknown or unmatched channels")
        (sh, sw), (dh, dw) = _spatial(strides, 2), _spatial(dilations or 1, 2)
        depth = channels * multiplier
        shape = (x.shape[0], _window_out(x.shape[1], kh, sh, dh, padding),
                 _window_out(x.shape[2], kw, sw, dw, padding), depth)
        return self._write_shaped(
            "DEPTHWISE_CONV_2D", [x, self.reshape(w, [1, kh, kw, depth]),
                                  self.weight(np.zeros(depth, np.float32))], shape, x.dtype,
            options("DepthwiseConv2DOptions", padding=_padding(padding), strideH=sh,
                    strideW=sw, depthMultiplier=multiplier, dilationHFactor=dh,
                    dilationWFactor=dw, fusedActivationFunction=0))

    def conv_transpose(self, input, filters, output_shape, strides, padding="SAME",
                       data_format=None, dilations=None, name=None) -> Tensor:
        """tf.nn.conv2d_transpose / conv3d_transpose, by the input's rank: TRANSPOSE_CONV of
        NHWC values by (kh, kw, out, in) filters moved to (out, kh, kw, in), without a bias
        (as TF's converter writes it), or CONV_3D_TRANSPOSE of NDHWC values by (kd, kh, kw,
        out, in) filters (TFLite's layout too), to `output_shape`."""
        x, w = self._tensor(input), self._tensor(filters)
        n = x.shape.rank - 2
        if x.dtype != np.float32 or w.dtype != np.float32 or n not in (2, 3):
            raise NotCovered("a transposed convolution of other than float32 2-D / 3-D values")
        if _spatial(dilations or 1, n) != (1,) * n:
            raise NotCovered("a dilated transposed convolution")
        steps, known = _spatial(strides, n), self._known(output_shape)
        if known is None or len(known) != n + 2:
            raise NotCovered("a transposed convolution to a shape of unknown rank")
        if n == 2:
            builtin, filt = "TRANSPOSE_CONV", self.transpose(w, [2, 0, 1, 3])
            opts = options("TransposeConvOptions", padding=_padding(padding), strideH=steps[0],
                           strideW=steps[1], fusedActivationFunction=0)
        else:
            builtin, filt = "CONV_3D_TRANSPOSE", w
            opts = options("Conv3DOptions", padding=_padding(padding), strideD=steps[0],
                           strideH=steps[1], strideW=steps[2], dilationDFactor=1,
                           dilationHFactor=1, dilationWFactor=1, fusedActivationFunction=0)
        return self._write_shaped(builtin, [self._vector(output_shape), filt, x], known,
                                  x.dtype, opts)

    def _pool_fn(self, builtin: str):
        def pool(input, ksize, strides, padding, data_format=None, name=None) -> Tensor:
            x = self._tensor(input)
            if x.dtype != np.float32 or x.shape.rank != 4:
                raise NotCovered(f"a {builtin.lower()} of other than float32 NHWC values")
            (kh, kw), (sh, sw) = _spatial(ksize, 2), _spatial(strides, 2)
            shape = (x.shape[0], _window_out(x.shape[1], kh, sh, 1, padding),
                     _window_out(x.shape[2], kw, sw, 1, padding), x.shape[3])
            return self._write_shaped(builtin, [x], shape, x.dtype, options(
                "Pool2DOptions", padding=_padding(padding), strideH=sh, strideW=sw,
                filterHeight=kh, filterWidth=kw, fusedActivationFunction=0))

        return pool

    def local_response_normalization(self, input, depth_radius=5, bias=1.0, alpha=1.0,
                                     beta=0.5, name=None) -> Tensor:
        x = self._tensor(input)
        if x.dtype != np.float32 or x.shape.rank != 4:
            raise NotCovered("a local response normalization of other than float32 NHWC")
        return self._write("LOCAL_RESPONSE_NORMALIZATION", [x], x.dtype, options(
            "LocalResponseNormalizationOptions", radius=int(depth_radius), bias=float(bias),
            alpha=float(alpha), beta=float(beta)))

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


_PADDING = {"SAME": schema.Padding.SAME, "VALID": schema.Padding.VALID}


def _spatial(values, n: int) -> tuple:
    """tf.nn's window sizes for `n` spatial axes: one int, n, or n + 2 (batch and channels
    first and last, of 1)."""
    values = tuple(int(v) for v in np.atleast_1d(values))
    if len(values) == 1:
        return values * n
    if len(values) == n + 2:
        if values[0] != 1 or values[-1] != 1:
            raise NotCovered("a window over the batch or channels")
        return values[1:-1]
    if len(values) != n:
        raise NotCovered(f"{len(values)} window sizes for {n} spatial axes")
    return values


def _padding(padding: str) -> int:
    """The schema's Padding of tf.nn's `padding` (SAME or VALID)."""
    if padding not in _PADDING:
        raise NotCovered(f"a window with padding {padding!r}")
    return _PADDING[padding]


def _window_out(size, k: int, stride: int, dilation: int, padding: str):
    """A window op's output length (None: known at run time)."""
    _padding(padding)
    if size is None:
        return None
    if padding == "SAME":
        return -(-size // stride)
    return -(-(size - (k - 1) * dilation) // stride)


def _flatten(structure) -> tuple[list, object]:
    """The leaves of nested lists and tuples, and a function that nests a list of leaves
    alike again."""
    if type(structure) not in (list, tuple):  # a leaf: a value, a shape (a Shape too)
        return [structure], lambda leaves: leaves[0]
    parts = [_flatten(s) for s in structure]
    sizes = [len(leaves) for leaves, _ in parts]

    def rebuild(leaves: list):
        nested, at = [], 0
        for (_, inner), size in zip(parts, sizes):
            nested.append(inner(leaves[at:at + size]))
            at += size
        return type(structure)(nested) if isinstance(structure, tuple) else nested

    return [leaf for leaves, _ in parts for leaf in leaves], rebuild


def _invariant(shape, value: Tensor) -> tuple:
    """A loop value's dims kept across steps (None: changing), from its shape invariant."""
    dims = list(shape) if getattr(shape, "rank", 0) is not None else None
    if dims is None or len(dims) != value.shape.rank:
        raise NotCovered("a loop value whose rank changes between steps")
    return tuple(None if d is None else int(d) for d in dims)


def _broadcast_all(shapes: list, axis: int) -> tuple:
    """The dims of values concatenated on `axis` (others equal, or None where one is known
    only at run time)."""
    dims = []
    for a, column in enumerate(zip(*shapes)):
        known = {d for d in column if d is not None}
        dims.append(None if a == axis or len(known) != 1 else known.pop())
    return tuple(dims)


def _as_transpose(x: Tensor, dims: list) -> tuple | None:
    """(source, perm) where `x` is a TRANSPOSE of source written here and reshaping it to
    `dims` (same rank, static) only moves unit axes, so one TRANSPOSE of source gives it."""
    before = x.derived.get("transposed")
    if before is None or len(dims) != x.shape.rank or None in dims or None in x.shape:
        return None
    source, perm = before
    sizes = [d for d in x.shape if d != 1]
    if [d for d in dims if d != 1] != sizes:
        return None
    big = iter(p for p, d in zip(perm, x.shape) if d != 1)
    units = iter(a for a, d in enumerate(source.shape) if d == 1)
    return source, [next(units) if d == 1 else next(big) for d in dims]


def _times(dim, factor: int):
    return None if dim is None else dim * factor


def _holds_tensors(values) -> bool:
    """Whether a (nested) list holds a Tensor."""
    return any(isinstance(v, Tensor) or isinstance(v, (list, tuple)) and _holds_tensors(v)
               for v in values)


def _bound(value):
    """An index or slice bound: an int, or a Tensor where computed at run time."""
    if isinstance(value, Tensor):
        return int(value.const) if value.const is not None else value
    return int(value)


def _fits(shape, planned) -> bool:
    """A value of `shape` (None: computed at run time) can be the planned output."""
    return len(shape) == len(planned) and all(
        d is None or p is None or d == p for d, p in zip(shape, planned))


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


def _read_by(branches: list[_Branch]) -> list[Tensor]:
    """The enclosing graphs' values the subgraphs of one IF or WHILE read, each once, in the
    order first read: the op's extra inputs."""
    return list({id(t): t for b in branches for t, _ in b.captured.values()}.values())


class _Branch:
    """An IF branch being written: its subgraph, and the values of enclosing graphs it
    reads (each an input of the subgraph, in the order first read)."""

    def __init__(self, recorder: Recorder, kind: str):
        self.recorder, self.kind, self.flat = recorder, kind, FlatGraph()
        self.captured: dict[int, tuple[Tensor, int]] = {}  # id(outer Tensor) -> it, input
        self.results: list[Tensor] = []
        self.outputs: list[int] = []
        self.formal: list[int] = []  # a WHILE subgraph's inputs for the loop values
        self.several = False

    def capture(self, t: Tensor) -> int:
        if id(t) not in self.captured:
            index = self.flat.tensor(f"{self.kind}_input_{len(self.captured)}", t.shape,
                                     as_numpy(t.dtype), dynamic=True)
            self.captured[id(t)] = (t, index)
        return self.captured[id(t)][1]

    def part(self, read: list[Tensor], key: str, passed: bool = False) -> Part:
        """The branch's subgraph taking its own inputs, then every value either branch
        reads, in `read` order (one this branch does not read is an input it ignores);
        `passed`: those are outputs too, as they came in (a WHILE body's)."""
        inputs = [self.captured[id(t)][1] if id(t) in self.captured else self.flat.tensor(
            f"{self.kind}_unread_{k}", t.shape, as_numpy(t.dtype), dynamic=True)
            for k, t in enumerate(read)]
        outputs = self.outputs + (inputs if passed else [])
        return Part(key, self.flat, self.formal + inputs, outputs, [], [])


class RecordingContext:
    """The NodeContext a handler reads (translate/context.py), over a DirectContext: the
    same attributes, constants, shapes and perms, with its inputs as the Recorder's
    tensors."""

    in_layer = True  # the handler writes its ops itself, as inside its own Keras layer
    recording = True

    def __init__(self, ctx, recorder: Recorder):
        self._ctx, self._recorder = ctx, recorder

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def x(self, i: int) -> Tensor:
        return self._recorder.node_input(i)

    def const_tensor(self, array) -> Tensor:
        return self._recorder.weight(np.asarray(array))

    def value(self, name: str):
        """A value of the graph by name (what a subgraph reads from the enclosing scope):
        its array when constant, else its Tensor in identity (ONNX) layout."""
        writer = self._ctx._writer
        value = writer.values[name]
        if value.const is not None:
            return value.const
        index = writer.input_tensor(name, P.identity(len(value.perm)))
        flat = writer.flat
        return Tensor(self._recorder, flat.shape(index), index=index, dtype=flat.dtype(index))


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
