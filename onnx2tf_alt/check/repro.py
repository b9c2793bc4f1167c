"""Per-node reports of a failed conversion: for every node that could not be converted, a
one-node ONNX model and the real values of its inputs, so the failure can be replayed
(and a handler written or fixed) without the original model.

Layout of `<output>/reports/`:
    conversion_errors.json       every failure, with the files written for it
    <node>.onnx                  the node alone: runtime inputs as graph inputs (typed from
                                 the graph), constant inputs as initializers, the model's
                                 opset imports
    <node>_inputs.npz            the node's runtime inputs, keyed by value name, computed
                                 by onnxruntime from the test inputs (random or -cind)
"""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.check.inputs import make_inputs
from onnx2tf_alt.check.observe import ort_values
from onnx2tf_alt.errors import NodeFailure
from onnx2tf_alt.ir.graph import Graph, Node, graph_from_model

log = logging.getLogger("onnx2tf_alt")

REPORTS_FOLDER = "reports"


def write_failure_reports(
    model: onnx.ModelProto,
    failures: list[NodeFailure],
    folder: str,
    custom_inputs: dict[str, np.ndarray] | None = None,
) -> dict:
    """Write the repro files of `failures` (nodes of the prepared `model`) into `folder`;
    returns what conversion_errors.json holds. That file is always written: a repro that
    cannot be made is noted in its entry (`repro_note`), with the reason."""
    os.makedirs(folder, exist_ok=True)
    entries = [{**vars(failure)} for failure in failures]
    sources: dict = {}
    try:
        sources = _write_repros(model, failures, entries, folder, custom_inputs)
    except Exception as err:  # noqa: BLE001 - the failure list matters more than the repros
        for entry in entries:
            entry.setdefault("repro_note", f"no repro written: {type(err).__name__}: {err}")
    summary = {
        "failures": entries,
        "test_inputs": sources,  # model input -> "random" (seed 0) or "file" (-cind)
        "replay": "onnxruntime.InferenceSession('<node>.onnx').run(None, "
        "dict(numpy.load('<node>_inputs.npz')))",
    }
    with open(os.path.join(folder, "conversion_errors.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    return summary


def _write_repros(model, failures, entries, folder, custom_inputs) -> dict:
    """One repro model (and its inputs, when they can be computed) per failure."""
    graph = graph_from_model(model)
    nodes = {n.name: n for n in graph.nodes}
    captured, why_missing, sources = _capture_inputs(model, graph, failures, nodes, custom_inputs)
    taken: set[str] = set()
    for failure, entry in zip(failures, entries):
        node = nodes.get(failure.node_name)
        if node is None:
            entry["repro_note"] = "node not found in the prepared model"
            continue
        stem = _file_stem(node.name, taken)
        try:
            repro = repro_model(node, graph, model)
            path = os.path.join(folder, f"{stem}.onnx")
            onnx.save(repro, path)
        except Exception as err:  # noqa: BLE001 - noted per node
            entry["repro_note"] = f"no repro written: {type(err).__name__}: {err}"
            continue
        entry["repro_model"] = os.path.basename(path)
        try:
            onnx.checker.check_model(repro)
        except onnx.checker.ValidationError as err:
            entry["repro_note"] = f"onnx.checker: {str(err).strip().splitlines()[0]}"
        names = [i.name for i in repro.graph.input]
        if all(n in captured for n in names):
            npz = os.path.join(folder, f"{stem}_inputs.npz")
            np.savez(npz, **{n: captured[n] for n in names})
            entry["inputs_npz"] = os.path.basename(npz)
        else:
            entry["inputs_npz"] = None
            entry["inputs_note"] = why_missing.get(node.name, "inputs could not be computed")
    return sources


def repro_model(node: Node, graph: Graph, model: onnx.ModelProto) -> onnx.ModelProto:
    """The node alone, with everything it reads from the graph typed as the graph types it."""
    inputs = [n for n in dict.fromkeys([*node.inputs, *_outer_scope_names(node.proto)]) if n]
    runtime = [n for n in inputs if not graph.is_const(n)]
    initializers = [numpy_helper.from_array(graph.constants[n], n) for n in inputs
                    if graph.is_const(n)]
    outputs = [o for o in node.outputs if o]
    repro = helper.make_model(
        helper.make_graph(
            [node.proto],
            f"repro_{node.name}",
            [_value_info(n, graph) for n in runtime],
            [_value_info(o, graph) for o in outputs],
            initializers,
        ),
        opset_imports=list(model.opset_import),
        producer_name="onnx2tf_alt failure report",
    )
    repro.ir_version = model.ir_version
    return repro


def _value_info(name: str, graph: Graph) -> onnx.ValueInfoProto:
    """Typed from the graph; an unknown dtype stays UNDEFINED and an unknown shape is
    written without dims (the checker requires a shape field)."""
    dtype = graph.dtypes.get(name)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype is not None else 0
    shape = graph.shapes.get(name)
    symbols = graph.symbols.get(name, {})
    dims = [] if shape is None else [
        d if d is not None else symbols.get(i, f"{name}_dim{i}") for i, d in enumerate(shape)
    ]
    return helper.make_tensor_value_info(name, elem, dims)


def _outer_scope_names(proto: onnx.NodeProto) -> list[str]:
    """Values a node's subgraphs read from the enclosing graph (not defined inside)."""
    used, defined = [], set()

    def walk(graph: onnx.GraphProto) -> None:
        defined.update(i.name for i in graph.input)
        defined.update(i.name for i in graph.initializer)
        for n in graph.node:
            used.extend(n.input)
            defined.update(n.output)
            for attr in n.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    walk(sub)

    for attr in proto.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            walk(sub)
    return [n for n in used if n and n not in defined]


def _capture_inputs(model, graph, failures, nodes, custom_inputs):
    """Runtime inputs of the failing nodes as onnxruntime computes them.

    First from the whole model; when onnxruntime cannot run it (e.g. an unknown custom
    op), node by node from the part of the graph that produces each node's inputs.
    Returns (values by name, {node name: why its inputs are missing}, input sources).
    """
    try:
        feeds, sources = make_inputs(graph, custom_inputs)
    except Exception as err:  # noqa: BLE001 - reported per node
        reason = f"no test inputs: {err}"
        return {}, {f.node_name: reason for f in failures}, {}
    wanted = {
        f.node_name: [n for n in [*nodes[f.node_name].inputs,
                                  *_outer_scope_names(nodes[f.node_name].proto)]
                      if n and not graph.is_const(n)]
        for f in failures if f.node_name in nodes
    }
    try:
        needed = [n for names in wanted.values() for n in names]
        return ort_values(model, feeds, needed), {}, sources
    except Exception as err:  # noqa: BLE001 - fall back to the part before each node
        log.debug("onnxruntime cannot run the whole model (%s); truncating", err)
    captured, why = {}, {}
    for node_name, names in wanted.items():
        try:
            captured.update(ort_values(_producing_part(model, graph, names), feeds, names))
        except Exception as err:  # noqa: BLE001 - reported per node
            message = [line for line in str(err).splitlines() if line.strip()]
            why[node_name] = (
                "onnxruntime cannot compute this node's inputs from the model inputs: "
                + (message[0] if message else type(err).__name__)
            )
    return captured, why, sources


def _producing_part(model: onnx.ModelProto, graph: Graph, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` holding only the nodes that `names` depend on."""
    producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    needed, stack = set(), [n for n in names if n in producer]
    while stack:
        index = producer[stack.pop()]
        if index in needed:
            continue
        needed.add(index)
        node = graph.nodes[index]
        stack.extend(n for n in [*node.inputs, *_outer_scope_names(node.proto)] if n in producer)
    part = onnx.ModelProto()
    part.CopyFrom(model)
    del part.graph.node[:]
    part.graph.node.extend(model.graph.node[i] for i in sorted(needed))
    return part


def _file_stem(node_name: str, taken: set[str]) -> str:
    """A file-name-safe, unique version of a node name."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", node_name).strip(".") or "node"
    base, k = stem, 1
    while stem in taken:
        stem, k = f"{base}_{k}", k + 1
    taken.add(stem)
    return stem
