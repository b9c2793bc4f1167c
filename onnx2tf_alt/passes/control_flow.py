"""Inline the control flow whose course is known at conversion time.

An If whose condition is a constant becomes the nodes of the branch it takes; a Loop with a
constant trip count (and a condition that stays true) and a Scan over a sequence of static
length are unrolled. What remains runs at run time (ops/control.py); unrolled graphs are
plain ops the layout plan can keep channel-last, and that constant folding can simplify.

Every value a copied subgraph produces gets a fresh name (prefixed with the node's name,
made unique with a counter); references to the enclosing scope keep their names, also in
subgraphs nested inside the copied nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset, dims_of

MAX_UNROLL = 256  # iterations; longer loops stay loops
EXPANDED = ("If", "Loop", "Scan")  # the ops `_expand` may replace


def inline_control_flow(model: onnx.ModelProto) -> bool:
    """Inline constant-condition Ifs, unroll constant-count Loops and static Scans.

    Works in place on `model`, in subgraphs too. Returns True if anything changed.
    """
    if not _has_control_flow(model.graph):  # the scopes below index the whole graph
        return False
    opset = default_opset(model)
    namer = _Namer(_all_names(model.graph))
    changed = _inline_graph(model.graph, _Scope({}, {}), opset, namer)
    if changed and model.ir_version < 4:
        model.ir_version = 4  # the new initializers are not graph inputs
    return changed


def _has_control_flow(graph: onnx.GraphProto) -> bool:
    return any((node.op_type in EXPANDED and node.domain in ("", "ai.onnx"))
               or any(_has_control_flow(sub) for sub in _subgraphs(node)) for node in graph.node)


# --- names -------------------------------------------------------------------------------
class _Namer:
    """Fresh value and node names, unique in the whole model."""

    def __init__(self, taken: set[str]):
        self.taken = taken

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
    names |= {i.name for i in graph.initializer}
    for node in graph.node:
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
        for sub in _subgraphs(node):
            names |= _all_names(sub)
    return names


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """Values a graph defines itself: its inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    names.update(o for n in graph.node for o in n.output if o)
    return names


def free_names(graph: onnx.GraphProto) -> list[str]:
    """Values a graph (or a subgraph nested in it) reads from its enclosing scopes, in order."""
    defined = defined_names(graph)
    used: list[str] = []
    for node in graph.node:
        used.extend(node.input)
        for sub in _subgraphs(node):
            used.extend(free_names(sub))
    used.extend(o.name for o in graph.output)
    return [n for n in dict.fromkeys(used) if n and n not in defined]


def _rename_references(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename the outer-scope references of a (nested) subgraph, in place."""
    mapping = {k: v for k, v in mapping.items() if k not in defined_names(graph)}
    if not mapping:
        return
    for node in graph.node:
        node.input[:] = [mapping.get(i, i) for i in node.input]
        for sub in _subgraphs(node):
            _rename_references(sub, mapping)
    for out in graph.output:
        out.name = mapping.get(out.name, out.name)


# --- constants and shapes of a scope -----------------------------------------------------
class _Scope:
    """Constant values and known shapes visible in a graph (its own and its ancestors')."""

    def __init__(self, consts: dict[str, np.ndarray], shapes: dict[str, tuple]):
        self.consts = consts
        self.shapes = shapes

    def enter(self, graph: onnx.GraphProto) -> _Scope:
        index = GraphIndex(graph)
        consts = dict(self.consts)
        consts.update({name: index.value(name) for name in index.constants})
        shapes = dict(self.shapes)  # None for unknown dims
        for name in index.infos:
            shape = index.shape(name)
            if shape is not None:
                shapes[name] = tuple(shape)
        shapes.update({name: tuple(a.shape) for name, a in consts.items()})
        return _Scope(consts, shapes)


# --- the pass ----------------------------------------------------------------------------
def _inline_graph(graph: onnx.GraphProto, outer: _Scope, opset: int, namer: _Namer) -> bool:
    scope = outer.enter(graph)
    changed = False
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        expansion = _expand(node, scope, opset, namer)
        if expansion is None:
            for sub in _subgraphs(node):
                changed |= _inline_graph(sub, scope, opset, namer)
            nodes.append(node)
            continue
        nodes.extend(expansion.nodes)
        graph.initializer.extend(expansion.initializers)
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed


def _expand(node: onnx.NodeProto, scope: _Scope, opset: int, namer: _Namer) -> _Expansion | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type not in EXPANDED:
        return None
    expand = {"If": _inline_if, "Loop": _unroll_loop, "Scan": _unroll_scan}[node.op_type]
    return expand(node, scope, _Expansion(node, opset, namer))


class _Expansion:
    """The nodes and initializers that replace one control-flow node."""

    def __init__(self, node: onnx.NodeProto, opset: int, namer: _Namer):
        self.prefix = node.name or node.op_type
        self.opset = opset
        self.namer = namer
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}

    def value(self, hint: str) -> str:
        return self.namer.fresh(f"{self.prefix}/{hint}")

    def const(self, array: np.ndarray) -> str:
        """Name of a new initializer holding `array` (one per distinct small value)."""
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = self.value("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def add(self, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        name = self.namer.fresh(f"{self.prefix}/{op_type}")
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    def identity(self, source: str, target: str) -> None:
        if target and target != source:
            self.add("Identity", [source], target)

    def stack(self, parts: list[str], axis: int, target: str) -> None:
        """Unsqueeze every part at `axis` and concatenate them along it into `target`."""
        expanded = []
        for part in parts:
            axes = {"axes": [axis]} if self.opset < 13 else {}
            inputs = [part] if self.opset < 13 else [part, self.const(np.array([axis], np.int64))]
            expanded.append(self.add("Unsqueeze", inputs, self.value("unsqueezed"), **axes))
        self.add("Concat", expanded, target, axis=axis)

    def instantiate(
        self,
        body: onnx.GraphProto,
        bound: dict[str, str],
        tag: str = "",
        targets: Iterable[str] = (),
    ) -> list[str]:
        """Copy `body`'s nodes with its inputs bound to outer names; returns its output names.

        Values the copy produces get fresh names, except that body outputs made by a body
        node take the names in `targets` (one per output, "" for none) directly.
        """
        mapping = dict(bound)
        produced = {o for n in body.node for o in n.output if o}
        for out, target in zip([o.name for o in body.output], targets):
            if target and out in produced and out not in mapping:
                mapping[out] = target
        for node in body.node:
            for out in node.output:
                if out and out not in mapping:
                    mapping[out] = self.value(f"{tag}{out}")
        for node in body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = self.namer.fresh(f"{self.prefix}/{tag}{node.name or node.op_type}")
            copy.input[:] = [mapping.get(i, i) for i in node.input]
            copy.output[:] = [mapping.get(o, o) for o in node.output]
            for sub in _subgraphs(copy):
                _rename_references(sub, mapping)
            self.nodes.append(copy)
        return [mapping.get(o.name, o.name) for o in body.output]

    def hoist_initializers(self, body: onnx.GraphProto) -> dict[str, str]:
        """Body initializers as new outer initializers (shared by all iterations)."""
        mapping = {}
        for init in body.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = mapping[init.name] = self.value(init.name)
            self.initializers.append(copy)
        return mapping


def _graph_attr(node: onnx.NodeProto, name: str) -> onnx.GraphProto | None:
    return next((a.g for a in node.attribute if a.name == name), None)


def _attr(node: onnx.NodeProto, name: str, default):
    attr = next((a for a in node.attribute if a.name == name), None)
    return default if attr is None else helper.get_attribute_value(attr)


def _scalar(scope: _Scope, name: str):
    value = scope.consts.get(name) if name else None
    return None if value is None or value.size != 1 else value.reshape(()).item()


def _inline_if(node, scope: _Scope, out: _Expansion) -> _Expansion | None:
    cond = _scalar(scope, node.input[0])
    if cond is None:
        return None
    branch = _graph_attr(node, "then_branch" if cond else "else_branch")
    bound = out.hoist_initializers(branch)
    results = out.instantiate(branch, bound, targets=node.output)
    for result, target in zip(results, node.output):
        out.identity(result, target)
    return out


def _stays_true(body: onnx.GraphProto, scope: _Scope) -> bool:
    """Is the body's condition output its condition input (through Identity) or true?"""
    cond_in, name = body.input[1].name, body.output[0].name
    index = GraphIndex(body)
    while True:
        if name == cond_in:
            return True
        if name in scope.consts:
            return bool(np.all(scope.consts[name]))
        producer = index.producer_node(name)
        if producer is None or producer.op_type != "Identity":
            return False
        name = producer.input[0]


def _unroll_loop(node, scope: _Scope, out: _Expansion) -> _Expansion | None:
    inputs = list(node.input) + [""] * (2 - len(node.input))
    trip = _scalar(scope, inputs[0])
    cond = _scalar(scope, inputs[1]) if inputs[1] else True
    body = _graph_attr(node, "body")
    if trip is None or not 0 <= trip <= MAX_UNROLL or not cond:
        return None
    if not _stays_true(body, scope.enter(body)):
        return None
    state = inputs[2:]
    n_state, n_scan = len(state), len(body.output) - 1 - len(state)
    if trip == 0 and n_scan:
        return None  # the empty scan outputs' element shapes are unknown
    shared = out.hoist_initializers(body)
    shared[body.input[1].name] = out.const(np.array(True))
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    for t in range(trip):
        bound = dict(shared)
        bound[body.input[0].name] = out.const(np.array(t, np.int64))
        bound.update({i.name: s for i, s in zip(body.input[2:], state)})
        last = t == trip - 1
        targets = ["", *node.output[:n_state]] if last else ()
        results = out.instantiate(body, bound, f"iter{t}/", targets)
        state = results[1 : 1 + n_state]
        for k in range(n_scan):
            scans[k].append(results[1 + n_state + k])
    for value, target in zip(state, node.output):
        out.identity(value, target)
    for parts, target in zip(scans, node.output[n_state:]):
        if target:
            out.stack(parts, 0, target)
    return out


def _unroll_scan(node, scope: _Scope, out: _Expansion) -> _Expansion | None:
    if out.opset < 9:
        return _unroll_batched_scan(node, scope, out)
    body = _graph_attr(node, "body")
    n_in = _attr(node, "num_scan_inputs", 0)
    n_state = len(node.input) - n_in
    n_out = len(body.output) - n_state
    in_axes = list(_attr(node, "scan_input_axes", [0] * n_in))
    in_dirs = list(_attr(node, "scan_input_directions", [0] * n_in))
    out_axes = list(_attr(node, "scan_output_axes", [0] * n_out))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * n_out))
    sequences = node.input[n_state:]
    shapes = [scope.shapes.get(s) for s in sequences]
    if not sequences or any(s is None for s in shapes):
        return None
    in_axes = [a % len(s) for a, s in zip(in_axes, shapes)]
    length = _common_dim(s[a] for a, s in zip(in_axes, shapes))
    out_ranks = [_out_rank(scope, node.output[n_state + k], body.output[n_state + k])
                 for k in range(n_out)]
    if length is None or not 0 < length <= MAX_UNROLL:
        return None
    if any(a < 0 and r is None for a, r in zip(out_axes, out_ranks)):
        return None
    out_axes = [a % r if a < 0 else a for a, r in zip(out_axes, out_ranks)]
    steps = list(zip(sequences, in_axes, in_dirs))
    shared = out.hoist_initializers(body)
    state, scans = _scan_steps(out, body, shared, node.input[:n_state], steps, length,
                               node.output[:n_state])
    for value, target in zip(state, node.output):
        out.identity(value, target)
    for parts, axis, direction, target in zip(scans, out_axes, out_dirs, node.output[n_state:]):
        if target:
            out.stack(parts[::-1] if direction else parts, axis, target)
    return out


def _unroll_batched_scan(node, scope: _Scope, out: _Expansion) -> _Expansion | None:
    """Scan-8: states are [batch, ...] and sequences [batch, sequence, ...]; the body runs
    on one batch entry. Unrolled per batch entry, without `sequence_lens`."""
    if node.input[0] and node.input[0] not in scope.consts:
        return None
    body = _graph_attr(node, "body")
    n_in = _attr(node, "num_scan_inputs", 0)
    n_state = len(node.input) - 1 - n_in
    values = list(node.input[1:])
    shapes = [scope.shapes.get(v) for v in values]
    if not n_in or any(s is None or len(s) < 1 + (i >= n_state) for i, s in enumerate(shapes)):
        return None
    batch = _common_dim(s[0] for s in shapes)
    length = _common_dim(s[1] for s in shapes[n_state:])
    lens = scope.consts.get(node.input[0]) if node.input[0] else None
    if batch is None or length is None or not 0 < batch * length <= MAX_UNROLL:
        return None
    if lens is not None and not np.all(lens == length):
        return None
    directions = list(_attr(node, "directions", [0] * n_in))
    shared = out.hoist_initializers(body)
    per_entry: list[list[str]] = [[] for _ in range(len(body.output))]
    for b in range(batch):
        index = out.const(np.array(b, np.int64))
        entry = [out.add("Gather", [v, index], out.value(f"batch{b}"), axis=0) for v in values]
        steps = [(seq, 0, d) for seq, d in zip(entry[n_state:], directions)]
        state, scans = _scan_steps(out, body, shared, entry[:n_state], steps, length, (),
                                   f"batch{b}/")
        for k, value in enumerate(state):
            per_entry[k].append(value)
        for k, parts in enumerate(scans):
            stacked = out.value(f"batch{b}/scan")
            out.stack(parts, 0, stacked)
            per_entry[n_state + k].append(stacked)
    for parts, target in zip(per_entry, node.output):
        if target:
            out.stack(parts, 0, target)
    return out


def _common_dim(dims) -> int | None:
    """The one static size all these dims share, or None."""
    found = set(dims)
    return found.pop() if len(found) == 1 and None not in found else None


def _scan_steps(out: _Expansion, body, shared, state, steps, length: int, targets, tag=""):
    """Unroll `length` steps of a scan body; `steps` gives (sequence, axis, reverse) per
    scan input, `shared` the names of its hoisted initializers. Returns the final state
    names and, per scan output, one name per step."""
    n_state = len(state)
    scans: list[list[str]] = [[] for _ in range(len(body.output) - n_state)]
    for t in range(length):
        bound = dict(shared)
        bound.update({i.name: s for i, s in zip(body.input, state)})
        for info, (seq, axis, reverse) in zip(body.input[n_state:], steps):
            index = out.const(np.array(length - 1 - t if reverse else t, np.int64))
            bound[info.name] = out.add("Gather", [seq, index], out.value(f"{tag}step{t}"),
                                       axis=axis)
        last = targets if t == length - 1 else ()
        results = out.instantiate(body, bound, f"{tag}step{t}/", last)
        state = results[:n_state]
        for k, parts in enumerate(scans):
            parts.append(results[n_state + k])
    return state, scans


def _out_rank(scope: _Scope, outer_name: str, body_output: onnx.ValueInfoProto) -> int | None:
    shape = scope.shapes.get(outer_name)
    if shape is not None:
        return len(shape)
    element = dims_of(body_output)
    return None if element is None else len(element) + 1
