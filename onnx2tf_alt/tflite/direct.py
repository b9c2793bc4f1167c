"""The direct TFLite writer: a float32 .tflite written from the prepared graph and its layout
plan, without TensorFlow.

Each node is written by its op's direct writer, registered next to its handler
(`translate.registry.direct`, in the same ops module, sharing its decisions): it reads the
node through `DirectContext` (the names of translate/context.NodeContext: attributes,
constants, shapes, perms) and adds TFLite operators. Inputs reach a writer in the perm its
layout policy asked for, moved exactly as the TF route moves them (a RESHAPE when only unit
axes move, else a TRANSPOSE), so both routes have the same transposes. After the last node,
the activations TF's converter fuses (RELU, RELU6, RELU_N1_TO_1 after a conv, a dense
layer or arithmetic) are fused the same way, and a RESHAPE of a RESHAPE becomes one.

A model is written directly only when every node is covered: a float32 graph whose tensors
have known shapes but for the batch, and a writer that takes the node's attributes (a writer
raises `NotCovered` for the rest). `write_direct` returns None otherwise, with the reason,
and the caller converts with TF (said at `-v info`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.layout.plan import Plan
from onnx2tf_alt.tflite.flatbuffer import (
    FILE_IDENTIFIER,
    SIGNATURE,
    RawBufferT,
    pack_table,
    schema,
)
from onnx2tf_alt.translate.context import NodeView
from onnx2tf_alt.translate.io_layout import keras_name
from onnx2tf_alt.translate.options import DEFAULT_OPTIONS, ConversionOptions
from onnx2tf_alt.translate.registry import find_direct

log = logging.getLogger("onnx2tf_alt")

DESCRIPTION = b"onnx2tf_alt direct writer"
LIMIT_BYTES = 1 << 30  # larger models go through TF's route (files past 2 GB need offsets)
FUSABLE = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL", "DIV"}
ACTIVATIONS = {"RELU": schema.ActivationFunctionType.RELU,
               "RELU6": schema.ActivationFunctionType.RELU6,
               "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1}
_TYPES = {np.dtype(np.float32): schema.TensorType.FLOAT32,
          np.dtype(np.int32): schema.TensorType.INT32,
          np.dtype(np.int64): schema.TensorType.INT64}


class NotCovered(Exception):
    """A node the direct writer does not write: the model goes through TF's converter."""


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
class _Value:
    tensor: int | None  # None: a constant (`const`, ONNX order)
    perm: Perm
    const: np.ndarray | None = None


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
        if dtype not in _TYPES:
            raise NotCovered(f"dtype {dtype}")
        if sum(d is None for d in shape) > 1:
            raise NotCovered(f"'{name}' has several unknown dims {list(shape)}")
        t = schema.TensorT()
        t.name = name.encode()
        t.type = _TYPES[dtype]
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

    def op(self, name: str, inputs: list[int], outputs: list[int], opts=None) -> None:
        self.operators.append(Operator(name, list(inputs), list(outputs), opts))


class DirectContext(NodeView):
    """What a direct writer sees of its node: a NodeView (attributes, constants, logical
    shapes and dtypes, perms, as a handler's NodeContext), `x(i)` a tensor index in the perm
    it asked for; it adds operators with `op` and gives its outputs `output(j)`."""

    def __init__(self, writer: DirectWriter, node: Node, in_perms, out_perms, opset: int):
        super().__init__(node, writer.graph, in_perms, out_perms, opset, writer.options)
        self._writer = writer
        self.flat = writer.flat
        self.shared = writer.shared  # results several nodes compute alike, by a writer's key

    def _constant(self, name: str) -> np.ndarray | None:
        return self._writer.values[name].const

    def x(self, i: int) -> int:
        return self._writer.input_tensor(self.node.inputs[i], self.in_perms[i])

    # --- writing -----------------------------------------------------------------------
    def weight(self, array: np.ndarray, suffix: str = "weight") -> int:
        """A constant tensor holding `array` as it is (physical layout)."""
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        return self.flat.tensor(f"{self.node.name}/{suffix}", array.shape, array.dtype, array)

    def ints(self, values, suffix: str = "shape") -> int:
        return self.weight(np.asarray(values, np.int32), suffix)

    def output(self, j: int = 0) -> int:
        """The tensor of output j (its ONNX name and physical shape)."""
        name = self.node.outputs[j]
        shape = self.out_phys_shape(j)
        if shape is None:
            raise NotCovered(f"output '{name}' has no known shape")
        return self.flat.tensor(name, shape, self.out_dtype(j) or np.float32)

    def reshape(self, source: int, shape, out: int) -> None:
        """RESHAPE `source` to `shape` (one None: -1) into `out`."""
        self._writer.reshape(source, shape, out)

    def temp(self, shape, suffix: str) -> int:
        return self.flat.tensor(f"{self.node.name}/{suffix}", shape)

    def op(self, name: str, inputs: list[int], outputs, opts=None) -> None:
        outputs = [outputs] if isinstance(outputs, int) else outputs
        self.flat.op(name, inputs, outputs, opts)


class DirectWriter:
    """Writes one prepared graph with its plan (see the module's docstring)."""

    def __init__(self, graph: Graph, plan: Plan, options: ConversionOptions = DEFAULT_OPTIONS):
        self.graph, self.plan, self.options = graph, plan, options
        self.flat = FlatGraph()
        self.values: dict[str, _Value] = {
            name: _Value(None, P.identity(a.ndim), a) for name, a in graph.constants.items()}
        self._moved: dict[tuple[str, Perm], int] = {}
        self.shared: dict = {}

    def input_tensor(self, name: str, want: Perm | None) -> int:
        value = self.values[name]
        if value.const is not None:
            array = value.const
            if want is not None:
                array = np.transpose(array.reshape((1,) * (len(want) - array.ndim) + array.shape),
                                     want)
            self._check_dtype(name, array.dtype)
            return self.flat.tensor(f"{name}/{'_'.join(map(str, want or ()))}", array.shape,
                                    array.dtype, array)
        if want is None or tuple(want) == tuple(value.perm):
            return value.tensor
        key = (name, tuple(want))
        if key not in self._moved:
            self._moved[key] = self._relayout(name, value, tuple(want))
        return self._moved[key]

    def _relayout(self, name: str, value: _Value, want: Perm) -> int:
        """As translate/builder.py's: leading unit axes for a longer perm, a RESHAPE when
        only unit axes move, else a TRANSPOSE."""
        have, phys = tuple(value.perm), self.flat.shape(value.tensor)
        extra = len(want) - len(have)
        if extra > 0:
            have = tuple(range(extra)) + tuple(a + extra for a in have)
            phys = (1,) * extra + phys
        move = P.transpose_between(have, want)
        target = tuple(phys[a] for a in move)
        out = self.flat.tensor(f"{name}/{'_'.join(map(str, want))}", target)
        if extra > 0 or P.moves_only_unit_axes(phys, move):
            self.reshape(value.tensor, target, out)
        else:
            perm = self.flat.tensor(f"{name}/perm", (len(move),), np.int32,
                                    np.array(move, np.int32))
            self.flat.op("TRANSPOSE", [value.tensor, perm], [out])
        return out

    def reshape(self, source: int, shape, out: int) -> None:
        """RESHAPE `source` to `shape` (one None: -1) into `out`."""
        dims = [-1 if d is None else int(d) for d in shape]
        target = self.flat.tensor(f"{self.flat.tensors[out].name.decode()}/shape", (len(dims),),
                                  np.int32, np.array(dims, np.int32))
        self.flat.op("RESHAPE", [source, target], [out])

    @staticmethod
    def _check_dtype(name: str, dtype) -> None:
        if np.dtype(dtype) != np.float32:
            raise NotCovered(f"'{name}' is {np.dtype(dtype)}: the direct writer writes float32 "
                             "graphs")

    def write(self) -> DirectResult:
        graph, plan, flat = self.graph, self.plan, self.flat
        taken: set[str] = set()
        input_names, inputs = {}, []
        for name in graph.inputs:
            shape, perm = graph.shapes.get(name), plan.perms[name]
            self._check_dtype(name, graph.dtypes[name])
            if shape is None:
                raise NotCovered(f"input '{name}' has no known shape")
            input_names[name] = key = keras_name(name, taken)
            index = flat.tensor(f"serving_default_{key}:0", P.physical_shape(shape, perm))
            self.values[name] = _Value(index, perm)
            inputs.append(index)
        for position, node in enumerate(graph.nodes):
            self._write_node(node, plan.node_inputs[position])
        output_names, output_keys, outputs = {}, [], []
        for name in graph.outputs:
            key = keras_name(name, taken)
            output_names.setdefault(name, key)
            output_keys.append(key)
            value = self.values[name]
            if value.const is not None:
                raise NotCovered(f"output '{name}' is a constant")
            index = self.input_tensor(name, plan.output_perms[name])
            if index in inputs or index in outputs:
                raise NotCovered(f"output '{name}' is an input or another output")
            outputs.append(index)
        _fold_affine(flat, outputs)
        while _fold_into_dense(flat, outputs):
            pass
        _fuse_activations(flat, outputs)
        _merge_reshapes(flat, outputs)
        _flatten_into_dense(flat, outputs)
        content = _pack(flat, inputs, outputs, list(input_names.values()), output_keys)
        return DirectResult(content, input_names, output_names,
                            {n: plan.perms[n] for n in graph.inputs}, dict(plan.output_perms),
                            output_keys)

    def _write_node(self, node: Node, wanted: list[Perm | None]) -> None:
        opset = self.graph.opset_of(node.domain)
        writer = find_direct(node.op_type, node.domain, opset)
        where = f"node '{node.name}' ({node.op_type})"
        if writer is None:
            raise NotCovered(f"{where}: no direct writer")
        for name in (*[n for n in node.inputs if n], *[n for n in node.outputs if n]):
            if name not in self.graph.constants:
                self._check_dtype(name, self.graph.dtypes.get(name, np.float32))
        out_perms = [self.plan.perms.get(o, ()) for o in node.outputs]
        ctx = DirectContext(self, node, wanted, out_perms, opset)
        try:
            result = writer(ctx)
        except NotCovered as reason:
            raise NotCovered(f"{where}: {reason}") from None
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for name, perm, index in zip(node.outputs, out_perms, results):
            if name:
                self.values[name] = _Value(index, perm)


@dataclass
class DirectResult:
    """A direct .tflite and its I/O names and perms (the names BuildResult has)."""

    content: bytes
    input_names: dict[str, str]
    output_names: dict[str, str]
    input_perms: dict[str, Perm]
    output_perms: dict[str, Perm]
    output_keys: list[str]
    model = None  # no Keras model
    values = MappingProxyType({})  # nor Keras tensors (export/tflite.layer_owners)

    def to_physical(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {key: P.to_physical_order(feeds[name], self.input_perms[name])
                for name, key in self.input_names.items()}

    def to_onnx(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: P.to_onnx_order(outputs[key], self.output_perms[name])
                for name, key in self.output_names.items() if key in outputs}


def write_direct(graph: Graph, plan: Plan,
                 options: ConversionOptions = DEFAULT_OPTIONS) -> DirectResult | NotCovered:
    """The direct .tflite of a prepared, planned graph, or the NotCovered that says why it
    must go through TF's converter."""
    try:
        return DirectWriter(graph, plan, options).write()
    except NotCovered as reason:
        return reason


def _consumers(flat: FlatGraph) -> dict[int, list[Operator]]:
    readers: dict[int, list[Operator]] = {}
    for op in flat.operators:
        for i in op.inputs:
            readers.setdefault(i, []).append(op)
    return readers


_FILTER_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}  # output channels


def _constant(flat: FlatGraph, index: int) -> np.ndarray | None:
    """A float32 constant tensor's values (a view of its buffer), or None."""
    tensor = flat.tensors[index]
    data = flat.buffers[tensor.buffer].data
    if data is None or tensor.type != schema.TensorType.FLOAT32:
        return None
    return data.view(np.float32).reshape(tuple(tensor.shape))


def _fold_affine(flat: FlatGraph, outputs: list[int]) -> None:
    """A MUL or ADD by a constant of one value or one per output channel, whose other input
    is the one use of a CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED output (no fused
    activation, with a constant filter and bias), goes into that op's filter and bias
    (as TF's converter folds them): the MUL scales both, the ADD shifts the bias."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name not in ("MUL", "ADD") or op.options[1].fusedActivationFunction:
            continue
        for k in (0, 1):
            source = producers.get(op.inputs[k])
            factor = _constant(flat, op.inputs[1 - k])
            if (source is None or source.name not in _FILTER_AXIS or factor is None
                    or op.inputs[k] in outputs or len(readers.get(op.inputs[k], [])) != 1
                    or source.options[1].fusedActivationFunction):
                continue
            channels = flat.shape(source.outputs[0])[-1]
            filt = _constant(flat, source.inputs[1])
            if (filt is None or factor.size not in (1, channels)
                    or any(d != 1 for d in factor.shape[:-1])):
                continue
            if len(source.inputs) < 3:  # a product without bias (MatMul): a zero one
                name = flat.tensors[source.outputs[0]].name.decode()
                source.inputs.append(flat.tensor(f"{name}/bias", (channels,), np.float32,
                                                 np.zeros(channels, np.float32)))
            bias = _constant(flat, source.inputs[2])
            if bias is None:
                continue
            values = factor.reshape(-1)
            if op.name == "MUL":
                shape = [1] * filt.ndim
                shape[_FILTER_AXIS[source.name]] = values.size
                _replace(flat, source.inputs[1], filt * values.reshape(shape))
                _replace(flat, source.inputs[2], bias * values)
            else:
                _replace(flat, source.inputs[2], bias + values)
            source.outputs = list(op.outputs)
            producers[op.outputs[0]] = source
            gone.append(op)
            break
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _fold_into_dense(flat: FlatGraph, outputs: list[int]) -> bool:
    """A MUL or ADD by a constant of one value or one per channel whose output only
    FULLY_CONNECTED ops read (as their input, with constant weights), a LayerNormalization's
    scale and shift before a Linear: into each one's weights (W diag(g)) and bias (W b), as
    TF's converter folds them. Returns whether one was folded (the caller repeats: the
    shift first, then the scale)."""
    readers = _consumers(flat)
    for op in flat.operators:
        if op.name not in ("MUL", "ADD") or op.options[1].fusedActivationFunction:
            continue
        users = readers.get(op.outputs[0], [])
        if (not users or op.outputs[0] in outputs
                or any(u.name != "FULLY_CONNECTED" for u in users)):
            continue
        for k in (0, 1):
            factor = _constant(flat, op.inputs[1 - k])
            if factor is None or _constant(flat, op.inputs[k]) is not None:
                continue
            channels = flat.shape(op.outputs[0])[-1]
            weights = [_constant(flat, u.inputs[1]) for u in users]
            if (factor.size not in (1, channels) or any(d != 1 for d in factor.shape[:-1])
                    or flat.shape(op.inputs[k]) != flat.shape(op.outputs[0])
                    or any(u.inputs[0] != op.outputs[0]
                           or op.outputs[0] in u.inputs[1:] or w is None
                           or w.shape[1] != channels for u, w in zip(users, weights))):
                continue
            values = np.broadcast_to(factor.reshape(-1), (channels,)).astype(np.float64)
            for user, w in zip(users, weights):
                if op.name == "MUL":
                    _replace(flat, user.inputs[1], w * values.astype(np.float32))
                    user.inputs[0] = op.inputs[k]
                    continue
                if len(user.inputs) < 3:
                    name = flat.tensors[user.outputs[0]].name.decode()
                    user.inputs.append(flat.tensor(f"{name}/bias", (w.shape[0],), np.float32,
                                                   np.zeros(w.shape[0], np.float32)))
                bias = _constant(flat, user.inputs[2])
                _replace(flat, user.inputs[2], bias + (w.astype(np.float64) @ values))
                user.inputs[0] = op.inputs[k]
            flat.operators = [o for o in flat.operators if o is not op]
            return True
    return False


def _replace(flat: FlatGraph, index: int, values: np.ndarray) -> None:
    tensor = flat.tensors[index]
    flat.buffers[tensor.buffer].data = np.ascontiguousarray(
        values, np.float32).reshape(-1).view(np.uint8)


def _fuse_activations(flat: FlatGraph, outputs: list[int]) -> None:
    """An activation op whose input is the one use of a fusable op's output goes into that
    op's fusedActivationFunction (as TF's converter fuses it)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name not in ACTIVATIONS:
            continue
        source = producers.get(op.inputs[0])
        if (source is None or source.name not in FUSABLE or op.inputs[0] in outputs
                or len(readers.get(op.inputs[0], [])) != 1
                or source.options[1].fusedActivationFunction != 0):
            continue
        source.options[1].fusedActivationFunction = ACTIVATIONS[op.name]
        source.outputs = list(op.outputs)
        producers[op.outputs[0]] = source
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _merge_reshapes(flat: FlatGraph, outputs: list[int]) -> None:
    """RESHAPE(RESHAPE(x)) with the inner result used once: one RESHAPE of x; then a RESHAPE
    to the shape its input has, that input computed by an op and read by it alone: that op
    writes its output (as TF's converter drops such a RESHAPE)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "RESHAPE":
            continue
        inner = producers.get(op.inputs[0])
        if (inner is not None and inner.name == "RESHAPE" and op.inputs[0] not in outputs
                and len(readers.get(op.inputs[0], [])) == 1):
            op.inputs[0] = inner.inputs[0]
            gone.append(inner)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        source = producers.get(op.inputs[0])
        if (op.name != "RESHAPE" or source is None or op.inputs[0] in outputs
                or len(readers.get(op.inputs[0], [])) != 1
                or flat.shape(op.inputs[0]) != flat.shape(op.outputs[0])):
            continue
        source.outputs = [op.outputs[0] if o == op.inputs[0] else o for o in source.outputs]
        producers[op.outputs[0]] = source
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _flatten_into_dense(flat: FlatGraph, outputs: list[int]) -> None:
    """A RESHAPE to 2-D read only as the input of FULLY_CONNECTED ops (keepNumDims false) is
    dropped: the kernel takes any input as (elements / K, K) rows, in the same order (TF's
    converter drops it too)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "FULLY_CONNECTED" or op.options[1].keepNumDims:
            continue
        source = producers.get(op.inputs[0])
        users = readers.get(op.inputs[0], [])
        if (source is not None and source.name == "RESHAPE" and op.inputs[0] not in outputs
                and len(flat.shape(op.inputs[0])) == 2
                and all(u.name == "FULLY_CONNECTED" and u.inputs[0] == op.inputs[0]
                        and u.inputs[1:].count(op.inputs[0]) == 0
                        and not u.options[1].keepNumDims for u in users)):
            op.inputs[0] = source.inputs[0]
            if all(u.inputs[0] != source.outputs[0] for u in users):
                gone.append(source)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _pack(flat: FlatGraph, inputs: list[int], outputs: list[int], input_keys: list[str],
          output_keys: list[str]) -> bytes:
    """The model table around the subgraph: only the tensors and buffers still read, the
    operator codes in first use, one signature."""
    used = sorted({*inputs, *outputs, *(i for op in flat.operators for i in op.inputs),
                   *(o for op in flat.operators for o in op.outputs)})
    renumber = {old: new for new, old in enumerate(used)}
    model = schema.ModelT()
    model.version, model.description = 3, DESCRIPTION
    model.buffers = [flat.buffers[0]]
    subgraph = schema.SubGraphT()
    subgraph.name = b"main"
    subgraph.tensors = []
    for old in used:
        tensor = flat.tensors[old]
        model.buffers.append(flat.buffers[tensor.buffer])
        tensor.buffer = len(model.buffers) - 1
        subgraph.tensors.append(tensor)
    codes: dict[str, int] = {}
    model.operatorCodes, subgraph.operators = [], []
    for op in flat.operators:
        if op.name not in codes:
            code = schema.OperatorCodeT()
            builtin = getattr(schema.BuiltinOperator, op.name)
            code.builtinCode, code.deprecatedBuiltinCode = builtin, min(builtin, 127)
            code.version = 1
            codes[op.name] = len(model.operatorCodes)
            model.operatorCodes.append(code)
        table = schema.OperatorT()
        table.opcodeIndex = codes[op.name]
        table.inputs = np.array([renumber[i] for i in op.inputs], np.int32)
        table.outputs = np.array([renumber[o] for o in op.outputs], np.int32)
        if op.options is not None:
            table.builtinOptionsType, table.builtinOptions = op.options
        subgraph.operators.append(table)
    subgraph.inputs = np.array([renumber[i] for i in inputs], np.int32)
    subgraph.outputs = np.array([renumber[o] for o in outputs], np.int32)
    model.subgraphs = [subgraph]
    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = SIGNATURE.encode(), 0
    signature.inputs = [_tensor_map(k, renumber[i]) for k, i in zip(input_keys, inputs)]
    signature.outputs = [_tensor_map(k, renumber[o]) for k, o in zip(output_keys, outputs)]
    model.signatureDefs = [signature]
    return pack_table(model, flat.weight_bytes + 16 * len(model.buffers) + (1 << 20),
                      FILE_IDENTIFIER)


def _tensor_map(key: str, index: int):
    entry = schema.TensorMapT()
    entry.name, entry.tensorIndex = key.encode(), index
    return entry


# --- helpers the ops modules' direct writers share ------------------------------------------
def unary(ctx: DirectContext, name: str) -> int:
    """A one-input, option-free builtin (RELU, LOGISTIC, TANH, ...) on input 0."""
    out = ctx.output()
    ctx.op(name, [ctx.x(0)], out)
    return out


_ARITHMETIC = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions",
               "DIV": "DivOptions", "MAXIMUM": None, "MINIMUM": None}


def binary(ctx: DirectContext, name: str) -> int:
    """A broadcasting two-input builtin on inputs 0 and 1 (ADD, SUB, MUL, DIV, MAXIMUM,
    MINIMUM): constants become weights in the perm the layout policy gave them."""
    if len(ctx.out_perm()) > 6:
        raise NotCovered("broadcasting above rank 6")
    out = ctx.output()
    kind = _ARITHMETIC[name]
    ctx.op(name, [ctx.x(0), ctx.x(1)], out,
           None if kind is None else options(kind, fusedActivationFunction=0))
    return out


def reshape_to_output(ctx: DirectContext) -> int:
    """Input 0, as it lies physically, reshaped to output 0's physical shape (at most one
    unknown dim), as ops/shape.py's reshape_to_output."""
    dims = ctx.out_phys_shape()
    if dims is None or sum(d is None for d in dims) > 1:
        raise NotCovered("a reshape to a shape known only at run time")
    out = ctx.output()
    ctx.reshape(ctx.x(0), dims, out)
    return out


PADDING = {"SAME": schema.Padding.SAME, "VALID": schema.Padding.VALID}


def pad_spatial(ctx: DirectContext, x: int, pads, value: float = 0.0) -> int:
    """PAD (or PADV2 with `value`) of the spatial axes of channel-last tensor `x` by
    [(begin, end)] per axis, as ops/_spatial.pad_spatial."""
    shape = ctx.flat.shape(x)
    widths = [(0, 0), *[tuple(p) for p in pads], (0, 0)]
    padded = tuple(None if d is None else d + b + e for d, (b, e) in zip(shape, widths))
    out = ctx.temp(padded, "pad")
    paddings = ctx.ints(np.array(widths, np.int32), "paddings")
    if value == 0.0:
        ctx.op("PAD", [x, paddings], out)
    else:
        ctx.op("PADV2", [x, paddings, ctx.weight(np.float32(value), "pad_value")], out)
    return out


def replicate_edges(ctx: DirectContext, x: int, pads) -> int:
    """The spatial axes of channel-last `x` padded by [(begin, end)] copies of their edges:
    SLICEs of the first and last rows and a CONCATENATION per axis, as
    ops/_spatial.replicate_edges (static sizes)."""
    for axis, (begin, end) in enumerate(pads, start=1):
        if not begin and not end:
            continue
        shape = ctx.flat.shape(x)

        def row(start: int, x=x, axis=axis, shape=shape) -> int:
            edge = ctx.temp(tuple(1 if a == axis else d for a, d in enumerate(shape)),
                            f"edge{axis}_{start}")
            begins = [start if a == axis else 0 for a in range(len(shape))]
            sizes = [1 if a == axis else -1 for a in range(len(shape))]
            ctx.op("SLICE", [x, ctx.ints(begins, "begin"), ctx.ints(sizes, "size")], edge)
            return edge

        parts = [*([row(0)] * begin if begin else []), x,
                 *([row(shape[axis] - 1)] * end if end else [])]
        out = ctx.temp(tuple(d + begin + end if a == axis else d for a, d in enumerate(shape)),
                       f"edges{axis}")
        ctx.op("CONCATENATION", parts, out,
               options("ConcatenationOptions", axis=axis, fusedActivationFunction=0))
        x = out
    return x
