"""One ONNX node whose handler writes many TF ops, as one Keras layer (`NodeLayer`).

The Keras functional API makes every TF op called on model tensors a layer of its own
(TFOpLambda): ~3 ms each to create, and replayed layer by layer in each trace of the model
(the saved_model, the TFLite signature, TF's converter). An unrolled LSTM of 100 steps is
~1,200 such layers. A handler that asks for it (`own_layer(ctx)`, ops/rnn.py) instead runs
inside one layer's `call`: the same handler code, on plain tensors, once per trace. The
TF graph it writes, and so the TFLite file, is the one it would have written op by op.

The layer's config holds what the handler reads: the ONNX node, the layouts the plan gave
its inputs and outputs, their shapes and dtypes, which outputs the model reads, the opsets
and the lowering options. Constant inputs are small tensors in the config or the layer's
weights; the handler reads them as numpy arrays, as when it runs outside a layer.
Importing onnx2tf_alt registers the class for `tf_keras.models.load_model`.

The large constants the handler makes from those (a transposed weight, a gate's slice), when
they add up to HELD_BYTES, are held while converting as `ConstantWeights` of the layer's own
(`derived`): the
saved_model stores them as variables and the float32 .tflite binds them after TF's
converter (tflite/late_weights.py), as for a node converted op by op. The Keras files do not
store them: a reloaded layer computes them again from its constant inputs.
"""

from __future__ import annotations

import base64

import numpy as np
import onnx
import tensorflow as tf
import tf_keras
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.graph import Graph, Node, decode_attribute, is_read
from onnx2tf_alt.ir.weights import release
from onnx2tf_alt.layout.perms import constant_in_perm
from onnx2tf_alt.translate.builder import INLINE_CONSTANT_LIMIT
from onnx2tf_alt.translate.context import NodeContext
from onnx2tf_alt.translate.keras_layers import LATE_VALUES, ConstantWeights
from onnx2tf_alt.translate.options import ConversionOptions
from onnx2tf_alt.translate.registry import find_handler


def encode_proto(message) -> str:
    """A protobuf message as text for a Keras layer config."""
    return base64.b64encode(message.SerializeToString()).decode("ascii")


def decode_proto(cls, text: str):
    return cls.FromString(base64.b64decode(text))


# Made constants of at least this many bytes in all are held as weights; fewer stay graph
# constants, which TF's converter folds faster than the .tflite binds them after it
# (tflite/late_weights.py walks every op): an unrolled 2-layer bidirectional LSTM, 2.4 MB,
# converts in 12.6 s against 16.1 s; one of 50 MB in 11.0 s and 1.3 GB against 15.2 s and
# 2.3 GB (the converter's peak) when they are constants.
HELD_BYTES = 8 << 20

# Keras learns a layer's outputs by tracing its `call` once, which runs the handler (an
# unrolled recurrence: all its steps). That trace is skipped where it cannot matter: the
# graph knows every output's shape and dtype, and the constants the handler makes cannot
# reach HELD_BYTES. They are the node's constant inputs transposed, sliced or summed:
# 0.99-1.16x their bytes on the RNNs of benchmarks/export_rnn.py; MADE_PER_INPUT bounds it.
MADE_PER_INPUT = 4
SIGNATURE_FROM_GRAPH = True  # False: always traced (the tests compare both)

ENABLED = True  # False: handlers write their ops one by one (the tests compare both)


def own_layer(ctx: NodeContext) -> list | None:
    """The node's outputs from a `NodeLayer` running the node's handler, when the node
    reads Keras model tensors; None when the handler should write its ops itself: it runs
    inside such a layer already, inside a subgraph (plain tensors), or on constants only."""
    if ctx.in_layer or not ENABLED:
        return None
    tensor_inputs = [i for i in range(ctx.num_inputs) if ctx.has(i) and ctx.const(i) is None]
    tensors = [ctx.x(i) for i in tensor_inputs]
    if not any(tf_keras.backend.is_keras_tensor(t) for t in tensors):
        return None
    return NodeLayer.of(ctx, tensor_inputs, tensors)


@tf_keras.saving.register_keras_serializable(package="onnx2tf_alt")
class NodeLayer(tf_keras.layers.Layer):
    """Runs one node's handler on the tensors it reads (see the module's docstring)."""

    def __init__(self, node: str, opsets: dict, in_perms: list, out_perms: list,
                 values: dict, tensor_inputs: list, read_outputs: list, constants: str,
                 weight_specs: list, options: dict, **kwargs):
        kwargs["autocast"] = False  # float64 and float16 values keep their dtype
        super().__init__(**kwargs)
        self.node, self.opsets = node, {str(k): int(v) for k, v in opsets.items()}
        self.in_perms = [None if p is None else [int(a) for a in p] for p in in_perms]
        self.out_perms = [[int(a) for a in p] for p in out_perms]
        self.values = {str(n): [None if s is None else [None if d is None else int(d)
                                                         for d in s], t]
                       for n, (s, t) in values.items()}
        self.tensor_inputs = [int(i) for i in tensor_inputs]
        self.read_outputs = [str(n) for n in read_outputs]
        self.constants, self.options = constants, dict(options)
        self.weight_specs = [(str(n), [int(d) for d in s], str(t)) for n, s, t in weight_specs]
        self.const_weights = [
            self.add_weight(name=f"const_{i}", shape=shape, dtype=dtype, trainable=False,
                            initializer="zeros")
            for i, (_, shape, dtype) in enumerate(self.weight_specs)
        ]
        self._arrays: dict[str, np.ndarray] | None = None  # the constants, while converting
        self._made: list | None = None
        self._known: list | None = None  # output specs for Keras' symbolic call, in `of`
        self._decoded = None
        # Set by `of` past Keras' attribute tracking, so that the Keras files leave it out.
        object.__setattr__(self, "derived", [])

    @classmethod
    def of(cls, ctx: NodeContext, tensor_inputs: list[int], tensors: list) -> list:
        """The layer for ctx's node, called on `tensors` (inputs `tensor_inputs`, already
        in the perms the plan asked for); the node's outputs, None where omitted."""
        node, graph = ctx.node, ctx.graph
        arrays = {n: ctx.const(i) for i, n in enumerate(node.inputs)
                  if n and i not in tensor_inputs}
        large = {n: a for n, a in arrays.items()
                 if a.size > INLINE_CONSTANT_LIMIT and a.dtype != bool}
        small = [numpy_helper.from_array(a, n) for n, a in arrays.items() if n not in large]
        names = [n for n in [*node.inputs, *node.outputs] if n]
        layer = cls(
            node=encode_proto(node.proto),
            opsets=graph.opsets,
            in_perms=[None if p is None else list(p) for p in ctx.in_perms],
            out_perms=[list(p) for p in ctx.out_perms],
            values={n: [None if graph.shapes.get(n) is None else list(graph.shapes[n]),
                        None if graph.dtypes.get(n) is None else np.dtype(graph.dtypes[n]).name]
                    for n in names},
            tensor_inputs=tensor_inputs,
            read_outputs=[n for n in node.outputs if n and is_read(graph, n)],
            constants=encode_proto(helper.make_graph([], "constants", [], [], small)),
            weight_specs=[(n, a.shape, a.dtype.name) for n, a in large.items()],
            options={"disable_group_convolution": ctx.options.disable_group_convolution,
                     "pseudo_operators": sorted(ctx.options.pseudo_operators)},
        )
        layer.set_weights(list(large.values()))
        for array in large.values():
            release(array)  # the layer holds its own copy (an array kept on disk pages out)
        layer._arrays = arrays
        made: list[np.ndarray] = []
        known = layer._graph_signature(tensors)
        if known is not None and (
                MADE_PER_INPUT * sum(a.nbytes for a in arrays.values()) < HELD_BYTES):
            layer._known = known
            outputs = layer(tensors)  # no trace: the outputs the graph gives
            layer._known = None
        else:
            layer._made = made
            outputs = layer(tensors)  # Keras' symbolic call: the constants the handler made
            layer._made = None
        held = sum(a.nbytes for a in made) >= HELD_BYTES
        while held and made:
            array = made.pop(0)
            layer.derived.append(ConstantWeights(array.shape, array.dtype.name, initial=array))
            del array
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        present = iter(outputs)
        return [next(present) if n in layer._returned else None for n in node.outputs]

    @property
    def _returned(self) -> list[str]:
        """The outputs the layer returns, in order: the ones the model reads (all named
        ones of a node nothing reads, which has to return something)."""
        return self.read_outputs or [n for n in decode_proto(onnx.NodeProto, self.node).output
                                     if n]

    def _graph_signature(self, tensors: list) -> list | None:
        """The returned outputs as TensorSpecs from the graph's shapes and dtypes (in the
        outputs' perms), or None: some dim or dtype unknown, an input tensor whose dtype is
        not the graph's (a model computed in another precision), or SIGNATURE_FROM_GRAPH
        off."""
        if not SIGNATURE_FROM_GRAPH:
            return None
        proto = decode_proto(onnx.NodeProto, self.node)
        for i, tensor in zip(self.tensor_inputs, tensors):
            dtype = self.values[proto.input[i]][1]
            if dtype is None or tf.as_dtype(tensor.dtype).name != dtype:
                return None
        specs = []
        for name in self._returned:
            shape, dtype = self.values[name]
            if shape is None or dtype is None or any(d is None for d in shape):
                return None
            perm = self.out_perms[list(proto.output).index(name)]
            specs.append(tf.TensorSpec([shape[a] for a in perm], tf.as_dtype(dtype)))
        return specs

    def _keras_tensor_symbolic_call(self, inputs, input_masks, args, kwargs):
        if self._known is None:
            return super()._keras_tensor_symbolic_call(inputs, input_masks, args, kwargs)
        return [tf_keras.__internal__.KerasTensor(spec) for spec in self._known]

    def call(self, inputs):
        return self._run(list(inputs) if isinstance(inputs, (list, tuple)) else [inputs])

    @tf.autograph.experimental.do_not_convert  # plain Python that writes TF ops
    def _run(self, inputs: list) -> list:
        node, graph, options = self._decode()
        arrays = self._arrays if self._arrays is not None else self._read_weights()
        graph.constants = arrays
        tensors = {}
        for i, tensor in zip(self.tensor_inputs, inputs):
            perm = self.in_perms[i]
            tensors[(node.inputs[i], None if perm is None else tuple(perm))] = tensor
        values = _LayerValues(arrays, tensors, self._made, self.derived)
        ctx = NodeContext(values, node, graph,
                          [None if p is None else tuple(p) for p in self.in_perms],
                          [tuple(p) for p in self.out_perms], graph.opset_of(node.domain),
                          options)
        ctx.in_layer = True
        handler = find_handler(node.op_type, node.domain, ctx.opset)
        result = handler.fn(ctx)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        by_name = dict(zip(node.outputs, results))
        missing = [n for n in self._returned if by_name.get(n) is None]
        if missing:
            raise ValueError(f"{node.op_type} '{node.name}' computed no value for {missing}")
        return [by_name[n] for n in self._returned]

    def _decode(self) -> tuple[Node, Graph, ConversionOptions]:
        """The node, a one-node graph with what the handler reads, and the options."""
        if self._decoded is None:
            proto = decode_proto(onnx.NodeProto, self.node)
            node = Node(name=proto.name, op_type=proto.op_type, domain=proto.domain,
                        inputs=list(proto.input), outputs=list(proto.output),
                        attrs={a.name: decode_attribute(a) for a in proto.attribute},
                        proto=proto)
            shapes = {n: None if s is None else tuple(s) for n, (s, _) in self.values.items()}
            dtypes = {n: np.dtype(t) for n, (_, t) in self.values.items() if t is not None}
            graph = Graph(nodes=[node], inputs=[], outputs=list(self.read_outputs),
                          constants={}, shapes=shapes, dtypes=dtypes, opsets=dict(self.opsets))
            options = ConversionOptions(
                disable_group_convolution=bool(self.options["disable_group_convolution"]),
                pseudo_operators=frozenset(self.options["pseudo_operators"]))
            self._decoded = node, graph, options
        return self._decoded

    def _read_weights(self) -> dict[str, np.ndarray]:
        """The constant inputs from the config and the weights (a reloaded model)."""
        arrays = {init.name: numpy_helper.to_array(init)
                  for init in decode_proto(onnx.GraphProto, self.constants).initializer}
        with tf.init_scope():  # the variables' current values, also while tracing
            for (name, _, _), weight in zip(self.weight_specs, self.const_weights):
                arrays[name] = weight.numpy()
        return arrays

    def get_config(self):
        config = super().get_config()
        config.update(node=self.node, opsets=self.opsets, in_perms=self.in_perms,
                      out_perms=self.out_perms, values=self.values,
                      tensor_inputs=self.tensor_inputs, read_outputs=self.read_outputs,
                      constants=self.constants, weight_specs=self.weight_specs,
                      options=self.options)
        return config


class _LayerValues:
    """What NodeContext asks its builder for, inside a NodeLayer: constants as arrays (and
    as tensors in the perm asked for), and the layer's input tensors.

    A large constant the handler makes is, in order: recorded in `made` (the first call,
    in NodeLayer.of), read from the layer's k-th derived weight (or the input that stands
    for it while the .tflite is converted: LATE_VALUES), or a tf constant (a reloaded
    layer, which has no derived weights)."""

    def __init__(self, arrays: dict[str, np.ndarray], tensors: dict[tuple, object],
                 made: list | None, derived: list):
        self.arrays, self.tensors, self.values = arrays, tensors, {}
        self.made, self.derived, self.large = made, derived, 0

    def constant_value(self, name: str) -> np.ndarray | None:
        return self.arrays.get(name)

    def materialize(self, array: np.ndarray):
        array = np.asarray(array)
        if array.size <= INLINE_CONSTANT_LIMIT or array.dtype == bool:
            return tf.constant(array)
        k, self.large = self.large, self.large + 1
        if self.made is not None:  # Keras' symbolic call, for shapes only
            self.made.append(array)
            return tf.zeros(array.shape, array.dtype)
        if k < len(self.derived):
            weight = self.derived[k]
            if weight.value_shape != array.shape or weight.value_dtype != array.dtype.name:
                raise ValueError(f"derived constant {k}: {array.shape} {array.dtype} made, "
                                 f"{weight.value_shape} {weight.value_dtype} held")
            late = LATE_VALUES.get(id(weight))
            return tf.identity(weight.value if late is None else late)
        return tf.constant(array)

    def input_tensor(self, name: str, perm, align_rank: int):
        if name in self.arrays:
            return self.materialize(constant_in_perm(self.arrays[name], perm))
        return self.tensors[(name, None if perm is None else tuple(perm))]



def serving_weights(model) -> list:
    """The weights a traced call of `model` reads: all but the NodeLayers', whose handlers
    read their constants as arrays (the traced graph holds them as constants). The
    saved_model and TF's converter get these; the Keras files get all of `model.weights`."""
    layers = [layer for layer in model.layers if isinstance(layer, NodeLayer)]
    own = {w.ref() for layer in layers for w in layer.weights}
    derived = [held.value for layer in layers for held in layer.derived]
    return [w for w in model.weights if w.ref() not in own] + derived


def derived_weights(model) -> list[ConstantWeights]:
    """The large constants NodeLayers made while converting (see the module's docstring)."""
    return [held for layer in model.layers if isinstance(layer, NodeLayer)
            for held in layer.derived]
