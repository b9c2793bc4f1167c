"""The shapes of Reshape outputs ONNX's inference leaves unknown, from the values of the shape
computations that feed them.

ONNX's data propagation follows Shape -> Slice -> Concat -> Reshape only from opset 17 on
for some of these ops: a Paddle2ONNX export at opset 12 that flattens a value of run-time width
by `Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1]))` leaves the Reshape's output, and every
value after it, without even a rank (PP-OCR's recognizer with a dynamic width). Here the
small integer values such subgraphs compute are followed with their dims known, symbolic
(a dim_param, equal where the symbol is) or unknown, and each such Reshape gets its output's
shape.
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


def fill_reshape_gaps(model: onnx.ModelProto) -> int:
    """Give each Reshape whose output has no shape the one its shape input's value gives
    (as far as it is known: unknown dims stay unknown), or the rank its length gives;
    returns how many were filled, so inference can run again downstream of them."""
    graph = model.graph
    index = GraphIndex(graph)
    opset = default_opset(model)
    values: dict[str, _Value | None] = {}
    filled = 0
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type != "Reshape":
            if len(node.output) == 1 and node.output[0]:
                values[node.output[0]] = _evaluate(node, index, values, opset)
            continue
        if len(node.input) < 2 or dims_of(index.info(node.output[0])) is not None:
            continue
        data = dims_of(index.info(node.input[0]))
        target = _value(node.input[1], index, values)
        length = dims_of(index.info(node.input[1]))
        if target is None and length is not None and len(length) == 1 and isinstance(
                length[0], int):
            target = _Value([None] * length[0])  # the rank alone
        info = index.info(node.input[0])
        if target is None or data is None or info is None or target.scalar:
            continue
        allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
        dims = reshaped(data, target.items, allow_zero)
        out = helper.make_tensor_value_info(node.output[0], info.type.tensor_type.elem_type,
                                            dims)
        declared = index.info(node.output[0])
        if declared is not None:
            declared.CopyFrom(out)
        else:
            graph.value_info.append(out)
            index.infos[node.output[0]] = graph.value_info[-1]
        filled += 1
    return filled


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
    if init is None or init.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return None
    array = numpy_helper.to_array(init)
    if array.ndim > 1 or array.size > LIMIT:
        return None
    return _Value([int(v) for v in array.reshape(-1)], array.ndim == 0)


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
    if op in ("Identity", "Cast"):
        return first
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


def _slice(node, first: _Value, inputs: list, opset: int) -> _Value | None:
    if opset < 10:
        starts, ends, axes = _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes", [0])
        steps = [1]
    else:
        if any(v is None for name, v in zip(node.input[1:], inputs[1:]) if name):
            return None  # a parameter known only at run time
        given = [inputs[i].items if i < len(inputs) and node.input[i] else None
                 for i in range(1, 5)]
        starts, ends, axes, steps = given[0], given[1], given[2] or [0], given[3] or [1]
        if starts is None or ends is None:
            return None
    if list(axes) not in ([0], [-1]) or any(not isinstance(v, int)
                                           for v in [*starts, *ends, *steps]):
        return None
    return _Value(first.items[slice(starts[0], ends[0], steps[0])])


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
