"""Where the layout plan puts transposes: each planned (value, perm) relayout grouped by the
op producing the value, the ops consuming it and the rank, most frequent first, with one
example each. A size-1 move is listed too, though the builder emits it as a reshape.

    python benchmarks/where_transposes.py model.onnx
"""

from __future__ import annotations

import collections
import sys

from onnx2tf_alt.graph import graph_from_model
from onnx2tf_alt.loader import load_model
from onnx2tf_alt.pipeline import plan_graph
from onnx2tf_alt.prepare import prepare_model


def main(path: str) -> None:
    graph = graph_from_model(prepare_model(load_model(path, None)))
    plan = plan_graph(graph)
    producers = {o: n for n in graph.nodes for o in n.outputs}
    consumers = collections.defaultdict(list)
    for node in graph.nodes:
        for name in node.inputs:
            consumers[name].append(node.op_type)
    groups, examples = collections.Counter(), {}
    for value, perm in plan.transposes(graph):
        producer = producers[value].op_type if value in producers else "(input)"
        key = (producer, tuple(sorted(set(consumers[value]))), len(perm))
        groups[key] += 1
        examples.setdefault(key, (value, plan.perms.get(value), perm, graph.shapes.get(value)))
    for key, count in groups.most_common():
        value, have, want, shape = examples[key]
        print(f"{count:4d}  {key[0]} -> {','.join(key[1])} (rank {key[2]}): e.g. {value} "
              f"shape {shape} held {have} wanted {want}")
    print(f"planned: {sum(groups.values())}; ONNX Transpose nodes: "
          f"{sum(n.op_type == 'Transpose' for n in graph.nodes)}")


if __name__ == "__main__":
    main(sys.argv[1])
