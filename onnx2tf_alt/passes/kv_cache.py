"""A decoder's growing KV cache as a cache of fixed capacity (issue 30).

An exported decoder (transformers / Optimum, torch.onnx) takes `past` keys and values and
returns `present = Concat(past, new, axis=sequence)`: one more position each step, so new
shapes and a re-allocation per token. `fixed_capacity` rewrites it so that every step has
the same shapes:

- each past input holds `capacity` positions (dim fixed), of which the caller marks the
  filled ones with 1 in the attention mask and the empty ones with 0;
- each present output returns only the `new` entries of this step; the caller writes them
  into its cache at the step's position (in place: a slice assignment into the interpreter's
  input tensor, no copy of the cache per step);
- inside the graph attention still reads Concat(past, new): the empty slots are masked out
  like padding, and the new positions keep their causal mask, so the outputs are those of
  the original graph for the same tokens (the order of the keys differs, so sums may differ
  in the last bits).

The attention mask then spans `capacity + sequence` positions, and position ids are the
caller's (the step's absolute positions). Pure ONNX: the rewritten model runs in
onnxruntime as well.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import onnx
from onnx import helper

from onnx2tf_alt.errors import InputError
from onnx2tf_alt.passes.prepare import symbol_value

ALL_SUFFIX = "/onnx2tf_alt_all_positions"


@dataclass(frozen=True)
class CacheEntry:
    """One past input and the present output that now returns only the new entries."""

    past: str
    present: str
    axis: int  # the sequence axis
    symbol: str  # the past input's symbolic length on that axis before the rewrite ("" if none)


def cache_entries(model: onnx.ModelProto) -> list[CacheEntry]:
    """The past/present pairs of `model`: a graph output made (directly or through Identity)
    by a two-input Concat whose first input is a graph input."""
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    producer = {out: node for node in graph.node for out in node.output}
    found = []
    for output in graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        if node is None or node.op_type != "Concat" or len(node.input) != 2:
            continue
        past = inputs.get(node.input[0])
        if past is None:
            continue
        dims = past.type.tensor_type.shape.dim
        axis = next(a.i for a in node.attribute if a.name == "axis")
        axis = axis + len(dims) if axis < 0 else axis
        found.append(CacheEntry(past.name, output.name, axis, dims[axis].dim_param))
    return found


def fixed_capacity(model: onnx.ModelProto, capacity: int) -> tuple[onnx.ModelProto,
                                                                    list[CacheEntry]]:
    """`model` (modified) with a cache of `capacity` positions (see the module docstring),
    and its past/present pairs. InputError when it has none."""
    if capacity < 1:
        raise InputError(f"--kv_cache_capacity must be at least 1 (got {capacity}).")
    entries = cache_entries(model)
    if not entries:
        raise InputError(
            "--kv_cache_capacity: the model has no KV cache to fix: no output is a Concat of a "
            "past input and new entries (inputs: "
            f"{[i.name for i in model.graph.input]}). Export the decoder with past key/values "
            "(e.g. transformers / Optimum with use_cache), or drop the flag.")
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    for entry in entries:
        node = producer[entry.present]
        while node.op_type == "Identity":
            node = producer[node.input[0]]
        new = node.input[1]
        _rename(graph, entry.present, entry.present + ALL_SUFFIX)
        graph.node.append(helper.make_node("Identity", [new], [entry.present],
                                           name=f"{entry.present}/new_entries"))
        dims = next(i for i in graph.input if i.name == entry.past).type.tensor_type.shape.dim
        dims[entry.axis].Clear()
        dims[entry.axis].dim_value = capacity
        out = next(o for o in graph.output if o.name == entry.present)
        out.type.tensor_type.shape.dim[entry.axis].Clear()  # the step's length
    _substitute(graph, {e.symbol for e in entries if e.symbol}, capacity)
    return model, entries


def _substitute(graph: onnx.GraphProto, symbols: set[str], capacity: int) -> None:
    """The past length's symbols replaced by `capacity` in every input's dims: the attention
    mask's `past_sequence + sequence` becomes `256 + sequence`, which -ois / --signature
    shapes then resolve (passes/prepare.set_input_shapes)."""
    for info in graph.input:
        for dim in info.type.tensor_type.shape.dim:
            if not dim.HasField("dim_param"):
                continue
            try:
                tree = ast.parse(dim.dim_param, mode="eval")
            except SyntaxError:
                continue
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            if not names & symbols:
                continue
            value = symbol_value(dim.dim_param, dict.fromkeys(symbols, capacity))
            if value is not None:
                dim.Clear()
                dim.dim_value = value
                continue
            for node in ast.walk(tree):
                for field, child in ast.iter_fields(node):
                    if isinstance(child, ast.Name) and child.id in symbols:
                        setattr(node, field, ast.Constant(capacity))
            dim.dim_param = ast.unparse(tree)


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node's reference to tensor `old` (as output or input) now names `new`; the graph
    output named `old` is left for its new producer."""
    for node in graph.node:
        for names in (node.input, node.output):
            for k, name in enumerate(names):
                if name == old:
                    names[k] = new
    for info in graph.value_info:
        if info.name == old:
            info.name = new
