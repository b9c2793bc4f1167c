"""If, Loop and Scan that run at run time: tf.cond and tf.while_loop (TFLite IF, WHILE).

Constant conditions, short constant loops and short static scans never get here: prepare
inlines them (onnx2tf_alt/passes/control_flow.py). What remains is converted subgraph by subgraph
with the project's own handlers, on plain TF tensors, each time the node is traced: the
subgraph becomes a small ONNX model whose inputs carry the static shapes of the tensors fed
to it, is prepared (shape inference, folding, inlining) and built node by node.

In a Keras model such a node is one `ControlFlow` layer (`control_flow_layer()`); its config
holds the ONNX node (subgraphs included) and the small constants it reads, larger ones are
its weights. Reload such a model from .h5 / .keras with `onnx2tf_alt.custom_objects()`.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.graph import graph_from_model
from onnx2tf_alt.ir.weights import to_array
from onnx2tf_alt.layout.policies import logical
from onnx2tf_alt.passes.control_flow import free_names
from onnx2tf_alt.passes.prepare import prepare_model
from onnx2tf_alt.pipeline import run_subgraph_model
from onnx2tf_alt.translate.late_shapes import IR_VERSION  # one IR version for made-up models
from onnx2tf_alt.translate.lazy import tf, tf_keras
from onnx2tf_alt.translate.options import INLINE_CONSTANT_LIMIT
from onnx2tf_alt.translate.registry import foreign_inference, handler


@handler("If", layout=logical, limits="runtime condition: both branches must give outputs of "
         "the same rank and dtype")
def if_(ctx):
    return _control_node(ctx)


@handler("Loop", layout=logical, limits="runtime trip count or condition (constant ones up to "
         "256 iterations are unrolled): a loop-carried value whose rank changes in the first "
         "step makes that step run before the loop: such a loop runs at least once")
def loop(ctx):
    return _control_node(ctx)


@handler("Scan", since=9, layout=logical, limits="runtime length (static ones are unrolled); "
         "as Loop")
def scan(ctx):
    return _control_node(ctx)


def _control_node(ctx):
    """Run the node now when everything it reads is constant, in a ControlFlow layer when it
    reads Keras model tensors, else directly (inside another subgraph)."""
    node = ctx.node.proto
    reads = [n for n in node.input if n] + free_names_of_node(node)
    values = {name: ctx.value(name) for name in dict.fromkeys(reads)}
    opsets = dict(ctx.graph.opsets)
    tensors = [v for v in values.values() if not isinstance(v, np.ndarray)]
    if not tensors:
        return [np.asarray(t) for t in run_control_node(node, values, opsets)]
    if ctx.recording or not any(tf_keras.backend.is_keras_tensor(t) for t in tensors):
        return run_control_node(node, values, opsets)
    return control_flow_layer().of(node, values, opsets)


def free_names_of_node(node: onnx.NodeProto) -> list[str]:
    """Values of the enclosing graph that the node's subgraphs read."""
    names = []
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            names.extend(free_names(sub))
    return list(dict.fromkeys(names))


# --- running a node on TF tensors --------------------------------------------------------
def run_control_node(node: onnx.NodeProto, values: dict, opsets: dict[str, int]) -> list:
    """The outputs of an If, Loop or Scan node, given every value it reads (tensors or
    arrays)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "If":
        return _run_if(node, attrs["then_branch"], attrs["else_branch"], values, opsets)
    if node.op_type == "Loop":
        return _run_loop(node, attrs["body"], values, opsets)
    return _run_scan(node, attrs, values, opsets)


def _run_if(node, then_branch, else_branch, values, opsets) -> list:
    cond = tf.reshape(tf.cast(values[node.input[0]], tf.bool), [])
    ranks = [_output_ranks(b, opsets, values) for b in (then_branch, else_branch)]
    ranks = [max(a, b) if a is not None and b is not None else None for a, b in zip(*ranks)]

    def branch(graph):
        return [_lifted(o, r) for o, r in zip(run_subgraph(graph, opsets, [], values), ranks)]

    outputs = tf.cond(cond, lambda: branch(then_branch), lambda: branch(else_branch))
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return [_ranked(o) for o in outputs]


def _output_ranks(graph: onnx.GraphProto, opsets, values: dict) -> list[int | None]:
    prepared = graph_from_model(_prepared(graph, opsets, [], values))
    return [prepared.rank(o.name) for o in graph.output]


def _lifted(x, rank: int | None):
    """A one-element branch output of lower rank than the other branch's, reshaped to that
    rank (Paddle2ONNX's branches give () on one side and (1,) on the other; onnxruntime
    passes on either): tf.cond needs one rank to give its output a shape at all."""
    x = tf.convert_to_tensor(x)
    if rank is None or x.shape.rank is None or x.shape.rank >= rank:
        return x
    if x.shape.num_elements() != 1:
        return x
    return tf.reshape(x, [1] * rank)


def _ranked(x):
    """`x` through a RESHAPE to its own static shape (-1 for its one unknown dim): TF's
    converter gives an IF's outputs no shape, not even a rank, in the .tflite, so the ops
    after it were lowered as if nothing were known of it (the clamping that a
    `keep[:post_nms_top_n]` after torchvision's batched_nms needs is ops/tensor.py's
    `_clamped_to_dim`)."""
    dims = x.shape.as_list() if x.shape.rank is not None else None
    if dims is None or sum(d is None for d in dims) > 1:
        return x
    return tf.reshape(x, [-1 if d is None else d for d in dims])


def _run_loop(node, body, values, opsets) -> list:
    names = list(node.input) + [""] * (2 - len(node.input))
    trip = _scalar_tensor(values, names[0], tf.int64)
    cond = _scalar_tensor(values, names[1], tf.bool)
    state = [tf.convert_to_tensor(values[n]) for n in names[2:]]
    empty = [isinstance(values[n], np.ndarray) and values[n].size == 0 for n in names[2:]]
    return _iterate(_Body(body, opsets, values, is_loop=True), state, trip, cond, empty)


def _run_scan(node, attrs, values, opsets) -> list:
    n_in = attrs["num_scan_inputs"]
    names = list(node.input)
    sequences = [tf.convert_to_tensor(values[n]) for n in names[len(names) - n_in:]]
    state = [tf.convert_to_tensor(values[n]) for n in names[: len(names) - n_in]]
    n_out = len(attrs["body"].output) - len(state)
    in_axes = attrs.get("scan_input_axes", [0] * n_in)
    in_dirs = attrs.get("scan_input_directions", [0] * n_in)
    steps_first = [_axis_to_front(x, a, d) for x, a, d in zip(sequences, in_axes, in_dirs)]
    length = tf.shape(steps_first[0], out_type=tf.int64)[0]
    body = _Body(attrs["body"], opsets, values, is_loop=False, sequences=steps_first)
    results = _iterate(body, state, length, None)
    out_axes = attrs.get("scan_output_axes", [0] * n_out)
    out_dirs = attrs.get("scan_output_directions", [0] * n_out)
    scans = [_front_to_axis(s, a, d)
             for s, a, d in zip(results[len(state):], out_axes, out_dirs)]
    return results[: len(state)] + scans


def _axis_to_front(x, axis: int, reverse: int):
    axis %= x.shape.rank
    if axis:
        x = tf.transpose(x, [axis, *[a for a in range(x.shape.rank) if a != axis]])
    return tf.reverse(x, [0]) if reverse else x


def _front_to_axis(x, axis: int, reverse: int):
    x = tf.reverse(x, [0]) if reverse else x
    axis %= x.shape.rank
    if not axis:
        return x
    return tf.transpose(x, [*range(1, axis + 1), 0, *range(axis + 1, x.shape.rank)])


class _Body:
    """A Loop or Scan body: what it is fed each step and where its outputs are.

    Loop bodies take (iteration, condition, *state) and return (condition, *state, *scans);
    Scan bodies take (*state, *one step of each sequence) and return (*state, *scans).
    """

    def __init__(self, graph, opsets, values, is_loop: bool, sequences=()):
        self.graph, self.opsets, self.values = graph, opsets, values
        self.is_loop, self.sequences = is_loop, list(sequences)
        self.first = 1 if is_loop else 0  # index of the first state output

    def feeds(self, i, c, state: list) -> list:
        if self.is_loop:
            return [i, c, *state]
        return [*state, *[tf.gather(x, i) for x in self.sequences]]

    def feed_specs(self, state_specs: list) -> list:
        if self.is_loop:
            return [tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.bool), *state_specs]
        return [*state_specs, *[tf.TensorSpec(x.shape[1:], x.dtype) for x in self.sequences]]

    def run(self, feeds: list) -> tuple[object, list]:
        """One step: (condition output or None, state outputs followed by scan outputs)."""
        outputs = run_subgraph(self.graph, self.opsets, feeds, self.values)
        cond = tf.reshape(tf.cast(outputs[0], tf.bool), []) if self.is_loop else None
        return cond, outputs[self.first :]

    def signature(self, state: list):
        """Shapes the state keeps across steps (dims that change become None, a rank that
        changes leaves no shape) and the specs of one scan-output element, from ONNX shape
        inference of the body."""
        shapes, n = [t.shape for t in state], len(state)
        for _ in range(4):
            specs = self.feed_specs([tf.TensorSpec(s, t.dtype) for s, t in zip(shapes, state)])
            graph = graph_from_model(_prepared(self.graph, self.opsets, specs, self.values))
            outs = [(_tf_shape(graph.shapes.get(o.name)),
                     graph.dtypes.get(o.name) or _declared_dtype(o)) for o in self.graph.output]
            outs = outs[self.first :]
            relaxed = [_relax(s, o) for s, (o, _) in zip(shapes, outs[:n])]
            if relaxed == shapes:
                break
            shapes = relaxed
        return shapes, [tf.TensorSpec(s, tf.as_dtype(d)) for s, d in outs[n:]]


def _declared_dtype(info: onnx.ValueInfoProto) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)


def _iterate(body: _Body, state: list, count, cond, empty: list | None = None) -> list:
    """tf.while_loop over the body; returns the final state, then each scan output stacked
    along a new axis 0. State values flagged `empty` (constants of no elements, e.g.
    torchvision's (0, H, W) start of the masks it pastes one by one) are carried flattened
    behind a placeholder element, with their shape beside them: TFLite's WHILE fails on an
    empty loop tensor.

    Where a state value's rank changes in the first step (Paddle2ONNX starts values the
    body replaces with a scalar placeholder), that step runs before the loop, which then
    carries values of one rank: such a loop runs at least once."""
    n_state = len(state)
    empty = empty or [False] * n_state
    state_shapes, scan_specs = body.signature(state)
    first = tf.constant(0, tf.int64)
    cond = tf.constant(True) if cond is None else cond
    scans = [_empty_scan(spec) for spec in scan_specs]
    if any(s.rank is None and t.shape.rank is not None for s, t in zip(state_shapes, state)):
        c_next, outputs = body.run(body.feeds(first, cond, state))
        state, empty = outputs[:n_state], [False] * n_state
        first, cond = first + 1, cond if c_next is None else c_next
        state_shapes, scan_specs = body.signature(state)
        scans = [_append(_empty_scan(spec), o) for spec, o in zip(scan_specs, outputs[n_state:])]

    def keep_going(i, c, *_):
        return c if count is None else tf.logical_and(c, i < count)

    def step(i, c, *carried):
        inner = [_unpadded(v, shape) if e else v
                 for v, e, shape in zip(carried[:n_state], empty, state_shapes)]
        c_next, outputs = body.run(body.feeds(i, c, inner))
        kept = [_padded(v) if e else v for v, e in zip(outputs[:n_state], empty)]
        grown = [_append(a, o) for a, o in zip(carried[n_state:], outputs[n_state:])]
        return (i + 1, c if c_next is None else c_next, *kept, *grown)

    invariants = (tf.TensorShape([]), tf.TensorShape([]),
                  *[(tf.TensorShape([None]), tf.TensorShape([s.rank])) if e else s
                    for s, e in zip(state_shapes, empty)],
                  *[_scan_invariant(spec) for spec in scan_specs])
    initial = [_padded(v) if e else v for v, e in zip(state, empty)]
    result = tf.while_loop(keep_going, step, (first, cond, *initial, *scans),
                           shape_invariants=invariants)
    count, final = result[0], list(result[2:])
    scans = [_stacked(a, spec, count) for a, spec in zip(final[n_state:], scan_specs)]
    return [_unpadded(v, shape) if e else v
            for v, e, shape in zip(final[:n_state], empty, state_shapes)] + scans


def _padded(value):
    """(placeholder + value flattened, value's shape): never an empty tensor."""
    flat = tf.concat([tf.zeros([1], value.dtype), tf.reshape(value, [-1])], 0)
    return flat, tf.shape(value, out_type=tf.int32)


def _unpadded(carried, shape: tf.TensorShape):
    flat, dims = carried
    value = tf.reshape(flat[1:], dims)
    if shape.rank is not None:
        value.set_shape(shape)
    return value


# Scan outputs grow by concatenation, TFLite builtins only. An element of static shape is
# appended as a row; any other is appended flattened, its shape kept beside it for the
# final reshape. Both start from a placeholder element, dropped at the end: TFLite's WHILE
# fails on an empty loop tensor.
def _empty_scan(spec: tf.TensorSpec):
    if spec.shape.is_fully_defined():
        return tf.zeros([1, *spec.shape.as_list()], spec.dtype)
    return tf.zeros([1], spec.dtype), tf.zeros([spec.shape.rank or 0], tf.int32)


def _append(scan, value):
    if not isinstance(scan, tuple):
        return tf.concat([scan, tf.expand_dims(value, 0)], 0)
    flat, _ = scan
    return tf.concat([flat, tf.reshape(value, [-1])], 0), tf.shape(value)


def _scan_invariant(spec: tf.TensorSpec):
    if spec.shape.is_fully_defined():
        return tf.TensorShape([None, *spec.shape.as_list()])
    return tf.TensorShape([None]), tf.TensorShape([spec.shape.rank])


def _stacked(scan, spec: tf.TensorSpec, count):
    if not isinstance(scan, tuple):
        return scan[1:]
    flat, shape = scan
    rows = tf.reshape(tf.cast(count, tf.int32), [1])
    stacked = tf.reshape(flat[1:], tf.concat([rows, shape], 0))
    if spec.shape.rank is not None:
        stacked.set_shape([None, *spec.shape.as_list()])
    return stacked


def _scalar_tensor(values, name: str, dtype):
    return None if not name else tf.reshape(tf.cast(values[name], dtype), [])


def _relax(before: tf.TensorShape, after: tf.TensorShape) -> tf.TensorShape:
    """A shape both fit: dims that differ (or that inference left unknown) become None."""
    if after.rank is None:
        return tf.TensorShape([None] * before.rank) if before.rank is not None else after
    if before.rank != after.rank:
        return tf.TensorShape(None)
    return tf.TensorShape([a if a == b else None for a, b in zip(before.as_list(), after.as_list())])


def _tf_shape(shape) -> tf.TensorShape:
    return tf.TensorShape(None if shape is None else list(shape))


# --- converting a subgraph ---------------------------------------------------------------
def run_subgraph(graph: onnx.GraphProto, opsets: dict[str, int], formal: list, outer: dict):
    """Convert and run `graph` on TF tensors: `formal` feeds its inputs in order, `outer`
    holds the enclosing scopes' values (tensors, or arrays for constants) by name.

    Returns its outputs in ONNX order and dtype, in identity layout.
    """
    prepared = _prepared(graph, opsets, formal, outer)
    feeds = dict(zip([i.name for i in graph.input], formal))
    constants = {t.name for t in prepared.graph.initializer}
    feeds.update({i.name: outer[i.name] for i in prepared.graph.input
                  if i.name not in feeds and i.name not in constants})
    return run_subgraph_model(prepared, feeds)


def _prepared(graph: onnx.GraphProto, opsets, formal: list, outer: dict) -> onnx.ModelProto:
    """The subgraph as a prepared model: inputs typed like the tensors fed to them, outer
    constants as initializers, outer tensors as more inputs."""
    sub = onnx.GraphProto()
    sub.CopyFrom(graph)
    del sub.input[:]
    del sub.value_info[:]
    sub.input.extend(_value_info(i.name, t) for i, t in zip(graph.input, formal))
    for name in free_names(graph):
        value = outer[name]
        if isinstance(value, np.ndarray):
            sub.initializer.append(numpy_helper.from_array(value, name))
        else:
            sub.input.append(_value_info(name, value))
    fed = {i.name: i for i in sub.input}
    for out in sub.output:  # shapes come from inference on the actual input shapes
        if out.name in fed:
            # an output that passes an input through (a loop-carried weight) has the input's
            # type: a shapeless copy of it makes ONNX inference drop every shape in the body
            out.type.CopyFrom(fed[out.name].type)
        else:
            out.type.tensor_type.ClearField("shape")
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(sub, opset_imports=imports)
    model.ir_version = IR_VERSION
    return prepare_model(model, infer_foreign=foreign_inference)


def _value_info(name: str, tensor) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype.as_numpy_dtype))
    shape = tensor.shape
    return helper.make_tensor_value_info(name, elem, None if shape.rank is None else shape.as_list())


# --- the Keras layer ---------------------------------------------------------------------
def _lift_initializers(graph: onnx.GraphProto, lifted: dict[str, np.ndarray]) -> None:
    """Move large subgraph initializers out of the subgraph (they become layer weights)."""
    kept = []
    for init in graph.initializer:
        array = to_array(init)
        if array.size > INLINE_CONSTANT_LIMIT and array.dtype != bool:
            lifted[init.name] = array
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _lift_initializers(sub, lifted)


@functools.cache
def control_flow_layer() -> type:
    """The Keras layer class of one run-time If / Loop / Scan node, defined (and registered
    with Keras) at its first use: importing the handlers does not load Keras."""
    from onnx2tf_alt.translate.node_layer import decode_proto, encode_proto

    @tf_keras.saving.register_keras_serializable(package="onnx2tf_alt")
    class ControlFlow(tf_keras.layers.Layer):
        """One ONNX If, Loop or Scan node, converted each time the layer is traced.

        Its inputs are the model tensors the node reads (`tensor_names`); small constants travel
        in the config, larger ones are non-trainable weights.
        """

        def __init__(self, node: str, opsets: dict, tensor_names: list, constants: str,
                     weight_specs: list, **kwargs):
            kwargs["autocast"] = False  # float64 and float16 values keep their dtype
            super().__init__(**kwargs)
            self.node, self.opsets = node, {k: int(v) for k, v in opsets.items()}
            self.tensor_names, self.constants = list(tensor_names), constants
            self.weight_specs = [(str(n), [int(d) for d in s], str(t)) for n, s, t in weight_specs]
            self.const_weights = [
                self.add_weight(name=f"const_{i}", shape=shape, dtype=dtype, trainable=False,
                                initializer="zeros")
                for i, (_, shape, dtype) in enumerate(self.weight_specs)
            ]
            self._traced = None

        @classmethod
        def of(cls, node: onnx.NodeProto, values: dict, opsets: dict) -> list:
            """The layer for `node`, called on the model tensors it reads."""
            node_copy = onnx.NodeProto()
            node_copy.CopyFrom(node)
            lifted: dict[str, np.ndarray] = {}
            for attr in node_copy.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    _lift_initializers(attr.g, lifted)
            values = {**values, **lifted}
            arrays = {n: v for n, v in values.items() if isinstance(v, np.ndarray)}
            large = {n: a for n, a in arrays.items()
                     if a.size > INLINE_CONSTANT_LIMIT and a.dtype != bool}
            small = [numpy_helper.from_array(a, n) for n, a in arrays.items() if n not in large]
            tensors = {n: v for n, v in values.items() if n not in arrays}
            layer = cls(
                node=encode_proto(node_copy),
                opsets=opsets,
                tensor_names=list(tensors),
                constants=encode_proto(helper.make_graph([], "constants", [], [], small)),
                weight_specs=[(n, a.shape, a.dtype.name) for n, a in large.items()],
            )
            layer.set_weights(list(large.values()))
            outputs = layer(list(tensors.values()))
            return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

        def call(self, inputs):
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if tf.executing_eagerly():  # convert the subgraphs once per input signature
                if self._traced is None:
                    self._traced = tf.function(self._run, autograph=False)
                return self._traced(inputs)
            return self._run(inputs)

        @tf.autograph.experimental.do_not_convert  # plain Python that builds TF ops
        def _run(self, inputs: list):
            values = dict(zip(self.tensor_names, inputs))
            for init in decode_proto(onnx.GraphProto, self.constants).initializer:
                values[init.name] = to_array(init)
            for (name, _, _), weight in zip(self.weight_specs, self.const_weights):
                values[name] = tf.convert_to_tensor(weight)
            return run_control_node(decode_proto(onnx.NodeProto, self.node), values, self.opsets)

        def get_config(self):
            config = super().get_config()
            config.update(node=self.node, opsets=self.opsets, tensor_names=self.tensor_names,
                          constants=self.constants, weight_specs=self.weight_specs)
            return config

    return ControlFlow
