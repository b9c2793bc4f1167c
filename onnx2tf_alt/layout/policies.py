"""Layout policies: what each handler says about the perms of its inputs and outputs.

A policy's `decide` says, given the perms the node's inputs already have, which perm it
wants each input in and which perm each output comes out in (`Decision`). The kinds
(shared/DESIGN.md): channel-last native ops pull their data inputs channel-last
(`channel_last`), elementwise and axis-remapping ops keep the perm that reaches them
(`agnostic`, `same_as_input`), reshapes keep a regrouped perm when the merged axes lie
together physically (`reshaping`), `derived` computes the output perm from the input's, and
`logical` (the default) asks for ONNX order. The plan that applies them is plan.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P
from onnx2tf_alt.layout.perms import Perm


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
