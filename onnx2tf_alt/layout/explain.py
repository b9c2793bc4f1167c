"""Where the transposes of a conversion come from.

`plan_transposes` groups the relayouts a plan asks the builder for by the op producing the
value, the ops consuming it and the rank, most frequent first, with one example each; a
move of size-1 axes only is listed too, marked free (the builder emits a reshape).
`tflite_transposes` explains each TRANSPOSE op of a .tflite: "plan" when it is a relayout
the plan asked for (its ONNX node consumes a value the plan moves), "inside <op type>" when
a handler emits it itself, "converter" when TF's converter made it with no ONNX node to
name. `describe` turns both into the lines `-v debug` prints and
`python -m onnx2tf_alt.cli.explain` shows for any model.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from onnx2tf_alt.ir.graph import Graph
from onnx2tf_alt.layout.cost import moving_transposes
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.layout.plan import Plan


@dataclass(frozen=True)
class TransposeGroup:
    """Relayouts of values made by one op type and read by the same op types."""

    producer: str  # op type, or "(input)" for a model input
    consumers: tuple[str, ...]
    rank: int
    moving: bool  # False: only size-1 axes move (a reshape, no data movement)
    count: int
    example: str  # one value of the group
    held: Perm | None
    wanted: Perm
    shape: tuple | None


def plan_transposes(graph: Graph, plan: Plan) -> list[TransposeGroup]:
    """The plan's relayouts, grouped, most frequent first."""
    producers = {o: n.op_type for n in graph.nodes for o in n.outputs}
    consumers = defaultdict(set)
    for node in graph.nodes:
        for name in node.inputs:
            consumers[name].add(node.op_type)
    moving = set(moving_transposes(graph, plan))
    counts, examples = Counter(), {}
    for value, perm in sorted(plan.transposes(graph)):
        key = (producers.get(value, "(input)"), tuple(sorted(consumers[value])), len(perm),
               (value, perm) in moving)
        counts[key] += 1
        examples.setdefault(key, (value, plan.perms.get(value), perm, graph.shapes.get(value)))
    return [TransposeGroup(*key, count, *examples[key]) for key, count in counts.most_common()]


def tflite_transposes(ops: Iterable, graph: Graph, plan: Plan) -> Counter:
    """Each TRANSPOSE op of a .tflite by where it comes from. `ops`: the delegate report's
    ops (export/delegates.py), each with `.op` and `.onnx_nodes` ([{"name", "op_type"}])."""
    moving = set(moving_transposes(graph, plan))
    asks = {node.name for i, node in enumerate(graph.nodes)
            if moving.intersection(plan.node_transposes(graph, i))}
    found = Counter()
    for op in ops:
        if op.op != "TRANSPOSE":
            continue
        names = [n["name"] for n in op.onnx_nodes]
        if any(n in asks for n in names):
            found["plan"] += 1
        elif names:
            found[f"inside {'/'.join(sorted({n['op_type'] for n in op.onnx_nodes}))}"] += 1
        else:
            found["converter"] += 1
    return found


def describe(graph: Graph, plan: Plan, tflite_ops: Iterable | None = None) -> list[str]:
    """One line per group of the plan's relayouts, then a summary line."""
    groups = plan_transposes(graph, plan)
    lines = [
        f"{g.count:4d}  {g.producer} -> {','.join(g.consumers)} (rank {g.rank})"
        f"{'' if g.moving else ' [free: size-1 axes]'}: e.g. {g.example} shape {g.shape} "
        f"held {g.held} wanted {g.wanted}"
        for g in groups
    ]
    onnx_transposes = sum(n.op_type == "Transpose" for n in graph.nodes)
    summary = (f"transposes: {onnx_transposes} Transpose node(s) in the prepared graph; "
               f"plan: {sum(g.count for g in groups if g.moving)} moving, "
               f"{sum(g.count for g in groups if not g.moving)} free")
    if tflite_ops is not None:
        found = tflite_transposes(tflite_ops, graph, plan)
        summary += f"; TFLite TRANSPOSE: {sum(found.values())} {dict(found.most_common())}"
    return [*lines, summary]
