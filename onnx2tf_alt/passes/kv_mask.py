"""The attention mask and the positions of a decoder whose cache gets a fixed capacity
(passes/kv_cache.py).

A fixed-capacity cache has empty slots, and a past input's length is always the capacity.
Two forms exporters write would then compute wrong tokens after the first; both are
rewritten here, or the conversion is refused:

- **No attention mask** (Optimum's Whisper, T5 and BART decoders mask by the past's length
  alone; T5's and BART's `encoder_attention_mask` spans the encoder's positions, not the
  keys, and is not taken for it): an `attention_mask` input [batch, past + sequence] is
  added, as transformers' decoders take it (1 at a filled slot and at the step's
  positions, 0 at an empty slot), and its bias (-1e9 at the empty slots) is added to each
  self-attention's scores before their Softmax.
  A self-attention's Softmax is the one a present key's Concat reaches through a single
  MatMul (the scores; from a value's Concat the next Softmax is two MatMuls away). A
  decoder where no cache reaches one (a fused attention op) is refused.
- **Positions from the past's length** (a Range started at a Shape of a past input, or of
  the mask less the step: GPT-2 exports without `position_ids`, Whisper's decoders): the
  position table's Gather or the rotary Cos / Sin that such a Range reaches reads it plus
  (filled slots - capacity), the filled slots counted in the mask's cache part. The keys'
  positions, a Range from 0 to the present key's length (T5's relative attention bias):
  the cache's slots keep theirs, the step's keys after the capacity take the filled
  slots'. A length that reaches the positions as a value only, no Range (M2M100's and
  NLLB's `(CumSum(ids != pad) + past) * (ids != pad) + pad`), is itself moved to the filled
  slots on that path. A comparison of key and query positions with an offset on one side
  (a sliding window: key > query - window) reads the moved positions too. Anything else
  that reads the Ranges or the length (a causal key <= query over capacity + sequence keys,
  the same on every filled slot) keeps them, and no shape changes, so the signatures stay
  static. Positions made from the length some other way (through a shape or an index) are
  refused.

A constant table sliced by bounds made from the keys' length reads the entries the past
growing reads: one entry per key (MPT's ALiBi: bias[..., max_len - keys:]; GPT-Neo's mask:
bias[..., :keys]) by a Gather, a filled slot's entry where the past growing would read it,
a step key's after the filled slots'; one per query (GPT-Neo's rows: bias[..., keys -
queries:keys, :]) from bounds moved to the filled slots.

What no rule here sees (an ALiBi bias counted from a Range of a mask's shape) is caught
after the rewrite by running it (passes/kv_check.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.errors import UnsupportedFormError
from onnx2tf_alt.ir.index import default_opset
from onnx2tf_alt.passes.graph_walk import (
    TABLE_CARRIERS,
    computed_from,
    concat_of,
    constant_dims,
    nodes_upstream,
    slice_constants,
    small_constant,
    source_of,
    traced,
)

MASK = "attention_mask"
_MASKED = -1e9  # a bias that keeps a slot out of the Softmax, and still adds to finfo.min


def fit_mask_and_positions(model: onnx.ModelProto, entries: list, capacity: int) -> None:
    """`model` (modified) with a mask input that covers the cache's empty slots, and with
    positions that do not depend on the past's length (see the module docstring).
    UnsupportedFormError where neither can be done."""
    graph = model.graph
    mask = own_mask(graph, entries)
    if mask is None:
        taken = {name for node in graph.node for name in node.output}
        mask = _add_mask(model, entries, MASK if MASK not in taken else f"onnx2tf_alt_{MASK}")
    _shift_positions(model, entries, capacity, mask)


def own_mask(graph: onnx.GraphProto, entries: list) -> str | None:
    """The decoder's own attention mask: an input named as a mask that spans its keys, not
    an encoder's (T5's and BART's decoders take `encoder_attention_mask` over the encoder's
    positions, and no mask of their own); None where there is none."""
    pasts = {e.past for e in entries}
    encoder = {d.dim_param for i in graph.input  # the encoder's states and cross caches
               if _encoders(i.name) or (i.name not in pasts and "past" in i.name.lower())
               for d in list(i.type.tensor_type.shape.dim)[1:] if d.dim_param}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if "mask" not in value.name.lower() or _encoders(value.name) or (
                dims and dims[-1].dim_param in encoder - {e.symbol for e in entries}):
            continue
        return value.name
    return None


def _encoders(name: str) -> bool:
    return "encoder" in name.lower() or "cross" in name.lower()


class _Nodes:
    """Nodes added to a graph, with the forms of this model's opset."""

    def __init__(self, model: onnx.ModelProto, prefix: str):
        self.graph, self.opset, self.prefix = model.graph, default_opset(model), prefix
        self.nodes = []

    def constant(self, name: str, value) -> str:
        name = f"{self.prefix}/{name}"
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def add(self, op: str, inputs: list[str], name: str, **attributes) -> str:
        out = f"{self.prefix}/{name}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attributes))
        return out

    def axes(self, op: str, data: str, axes: list[int], name: str, **attributes) -> str:
        """ReduceSum / Unsqueeze on `axes`: an input from opset 13, an attribute before."""
        if self.opset >= 13:
            return self.add(op, [data, self.constant(name + "_axes", np.array(axes, np.int64))],
                            name, **attributes)
        return self.add(op, [data], name, axes=axes, **attributes)

    def like(self, data: str, other: str, name: str, fallback: int) -> str:
        """`data` in `other`'s element type (CastLike from opset 15; `fallback` before)."""
        if self.opset >= 15:
            return self.add("CastLike", [data, other], name)
        return self.add("Cast", [data], name, to=fallback)

    def before(self, node: onnx.NodeProto | None) -> None:
        """The added nodes into the graph, before `node` (None: at the start)."""
        self._insert(0 if node is None else list(self.graph.node).index(node))

    def after(self, node: onnx.NodeProto) -> None:
        """The added nodes into the graph, right after `node`."""
        self._insert(list(self.graph.node).index(node) + 1)

    def _insert(self, at: int) -> None:
        for k, added in enumerate(self.nodes):
            self.graph.node.insert(at + k, added)
        self.nodes = []


def _add_mask(model: onnx.ModelProto, entries: list, mask: str) -> str:
    """An input `mask`, its bias added before each self-attention's Softmax; returns its
    name. UnsupportedFormError when no self-attention's Softmax is found."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    softmaxes: dict[str, onnx.NodeProto] = {}
    for entry in entries:
        concat = _present_concat(graph, producer, entry.present)
        if concat is not None:
            for node in _softmaxes_reached(graph, concat.output[0]):
                softmaxes.setdefault(node.output[0], node)
    if not softmaxes:
        raise UnsupportedFormError(
            "--kv_cache_capacity: this decoder takes no attention mask (inputs: "
            f"{[i.name for i in graph.input]}), and no Softmax over its keys was found to "
            "add one to (a fused attention op reads no added mask): with a cache of fixed "
            "capacity its empty slots would be attended to, and every token after the first "
            "would be wrong. Export the decoder with an attention_mask input over past and "
            "new positions, or convert without --kv_cache_capacity (caches: "
            f"{', '.join(e.past for e in entries[:2])}, ...).")
    past = next(i for i in graph.input if i.name == entries[0].past)
    dims = past.type.tensor_type.shape.dim
    present = next((o for o in graph.output if o.name == entries[0].present), None)
    span = _dim(present, entries[0].axis) if present is not None else ""
    if not span or entries[0].symbol not in span:
        ids = next((i for i in graph.input if i.name == "input_ids"), None)
        span = f"{entries[0].symbol} + {_dim(ids, 1) or 'sequence'}"
    batch = dims[0].dim_value or dims[0].dim_param or "batch"
    graph.input.append(helper.make_tensor_value_info(mask, TensorProto.INT64, [batch, span]))
    added = _Nodes(model, f"{mask}/onnx2tf_alt_bias")
    filled = added.add("Cast", [mask], "filled", to=TensorProto.FLOAT)
    empty = added.add("Sub", [added.constant("one", np.array(1, np.float32)), filled], "empty")
    bias = added.add("Mul", [empty, added.constant("masked", np.array(_MASKED, np.float32))],
                     "bias")
    # [batch, keys] -> [batch, 1, ..., keys]: broadcast over the heads and queries
    bias = added.axes("Unsqueeze", bias, list(range(1, len(dims) - 1)), "bias_nd")
    added.before(None)
    for softmax in softmaxes.values():
        scores = softmax.input[0]
        typed = added.like(bias, scores, f"{scores}/bias", TensorProto.FLOAT)
        masked = added.add("Add", [scores, typed], f"{scores}/masked")
        added.before(softmax)
        softmax.input[0] = masked
    return mask


def _present_concat(graph: onnx.GraphProto, producer: dict, present: str
                    ) -> onnx.NodeProto | None:
    return concat_of(producer, present, {i.name: i.type.tensor_type.elem_type
                                         for i in graph.input})


def _softmaxes_reached(graph: onnx.GraphProto, start: str) -> list[onnx.NodeProto]:
    """The Softmax nodes that `start` reaches through exactly one MatMul (or Einsum), not
    through a Shape (its values are not the keys')."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found, seen, todo = [], set(), [(start, 0)]
    while todo:
        name, matmuls = todo.pop()
        for node in consumers.get(name, []):
            if node.op_type == "Softmax":
                if matmuls == 1 and node not in found:
                    found.append(node)
                continue
            crossed = matmuls + (node.op_type in ("MatMul", "Einsum"))
            key = (node.output[0], crossed)
            if node.op_type == "Shape" or crossed > 1 or key in seen:
                continue
            seen.add(key)
            todo.extend((out, crossed) for out in node.output)
    return found


def _dim(value: onnx.ValueInfoProto | None, axis: int) -> str:
    dims = value.type.tensor_type.shape.dim if value is not None else []
    return dims[axis].dim_param if axis < len(dims) else ""


def _shift_positions(model: onnx.ModelProto, entries: list, capacity: int, mask: str) -> None:
    """The position reads that the past's length reaches (a table's Gather, a rotary Cos /
    Sin, a comparison of key and query positions), made from positions moved to the filled
    slots (see the module docstring). UnsupportedFormError when a table read is computed
    from the length some other way."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    symbols = {e.symbol for e in entries if e.symbol}
    spans = {e.past for e in entries} | {
        i.name for i in graph.input
        if any(d.dim_param and d.dim_param != s and s in d.dim_param
               for d in i.type.tensor_type.shape.dim for s in symbols)}
    # a present key's Concat: the keys (past and new) that a key position indexes, with
    # its past's (rank, axis)
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in graph.input}
    keys = {}
    for entry in entries:
        concat = _present_concat(graph, producer, entry.present)
        if concat is not None:
            keys[concat.output[0]] = (ranks.get(entry.past, 0), entry.axis)
    lengths = {n.output[0] for n in graph.node if n.op_type == "Shape" and source_of(
        producer, traced(producer, n.input[0], ("Identity", "Cast"))) in spans | set(keys)}
    if not lengths:
        return
    constants = constant_dims(graph)
    tables = {name for name, dims in constants.items() if len(dims) == 2}

    def moved(read: str) -> tuple[list, list[str]] | None:
        """(the Ranges, the length values) `read` is computed from; None where some length
        reaches it otherwise (a size, another axis) or it reads no Range nor value."""
        ranges = [n for n in nodes_upstream(producer, read) if n.op_type == "Range"
                  and any(computed_from(producer, i, lengths) for i in n.input[:2])]
        # the length as a value besides the Ranges (transformers 5's T5: Range(0, sequence)
        # + the past's length) or instead of them (M2M100's CumSum)
        scalars = _length_scalars(graph, producer, read, lengths, entries,
                                  {n.output[0] for n in ranges}, keys)
        return None if scalars is None or not (ranges or scalars) else (ranges, scalars)

    reads = []  # (node, input index, its Ranges and length values)
    for node in graph.node:
        if node.op_type in _COMPARISONS:  # key against query positions (a sliding window)
            found = [moved(i) if computed_from(producer, i, lengths) else None
                     for i in node.input[:2]]
            # both sides positions, one of them offset (k > q - window): else the comparison
            # keeps its values (a causal k <= q gives the same on every filled slot, and
            # stays a constant the conversion folds)
            if all(found) and any(_offset(producer, i, lengths) for i in node.input[:2]):
                reads += [(node, k, f) for k, f in enumerate(found)]
            continue
        if node.op_type == "Slice":  # a table's entries, one per key or query (ALiBi, masks)
            table = _table_slice(graph, producer, node, lengths, constants)
            # its bounds values made from the keys' length (no Range on the way: the Shape
            # the length is read from ends the walk, not the keys' own computation)
            found = [] if table is None else [
                _length_scalars(graph, producer, node.input[k], lengths, entries, set(), keys)
                for k in (1, 2) if computed_from(producer, node.input[k], lengths)]
            if found and all(found):
                reads.append((node, table, ([], [s for f in found for s in f])))
            continue
        if node.op_type in ("Cos", "Sin"):
            index = 0
        elif node.op_type == "Gather" and traced(producer, node.input[0],
                                                  TABLE_CARRIERS) in tables:
            index = 1
        else:
            continue
        if computed_from(producer, node.input[index], lengths) is None:
            continue
        found = moved(node.input[index])
        if found is None:
            length = producer[computed_from(producer, node.input[index], lengths)]
            raise UnsupportedFormError(
                f"--kv_cache_capacity: this decoder computes its positions from the length of "
                f"its past: {node.op_type} '{node.name or node.output[0]}' reads a value made "
                f"from {length.op_type}('{length.input[0]}'), not through a Range that could be "
                "started at the cache's filled slots nor as a value added to (a shape or an "
                "index made from it). With a fixed-capacity cache that length "
                "is always the capacity, and every position would be wrong. Export the decoder "
                "with a position_ids input (transformers: pass position_ids to the model; "
                "Optimum's exports have it), or convert without --kv_cache_capacity.")
        reads.append((node, index, found))
    if not reads:
        return
    value = next(i for i in graph.input if i.name == mask).type.tensor_type
    if len(value.shape.dim) != 2 or value.elem_type == TensorProto.FLOAT:
        raise UnsupportedFormError(
            f"--kv_cache_capacity: this decoder computes its positions from the length of its "
            f"past ({reads[0][0].op_type} '{reads[0][0].name or reads[0][0].output[0]}'), and "
            f"the filled slots that would replace it are counted in a [batch, past + "
            f"sequence] mask of ones and zeros; its mask '{mask}' is "
            f"{len(value.shape.dim)}-D {TensorProto.DataType.Name(value.elem_type).lower()}. "
            "Export the decoder with a position_ids input, or with a 2-D integer "
            "attention_mask, or convert without --kv_cache_capacity.")
    added = _Nodes(model, f"{mask}/onnx2tf_alt_positions")
    cache_part = added.add("Slice", [mask, added.constant("starts", np.array([0, 0], np.int64)),
                                     added.constant("ends", np.array([1, capacity], np.int64)),
                                     added.constant("axes", np.array([0, 1], np.int64))],
                           "cache_part")
    filled = added.add("Cast", [cache_part], "filled", to=TensorProto.INT64)
    count = added.axes("ReduceSum", filled, [0, 1], "count", keepdims=0)  # a scalar
    shift = added.add("Sub", [count, added.constant("capacity", np.array(capacity, np.int64))],
                      "shift")
    added.before(None)
    shifted: dict[str, str] = {}  # a tensor -> its copy made from the moved positions
    for node, index, (ranges, scalars) in reads:
        for at in ranges:
            if at.output[0] in shifted:
                continue
            # the Range's values plus the shift: the Range itself stays as it is (constant
            # once the capacity fixes its start), so the positions keep its static length
            out = at.output[0]
            step = added.like(shift, at.input[0], f"{out}/shift", TensorProto.INT64)
            moved_range = added.add("Add", [out, step], f"{out}/shifted")
            if not computed_from(producer, at.input[0], lengths):
                # counted from 0 to the keys' length: the keys' positions (T5's relative
                # bias, a sliding window's mask). The cache's slots keep theirs; the step's,
                # after the capacity, move to the filled slots
                first = added.like(f"{added.prefix}/capacity", at.input[0],
                                   f"{out}/capacity", TensorProto.INT64)
                slots = added.add("Less", [out, first], f"{out}/in_cache")
                moved_range = added.add("Where", [slots, out, moved_range], f"{out}/keys")
            shifted[out] = moved_range
            added.after(at)
        for scalar in scalars:
            if scalar not in shifted:
                step = added.like(shift, scalar, f"{scalar}/shift", TensorProto.INT64)
                shifted[scalar] = added.add("Add", [scalar, step], f"{scalar}/filled")
                added.after(producer[scalar])
        if node.op_type == "Slice":  # index: (axis, kind, size) of a table (_table_slice)
            _moved_slice(added, graph, producer, node, index, shifted, shift, capacity)
        else:
            node.input[index] = _copy_path(graph, producer, node.input[index], shifted)


def _table_slice(graph: onnx.GraphProto, producer: dict, node: onnx.NodeProto,
                 lengths: set[str], constants: dict) -> tuple[int, str, int] | None:
    """(axis, kind, the table's size there) of Slice `node` when it takes a constant table's
    entries along one axis between bounds made from the keys' length, else None. Kind "keys":
    one entry per key, the table's last `keys` (MPT's ALiBi: bias[..., max_len - keys:]) or
    its first (GPT-Neo's mask: bias[..., :keys]), along its last axis; "queries": one entry
    per query, both bounds made from the keys' length (GPT-Neo's mask: bias[..., keys -
    queries:keys, :]), along the axis before."""
    if len(node.input) < 4:
        return None
    made = [computed_from(producer, node.input[k], lengths) is not None for k in (1, 2)]
    _, _, axes, steps = slice_constants(graph, node)
    table = traced(producer, node.input[0], ("Identity", "Slice"))
    dims = constants.get(table)
    if not any(made) or not dims or axes is None or len(axes) != 1 or steps != [1]:
        return None
    axis = int(axes[0]) % len(dims)
    earlier = node.input[0]  # earlier slices of the table: along other axes only
    while earlier != table:
        before = producer[earlier]
        if before.op_type == "Slice":
            other = slice_constants(graph, before)[2]
            if other is None or axis in {int(a) % len(dims) for a in other}:
                return None
        earlier = before.input[0]
    if all(made):
        kind = "queries" if axis == len(dims) - 2 else None
    elif made[0]:  # from a start made from the keys' length to the table's end
        ends = small_constant(graph, node.input[2])
        kind = "keys" if ends is not None and int(ends[0]) >= dims[axis] else None
    else:  # from a constant start to an end made from the keys' length
        kind = "keys" if small_constant(graph, node.input[1]) is not None else None
    if kind == "keys" and axis != len(dims) - 1:
        kind = None
    return None if kind is None else (axis, kind, dims[axis])


def _moved_slice(added: _Nodes, graph: onnx.GraphProto, producer: dict, node: onnx.NodeProto,
                 table: tuple[int, str, int], shifted: dict, shift: str, capacity: int) -> None:
    """Slice `node` of a table (see _table_slice) reading the entries the past growing reads.
    Queries: its bounds made from the keys' length moved to the filled slots (the same
    count of entries). Keys: a Gather of the table at each key's entry, counted from the
    start the past growing would take: a filled slot's at its index, a step key's after
    the filled slots, an empty slot's (masked) at an index kept in the table."""
    axis, kind, size = table
    if kind == "queries":
        for k in (1, 2):
            node.input[k] = _copy_path(graph, producer, node.input[k], shifted)
        return
    out, scalar_shape = node.output[0], added.constant(f"{node.output[0]}/scalar",
                                                       np.zeros(0, np.int64))

    def scalar(name: str, what: str) -> str:
        return added.add("Reshape", [added.like(name, shift, f"{out}/{what}_i64",
                                                TensorProto.INT64), scalar_shape],
                         f"{out}/{what}")

    def constant(what: str, value: int) -> str:
        return added.constant(f"{out}/{what}", np.array(value, np.int64))

    start = scalar(node.input[1], "start")
    first = scalar(_copy_path(graph, producer, node.input[1], shifted), "true_start")
    end = added.add("Min", [scalar(node.input[2], "end"), constant("size", size)],
                    f"{out}/end_in_table")
    count = added.add("Sub", [end, start], f"{out}/count")
    slot = added.add("Range", [constant("zero", 0), count, constant("one", 1)], f"{out}/slot")
    in_cache = added.add("Less", [slot, constant("capacity", capacity)], f"{out}/in_cache")
    moved = added.add("Where", [in_cache, slot, added.add("Add", [slot, shift],
                                                            f"{out}/after_filled")],
                      f"{out}/position")
    entry = added.add("Add", [first, moved], f"{out}/entry")
    entry = added.add("Max", [entry, constant("lowest", 0)], f"{out}/entry_low")
    entry = added.add("Min", [entry, constant("highest", size - 1)], f"{out}/entry_in_table")
    added.nodes.append(helper.make_node("Gather", [node.input[0], entry], [out], axis=axis,
                                        name=f"{node.name or out}/onnx2tf_alt_keys"))
    added.before(node)
    graph.node.remove(node)


_COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")
_ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Neg")


def _offset(producer: dict, name: str, lengths: set[str]) -> bool:
    """Whether positions `name` are offset on their way from their Ranges and the past's
    length (an arithmetic op with an operand made from neither: a window)."""
    lengths = lengths | {o for node in producer.values() if node.op_type == "Range"
                         for o in node.output}
    todo, seen = [name], set()
    while todo:
        name = todo.pop()
        node = producer.get(name)
        if name in seen or node is None or node.op_type == "Range":
            continue
        seen.add(name)
        inputs = [i for i in node.input if i]
        if node.op_type in _ARITHMETIC and not all(computed_from(producer, i, lengths)
                                                    for i in inputs):
            return True
        todo += [i for i in inputs if computed_from(producer, i, lengths)]
    return False


# the inputs that give a size, a shape, an axis or a position in a tensor: a length that
# reaches one of them is not a value the shift can be added to (the shapes would change)
_SIZE_INPUTS = {"Range": {0, 1, 2}, "Reshape": {1}, "Expand": {1}, "ConstantOfShape": {0},
                "Tile": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 2, 3}, "Resize": {1, 2, 3},
                "Unsqueeze": {1}, "Squeeze": {1}, "Split": {1}, "CumSum": {1}, "TopK": {1},
                "OneHot": {1}, "ReduceSum": {1}, "ReduceMean": {1}, "ReduceMax": {1},
                "ReduceMin": {1}, "ReduceProd": {1}, "Upsample": {1}}
_SUBGRAPHS = {"If", "Loop", "Scan"}


def _length_scalars(graph: onnx.GraphProto, producer: dict, read: str, lengths: set[str],
                    entries: list, ranges: set[str], keys: dict) -> list[str] | None:
    """The past's lengths that `read` is computed from as values, besides the outputs of
    `ranges` (M2M100's and NLLB's positions: (CumSum(ids != pad) + past length) * (ids !=
    pad) + pad): each a Gather of a length Shape at the cache's axis, reaching `read`
    as values (no _SIZE_INPUTS on the way; a Shape of what it computes reads no value), or
    a Gather of a present key's Concat's Shape (`keys`: {concat: (rank, axis)}) at its
    past's axis. None when it is computed from a length some other way (a shape it gives,
    another axis)."""
    axes = {e.past: e.axis for e in entries}
    # stop at the Ranges, and at a Shape of what the length computes (no value of it read)
    beside = {n: node for n, node in producer.items() if n not in ranges and (
        n in lengths or node.op_type not in ("Shape", "Size"))}

    def from_length(name: str) -> bool:
        return computed_from(beside, name, lengths) is not None

    found, todo, seen = [], [read], set()
    while todo:
        name = todo.pop()
        node = beside.get(name)
        if name in seen or node is None or not from_length(name):
            continue
        seen.add(name)
        if name in lengths or node.op_type in ("Gather", "Slice") and node.input[0] in lengths:
            # Shape(x, start=a, end=a + 1) (torch.export's), Gather(Shape(x), a) or
            # Slice(Shape(x), a, a + 1): a at the cache's axis (a mask: its last); any other
            # read of a length is refused
            shape = producer[name if name in lengths else node.input[0]]
            source = source_of(producer, traced(producer, shape.input[0], ("Identity", "Cast")))
            rank = next((len(i.type.tensor_type.shape.dim) for i in graph.input
                         if i.name == source), 0)
            rank, axis = keys.get(source, (rank, axes.get(source, rank - 1)))
            if name in lengths or node.op_type == "Slice":
                bounds = {a.name: a.i for a in shape.attribute}
                if node.op_type == "Slice":  # its own bounds, within the whole shape's
                    starts, ends, axes, steps = slice_constants(graph, node)
                    if bounds or None in (starts, ends) or axes != [0] or steps != [1]:
                        return None
                    bounds = {"start": int(starts[0]), "end": int(ends[0])}
                start, end = (b + rank if b < 0 else b for b in (bounds.get("start", 0),
                                                                 bounds.get("end", rank)))
                at, one = start, min(end, rank) - start == 1
            else:
                value = small_constant(graph, node.input[1])
                one = value is not None and len(value) == 1
                at = int(value[0]) % rank if one and rank else None
            if not (rank and one and at == axis):
                return None
            found.append(name)
            continue
        sizes = _SIZE_INPUTS.get(node.op_type, set())
        for k, name_in in enumerate(node.input):
            if name_in and from_length(name_in):
                if k in sizes or node.op_type in _SUBGRAPHS:
                    return None
                todo.append(name_in)
    return found


def _copy_path(graph: onnx.GraphProto, producer: dict, name: str, shifted: dict) -> str:
    """`name` computed again from the tensors in `shifted` (a copy of each node between
    them and it, added after the original); returns the copy's name, or `name` when it
    reads none of them."""
    if name in shifted:
        return shifted[name]
    node = producer.get(name)
    if node is None or node.op_type in ("Shape", "Size"):  # no value read, none to move
        return name
    inputs = [_copy_path(graph, producer, i, shifted) if i else i for i in node.input]
    if inputs == list(node.input):
        return name
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = f"{node.name or node.output[0]}/onnx2tf_alt_shifted"
    copy.input[:] = inputs
    copy.output[:] = [f"{o}/onnx2tf_alt_shifted" for o in node.output]
    graph.node.insert(list(graph.node).index(node) + 1, copy)
    for original, copied in zip(node.output, copy.output):
        shifted[original] = copied
    return shifted[name]
