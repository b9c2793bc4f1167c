"""What a handler sees: its node's attributes, and its inputs already in the layout it asked for."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.options import DEFAULT_OPTIONS, ConversionOptions


class NodeView:
    """What any writer of a node reads: its attributes, its constant inputs, the logical
    (ONNX) shapes and dtypes, and the perms the layout plan gave its inputs and outputs.
    NodeContext (a handler, on TF tensors) and tflite/direct.DirectContext (a direct
    writer, on flatbuffer tensors) add how inputs are read and outputs made."""

    def __init__(self, node: Node, graph: Graph, in_perms, out_perms, opset: int,
                 options: ConversionOptions = DEFAULT_OPTIONS):
        self.options = options
        self.node = node
        self.graph = graph
        self.in_perms: list[Perm | None] = in_perms
        self.out_perms: list[Perm] = out_perms
        self.opset = opset

    def _constant(self, name: str) -> np.ndarray | None:
        raise NotImplementedError

    # --- attributes --------------------------------------------------------------------
    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    # --- inputs ------------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    def has(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def const(self, i: int, physical: bool = False) -> np.ndarray | None:
        """Input i's constant value, or None if it is computed at run time: in ONNX order,
        or with `physical` as ctx.x(i) holds it (rank-aligned, in perm(i))."""
        if not self.has(i):
            return None
        value = self._constant(self.node.inputs[i])
        return value if value is None or not physical else self.physical(value, i)

    def physical(self, array: np.ndarray, i: int, first_axis: int | None = None) -> np.ndarray:
        """An ONNX-order array laid out like input i. By default it broadcasts against the
        input (numpy rules): rank-aligned with leading 1s, then permuted by perm(i). With
        `first_axis`, its axes are input i's axes first_axis, first_axis + 1, ... (a
        per-channel parameter: first_axis=1) and come back in their physical order."""
        perm = self.in_perms[i]
        if first_axis is None:
            array = array.reshape((1,) * (len(perm) - array.ndim) + array.shape)
            return np.transpose(array, perm)
        own = range(first_axis, first_axis + array.ndim)
        return np.transpose(array, [a - first_axis for a in perm if a in own])

    def perm(self, i: int) -> Perm:
        return self.in_perms[i]

    def shape(self, i: int) -> tuple | None:
        return self.graph.shapes.get(self.node.inputs[i])

    def rank(self, i: int) -> int:
        return len(self.in_perms[i]) if self.in_perms[i] is not None else len(self.shape(i))

    def dtype(self, i: int) -> np.dtype:
        return self.graph.dtypes.get(self.node.inputs[i])

    def phys_shape(self, i: int) -> tuple | None:
        shape = self.shape(i)
        return None if shape is None else P.physical_shape(shape, self.in_perms[i])

    def axis(self, logical_axis: int, i: int = 0) -> int:
        """Physical axis of input i holding `logical_axis` (negative allowed)."""
        return P.to_physical_axis(self.in_perms[i], logical_axis)

    def axes(self, logical_axes: Sequence[int], i: int = 0) -> list[int]:
        return sorted(self.axis(a, i) for a in logical_axes)

    # --- outputs -----------------------------------------------------------------------
    def out_shape(self, j: int = 0) -> tuple | None:
        return self.graph.shapes.get(self.node.outputs[j])

    def out_phys_shape(self, j: int = 0) -> tuple | None:
        shape = self.out_shape(j)
        return None if shape is None else P.physical_shape(shape, self.out_perms[j])

    def out_dtype(self, j: int = 0) -> np.dtype | None:
        return self.graph.dtypes.get(self.node.outputs[j])

    def out_perm(self, j: int = 0) -> Perm:
        return self.out_perms[j]

    def rank_out(self, j: int = 0) -> int:
        return len(self.out_perms[j]) if self.out_perms else 0

    def out_axis(self, logical_axis: int, j: int = 0) -> int:
        return P.to_physical_axis(self.out_perms[j], logical_axis)


class NodeContext(NodeView):
    """Per-node view handed to a handler.

    `x(i)` is input i as a TF tensor in `perm(i)`; `const(i)` its value when it is a constant
    (in ONNX order, untouched). Shapes and dtypes are the logical ONNX ones. `options` are
    the user's lowering choices (onnx2tf_alt/translate/options.py). `in_layer`: the
    handler runs inside its node's own Keras layer (translate/node_layer.py); `recording`:
    on the direct writer's Recorder (tflite/recorder.py), without TensorFlow.
    """

    in_layer = False
    recording = False

    def __init__(self, builder, node: Node, graph: Graph, in_perms, out_perms, opset: int,
                 options: ConversionOptions = DEFAULT_OPTIONS):
        super().__init__(node, graph, in_perms, out_perms, opset, options)
        self._builder = builder

    def _constant(self, name: str) -> np.ndarray | None:
        return self._builder.constant_value(name)

    def x(self, i: int):
        """Input i as a tensor, in the perm the handler's layout policy asked for."""
        return self._builder.input_tensor(self.node.inputs[i], self.in_perms[i], self.rank_out())

    def const_tensor(self, array: np.ndarray):
        """A converter-made constant as a tensor (large ones become layer weights)."""
        return self._builder.materialize(np.asarray(array))

    def value(self, name: str):
        """Any value of this graph by name (what a subgraph reads from the enclosing scope):
        its numpy array when constant, else its tensor in identity (ONNX) layout."""
        const = self._builder.constant_value(name)
        if const is not None:
            return const
        rank = len(self._builder.values[name].perm)
        return self._builder.input_tensor(name, P.identity(rank), rank)


def reshape(x, dims: Sequence):
    """tf.reshape to `dims` (None: unknown).

    A single unknown becomes -1 so the TFLite graph keeps a plain RESHAPE. With several,
    the i-th unknown target dim is read from the i-th unknown dim of x at run time, which
    is right for the reshapes used here (ones that only insert, drop or move size-1 axes).
    """
    dims = list(dims)
    if sum(d is None for d in dims) <= 1:
        return tf.reshape(x, [-1 if d is None else int(d) for d in dims])
    src = tf.shape(x)
    unknown_src = [i for i, d in enumerate(x.shape.as_list()) if d is None]
    parts, k = [], 0
    for d in dims:
        if d is None:
            parts.append(src[unknown_src[k] : unknown_src[k] + 1])
            k += 1
        else:
            parts.append(tf.constant([int(d)], dtype=src.dtype))
    return tf.reshape(x, tf.concat(parts, axis=0))
