"""The direct TFLite writer: a float32 .tflite written from the prepared graph and its layout
plan, without TensorFlow.

Each node is written by its op's direct writer, registered next to its handler
(`translate.registry.direct`, in the same ops module, sharing its decisions): it reads the
node through `DirectContext` (the names of translate/context.NodeContext: attributes,
constants, shapes, perms) and adds TFLite operators. Inputs reach a writer in the perm its
layout policy asked for, moved exactly as the TF route moves them (a RESHAPE when only unit
axes move, else a TRANSPOSE), so both routes have the same transposes. After the last node,
the graph gets what TF's converter would do to it (tflite/direct_rewrites.py: folded
per-channel MUL / ADD, fused activations, fewer RESHAPEs). tflite/flatgraph.py holds the
tensors, buffers and operators as they are added; `_pack` makes the file.

A model is written directly only when every node is covered: its inputs' shapes known but
for the batch (values the Recorder computes may have dims known only at run time), and a
writer that takes the node's attributes (a writer raises `NotCovered` for the rest). `write_direct` returns the NotCovered otherwise, with the
node and the reason, and the caller converts with TF (said at `-v info`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.ir.weights import release
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.layout.plan import Plan
from onnx2tf_alt.tflite.direct_rewrites import rewrite
from onnx2tf_alt.tflite.flatbuffer import FILE_IDENTIFIER, SIGNATURE, pack_table, schema
from onnx2tf_alt.tflite.flatgraph import (
    TYPES,
    ArrayBuffer,
    FlatGraph,
    NotCovered,
    Part,
    options,
)
from onnx2tf_alt.tflite.late_weights import Bound
from onnx2tf_alt.tflite.recorder import record_handler
from onnx2tf_alt.translate.context import NodeView
from onnx2tf_alt.translate.io_layout import SignatureIO, keras_name
from onnx2tf_alt.translate.options import DEFAULT_OPTIONS, ConversionOptions
from onnx2tf_alt.translate.registry import find_direct, find_handler

DESCRIPTION = b"onnx2tf_alt direct writer"
# builtins whose kernels are registered from a version above 1 (TFLite's register.cc)
MIN_VERSION = {"BROADCAST_TO": 2}
# value types of a model's inputs and outputs only, cast to float32 on entry and back on
# exit (pipeline.float32_planned)
WIDE_OR_HALF = {np.dtype(np.float16), np.dtype(np.float64)}
# ops that read or write such a value as it is: a type change, its bits (TFLite's CAST and
# BITCAST take every type)
BIT_EXACT = {"Cast", "BitCast"}
# Weights past which the file is not packed in memory but written by late_weights.Bound
# (the bytes of each weight made from its array as it is written; past 2 GB after the
# flatbuffer): packing holds the builder and the file's bytes besides the arrays.
BOUND_BYTES = 1 << 30
# The same for the files a conversion writes (conversion.py; -oiqt reads the file back for
# its quantizer): a 553 MB model's -dms run 8.2 -> 4.5 s, peak 1.96 -> 1.16 GB
STREAMED_BYTES = 256 << 20


def op_version(op) -> int:
    """The version TFLite's op_version.cc gives `op` (a FlatGraph Operator): MIN_VERSION, or
    a TRANSPOSE_CONV's 3 with a bias input and 4 with a fused activation (as TF's converter
    writes them: a runtime that predates them refuses the file instead of ignoring them)."""
    if op.name == "TRANSPOSE_CONV":
        if op.options is not None and op.options[1].fusedActivationFunction:
            return 4
        if len(op.inputs) > 3 and op.inputs[3] >= 0:
            return 3
    return MIN_VERSION.get(op.name, 1)


@dataclass
class _Value:
    tensor: int | None  # None: a constant (`const`, ONNX order)
    perm: Perm
    const: np.ndarray | None = None


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

    def x_constant(self, i: int) -> np.ndarray | None:
        """Input i's value where it is a constant, in the perm it is asked in (what x(i)
        would hold), else None."""
        value = self._constant(self.node.inputs[i])
        return None if value is None else P.constant_in_perm(value, self.in_perms[i])

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

    def temp(self, shape, suffix: str, dtype=np.float32) -> int:
        return self.flat.tensor(f"{self.node.name}/{suffix}", shape, dtype)

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
            array = P.constant_in_perm(value.const, want)
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
        out = self.flat.tensor(f"{name}/{'_'.join(map(str, want))}", target,
                               self.flat.dtype(value.tensor), dynamic=True)
        if extra > 0 or P.moves_only_unit_axes(phys, move):
            self.reshape(value.tensor, target, out)
        else:
            perm = self.flat.tensor(f"{name}/perm", (len(move),), np.int32,
                                    np.array(move, np.int32))
            self.flat.op("TRANSPOSE", [value.tensor, perm], [out])
        return out

    def run_subgraph(self, graph: Graph, plan: Plan, feeds: dict) -> list:
        """A prepared, planned subgraph's nodes (an If branch's, a Loop body's) written into
        this writer's flat graph as it is now, on `feeds` by input name ((tensor index,
        rank) in identity layout, or arrays); its outputs in ONNX order: tensor indices in
        identity layout, or arrays."""
        writer = DirectWriter(graph, plan, self.options)
        writer.flat = self.flat
        for name, value in feeds.items():
            writer.values[name] = (_Value(None, P.identity(value.ndim), value)
                                   if isinstance(value, np.ndarray)
                                   else _Value(value[0], P.identity(value[1])))
        for position, node in enumerate(graph.nodes):
            writer._write_node(node, plan.node_inputs[position])
        outputs = []
        for name in graph.outputs:
            value = writer.values[name]
            outputs.append(value.const if value.const is not None else
                           writer.input_tensor(name, P.identity(len(value.perm))))
        return outputs

    def reshape(self, source: int, shape, out: int) -> None:
        """RESHAPE `source` to `shape` (one None: -1) into `out`."""
        if sum(d is None for d in shape) > 1:
            raise NotCovered(f"a reshape to several run-time dims {list(shape)}")
        dims = [-1 if d is None else int(d) for d in shape]
        target = self.flat.tensor(f"{self.flat.tensors[out].name.decode()}/shape", (len(dims),),
                                  np.int32, np.array(dims, np.int32))
        self.flat.op("RESHAPE", [source, target], [out])

    def _as_it_is(self, name: str, want: Perm | None) -> Perm | None:
        """The perm a node reads input `name` in: the planned one, or the value's own where
        the plan gave one of a lower rank (planned before its rank was known, behind axes
        computed at run time), so the handler sees the perm the value has."""
        value = self.values.get(name) if name else None
        if (want is None or value is None or value.const is not None
                or len(want) >= len(value.perm)):
            return want
        return value.perm

    @staticmethod
    def _check_dtype(name: str, dtype) -> None:
        if np.dtype(dtype) not in TYPES:
            raise NotCovered(f"'{name}' is {np.dtype(dtype)}: the direct writer writes "
                             f"{', '.join(sorted(t.name for t in TYPES))} tensors")

    def write(self, key: str = SIGNATURE) -> tuple[Part, DirectResult]:
        """The written subgraph, for signature `key`, and its I/O names and perms (the
        result's `content` is filled when the file is packed)."""
        graph, plan, flat = self.graph, self.plan, self.flat
        taken: set[str] = set()
        input_names, inputs = {}, []
        for name in graph.inputs:
            shape, perm = graph.shapes.get(name), plan.perms[name]
            self._check_dtype(name, graph.dtypes[name])
            if shape is None:
                raise NotCovered(f"input '{name}' has no known shape")
            input_names[name] = keras = keras_name(name, taken)
            index = flat.tensor(f"{key}_{keras}:0", P.physical_shape(shape, perm),
                                graph.dtypes[name], dynamic=True)
            self.values[name] = _Value(index, perm)
            inputs.append(index)
        for position, node in enumerate(graph.nodes):
            self._write_node(node, plan.node_inputs[position])
        output_names, output_keys, outputs = {}, [], []
        for name in graph.outputs:
            keras = keras_name(name, taken)
            output_names.setdefault(name, keras)
            output_keys.append(keras)
            # a constant output is a constant tensor, and an output that is an input or
            # another output that tensor again, as in TF's converter's files
            outputs.append(self.input_tensor(name, plan.output_perms[name]))
        rewrite(flat, outputs, for_quantization=self.options.for_quantization)
        part = Part(key, flat, inputs, outputs, list(input_names.values()), output_keys)
        return part, DirectResult(b"", input_names, output_names,
                                  {n: plan.perms[n] for n in graph.inputs},
                                  dict(plan.output_perms), output_keys)

    def _write_node(self, node: Node, wanted: list[Perm | None]) -> None:
        """By the op's `@direct` writer where it has one, the node's values are float32 and
        it takes the node; else by its handler's own code on the Recorder
        (tflite/recorder.py). What a writer added before it gave up is read by nothing and
        dropped (direct_rewrites.drop_unread)."""
        opset = self.graph.opset_of(node.domain)
        writer = find_direct(node.op_type, node.domain, opset)
        handler = find_handler(node.op_type, node.domain, opset)
        where = f"node '{node.name}' ({node.op_type})"
        values = [n for n in (*node.inputs, *node.outputs) if n and n not in self.graph.constants]
        dtypes = [np.dtype(self.graph.dtypes.get(n, np.float32)) for n in values]
        writers = ([] if writer is None or any(d != np.float32 for d in dtypes)
                   or any(_beyond_writers(self.graph.shapes.get(n)) for n in values)
                   else [writer])
        if handler is not None:
            writers.append(functools.partial(record_handler, handler))
        if not writers:
            raise NotCovered(f"{where}: no direct writer", node)
        out_perms = [self.plan.perms.get(o, ()) for o in node.outputs]
        wanted = [self._as_it_is(name, want) for name, want in zip(node.inputs, wanted)]
        try:
            for name, dtype in zip(values, dtypes):
                self._check_dtype(name, dtype)
                if dtype in WIDE_OR_HALF and node.op_type not in BIT_EXACT:
                    raise NotCovered(f"'{name}' is {dtype}: TFLite has few {dtype} kernels "
                                     "(the file computes in float32: passes/float32_compute)")
        except NotCovered as reason:
            raise NotCovered(f"{where}: {reason}", node) from None
        first = None  # why the first writer gave up: the op's own writer says it best
        for write in writers:
            try:
                result = write(DirectContext(self, node, wanted, out_perms, opset))
                break
            except NotCovered as reason:
                first = first or reason
        else:
            raise NotCovered(f"{where}: {first}", node) from None
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for name, perm, value in zip(node.outputs, out_perms, results):
            if not name or value is None:
                continue
            if isinstance(value, np.ndarray):  # folded: a constant, ONNX order
                array = np.asarray(value, self.graph.dtypes.get(name))
                self.values[name] = _Value(None, P.identity(array.ndim), array)
            else:
                self.values[name] = _Value(value, perm)


def _beyond_writers(shape) -> bool:
    """Whether a value of ONNX `shape` is beyond the `@direct` writers, which read shapes
    known but for one dim: of unknown rank, or several dims known only at run time (an
    image's height and width). The handler's own code writes such nodes (tflite/recorder.py)
    as it builds them in TF, from the shapes the written tensors have."""
    return shape is None or sum(d is None for d in shape) > 1


@dataclass
class DirectResult(SignatureIO):
    """A direct .tflite and its I/O names and perms (the names BuildResult has)."""

    content: bytes  # empty where `bound` holds the file
    input_names: dict[str, str]
    output_names: dict[str, str]
    input_perms: dict[str, Perm]
    output_perms: dict[str, Perm]
    output_keys: list[str]
    bound: Bound | None = None  # past BOUND_BYTES of weights: written with bound.write(path)
    model = None  # no Keras model
    values = MappingProxyType({})  # nor Keras tensors (export/tflite.layer_owners)


def write_direct(graph: Graph, plan: Plan, options: ConversionOptions = DEFAULT_OPTIONS,
                 bound_bytes: int = BOUND_BYTES) -> DirectResult | NotCovered:
    """The direct .tflite of a prepared, planned graph, or the NotCovered that says why it
    must go through TF's converter."""
    found = write_direct_signatures({SIGNATURE: (graph, plan, options)}, bound_bytes)
    return found if isinstance(found, NotCovered) else found[SIGNATURE]


def write_direct_signatures(planned: dict[str, tuple[Graph, Plan, ConversionOptions]],
                            bound_bytes: int = BOUND_BYTES
                            ) -> dict[str, DirectResult] | NotCovered:
    """One .tflite with a subgraph and a signature per entry of `planned` ({key: (graph,
    plan, options)}, a decoder's prefill and decode): a constant equal in several of them
    is one buffer. The results share that file's `content` (or, past `bound_bytes` of
    weights, its `bound`); or the NotCovered of the first node not covered."""
    parts, results, buffers = [], {}, _SharedBuffers()
    try:
        for key, (graph, plan, options) in planned.items():
            part, results[key] = DirectWriter(graph, plan, options).write(key)
            buffers.share(part.flat)  # the copies of earlier weights dropped now
            parts.append(part)
    except NotCovered as reason:  # without its frames, which hold the weights written
        return reason.with_traceback(None)
    packed = _pack(parts, bound_bytes)
    for result in results.values():
        if isinstance(packed, Bound):
            result.bound = packed
        else:
            result.content = packed
    return results


class _SharedBuffers:
    """Constant buffers by content across subgraphs: `share` points each buffer of a new
    subgraph that equals an earlier one at that one (a weight is stored once)."""

    def __init__(self):
        self._seen: dict[tuple, list[ArrayBuffer]] = {}

    def share(self, flat: FlatGraph) -> None:
        for k, buffer in enumerate(flat.buffers):
            if not isinstance(buffer, ArrayBuffer) or not buffer.nbytes:
                continue
            array = buffer.array
            sample = array.flat[::max(1, array.size // 64)][:64]  # no copy of the whole
            same = self._seen.setdefault((array.dtype, array.shape, sample.tobytes()), [])
            match = next((b for b in same if _equal(b.array, array)), None)
            if match is None:
                same.append(buffer)
            else:
                flat.buffers[k] = match
                for compared in (array, match.array):  # ONNX weights kept on disk: the
                    release(compared)  # pages read to compare them, no longer resident


def _equal(a: np.ndarray, b: np.ndarray, rows: int = 1 << 20) -> bool:
    """a == b everywhere (same shape), compared a block of leading rows at a time."""
    if a.ndim == 0:
        return bool(a == b)
    step = max(1, rows // max(1, a[0].size))
    return all(np.array_equal(a[k:k + step], b[k:k + step]) for k in range(0, len(a), step))


def _with_subgraphs(parts: list[Part]) -> list[Part]:
    """`parts`, then every subgraph their IF / WHILE ops run (and theirs), each once."""
    ordered, seen = list(parts), {id(p) for p in parts}
    for part in ordered:  # grows while walked
        for sub in part.flat.subgraphs:
            if id(sub) not in seen:
                seen.add(id(sub))
                ordered.append(sub)
    return ordered


def _pack(parts: list[Part], bound_bytes: int = BOUND_BYTES) -> bytes | Bound:
    """The model table around the subgraphs: in each only the tensors still read, a buffer
    shared by several once, the operator codes in first use, a signature per subgraph of
    `parts` (the IF branches and WHILE bodies they run follow them, without one). Its
    bytes; past `bound_bytes` of weights the table itself, written by Bound.write (past 2 GB
    with its weights after the flatbuffer), the weights made from their arrays only then."""
    signed = len(parts)
    parts = _with_subgraphs(parts)
    numbers = {id(p): k for k, p in enumerate(parts)}
    model = schema.ModelT()
    model.version, model.description = 3, DESCRIPTION
    model.buffers, model.subgraphs, model.signatureDefs = [parts[0].flat.buffers[0]], [], []
    model.operatorCodes = []
    stored: dict[int, int] = {}  # id(buffer) -> index in model.buffers
    codes: dict[str, int] = {}
    weight_bytes = 0
    for index, part in enumerate(parts):
        flat, inputs, outputs = part.flat, part.inputs, part.outputs
        used = sorted({*inputs, *outputs, *(i for op in flat.operators for i in op.inputs),
                       *(o for op in flat.operators for o in op.outputs)})
        renumber = {old: new for new, old in enumerate(used)}
        subgraph = schema.SubGraphT()
        subgraph.name = b"main" if signed == 1 and index == 0 else part.key.encode()
        for op in flat.operators:  # an IF's branches, a WHILE's condition and body
            for field_name, sub in getattr(op.options[1] if op.options else None,
                                           "subgraph_parts", {}).items():
                setattr(op.options[1], field_name, numbers[id(sub)])
        subgraph.tensors = []
        _unique_names([flat.tensors[old] for old in used])
        for old in used:
            tensor = flat.tensors[old]
            buffer = flat.buffers[tensor.buffer]
            if not isinstance(buffer, ArrayBuffer):
                model.buffers.append(schema.BufferT())  # each activation its own, as TF's
                tensor.buffer = len(model.buffers) - 1
            else:
                if id(buffer) not in stored:
                    model.buffers.append(buffer)
                    stored[id(buffer)] = len(model.buffers) - 1
                    weight_bytes += buffer.nbytes
                tensor.buffer = stored[id(buffer)]
            subgraph.tensors.append(tensor)
        subgraph.operators = []
        for op in flat.operators:
            if op.name not in codes:
                code = schema.OperatorCodeT()
                builtin = getattr(schema.BuiltinOperator, op.name)
                code.builtinCode, code.deprecatedBuiltinCode = builtin, min(builtin, 127)
                code.version = 1
                codes[op.name] = len(model.operatorCodes)
                model.operatorCodes.append(code)
            code = model.operatorCodes[codes[op.name]]
            code.version = max(code.version, op_version(op))
            table = schema.OperatorT()
            table.opcodeIndex = codes[op.name]
            table.inputs = np.array([renumber[i] for i in op.inputs], np.int32)
            table.outputs = np.array([renumber[o] for o in op.outputs], np.int32)
            if op.options is not None:
                table.builtinOptionsType, table.builtinOptions = op.options
            subgraph.operators.append(table)
        subgraph.inputs = np.array([renumber[i] for i in inputs], np.int32)
        subgraph.outputs = np.array([renumber[o] for o in outputs], np.int32)
        model.subgraphs.append(subgraph)
        if index >= signed:
            continue
        signature = schema.SignatureDefT()
        signature.signatureKey, signature.subgraphIndex = part.key.encode(), index
        signature.inputs = [_tensor_map(k, renumber[i])
                            for k, i in zip(part.input_keys, inputs)]
        signature.outputs = [_tensor_map(k, renumber[o])
                             for k, o in zip(part.output_keys, outputs)]
        model.signatureDefs.append(signature)
    if weight_bytes > bound_bytes:
        return Bound(model, {})
    return pack_table(model, weight_bytes + 16 * len(model.buffers) + (1 << 20),
                      FILE_IDENTIFIER)


def _unique_names(tensors: list) -> None:
    """A tensor whose name an earlier one of `tensors` has takes the first free `name_k`:
    tools that edit a file by tensor name need them unique (ai-edge-quantizer refuses a file
    with two "Conv@2/const"), as TF's converter writes them."""
    taken = {t.name for t in tensors}
    seen: set[bytes] = set()
    for tensor in tensors:
        if tensor.name in seen:
            k = 1
            while tensor.name + b"_%d" % k in taken:
                k += 1
            tensor.name += b"_%d" % k
            taken.add(tensor.name)
        seen.add(tensor.name)


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
    ops/_spatial.replicate_edges."""
    for axis, (begin, end) in enumerate(pads, start=1):
        if not begin and not end:
            continue
        shape = ctx.flat.shape(x)

        def row(start: int, x=x, axis=axis, shape=shape) -> int:
            edge = ctx.temp(tuple(1 if a == axis else d for a, d in enumerate(shape)),
                            f"edge{axis}_{start}")
            begins = [start if a == axis else 0 for a in range(len(shape))]
            # explicit sizes: XNNPACK leaves a SLICE of size -1 ("to the end") to TFLite's
            # reference kernel, splitting the model's partition (resnet's first MaxPool)
            sizes = [1 if a == axis else d for a, d in enumerate(shape)]
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
