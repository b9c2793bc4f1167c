"""Build a tf_keras functional Model from the graph view, the layout plan and the handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
import tf_keras

from onnx2tf_alt.errors import ConversionError
from onnx2tf_alt.interrupts import checkpoint
from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm, constant_in_perm
from onnx2tf_alt.layout.plan import Plan
from onnx2tf_alt.translate import late_shapes
from onnx2tf_alt.translate.context import NodeContext, reshape
from onnx2tf_alt.translate.failures import failure_for
from onnx2tf_alt.translate.io_layout import SignatureIO, keras_name
from onnx2tf_alt.translate.keras_layers import constant_weights
from onnx2tf_alt.translate.options import (
    DEFAULT_OPTIONS,
    INLINE_CONSTANT_LIMIT,
    ConversionOptions,
)
from onnx2tf_alt.translate.registry import find_handler


@dataclass
class Value:
    """A converted ONNX value: a tensor in `perm`, or a numpy constant in ONNX order."""

    perm: Perm
    tensor: object = None
    const: np.ndarray | None = None


@dataclass
class BuildResult(SignatureIO):
    model: tf_keras.Model
    input_names: dict[str, str]  # ONNX name -> Keras / signature name
    output_names: dict[str, str]  # the first key of each output value
    input_perms: dict[str, Perm]
    output_perms: dict[str, Perm]
    values: dict[str, Value] = field(default_factory=dict)
    output_keys: list[str] = field(default_factory=list)  # one per graph output, in order


class ModelBuilder:
    def __init__(self, graph: Graph, plan: Plan, progress=None,
                 options: ConversionOptions | None = None):
        self.graph = graph
        self.options = options or DEFAULT_OPTIONS
        self.plan = plan
        self.progress = progress
        self.values: dict[str, Value] = {
            name: Value(perm=P.identity(a.ndim), const=a) for name, a in graph.constants.items()
        }
        self._transposed: dict[tuple[str, Perm, int], object] = {}
        self._anchor = None
        self._learned: set[str] = set()  # values whose shape TF told us (late_shapes.py)

    # --- value access used by NodeContext -----------------------------------------------
    def constant_value(self, name: str) -> np.ndarray | None:
        value = self.values.get(name)
        return None if value is None else value.const

    def materialize(self, array: np.ndarray):
        if array.size > INLINE_CONSTANT_LIMIT and self._anchor is not None and array.dtype != bool:
            return constant_weights(array, self._anchor)
        return tf.constant(array)

    def input_tensor(self, name: str, perm: Perm | None, align_rank: int):
        """Value `name` as a tensor in `perm`, rank-aligned (leading 1s) when perm is longer."""
        value = self.values[name]
        if value.const is not None:
            return self.materialize(constant_in_perm(value.const, perm))
        if perm is None:
            return value.tensor
        key = (name, tuple(perm), 0)
        if key not in self._transposed:
            self._transposed[key] = self._relayout(name, value, tuple(perm))
        return self._transposed[key]

    def _relayout(self, name: str, value: Value, want: Perm):
        tensor, have = value.tensor, value.perm
        extra = len(want) - len(have)
        if extra < 0:  # planned before its rank was known (run-time axes): as it is
            return tensor
        if extra > 0:
            for _ in range(extra):
                tensor = tf.expand_dims(tensor, 0)
            have = tuple(range(extra)) + tuple(a + extra for a in have)
        if have == want:
            return tensor
        move = P.transpose_between(have, want)
        phys = tuple(tensor.shape.as_list())
        if P.moves_only_unit_axes(phys, move):
            return reshape(tensor, [phys[a] for a in move])
        return tf.transpose(tensor, move)

    # --- the build -----------------------------------------------------------------------
    def build(self, keep_names: bool = True) -> BuildResult:
        graph, plan = self.graph, self.plan
        taken: set[str] = set()
        inputs, input_names = [], {}
        for name in graph.inputs:
            shape = graph.shapes.get(name)
            if shape is None:
                raise ConversionError(
                    [], headline=f"model input '{name}' has no known rank; set it with -ois"
                )
            perm = plan.perms[name]
            input_names[name] = keras_name(name, taken)
            spec = tf.TensorSpec(P.physical_shape(shape, perm), _tf_dtype(graph.dtypes[name]))
            tensor = tf_keras.Input(type_spec=spec, name=input_names[name])
            inputs.append(tensor)
            self.values[name] = Value(perm=perm, tensor=tensor)
        self._anchor = inputs[0] if inputs else None

        failures = []
        for index, node in enumerate(graph.nodes):
            checkpoint()  # a requested stop ends the build between two nodes
            if self.progress:
                self.progress.begin(f"{node.op_type} {node.name}")
            if any(n and n not in self.values for n in node.inputs):
                continue  # an upstream node failed; it is reported already
            try:
                self._convert_node(node, plan.node_inputs[index], index)
            except Exception as exc:  # noqa: BLE001 - reported per node, with the node
                failures.append(failure_for(node, graph, f"{type(exc).__name__}: {exc}"))
        if failures:
            raise ConversionError(failures)

        outputs, output_names, output_keys = {}, {}, []
        for name in graph.outputs:
            key = keras_name(name, taken)  # a value listed twice gets a second, distinct key
            output_names.setdefault(name, key)
            output_keys.append(key)
            want = plan.output_perms[name]
            value = self.values[name]
            if value.const is not None:
                array = np.ascontiguousarray(value.const).reshape(value.const.shape)
                tensor = constant_weights(array, self._anchor)
            else:
                tensor = self.input_tensor(name, want, len(want))
            if any(tensor is t for t in inputs):
                tensor = tf.identity(tensor)
            outputs[key] = tensor
        model = tf_keras.Model(inputs=inputs, outputs=outputs)
        return BuildResult(
            model=model,
            input_names=input_names,
            output_names=output_names,
            output_keys=output_keys,
            input_perms={n: plan.perms[n] for n in graph.inputs},
            output_perms=dict(plan.output_perms),
            values=self.values,
        )

    def run(self, feeds: dict) -> list:
        """Build the graph on given TF tensors (or arrays) instead of Keras inputs, each in
        identity layout: a subgraph traced inside an If / Loop / Scan (ops/control.py).
        Returns the graph's outputs in ONNX order and layout."""
        for name, tensor in feeds.items():
            tensor = tf.convert_to_tensor(tensor)
            self.values[name] = Value(perm=P.identity(tensor.shape.rank or 0), tensor=tensor)
        for index, node in enumerate(self.graph.nodes):
            try:
                self._convert_node(node, self.plan.node_inputs[index], index)
            except Exception as exc:
                failure = failure_for(node, self.graph, f"{type(exc).__name__}: {exc}")
                raise ConversionError([failure], headline="a subgraph node failed:") from exc
        outputs = []
        for name in self.graph.outputs:
            value = self.values[name]
            if value.const is not None:
                outputs.append(tf.constant(value.const))
            else:
                rank = len(value.perm)
                outputs.append(self.input_tensor(name, P.identity(rank), rank))
        return outputs

    def _relearn(self, node: Node, policy) -> list[Perm | None]:
        """For a node reading values whose shapes were learned while building: its outputs'
        shapes from ONNX inference of the node alone, and its layout decided again from
        the perms its inputs actually have (the plan decided it without their ranks); the
        output perms go into the plan, the wanted input perms are returned."""
        graph = self.graph
        for name, (shape, dtype) in late_shapes.infer_node(node, graph, self.constant_value).items():
            if graph.shapes.get(name) is None:
                graph.shapes[name], graph.dtypes[name] = shape, graph.dtypes.get(name) or dtype
                self._learned.add(name)
        in_perms = [None if not n else self.values[n].perm for n in node.inputs]
        decision = policy.decide(node, graph, in_perms)
        for name, perm in zip(node.outputs, decision.outputs):
            if name:
                self.plan.perms[name] = perm
        return decision.inputs

    def _convert_node(self, node: Node, wanted: list[Perm | None], index: int) -> None:
        graph = self.graph
        opset = graph.opset_of(node.domain)
        handler = find_handler(node.op_type, node.domain, opset)
        if any(i in self._learned for i in node.inputs):
            # the plan keeps the decision too: the direct writer run on this plan after the
            # build (-osm with .tflite files, conversion._direct_conversion) reads the node's
            # inputs in the perms its outputs' perms were decided with
            wanted = self.plan.node_inputs[index] = self._relearn(node, handler.layout)
        out_perms = [self.plan.perms.get(o, ()) for o in node.outputs]
        ctx = NodeContext(self, node, graph, wanted, out_perms, opset, self.options)
        result = handler.fn(ctx)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for name, perm, out in zip(node.outputs, out_perms, results):
            if not name or out is None:  # omitted, or named but read by nothing
                continue
            if hasattr(out, "numpy"):  # computed eagerly from constants: a constant, ONNX order
                out = P.to_onnx_order(out.numpy(), perm)
            if isinstance(out, np.ndarray) or np.isscalar(out):
                array = np.asarray(out, dtype=graph.dtypes.get(name))
                self.values[name] = Value(perm=P.identity(array.ndim), const=array)
            else:
                rank = out.shape.rank
                if rank is not None and len(perm) != rank:
                    # ONNX inference left this value's rank unknown, so the plan could not
                    # lay it out: it is in ONNX order, as every handler computes by default.
                    perm = P.identity(rank)
                    self.plan.perms[name] = perm
                if late_shapes.learn(graph, name, out.shape, out.dtype.as_numpy_dtype, perm):
                    self._learned.add(name)
                self.values[name] = Value(perm=perm, tensor=_as_dtype(out, graph.dtypes.get(name)))


def _tf_dtype(dtype: np.dtype) -> tf.DType:
    return tf.as_dtype(np.dtype(dtype))


def _as_dtype(tensor, dtype):
    """Outputs keep their ONNX dtype even where a TF kernel returns another one."""
    if dtype is None:
        return tensor
    want = _tf_dtype(dtype)
    return tensor if tensor.dtype == want else tf.cast(tensor, want)
