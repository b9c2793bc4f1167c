"""The rewrites TF's converter makes when a weight is a constant, made on a .tflite whose
weights are bound after conversion (tflite/late_weights.py): the converter saw those
weights as inputs, so it left these for here.

- BATCH_MATMUL(x, rank-2 weight) becomes FULLY_CONNECTED(x, weight stored [units, depth]);
- a MUL / DIV / ADD / SUB of a constant scalar or per-channel vector after a CONV_2D,
  DEPTHWISE_CONV_2D or FULLY_CONNECTED that it alone reads goes into its weights and bias
  (TF's converter clones a FULLY_CONNECTED others read too: CLIP's quick GELU,
  h * sigmoid(1.702 h), got a second 768x3072 product per layer, 1.28x the time), a RELU /
  RELU6 / RELU_N1_TO_1 after it into its fused activation;
- RESHAPE -> FULLY_CONNECTED -> RESHAPE keeping the last axis becomes one RESHAPE, then the
  product.

Each works on the bound model's `late` map {tensor index: recipe of its weight}; a new
weight is a new tensor with its own recipe (Recipe.then), so other readers of the old one
keep it.
"""

from __future__ import annotations

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import op_name, opcode_index, schema

NUMPY = {schema.TensorType.FLOAT32: np.float32, schema.TensorType.FLOAT16: np.float16,
         schema.TensorType.INT32: np.int32, schema.TensorType.INT64: np.int64,
         schema.TensorType.INT8: np.int8, schema.TensorType.UINT8: np.uint8,
         schema.TensorType.INT16: np.int16, schema.TensorType.BOOL: np.bool_,
         schema.TensorType.FLOAT64: np.float64}  # a tensor type's numpy dtype


class Unbindable(ValueError):
    """The converted graph has an op on weights that tflite/late_weights.py does not
    compute (the caller then converts with every weight a constant)."""


def fused_into_affine(model, subgraph, ops: list, late: dict) -> list:
    """`ops` with the arithmetic TF's converter computes into the weights of a CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED when they are constants, done here for bound
    weights: a MUL / DIV / ADD / SUB of a constant scalar or per-channel vector reading the
    op's output goes into its weights and bias, its activation onto the op, when it is that
    op's only reader (a clone would compute the product twice). Then a RELU / RELU6 / RELU_N1_TO_1 alone reading such an op
    becomes its fused activation."""
    readers: dict[int, int] = {}
    for op in ops:
        for i in op.inputs:
            readers[int(i)] = readers.get(int(i), 0) + 1
    outputs = {int(i) for i in subgraph.outputs}
    producers = {int(o): op for op in ops for o in op.outputs}
    kept = [op for op in ops if op_name(model, op) not in _ARITHMETIC
            or not _fuse(model, subgraph, op, producers, readers, outputs, late)]
    bound_affine = [op for op in kept
                    if op_name(model, op) in _CHANNEL_AXIS and int(op.inputs[1]) in late]
    return _fused_activations(model, kept, bound_affine, readers, outputs)


def fused_into_following(model, subgraph, ops: list, late: dict, weight_of) -> list:
    """`ops` with a MUL / DIV / ADD / SUB of a constant scalar whose output only a CONV_2D
    with a bound weight reads computed into that op, as TF's converter does for a constant
    filter (scalars only: it leaves a per-channel one): a product scales the filter, a sum
    adds the filter times the constant to the bias (only without padding: VALID, or SAME
    with a 1x1 kernel). `weight_of(recipe)` is a weight's array (for the bias). Repeated until
    nothing changes, so x * a + b before a convolution goes in whole."""
    while True:
        readers: dict[int, list] = {}
        for op in ops:
            for i in op.inputs:
                readers.setdefault(int(i), []).append(op)
        outputs = {int(i) for i in subgraph.outputs}
        dropped = None
        for op in ops:
            name = op_name(model, op)
            if name in _ARITHMETIC and _fuse_forward(model, subgraph, op, name, readers,
                                                     outputs, late, weight_of):
                dropped = op
                break
        if dropped is None:
            return ops
        ops = [op for op in ops if op is not dropped]


# TF's converter does this for CONV_2D only (a LayerNorm's scale and shift before a
# FULLY_CONNECTED stay; measured on PP-OCRv4's recognizer)
_INPUT_AXIS = {"CONV_2D": 3}


def _fuse_forward(model, subgraph, op, name, readers, outputs, late, weight_of) -> bool:
    if len(op.inputs) != 2 or getattr(op.builtinOptions, "fusedActivationFunction", 0):
        return False
    result = int(op.outputs[0])
    after = readers.get(result, [])
    if len(after) != 1 or result in outputs:
        return False
    affine = after[0]
    kind = op_name(model, affine)
    if (kind not in _INPUT_AXIS or int(affine.inputs[0]) != result
            or int(affine.inputs[1]) not in late or result in [int(i) for i in affine.inputs[1:]]):
        return False
    for k in (0, 1):
        source, other = int(op.inputs[k]), int(op.inputs[1 - k])
        if (name in ("SUB", "DIV") and k != 0) or other in late or source in late:
            continue
        if not _is_inline(model, subgraph, other):
            continue
        weight = subgraph.tensors[int(affine.inputs[1])]
        axis = _INPUT_AXIS[kind]
        channels = int(weight.shape[axis])
        value = constant(model, subgraph, other).astype(np.float32)
        if weight.type != schema.TensorType.FLOAT32 or value.size != 1:  # TF: scalars only
            continue
        vector = np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float32)
        recipe = late[int(affine.inputs[1])]
        has_bias = len(affine.inputs) > 2 and int(affine.inputs[2]) >= 0
        if name in ("MUL", "DIV"):
            recipe = recipe.then("scale" if name == "MUL" else "divide",
                                 (axis, tuple(vector.tolist())))
            bias = None
        else:
            if not _unpadded(affine, weight):
                continue
            if has_bias and int(affine.inputs[2]) in late:
                continue
            units = int(weight.shape[0])
            base = (constant(model, subgraph, int(affine.inputs[2])).astype(np.float32)
                    if has_bias else np.zeros(units, np.float32))
            if base.size != units:
                continue
            sign = 1.0 if name == "ADD" else -1.0
            array = weight_of(recipe).astype(np.float32)
            shift = (array * vector).reshape(units, -1).sum(axis=1)
            bias = (base + sign * shift).astype(np.float32)
        fused = schema.TensorT()
        fused.shape, fused.type = weight.shape, weight.type
        fused.name, fused.buffer = (weight.name or b"") + b"/fused_input", 0
        subgraph.tensors.append(fused)
        late[len(subgraph.tensors) - 1] = recipe
        inputs = [source, len(subgraph.tensors) - 1] + [int(i) for i in affine.inputs[2:]]
        if bias is not None:
            index = _new_constant(model, subgraph, bias, b"/fused_bias")
            inputs = inputs[:2] + [index]
        affine.inputs = inputs
        return True
    return False


def _unpadded(conv, weight) -> bool:
    """Whether a convolution reads no padding (a constant added to its input would be
    missing where it does)."""
    options = conv.builtinOptions
    if options.padding == schema.Padding.VALID:
        return True
    return int(weight.shape[1]) == 1 and int(weight.shape[2]) == 1


_ARITHMETIC = ("MUL", "DIV", "ADD", "SUB")
_ACTIVATIONS = {"RELU": schema.ActivationFunctionType.RELU,
                "RELU6": schema.ActivationFunctionType.RELU6,
                "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1}
_CHANNEL_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}


def _fuse(model, subgraph, op, producers, readers, outputs, late) -> bool:
    """Computes `op` into the affine op that produces its operand, changed in place;
    whether it did."""
    name = op_name(model, op)
    if len(op.inputs) != 2:
        return False
    for k in (0, 1):
        source, other = int(op.inputs[k]), int(op.inputs[1 - k])
        affine = producers.get(source)
        if affine is None or (name in ("SUB", "DIV") and k != 0):
            continue
        kind = op_name(model, affine)
        if (kind not in _CHANNEL_AXIS or int(affine.inputs[1]) not in late
                or readers.get(source, 0) != 1 or source in outputs
                or getattr(affine.builtinOptions, "fusedActivationFunction", 0)
                or int(affine.inputs[0]) in late):
            continue
        if other in late or not _is_inline(model, subgraph, other):
            continue
        weight = subgraph.tensors[int(affine.inputs[1])]
        axis = _CHANNEL_AXIS[kind]
        channels = int(weight.shape[axis])
        value = constant(model, subgraph, other).astype(np.float32)
        shape = list(subgraph.tensors[other].shape)
        if weight.type != schema.TensorType.FLOAT32 or not (
                value.size == 1 or (value.size == channels and shape and shape[-1] == channels)):
            continue
        has_bias = len(affine.inputs) > 2 and int(affine.inputs[2]) >= 0
        bias = (constant(model, subgraph, int(affine.inputs[2])).astype(np.float32)
                if has_bias else None)
        if has_bias and (int(affine.inputs[2]) in late or bias.size != channels):
            continue
        vector = np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float32)
        recipe = late[int(affine.inputs[1])]
        if name in ("MUL", "DIV"):
            recipe = recipe.then("scale" if name == "MUL" else "divide",
                                 (axis, tuple(vector.tolist())))
            if bias is not None:
                bias = bias * vector if name == "MUL" else bias / vector
        else:
            base = bias if bias is not None else np.zeros(channels, np.float32)
            bias = base + vector if name == "ADD" else base - vector
        affine.inputs = list(affine.inputs)
        if bias is not None:
            index = _new_constant(model, subgraph, bias, b"/fused_bias")
            affine.inputs = [int(affine.inputs[0]), int(affine.inputs[1]), index]
        # a tensor of its own for the new weights: others may read the old ones
        fused = schema.TensorT()
        fused.shape, fused.type = weight.shape, weight.type
        fused.name, fused.buffer = (weight.name or b"") + b"/fused", 0
        subgraph.tensors.append(fused)
        late[len(subgraph.tensors) - 1] = recipe
        affine.inputs[1] = len(subgraph.tensors) - 1
        affine.outputs = list(op.outputs)
        affine.builtinOptions.fusedActivationFunction = getattr(
            op.builtinOptions, "fusedActivationFunction", 0)
        for o in op.outputs:
            producers[int(o)] = affine
        return True
    return False


def _fused_activations(model, ops: list, affine: list, readers, outputs) -> list:
    """`ops` with a RELU, RELU6 or RELU_N1_TO_1 that alone reads the output of an `affine`
    op without activation made that op's fused activation."""
    producers = {int(op.outputs[0]): op for op in affine}
    dropped = set()
    for op in ops:
        kind = _ACTIVATIONS.get(op_name(model, op))
        source = int(op.inputs[0]) if kind is not None else None
        target = producers.get(source)
        if (target is None or readers.get(source) != 1 or source in outputs
                or target.builtinOptions.fusedActivationFunction):
            continue
        target.builtinOptions.fusedActivationFunction = kind
        target.outputs = list(op.outputs)
        dropped.add(id(op))
    return [op for op in ops if id(op) not in dropped]


def reshapes_around_products(model, subgraph, ops: list, late: dict) -> list:
    """RESHAPE -> FULLY_CONNECTED (keep_num_dims, bound weights) -> RESHAPE that keeps the
    last axis: one RESHAPE straight to the final shape, then the product, as TF's converter
    writes it for a constant weight (a product over the last axis commutes with reshaping
    the others)."""
    readers: dict[int, list] = {}
    for op in ops:
        for i in op.inputs:
            readers.setdefault(int(i), []).append(op)
    producers = {int(o): op for op in ops for o in op.outputs}
    outputs = {int(i) for i in subgraph.outputs}
    dropped = set()
    for product in ops:
        if (op_name(model, product) != "FULLY_CONNECTED" or int(product.inputs[1]) not in late
                or not product.builtinOptions.keepNumDims):
            continue
        first = producers.get(int(product.inputs[0]))
        after = readers.get(int(product.outputs[0]), [])
        if (first is None or op_name(model, first) != "RESHAPE" or len(after) != 1
                or op_name(model, after[0]) != "RESHAPE" or int(product.outputs[0]) in outputs
                or len(readers.get(int(first.outputs[0]), [])) != 1
                or int(first.outputs[0]) in outputs):
            continue
        last = after[0]
        source = subgraph.tensors[int(first.inputs[0])]
        final = subgraph.tensors[int(last.outputs[0])]
        shape = [int(d) for d in final.shape]
        signature = [int(d) for d in (final.shapeSignature if final.shapeSignature is not None
                                      else final.shape)]
        depth = int(subgraph.tensors[int(first.outputs[0])].shape[-1])
        if (min(signature + [int(d) for d in (source.shapeSignature if source.shapeSignature
                                              is not None else source.shape)]) < 0
                or not shape or shape[-1] != int(subgraph.tensors[int(product.outputs[0])]
                                                 .shape[-1])):
            continue
        reshaped = subgraph.tensors[int(first.outputs[0])]
        reshaped.shape = np.array(shape[:-1] + [depth], np.int32)
        reshaped.shapeSignature = None
        target = _new_int32(model, subgraph, np.array(shape[:-1] + [depth], np.int32))
        first.inputs = [int(first.inputs[0]), target]
        if getattr(first.builtinOptions, "newShape", None) is not None:
            first.builtinOptions.newShape = list(shape[:-1] + [depth])
        product.outputs = list(last.outputs)
        dropped.add(id(last))
    return [op for op in ops if id(op) not in dropped]


def _new_int32(model, subgraph, value: np.ndarray) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(value.astype("<i4").tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape = np.array(value.shape, np.int32)
    tensor.type, tensor.buffer = schema.TensorType.INT32, len(model.buffers) - 1
    tensor.name = b"reshape_shape"
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _is_inline(model, subgraph, index: int) -> bool:
    data = model.buffers[subgraph.tensors[index].buffer].data
    return data is not None and len(data) > 0


def _new_constant(model, subgraph, value: np.ndarray, suffix: bytes) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape = np.array(value.shape, np.int32)
    tensor.type, tensor.buffer = schema.TensorType.FLOAT32, len(model.buffers) - 1
    tensor.name = b"fused" + suffix
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def to_fully_connected(model, subgraph, op, late: dict) -> bool:
    """BATCH_MATMUL(x, rank-2 weight) as FULLY_CONNECTED(x, weight stored [units, depth]),
    as TF's converter writes a product with a constant right side."""
    x, w = int(op.inputs[0]), int(op.inputs[1])
    options = op.builtinOptions
    weight = subgraph.tensors[w]
    if x in late or w not in late or options.adjX or len(weight.shape) != 2:
        return False
    recipe = late[w] if options.adjY else late[w].then("transpose", (1, 0))
    transposed = schema.TensorT()
    transposed.shape = np.array(weight.shape[::-1] if not options.adjY else weight.shape,
                                np.int32)
    transposed.type, transposed.name = weight.type, (weight.name or b"") + b"/transposed"
    transposed.buffer = 0
    subgraph.tensors.append(transposed)
    late[len(subgraph.tensors) - 1] = recipe
    rank = len(subgraph.tensors[x].shape)
    op.opcodeIndex = opcode_index(model, schema.BuiltinOperator.FULLY_CONNECTED,
                                  5 if rank != 2 else 1)
    op.inputs = [x, len(subgraph.tensors) - 1, -1]
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT(keepNumDims=rank != 2)
    return True


def constant(model, subgraph, index: int) -> np.ndarray:
    tensor = subgraph.tensors[index]
    data = model.buffers[tensor.buffer].data
    if data is None or not len(data):
        raise Unbindable(f"tensor '{tensor.name}' is not a constant")
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), NUMPY[tensor.type])
