"""The shapes of Reshape and Slice outputs ONNX's inference leaves unknown, from the values
of the shape computations that feed them.

ONNX's data propagation follows Shape -> Slice -> Concat -> Reshape only from opset 17 on
for some of these ops: a Paddle2ONNX export at opset 12 that flattens a value of run-time width
by `Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1]))` leaves the Reshape's output, and every
value after it, without even a rank (PP-OCR's recognizer with a dynamic width); a TorchScript
export's channel split `x[:, x.size(1) // 2:]` of an image of run-time size leaves the
Slice's channels unknown (ShuffleNet V2), and the convolution after it cannot be written.
Here the small integer values such subgraphs compute are followed with their dims known,
symbolic (a dim_param, equal where the symbol is) or unknown, and each such Reshape and
Slice gets the dims they give where inference left them unknown.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2tf_alt.ir.index import GraphIndex, default_opset, dims_of

Dim = int | str | None  # a size, a symbol, or unknown
LIMIT = 16  # longest shape value followed


class _Value:
    """A 1-D (or scalar) integer value: its entries, each a Dim."""

    def __init__(self, items: list[Dim], scalar: bool = False):
        self.items, self.scalar = list(items), scalar


def fill_computed_shape_gaps(model: onnx.ModelProto) -> int:
    """Give each Reshape and Slice of a data value the dims its shape or slice parameters'
    values give where inference left them unknown (a Reshape's rank from its shape input's
    length at least); returns how many outputs changed, so inference can run again
    downstream of them."""
    graph = model.graph
    shaped = {v.name for v in [*graph.value_info, *graph.output]
              if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    if not any(n.op_type == "Shape" or (n.op_type == "Reshape" and n.output[0] not in shaped)
               for n in graph.node):
        return 0  # every shape value is a constant, which ONNX's inference reads
    index = GraphIndex(graph)
    opset = default_opset(model)
    values: dict[str, _Value | None] = {}
    filled = 0
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output or not node.output[0]:
            continue
        data = dims_of(index.info(node.input[0])) if node.input else None
        dims = None
        if node.op_type == "Reshape" and len(node.input) > 1 and data is not None:
            dims = _reshape_dims(node, data, index, values)
        elif node.op_type == "Slice" and data is not None:
            dims = _sliced(node, data, [_value(i, index, values) if i else None
                                        for i in node.input], opset)
        if len(node.output) == 1:
            values[node.output[0]] = _evaluate(node, index, values, opset)
        if dims is not None:
            filled += _merge(graph, index, node.output[0], node.input[0], dims)
    return filled


def _reshape_dims(node, data: list[Dim], index: GraphIndex, values: dict) -> list | None:
    target = _value(node.input[1], index, values)
    length = dims_of(index.info(node.input[1]))
    if target is None and length is not None and len(length) == 1 and isinstance(
            length[0], int):
        target = _Value([None] * length[0])  # the rank alone
    if target is None or target.scalar:
        return None
    allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
    return reshaped(data, target.items, allow_zero)


def _merge(graph, index: GraphIndex, name: str, like: str, dims: list[Dim]) -> int:
    """Write `dims` as value `name`'s shape where inference left it without one, or fill
    the dims it left unknown: None, or a symbol it made up (`unk__N`), where `dims` has a
    size or a symbol of the model's; 1 if it changed."""
    declared = index.info(name)
    known = dims_of(declared)
    if known is not None:
        if len(known) != len(dims):
            return 0
        merged = [n if _made_up(d) and (isinstance(n, int) or not _made_up(n)) else d
                  for d, n in zip(known, dims)]
        if merged == known:
            return 0
        dims = merged
    source = index.info(like)
    if source is None:
        return 0
    out = helper.make_tensor_value_info(name, source.type.tensor_type.elem_type, dims)
    if declared is not None:
        declared.CopyFrom(out)
    else:
        graph.value_info.append(out)
        index.infos[name] = graph.value_info[-1]
    return 1


def _made_up(dim: Dim) -> bool:
    """Unknown, or a symbol ONNX's inference made up for a dim it could not compute."""
    return dim is None or (isinstance(dim, str) and dim.startswith("unk__"))


def reshaped(data: list[Dim], target: list[Dim], allow_zero: bool = False) -> list[Dim]:
    """The dims of a Reshape of a value of dims `data` to the shape value `target`."""
    dims = [data[i] if d == 0 and not allow_zero and i < len(data) else d
            for i, d in enumerate(target)]
    if dims.count(-1) != 1:
        return [None if d == -1 else d for d in dims]
    rest = [d for d in dims if d != -1]
    if None in data or None in rest:
        return [None if d == -1 else d for d in dims]
    size, symbols = _factors(data)
    known, wanted = _factors(rest)
    if known == 0 or size % known or wanted - symbols:
        return [None if d == -1 else d for d in dims]
    left, count = symbols - wanted, size // known
    inferred = (count if not left else
                next(iter(left)) if count == 1 and sum(left.values()) == 1 else None)
    return [inferred if d == -1 else d for d in dims]


def _factors(dims: list[Dim]) -> tuple[int, Counter]:
    size = 1
    for d in dims:
        if isinstance(d, int):
            size *= d
    return size, Counter(d for d in dims if isinstance(d, str))


def _value(name: str, index: GraphIndex, values: dict) -> _Value | None:
    if name in values:
        return values[name]
    init = index.initializers.get(name)
    if (init is None or init.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
            or init.data_location == onnx.TensorProto.EXTERNAL):  # kept on disk: no shape
        return None
    return _array_value(numpy_helper.to_array(init))


def _array_value(array: np.ndarray) -> _Value | None:
    array = np.asarray(array)
    if array.dtype.kind not in "iu" or array.ndim > 1 or array.size > LIMIT:
        return None
    return _Value([int(v) for v in array.reshape(-1)], array.ndim == 0)


def known_part(node: onnx.NodeProto, index: GraphIndex, known: dict,
               opset: int) -> np.ndarray | None:
    """What a Gather or Slice `node` of a Shape takes of that value where it takes known dims
    alone (TorchScript's x.size(1) of an image of run-time height and width), its other
    inputs constants in `known` (arrays by name); else None."""
    source = index.producer_node(node.input[0])
    if source is None or source.op_type != "Shape":
        return None
    values = {source.output[0]: _evaluate(source, index, {}, opset)}
    for name in node.input[1:]:
        if name:
            if name not in known:
                return None
            values[name] = _array_value(known[name])
    found = _evaluate(node, index, values, opset)
    if found is None or not all(isinstance(d, int) for d in found.items):
        return None
    return np.array(found.items[0] if found.scalar else found.items, np.int64)


def _constant(node: onnx.NodeProto) -> _Value | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type in (onnx.TensorProto.INT64,
                                                        onnx.TensorProto.INT32):
            array = numpy_helper.to_array(attr.t)
            if array.ndim <= 1 and array.size <= LIMIT:
                return _Value([int(v) for v in array.reshape(-1)], array.ndim == 0)
        if attr.name in ("value_int", "value_ints"):
            ints = [attr.i] if attr.name == "value_int" else list(attr.ints)
            return _Value(ints, attr.name == "value_int")
    return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _evaluate(node: onnx.NodeProto, index: GraphIndex, values: dict,
              opset: int) -> _Value | None:
    """The value `node` computes where it is a shape computation this module follows."""
    op = node.op_type
    if op == "Constant":
        return _constant(node)
    if op == "Shape":
        dims = dims_of(index.info(node.input[0]))
        if dims is None:
            return None
        start, end = _attr(node, "start", 0), _attr(node, "end", len(dims))
        return _Value(dims[slice(start, end)])
    inputs = [_value(i, index, values) if i else None for i in node.input]
    if not inputs or inputs[0] is None:
        return None
    first = inputs[0]
    if op in ("Identity", "Cast") or (op == "Reshape" and not first.scalar and len(inputs) == 2
                                      and inputs[1] is not None and len(inputs[1].items) == 1):
        return _Value(first.items)
    if op == "Unsqueeze" and first.scalar:
        return _Value(first.items)
    if op == "Squeeze" and len(first.items) == 1:
        return _Value(first.items, scalar=True)
    if op == "Concat" and all(v is not None and not v.scalar for v in inputs):
        return _Value([d for v in inputs for d in v.items])
    if op == "Gather" and len(inputs) == 2 and inputs[1] is not None and _attr(node, "axis", 0) == 0:
        size = len(first.items)
        picked = [first.items[i] if isinstance(i, int) and -size <= i < size else None
                  for i in inputs[1].items]
        return _Value(picked, inputs[1].scalar)
    if op == "Slice":
        return _slice(node, first, inputs, opset)
    if op in ("Add", "Sub", "Mul", "Div") and len(inputs) == 2 and inputs[1] is not None:
        return _arithmetic(op, first, inputs[1])
    return None


def _slice_parameters(node, inputs: list, opset: int):
    """(starts, ends, axes, steps) of a Slice, or None where one is known only at run time."""
    if opset < 10:
        axes = _attr(node, "axes")
        return _attr(node, "starts"), _attr(node, "ends"), axes, None
    given = [inputs[i].items if i < len(inputs) and node.input[i] and inputs[i] is not None
             else None for i in range(1, 5)]
    if any(v is None for v, name in zip(given, [*node.input[1:5], "", "", ""]) if name):
        return None
    starts, ends, axes, steps = given
    return starts, ends, axes, steps


def _slice(node, first: _Value, inputs: list, opset: int) -> _Value | None:
    """A slice of a shape value."""
    params = _slice_parameters(node, inputs, opset)
    if params is None:
        return None
    starts, ends, axes, steps = params
    steps = steps or [1]
    if (len(starts) != 1 or (axes and list(axes) not in ([0], [-1]))
            or not all(isinstance(v, int) for v in (*starts, *ends, *steps))):
        return None
    return _Value(first.items[slice(starts[0], ends[0], steps[0])])


def _sliced(node, data: list[Dim], inputs: list, opset: int) -> list[Dim] | None:
    """The dims of a Slice of a value of dims `data`: a sliced dim of known size and known
    parameters has its length; one of unknown size keeps it where the whole of it is taken."""
    params = _slice_parameters(node, inputs, opset)
    if params is None:
        return None
    starts, ends, axes, steps = params
    axes = list(axes) if axes else list(range(len(starts)))
    steps = list(steps) if steps else [1] * len(starts)
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return None
    dims = list(data)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if not -len(data) <= (axis if isinstance(axis, int) else len(data)) < len(data):
            return None
        axis %= len(data)
        size = data[axis]
        if not all(isinstance(v, int) for v in (start, end, step)) or step == 0:
            dims[axis] = None
        elif isinstance(size, int):
            dims[axis] = len(range(*slice(start, end, step).indices(size)))
        else:
            whole = start == 0 and step == 1 and end >= 2**31 - 1
            dims[axis] = size if whole else None
    return dims


def _arithmetic(op: str, a: _Value, b: _Value) -> _Value | None:
    left, right = a.items, b.items
    if len(left) != len(right):
        if len(right) == 1:
            right = right * len(left)
        elif len(left) == 1:
            left = left * len(right)
        else:
            return None
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.floor_divide}[op]
    items = [int(fn(x, y)) if isinstance(x, int) and isinstance(y, int)
             and not (op == "Div" and y == 0) else
             x if op in ("Mul", "Div") and y == 1 else
             y if op == "Mul" and x == 1 else None
             for x, y in zip(left, right)]
    return _Value(items, a.scalar and b.scalar)
