"""The Select TF (Flex) ops a .tflite needs, mapped to ONNX nodes (--builtin_only). The
flatbuffers themselves come from onnx2tf_alt/tflite/lowering.py."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from onnx2tf_alt.errors import ConversionError
from onnx2tf_alt.tflite.flatbuffer import read_model

log = logging.getLogger("onnx2tf_alt")


@dataclass
class FlexOp:
    """A Select TF op of a .tflite: its name ('FlexMatrixInverse'), the names of its output
    tensors (TF's converter derives them from the op's Keras layer) and the signature keys
    of those that are model outputs (which TF names StatefulPartitionedCall:<i>)."""

    code: str
    tensors: list[str]
    output_keys: list[str]


def flex_ops(content: bytes) -> list[FlexOp]:
    """The Select TF (Flex) ops of a .tflite, in every subgraph."""
    model = read_model(content)
    keys: dict[tuple[int, int], str] = {}
    for i in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(i)
        for j in range(signature.OutputsLength()):
            tensor_map = signature.Outputs(j)
            keys[(signature.SubgraphIndex(), tensor_map.TensorIndex())] = (
                tensor_map.Name().decode())
    found = []
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(i)
            code = (model.OperatorCodes(op.OpcodeIndex()).CustomCode() or b"").decode()
            if code.startswith("Flex"):
                outputs = [int(t) for t in op.OutputsAsNumpy() if t >= 0]
                found.append(FlexOp(code, [subgraph.Tensors(t).Name().decode() for t in outputs],
                                    [keys[(g, t)] for t in outputs if (g, t) in keys]))
    return found


def layer_owners(result, graph) -> dict[str, object]:
    """{Keras layer name: the ONNX node whose handler created it}: from each node's output
    tensors back to the converted values it read (relayouts go to their consumer); `result`
    is a translate/builder.BuildResult (a direct writer's has no Keras layers)."""
    values = {id(v.tensor) for v in result.values.values() if v.tensor is not None}
    owners: dict[str, object] = {}
    for node in graph.nodes:
        stack = [result.values[o].tensor for o in node.outputs
                 if o in result.values and result.values[o].tensor is not None]
        while stack:
            history = getattr(stack.pop(), "_keras_history", None)
            if history is None or history.layer.name in owners:
                continue
            owners[history.layer.name] = node
            inbound = history.layer._inbound_nodes[history.node_index]
            stack += [t for t in inbound.keras_inputs if id(t) not in values]
    return owners


def flex_report(content: bytes, converted) -> list[str]:
    """One line per Flex op of `content`: the op and the ONNX node (name, op type) it
    came from, or its tensor names where no node is known (e.g. a quantized rebuild)."""
    found = flex_ops(content)
    if not found:
        return []
    result, graph = converted.tflite_result(), converted.graph
    owners = layer_owners(result, graph)
    producers = {o: node for node in graph.nodes for o in node.outputs}
    by_key = {key: producers.get(name) for name, key in zip(graph.outputs, result.output_keys)}
    lines = []
    for op in found:
        parts = {part for t in op.tensors for part in t.split("/")}
        nodes = [node for layer, node in owners.items() if layer in parts]
        nodes += [by_key[k] for k in op.output_keys if by_key.get(k) and by_key[k] not in nodes]
        where = ", ".join(f"node '{n.name}' ({n.op_type})" for n in nodes) or (
            f"tensor(s) {op.tensors}")
        lines.append(f"{op.code} from {where}")
    return lines


def check_builtin_only(content: bytes, name: str, converted, builtin_only: bool) -> None:
    """A .tflite that needs the Flex delegate: ConversionError (exit 1) with --builtin_only,
    else a warning; both name the ONNX nodes responsible."""
    lines = flex_report(content, converted)
    if not lines:
        return
    text = f"{name} needs Select TF ops (the Flex delegate at run time):\n" + "\n".join(
        f"  - {line}" for line in lines)
    if builtin_only:
        raise ConversionError([], headline=text + "\n--builtin_only forbids them: replace "
                              "these nodes in the ONNX graph, or convert without it.")
    log.warning("%s", text)


def check_builtin_only_files(paths: list[str], converted, builtin_only: bool) -> None:
    """check_builtin_only for .tflite files already written."""
    for path in paths:
        with open(path, "rb") as f:
            check_builtin_only(f.read(), os.path.basename(path), converted, builtin_only)
