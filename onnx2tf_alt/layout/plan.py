"""The per-tensor layout plan.

`plan_layouts` assigns every value a perm before any TensorFlow op exists, as a pure
function of the graph and of each handler's LayoutPolicy (policies.py); the builder then
inserts a transpose exactly where a value's perm differs from what a consumer asked for
(once per value and perm; a move of size-1 axes only becomes a reshape).

- Model inputs of rank 3-5 start channel-last when they reach a node whose policy
  `wants_channel_last` through nodes whose policy `passes_layout` (-k / -kt override).
- The forward pass visits nodes in topological order; each decides from the perms that
  reach it.
- By default the plan is then the cheapest of the forward pass and of the ONNX-order plan,
  improved by the cost-decreasing search of cost.py (a change is kept only when the cost of
  the plan's transposes strictly falls), so it is never worse than either.
- Model outputs keep their perm when it is ONNX order or channel-last (at rank 3 only when a
  channel-last op produced them), else go back to ONNX order.

explain.py says where each transpose of a plan comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm
from onnx2tf_alt.layout.policies import LayoutPolicy, logical


@dataclass
class Plan:
    """Perm of every value, and what each node wants of its inputs."""

    perms: dict[str, Perm] = field(default_factory=dict)
    node_inputs: list[list[Perm | None]] = field(default_factory=list)
    output_perms: dict[str, Perm] = field(default_factory=dict)

    def transposes(self, graph: Graph) -> set[tuple[str, Perm]]:
        """Distinct (value, perm) pairs the builder must materialize with a transpose."""
        needed = self.output_transposes(graph)
        for index in range(len(graph.nodes)):
            needed.update(self.node_transposes(graph, index))
        return needed

    def node_transposes(self, graph: Graph, index: int) -> list[tuple[str, Perm]]:
        """The (value, perm) pairs node `index` needs a transpose for."""
        return [(name, perm) for name, perm in zip(graph.nodes[index].inputs,
                                                   self.node_inputs[index])
                if _needs_transpose(graph, self.perms, name, perm)]

    def output_transposes(self, graph: Graph) -> set[tuple[str, Perm]]:
        """The (value, perm) pairs the model outputs need a transpose for."""
        return {(name, perm) for name, perm in self.output_perms.items()
                if not graph.is_const(name) and _differs(self.perms[name], perm)}


def _needs_transpose(graph: Graph, perms: dict[str, Perm], name: str, want: Perm | None) -> bool:
    if want is None or not name or graph.is_const(name):
        return False
    return _differs(perms[name], want)


def _differs(have: Perm, want: Perm) -> bool:
    return len(have) == len(want) and tuple(have) != tuple(want)


def _feeds_channel_last(
    name: str, graph: Graph, policy_of: Callable[[Node], LayoutPolicy], depth: int = 8
) -> bool:
    """Does this value reach a channel-last op's data input through ops that keep layouts?"""
    for node in graph.nodes:
        if name not in node.inputs:
            continue
        policy = policy_of(node)
        if node.inputs.index(name) == 0 and policy.wants_channel_last(node, graph):
            return True
        if policy.passes_layout and depth > 0 and any(
            _feeds_channel_last(o, graph, policy_of, depth - 1) for o in node.outputs
        ):
            return True
    return False


def plan_layouts(
    graph: Graph,
    policy_of: Callable[[Node], LayoutPolicy],
    keep_channel_first: frozenset[str] = frozenset(),
    force_channel_last: frozenset[str] = frozenset(),
    search: str = "refined",
) -> Plan:
    """Compute the layout of every value (a pure function of the graph and the policies).

    `search`: "refined" (the default) is the cheapest of the forward pass and of the ONNX-
    order plan, improved by the cost-decreasing search of cost.py; "forward" is the
    forward pass alone; "onnx_order" the plan where every node decides from ONNX order (its
    inputs transposed back wherever the forward pass would keep another perm)."""
    start = _start_perms(graph, policy_of, keep_channel_first, force_channel_last)
    policies = [policy_of(node) for node in graph.nodes]

    def forward(assumed: Assumed, begin: int = 0, base: Plan | None = None,
                redone: list[int] | None = None) -> Plan:
        return _forward(graph, policies, start, assumed, begin, base, redone)

    plan = forward({})
    if search == "forward":
        return plan
    onnx_order = {
        i: [P.identity(len(plan.perms[n])) if n in plan.perms else None for n in node.inputs]
        for i, node in enumerate(graph.nodes)
    }
    if search == "onnx_order":
        return forward(onnx_order)
    from onnx2tf_alt.layout.cost import refined

    return refined(graph, forward, plan, onnx_order)


# Node index -> the input perms its policy decides from instead of those that arrive (None:
# the arriving one). The builder then moves each input from its perm to the one decided.
Assumed = dict[int, list[Perm | None]]


def _start_perms(graph: Graph, policy_of, keep_channel_first, force_channel_last) -> dict:
    """Perms of the constants (ONNX order) and of the model inputs."""
    perms = {name: P.identity(array.ndim) for name, array in graph.constants.items()}
    for name in graph.inputs:
        rank = graph.rank(name) or 0
        channel_last_input = 3 <= rank <= 5 and name not in keep_channel_first and (
            name in force_channel_last or _feeds_channel_last(name, graph, policy_of)
        )
        perms[name] = P.channel_last(rank) if channel_last_input else P.identity(rank)
    return perms


def _forward(graph: Graph, policies: list[LayoutPolicy], start: dict, assumed: Assumed,
             begin: int = 0, base: Plan | None = None, redone: list[int] | None = None) -> Plan:
    """The forward pass: each node decides from the perms that reach it (or those
    `assumed` for it). With `base`, a plan of the same graph whose assumptions differ at
    most at node `begin`: nodes before it, and later nodes none of whose inputs changed,
    keep its decisions; the indices of the nodes decided anew are appended to `redone`."""
    plan = Plan(perms=dict(start if base is None else base.perms))
    changed: set[str] = set()
    if base is not None:
        plan.node_inputs = list(base.node_inputs[:begin])
    for index in range(begin, len(graph.nodes)):
        node = graph.nodes[index]
        if base is not None and index > begin and not changed.intersection(node.inputs):
            plan.node_inputs.append(base.node_inputs[index])
            continue
        in_perms = [plan.perms.get(n) if n else None for n in node.inputs]
        in_perms = [
            P.identity(graph.rank(n) or 0) if p is None and n else p
            for n, p in zip(node.inputs, in_perms)
        ]
        if index in assumed:
            in_perms = [p if a is None else a for p, a in zip(in_perms, assumed[index])]
        if any(n and graph.rank(n) is None and n not in graph.constants for n in node.inputs):
            # a value ONNX inference lost (inside control-flow bodies): ONNX order; the
            # builder decides again once TF has told it the rank (translate/late_shapes.py)
            decision = logical.decide(node, graph, in_perms)
        else:
            decision = policies[index].decide(node, graph, in_perms)
        plan.node_inputs.append(decision.inputs)
        if redone is not None:
            redone.append(index)
        for name, perm in zip(node.outputs, decision.outputs):
            if name:
                if base is not None and base.perms.get(name) != perm:
                    changed.add(name)
                plan.perms[name] = perm
    producers = {o: i for i, node in enumerate(graph.nodes) for o in node.outputs if o}
    for name in graph.outputs:
        perm = plan.perms.get(name, P.identity(graph.rank(name) or 0))
        keep = P.is_identity(perm) or (
            perm == P.channel_last(len(perm)) and _channel_last_output(name, graph, policies,
                                                                       producers, plan.perms))
        plan.output_perms[name] = perm if keep else P.identity(len(perm))
    return plan


def _channel_last_output(name: str, graph: Graph, policies, producers, perms) -> bool:
    """Whether a model output planned channel-last is delivered so: always at rank 4-5
    (images, volumes: NHWC / NDHWC as TFLite's own ops give them); at rank 3 only when a
    channel-last op (a 1-D conv, pool, ...) made it or it is a channel-last model input,
    possibly through ops that pass the layout on (activations, elementwise, casts: an input
    in the value's perm), so that e.g. a detector's (N, 84, anchors) concat of reshaped
    scores and boxes keeps its ONNX layout whatever the plan did inside."""
    if (graph.rank(name) or 0) >= 4:
        return True
    todo, seen = [name], set()
    while todo:
        value = todo.pop()
        index = producers.get(value)
        if index is None:
            if value in graph.inputs:
                return True  # a channel-last model input passed through
            continue
        if index in seen:
            continue
        seen.add(index)
        node, policy = graph.nodes[index], policies[index]
        if policy.wants_channel_last(node, graph):
            return True
        perm = perms.get(value)
        todo += [n for n in node.inputs if n and not graph.is_const(n)
                 and (policy.passes_layout or perms.get(n) == perm)]
    return False
