"""FULLY_CONNECTED ops that share one weight matrix run on TFLite's builtin kernel.

An unrolled recurrence (ops/rnn.py) multiplies its state by the same recurrence matrix at
every time step: one FULLY_CONNECTED op per step, all reading one weight tensor. The XNNPACK
delegate packs the weights of each op it takes into memory of that op's own, so T steps keep
T packed copies. Once they outgrow the CPU's caches every step reads its copy from memory:
a GRU of 100 steps with hidden size 128 (192 KiB of recurrence weights) ran 18 us per step
under XNNPACK against 6 us on the builtin kernel, which reads the one shared tensor from
cache (measured on the 2-core CI machine, 16 MiB L3); the packed copies also cost T times
the weights in memory.

XNNPACK (ai-edge-litert 2.3, measured) leaves a FULLY_CONNECTED whose bias is computed at
run time to the builtin kernel; run-time weights alone it still takes, and packs on every
run. So the handler adds a per-output-channel vector computed at run time (the step's input
projection) right after the product, and this pass, run on the converted flatbuffer, makes
that ADD the op's bias. That is the op's own semantics (out = in @ W^T + bias), so no value
changes.
"""

from __future__ import annotations

from onnx2tf_alt.tflite.flatbuffer import (
    builtin_codes,
    pack_model,
    read_model,
    schema,
    unpack_model,
)
from onnx2tf_alt.tflite.late_weights import is_constant


def fold_runtime_biases(content: bytes) -> bytes:
    """`content` with each FULLY_CONNECTED op that has no bias, no fused activation, shares
    its weight tensor with another FULLY_CONNECTED op, and whose output only feeds an ADD
    of a 1-D run-time vector [units], computing that ADD as its bias (the ADD removed). The
    flatbuffer is returned unchanged (the same object) when no op qualifies."""
    if not _has_candidates(read_model(content), schema):
        return content
    model = unpack_model(content)
    if not fold_runtime_biases_model(model):
        return content
    return pack_model(model, len(content) + 4096)


def fold_runtime_biases_model(model) -> int:
    """fold_runtime_biases on an unpacked model (schema.ModelT), in place; returns the
    number of ADD ops folded."""
    codes = _builtin_codes(model)
    return sum(_fold_subgraph(codes, model, subgraph, schema) for subgraph in model.subgraphs)


def _builtin_codes(model) -> list[int]:
    """Per operator code index, its builtin operator (max of the two code fields, as the
    schema says for files written before and after the 127 limit)."""
    return [max(code.builtinCode, code.deprecatedBuiltinCode) for code in model.operatorCodes]


def _has_candidates(model, schema) -> bool:
    """Whether two FULLY_CONNECTED ops read one weight tensor, read without unpacking the
    model (its weights may be large)."""
    fc = schema.BuiltinOperator.FULLY_CONNECTED
    codes = builtin_codes(model)
    for s in range(model.SubgraphsLength()):
        subgraph, seen = model.Subgraphs(s), set()
        for i in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(i)
            if codes[op.OpcodeIndex()] == fc and op.InputsLength() > 1:
                weights = op.Inputs(1)
                if weights in seen:
                    return True
                seen.add(weights)
    return False


def _fold_subgraph(codes: list[int], model, subgraph, schema) -> int:
    fc, add = schema.BuiltinOperator.FULLY_CONNECTED, schema.BuiltinOperator.ADD
    readers: dict[int, list[int]] = {}
    for index, op in enumerate(subgraph.operators):
        for tensor in op.inputs if op.inputs is not None else []:
            readers.setdefault(int(tensor), []).append(index)
    def weight_key(op) -> tuple[str, int]:
        """Weights are shared when the ops read one tensor or one constant buffer (bound
        weights, tflite/late_weights.py, are one buffer read by several tensors)."""
        tensor = subgraph.tensors[int(op.inputs[1])]
        if tensor.buffer and is_constant(model.buffers[tensor.buffer]):
            return ("buffer", int(tensor.buffer))
        return ("tensor", int(op.inputs[1]))

    weight_users: dict[tuple[str, int], int] = {}
    for op in subgraph.operators:
        if codes[op.opcodeIndex] == fc and len(op.inputs) > 1:
            weight_users[weight_key(op)] = weight_users.get(weight_key(op), 0) + 1
    outputs = {int(t) for t in subgraph.outputs}
    removed = set()
    for op in subgraph.operators:
        if codes[op.opcodeIndex] != fc or weight_users.get(weight_key(op), 0) < 2:
            continue
        if (len(op.inputs) > 2 and op.inputs[2] >= 0) or _activation(op):
            continue
        product = int(op.outputs[0])
        users = readers.get(product, [])
        if product in outputs or len(users) != 1:
            continue
        adder = subgraph.operators[users[0]]
        if codes[adder.opcodeIndex] != add:
            continue
        bias = [int(t) for t in adder.inputs if int(t) != product]
        units = subgraph.tensors[int(op.inputs[1])].shape[0]
        if len(bias) != 1 or not _runtime_vector(model, subgraph.tensors[bias[0]], units):
            continue
        op.inputs = [int(op.inputs[0]), int(op.inputs[1]), bias[0]]
        op.outputs = list(adder.outputs)
        if op.builtinOptions is None:
            op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
            op.builtinOptions = schema.FullyConnectedOptionsT()
        op.builtinOptions.fusedActivationFunction = _activation(adder)
        removed.add(users[0])
    subgraph.operators = [op for i, op in enumerate(subgraph.operators) if i not in removed]
    return len(removed)


def _activation(op) -> int:
    """The op's fused activation function (0: none)."""
    return getattr(op.builtinOptions, "fusedActivationFunction", 0) or 0


def _runtime_vector(model, tensor, units: int) -> bool:
    """A float32 tensor of shape [units] computed at run time (no constant data)."""
    buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
    return (tensor.type == 0 and tensor.shape is not None and list(tensor.shape) == [units]
            and not is_constant(buffer))
