"""One index of an ONNX graph for the rewrite passes: which node makes each value and which
read it, each value's declared type and shape, and the constants among the values.

Nodes are referred to by their position in `nodes` (protobuf wrappers have no stable
identity); `producer_node` and `consumer_nodes` give the nodes themselves. The index covers
one graph: a pass working in an If or Loop body builds one on that body (the enclosing
graphs' values are not in it), and reads inside a node's subgraphs do not count as reads.
A pass that changes the node list calls `reindex`.

Shapes come from the declared value infos (an initializer's from its tensor) in three
strengths: `dims` keeps each unknown dim's symbol, `shape` reports every unknown dim as
None, and `static_shape` is None unless every dim is known.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.weights import to_array

# Initializers up to this many elements are read into `constants`; larger ones (weights)
# stand there as shape-only arrays, so that indexing a graph copies no weights.
LIGHT_ELEMENTS = 16

# Constant node attributes holding a list or scalar value, and the dtype that value has.
_PLAIN_CONSTANTS = {"value_int": np.int64, "value_ints": np.int64, "value_float": np.float32,
                    "value_floats": np.float32}


def default_opset(model: onnx.ModelProto, missing: int = 1) -> int:
    """The model's opset of the default ONNX domain ("" or "ai.onnx"); `missing` without one."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), missing)


def dims_of(info: onnx.ValueInfoProto | None) -> list[int | str | None] | None:
    """The dims of a tensor value info, each its size, its symbol (dim_param) or None when
    it has neither; None when the rank is unknown (no info, not a tensor, no shape)."""
    if info is None or not info.type.HasField("tensor_type"):
        return None
    if not info.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in info.type.tensor_type.shape.dim]


class GraphIndex:
    """Producers, consumers, declared types and constants of `graph`.

    nodes: the nodes in graph order; producer: value -> position of the node making it;
    consumers: value -> positions of the nodes reading it (a node reading it twice once);
    outputs: the graph's output names; initializers: name -> tensor; infos: name -> the
    declared value info (a pass that declares a new type may record it here).
    """

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.outputs = {o.name for o in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}
        # declared types; where a name is declared twice, an output's wins over a
        # value_info's, which wins over an input's
        self.infos = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
        self._values: dict[str, np.ndarray] = {}
        self.reindex()

    def reindex(self) -> None:
        """Read the node list again (positions, producers, consumers) after a change."""
        self.nodes = list(self.graph.node)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.input):  # reading a value twice is one use
                if name:
                    self.consumers.setdefault(name, []).append(i)

    # --- where values come from and go ----------------------------------------------------
    def producer_node(self, name: str) -> onnx.NodeProto | None:
        i = self.producer.get(name)
        return None if i is None else self.nodes[i]

    def consumer_nodes(self, name: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i in self.consumers.get(name, [])]

    def single_use(self, name: str) -> bool:
        """Whether one node reads `name` and it is not a graph output."""
        return len(self.consumers.get(name, [])) == 1 and name not in self.outputs

    def only_user(self, name: str) -> onnx.NodeProto | None:
        """The node reading `name` when it is single_use, else None."""
        return self.nodes[self.consumers[name][0]] if self.single_use(name) else None

    # --- declared types ---------------------------------------------------------------------
    def info(self, name: str) -> onnx.ValueInfoProto | None:
        """The value info declared for `name`; for an initializer without one, its type made
        from the tensor (not added to the graph)."""
        info, tensor = self.infos.get(name), self.initializers.get(name)
        if info is None and tensor is not None:
            return helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
        return info

    def dims(self, name: str) -> list[int | str | None] | None:
        """The value's dims, each its size, its symbol or None (see `dims_of`)."""
        return dims_of(self.info(name))

    def shape(self, name: str) -> list[int | None] | None:
        """The value's shape with None for every unknown (symbolic or unset) dim; None when
        the rank is unknown."""
        dims = self.dims(name)
        return None if dims is None else [d if isinstance(d, int) else None for d in dims]

    def static_shape(self, name: str) -> list[int] | None:
        """The value's shape when every dim is known, else None."""
        shape = self.shape(name)
        return None if shape is None or None in shape else shape

    def rank(self, name: str) -> int | None:
        """The value's rank; None when unknown."""
        dims = self.dims(name)
        return None if dims is None else len(dims)

    # --- constants --------------------------------------------------------------------------
    @cached_property
    def constants(self) -> dict[str, np.ndarray]:
        """Values of the initializers and Constant nodes by name (read on first use). An
        initializer above LIGHT_ELEMENTS stands here as zeros broadcast to its shape: its
        dtype, rank and shape are right and nothing is copied; `value` reads it."""
        found = {name: _light_value(t) for name, t in self.initializers.items()}
        for node in self.nodes:
            value = _constant_node_value(node)
            if value is not None:
                found[node.output[0]] = value
        return found

    def value(self, name: str) -> np.ndarray | None:
        """The full value of a constant (a large initializer is read once, then kept); None
        for a value that is not a constant."""
        if name not in self.constants:
            return None
        if name not in self._values:
            tensor = self.initializers.get(name)
            self._values[name] = self.constants[name] if tensor is None else to_array(tensor)
        return self._values[name]

    # --- changes ------------------------------------------------------------------------------
    def add_constant(self, name: str, value: np.ndarray) -> str:
        """Add `value` as an initializer named `unique(name)`; returns that name."""
        name = self.unique(name)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        self.initializers[name] = self.graph.initializer[-1]
        self.constants[name] = self._values[name] = value
        return name

    def replace_nodes(self, replaced: dict[int, list[onnx.NodeProto]],
                      dropped: set[int]) -> None:
        """The graph's nodes rewritten in order: the node at each position of `replaced`
        becomes its nodes, those at the positions in `dropped` go (positions as `nodes`
        indexes them); then reindexed."""
        nodes = []
        for position, node in enumerate(self.nodes):
            if position in replaced:
                nodes.extend(replaced[position])
            elif position not in dropped:
                nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.reindex()

    def unique(self, name: str) -> str:
        """`name`, or `name_1`, `name_2`, ...: the first no node output, initializer or graph
        input has."""
        taken = set(self.producer) | set(self.initializers) | {i.name for i in self.graph.input}
        candidate, k = name, 0
        while candidate in taken:
            k += 1
            candidate = f"{name}_{k}"
        return candidate


def _light_value(tensor: onnx.TensorProto) -> np.ndarray:
    if int(np.prod(tensor.dims, dtype=np.int64)) <= LIGHT_ELEMENTS:
        return to_array(tensor)
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return np.broadcast_to(np.zeros((), dtype), tuple(tensor.dims))


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node (tensor, int(s) or float(s)); None for other nodes and
    for sparse and string constants."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.attribute:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name in _PLAIN_CONSTANTS:
        return np.array(helper.get_attribute_value(attr), dtype=_PLAIN_CONSTANTS[attr.name])
    return None
