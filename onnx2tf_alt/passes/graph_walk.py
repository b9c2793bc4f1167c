"""Walks over an ONNX graph's producers, shared by the KV-cache passes (kv_cache.py,
kv_mask.py): what a tensor copies, what it is computed from, which constants it reads."""

from __future__ import annotations

import onnx

TABLE_CARRIERS = ("Identity", "Cast", "Slice", "Squeeze")  # a table's rows, sliced or not


def is_copy(node: onnx.NodeProto | None) -> bool:
    """An op whose output is its one input, unchanged: Identity, or a Concat of one tensor
    (TorchScript exports write one where a cache list is rebuilt)."""
    return node is not None and (node.op_type == "Identity" or (
        node.op_type == "Concat" and len([i for i in node.input if i]) == 1))


def source_of(producer: dict[str, onnx.NodeProto], name: str) -> str:
    """The tensor `name` copies (see is_copy), or `name` itself."""
    node = producer.get(name)
    while is_copy(node):
        name = next(i for i in node.input if i)
        node = producer.get(name)
    return name


def concat_of(producer: dict[str, onnx.NodeProto], name: str, types: dict[str, int]
              ) -> onnx.NodeProto | None:
    """The Concat that `name` copies (see is_copy), also through a Cast to the element type
    its first input already has (`types`: the graph inputs' element types; GPT-J's and
    CodeGen's present keys are cast back to the model's type), or None."""
    node = producer.get(source_of(producer, name))
    if node is not None and node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        inner = producer.get(source_of(producer, node.input[0]))
        first = inner.input[0] if inner is not None and inner.op_type == "Concat" else ""
        node = inner if first and types.get(source_of(producer, first)) == to else None
    return node if node is not None and node.op_type == "Concat" else None


def computed_from(producer: dict[str, onnx.NodeProto], name: str, wanted: set[str],
              limit: int = 400) -> str | None:
    """The first of `wanted` that `name` is computed from (a bounded walk up), or None."""
    seen, todo = set(), [name]
    while todo and len(seen) < limit:
        name = todo.pop()
        if name in wanted:
            return name
        if name in seen or name not in producer:
            continue
        seen.add(name)
        todo.extend(i for i in producer[name].input if i)
    return None


def constant_dims(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """{name: dims} of the graph's initializers and Constant nodes' tensors."""
    dims = {i.name: list(i.dims) for i in graph.initializer}
    dims.update({n.output[0]: list(n.attribute[0].t.dims) for n in graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return dims


def traced(producer: dict[str, onnx.NodeProto], name: str, carriers: tuple[str, ...]) -> str:
    """The tensor `name` is made from through `carriers` (their first input)."""
    while name in producer and producer[name].op_type in carriers:
        name = producer[name].input[0]
    return name


def nodes_upstream(producer: dict[str, onnx.NodeProto], name: str,
                   limit: int = 400) -> list[onnx.NodeProto]:
    """The nodes `name` is computed by (a bounded walk up), nearest first."""
    seen, todo, found = set(), [name], []
    while todo and len(seen) < limit:
        name = todo.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        found.append(producer[name])
        todo.extend(i for i in producer[name].input if i)
    return found


def small_constant(graph: onnx.GraphProto, name: str) -> list[int] | None:
    """The values of a small integer constant (a Constant node's or an inline initializer's),
    else None."""
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name and node.attribute:
            value = onnx.helper.get_attribute_value(node.attribute[0])
            return onnx.numpy_helper.to_array(value).reshape(-1).tolist() \
                if isinstance(value, onnx.TensorProto) else None
    for init in graph.initializer:
        if init.name == name and init.data_location != onnx.TensorProto.EXTERNAL:
            return onnx.numpy_helper.to_array(init).reshape(-1).tolist()
    return None


def slice_constants(graph: onnx.GraphProto, node: onnx.NodeProto) -> list[list[int] | None]:
    """[starts, ends, axes, steps] of Slice `node`, each the small constant it reads or None
    where it is computed; axes not given are the first len(starts), steps not given 1."""
    inputs = [*node.input[1:5], "", "", "", ""][:4]
    starts, ends = (small_constant(graph, i) for i in inputs[:2])
    axes = small_constant(graph, inputs[2]) if inputs[2] else (
        list(range(len(starts))) if starts is not None else None)
    steps = small_constant(graph, inputs[3]) if inputs[3] else (
        [1] * len(axes) if axes is not None else None)
    return [starts, ends, axes, steps]
