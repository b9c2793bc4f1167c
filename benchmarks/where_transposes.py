"""Where the transposes of a conversion come from.

    python benchmarks/where_transposes.py [--tflite] model.onnx [...]

For each model: the layout plan's relayouts, grouped by the op producing the value, the ops
consuming it and the rank, most frequent first, with one example each (a move of size-1
axes only is listed too, marked free: the builder emits a reshape). With --tflite the model
is also converted, and every TRANSPOSE op of the float32 .tflite is explained: "plan" when
it is a relayout the plan asked for (its ONNX node consumes a value the plan moves), else
"inside <op type>" (a handler's own transpose), or "converter" when TF's converter made it
with no ONNX node to name. A summary line per model gives ONNX Transpose nodes, moving
plan transposes and TFLite TRANSPOSE ops.
"""

from __future__ import annotations

import argparse
import collections

import onnx

from onnx2tf_alt.layout.cost import moving_transposes
from onnx2tf_alt.pipeline import build


def plan_groups(converted) -> None:
    graph, plan = converted.graph, converted.plan
    producers = {o: n for n in graph.nodes for o in n.outputs}
    consumers = collections.defaultdict(list)
    for node in graph.nodes:
        for name in node.inputs:
            consumers[name].append(node.op_type)
    moving = set(moving_transposes(graph, plan))
    groups, examples = collections.Counter(), {}
    for value, perm in plan.transposes(graph):
        producer = producers[value].op_type if value in producers else "(input)"
        key = (producer, tuple(sorted(set(consumers[value]))), len(perm),
               (value, perm) in moving)
        groups[key] += 1
        examples.setdefault(key, (value, plan.perms.get(value), perm, graph.shapes.get(value)))
    for key, count in groups.most_common():
        value, have, want, shape = examples[key]
        free = "" if key[3] else " [free: size-1 axes]"
        print(f"{count:4d}  {key[0]} -> {','.join(key[1])} (rank {key[2]}){free}: e.g. {value} "
              f"shape {shape} held {have} wanted {want}")


def tflite_transposes(converted) -> collections.Counter:
    """Each TRANSPOSE op of the float32 .tflite, by where it comes from."""
    from onnx2tf_alt.export.delegates import analyze
    from onnx2tf_alt.tflite.lowering import tflite_bytes

    graph, plan = converted.graph, converted.plan
    moving = set(moving_transposes(graph, plan))
    asks = {node.name for i, node in enumerate(graph.nodes)
            if moving.intersection(plan.node_transposes(graph, i))}
    report = analyze(tflite_bytes(converted.tflite_result()), converted.result, graph)
    found = collections.Counter()
    for op in report.ops:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--tflite", action="store_true", help="explain the .tflite's TRANSPOSEs")
    args = parser.parse_args()
    for path in args.models:
        converted = build(path)
        print(f"== {path}")
        plan_groups(converted)
        graph = converted.graph
        model = onnx.load(path, load_external_data=False)
        onnx_count = sum(n.op_type == "Transpose" for n in model.graph.node)
        planned = len(moving_transposes(graph, converted.plan))
        line = f"ONNX Transpose nodes: {onnx_count}; plan: {planned} moving"
        if args.tflite:
            found = tflite_transposes(converted)
            line += f"; TFLite TRANSPOSE: {sum(found.values())} ({dict(found.most_common())})"
        print(line)


if __name__ == "__main__":
    main()
