"""The per-tensor layout plan.

`plan_layouts` assigns every value a perm before any TensorFlow op exists, as a pure
function of the graph and of each handler's LayoutPolicy. A policy's `decide` says, given
the perms the node's inputs already have, which perm it wants each input in and which perm
each output comes out in; the builder then inserts a transpose exactly where a value's perm
differs from what a consumer asked for (once per value and perm; a move of size-1 axes
only becomes a reshape).

What the plan does today (one forward pass, no cost model; shared/DESIGN.md's cost-based
global plan is the next step, issue 13):
- Model inputs of rank 3-5 start channel-last when they reach a node whose policy
  `wants_channel_last` through nodes whose policy `passes_layout` (-k / -kt override).
- Nodes are visited in topological order; each decides from the perms that reach it:
  channel-last ops pull their data inputs into channel-last, elementwise ops take the most
  common perm of their non-constant inputs (first wins ties), axis-remapping ops keep the
  data input's perm and remap their axes, reshapes keep a regrouped perm when the merged
  axes lie together physically (or after one regrouping transpose, when that lands a
  channel shuffle channel-last), and the logical default asks for ONNX order.
- Model outputs keep their perm when it is ONNX order or channel-last (at rank 3 only when a
  channel-last op produced them), else go back to
  ONNX order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from onnx2tf_alt import perms as P
from onnx2tf_alt.graph import Graph, Node
from onnx2tf_alt.perms import Perm


@dataclass
class Decision:
    """What a node needs: one perm per input (None: omitted or native) and per output."""

    inputs: list[Perm | None]
    outputs: list[Perm]


Rule = Callable[[Node, Graph, list[Perm | None]], Decision]

# What the planner may assume of a policy's decisions (LayoutPolicy.kind).
LOGICAL = "logical"  # everything in ONNX order
CHANNEL_LAST = "channel_last"  # data inputs and outputs channel-last
PASSES = "passes"  # outputs take the perm their inputs arrive in (elementwise, axis-remapping)
DERIVED = "derived"  # the output perm is a function of the input perm
CUSTOM = "custom"  # anything else: the planner only calls `decide`


@dataclass(frozen=True)
class LayoutPolicy:
    """An op's layout rule, as a value the planner can ask questions of.

    `decide(node, graph, in_perms)` says which perm each input is wanted in and which perm
    each output comes out in; `wants_channel_last(node, graph)` whether the node wants its
    data input (input 0) channel-last, which decides the layout of the model inputs feeding
    it; `passes_layout` whether outputs keep the inputs' perm, so a channel-last consumer
    further on still counts.
    """

    kind: str
    name: str
    rule: Rule
    channel_last_if: Callable[[Node, Graph], bool] | None = None

    def decide(self, node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
        return self.rule(node, graph, in_perms)

    def wants_channel_last(self, node: Node, graph: Graph) -> bool:
        if self.channel_last_if is not None:
            return self.channel_last_if(node, graph)
        return self.kind == CHANNEL_LAST

    @property
    def passes_layout(self) -> bool:
        return self.kind == PASSES


def custom_policy(rule: Rule | None = None, *, channel_last_if=None):
    """Make a decide function a LayoutPolicy of kind "custom" (usable as a decorator, with
    or without `channel_last_if`, a per-node predicate (node, graph) -> bool)."""

    def make(fn: Rule) -> LayoutPolicy:
        return LayoutPolicy(CUSTOM, fn.__name__.lstrip("_"), fn, channel_last_if)

    return make(rule) if rule is not None else make


def _out_ranks(node: Node, graph: Graph) -> list[int]:
    return [graph.rank(o) or 0 for o in node.outputs]


def _logical(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
    """The safe default: everything in ONNX order."""
    return Decision(
        inputs=[None if p is None else P.identity(len(p)) for p in in_perms],
        outputs=[P.identity(r) for r in _out_ranks(node, graph)],
    )


logical = LayoutPolicy(LOGICAL, "logical", _logical)


def channel_last(*data_inputs: int) -> LayoutPolicy:
    """Inputs listed in `data_inputs` (default: 0) and all outputs channel-last."""
    data = set(data_inputs or (0,))

    def policy(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
        wanted = []
        for i, p in enumerate(in_perms):
            if p is None:
                wanted.append(None)
            else:
                wanted.append(P.channel_last(len(p)) if i in data else P.identity(len(p)))
        return Decision(wanted, [P.channel_last(r) for r in _out_ranks(node, graph)])

    return LayoutPolicy(CHANNEL_LAST, "channel_last", policy)


def _common_perm(node: Node, graph: Graph, in_perms: list[Perm | None], rank: int) -> Perm:
    """Most frequent perm among the non-constant full-rank inputs (first one wins ties)."""
    votes = Counter()
    first: dict[Perm, int] = {}
    for i, (name, p) in enumerate(zip(node.inputs, in_perms)):
        if p is None or len(p) != rank or graph.is_const(name):
            continue
        votes[p] += 1
        first.setdefault(p, i)
    if not votes:
        return P.identity(rank)
    return max(votes, key=lambda p: (votes[p], -first[p]))


def _agnostic(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
    """Elementwise ops: every input in one common perm, rank-aligned for broadcasting.

    Lower-rank inputs are aligned to the output rank (leading size-1 axes) by the builder
    before being permuted; constants are permuted at conversion time.
    """
    ranks = _out_ranks(node, graph)
    rank = max([len(p) for p in in_perms if p is not None] + ranks[:1] or [0])
    common = _common_perm(node, graph, in_perms, rank)
    wanted = [None if p is None else common for p in in_perms]
    # An output whose rank inference left unknown has the broadcast rank of the inputs.
    known = [r if graph.rank(o) is not None else rank for o, r in zip(node.outputs, ranks)]
    return Decision(wanted, [common if r == rank else P.identity(r) for r in known])


agnostic = LayoutPolicy(PASSES, "agnostic", _agnostic)


def same_as_input(data_input: int | None = 0) -> LayoutPolicy:
    """Axis-remapping ops whose outputs keep the data input's perm (Softmax, Split, ...).

    Every other non-omitted input of the same rank takes the same perm; lower-rank inputs
    (axes, starts, ...) stay logical. `data_input=None` (Concat) takes the most common perm
    of the non-constant inputs of the highest rank instead of one input's.
    """

    def policy(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
        if data_input is None:
            rank = max(len(p) for p in in_perms if p is not None)
            base = _common_perm(node, graph, in_perms, rank)
        else:
            base = in_perms[data_input]
        wanted = []
        for p in in_perms:
            if p is None:
                wanted.append(None)
            elif len(p) == len(base):
                wanted.append(base)
            else:
                wanted.append(P.identity(len(p)))
        outs = [base if r == len(base) else P.identity(r) for r in _out_ranks(node, graph)]
        return Decision(wanted, outs)

    return LayoutPolicy(PASSES, "same_as_input", policy)


def derived(out_perm: Callable[[Node, Graph, Perm], Perm | None]) -> LayoutPolicy:
    """Single-data-input ops whose output perm is a function of the input perm.

    `out_perm` returns None when the op cannot run on this layout; then it runs logically.
    """

    def policy(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
        base = in_perms[0]
        result = out_perm(node, graph, base) if base is not None else None
        if result is None:
            return _logical(node, graph, in_perms)
        rest = [None if p is None else P.identity(len(p)) for p in in_perms[1:]]
        return Decision([base, *rest], [result])

    return LayoutPolicy(DERIVED, "derived", policy)


def reshape_perm(in_shape, out_shape, in_perm: Perm) -> Perm | None:
    """Perm under which a reshape can run directly on the physical tensor, or None.

    The reshape is split into groups of input axes that map onto groups of output axes
    (merges and splits). When every group's axes are adjacent and in order physically too,
    the physical data is already in the order the reshape needs; the output perm follows
    the groups' physical order. Size-1 axes carry no data and may go anywhere.
    """
    if in_shape is None or out_shape is None:
        return None
    groups = _reshape_groups(in_shape, out_shape)
    if groups is None:
        return None
    phys_rank = {a: i for i, a in enumerate(a for a in in_perm if in_shape[a] != 1)}
    for in_axes, _ in groups:
        ranks = [phys_rank[a] for a in in_axes]
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            return None
    groups.sort(key=lambda g: phys_rank[g[0][0]])
    key = {}
    for gi, (_, out_axes) in enumerate(groups):
        for j, axis in enumerate(out_axes):
            key[axis] = gi + j / (len(out_axes) + 1)
    n = len(out_shape)
    for axis in range(n - 1, -1, -1):
        if axis not in key:
            after = [key[a] for a in range(axis + 1, n) if a in key]
            key[axis] = (min(after) if after else len(groups)) - 1e-3 * (n - axis)
    return tuple(sorted(range(n), key=lambda a: key[a]))


def regrouped_reshape(in_shape, out_shape, in_perm: Perm) -> tuple[Perm, Perm] | None:
    """(input perm to ask for, output perm) of a reshape, moving as little as possible.

    When the reshape cannot run on the input as it lies, the input is reordered so that each
    group of merged axes is adjacent and in order, while the groups keep their physical order
    (one transpose), provided the output then lands channel-last (NHWC after a channel
    shuffle). None otherwise: the reshape then runs in ONNX order.
    """
    out = reshape_perm(in_shape, out_shape, in_perm)
    if out is not None:
        return tuple(in_perm), out
    groups = None if in_shape is None or out_shape is None else _reshape_groups(in_shape, out_shape)
    if groups is None:
        return None
    phys = {a: i for i, a in enumerate(in_perm)}
    groups.sort(key=lambda g: min(phys[a] for a in g[0]))
    grouped = [a for g in groups for a in g[0]]
    unit = [a for a in range(len(in_shape)) if a not in grouped]
    need = tuple(unit + grouped)
    out = reshape_perm(in_shape, out_shape, need)
    # Worth it only when the output lands channel-last for a conv (a channel shuffle); else
    # ONNX order is the better bet for what follows (matmuls of attention blocks).
    if out is None or len(out) < 4 or out != P.channel_last(len(out)):
        return None
    return need, out


def reshaping(shapes: Callable[[Node, Graph], tuple | None]) -> LayoutPolicy:
    """Policy of Reshape-like ops: `shapes(node, graph)` gives (input shape, output shape)."""

    def policy(node: Node, graph: Graph, in_perms: list[Perm | None]) -> Decision:
        found = shapes(node, graph)
        planned = regrouped_reshape(*found, in_perms[0]) if found and in_perms[0] else None
        if planned is None:
            return _logical(node, graph, in_perms)
        rest = [None if p is None else P.identity(len(p)) for p in in_perms[1:]]
        return Decision([planned[0], *rest], [planned[1]])

    return LayoutPolicy(DERIVED, "reshaping", policy)


def _reshape_groups(in_shape, out_shape):
    """Pairs (input axes, output axes) of equal element count, ignoring size-1 axes."""
    ins = [a for a, d in enumerate(in_shape) if d != 1]
    outs = [a for a, d in enumerate(out_shape) if d != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        gi, go = [ins[i]], [outs[j]]
        din, dout = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        if din is None or dout is None:
            if din is not None or dout is not None:
                return None
            groups.append((gi, go))
            continue
        while din != dout:
            if din < dout:
                if i >= len(ins) or in_shape[ins[i]] is None:
                    return None
                din *= in_shape[ins[i]]
                gi.append(ins[i])
                i += 1
            else:
                if j >= len(outs) or out_shape[outs[j]] is None:
                    return None
                dout *= out_shape[outs[j]]
                go.append(outs[j])
                j += 1
        groups.append((gi, go))
    if i != len(ins) or j != len(outs):
        return None
    return groups


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
    order plan, improved by the cost-decreasing search of layout_cost.py; "forward" is the
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
    from onnx2tf_alt.layout_cost import refined

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
