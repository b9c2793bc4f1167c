"""Convolutions and pools over a run-time number of rows that may be zero get one row.

Detectors run their per-region heads on as many rows as there are detections: torchvision's
Mask R-CNN and Keypoint R-CNN apply 4 and 8 convolutions and a transposed one to the
RoiAlign output, and an image with nothing in it has zero rows. The XNNPACK delegate
(ai-edge-litert 2.3) cannot run those on zero rows: a convolution that reads another
delegated op's zero-row output, and MAX_POOL_2D / AVERAGE_POOL_2D on zero rows, leave their
output shape unset, and the delegate fails to prepare ("BytesRequired number of elements
overflowed"); the model then fails on every image without a detection. TF's CPU conv2d
returns its input's shape for an empty batch (the wrong channel count).

So each region of row-wise ops whose rows are a data-dependent count (ONNX shape inference
names it with a symbol that no graph input carries) and which holds a Conv, ConvTranspose,
MaxPool or AveragePool gets its entries padded to max(rows, 1) rows with zeros and its
exits cut back to the first `rows` rows. With one row or more nothing is added, so only
two copies (the entries and the exits) cost anything.
"""

from __future__ import annotations

import heapq

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset

FRAGILE = {"Conv", "ConvTranspose", "MaxPool", "AveragePool"}
UNARY = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
         "Erf", "Identity", "Cast", "Clip", "BatchNormalization", "InstanceNormalization",
         "GlobalAveragePool", "GlobalMaxPool", "Abs", "Neg", "Exp", "Sqrt", "Softplus",
         *FRAGILE}
BINARY = {"Add", "Sub", "Mul", "Div"}


def guard_empty_rows(model: onnx.ModelProto) -> int:
    """Pad and cut the main graph's regions as the module says; returns how many."""
    opset = default_opset(model, 0)
    if opset < 11:  # Pad takes its pads as an input from opset 11
        return 0
    graph = model.graph
    index = GraphIndex(graph)
    taken = _input_symbols(graph)
    constants = set(index.constants)
    member: dict[int, str] = {}  # node index -> the row symbol of its region
    for k, node in enumerate(index.nodes):
        symbol = _rows_symbol(node, index, taken, constants)
        if symbol is not None:
            member[k] = symbol
    guarded = 0
    for region in _regions(index, member):
        if any(index.nodes[k].op_type in FRAGILE for k in region) and _static_rows(
                index, region, constants):
            _guard(index, region, constants, guarded)
            index = GraphIndex(graph)  # reordered: indices of later regions are stale
            guarded += 1
    return guarded


def _static_rows(index: GraphIndex, region: list[int], constants: set[str]) -> bool:
    """Whether every value entering the region has static dims after the first: the padded
    copy keeps them (ONNX cannot infer a Pad by run-time amounts), and the ops need them
    (a Conv of unknown input channels would need Flex)."""
    made = {o for k in region for o in index.nodes[k].output}
    entries = {name for k in region for name in index.nodes[k].input
               if name and name not in made and name not in constants}
    return all((shape := index.shape(name)) is not None and None not in shape[1:]
               for name in entries)


def _first_dim(index: GraphIndex, name: str) -> tuple[int | None, str | None]:
    """(the value's static first dim or None, the symbol of an unknown one); (0, None),
    static, when its rank is unknown or 0."""
    first = (index.dims(name) or [0])[0]
    return (first, None) if isinstance(first, int) else (None, first)


def _input_symbols(graph: onnx.GraphProto) -> set[str]:
    """Symbols of the graph inputs' dims: a batch the user chooses, not a count."""
    return {d.dim_param for i in graph.input if i.type.HasField("tensor_type")
            for d in i.type.tensor_type.shape.dim if d.HasField("dim_param")}


def _rows_symbol(node, index: GraphIndex, taken: set[str], constants: set[str]) -> str | None:
    """The data-dependent row symbol `node` maps row by row, or None."""
    if node.domain not in ("", "ai.onnx") or not node.input or not node.output:
        return None
    value, symbol = _first_dim(index, node.input[0])
    if value is not None or symbol is None or symbol in taken:
        return None
    if _first_dim(index, node.output[0]) != (None, symbol):
        return None
    if node.op_type in UNARY:
        extra = node.input[1:]
        return symbol if all(not name or name in constants for name in extra) else None
    if node.op_type in BINARY:
        other = node.input[1]
        if other in constants or _first_dim(index, other) == (None, symbol):
            return symbol
    return None


def _regions(index: GraphIndex, member: dict[int, str]) -> list[list[int]]:
    """Connected groups of member nodes (indices) with one symbol."""
    parent = {k: k for k in member}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k, symbol in member.items():
        for name in index.nodes[k].input:
            source = index.producer.get(name)
            if source in member and member[source] == symbol:
                parent[find(k)] = find(source)
    groups: dict[int, list[int]] = {}
    for k in sorted(member):
        groups.setdefault(find(k), []).append(k)
    return list(groups.values())


def _guard(index: GraphIndex, region: list[int], constants: set[str], count: int) -> None:
    """Pad the region's entries and cut its exits (values read outside it); `count`: how
    many regions are guarded already."""
    graph, all_nodes = index.graph, index.nodes
    nodes = [all_nodes[k] for k in region]
    made = {o for n in nodes for o in n.output}
    entries = []
    for node in nodes:
        for name in node.input:
            if name and name not in made and name not in constants and name not in entries:
                entries.append(name)
    inside = set(region)
    readers_outside = {name for k, n in enumerate(all_nodes) if k not in inside
                       for name in _reads(n)}
    readers_outside |= {o.name for o in graph.output}
    exits = [o for n in nodes for o in n.output if o in readers_outside]
    prefix = f"rows_guard_{count}"
    first = entries[0]
    added = [  # rows = Shape(first)[0:1]; missing = (rows == 0): ops of every opset >= 11
        helper.make_node("Shape", [first], [f"{prefix}_dims"]),
        _constant(f"{prefix}_zero", np.array([0], np.int64)),
        helper.make_node("Gather", [f"{prefix}_dims", f"{prefix}_zero"], [f"{prefix}_shape"],
                         axis=0),
        helper.make_node("Equal", [f"{prefix}_shape", f"{prefix}_zero"], [f"{prefix}_none"]),
        helper.make_node("Cast", [f"{prefix}_none"], [f"{prefix}_missing"],
                         to=onnx.TensorProto.INT64),
    ]
    renamed = {}
    for k, name in enumerate(entries):
        rank = index.rank(name)
        zeros = f"{prefix}_zeros_{rank}"
        if not any(n.output[0] == zeros for n in added):
            added.append(_constant(zeros, np.zeros(rank - 1, np.int64)))
            added.append(_constant(f"{prefix}_zeros_{rank}_all", np.zeros(rank, np.int64)))
        pads = f"{prefix}_pads_{k}"
        added.append(helper.make_node(
            "Concat", [f"{prefix}_zeros_{rank}_all", f"{prefix}_missing", zeros], [pads],
            axis=0))
        renamed[name] = f"{name}_{prefix}"
        added.append(helper.make_node("Pad", [name, pads], [renamed[name]]))
        graph.value_info.append(_with_rows(index.info(name), renamed[name], f"{prefix}_rows"))
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    cuts = []
    for name in exits:
        padded = f"{name}_{prefix}_padded"
        for node in nodes:
            for i, out in enumerate(node.output):
                if out == name:
                    node.output[i] = padded
        cuts.append(helper.make_node("Slice", [padded, f"{prefix}_zero", f"{prefix}_shape",
                                               f"{prefix}_zero"], [name]))
    for node in [*added, *cuts]:
        node.name = node.output[0]
    _sort(graph, [*all_nodes, *added, *cuts])


def _sort(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """`nodes` into the graph in an order where each comes after what it reads (stable:
    the given order wherever it is valid already)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    reads = [_reads(n) for n in nodes]
    waiting = [sum(1 for name in names if name in producer) for names in reads]
    readers: dict[int, list[int]] = {}
    for k, names in enumerate(reads):
        for name in names:
            if name in producer:
                readers.setdefault(producer[name], []).append(k)
    ready = [k for k, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for reader in readers.get(k, []):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    del graph.node[:]
    graph.node.extend(order)


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values `node` reads: its inputs and what its subgraphs read from outside."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in sub.node:
                names |= _reads(inner)
    return names


def _with_rows(info: onnx.ValueInfoProto, name: str, rows: str) -> onnx.ValueInfoProto:
    """`info`'s type under `name`, its first dim the symbol `rows` (ONNX cannot infer the
    shape of a Pad by run-time amounts; the other dims do not change)."""
    padded = onnx.ValueInfoProto()
    padded.CopyFrom(info)
    padded.name = name
    first = padded.type.tensor_type.shape.dim[0]
    first.Clear()
    first.dim_param = rows
    return padded


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))
