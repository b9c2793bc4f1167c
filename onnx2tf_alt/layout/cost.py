"""What a layout plan costs, and the search that lowers it.

The cost of a plan is what its transposes move: for each (value, perm) the builder must
materialize, the value's elements (weighted by NARROW_TILE where the transpose swaps narrow
tiles, as a channel shuffle does) plus a fixed charge per TRANSPOSE op (its launch, and a
boundary where a delegate may split the graph). Constants are permuted at conversion time
and moves of size-1 axes become reshapes: both are free. Unknown dims count UNKNOWN_DIM.

The forward pass decides each node from the perms that reach it, so it defers a transpose
as long as it can: an attention block's Transpose of q/k/v stays a perm change and each of
the three heads is then transposed where a MatMul needs it. `refined` searches, node by
node, the few other input perms a node may decide from (ONNX order; for a Transpose, the
perm that makes its output ONNX order, i.e. doing the transpose itself; for a node whose
inputs disagree, the perm of any of them), keeps a change only when the plan's cost
strictly falls, every model output keeps the layout the forward pass gave it and no
transpose of more than MAX_ADDED_RANK dims is added, and sweeps until nothing improves. The result is never worse than the forward pass, nor than the plan
deciding every node from ONNX order (when that plan gives the outputs the same layouts).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from onnx2tf_alt.ir.graph import Graph, Node
from onnx2tf_alt.layout import perms as P

UNKNOWN_DIM = 16
# Elements-equivalent of one more TRANSPOSE op. Measured on yolo11n's attention (XNNPACK,
# 1 and 2 threads): 3 transposes moving 51.2K elements ran as fast as 4 moving 38.4K, so
# an op costs at least 12.8K; 4096 kept the 4-op plan.
PER_TRANSPOSE = 16384
MAX_SWEEPS = 3
# The search adds no transpose of a higher rank than TFLite's TRANSPOSE takes. (A limit of
# 4 was once set from a 2-thread measurement that onnxruntime's spinning workers had
# skewed; re-measured without them, mobilevit_xxs with its 5-D q/k/v transposes is 3%
# faster at 1 and 2 threads, and swin_t is as fast with 44 TRANSPOSE as with 68.)
MAX_ADDED_RANK = 6
# (width, factor): a transpose that moves the innermost axis between tiles at most `width`
# wide costs `factor` times per element. XNNPACK's kernel time at 1 thread, ShuffleNet V2's
# six shuffle shapes ([784, 2, 24] ... [49, 2, 232]) against NHWC -> NCHW of the same
# tensors: 2.0x to 4.3x, 3.4x at [784, 2, 58]; end to end, tiles 4 wide took a third of
# the excess of tiles 2 wide and 8 wide none (docs/benchmarks.md, ShuffleNet).
NARROW_TILE = ((2, 3.0), (7, 1.5))


@dataclass(frozen=True)
class Cost:
    elements: int
    transposes: int

    @property
    def total(self) -> int:
        return self.elements + PER_TRANSPOSE * self.transposes


def _elements(shape) -> int:
    if shape is None:
        return UNKNOWN_DIM ** 4
    return math.prod(UNKNOWN_DIM if d is None else d for d in shape)


def _moves(graph: Graph, plan, pairs) -> list[tuple[str, tuple]]:
    """The pairs (value, perm) of `pairs` whose transpose moves data (not size-1 axes)."""
    moved = []
    for name, want in pairs:
        have, shape = plan.perms[name], graph.shapes.get(name)
        if shape is None or not P.moves_only_unit_axes(P.physical_shape(shape, have),
                                                       P.transpose_between(have, want)):
            moved.append((name, want))
    return moved


def _cost(graph: Graph, plan, moved) -> Cost:
    return Cost(sum(round(_elements(graph.shapes.get(name)) * _per_element(
        graph.shapes.get(name), plan.perms[name], want)) for name, want in moved), len(moved))


def _per_element(shape, have, want) -> float:
    """What one element of the transpose from `have` to `want` costs, in elements of a
    well-tiled one: NARROW_TILE[n] where the innermost axis moves and the narrower of the
    tiles it swaps is n wide (a channel shuffle's [HW, 2, C/2] -> [HW, C/2, 2]: 2), else 1
    (a block copy, or wide tiles such as NHWC <-> NCHW)."""
    if shape is None:
        return 1.0
    dims = [UNKNOWN_DIM if d is None else d for d in P.physical_shape(shape, have)]
    move = [a for a in P.transpose_between(have, want) if dims[a] != 1]
    if len(move) < 2:
        return 1.0
    groups = [[move[0]]]  # output-order runs of input axes that stay adjacent and in order
    for axis in move[1:]:
        if axis == groups[-1][-1] + 1:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    inner = max(move)  # the input's innermost axis that moves data
    if inner in groups[-1]:
        return 1.0  # the innermost run stays innermost: whole rows are copied
    group_in = next(g for g in groups if inner in g)
    narrow = min(math.prod(dims[a] for a in group_in), math.prod(dims[a] for a in groups[-1]))
    return next((f for width, f in NARROW_TILE if narrow <= width), 1.0)


def moving_transposes(graph: Graph, plan) -> list[tuple[str, tuple]]:
    """The (value, perm) pairs `plan` (layout.Plan) transposes with data movement."""
    return _moves(graph, plan, plan.transposes(graph))


def plan_cost(graph: Graph, plan) -> Cost:
    """What the transposes the builder inserts for `plan` move."""
    return _cost(graph, plan, moving_transposes(graph, plan))


class _Requests:
    """The moving transposes of a plan, counted per requesting node, so that a plan
    differing in a few nodes' decisions is costed from those nodes alone."""

    def __init__(self, graph: Graph, plan, counts: Counter | None = None):
        self.graph, self.plan = graph, plan
        self.counts = counts if counts is not None else Counter(
            pair for i in range(len(graph.nodes)) for pair in self._of(plan, i))

    def _of(self, plan, index: int) -> list:
        return _moves(self.graph, plan, plan.node_transposes(self.graph, index))

    def after(self, trial, redone: list[int]) -> _Requests:
        counts = Counter(self.counts)
        for index in redone:
            counts.subtract(self._of(self.plan, index))
            counts.update(self._of(trial, index))
        return _Requests(self.graph, trial, +counts)

    @cached_property
    def cost(self) -> int:
        outputs = _moves(self.graph, self.plan, self.plan.output_transposes(self.graph))
        return _cost(self.graph, self.plan, set(self.counts) | set(outputs)).total


def _relevant(graph: Graph, plan) -> set[int]:
    """Nodes whose decision can change a transpose of `plan`: the consumers of the moved
    values and every node upstream of those values."""
    producer = {o: i for i, node in enumerate(graph.nodes) for o in node.outputs if o}
    moved = {name for name, _ in moving_transposes(graph, plan)}
    found = {i for i, node in enumerate(graph.nodes) if moved.intersection(node.inputs)}
    todo = [producer[n] for n in moved if n in producer]
    while todo:
        i = todo.pop()
        if i not in found:
            found.add(i)
            todo += [producer[n] for n in graph.nodes[i].inputs if n in producer]
    return found


def alternatives(node: Node, in_perms: list) -> list[list]:
    """Input perms, other than the arriving ones, that `node` may decide from: every input
    in ONNX order; every input of the highest rank in the perm one of them arrives in (so
    a Concat or an Add may follow its minority input); for a Transpose, the perm that makes
    its output ONNX order."""
    found = []
    if any(p is not None and not P.is_identity(p) for p in in_perms):
        found.append([None if p is None else P.identity(len(p)) for p in in_perms])
    rank = max((len(p) for p in in_perms if p is not None), default=0)
    arriving = {tuple(p) for p in in_perms if p is not None and len(p) == rank}
    if len(arriving) > 1:
        for perm in sorted(arriving - {P.identity(rank)}):
            found.append([p if p is None or len(p) != rank else perm for p in in_perms])
    onnx_perm = node.attrs.get("perm") if node.op_type == "Transpose" else None
    if onnx_perm is not None and in_perms and in_perms[0] is not None and (
            len(onnx_perm) == len(in_perms[0]) and tuple(onnx_perm) != tuple(in_perms[0])):
        found.append([tuple(onnx_perm), *in_perms[1:]])  # its output then in ONNX order
    return found


def refined(graph: Graph, forward: Callable, plan, onnx_order: dict):
    """The cheapest plan the search reaches from the forward pass's `plan`, or from the
    plan that decides every node from ONNX order (the assumptions `onnx_order`) when that
    one is cheaper. `forward(assumed, begin, base, redone)` is layout._forward bound to
    the graph."""
    if plan_cost(graph, plan).total == 0:
        return plan
    outputs = plan.output_perms  # the layouts users get: the search keeps them
    allowed = set(moving_transposes(graph, plan))

    def better(trial: _Requests, than: int) -> bool:
        return trial.cost < than and trial.plan.output_perms == outputs and all(
            len(perm) <= MAX_ADDED_RANK or (name, perm) in allowed for name, perm in trial.counts)

    best_assumed, best = {}, _Requests(graph, plan)
    baseline = _Requests(graph, forward(onnx_order))
    if better(baseline, best.cost):
        best_assumed, best = onnx_order, baseline
    for _ in range(MAX_SWEEPS):
        improved = False
        relevant = _relevant(graph, best.plan) if best.cost else set()
        for index, node in enumerate(graph.nodes):
            if index not in relevant:
                continue
            arriving = [best.plan.perms.get(n) if n else None for n in node.inputs]
            for option in alternatives(node, arriving):
                assumed, redone = {**best_assumed, index: option}, []
                trial = best.after(forward(assumed, index, best.plan, redone), redone)
                if better(trial, best.cost):
                    best_assumed, best, improved = assumed, trial, True
                    break
        if not improved:
            break
    return best.plan
