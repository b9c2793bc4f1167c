"""What TF's converter does to a graph like the direct writer's, done on its FlatGraph after
the last node: ops whose results nothing reads dropped, logical ops with a neutral constant
dropped, an op computing what another computes merged into it, a DIV by a constant written
as a MUL by its reciprocal and two MULs by constants as one, per-channel MUL / ADD folded
into the filter and bias of the CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED before them
(or of the FULLY_CONNECTED ops after them; an ADD into a 1x1 CONV_2D after it, a MUL into
the filter of the convolutions after it), RELU / RELU6 / RELU_N1_TO_1 fused into the op
before, a RESHAPE of a RESHAPE merged, one to its input's own shape, flattening into a
FULLY_CONNECTED or adding leading unit axes before broadcasting ops dropped, 1 / SQRT(x)
written as RSQRT(x), a TRANSPOSE of the last two axes before a BATCH_MATMUL folded into its
adjoint flag."""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import schema
from onnx2tf_alt.tflite.flatgraph import FlatGraph, Operator, options

FLOAT32 = schema.TensorType.FLOAT32
FUSABLE = {"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "ADD", "SUB", "MUL",
           "DIV"}
ACTIVATIONS = {"RELU": schema.ActivationFunctionType.RELU,
               "RELU6": schema.ActivationFunctionType.RELU6,
               "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1}


def rewrite(flat: FlatGraph, outputs: list[int], for_quantization: bool = False) -> None:
    """All of the module's rewrites, in order; `outputs` (the graph's) are kept.

    `for_quantization` (the graph the own quantizer starts from): of the folds TF's converter
    makes for speed, those that keep every quantization grid as fine: a DIV by a constant
    as a MUL, a shift into a 1x1 CONV_2D's int32 bias, a scale into a filter where it
    multiplies whole output channels (one value, or a DEPTHWISE_CONV_2D's channels: a
    per-channel scale along a CONV_2D's input channels would mix their grids). Two MULs by
    constants stay two: on the PP-OCRv4 recognizer, judged on held-out samples of other
    scenes and fonts with two calibration subsets, the INT8 file made with the merge held
    0.9813 / 0.9816 pooled cosine, without it 0.9927 / 0.9912 (none of the folds: 0.9859 /
    0.9859; docs/direct_writer.md)."""
    drop_unread(flat, outputs)
    drop_logical_identities(flat, outputs)
    merge_duplicates(flat, outputs)
    # a graph that rounds to a grid (a QDQ model's QuantizeLinear pairs) keeps onnxruntime's
    # order of float operations: a product reassociated or folded into a filter moves
    # values by an ulp, and a value at a rounding boundary by 1 LSB
    speed_folds = not any(op.name == "ROUND" for op in flat.operators)
    if speed_folds:
        constant_divisions(flat, outputs)
        if not for_quantization:
            hard_swishes(flat, outputs)
            merge_constant_products(flat, outputs)
    fold_affine(flat, outputs)
    if speed_folds:
        shifts_into_pointwise(flat, outputs)
        scales_into_convolutions(flat, outputs, for_quantization)
    while fold_into_dense(flat, outputs):
        pass
    maxima_as_relu(flat, outputs)
    fuse_activations(flat, outputs)
    reshapes_before_dense(flat, outputs)
    merge_reshapes(flat, outputs)
    flatten_into_dense(flat, outputs)
    kept_dims_into_dense(flat, outputs)
    broadcast_leading_units(flat, outputs)
    reciprocal_roots(flat, outputs)
    transposed_operands(flat, outputs)
    pads_into_same_windows(flat, outputs)
    unshared_moves(flat, outputs)


SMALL_CONSTANT = 1 << 16  # bytes up to which constant inputs are compared by value (an
# unrolled LSTM's shape constants of 2 KB are written once per layer)


def merge_duplicates(flat: FlatGraph, outputs: list[int]) -> None:
    """An op that computes what an earlier one computes (same builtin, options, inputs and
    output types, as a CAST says its target by its output alone; small constants compared by
    value: the shape of a RESHAPE each node writes itself) is dropped, its readers reading
    the earlier one's results, as TF's converter merges them (Swin's patch merging reshapes
    one value for four slices). Where only the later one writes a graph output, the earlier
    one writes it instead (a decoder's present key, also read by the cache's CONCATENATION)."""
    seen: dict[tuple, Operator] = {}
    same: dict[int, int] = {}
    renamed: dict[int, int] = {}  # an earlier op's result -> the graph output it now writes
    kept = []
    for op in flat.operators:
        op.inputs = [same.get(i, i) for i in op.inputs]
        key = (op.name, tuple(_input_key(flat, i) for i in op.inputs), _options_key(op.options),
               tuple((flat.shape(o), flat.tensors[o].type) for o in op.outputs))
        first = seen.get(key)
        if first is not None and not set(first.outputs) & set(outputs):
            if set(op.outputs) & set(outputs):  # the earlier op writes the graph output
                renamed.update(zip(first.outputs, op.outputs))
                first.outputs = list(op.outputs)
            else:
                same.update(zip(op.outputs, first.outputs))
            continue
        seen.setdefault(key, op)
        kept.append(op)
    for op in kept:
        op.inputs = [renamed.get(i, i) for i in op.inputs]
    flat.operators = kept


def _input_key(flat: FlatGraph, index: int):
    if index < 0:
        return index
    tensor, array = flat.tensors[index], flat.constant(index)
    if array is None or array.nbytes > SMALL_CONSTANT:
        return index
    return tensor.type, tuple(tensor.shape), array.tobytes()


def _options_key(opts):
    if opts is None:
        return None
    kind, table = opts
    return kind, tuple(sorted((k, _hashable(v)) for k, v in vars(table).items()))


def _hashable(value):
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):  # an IF's or WHILE's subgraphs: the same only if they are
        return tuple(sorted((k, id(v)) for k, v in value.items()))
    return value


# an operand that leaves the other as it is (ADD of zeros: a recurrence's absent biases)
IDENTITY_OPERAND = {"LOGICAL_AND": True, "LOGICAL_OR": False, "ADD": 0, "MUL": 1}


def drop_logical_identities(flat: FlatGraph, outputs: list[int]) -> None:
    """LOGICAL_AND with a constant all true, LOGICAL_OR with one all false, ADD of zeros and
    MUL by ones that do not broadcast the other operand: its readers read that operand (TF's
    converter folds them; a decoder's causal mask at one new position is all true). Where
    the result is a model output (a last LayerNorm's shift of zeros, an RMSNorm's scale of
    ones, as random-weight models have them), the op making the operand writes the output
    instead, if nothing else reads the operand."""
    same: dict[int, int] = {}
    kept, at_outputs = [], []
    for op in flat.operators:
        op.inputs = [same.get(i, i) for i in op.inputs]
        other = _neutral_operand(flat, op)
        if other is not None and op.outputs[0] not in outputs:
            same[op.outputs[0]] = other
            continue
        if other is not None:
            at_outputs.append((op, other))
        kept.append(op)
    flat.operators = kept
    if not at_outputs:
        return
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op, other in at_outputs:
        source = producers.get(other)
        if (source is None or other in outputs or len(source.outputs) != 1
                or len(readers.get(other, [])) != 1):
            continue
        _absorb(flat, source, op)
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _neutral_operand(flat: FlatGraph, op: Operator) -> int | None:
    """The operand `op` passes on unchanged (the other one a constant of its identity
    element that does not broadcast it), or None."""
    neutral = IDENTITY_OPERAND.get(op.name)
    fused = op.options is not None and getattr(op.options[1], "fusedActivationFunction", 0)
    if neutral is None or fused:
        return None
    for k, index in enumerate(op.inputs):
        values, other = flat.constant(index), op.inputs[1 - k]
        if (values is not None and np.all(values == neutral)
                and same_shape(flat, other, op.outputs[0])
                and flat.tensors[other].type == flat.tensors[op.outputs[0]].type):
            return other
    return None


def same_shape(flat: FlatGraph, a: int, b: int) -> bool:
    """Tensor b, computed from a by ops whose other operands are constants, has a's shape:
    equal dims (a constant that broadcasts an unknown dim makes it known, so equal unknown
    dims are a's own)."""
    return flat.shape(a) == flat.shape(b)


def one_shape(flat: FlatGraph, a: int, b: int) -> bool:
    """Any tensors a and b have one shape: equal dims, at most one unknown (then the
    element counts fix it); two values of several run-time dims may differ."""
    shape = flat.shape(a)
    return shape == flat.shape(b) and sum(d is None for d in shape) <= 1


def _consumers(flat: FlatGraph) -> dict[int, list[Operator]]:
    readers: dict[int, list[Operator]] = {}
    for op in flat.operators:
        for i in op.inputs:
            readers.setdefault(i, []).append(op)
    return readers


def drop_unread(flat: FlatGraph, outputs: list[int]) -> None:
    """Drops the operators none of whose results is read (an output of a node that the
    graph does not use: an LSTM's final states), last first."""
    read = set(outputs)
    kept = []
    for op in reversed(flat.operators):
        if read.intersection(op.outputs):
            kept.append(op)
            read.update(op.inputs)
    flat.operators = kept[::-1]


# output channels' axis of the filter (input 1), and the bias's input
_FILTER_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 0}
_BIAS_INPUT = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 2, "TRANSPOSE_CONV": 3}


def _constant(flat: FlatGraph, index: int) -> np.ndarray | None:
    """A float32 constant tensor's values (its buffer's array), or None."""
    if flat.tensors[index].type != schema.TensorType.FLOAT32:
        return None
    return flat.constant(index)


def fold_affine(flat: FlatGraph, outputs: list[int]) -> None:
    """A MUL or ADD by a constant of one value or one per output channel, whose other input
    is the one use of a CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV or FULLY_CONNECTED output
    (no fused activation, with a constant filter and bias), goes into that op's filter and
    bias (as TF's converter folds them): the MUL scales both, the ADD shifts the bias; an
    activation fused into the MUL or ADD moves to the op (a transposed convolution's bias,
    batch norm and ReLU: one op, as TF's converter writes it). A RESHAPE that keeps the
    channel axis last may stand between them (LeViT's Linear -> Flatten -> BatchNorm1d):
    it then takes the MUL's or ADD's output."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name not in ("MUL", "ADD"):
            continue
        for k in (0, 1):
            source = producers.get(op.inputs[k])
            factor = _constant(flat, op.inputs[1 - k])
            if source is None or op.inputs[k] in outputs or len(readers.get(op.inputs[k],
                                                                           [])) != 1:
                continue
            mid = _channel_keeping_reshape(flat, source, op, k, outputs, readers, producers)
            if mid is not None:
                source = producers[mid.inputs[0]]
            if source.name not in _FILTER_AXIS or source.options[1].fusedActivationFunction:
                continue
            channels = flat.shape(source.outputs[0])[-1]
            filt = _constant(flat, source.inputs[1])
            if not op.options[1].fusedActivationFunction and _run_time_bias(
                    flat, op, k, source, channels):
                _absorb(flat, source, op)
                producers[op.outputs[0]] = source
                gone.append(op)
                break
            if ((filt is None and op.name == "MUL") or factor is None
                    or factor.size not in (1, channels)
                    or any(d != 1 for d in factor.shape[:-1])):
                continue
            at = _BIAS_INPUT[source.name]
            if len(source.inputs) <= at or source.inputs[at] < 0:  # no bias: a zero one
                name = flat.tensors[source.outputs[0]].name.decode()
                source.inputs[at:] = [flat.tensor(f"{name}/bias", (channels,), np.float32,
                                                  np.zeros(channels, np.float32))]
            bias = _constant(flat, source.inputs[at])
            if bias is None:
                continue
            values = factor.reshape(-1)
            if op.name == "MUL":
                shape = [1] * filt.ndim
                shape[_FILTER_AXIS[source.name]] = values.size
                flat.set_constant(source.inputs[1], filt * values.reshape(shape))
                flat.set_constant(source.inputs[at], bias * values)
            else:
                flat.set_constant(source.inputs[at], bias + values)
            source.options[1].fusedActivationFunction = op.options[1].fusedActivationFunction
            _absorb(flat, source if mid is None else mid, op)
            producers[op.outputs[0]] = source if mid is None else mid
            gone.append(op)
            break
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _channel_keeping_reshape(flat: FlatGraph, reshape: Operator, op: Operator, k: int,
                             outputs: list[int], readers: dict, producers: dict):
    """`reshape` where it is a RESHAPE between a filtered op and `op` (reading it as input
    k) that keeps the last axis, whose input nothing else reads, and whose output `op` keeps
    the shape of: a per-channel MUL / ADD then commutes with it. Else None."""
    if reshape.name != "RESHAPE":
        return None
    source = producers.get(reshape.inputs[0])
    if (source is None or source.name not in _FILTER_AXIS or reshape.inputs[0] in outputs
            or len(readers.get(reshape.inputs[0], [])) != 1
            or not same_shape(flat, op.inputs[k], op.outputs[0])):
        return None
    before, after = flat.shape(reshape.inputs[0]), flat.shape(reshape.outputs[0])
    if not before or not after or before[-1] is None or before[-1] != after[-1]:
        return None
    return reshape


# readers for which x / c and x * (1 / c), an ulp apart, differ: a rounding or a comparison
# moves at a boundary (a QDQ pair's round(x / scale), onnxruntime's ties included)
ROUNDS_QUOTIENT = {"ROUND", "FLOOR", "CEIL", "CAST", "FLOOR_DIV", "FLOOR_MOD", "LESS",
                   "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"}


def constant_divisions(flat: FlatGraph, outputs: list[int]) -> None:
    """DIV(x, c) by a float32 constant c: MUL(x, 1 / c), as TF's converter writes a division
    by a constant (a hard-swish's / 6). XNNPACK's MUL is the cheaper kernel, and the MUL can
    then merge with a scale next to it or go into a convolution. Unless c is a power of two
    (then 1 / c is exact), a quotient that is rounded or compared (ROUNDS_QUOTIENT) stays a
    DIV: TF's converter's rewrite moved a QDQ model's QuantizeLinear by 1 LSB."""
    readers = _consumers(flat)
    for op in flat.operators:
        if op.name != "DIV" or flat.tensors[op.outputs[0]].type != FLOAT32:
            continue
        divisor = _constant(flat, op.inputs[1])
        if divisor is None or _constant(flat, op.inputs[0]) is not None:
            continue
        exact = bool(np.all(np.frexp(divisor)[0] == 0.5))  # every c a power of two
        if not exact and (op.outputs[0] in outputs or any(
                r.name in ROUNDS_QUOTIENT for r in readers.get(op.outputs[0], []))):
            continue
        tensor = flat.tensors[op.inputs[1]]
        with np.errstate(divide="ignore"):  # x / 0 and x * inf alike: inf, or nan for 0
            values = np.float32(1) / divisor
        inverse = flat.tensor(f"{tensor.name.decode()}/reciprocal", list(tensor.shape),
                              np.float32, values)
        activation = op.options[1].fusedActivationFunction if op.options else 0
        op.name, op.inputs = "MUL", [op.inputs[0], inverse]
        op.options = options("MulOptions", fusedActivationFunction=activation)


def hard_swishes(flat: FlatGraph, outputs: list[int]) -> None:
    """x * relu6(x + 3) * (1 / 6), multiplied in either order (tf2onnx's MobileNetV3 and
    Keras write x * (relu6(x + 3) * (1 / 6)), torch's and Paddle's exports x * relu6(x + 3)
    / 6, torch's before opset 14 x * HardSigmoid(x) with alpha 1 / 6 and beta 0.5), its
    parts read by it alone: one HARD_SWISH, one pass over x where there were three
    (TF's converter fuses the first order). Not for the graph the own quantizer starts
    from: XNNPACK takes no INT8 HARD_SWISH and 16x8 has none (passes/quant_rewrites.py).
    The order -rtpo HardSwish writes, (x / 6) * relu6(x + 3), is left as it is."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)

    def only(index: int, name: str) -> Operator | None:
        """The op `name` that writes `index`, read there alone, without a fused activation."""
        op = producers.get(index)
        if (op is None or op.name != name or index in outputs
                or len(readers.get(index, [])) != 1
                or (op.options is not None and op.options[1].fusedActivationFunction)):
            return None
        return op

    def scalar(index: int, value: float, tolerance: float = 0.0) -> bool:
        c = _constant(flat, index)
        return c is not None and c.size == 1 and abs(float(c.reshape(-1)[0]) - value) <= tolerance

    def sixth(op: Operator) -> int | None:
        """The operand of MUL `op` whose other one is the constant 1 / 6."""
        return next((op.inputs[k] for k in (0, 1) if scalar(op.inputs[1 - k], 1 / 6, 1e-7)),
                    None)

    def activated_add(index: int, activation: str, shift: float):
        """(the ops, the operand v) of activation(v + shift) writing `index`: an
        `activation` op of an ADD, or the ADD with it fused; else None."""
        act = only(index, activation)
        add = only(act.inputs[0], "ADD") if act is not None else producers.get(index)
        if (add is None or add.name != "ADD" or (act is None and (
                index in outputs or len(readers.get(index, [])) != 1
                or add.options[1].fusedActivationFunction != ACTIVATIONS[activation]))):
            return None
        operand = next((add.inputs[k] for k in (0, 1) if scalar(add.inputs[1 - k], shift)),
                       None)
        return None if operand is None else ([add] if act is None else [add, act], operand)

    def shifted_relu6(index: int, x: int) -> list[Operator] | None:
        """The ops of relu6(x + 3) writing `index`."""
        found = activated_add(index, "RELU6", 3.0)
        return found[0] if found is not None and found[1] == x else None

    def hard_sigmoid(index: int, x: int) -> list[Operator] | None:
        """The ops of min(relu(x * (1 / 6) + 0.5), 1) writing `index` (HardSigmoid's
        writer, torch's hard-swish before opset 14): MINIMUM, RELU (or fused), ADD, MUL."""
        least = only(index, "MINIMUM")
        inner = None if least is None else next(
            (least.inputs[k] for k in (0, 1) if scalar(least.inputs[1 - k], 1.0)), None)
        found = None if inner is None else activated_add(inner, "RELU", 0.5)
        scaled = None if found is None else only(found[1], "MUL")
        if scaled is None or sixth(scaled) != x:
            return None
        return [least, *found[0], scaled]

    gone = []
    for op in flat.operators:
        if (op.name != "MUL" or op.options[1].fusedActivationFunction
                or flat.tensors[op.outputs[0]].type != FLOAT32):
            continue
        found = None
        for k in (0, 1):  # x * hard_sigmoid(x)
            parts = hard_sigmoid(op.inputs[k], op.inputs[1 - k])
            if parts is not None:
                found = (op.inputs[1 - k], parts)
                break
        for k in (0, 1) if found is None else ():  # x * (relu6(x + 3) * (1 / 6))
            x, inner = op.inputs[1 - k], only(op.inputs[k], "MUL")
            gate = sixth(inner) if inner is not None else None
            parts = shifted_relu6(gate, x) if gate is not None else None
            if parts is not None:
                found = (x, [inner, *parts])
                break
        product = sixth(op)
        inner = only(product, "MUL") if product is not None else None
        for k in (0, 1) if found is None and inner is not None else ():  # (x * relu6) / 6
            x = inner.inputs[1 - k]
            parts = shifted_relu6(inner.inputs[k], x)
            if parts is not None:
                found = (x, [inner, *parts])
                break
        if found is None or not same_shape(flat, found[0], op.outputs[0]):
            continue
        op.name, op.inputs, op.options = "HARD_SWISH", [found[0]], None
        gone.extend(found[1])
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def merge_constant_products(flat: FlatGraph, outputs: list[int]) -> None:
    """MUL(MUL(x, a), b) by float32 constants a and b that broadcast x to no larger shape,
    the inner product read by the outer alone: MUL(x, a * b), as TF's converter folds the
    constants (a hard-swish's 1 / 6 and the learnable scale after it)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "MUL" or flat.tensors[op.outputs[0]].type != FLOAT32:
            continue
        for k in (0, 1):
            inner, b = producers.get(op.inputs[k]), _constant(flat, op.inputs[1 - k])
            if (inner is None or b is None or inner.name != "MUL" or inner.outputs[0] in outputs
                    or len(readers.get(inner.outputs[0], [])) != 1
                    or inner.options[1].fusedActivationFunction):
                continue
            found = [(j, _constant(flat, inner.inputs[1 - j])) for j in (0, 1)
                     if _constant(flat, inner.inputs[j]) is None]
            if len(found) != 1 or found[0][1] is None:
                continue
            j, a = found[0]
            x = inner.inputs[j]
            if not (same_shape(flat, x, inner.outputs[0]) and same_shape(flat, x, op.outputs[0])
                    and max(a.ndim, b.ndim) <= len(flat.shape(x))):
                continue
            product = np.multiply(a, b, dtype=np.float32)
            name = flat.tensors[op.inputs[1 - k]].name.decode()
            op.inputs = [x, flat.tensor(f"{name}/product", list(product.shape), np.float32,
                                        product)]
            gone.append(inner)
            break
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def shifts_into_pointwise(flat: FlatGraph, outputs: list[int]) -> None:
    """ADD of a float32 constant of one value or one per channel whose output only 1x1
    CONV_2D ops read (as their input, stride any, constant filter and bias they alone
    read): into each one's bias (b + W c; a 1x1 window pads nothing), as TF's converter
    folds it. A learnable shift before a pointwise convolution (PP-LCNet's)."""
    def fold(user: Operator, values: np.ndarray) -> None:
        weights = _constant(flat, user.inputs[1]).astype(np.float64)
        bias = _constant(flat, user.inputs[2])
        flat.set_constant(user.inputs[2], bias + weights.reshape(len(bias), -1) @ values)

    _into_readers(flat, outputs, "ADD", _pointwise, fold)


def scales_into_convolutions(flat: FlatGraph, outputs: list[int],
                             per_output_channel: bool = False) -> None:
    """MUL by a float32 constant of one value or one per channel whose output only CONV_2D
    and DEPTHWISE_CONV_2D ops read (as their input, constant filter they alone read): into
    each one's filter, along its input channels (zero padding stays zero, so any window and
    padding), as TF's converter folds it. With `per_output_channel`, only where the factor
    scales whole output channels of each filter, which a per-channel quantization grid
    follows: one value, or a DEPTHWISE_CONV_2D's channels."""
    def takes(flat: FlatGraph, user: Operator, tensor: int, values: np.ndarray) -> bool:
        return (user.name in WINDOWS and user.inputs[0] == tensor
                and tensor not in user.inputs[1:] and _constant(flat, user.inputs[1]) is not None
                and (not per_output_channel or user.name == "DEPTHWISE_CONV_2D"
                     or bool(np.all(values == values[0]))))

    def fold(user: Operator, values: np.ndarray) -> None:
        filt = _constant(flat, user.inputs[1])
        # CONV_2D [out, h, w, in]; DEPTHWISE_CONV_2D [1, h, w, in * multiplier]
        factor = np.repeat(values, filt.shape[3] // len(values)) if (
            user.name == "DEPTHWISE_CONV_2D") else values
        flat.set_constant(user.inputs[1], filt * factor.astype(np.float32))

    _into_readers(flat, outputs, "MUL", takes, fold)


def _into_readers(flat: FlatGraph, outputs: list[int], name: str, takes, fold) -> None:
    """Each `name` op (ADD or MUL, no fused activation) of a value by a float32 constant of
    one value or one per channel, that does not broadcast the value, whose output only ops
    for which `takes(flat, op, tensor, values per channel)` holds read, with constant
    parameters they alone read: `fold(reader, values per channel)` for each, which then
    reads the value; the op goes."""
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if (op.name != name or op.options[1].fusedActivationFunction
                or op.outputs[0] in outputs):
            continue
        users, shape = readers.get(op.outputs[0], []), flat.shape(op.outputs[0])
        if not users or not shape or shape[-1] is None:
            continue
        channels = shape[-1]
        for k in (0, 1):
            constant = _constant(flat, op.inputs[1 - k])
            if (constant is None or _constant(flat, op.inputs[k]) is not None
                    or constant.size not in (1, channels)
                    or any(d != 1 for d in constant.shape[:-1])
                    or not same_shape(flat, op.inputs[k], op.outputs[0])):
                continue
            values = np.broadcast_to(constant.reshape(-1), (channels,)).astype(np.float64)
            if (not all(takes(flat, u, op.outputs[0], values) for u in users)
                    or not _own_parameters(flat, readers, users)):
                continue
            for user in users:
                fold(user, values)
                user.inputs[0] = op.inputs[k]
            gone.append(op)
            break
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _pointwise(flat: FlatGraph, op: Operator, tensor: int, values: np.ndarray) -> bool:
    """Whether `op` is a 1x1 CONV_2D (no dilation effect, no padding) of `tensor` with a
    constant filter and bias."""
    return (op.name == "CONV_2D" and op.inputs[0] == tensor and tensor not in op.inputs[1:]
            and len(op.inputs) > 2 and op.inputs[2] >= 0
            and _constant(flat, op.inputs[1]) is not None
            and _constant(flat, op.inputs[2]) is not None
            and tuple(flat.shape(op.inputs[1])[1:3]) == (1, 1))


def _absorb(flat: FlatGraph, source: Operator, op: Operator) -> None:
    """`source` takes over `op`'s outputs, the first named after both ("a;b", as TF's
    converter names a fused op's result: the delegate report finds both nodes)."""
    tensor = flat.tensors[op.outputs[0]]
    tensor.name += b";" + flat.tensors[source.outputs[0]].name
    source.outputs = list(op.outputs)


def _run_time_bias(flat: FlatGraph, op: Operator, k: int, source: Operator,
                   channels: int) -> bool:
    """An ADD of a run-time vector of one value per channel to a FULLY_CONNECTED without a
    bias: the vector becomes its bias input (the kernel takes a run-time one; TF's converter
    fuses it so: an unrolled recurrence's biases computed at run time)."""
    other = op.inputs[1 - k]
    if (op.name != "ADD" or source.name != "FULLY_CONNECTED" or len(source.inputs) > 2
            or flat.constant(other) is not None or flat.shape(other) != (channels,)
            or flat.tensors[other].type != schema.TensorType.FLOAT32):
        return False
    source.inputs.append(other)
    return True


def fold_into_dense(flat: FlatGraph, outputs: list[int]) -> bool:
    """A MUL or ADD by a constant of one value or one per channel whose output only
    FULLY_CONNECTED ops read (as their input, with constant weights), a LayerNormalization's
    scale and shift before a Linear: into each one's weights (W diag(g)) and bias (W b), as
    TF's converter folds them. Returns whether one was folded (the caller repeats: the
    shift first, then the scale)."""
    readers = _consumers(flat)
    for op in flat.operators:
        if op.name not in ("MUL", "ADD") or op.options[1].fusedActivationFunction:
            continue
        users = readers.get(op.outputs[0], [])
        if (not users or op.outputs[0] in outputs
                or any(u.name != "FULLY_CONNECTED" for u in users)):
            continue
        for k in (0, 1):
            factor = _constant(flat, op.inputs[1 - k])
            if factor is None or _constant(flat, op.inputs[k]) is not None:
                continue
            channels = flat.shape(op.outputs[0])[-1]
            weights = [_constant(flat, u.inputs[1]) for u in users]
            if (factor.size not in (1, channels) or any(d != 1 for d in factor.shape[:-1])
                    or not _own_parameters(flat, readers, users)
                    or not same_shape(flat, op.inputs[k], op.outputs[0])
                    or any(u.inputs[0] != op.outputs[0]
                           or op.outputs[0] in u.inputs[1:] or w is None
                           or w.shape[1] != channels for u, w in zip(users, weights))):
                continue
            values = np.broadcast_to(factor.reshape(-1), (channels,)).astype(np.float64)
            for user, w in zip(users, weights):
                if op.name == "MUL":
                    flat.set_constant(user.inputs[1], w * values.astype(np.float32))
                    user.inputs[0] = op.inputs[k]
                    continue
                if len(user.inputs) < 3:
                    name = flat.tensors[user.outputs[0]].name.decode()
                    user.inputs.append(flat.tensor(f"{name}/bias", (w.shape[0],), np.float32,
                                                   np.zeros(w.shape[0], np.float32)))
                bias = _constant(flat, user.inputs[2])
                flat.set_constant(user.inputs[2], bias + (w.astype(np.float64) @ values))
                user.inputs[0] = op.inputs[k]
            flat.operators = [o for o in flat.operators if o is not op]
            return True
    return False


def _own_parameters(flat: FlatGraph, readers: dict, users: list[Operator]) -> bool:
    """Whether the weights and biases of `users` are constants only they read (an unrolled
    recurrence's FULLY_CONNECTED ops share one weight tensor and take run-time biases)."""
    ours = {id(u) for u in users}
    return all(_constant(flat, i) is not None and all(id(r) in ours for r in readers[i])
               for u in users for i in u.inputs[1:] if i >= 0)




def maxima_as_relu(flat: FlatGraph, outputs: list[int]) -> None:
    """MAXIMUM of a float32 value and a constant zero that does not broadcast it: RELU (as
    TF's converter writes it; it can then go into the op before it)."""
    for op in flat.operators:
        if op.name != "MAXIMUM" or flat.tensors[op.outputs[0]].type != schema.TensorType.FLOAT32:
            continue
        for k in (0, 1):
            zero = flat.constant(op.inputs[1 - k])
            if (zero is not None and zero.size == 1 and float(zero.reshape(-1)[0]) == 0.0
                    and same_shape(flat, op.inputs[k], op.outputs[0])):
                op.name, op.inputs, op.options = "RELU", [op.inputs[k]], None
                break


def fuse_activations(flat: FlatGraph, outputs: list[int]) -> None:
    """An activation op whose input is the one use of a fusable op's output goes into that
    op's fusedActivationFunction, through a RESHAPE (a lifted 1-D conv's) or a TRANSPOSE (a
    value the plan keeps channel-first after it, as ShuffleNet's branches) between them too:
    the activation commutes with either. TF's converter fuses both."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)

    def only_use(tensor: int) -> Operator | None:
        source = producers.get(tensor)
        if source is None or tensor in outputs or len(readers.get(tensor, [])) != 1:
            return None
        return source

    gone = []
    for op in flat.operators:
        if op.name not in ACTIVATIONS:
            continue
        source = only_use(op.inputs[0])
        moves = source is not None and source.name in ("RESHAPE", "TRANSPOSE")
        fused = only_use(source.inputs[0]) if moves else source
        if (fused is None or fused.name not in FUSABLE
                or fused.options[1].fusedActivationFunction != 0):
            continue
        fused.options[1].fusedActivationFunction = ACTIVATIONS[op.name]
        _absorb(flat, source, op)
        producers[op.outputs[0]] = source
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def merge_reshapes(flat: FlatGraph, outputs: list[int]) -> None:
    """RESHAPE(RESHAPE(x)): one RESHAPE of x (the inner one dropped when nothing else reads
    it); two RESHAPEs of x to one shape then merged; then a RESHAPE to the shape its input
    has, that input computed by an op and read by it alone: that op writes its output (as
    TF's converter drops such a RESHAPE); where other ops read that input too (SegFormer's
    stage output, reshaped to an image and to tokens), the RESHAPE's readers read it."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    for op in flat.operators:
        inner = producers.get(op.inputs[0])
        if op.name == "RESHAPE" and inner is not None and inner.name == "RESHAPE":
            op.inputs[0] = inner.inputs[0]
    drop_unread(flat, outputs)
    merge_duplicates(flat, outputs)
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        source = producers.get(op.inputs[0])
        if op.name != "RESHAPE" or not one_shape(flat, op.inputs[0], op.outputs[0]):
            continue
        if op.outputs[0] not in outputs and len(readers.get(op.inputs[0], [])) > 1:
            for reader in readers.get(op.outputs[0], []):
                reader.inputs = [op.inputs[0] if i == op.outputs[0] else i
                                 for i in reader.inputs]
            gone.append(op)
            continue
        if (source is None or op.inputs[0] in outputs
                or len(readers.get(op.inputs[0], [])) != 1):
            continue
        source.outputs = [op.outputs[0] if o == op.inputs[0] else o for o in source.outputs]
        producers[op.outputs[0]] = source
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def flatten_into_dense(flat: FlatGraph, outputs: list[int]) -> None:
    """A RESHAPE to 2-D read only as the input of FULLY_CONNECTED ops (keepNumDims false) is
    dropped: the kernel takes any input as (elements / K, K) rows, in the same order (TF's
    converter drops it too)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "FULLY_CONNECTED" or op.options[1].keepNumDims:
            continue
        source = producers.get(op.inputs[0])
        users = readers.get(op.inputs[0], [])
        if (source is not None and source.name == "RESHAPE" and op.inputs[0] not in outputs
                and len(flat.shape(op.inputs[0])) == 2
                and all(u.name == "FULLY_CONNECTED" and u.inputs[0] == op.inputs[0]
                        and u.inputs[1:].count(op.inputs[0]) == 0
                        and not u.options[1].keepNumDims for u in users)):
            op.inputs[0] = source.inputs[0]
            if all(u.inputs[0] != source.outputs[0] for u in users):
                gone.append(source)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def reshapes_before_dense(flat: FlatGraph, outputs: list[int]) -> None:
    """A FULLY_CONNECTED (keepNumDims) whose one reader is a RESHAPE keeping the last axis:
    the input is reshaped instead, to the RESHAPE's leading dims, and the op writes the
    RESHAPE's output; a RESHAPE before the op then merges with the new one (merge_reshapes:
    Swin's attention projection between its window reshapes, as TF's converter writes it)."""
    while _reshape_before_dense(flat, outputs):
        pass


def _reshape_before_dense(flat: FlatGraph, outputs: list[int]) -> bool:
    """One move of reshapes_before_dense; whether one was made."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    for op in flat.operators:
        dense = _dense_before(flat, op, True, outputs, producers, readers)
        if dense is None:
            continue
        given, before, after = (flat.shape(dense.inputs[0]), flat.shape(op.inputs[0]),
                                flat.shape(op.outputs[0]))
        if (None in given or None in after or not after or after[-1] != before[-1]
                or len(flat.shape(dense.inputs[1])) != 2):
            continue
        shape = (*after[:-1], given[-1])
        name = flat.tensors[dense.inputs[0]].name.decode()
        moved = flat.tensor(f"{name}/rows", shape)
        at = next(k for k, o in enumerate(flat.operators) if o is dense)
        flat.operators.insert(at, Operator(
            "RESHAPE", [dense.inputs[0], flat.tensor(f"{name}/rows_shape", (len(shape),),
                                                     np.int32, np.asarray(shape, np.int32))],
            [moved], None))
        dense.inputs[0] = moved
        dense.outputs = list(op.outputs)
        if len(shape) == 2:  # rows: the kernel flattens itself (flatten_into_dense drops it)
            dense.options[1].keepNumDims = False
        flat.operators = [o for o in flat.operators if o is not op]
        return True
    return False


def kept_dims_into_dense(flat: FlatGraph, outputs: list[int]) -> None:
    """A FULLY_CONNECTED (keepNumDims false) of an input (..., K) whose one reader is a
    RESHAPE of its (rows, units) output back to (..., units): the op keeps the input's
    dims itself and writes the RESHAPE's output (GPT-2's Conv1D, exported as a 2-D Gemm
    between two Reshapes, as TF's converter writes it)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        dense = _dense_before(flat, op, False, outputs, producers, readers)
        if dense is None:
            continue
        given, wanted = flat.shape(dense.inputs[0]), flat.shape(op.outputs[0])
        weights = flat.shape(dense.inputs[1])
        if (len(given) < 3 or given[-1] != weights[-1] or None in given
                or tuple(wanted) != (*given[:-1], weights[0])):
            continue
        dense.options[1].keepNumDims = True
        dense.outputs = list(op.outputs)
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _dense_before(flat: FlatGraph, reshape: Operator, keep_dims: bool, outputs: list[int],
                  producers: dict, readers: dict) -> Operator | None:
    """The FULLY_CONNECTED (keepNumDims `keep_dims`) whose one result only `reshape`, a
    RESHAPE, reads (and is no model output), or None."""
    if reshape.name != "RESHAPE":
        return None
    dense = producers.get(reshape.inputs[0])
    if (dense is None or dense.name != "FULLY_CONNECTED"
            or bool(dense.options[1].keepNumDims) != keep_dims or len(dense.outputs) != 1
            or reshape.inputs[0] in outputs or len(readers.get(reshape.inputs[0], [])) != 1):
        return None
    return dense


BROADCASTING = {"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
                "FLOOR_DIV", "FLOOR_MOD", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER",
                "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "SELECT_V2"}


def broadcast_leading_units(flat: FlatGraph, outputs: list[int]) -> None:
    """A RESHAPE that only adds leading unit axes (a value rank-aligned for a broadcast), read
    by broadcasting ops alone whose other operands have those axes: they read its input
    (broadcasting adds them back; TF's converter drops such a RESHAPE too). Against a
    scalar or a shorter operand it stays: the result would lose the axes (a QDQ
    recognizer's Unsqueeze before a pair's division by its scale fed a CONV_2D 3-D)."""
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "RESHAPE" or op.outputs[0] in outputs:
            continue
        have, want = flat.shape(op.inputs[0]), flat.shape(op.outputs[0])
        extra = len(want) - len(have)
        users = readers.get(op.outputs[0], [])
        if (extra < 1 or want[extra:] != have or set(want[:extra]) != {1} or not users
                or sum(d is None for d in have) > 1
                or any(u.name not in BROADCASTING or not _widened_by_others(
                    flat, u, op.outputs[0], len(want)) for u in users)):
            continue
        for user in users:
            user.inputs = [op.inputs[0] if i == op.outputs[0] else i for i in user.inputs]
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _widened_by_others(flat: FlatGraph, user, value: int, rank: int) -> bool:
    """Whether an operand of `user` other than `value` has `rank` axes at least."""
    return any(len(flat.shape(i)) >= rank for i in user.inputs if i >= 0 and i != value)


def reciprocal_roots(flat: FlatGraph, outputs: list[int]) -> None:
    """DIV(1, SQRT(x)), the SQRT's result read by it alone: RSQRT(x), as TF's converter
    writes tf.math.reciprocal(tf.sqrt(x)) (an RMSNorm's scale)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        if op.name != "DIV" or (op.options and op.options[1].fusedActivationFunction):
            continue
        one, root = _constant(flat, op.inputs[0]), producers.get(op.inputs[1])
        if (one is None or one.size != 1 or float(one.reshape(-1)[0]) != 1.0 or root is None
                or root.name != "SQRT" or root.outputs[0] in outputs
                or len(readers.get(root.outputs[0], [])) != 1
                or not same_shape(flat, root.inputs[0], op.outputs[0])):
            continue
        op.name, op.inputs, op.options = "RSQRT", [root.inputs[0]], None
        gone.append(root)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


SCALAR_SCALINGS = {"MUL": (0, 1), "DIV": (0,)}  # op -> positions its scaled value may take


def transposed_operands(flat: FlatGraph, outputs: list[int]) -> None:
    """A TRANSPOSE that swaps the last two axes, read by one BATCH_MATMUL alone, directly
    or through one MUL (or DIV) by a constant of one value: the BATCH_MATMUL reads the
    untransposed value with its adjX / adjY flag toggled, the MUL scaling that value (a
    GPT-2 attention's key, scaled before its product), as TF's converter folds it."""
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        perm = flat.constant(op.inputs[1]) if op.name == "TRANSPOSE" else None
        rank = len(flat.shape(op.inputs[0]))
        if (perm is None or rank < 3 or op.outputs[0] in outputs
                or list(perm) != [*range(rank - 2), rank - 1, rank - 2]):
            continue
        chain, value = [], op.outputs[0]
        users = readers.get(value, [])
        if len(users) == 1 and users[0].name in SCALAR_SCALINGS:
            scaling = users[0]
            k = scaling.inputs.index(value)
            other = flat.constant(scaling.inputs[1 - k]) if len(scaling.inputs) == 2 else None
            if (k not in SCALAR_SCALINGS[scaling.name] or other is None or other.size != 1
                    or scaling.outputs[0] in outputs
                    or not same_shape(flat, scaling.outputs[0], value)):
                continue
            chain, value = [scaling], scaling.outputs[0]
            users = readers.get(value, [])
        if (len(users) != 1 or users[0].name != "BATCH_MATMUL" or users[0].options is None
                or users[0].inputs[:2].count(value) != 1):
            continue
        product = users[0]
        for scaling in chain:  # scales the untransposed value now: its shape swaps back
            scaling.inputs = [op.inputs[0] if i == op.outputs[0] else i for i in scaling.inputs]
            _swap_last_two(flat, scaling.outputs[0])
        position = product.inputs.index(value)
        if not chain:
            product.inputs[position] = op.inputs[0]
        flag = "adjX" if position == 0 else "adjY"
        table = product.options[1]
        setattr(table, flag, not getattr(table, flag))
        gone.append(op)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _swap_last_two(flat: FlatGraph, index: int) -> None:
    tensor = flat.tensors[index]
    for field in ("shape", "shapeSignature"):
        dims = getattr(tensor, field)
        if dims is not None:
            setattr(tensor, field, np.array([*dims[:-2], dims[-1], dims[-2]], np.int32))


WINDOWS = {"CONV_2D", "DEPTHWISE_CONV_2D"}


def pads_into_same_windows(flat: FlatGraph, outputs: list[int]) -> None:
    """A PAD by zeros of the spatial axes read only by VALID convolutions, by what SAME pads
    for their sizes: the convolutions read its input with SAME (as TF's converter fuses it;
    a convolution by run-time weights is padded by its handler's code)."""
    producers = {o: op for op in flat.operators for o in op.outputs}
    readers = _consumers(flat)
    gone = []
    for op in flat.operators:
        pad = producers.get(op.inputs[0])
        if (op.name not in WINDOWS or op.options[1].padding != schema.Padding.VALID
                or pad is None or pad.name != "PAD" or pad.outputs[0] in outputs):
            continue
        widths, shape = flat.constant(pad.inputs[1]), flat.shape(pad.inputs[0])
        users = readers.get(pad.outputs[0], [])
        if (widths is None or len(shape) != 4 or None in shape[1:3] or np.any(widths[0])
                or np.any(widths[3]) or len(users) != 1):
            continue
        kernel = flat.shape(op.inputs[1])[1:3]
        opts = op.options[1]
        steps = [(opts.strideH, opts.dilationHFactor), (opts.strideW, opts.dilationWFactor)]
        if all(tuple(widths[a + 1]) == _same_pads(shape[a + 1], kernel[a], *steps[a])
               for a in (0, 1)):
            op.inputs[0], opts.padding = pad.inputs[0], schema.Padding.SAME
            gone.append(pad)
    flat.operators = [op for op in flat.operators if all(op is not g for g in gone)]


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """The (before, after) pads of TF's SAME for one axis."""
    reach = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + reach - size, 0)
    return total // 2, total - total // 2


MOVES = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
# elementwise ops LiteRT may run in place (their result written over an input's buffer)
IN_PLACE = BROADCASTING | {"ABS", "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "SIN", "COS",
                           "TANH", "LOGISTIC", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU",
                           "HARD_SWISH", "GELU", "ELU", "FLOOR", "CEIL", "ROUND", "SIGN",
                           "LOGICAL_NOT", "CAST"}
# the copies a RESHAPE of an integer or boolean value reads (float values, whose ops XNNPACK
# runs and plans, were not seen written over: they keep their file)
_COPIES = {np.dtype(np.int32): ("ADD", 0), np.dtype(np.int64): ("ADD", 0),
           np.dtype(np.bool_): ("LOGICAL_OR", False)}


def unshared_moves(flat: FlatGraph, outputs: list[int]) -> None:
    """LiteRT's memory planner lets a RESHAPE's result share its input's buffer where other
    ops still read that input, then lets an elementwise op that alone reads the RESHAPE's
    result write its own result into that buffer in place, over the input the others have
    yet to read (LiteRT issues #8889 and #8928: exit 0 and wrong values on its builtin
    kernels; XNNPACK plans the memory of its partitions itself). A decoder's mask found it:
    an int64 [1] count reshaped to a scalar, read by an ADD, and read by another ADD as it
    was. So such a RESHAPE (SQUEEZE, EXPAND_DIMS) gets its input to itself: the other
    readers read its result where broadcasting gives them the same result shape, else the
    RESHAPE of an integer or boolean value reads a copy of it (an ADD of 0, a LOGICAL_OR
    with false: the same int64 count concatenated was written over, float32 values in the
    same places were not)."""
    readers = _consumers(flat)
    for move in [op for op in flat.operators if op.name in MOVES]:
        x, y = move.inputs[0], move.outputs[0]
        users = readers.get(y, [])
        others = [op for op in readers.get(x, []) if op is not move]
        if (flat.constant(x) is not None or y in outputs or len(users) != 1
                or not _may_write_over(flat, users[0], y) or not (others or x in outputs)):
            continue
        for other in others:
            if other.name in BROADCASTING and _same_result(flat, other, x, y):
                other.inputs = [y if i == x else i for i in other.inputs]
                readers[y].append(other)
                readers[x].remove(other)
        if not [op for op in readers.get(x, []) if op is not move] and x not in outputs:
            continue
        dtype = flat.dtype(x)
        if dtype not in _COPIES or flat.tensors[x].quantization is not None and (
                flat.tensors[x].quantization.scale is not None):
            continue
        builtin, zero = _COPIES[dtype]
        name = flat.tensors[x].name.decode()
        copy = flat.tensor(f"{name}/own_copy", flat.shape(x), dtype,
                           dynamic=flat.tensors[x].shapeSignature is not None)
        nothing = flat.tensor(f"{name}/own_copy_zero", (), dtype, np.asarray(zero, dtype))
        at = next(k for k, op in enumerate(flat.operators) if op is move)
        flat.operators.insert(at, Operator(builtin, [x, nothing], [copy],
                                           options(f"{builtin.title().replace('_', '')}Options")))
        move.inputs[0] = copy


def _may_write_over(flat: FlatGraph, op: Operator, value: int) -> bool:
    """Whether `op` may write its result over `value`'s buffer in place: an elementwise op
    whose result has the value's type and shape."""
    result = op.outputs[0]
    return (op.name in IN_PLACE and flat.tensors[result].type == flat.tensors[value].type
            and flat.shape(result) == flat.shape(value))


def _same_result(flat: FlatGraph, op: Operator, x: int, y: int) -> bool:
    """Whether `op`, reading `y` where it reads `x`, gives its result the same shape."""
    shapes = [flat.shape(y if i == x else i) for i in op.inputs if i >= 0]
    if any(None in shape for shape in shapes) or None in flat.shape(op.outputs[0]):
        return False
    try:
        return tuple(np.broadcast_shapes(*shapes)) == flat.shape(op.outputs[0])
    except ValueError:
        return False
