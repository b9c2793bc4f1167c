"""ONNX-level pattern fusion: decomposed activations back into the single op they are.

Exporters without a Gelu op (ONNX before opset 20) write Gelu as elementwise arithmetic
around Erf or Tanh. Fused back into one Gelu node it converts to TFLite's GELU builtin.

A candidate is found structurally (an Erf or Tanh whose surrounding arithmetic reads one
tensor x, scalar constants and nothing else) and accepted numerically: the candidate
subgraph, evaluated at sample points, must equal Gelu. Every arrangement exporters emit
(x / sqrt(2) or x * (1/sqrt(2)), 0.5 applied first or last, x^3 as Pow or as products)
therefore fuses, while look-alikes with other constants (QuickGELU, ...) do not.

From opset 20 the fused node is ONNX's Gelu. Below it, it is onnxruntime's contrib op
(com.microsoft Gelu, or FastGelu for the tanh form), so the fused model stays valid and
runnable by onnxruntime (the accuracy checker runs it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset

ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Pow"}
CORES = {"Erf": "none", "Tanh": "tanh"}
MAX_CLIMB = 4  # arithmetic nodes between the core (Erf / Tanh) and the Gelu output
SAMPLES = np.array([-4.1, -2.3, -1.2, -0.7, -0.2, 0.05, 0.4, 0.9, 1.7, 3.2], np.float64)


def fuse_patterns(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite erf- and tanh-based Gelu subgraphs of the main graph into Gelu nodes
    (domain "", attribute `approximate` "none" / "tanh"); in place, and returned.

    A subgraph is fused only when its intermediate values have no other consumers and are
    not graph outputs. Constants it alone used are removed.
    """
    graph = model.graph
    opset = default_opset(model)
    while True:
        index = GraphIndex(graph)
        match = next((m for i in range(len(index.nodes)) if (m := _match_gelu(i, index))), None)
        if match is None:
            return model
        _replace(graph, index, match, contrib=opset < 20)
        if opset < 20 and not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


@dataclass
class _Match:
    nodes: list[int]  # positions of the fused subgraph's nodes, in graph order
    x: str
    output: str
    approximate: str


def _is_scalar(index: GraphIndex, name: str) -> bool:
    value = index.constants.get(name)
    return value is not None and value.size == 1 and value.dtype.kind == "f"


def _keeps_rank(index: GraphIndex, name: str, x: str) -> bool:
    """Broadcasting the one-element constant against x does not raise x's rank
    (an unknown rank admits scalars and 1-D constants)."""
    rank = index.rank(x)
    return index.constants[name].ndim <= (1 if rank is None else rank)


def _is_arithmetic(index: GraphIndex, i: int | None) -> bool:
    node = None if i is None else index.nodes[i]
    return node is not None and node.op_type in ARITHMETIC and node.domain in ("", "ai.onnx")


def _operands(index: GraphIndex, i: int) -> list[str] | None:
    """Non-constant inputs of node i, or None when one of its constants is not a scalar."""
    inputs = index.nodes[i].input
    if any(name in index.constants and not _is_scalar(index, name) for name in inputs):
        return None
    return [name for name in inputs if name not in index.constants]


def _region_behind(value: str, index: GraphIndex, x: str | None = None):
    """(nodes, sources): the arithmetic nodes computing `value` through single-use
    intermediates (stopping at x), and the non-constant values they start from."""
    nodes, sources, stack = [], set(), [value]
    while stack:
        name = stack.pop()
        i = index.producer.get(name)
        if name == x or not _is_arithmetic(index, i) or not index.single_use(name):
            sources.add(name)
            continue
        operands = _operands(index, i)
        if operands is None:
            return None
        if i not in nodes:
            nodes.append(i)
        stack.extend(operands)
    return nodes, sources


def _match_gelu(core: int, index: GraphIndex) -> _Match | None:
    """The Gelu subgraph around node `core` if it is an Erf or Tanh in one, else None."""
    node = index.nodes[core]
    if node.op_type not in CORES or node.domain not in ("", "ai.onnx"):
        return None
    approximate = CORES[node.op_type]
    behind = _region_behind(node.input[0], index)
    if behind is None or not behind[0] or len(behind[1]) != 1:
        return None
    region, (x,) = [*behind[0], core], behind[1]
    value = node.output[0]
    for _ in range(MAX_CLIMB):
        if not index.single_use(value):
            return None
        step = index.consumers[value][0]
        operands = _operands(index, step) if _is_arithmetic(index, step) else None
        if operands is None:
            return None
        for operand in set(operands) - {value, x}:
            side = _region_behind(operand, index, x)
            if side is None or side[1] != {x}:
                return None
            region.extend(i for i in side[0] if i not in region)
        region.append(step)
        value = index.nodes[step].output[0]
        if _computes_gelu(sorted(region), x, value, index, approximate):
            return _Match(sorted(region), x, value, approximate)
    return None


_FUNCTIONS = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
    "Tanh": np.tanh, "Erf": np.vectorize(math.erf),
}


def _computes_gelu(region, x: str, output: str, index: GraphIndex, approximate: str) -> bool:
    """Does the region (positions in graph order), evaluated at SAMPLES in float64, equal
    Gelu at its output?"""
    nodes = [index.nodes[i] for i in region]
    constants = {name for n in nodes for name in n.input if name in index.constants}
    if not all(_keeps_rank(index, c, x) for c in constants):
        return False
    values = {x: SAMPLES, **{c: float(index.constants[c].reshape(-1)[0]) for c in constants}}
    with np.errstate(all="ignore"):
        for n in nodes:
            values[n.output[0]] = _FUNCTIONS[n.op_type](*(values[i] for i in n.input))
    return bool(np.allclose(values[output], _gelu(SAMPLES, approximate), rtol=1e-5, atol=1e-6))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _FUNCTIONS["Erf"](x / math.sqrt(2)))


def _replace(graph: onnx.GraphProto, index: GraphIndex, match: _Match, contrib: bool) -> None:
    """Put one Gelu node where the subgraph's output node was; drop what only it used.

    `contrib`: use onnxruntime's com.microsoft Gelu / FastGelu (models below opset 20).
    """
    root = match.nodes[-1]
    name = f"{index.nodes[root].name or match.output}_gelu"
    if contrib:
        op_type = "FastGelu" if match.approximate == "tanh" else "Gelu"
        gelu = helper.make_node(op_type, [match.x], [match.output], name=name,
                                domain="com.microsoft")
    else:
        gelu = helper.make_node("Gelu", [match.x], [match.output], name=name,
                                approximate=match.approximate)
    fused = [index.nodes[i] for i in match.nodes]
    kept = [gelu if i == root else n for i, n in enumerate(index.nodes)
            if i == root or i not in match.nodes]
    still_used = {name for n in kept for name in n.input} | index.outputs
    dead = {name for n in fused for name in n.input if name in index.constants} - still_used
    kept = [n for n in kept if not (n.op_type == "Constant" and n.output[0] in dead)]
    stale = {o for n in fused for o in n.output} - {match.output}
    del graph.node[:]
    graph.node.extend(kept)
    _remove_named(graph.initializer, dead)
    _remove_named(graph.input, dead)
    _remove_named(graph.value_info, stale)


def _remove_named(field, names: set[str]) -> None:
    """Delete the entries called `names` in place (the others, weights included, are not
    copied)."""
    for i in reversed([i for i, item in enumerate(field) if item.name in names]):
        del field[i]
